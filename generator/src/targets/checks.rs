//! Refusals and warnings several targets share: features the filters do not enforce yet, and
//! the options that shape the plugin config.

use crate::ir::{label_of, CompileOptions};
use crate::model::*;
use crate::targets::Target;
use crate::{Diagnostics, Problem};

/// What no target serves yet (auth is refused rather than served unauthenticated), external backends without credentials, and a `dataPlane` that the
/// gateway target overrides.
pub fn unenforced_features(router: &ModelRouter, target: Target, diags: &mut Diagnostics) {
    let label = label_of(router);
    let spec = &router.spec;
    for (i, b) in spec.backends.iter().enumerate() {
        let Some(e) = &b.external else { continue };
        if e.credentials_secret_ref.is_none() && e.provider != Provider::Litellm {
            diags.warn(Problem::new(
                &label,
                format!("spec.backends[{i}].external"),
                format!(
                    "no credentialsSecretRef: requests to {} are sent without credentials",
                    e.provider.as_str()
                ),
            ));
        }
    }
    if let Some(auth) = spec.policy.as_ref().and_then(|p| p.auth.as_ref()) {
        if auth.jwt.is_some() || !auth.allowlists.is_empty() {
            diags.error(Problem::new(&label, "spec.policy.auth", format!("is not enforced by the {target} target yet; refusing rather than serving unauthenticated")));
        }
    }
    // Budgets need no check here: every target embeds the plugin config, which carries them,
    // and the filter enforces them wherever it runs (ledgers in that gateway's shared data).
    if let Some(dp) = spec.data_plane.filter(|d| *d != DataPlane::Proxy) {
        diags.warn(Problem::new(&label, "spec.dataPlane", format!("{dp:?} selects LLMKube's own data plane; the {target} target runs the whole spec in the gateway regardless")));
    }
}

/// `--max-body-bytes` and `--model-header`, which end up in the plugin config.
pub fn plugin_options(opts: &CompileOptions, diags: &mut Diagnostics) {
    if opts.max_body_bytes == Some(0) {
        diags.error(Problem::new(
            "options",
            "--max-body-bytes",
            "must be greater than 0",
        ));
    }
    if let Some(h) = &opts.model_header {
        if !router_core::headers::is_token(h) {
            diags.error(Problem::new(
                "options",
                "--model-header",
                format!("{h:?} is not a valid HTTP header name"),
            ));
        }
    }
}
