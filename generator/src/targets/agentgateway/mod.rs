//! `compile --target agentgateway`: agentgateway (v1.3.x) routes on the decision the model-router
//! filter takes inside `llmkube-ext-proc`.
//!
//! Where the decision can steer agentgateway (docs/agentgateway.md has the source references):
//! a listener-level (gateway) `extProc` policy runs *before* route selection, so the
//! `x-llmkube-route` header the filter sets selects the route; a route-level `extProc` runs after
//! it and could not. Each route key becomes one route matching that header exactly, whose single
//! AI backend lists the key's attempt order as priority groups of one provider each: retries move
//! to the next group once the failed one is evicted (the quarantine), each provider carrying its
//! own model, credential and per-attempt timeout (what the per-attempt module does on Envoy).
//! A request without a key matches only the catch-all 404, so it never reaches a backend.
//!
//! - [`standalone`]: `agentgateway.yaml` (the `binds:` dialect) for `agentgateway -f`;
//! - [`ext_proc`]: `ext-proc.yaml` for `llmkube-ext-proc --config`;
//! - [`kubernetes`]: `kubernetes.yaml` for an agentgateway installation;
//! - [`shadow`]: shadow copies, sent by the filter (agentgateway's mirrors drop the body).

mod attempts;
mod budgets;
mod ext_proc;
mod kubernetes;
mod options;
mod picked;
mod shadow;
mod standalone;

pub use options::{
    AgentgatewayOptions, Failover, DEFAULT_EXT_PROC, DEFAULT_IMAGE, EXT_PROC_PORT, FILES,
    IMAGE_WASM_DIR, INTERNAL_HEADERS, NO_BACKEND_PROVIDER, PICKER_FILE, RETRY_REPLAY_LIMIT,
};

use crate::inputs::Source;
use crate::ir::{label_of, CompileOptions, Ir};
use crate::model::*;
use crate::targets::{checks, front_end, Target, TargetChecks};
use crate::{Diagnostics, Problem};

/// The three files, as `(file name, text)` in [`FILES`] order.
pub type Output = Vec<(&'static str, String)>;

/// Compiles the inputs; the `Err` holds every problem.
pub fn compile_agentgateway(
    sources: &[Source],
    opts: &AgentgatewayOptions,
) -> Result<Output, Vec<Problem>> {
    Diagnostics::collect(|diags| compile_agentgateway_diag(sources, opts, diags))
}

/// Compiles the inputs, reporting errors and warnings into `diags`. `None` when there is any error.
pub fn compile_agentgateway_diag(
    sources: &[Source],
    opts: &AgentgatewayOptions,
    diags: &mut Diagnostics,
) -> Option<Output> {
    let sha256 = super::module::pin_module(opts.wasm_sha256.as_deref(), &opts.wasm_dir, diags);
    let common = CompileOptions {
        budgets_cluster: budgets::cluster_name(opts),
        ..opts.common.clone()
    };
    let ir = front_end(sources, &common, opts, diags)?;
    let sha256 = sha256?;
    let standalone = crate::render::render(
        &standalone::config(&ir, opts),
        crate::render::Format::Yaml,
        diags,
    )?;
    let module = super::module::absolute(opts.wasm_dir.join(super::module::WASM_FILE));
    let mut server = ext_proc::config(&ir, &module.to_string_lossy(), &sha256, opts);
    // The local server answers the standalone routes' last priority group.
    let (host, port) = opts.no_backend_addr();
    server["no_backend_listen"] = serde_json::json!(options::host_port(&host, port));
    let server = crate::render::render(&server, crate::render::Format::Yaml, diags)?;
    let manifests =
        crate::render::render_documents(&kubernetes::documents(&ir, opts, &sha256), diags)?;
    let mut out = vec![
        (FILES[0], standalone),
        (FILES[1], server),
        (FILES[2], manifests),
    ];
    if picked::any_picked(&ir) {
        let picker = crate::render::render(
            &picked::picker_config(&ir, &module.to_string_lossy(), &sha256, opts),
            crate::render::Format::Yaml,
            diags,
        )?;
        out.push((PICKER_FILE, picker));
    }
    Some(out)
}

impl TargetChecks for AgentgatewayOptions {
    fn target(&self) -> Target {
        Target::Agentgateway
    }
    fn needs_secret_values(&self) -> bool {
        false
    }
    fn check_router(&self, router: &ModelRouter, diags: &mut Diagnostics) {
        checks::unenforced_features(router, Target::Agentgateway, diags);
        checks::plugin_options(&self.common, diags);
        let label = label_of(router);
        if router.spec.agent_gateway_ref.is_none() {
            diags.error(Problem::new(
                &label,
                "spec.agentGatewayRef",
                "is required for the agentgateway target: it names the Gateway the ext_proc policy and the routes attach to",
            ));
        }
        if !self.listen.ip().is_unspecified() {
            diags.warn(Problem::new(
                "options",
                "--listen",
                format!("agentgateway v1.3.1 binds take only a port: it listens on port {} of every address, not only on {}", self.listen.port(), self.listen.ip()),
            ));
        }
        if self.image.is_empty() || self.image.contains(char::is_whitespace) {
            diags.error(Problem::new(
                "options",
                "--ext-proc-image",
                format!("{:?} is not an image reference", self.image),
            ));
        }
        for (i, b) in router.spec.backends.iter().enumerate() {
            if let Some(e) = &b.external {
                if matches!(e.provider, Provider::Bedrock | Provider::VertexAi) {
                    diags.error(Problem::new(
                        &label,
                        format!("spec.backends[{i}].external.provider"),
                        format!("{} is not served by the agentgateway target yet (its request signing is not generated); use the envoy-gateway target", e.provider.as_str()),
                    ));
                }
            }
        }
    }
    fn check_ir(&self, ir: &Ir, diags: &mut Diagnostics) {
        refusals(ir, self.failover, diags);
    }
}

/// What agentgateway v1.3.1 cannot serve with the envoy target's guarantees.
fn refusals(ir: &Ir, failover: Failover, diags: &mut Diagnostics) {
    let unreplayable = ir.max_body_bytes > RETRY_REPLAY_LIMIT && failover == Failover::Always;
    picked::refusals(ir, diags);
    shadow::check(ir, diags);
    for (i, r) in ir.router.spec.rules.iter().enumerate() {
        let plans = ir.rule_plans(&r.name);
        if unreplayable && plans.iter().any(|p| p.order.len() > 1) {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.rules[{i}].route.backends"),
                format!("failover needs the request replayed, and agentgateway v1.3.1 replays bodies of at most {RETRY_REPLAY_LIMIT} bytes; with a body limit of {} bytes a larger request would get no fallback attempt: pass --max-body-bytes {RETRY_REPLAY_LIMIT} (or less), or --failover-within-replay-limit (larger bodies are then served by their first backend only, counted and audited as failover_skipped), or route this rule to one backend", ir.max_body_bytes),
            ));
        }
    }
    let unruled_failover = ir
        .routes
        .iter()
        .any(|p| p.rule.is_none() && p.order.len() > 1);
    if unruled_failover && unreplayable {
        diags.error(Problem::new(
            &ir.label,
            "spec.defaultRoute",
            format!("failover needs the request replayed, and agentgateway v1.3.1 replays bodies of at most {RETRY_REPLAY_LIMIT} bytes: pass --max-body-bytes {RETRY_REPLAY_LIMIT} (or less), or --failover-within-replay-limit"),
        ));
    }
}
