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
//! - [`kubernetes`]: `kubernetes.yaml` for an agentgateway installation.

mod budgets;
mod ext_proc;
mod kubernetes;
mod picked;
mod standalone;

use std::net::SocketAddr;
use std::path::PathBuf;

use router_core::headers::{
    ATTEMPT_BACKEND_HEADER, MODEL_SPAN_HEADER, ROUTE_HEADER, SENSITIVE_HEADER,
};

use crate::inputs::Source;
use crate::ir::{label_of, CompileOptions, Ir, RoutePlan};
use crate::model::*;
use crate::targets::{checks, front_end, Target, TargetChecks};
use crate::{Diagnostics, Problem};

/// agentgateway v1.3.1 replays a request body for a retry only up to this size
/// (`MAX_BUFFERED_BYTES` in crates/agentgateway/src/proxy/httpproxy.rs); above it the request
/// gets one attempt.
pub const RETRY_REPLAY_LIMIT: u64 = 64 * 1024;
/// Where `llmkube-ext-proc` listens when `--ext-proc` is not given.
pub const DEFAULT_EXT_PROC: (&str, u16) = ("127.0.0.1", 50051);
/// Port of the in-cluster `llmkube-ext-proc` Service.
pub const EXT_PROC_PORT: u16 = 50051;
/// Where the in-cluster image keeps the filter modules.
pub const IMAGE_WASM_DIR: &str = "/opt/llmkube/wasm";
pub const DEFAULT_IMAGE: &str = "ghcr.io/llmkube/llmkube-ext-proc:latest";
/// The three files written to `-o DIR`, in this order.
pub const FILES: [&str; 3] = ["agentgateway.yaml", "ext-proc.yaml", "kubernetes.yaml"];
/// The fourth, when a backend has its pods picked: the endpoint picker's `llmkube-ext-proc`
/// config (it listens on the `--ext-proc` port plus one).
pub const PICKER_FILE: &str = "endpoint-picker.yaml";
/// Decision headers only the gateway needs: removed before a request leaves for a backend.
pub const INTERNAL_HEADERS: [&str; 4] = [
    ROUTE_HEADER,
    SENSITIVE_HEADER,
    ATTEMPT_BACKEND_HEADER,
    MODEL_SPAN_HEADER,
];

/// Options of `compile --target agentgateway`.
#[derive(Debug, Clone)]
pub struct AgentgatewayOptions {
    pub common: CompileOptions,
    /// `--listen`: agentgateway's listener (v1.3.1 binds take a port; the host is documentary).
    pub listen: SocketAddr,
    /// `--ext-proc HOST:PORT`: where agentgateway reaches `llmkube-ext-proc`.
    pub ext_proc: (String, u16),
    /// Directory holding `llmkube_model_router.wasm` (for the local `ext-proc.yaml`).
    pub wasm_dir: PathBuf,
    /// `--wasm-sha256`; otherwise computed from the built module.
    pub wasm_sha256: Option<String>,
    /// `--ext-proc-image`: the in-cluster server's image (modules in [`IMAGE_WASM_DIR`]).
    pub image: String,
    /// `--budgets-service HOST:PORT`: budgets are kept by `llmkube-budgets` there (a cluster of
    /// `ext-proc.yaml`); `None`: in the server's shared data.
    pub budgets_service: Option<(String, u16)>,
    /// What failover means for bodies over agentgateway's replay limit.
    pub failover: Failover,
}

/// Failover against agentgateway's replay limit ([`RETRY_REPLAY_LIMIT`]): a request body above
/// it gets one attempt, whatever the route's retry policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failover {
    /// A router with an attempt order of more than one backend is refused unless the body limit
    /// (`--max-body-bytes`) is within the replay limit: every request it admits can fail over.
    #[default]
    Always,
    /// `--failover-within-replay-limit`: bodies up to the replay limit fail over; a larger one
    /// is served by the first backend of its order only, and the filter counts it
    /// (`llmkube.failover_skipped`) and audits it (`failover_skipped`).
    WithinReplayLimit,
}

impl Default for AgentgatewayOptions {
    fn default() -> Self {
        AgentgatewayOptions {
            common: CompileOptions::default(),
            listen: super::DEFAULT_LISTEN,
            ext_proc: (DEFAULT_EXT_PROC.0.to_string(), DEFAULT_EXT_PROC.1),
            wasm_dir: super::module::default_wasm_dir(),
            wasm_sha256: None,
            image: DEFAULT_IMAGE.to_string(),
            budgets_service: None,
            failover: Failover::default(),
        }
    }
}

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
    let server = crate::render::render(
        &ext_proc::config(&ir, &module.to_string_lossy(), &sha256, opts),
        crate::render::Format::Yaml,
        diags,
    )?;
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

/// One attempt of a route key, as both renderings need it.
pub(crate) struct Attempt<'a> {
    pub backend: &'a crate::ir::Backend,
    pub timeout_ms: u64,
}

pub(crate) fn attempts<'a>(ir: &'a Ir, p: &RoutePlan) -> Vec<Attempt<'a>> {
    p.order
        .iter()
        .zip(&p.attempt_timeouts_ms)
        .map(|(&b, &timeout_ms)| Attempt {
            backend: &ir.backends[b],
            timeout_ms,
        })
        .collect()
}

/// `host:port`, an IPv6 host in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The OpenAI-shaped body of the catch-all answer (a request the filter did not route).
pub(crate) fn no_route_body() -> String {
    serde_json::json!({"error": {
        "message": "no route: the request was not routed by the model-router filter",
        "type": "invalid_request_error",
        "param": null,
        "code": "no_route",
    }})
    .to_string()
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
    for (i, r) in ir.router.spec.rules.iter().enumerate() {
        let plans = ir.rule_plans(&r.name);
        if plans.iter().any(|p| !p.mirrors.is_empty()) {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.rules[{i}].route.strategy"),
                "shadow is refused by the agentgateway target: agentgateway v1.3.1 mirrors requests without their body (requestMirror), so the shadow backends would not get the request",
            ));
        }
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
