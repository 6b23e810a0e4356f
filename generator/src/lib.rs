//! `llmkube-gen`: LLMKube ModelRouter manifests → gateway configuration that loads the filters.
//!
//! Input → validated IR → one emitter per target:
//! - [`model`]: typed ModelRouter spec (kube `CustomResource`), [`inputs`]: multi-document YAML
//!   loading (ModelRouter, InferenceService, Secret, EndpointSlice).
//! - [`validate`]: every rule of the CRD reference, as [`Problem`] lines
//!   `<Kind>/<name>: <field.path>: <why>`.
//! - [`plugin`]: ModelRouter → `router_core::config::PluginConfig`.
//! - [`ir`]: the validated router every target renders (plugin config, the core `Router`,
//!   resolved backends, route plans, durations, credentials as Secret references).
//! - [`targets`]: one module per `--target` with its own refusals ([`targets::envoy`]: a
//!   standalone bootstrap).
//! - [`url`], [`duration`]: the value syntaxes of the spec; [`render`]: YAML/JSON output.
//! - [`explain`]: one request through the filter's own decision code, offline.
//! - [`cli`]: the command line (`validate`, `compile`, `explain`).

pub mod auth;
pub mod cli;
pub mod duration;
pub mod explain;
pub mod inputs;
pub mod ir;
pub mod model;
pub mod plugin;
pub mod render;
pub mod targets;
pub mod url;
pub mod validate;

use std::fmt;

pub use inputs::{load, Inputs, Source};
pub use ir::CompileOptions;
pub use model::{ModelRouter, ModelRouterSpec};
pub use plugin::{plugin_config, PluginContext};
pub use targets::envoy::{compile_envoy, compile_envoy_diag, EnvoyOptions, Format};
pub use targets::Target;

/// One problem: `<object>: <field.path>: <why>` (the path part is left out when empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `Kind/name` (or a file name / `options` for problems outside an object).
    pub object: String,
    pub path: String,
    pub message: String,
}

impl Problem {
    pub fn new(
        object: impl Into<String>,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Problem {
            object: object.into(),
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.object, self.message)
        } else {
            write!(f, "{}: {}: {}", self.object, self.path, self.message)
        }
    }
}

/// Errors (which fail the command) and warnings (printed as `warning: ...`).
#[derive(Debug, Clone, Default)]
pub struct Diagnostics {
    pub errors: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

impl Diagnostics {
    pub fn error(&mut self, p: Problem) {
        if !self.errors.contains(&p) {
            self.errors.push(p);
        }
    }
    pub fn warn(&mut self, p: Problem) {
        if !self.warnings.contains(&p) {
            self.warnings.push(p);
        }
    }

    /// Runs a `*_diag` compile and keeps only its verdict: the output when it reported no error,
    /// else every error (warnings are dropped).
    pub fn collect<T>(
        compile: impl FnOnce(&mut Diagnostics) -> Option<T>,
    ) -> Result<T, Vec<Problem>> {
        let mut diags = Diagnostics::default();
        match compile(&mut diags) {
            Some(out) if diags.errors.is_empty() => Ok(out),
            _ => Err(diags.errors),
        }
    }
}

/// `validate`: loads the sources and checks every ModelRouter in them. References to objects that
/// are not in the input are warnings here (they may exist in the cluster); `compile` makes them
/// errors.
pub fn validate_sources(sources: &[Source]) -> Diagnostics {
    let mut diags = Diagnostics::default();
    let inputs = inputs::load(sources, &mut diags);
    let mut seen = std::collections::BTreeSet::new();
    for r in &inputs.routers {
        let key = inputs::router_key(r);
        if !seen.insert(key.clone()) {
            diags.error(Problem::new(
                format!("ModelRouter/{}", r.metadata.name.as_deref().unwrap_or("")),
                "metadata.name",
                format!("{key} is defined twice in the input"),
            ));
        }
        let before = diags.errors.len();
        validate::validate_router(r, &inputs, &validate::RefPolicy::default(), &mut diags);
        if diags.errors.len() == before {
            validate::lint_served_models(r, &inputs, &mut diags);
        }
    }
    if inputs.routers.is_empty() && diags.errors.is_empty() {
        diags.error(Problem::new(
            "input",
            "",
            "no ModelRouter (inference.llmkube.dev/v1alpha1) found",
        ));
    }
    diags
}

/// Reads `-f` arguments: a path, or `-` for stdin (at most once).
pub fn read_sources(
    paths: &[String],
    stdin: &mut dyn std::io::Read,
) -> Result<Vec<Source>, Problem> {
    let mut out = Vec::new();
    let mut stdin_used = false;
    for p in paths {
        if p == "-" {
            if stdin_used {
                return Err(Problem::new(
                    "options",
                    "-f",
                    "stdin (-) can be read only once",
                ));
            }
            stdin_used = true;
            let mut text = String::new();
            stdin
                .read_to_string(&mut text)
                .map_err(|e| Problem::new("<stdin>", "", format!("cannot read: {e}")))?;
            out.push(Source {
                name: "<stdin>".into(),
                text,
            });
        } else {
            let text = std::fs::read_to_string(p)
                .map_err(|e| Problem::new(p.as_str(), "", format!("cannot read: {e}")))?;
            out.push(Source {
                name: p.clone(),
                text,
            });
        }
    }
    Ok(out)
}
