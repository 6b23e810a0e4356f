//! `llmkube-ext-proc`'s configuration (the format of ext-proc/src/config.rs): the model-router
//! module pinned by sha256 and the very plugin config the envoy target embeds. Only the
//! model-router module: the per-attempt one cannot run behind ext_proc (the server refuses it);
//! its work is agentgateway's per-provider model, credential and timeout here.

use serde_json::{json, Value};

use super::options::{AgentgatewayOptions, Failover, RETRY_REPLAY_LIMIT};
use crate::ir::Ir;

pub const ROOT_ID: &str = "model-router";
pub const VM_ID: &str = "llmkube";

/// How long the server drains its streams on SIGTERM (`drain_timeout_ms`).
pub const DRAIN_TIMEOUT_MS: u64 = 25_000;
/// The pod's `terminationGracePeriodSeconds`: the drain, and 5 s for the server to answer the
/// streams the drain deadline cuts and exit before the kubelet's SIGKILL.
pub const TERMINATION_GRACE_SECONDS: u64 = DRAIN_TIMEOUT_MS / 1000 + 5;
/// agentgateway's deadline on an ext_proc call (`extProc.policies.http.requestTimeout`): it
/// bounds the wait for the server to accept the stream (its response headers), which the server
/// sends at once, admitted or refused; a stopped or hung server gets the request failed closed
/// after this instead of holding it indefinitely.
pub const CALL_TIMEOUT: &str = "5s";

/// Request bytes the server may hold across its streams: room for 16 requests of the filter's
/// largest body at once, and at least 256 MiB.
pub fn memory_budget_bytes(ir: &Ir) -> u64 {
    (ir.max_body_bytes.saturating_add(1))
        .saturating_mul(16)
        .max(256 << 20)
}

/// The container's memory: twice the budget (a body is held in the gRPC message, the runtime's
/// buffer and the module's memory while it is decided) and 256 MiB for the module instances and
/// the runtime. Requested as much as the limit, so the pod is not the first evicted under node
/// pressure; CPU is requested, not limited (a throttled server adds latency to every request).
pub fn resources(ir: &Ir) -> Value {
    let memory = memory_budget_bytes(ir)
        .saturating_mul(2)
        .saturating_add(256 << 20);
    let mib = format!("{}Mi", memory.div_ceil(1 << 20));
    json!({
        "requests": {"cpu": "500m", "memory": mib},
        "limits": {"memory": mib},
    })
}

pub(super) fn config(
    ir: &Ir,
    module_path: &str,
    sha256: &str,
    opts: &AgentgatewayOptions,
) -> Value {
    let plugin: Value = serde_json::from_str(&ir.plugin_json).unwrap_or(Value::Null);
    let plugin = match plugin {
        Value::Null => Value::String(ir.plugin_json.clone()),
        Value::Object(mut p) => {
            // The filter counts and audits the requests the trade serves without failover.
            if opts.failover == Failover::WithinReplayLimit
                && ir.max_body_bytes > RETRY_REPLAY_LIMIT
            {
                p.insert("failover_replay_limit".into(), json!(RETRY_REPLAY_LIMIT));
            }
            // agentgateway's mirrors drop the body: the filter sends shadow copies itself.
            if let Some(shadow) = super::shadow::plugin_section(ir) {
                p.insert("shadow".into(), shadow);
            }
            Value::Object(p)
        }
        other => other,
    };
    let mut cfg = json!({
        "module": {"path": module_path, "sha256": sha256},
        "root_id": ROOT_ID,
        "vm_id": VM_ID,
        "plugin_config": plugin,
        "log_level": "info",
        "memory_budget_bytes": memory_budget_bytes(ir),
        "drain_timeout_ms": DRAIN_TIMEOUT_MS,
    });
    let mut clusters = super::shadow::clusters(ir);
    if let Some(Value::Object(budgets)) = super::budgets::clusters(opts) {
        clusters.extend(budgets);
    }
    if !clusters.is_empty() {
        cfg["clusters"] = Value::Object(clusters);
    }
    cfg
}
