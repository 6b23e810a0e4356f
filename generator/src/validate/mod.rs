//! Static validation of a ModelRouter: everything the CRD reference states (patterns, limits,
//! cross-field rules), plus checks of the objects it references.
//!
//! Errors and warnings are [`Problem`]s: `<Kind>/<name>: <field.path>: <why>`.

mod backends;
mod policy;
mod proxy;
mod references;
mod reporter;
mod rules;
mod served;
mod syntax;

pub use syntax::{
    check_glob, is_cidr_or_addr, is_decimal, is_dns_label, is_dns_subdomain, is_name,
};

use crate::inputs::{namespace_of, Inputs};
use crate::model::*;
use crate::Diagnostics;
pub use references::RefPolicy;
use reporter::Ctx;

/// Validates one ModelRouter. `inputs` supplies the referenced objects; `refs` says how missing
/// ones are reported.
/// The `validate` lint of model names a local engine may not serve (`served`): rules and the
/// default route that can send a local backend names other than its own, while its
/// InferenceService does not say which name its engine serves.
pub fn lint_served_models(router: &ModelRouter, inputs: &Inputs, diags: &mut Diagnostics) {
    let name = router.metadata.name.clone().unwrap_or_default();
    let mut cx = Ctx {
        label: format!("ModelRouter/{name}"),
        diags,
    };
    let namespace = namespace_of(&router.metadata).to_string();
    served::foreign_model_names(&mut cx, &router.spec, &namespace, inputs);
}

pub fn validate_router(
    router: &ModelRouter,
    inputs: &Inputs,
    refs: &RefPolicy,
    diags: &mut Diagnostics,
) {
    let name = router.metadata.name.clone().unwrap_or_default();
    let mut cx = Ctx {
        label: format!("ModelRouter/{name}"),
        diags,
    };
    let cx = &mut cx;
    if !is_dns_subdomain(&name) {
        cx.err(
            "metadata.name",
            format!("{name:?} is not a valid Kubernetes name (RFC 1123 subdomain)"),
        );
    }
    let namespace = namespace_of(&router.metadata).to_string();
    if !is_dns_label(&namespace) {
        cx.err(
            "metadata.namespace",
            format!("{namespace:?} is not a valid namespace name (RFC 1123 label)"),
        );
    }
    let spec = &router.spec;
    let data_plane = spec.data_plane.unwrap_or_default();

    let cap = proxy::validate_proxy(cx, spec);
    backends::validate_backends(cx, spec, cap, data_plane);
    rules::validate_rules(cx, spec, cap);
    if let Some(d) = &spec.default_route {
        if spec.backend(d).is_none() {
            cx.err(
                "spec.defaultRoute",
                format!("backend {d:?} is not declared in spec.backends"),
            );
        }
    }
    policy::validate_policy(cx, spec);
    references::validate_data_plane_refs(cx, spec, data_plane);
    references::validate_endpoint(cx, spec);
    if spec.mcp_server.as_ref().and_then(|m| m.enabled) == Some(true) {
        cx.warn(
            "spec.mcpServer.enabled",
            "MCP exposure is reserved and not implemented; ignored",
        );
    }
    references::validate_references(cx, spec, &namespace, inputs, refs);
}
