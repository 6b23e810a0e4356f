//! `shadow`: copies of shadow rules' requests that the filter sends itself, by an HTTP callout,
//! on gateways whose own mirrors cannot carry the request body (agentgateway). Absent on the
//! Envoy targets, whose routes mirror (`request_mirror_policies`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// Copies in flight to one target, across the gateway's workers; more are dropped and
    /// counted.
    pub max_in_flight: u32,
    /// One per mirrored backend; only local backends take copies from the filter.
    pub targets: Vec<ShadowTarget>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowTarget {
    /// The backend mirrored to.
    pub backend: String,
    /// The callout cluster that reaches it.
    pub cluster: String,
    /// `:authority` of the copy (the backend's `host:port`).
    pub authority: String,
    /// The backend URL's path, which replaces the request path's leading `/v1` (as the
    /// gateway's rewrite does for the backend's own attempts); absent: the path as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// How long a copy may take; its answer is discarded either way.
    pub timeout_ms: u64,
}
