//! `compile --target envoy-gateway`: Kubernetes manifests for Envoy Gateway + Envoy AI Gateway
//! that load the model-router filter into the ModelRouter's `spec.gatewayRef` Gateway and route
//! on the decisions it stamps.
//!
//! - [`extension`]: the EnvoyExtensionPolicy loading the module (pinned by sha256, the same
//!   plugin config as the envoy target), the EnvoyPatchPolicy for what Envoy Gateway cannot
//!   express, the ClientTrafficPolicy raising the connection buffer to the body limit;
//! - [`routing`]: AIGatewayRoutes with one rule per route key (`x-llmkube-route` exact, backends
//!   by priority in attempt order), BackendTrafficPolicies for retries, per-attempt timeouts,
//!   passive and active health checks (the quarantine);
//! - [`quarantine`]: the quarantine settings the BackendTrafficPolicy cannot express, patched
//!   onto the rule clusters;
//! - [`backends`]: AIServiceBackend + Backend per backend, BackendSecurityPolicy per external
//!   credential (a Secret reference: no credential value is ever written);
//! - [`security`]: the SecurityPolicy verifying `policy.auth.jwt` on the routes;
//! - [`shadow`]: mirrored copies of shadow rules to local backends;
//! - [`pick`]: endpoint picking, the `ORIGINAL_DST` cluster of each picked backend;
//! - [`budgets`]: the shared ledger `llmkube-budgets` (its cluster, and optionally its
//!   Deployment, Service and NetworkPolicy).

mod backends;
pub mod budgets;
mod extension;
pub mod names;
mod objects;
mod options;
mod pick;
mod quarantine;
mod routing;
mod security;
mod shadow;

use serde_json::Value;

use crate::inputs::Source;
use crate::ir::{label_of, Ir};
use crate::model::*;
use crate::targets::{checks, front_end, Target, TargetChecks};
use crate::{Diagnostics, Problem};
use objects::gateway;
pub use objects::GatewayRef;
pub use options::{GatewayOptions, WasmSource, DEFAULT_LISTENER};

/// Compiles the inputs to a multi-document YAML stream; the `Err` holds every problem.
pub fn compile_envoy_gateway(
    sources: &[Source],
    opts: &GatewayOptions,
) -> Result<String, Vec<Problem>> {
    Diagnostics::collect(|diags| compile_envoy_gateway_diag(sources, opts, diags))
}

/// Compiles the inputs, reporting errors and warnings into `diags`. `None` when there is any error.
pub fn compile_envoy_gateway_diag(
    sources: &[Source],
    opts: &GatewayOptions,
    diags: &mut Diagnostics,
) -> Option<String> {
    let sha256 = module_sha256(opts, diags);
    let mut common = opts.common.clone();
    // The ledger's cluster is named after the router, known once the IR is built.
    if opts.budgets.is_some() {
        common.budgets_cluster = Some(String::new());
    }
    let mut ir = front_end(sources, &common, opts, diags)?;
    budgets::name_cluster(&mut ir);
    let sha256 = sha256?;
    let docs = documents(&ir, opts, &sha256);
    crate::render::render_documents(&docs, diags)
}

/// Every document, in apply order: backends first, then routes, then the policies on them.
pub fn documents(ir: &Ir, opts: &GatewayOptions, sha256: &str) -> Vec<Value> {
    let gw = gateway(ir);
    let mut docs = backends::documents(ir);
    let routes = routing::routes(ir, &gw);
    let route_names: Vec<String> = routes
        .iter()
        .filter_map(|r| r["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    docs.extend(routes);
    docs.extend(routing::traffic_policies(ir, &route_names));
    docs.extend(extension::documents(ir, opts, &gw, &route_names, sha256));
    docs.extend(security::documents(ir, &route_names));
    docs.extend(budgets::documents(ir, opts.budgets.as_ref(), &gw));
    docs
}

/// The module's sha256 for this target's options.
fn module_sha256(opts: &GatewayOptions, diags: &mut Diagnostics) -> Option<String> {
    crate::targets::module::pin_module(opts.wasm_sha256.as_deref(), &opts.wasm_dir, diags)
}

impl TargetChecks for GatewayOptions {
    fn target(&self) -> Target {
        Target::EnvoyGateway
    }
    fn needs_secret_values(&self) -> bool {
        false
    }
    fn check_router(&self, router: &ModelRouter, diags: &mut Diagnostics) {
        let label = label_of(router);
        if router.spec.gateway_ref.is_none() {
            diags.error(Problem::new(
                &label,
                "spec.gatewayRef",
                "is required for the envoy-gateway target: it names the Gateway the policies and routes attach to",
            ));
        }
        checks::unenforced_features(router, Target::EnvoyGateway, diags);
        checks::plugin_options(&self.common, diags);
        if !crate::validate::is_dns_subdomain(&self.listener) {
            diags.error(Problem::new(
                "options",
                "--gateway-listener",
                format!("{:?} is not a valid Gateway listener name", self.listener),
            ));
        }
        let source = match &self.wasm {
            WasmSource::Http(u) => crate::url::parse_url(u).err(),
            WasmSource::Image(i) => (i.is_empty() || i.contains(char::is_whitespace))
                .then(|| format!("{i:?} is not an image reference")),
        };
        if let Some(why) = source {
            let flag = match self.wasm {
                WasmSource::Http(_) => "--wasm-url",
                WasmSource::Image(_) => "--wasm-image",
            };
            diags.error(Problem::new("options", flag, why));
        }
    }
    fn check_ir(&self, ir: &Ir, diags: &mut Diagnostics) {
        check_name_lengths(ir, diags);
        routing::check(ir, diags);
        backends::check(ir, diags);
        security::check(ir, diags);
        budgets::check(ir, self.budgets.as_ref(), diags);
        pick::check(ir, diags);
        shadow::check(ir, diags);
        quarantine::check(ir, diags);
    }
}

/// Kubernetes object names are at most 253 characters; ours add a prefix and the backend name to
/// the router's.
fn check_name_lengths(ir: &Ir, diags: &mut Diagnostics) {
    let longest = ir
        .backends
        .iter()
        .map(|b| names::backend(ir, &b.name))
        .chain([names::traffic_policy(ir, ir.routes.len())])
        .max_by_key(String::len)
        .unwrap_or_default();
    if longest.len() > 253 {
        diags.error(Problem::new(
            &ir.label,
            "metadata.name",
            format!("the generated object name {longest:?} would be longer than 253 characters; use a shorter router name"),
        ));
    }
}
