//! Budgets behind agentgateway. The filter settles a budget from the response body (the usage
//! it reports), so the response body must reach `llmkube-ext-proc`. agentgateway v1.3.1 streams
//! a response body to an ext_proc server in `fullDuplexStreamed` mode: `mutate_response` in
//! crates/agentgateway/src/http/ext_proc.rs spawns the body stream for that mode
//! (`response_body_streamed_before_header_response`) and forwards the server's
//! `streamed_response` chunks (`handle_response_for_response_mutation` in
//! ext_proc/mutation.rs); its gateway-level `extProc` runs that phase on every upstream response
//! (`ResponsePolicies::apply`, proxy/httpproxy.rs). `llmkube-ext-proc` answers that mode chunk by
//! chunk (ext-proc/src/phases/duplex.rs), so the usage-only chunk is stripped there as on Envoy.
//!
//! `--budgets-service HOST:PORT`: the ledgers are kept by `llmkube-budgets`, which the filter
//! reaches by a callout to the `llmkube-budgets` cluster of `ext-proc.yaml`.

use serde_json::{json, Value};

use super::options::{host_port, AgentgatewayOptions};
use crate::ir::callout_clusters::BUDGETS_CLUSTER;

/// The response body mode the filter needs: streamed, budget or not. The filter reads every
/// response's usage (the audit line, `gen_ai.client.token.usage`), and it asks an OpenAI stream
/// for its usage chunk, which it must then see to strip it from what the client gets.
pub(super) fn response_body_mode() -> &'static str {
    "fullDuplexStreamed"
}

/// The cluster the plugin config's budget service names, when it is set.
pub(super) fn cluster_name(opts: &AgentgatewayOptions) -> Option<String> {
    opts.budgets_service
        .as_ref()
        .map(|_| BUDGETS_CLUSTER.to_string())
}

/// `clusters:` of `ext-proc.yaml`: `llmkube-budgets` at `--budgets-service`.
pub(super) fn clusters(opts: &AgentgatewayOptions) -> Option<Value> {
    let (host, port) = opts.budgets_service.as_ref()?;
    Some(json!({BUDGETS_CLUSTER: {"address": host_port(host, *port)}}))
}
