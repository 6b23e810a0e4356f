//! `compile --target envoy`: a standalone Envoy v3 bootstrap that loads the model-router filter.
//!
//! Layout (the contract is docs/architecture.md, "Failover, weighted picks, shadow, quarantine"):
//! one listener, one http_connection_manager with `[envoy.filters.http.wasm,
//! envoy.filters.http.router]`. The filter stamps `x-llmkube-route: <key>`; the route table has
//! exactly one route per key the filter can stamp (enumerated from `router_core::router::Router`
//! built from the same plugin config: `rule_orders` per rule, then `unruled_targets`), each
//! matching the header exactly, and a final catch-all `direct_response` 404 (OpenAI-shaped JSON)
//! so a request the filter did not decide never reaches a backend.
//!
//! A one-backend order goes to `backend-<name>`; a longer one to the aggregate
//! `order.<b1>.<b2>...` over those backend clusters, failing over with a retry policy
//! (`previous_priorities`). Backend clusters carry the quarantine (outlier detection + TCP health
//! check, no panic mode); shadow rules mirror to `shadow-<name>` clusters. Clusters that can send
//! to an external backend run the upstream chain (upstream wasm, per-backend credential injector
//! reading `static_resources.secrets` `cred-<name>`, marker removal, codec).
//!
//! Route `timeout: 0s`: Envoy's route timeout spans until the whole response has been received,
//! which would cut long streams; `per_try_timeout` bounds the time to response headers per attempt
//! and `idle_timeout` (`spec.proxy.streamIdleTimeout`) a silent stream. `per_try_timeout` is one
//! value per route, so an order whose attempts need different timeouts (no rule timeout, backends
//! with different ones) goes to the aggregate `attempts.<b1>.<b2>...` over `via-<b>` clusters
//! instead: each attempt passes through the internal listener `attempt-<b>`, whose route to
//! `backend-<b>` carries b's own timeout (and where `backend-<b>`'s own upstream chain runs).

mod bootstrap;
mod clusters;
mod filters;
pub mod jwt;
pub mod names;
mod options;
mod pick;

use crate::inputs::Source;
use crate::ir::{label_of, CompileOptions, Ir};
use crate::model::*;
use crate::targets::{checks, front_end, Target, TargetChecks};
use crate::{Diagnostics, Problem};

pub use crate::render::Format;
pub use crate::targets::module::{absolute, default_wasm_dir, UPSTREAM_WASM_FILE, WASM_FILE};
pub use crate::targets::xds::SHADOW_MAX_REQUESTS;
pub use crate::targets::DEFAULT_LISTEN;
pub use names::*;
pub use options::*;

/// Compiles the inputs to an Envoy bootstrap; the `Err` holds every problem. Warnings are dropped:
/// use [`compile_envoy_diag`] to see them.
pub fn compile_envoy(sources: &[Source], opts: &EnvoyOptions) -> Result<String, Vec<Problem>> {
    Diagnostics::collect(|diags| compile_envoy_diag(sources, opts, diags))
}

/// Compiles the inputs, reporting errors and warnings into `diags`. `None` when there is any error.
pub fn compile_envoy_diag(
    sources: &[Source],
    opts: &EnvoyOptions,
    diags: &mut Diagnostics,
) -> Option<String> {
    let ir = front_end(sources, &opts.common(), opts, diags)?;
    let bootstrap = bootstrap::bootstrap(&ir, opts);
    crate::render::render(&bootstrap, opts.format, diags)
}

impl EnvoyOptions {
    /// With a set of options every target takes.
    pub fn with_common(common: CompileOptions) -> Self {
        EnvoyOptions {
            resolve: common.resolve,
            endpoints: common.endpoints,
            router: common.router,
            model_header: common.model_header,
            max_body_bytes: common.max_body_bytes,
            ..Default::default()
        }
    }

    /// The options every target takes.
    pub fn common(&self) -> CompileOptions {
        CompileOptions {
            router: self.router.clone(),
            resolve: self.resolve.clone(),
            endpoints: self.endpoints.clone(),
            model_header: self.model_header.clone(),
            max_body_bytes: self.max_body_bytes,
            unsafe_budgets_charge_after: self.unsafe_budgets_charge_after,
            budgets_cluster: self
                .budgets_service
                .as_ref()
                .map(|_| names::BUDGETS_CLUSTER.to_string()),
            budgets_fail_open: self.budgets_fail_open,
            budgets_hold_ttl_s: self.budgets_hold_ttl_s,
            budgets_per_request: self.budgets_per_request,
            unsafe_budgets_worker_leases_unheld: self.unsafe_budgets_worker_leases_unheld,
            budgets_lease: self.budgets_lease.clone(),
        }
    }
}

impl TargetChecks for EnvoyOptions {
    fn target(&self) -> Target {
        Target::Envoy
    }
    fn needs_secret_values(&self) -> bool {
        true
    }
    fn check_router(&self, router: &ModelRouter, diags: &mut Diagnostics) {
        check_router(router, self, diags)
    }
    fn check_ir(&self, ir: &Ir, diags: &mut Diagnostics) {
        check_credential_values(ir, diags);
        check_path_rewrites(ir, diags);
        pick::check_orders(ir, diags)
    }
}

/// What the envoy target refuses or warns about beyond the spec's own rules.
fn check_router(router: &ModelRouter, opts: &EnvoyOptions, diags: &mut Diagnostics) {
    let label = label_of(router);
    let spec = &router.spec;
    for (i, b) in spec.backends.iter().enumerate() {
        if let Some(e) = &b.external {
            if matches!(e.provider, Provider::Bedrock | Provider::VertexAi) {
                diags.error(Problem::new(
                    &label,
                    format!("spec.backends[{i}].external.provider"),
                    format!("provider {} is not supported by the envoy target yet (it needs request signing); use litellm in front of it", e.provider.as_str()),
                ));
            }
        }
    }
    checks::unenforced_features(router, Target::Envoy, diags);
    check_jwks_file(router, opts, diags);
    checks::plugin_options(&opts.common(), diags);
    let wasm = wasm_path(opts);
    if !wasm.is_file() {
        diags.warn(Problem::new(
            "options",
            "--wasm-dir",
            format!("{} does not exist yet (build it: cargo build --release --target wasm32-wasip1 -p llmkube-model-router)", wasm.display()),
        ));
    }
    let upstream_wasm = upstream_wasm_path(opts);
    if spec.backends.iter().any(|b| b.external.is_some()) && !upstream_wasm.is_file() {
        diags.warn(Problem::new(
            "options",
            "--wasm-dir",
            format!("{} does not exist yet (external backends need the upstream filter: build filters/upstream for wasm32-wasip1)", upstream_wasm.display()),
        ));
    }
}

/// `--jwks-file` stands in for `jwksURI`: it needs a JWT policy and a file Envoy can read.
fn check_jwks_file(router: &ModelRouter, opts: &EnvoyOptions, diags: &mut Diagnostics) {
    let Some(f) = &opts.jwks_file else { return };
    if crate::auth::jwt(&router.spec).is_none() {
        diags.warn(Problem::new(
            "options",
            "--jwks-file",
            format!(
                "{} sets no spec.policy.auth.jwt: the keys are not used",
                label_of(router)
            ),
        ));
    } else if !f.is_file() {
        diags.error(Problem::new(
            "options",
            "--jwks-file",
            format!("{} is not a readable file", f.display()),
        ));
    }
}

/// The bootstrap inlines each credential in its secret store: the Secret must hold the
/// provider's key.
fn check_credential_values(ir: &Ir, diags: &mut Diagnostics) {
    for (i, b) in ir.backends.iter().enumerate() {
        let Some(e) = b.external() else { continue };
        let Some(c) = e.credential.as_ref().filter(|c| c.value.is_none()) else {
            continue;
        };
        diags.error(Problem::new(
            &ir.label,
            format!("spec.backends[{i}].external.credentialsSecretRef.name"),
            format!(
                "Secret {}/{} has no key {} (the {} credential)",
                c.secret.namespace, c.secret.name, c.secret.key, e.provider
            ),
        ));
    }
}

/// Path prefixes are route-level in Envoy: only a route to that backend alone can apply one.
fn check_path_rewrites(ir: &Ir, diags: &mut Diagnostics) {
    for (i, b) in ir.backends.iter().enumerate() {
        if !b.rewrites_path() {
            continue;
        }
        let shared = ir
            .routes
            .iter()
            .find(|p| (p.order.len() > 1 && p.order.contains(&i)) || p.mirrors.contains(&i));
        if let Some(p) = shared {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.backends[{i}].external.url"),
                format!("the path {:?} can only be applied on a route to {} alone, but route {:?} {} (Envoy rewrites paths per route, not per attempt); use a URL without a path, or one ending in /v1", b.path_prefix(), b.name, p.key, if p.mirrors.contains(&i) { "mirrors to it" } else { "fails over across it and other backends" }),
            ));
        }
    }
}
