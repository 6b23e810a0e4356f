//! `llmkube-ext-proc`'s configuration (the format of ext-proc/src/config.rs): the model-router
//! module pinned by sha256 and the very plugin config the envoy target embeds. Only the
//! model-router module: the per-attempt one cannot run behind ext_proc (the server refuses it);
//! its work is agentgateway's per-provider model, credential and timeout here.

use serde_json::{json, Value};

use super::{AgentgatewayOptions, Failover, RETRY_REPLAY_LIMIT};
use crate::ir::Ir;

pub const ROOT_ID: &str = "model-router";
pub const VM_ID: &str = "llmkube";

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
    });
    if let Some(clusters) = super::budgets::clusters(opts) {
        cfg["clusters"] = clusters;
    }
    cfg
}
