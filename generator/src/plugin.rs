//! ModelRouter → `router_core::config::PluginConfig` (the JSON the filters load).

use std::time::Duration;

use router_core::config::{
    self as rc, BackendConfig, HeaderMatch, PluginConfig, RuleConfig,
    DEFAULT_CLASSIFICATION_HEADER, DEFAULT_COMPLEXITY_HEADER, DEFAULT_INFERENCE_PATHS,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MODELS_PATH, DEFAULT_MODEL_HEADER,
};

use router_core::budget::admit::DEFAULT_HOLD_TTL_S;
use router_core::budget::compiled::{
    BackendPrice, BudgetConfig, BudgetsConfig, ScopeName, DEFAULT_MAX_TOKENS,
};
use router_core::budget::team_slots::DEFAULT_MAX_TEAMS;

use crate::duration::parse_duration;
use crate::inputs::{namespace_of, router_key, Inputs};
use crate::model::*;

/// What the mapping needs besides the router itself.
#[derive(Debug, Clone, Copy)]
pub struct PluginContext<'a> {
    /// The other objects of the compile unit (InferenceServices fill `modelInfo.contextLength`).
    pub inputs: &'a Inputs,
    /// `--model-header`; `None` keeps `x-ai-eg-model`.
    pub model_header: Option<&'a str>,
    /// `--max-body-bytes`; `None` keeps 8 MiB.
    pub max_body_bytes: Option<u64>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// Resolves a timeout string against the cap (call after validation; invalid values fall back to
/// the cap).
fn resolve_timeout(s: Option<&str>, cap: Duration) -> Option<u64> {
    let d = parse_duration(s?)
        .ok()
        .filter(|d| !d.is_zero())
        .unwrap_or(cap);
    Some(ms(d.min(cap)))
}

/// Maps a (validated) ModelRouter to the plugin config. Rules keep their order; header names and
/// classifications are lower-cased; timeouts are resolved to milliseconds and never exceed
/// `spec.proxy.responseHeaderTimeout` (default 120s). Each backend carries its effective timeout
/// (its own, else the cap) so the filter never needs the proxy default; a rule carries one only when
/// it sets its own.
pub fn plugin_config(router: &ModelRouter, ctx: &PluginContext) -> PluginConfig {
    let spec = &router.spec;
    let namespace = namespace_of(&router.metadata);
    let cap = spec.response_header_cap();
    let model_header = ctx
        .model_header
        .unwrap_or(DEFAULT_MODEL_HEADER)
        .to_ascii_lowercase();
    let classification_header = spec
        .classification()
        .and_then(|c| c.header_key.as_deref())
        .unwrap_or(DEFAULT_CLASSIFICATION_HEADER)
        .to_ascii_lowercase();

    let backends = spec
        .backends
        .iter()
        .map(|b| backend_config(b, ctx, namespace, cap))
        .collect();
    let rules = spec.rules.iter().map(|r| rule_config(r, cap)).collect();

    PluginConfig {
        router: router_key(router),
        extra_stamped_headers: Vec::new(),
        model_header,
        max_body_bytes: ctx.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES),
        inference_paths: DEFAULT_INFERENCE_PATHS
            .iter()
            .map(|s| s.to_string())
            .collect(),
        models_path: DEFAULT_MODELS_PATH.to_string(),
        classification_header,
        complexity_header: DEFAULT_COMPLEXITY_HEADER.to_string(),
        sensitive_classifications: spec.sensitive_classifications(),
        default_route_strategy: spec.default_route_strategy.unwrap_or_default(),
        default_route: spec.default_route.clone(),
        backends,
        rules,
        audit: audit_config(spec.policy.as_ref().and_then(|p| p.audit_log.as_ref())),
        quarantine_ms: spec.quarantine().as_millis() as u64,
        auth: crate::auth::allow_config(spec),
        budgets: budgets_config(spec),
        // A gateway-specific trade, set by the target that makes it (agentgateway).
        failover_replay_limit: None,
        // Set by a target whose gateway cannot mirror the body (agentgateway).
        shadow: None,
    }
}

/// A backend as the filter reads it: its tier, weight, model facts (the context length from the
/// InferenceService when the manifest gives none) and timeout.
fn backend_config(
    b: &RouterBackend,
    ctx: &PluginContext,
    namespace: &str,
    cap: Duration,
) -> BackendConfig {
    let model_info = b.model_info.as_ref().map(|m| rc::ModelInfo {
        context_length: m.context_length.map(|c| c as u64).or_else(|| {
            let r = b.inference_service_ref.as_ref()?;
            ctx.inputs
                .inference_service(namespace, &r.name)?
                .context_length
        }),
        input_modalities: m.input_modalities.clone(),
        output_modalities: m.output_modalities.clone(),
    });
    BackendConfig {
        name: b.name.clone(),
        display_name: b.display_name.clone(),
        tier: b.effective_tier(),
        capabilities: b.capabilities.clone(),
        weight: b.effective_weight().clamp(0, u32::MAX as i64) as u32,
        model_info,
        external_model: b.external.as_ref().map(|e| e.model.clone()),
        served_model: b.inference_service_ref.as_ref().and_then(|r| {
            ctx.inputs
                .inference_service(namespace, &r.name)?
                .served_model
                .clone()
        }),
        provider: b.external.as_ref().map(|e| e.provider.as_str().to_string()),
        timeout_ms: resolve_timeout(b.timeout.as_deref(), cap).or(Some(ms(cap))),
        // Filled in by a target that picks pods (it knows the pods and its clusters).
        pick: None,
    }
}

/// A rule as the filter reads it: header names and classifications lowercased, its timeout
/// within the response-header cap.
fn rule_config(r: &RouterRule, cap: Duration) -> RuleConfig {
    let m = r.match_.clone().unwrap_or_default();
    RuleConfig {
        name: r.name.clone(),
        models: m.models.clone(),
        headers: m
            .headers
            .iter()
            .map(|(k, v)| HeaderMatch {
                name: k.to_ascii_lowercase(),
                value: v.clone(),
            })
            .collect(),
        task_complexity: m.task_complexity,
        data_classification: m
            .data_classification
            .iter()
            .map(|c| c.to_ascii_lowercase())
            .collect(),
        required_capabilities: m.required_capabilities.clone(),
        fail_closed: r.fail_closed.unwrap_or(false),
        strategy: r.route.strategy.unwrap_or_default(),
        backends: r.route.backends.clone(),
        timeout_ms: resolve_timeout(r.timeout.as_deref(), cap),
    }
}

/// Window of a budget that sets no `windowSeconds` (the seed gives no default): one hour.
pub const DEFAULT_BUDGET_WINDOW_S: u64 = 3600;

/// `spec.policy.budgets` → the filter's budgets config: scopes, caps and windows, and the price of
/// every backend that declares `costPerMillionTokens` (a backend without one is free). Ledgers
/// live in the gateway's shared data (the filter's default); `None` without budgets.
fn budgets_config(spec: &ModelRouterSpec) -> Option<BudgetsConfig> {
    let policy = spec.policy.as_ref().filter(|p| !p.budgets.is_empty())?;
    let budgets = policy
        .budgets
        .iter()
        .map(|b| BudgetConfig {
            name: b.name.clone(),
            scope: match b.scope {
                BudgetScope::Router => ScopeName::Router,
                BudgetScope::Rule => ScopeName::Rule,
                BudgetScope::Team => ScopeName::Team,
            },
            rule: b.rule_name.clone().filter(|_| b.scope == BudgetScope::Rule),
            header: b
                .header_key
                .as_ref()
                .filter(|_| b.scope == BudgetScope::Team)
                .map(|h| h.to_ascii_lowercase()),
            max_tokens: b.max_tokens.map(|t| t.max(1) as u64),
            max_usd: b.max_usd.clone(),
            window_s: b
                .window_seconds
                .map_or(DEFAULT_BUDGET_WINDOW_S, |w| w.max(1) as u64),
        })
        .collect();
    let prices = spec
        .backends
        .iter()
        .filter_map(|b| {
            let c = b.cost_per_million_tokens.as_ref()?;
            Some(BackendPrice {
                backend: b.name.clone(),
                prompt_usd: c.prompt_usd.clone(),
                completion_usd: c.completion_usd.clone(),
            })
        })
        .collect();
    Some(BudgetsConfig {
        budgets,
        prices,
        hold_ttl_s: DEFAULT_HOLD_TTL_S,
        default_max_tokens: DEFAULT_MAX_TOKENS,
        max_teams: DEFAULT_MAX_TEAMS,
        service: None,
        unsafe_charge_after: false,
        per_request: false,
        unsafe_worker_leases_unheld: false,
    })
}

/// The manifest field a problem of the filter's budgets config (`budgets[1].max_usd`,
/// `prices[0]`) comes from.
pub fn budget_field(spec: &ModelRouterSpec, config: &BudgetsConfig, path: &str) -> String {
    if let Some(rest) = path.strip_prefix("prices[") {
        let backend = rest
            .split(']')
            .next()
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| config.prices.get(i))
            .and_then(|p| spec.backends.iter().position(|b| b.name == p.backend));
        if let Some(j) = backend {
            return format!("spec.backends[{j}].costPerMillionTokens");
        }
    }
    if let Some((head, field)) = path.split_once("].") {
        if let Some(i) = head.strip_prefix("budgets[") {
            let field = match field {
                "max_usd" => "maxUSD",
                "max_tokens" => "maxTokens",
                "window_s" => "windowSeconds",
                "rule" => "ruleName",
                "header" => "headerKey",
                other => other,
            };
            return format!("spec.policy.budgets[{i}].{field}");
        }
    }
    "spec.policy.budgets".to_string()
}

fn audit_config(a: Option<&crate::model::AuditLog>) -> rc::AuditConfig {
    let Some(a) = a else {
        return rc::AuditConfig::default();
    };
    rc::AuditConfig {
        caller_header: a.caller_header.as_ref().map(|h| h.to_ascii_lowercase()),
        log_client_address: a.log_client_address.unwrap_or(false),
        trusted_proxy_cidrs: a.trusted_proxy_cidrs.clone().unwrap_or_default(),
        include_request_body: a.include_request_body.unwrap_or(false),
    }
}
