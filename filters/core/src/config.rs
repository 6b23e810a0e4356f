//! The plugin configuration: the contract between the generator (which writes it as JSON into the
//! gateway config) and the filters (which read it once per VM in `on_configure`).
//!
//! Unknown fields are refused so that a generator/filter version skew fails loudly at config load
//! instead of silently dropping a policy.

use serde::{Deserialize, Serialize};

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

/// Headers that carry routing decisions. They are stamped only by the filters; whatever a client
/// sent under these names is removed before anything reads them.
pub const RULE_HEADER: &str = "x-llmkube-rule";
pub const BACKEND_HEADER: &str = "x-llmkube-backend";
pub const DESTINATION_ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
pub const SHADOW_HEADER: &str = "x-llmkube-shadow";
/// The attempt order (`orders::route_key`); the route table matches it exactly.
pub const ROUTE_HEADER: &str = "x-llmkube-route";
/// `true` on requests of a sensitive class, for the per-attempt guard in the upstream filter.
pub const SENSITIVE_HEADER: &str = "x-llmkube-sensitive";
/// Set by the upstream filter on each attempt to the backend it goes to, so per-backend
/// upstream filters (credential injection) can select on it.
pub const ATTEMPT_BACKEND_HEADER: &str = "x-llmkube-attempt-backend";
/// Where the body's `model` value sits (`rewrite::format_span`), stamped when an attempt may go to
/// an external backend, so the per-attempt filter rewrites it without scanning the body again.
pub const MODEL_SPAN_HEADER: &str = "x-llmkube-model-span";

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
    /// For external backends: `openai`, `anthropic` or `litellm` (provider headers differ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Per-backend response-header timeout in milliseconds (already resolved against the cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
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
        let mut names: Vec<String> = [
            self.model_header.as_str(),
            DEFAULT_MODEL_HEADER,
            RULE_HEADER,
            BACKEND_HEADER,
            DESTINATION_ENDPOINT_HEADER,
            SHADOW_HEADER,
            ROUTE_HEADER,
            SENSITIVE_HEADER,
            ATTEMPT_BACKEND_HEADER,
            MODEL_SPAN_HEADER,
        ]
        .iter()
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
