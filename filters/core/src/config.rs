//! The plugin configuration: the contract between the generator (which writes it as JSON into the
//! gateway config) and the filters (which read it once per VM in `on_configure`).
//!
//! Unknown fields are refused so that a generator/filter version skew fails loudly at config load
//! instead of silently dropping a policy.

use serde::{Deserialize, Serialize};

pub mod auth;
pub mod budgets;
pub mod pick;
pub mod shadow;

pub const DEFAULT_MODEL_HEADER: &str = "x-ai-eg-model";
pub const DEFAULT_CLASSIFICATION_HEADER: &str = "x-llmkube-classification";
pub const DEFAULT_COMPLEXITY_HEADER: &str = "x-llmkube-task-complexity";
pub const DEFAULT_MAX_BODY_BYTES: u64 = 8 * 1024 * 1024;
pub const DEFAULT_MODELS_PATH: &str = "/v1/models";
pub const DEFAULT_INFERENCE_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
];
pub const DEFAULT_SENSITIVE: &[&str] = &["pii", "phi"];

// Decision headers live in `headers`; re-exported here for the generator's existing imports.
pub use crate::headers::{
    ATTEMPT_BACKEND_HEADER, BACKEND_HEADER, DESTINATION_ENDPOINT_HEADER, MODEL_SPAN_HEADER,
    ROUTE_HEADER, RULE_HEADER, SENSITIVE_HEADER, SHADOW_HEADER,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// `namespace/name` of the ModelRouter, for audit lines and logs.
    pub router: String,
    #[serde(default = "default_model_header")]
    pub model_header: String,
    /// Extra decision-header names to strip on every request (e.g. `x-gateway-base-model-name`
    /// when `model_header` is configured differently from the default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_stamped_headers: Vec<String>,
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
    #[serde(default = "default_inference_paths")]
    pub inference_paths: Vec<String>,
    #[serde(default = "default_models_path")]
    pub models_path: String,
    #[serde(default = "default_classification_header")]
    pub classification_header: String,
    #[serde(default = "default_complexity_header")]
    pub complexity_header: String,
    #[serde(default = "default_sensitive")]
    pub sensitive_classifications: Vec<String>,
    #[serde(default)]
    pub default_route_strategy: DefaultRouteStrategy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_route: Option<String>,
    pub backends: Vec<BackendConfig>,
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    #[serde(default, skip_serializing_if = "AuditConfig::is_default")]
    pub audit: AuditConfig,
    /// `spec.proxy.quarantineDuration` in milliseconds: how long a backend whose stream went
    /// silent past the idle timeout stays out of the attempt orders the filter stamps.
    #[serde(default = "default_quarantine_ms")]
    pub quarantine_ms: u64,
    /// `policy.auth.allowlists` and the header the verified team arrives in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<auth::AllowConfig>,
    /// `spec.policy.budgets`, compiled by the filter at configure time (`budget::compiled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<budgets::BudgetsConfig>,
    /// The gateway replays a request body of at most this many bytes for another attempt
    /// (agentgateway: 64 KiB), and the router was compiled to accept that: a larger request
    /// whose order has more than one backend gets one attempt, which the filter counts and
    /// audits (`replay::failover_skipped`). `None`: every attempt order fails over whatever
    /// the body's size (Envoy buffers the whole body).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_replay_limit: Option<u64>,
    /// Shadow copies the filter sends itself (`crate::shadow`); `None` where the gateway
    /// mirrors them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<shadow::ShadowConfig>,
}

/// `spec.policy.auditLog`, as far as the filter acts on it (the sink is the gateway's log).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Lower-cased header whose value is logged as `caller` (credential headers are refused by
    /// the generator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_header: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub log_client_address: bool,
    /// CIDRs or addresses whose X-Forwarded-For is believed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxy_cidrs: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_request_body: bool,
}

impl AuditConfig {
    pub fn is_default(&self) -> bool {
        *self == AuditConfig::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DefaultRouteStrategy {
    #[default]
    Static,
    BackendNameMatch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    #[default]
    Local,
    Cloud,
}

impl Tier {
    /// The wire name (`local`, `cloud`): in the plugin config, endpoint metadata and audit lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Local => "local",
            Tier::Cloud => "cloud",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        [Tier::Local, Tier::Cloud]
            .into_iter()
            .find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default)]
    pub tier: Tier,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Published on `/v1/models`; `None` publishes only the id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_info: Option<ModelInfo>,
    /// For external backends: the provider's model name the body's `model` becomes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_model: Option<String>,
    /// For local backends: the model name the engine serves (vLLM `--served-model-name`, the
    /// InferenceService's model name), which the body's `model` becomes on the way to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model: Option<String>,
    /// For external backends: a `Provider` wire name (provider headers differ). A string here so
    /// the JSON stays as it is; `Router::new` refuses a name it does not know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Per-backend response-header timeout in milliseconds (already resolved against the cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The filter picks this backend's pod (`resolution: endpoint`, `balancing` LoadAware).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pick: Option<pick::PickConfig>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    /// `None`: derived from capabilities (vision → text+image, else text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_modalities: Option<Vec<String>>,
    /// `None`: `["text"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_modalities: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    #[default]
    PrimaryFallback,
    Weighted,
    Shadow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskComplexity {
    Simple,
    Moderate,
    Complex,
}

impl TaskComplexity {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskComplexity::Simple => "simple",
            TaskComplexity::Moderate => "moderate",
            TaskComplexity::Complex => "complex",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Exact-value header matches; names are compared case-insensitively (stored lower-cased).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_complexity: Option<TaskComplexity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_classification: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_capabilities: Vec<String>,
    #[serde(default)]
    pub fail_closed: bool,
    #[serde(default)]
    pub strategy: Strategy,
    pub backends: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    pub name: String,
    pub value: String,
}

fn default_model_header() -> String {
    DEFAULT_MODEL_HEADER.to_string()
}
fn default_max_body_bytes() -> u64 {
    DEFAULT_MAX_BODY_BYTES
}
fn default_inference_paths() -> Vec<String> {
    DEFAULT_INFERENCE_PATHS
        .iter()
        .map(|s| s.to_string())
        .collect()
}
fn default_models_path() -> String {
    DEFAULT_MODELS_PATH.to_string()
}
fn default_classification_header() -> String {
    DEFAULT_CLASSIFICATION_HEADER.to_string()
}
fn default_complexity_header() -> String {
    DEFAULT_COMPLEXITY_HEADER.to_string()
}
fn default_sensitive() -> Vec<String> {
    DEFAULT_SENSITIVE.iter().map(|s| s.to_string()).collect()
}
pub const DEFAULT_QUARANTINE_MS: u64 = 15_000;
fn default_quarantine_ms() -> u64 {
    DEFAULT_QUARANTINE_MS
}
fn default_weight() -> u32 {
    1
}

impl PluginConfig {
    /// Every header name a client must never be able to set, lower-cased.
    pub fn stamped_headers(&self) -> Vec<String> {
        let mut names: Vec<String> = [self.model_header.as_str(), DEFAULT_MODEL_HEADER]
            .iter()
            .chain(crate::headers::DECISION_HEADERS)
            .map(|s| s.to_ascii_lowercase())
            .chain(
                self.extra_stamped_headers
                    .iter()
                    .map(|s| s.to_ascii_lowercase()),
            )
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_names_match_the_wire() {
        for t in [Tier::Local, Tier::Cloud] {
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{t}\""));
            assert_eq!(Tier::parse(t.as_str()), Some(t));
        }
        assert_eq!(Tier::parse("Local"), None);
    }

    #[test]
    fn every_decision_header_is_stamped_only_by_the_filters() {
        let cfg: PluginConfig = serde_json::from_value(serde_json::json!({
            "router": "r", "backends": [], "model_header": "X-Model",
            "extra_stamped_headers": ["X-Gateway-Base-Model-Name"]
        }))
        .unwrap();
        let stamped = cfg.stamped_headers();
        for h in crate::headers::DECISION_HEADERS {
            assert!(stamped.iter().any(|s| s == h), "{h}");
        }
        for h in ["x-model", DEFAULT_MODEL_HEADER, "x-gateway-base-model-name"] {
            assert!(stamped.iter().any(|s| s == h), "{h}");
        }
    }
}
