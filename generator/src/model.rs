//! Typed model of the LLMKube `ModelRouter` (inference.llmkube.dev/v1alpha1) spec.
//!
//! Every field of `spec` in the CRD reference is modelled; unknown fields are refused
//! (`deny_unknown_fields`) so a typo never silently drops a policy. Integer fields are `i64` so that
//! range checks (minimum/maximum from the schema) can name the limit instead of failing in serde.
//! The pod-spec passthrough blobs under `spec.proxy` are generic JSON values checked lightly.
//! Defaults stated by the reference are exposed as methods, not baked into the parsed values, so the
//! validator can tell "unset" from "set to the default".

use std::collections::BTreeMap;
use std::time::Duration;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Enums whose wire names the spec and the plugin config share: one definition, the core's.
pub use router_core::config::{DefaultRouteStrategy, Strategy, TaskComplexity, Tier};
pub use router_core::provider::Provider;

pub const API_VERSION: &str = "inference.llmkube.dev/v1alpha1";
pub const DEFAULT_RESPONSE_HEADER_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const DEFAULT_QUARANTINE: Duration = Duration::from_secs(15);
pub const DEFAULT_SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
pub const DEFAULT_BLOCK_BYTES: i64 = 1024;
pub const DEFAULT_MAX_BLOCKS_PER_ENDPOINT: i64 = 16384;
pub const DEFAULT_TEAM_HEADER: &str = "x-llmkube-team";

/// `spec` of a ModelRouter.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "inference.llmkube.dev",
    version = "v1alpha1",
    kind = "ModelRouter",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelRouterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_gateway_ref: Option<AgentGatewayRef>,
    pub backends: Vec<RouterBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_plane: Option<DataPlane>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_route: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_route_strategy: Option<DefaultRouteStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<EndpointSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_ref: Option<GatewayRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<McpServer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RouterRule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DataPlane {
    #[default]
    Proxy,
    Gateway,
    AgentGateway,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentGatewayRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker_port: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostnames: Option<Vec<String>>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<AgentGatewayRouting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AgentGatewayRouting {
    #[default]
    InferencePool,
    Model,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouterBackend {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balancing: Option<Balancing>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_million_tokens: Option<CostPerMillionTokens>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker: Option<BackendEndpointPicker>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_service_ref: Option<LocalObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_info: Option<ModelInfo>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
}

impl RouterBackend {
    /// The tier used for rule checks and the plugin config. Unset: `local` for an
    /// InferenceService backend, `cloud` for an external one (it egresses the cluster, so a
    /// fail-closed rule must not reach it unless the manifest says otherwise explicitly).
    pub fn effective_tier(&self) -> Tier {
        self.tier.unwrap_or(if self.external.is_some() {
            Tier::Cloud
        } else {
            Tier::Local
        })
    }
    pub fn effective_weight(&self) -> i64 {
        self.weight.unwrap_or(1)
    }
    pub fn resolution(&self) -> Resolution {
        self.resolution.unwrap_or_default()
    }
    /// The model id published on /v1/models and matched by BackendNameMatch.
    pub fn model_id(&self) -> &str {
        self.display_name.as_deref().unwrap_or(&self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    #[default]
    Service,
    Endpoint,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Balancing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<BalancingMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_affinity: Option<PrefixAffinity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum BalancingMode {
    #[default]
    RoundRobin,
    LoadAware,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefixAffinity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_blocks_per_endpoint: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionAffinity {
    pub headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<String>,
    /// Deprecated, accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_load_percent: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CostPerMillionTokens {
    #[serde(
        default,
        rename = "completionUSD",
        skip_serializing_if = "Option::is_none"
    )]
    pub completion_usd: Option<String>,
    #[serde(default, rename = "promptUSD", skip_serializing_if = "Option::is_none")]
    pub prompt_usd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendEndpointPicker {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<EndpointPickerService>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPickerService {
    pub name: String,
    pub port: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExternalBackend {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<LocalObjectReference>,
    pub model: String,
    pub provider: Provider,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
}

/// `{name}` reference to an object in the ModelRouter's namespace.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalObjectReference {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_modalities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_modalities: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<ExternalTrafficPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<EndpointGateway>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub service_type: Option<ServiceType>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeySelector {
    pub key: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExternalTrafficPolicy {
    Cluster,
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceType {
    ClusterIP,
    NodePort,
    LoadBalancer,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointGateway {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    pub gateway_ref: GatewayRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_log: Option<AuditLog>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<Budget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classification: Option<Classification>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditLog {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller_header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_request_body: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_client_address: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<AuditSink>,
    #[serde(
        default,
        rename = "trustedProxyCIDRs",
        skip_serializing_if = "Option::is_none"
    )]
    pub trusted_proxy_cidrs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditSink {
    #[default]
    Stdout,
    File,
    Otlp,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Auth {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowlists: Vec<Allowlist>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<Jwt>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allowlist {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    pub team: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Jwt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_key: Option<String>,
    pub issuer: String,
    #[serde(rename = "jwksURI")]
    pub jwks_uri: String,
    pub provider: String,
    pub team_claim: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    #[serde(default, rename = "maxUSD", skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    pub scope: BudgetScope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_seconds: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetScope {
    Router,
    Rule,
    Team,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Classification {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClassificationMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitive_classifications: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassificationMode {
    #[default]
    HeaderOnly,
    Detector,
    Hybrid,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProxySpec {
    /// Pod-spec passthrough (core/v1 Affinity), checked lightly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine_duration: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    /// Pod-spec passthrough (core/v1 ResourceRequirements), checked lightly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_idle_timeout: Option<String>,
    /// Pod-spec passthrough ([]core/v1 Toleration), checked lightly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<serde_json::Value>,
    /// Pod-spec passthrough ([]core/v1 TopologySpreadConstraint), checked lightly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouterRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_closed: Option<bool>,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<RuleMatch>,
    pub name: String,
    pub route: RuleRoute,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleMatch {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_classification: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(
        default,
        rename = "latencySLOMs",
        skip_serializing_if = "Option::is_none"
    )]
    pub latency_slo_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_complexity: Option<TaskComplexity>,
}

impl RuleMatch {
    pub fn is_catch_all(&self) -> bool {
        self.data_classification.is_empty()
            && self.headers.is_empty()
            && self.models.is_empty()
            && self.required_capabilities.is_empty()
            && self.task_complexity.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleRoute {
    pub backends: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_activation: Option<PoolActivation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolActivation {
    Wait,
    IfIdle,
}

impl ModelRouterSpec {
    pub fn backend(&self, name: &str) -> Option<&RouterBackend> {
        self.backends.iter().find(|b| b.name == name)
    }
    pub fn classification(&self) -> Option<&Classification> {
        self.policy.as_ref().and_then(|p| p.classification.as_ref())
    }
    /// Sensitive classes, lower-cased (default `pii`, `phi`).
    pub fn sensitive_classifications(&self) -> Vec<String> {
        match self
            .classification()
            .and_then(|c| c.sensitive_classifications.as_ref())
        {
            Some(list) => list.iter().map(|s| s.to_ascii_lowercase()).collect(),
            None => router_core::config::DEFAULT_SENSITIVE
                .iter()
                .map(|s| s.to_string())
                .collect(),
        }
    }
    /// A `spec.proxy` duration; `None` when unset or unparsable (validation reports those).
    fn proxy_duration(&self, field: impl Fn(&ProxySpec) -> Option<&String>) -> Option<Duration> {
        let s = self.proxy.as_ref().and_then(field)?;
        crate::duration::parse_duration(s).ok()
    }
    /// `proxy.quarantineDuration`, default 15s (validation refuses 0 and unparsable values).
    pub fn quarantine(&self) -> Duration {
        self.proxy_duration(|p| p.quarantine_duration.as_ref())
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_QUARANTINE)
    }
    /// The response-header timeout cap (`proxy.responseHeaderTimeout`, default 120s): the
    /// timeout of an attempt without its own, and the bound of every rule or backend timeout.
    pub fn response_header_cap(&self) -> Duration {
        self.proxy_duration(|p| p.response_header_timeout.as_ref())
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_RESPONSE_HEADER_TIMEOUT)
    }
    /// `proxy.streamIdleTimeout`, default 300s; zero turns the idle timeout off.
    pub fn stream_idle_timeout(&self) -> Duration {
        self.proxy_duration(|p| p.stream_idle_timeout.as_ref())
            .unwrap_or(DEFAULT_STREAM_IDLE_TIMEOUT)
    }
}
