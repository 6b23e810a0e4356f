//! The rule engine: which backend serves a request, per the ModelRouter semantics.
//!
//! Order: rules in declaration order (first match wins, every set condition must hold), then
//! `BackendNameMatch` (a backend whose displayName, else name, equals the model), then
//! `defaultRoute`, else 404. On top of that the sensitive-data guard: a request whose
//! classification is sensitive is served only by `tier: local` backends, whatever route it took;
//! if its route has none, it gets 503 `fail_closed` instead of leaving the cluster.

use crate::allow::Allowlists;
use crate::config::budgets::{ScopeName, DEFAULT_TEAM_HEADER};
use crate::config::{BackendConfig, PluginConfig, RuleConfig, Strategy, TaskComplexity, Tier};
use crate::errors::ApiError;
use crate::glob::Glob;
use crate::orders;
use crate::provider::Provider;
use crate::verdict::{Miss, Signals};
use hashbrown::HashMap;

#[derive(Debug)]
pub struct Router {
    pub config: PluginConfig,
    backends: Vec<Backend>,
    rules: Vec<Rule>,
    by_model: HashMap<String, usize>,
    default_route: Option<usize>,
    sensitive: Vec<String>,
    classification_header: String,
    complexity_header: String,
    /// Lower-cased names of every request header a decision may read.
    needed_headers: Vec<String>,
    models: crate::models::ModelTable,
    tiers: Vec<Tier>,
    weights: Vec<u32>,
    /// `policy.auth.allowlists`, when set.
    allow: Option<Allowlists>,
}

#[derive(Debug)]
pub struct Backend {
    pub name: String,
    pub tier: Tier,
    pub capabilities: Vec<String>,
    pub weight: u32,
    pub external_model: Option<String>,
    /// A local backend's served model name (`None` for external ones: `external_model` rules).
    pub served_model: Option<String>,
    pub provider: Option<Provider>,
    pub timeout_ms: Option<u64>,
}

impl Backend {
    /// The name the body's `model` becomes on an attempt to this backend: the provider's model
    /// of an external backend, the served model name of a local one, when known.
    pub fn rewrite_model(&self) -> Option<&str> {
        self.external_model
            .as_deref()
            .or(self.served_model.as_deref())
    }
}

#[derive(Debug)]
pub struct Rule {
    pub name: String,
    globs: Vec<Glob>,
    headers: Vec<(String, String)>,
    complexity: Option<TaskComplexity>,
    classes: Vec<String>,
    /// The rule's backends that advertise every required capability, in declared order.
    pub candidates: Vec<usize>,
    pub fail_closed: bool,
    pub strategy: Strategy,
    pub timeout_ms: Option<u64>,
}

/// The request headers a decision reads: only the names `Router::needed_headers` lists,
/// lower-cased, with every value a client sent (repeats included).
#[derive(Debug, Default, Clone)]
pub struct RequestHeaders {
    pairs: Vec<(String, String)>,
}

impl RequestHeaders {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn clear(&mut self) {
        self.pairs.clear();
    }

    pub fn push(&mut self, lower_name: String, value: String) {
        self.pairs.push((lower_name, value));
    }

    /// The first value of `name` (lower-cased), if any.
    pub fn first(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name` (lower-cased), in the order sent.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.pairs
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Values of a list-valued header: repeated headers and comma-separated items, trimmed and
    /// lower-cased.
    fn items<'a>(&'a self, name: &'a str) -> impl Iterator<Item = String> + 'a {
        self.all(name).flat_map(|v| {
            v.split(',')
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
        })
    }
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Index of the matched rule; `None` when BackendNameMatch or the default route served.
    pub rule: Option<usize>,
    /// Backends in attempt order (never empty); Envoy fails over along it.
    pub order: Vec<usize>,
    /// The request carries a sensitive classification: only local backends may serve it.
    pub sensitive: bool,
}

impl Decision {
    /// The backend tried first.
    pub fn backend(&self) -> usize {
        self.order[0]
    }
}

/// Backend positions by name; a name declared twice is an error.
fn backend_index(config: &PluginConfig) -> Result<HashMap<&str, usize>, String> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, b) in config.backends.iter().enumerate() {
        if index.insert(b.name.as_str(), i).is_some() {
            return Err(format!("backend {:?} is declared twice", b.name));
        }
    }
    Ok(index)
}

/// Lower-cased names of every request header a decision may read: the classification and
/// complexity headers, the rules' header matches, the allowlists' team header and the team
/// budgets' headers (a team budget is keyed by a header's value: read with the routing headers).
fn needed_headers(
    config: &PluginConfig,
    rules: &[Rule],
    allow: Option<&Allowlists>,
) -> Vec<String> {
    let mut needed = vec![
        config.classification_header.to_ascii_lowercase(),
        config.complexity_header.to_ascii_lowercase(),
    ];
    for r in rules {
        needed.extend(r.headers.iter().map(|(n, _)| n.clone()));
    }
    needed.extend(allow.iter().map(|a| a.team_header().to_string()));
    let budgets = config.budgets.iter().flat_map(|b| &b.budgets);
    needed.extend(budgets.filter(|b| b.scope == ScopeName::Team).map(|b| {
        b.header
            .as_deref()
            .unwrap_or(DEFAULT_TEAM_HEADER)
            .to_ascii_lowercase()
    }));
    needed.sort();
    needed.dedup();
    needed
}

impl Backend {
    /// A backend as the plugin config declares it; an unknown provider name is an error.
    fn new(b: &BackendConfig) -> Result<Backend, String> {
        let provider = match b.provider.as_deref() {
            None => None,
            Some(p) => Some(
                Provider::parse(p)
                    .ok_or_else(|| format!("backend {:?} names unknown provider {p:?}", b.name))?,
            ),
        };
        Ok(Backend {
            name: b.name.clone(),
            tier: b.tier,
            capabilities: b.capabilities.clone(),
            weight: b.weight,
            external_model: b.external_model.clone(),
            served_model: b
                .served_model
                .clone()
                .filter(|_| b.external_model.is_none()),
            provider,
            timeout_ms: b.timeout_ms,
        })
    }
}

impl Rule {
    /// A rule with its model globs compiled and its candidates: the named backends (each must
    /// exist) that advertise every required capability, in declared order.
    fn new(
        r: &RuleConfig,
        backends: &[Backend],
        lookup: &dyn Fn(&str, &str) -> Result<usize, String>,
    ) -> Result<Rule, String> {
        let mut globs = Vec::with_capacity(r.models.len());
        for m in &r.models {
            globs.push(Glob::new(m).map_err(|e| format!("rule {:?}: {e}", r.name))?);
        }
        let mut candidates = Vec::with_capacity(r.backends.len());
        for name in &r.backends {
            let i = lookup(name, &format!("rule {:?}", r.name))?;
            let caps = &backends[i].capabilities;
            if r.required_capabilities.iter().all(|c| caps.contains(c)) {
                candidates.push(i);
            }
        }
        Ok(Rule {
            name: r.name.clone(),
            globs,
            headers: r
                .headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), h.value.clone()))
                .collect(),
            complexity: r.task_complexity,
            classes: r
                .data_classification
                .iter()
                .map(|c| c.to_ascii_lowercase())
                .collect(),
            candidates,
            fail_closed: r.fail_closed,
            strategy: r.strategy,
            timeout_ms: r.timeout_ms,
        })
    }
}

impl Router {
    /// Parses and compiles the plugin configuration JSON the generator wrote.
    pub fn from_json(raw: &[u8]) -> Result<Router, String> {
        let config: PluginConfig =
            serde_json::from_slice(raw).map_err(|e| format!("invalid configuration: {e}"))?;
        Router::new(config)
    }

    /// Compiles a plugin config. Errors name what is wrong; the filter refuses to start on them.
    pub fn new(config: PluginConfig) -> Result<Router, String> {
        let index = backend_index(&config)?;
        let lookup = |name: &str, what: &str| {
            index
                .get(name)
                .copied()
                .ok_or_else(|| format!("{what} names unknown backend {name:?}"))
        };
        let backends = config
            .backends
            .iter()
            .map(Backend::new)
            .collect::<Result<Vec<_>, _>>()?;
        let rules = config
            .rules
            .iter()
            .map(|r| Rule::new(r, &backends, &lookup))
            .collect::<Result<Vec<_>, _>>()?;
        let default_route = match &config.default_route {
            Some(name) => Some(lookup(name, "defaultRoute")?),
            None => None,
        };
        drop(index);
        let mut by_model = HashMap::new();
        for (i, b) in config.backends.iter().enumerate() {
            by_model
                .entry(b.display_name.clone().unwrap_or_else(|| b.name.clone()))
                .or_insert(i);
        }
        let allow = config.auth.as_ref().map(Allowlists::new).transpose()?;
        let needed_headers = needed_headers(&config, &rules, allow.as_ref());
        let models = crate::models::ModelTable::new(&config);
        let tiers: Vec<Tier> = backends.iter().map(|b| b.tier).collect();
        let weights: Vec<u32> = backends.iter().map(|b| b.weight).collect();
        Ok(Router {
            sensitive: config
                .sensitive_classifications
                .iter()
                .map(|c| c.to_ascii_lowercase())
                .collect(),
            backends,
            rules,
            by_model,
            default_route,
            classification_header: config.classification_header.to_ascii_lowercase(),
            complexity_header: config.complexity_header.to_ascii_lowercase(),
            needed_headers,
            models,
            tiers,
            weights,
            allow,
            config,
        })
    }

    pub fn needed_headers(&self) -> &[String] {
        &self.needed_headers
    }

    /// The classification header's name, lower-cased (as [`RequestHeaders`] keeps names).
    pub fn classification_header(&self) -> &str {
        &self.classification_header
    }

    /// The task-complexity header's name, lower-cased.
    pub fn complexity_header(&self) -> &str {
        &self.complexity_header
    }

    /// The allowlists step, when `policy.auth.allowlists` is set.
    pub fn allowlists(&self) -> Option<&Allowlists> {
        self.allow.as_ref()
    }

    pub fn backend(&self, i: usize) -> &Backend {
        &self.backends[i]
    }

    /// Index of the backend named `name` (its `spec.backends[].name`).
    pub fn backend_index(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| b.name == name)
    }

    pub fn rule(&self, i: usize) -> &Rule {
        &self.rules[i]
    }

    /// The `/v1/models` response body, built once at config load.
    pub fn models_body(&self) -> &[u8] {
        self.models.list()
    }

    /// The `/v1/models/{id}` response body, when `/v1/models` lists `id`.
    pub fn model_body(&self, id: &str) -> Option<&[u8]> {
        self.models.entry(id)
    }

    /// Decides where a request goes, every backend counted healthy. `random` supplies entropy
    /// for weighted rules.
    pub fn decide(
        &self,
        model: &str,
        headers: &RequestHeaders,
        random: &mut dyn FnMut() -> u64,
    ) -> Result<Decision, ApiError> {
        self.decide_among(model, headers, &|_| true, random)
    }

    /// Decides where a request goes when only backends for which `healthy` holds may be tried.
    /// A rule left with none falls through to later rules, unless it is fail-closed or the
    /// request sensitive (503 `fail_closed`); when nothing else resolves, 502
    /// `all_backends_failed` rather than 404, since a rule did match.
    pub fn decide_among(
        &self,
        model: &str,
        headers: &RequestHeaders,
        healthy: &dyn Fn(usize) -> bool,
        random: &mut dyn FnMut() -> u64,
    ) -> Result<Decision, ApiError> {
        let Signals {
            classes,
            sensitive,
            complexity,
        } = self.signals(headers);

        let mut matched_unhealthy = false;
        for (ri, rule) in self.rules.iter().enumerate() {
            if self
                .check_rule(rule, model, headers, &classes, complexity.as_deref())
                .is_err()
            {
                continue;
            }
            let order = orders::pick_order(&self.order_input(rule), sensitive, healthy, random);
            if !order.is_empty() {
                return Ok(Decision {
                    rule: Some(ri),
                    order,
                    sensitive,
                });
            }
            // No backend of this rule may serve the request. A fail-closed rule answers for its
            // requests; any other rule lets them fall through, as the ModelRouter spec describes.
            if rule.fail_closed || sensitive {
                return Err(self.refuse(&classes, sensitive, &format!("rule {:?}", rule.name)));
            }
            matched_unhealthy = true;
        }
        if self.config.default_route_strategy
            == crate::config::DefaultRouteStrategy::BackendNameMatch
        {
            if let Some(&b) = self.by_model.get(model) {
                return self.unruled(
                    b,
                    sensitive,
                    healthy,
                    &classes,
                    "the backend named by the model",
                );
            }
        }
        match self.default_route {
            Some(b) => self.unruled(b, sensitive, healthy, &classes, "the default route"),
            None if matched_unhealthy => Err(ApiError::all_backends_failed(503)),
            None => Err(ApiError::model_not_found(model)),
        }
    }

    fn order_input<'a>(&'a self, rule: &'a Rule) -> orders::OrderInput<'a> {
        orders::OrderInput {
            strategy: rule.strategy,
            candidates: &rule.candidates,
            tiers: &self.tiers,
            weights: &self.weights,
        }
    }

    /// Every attempt order the filter can stamp for rule `i` (the generator emits one route each).
    pub fn rule_orders(&self, i: usize) -> Vec<Vec<usize>> {
        orders::all_orders(&self.order_input(&self.rules[i]))
    }

    /// Backends a request can reach without a rule (BackendNameMatch, default route).
    pub fn unruled_targets(&self) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        if self.config.default_route_strategy
            == crate::config::DefaultRouteStrategy::BackendNameMatch
        {
            out.extend(self.by_model.values().copied());
        }
        out.extend(self.default_route);
        out.sort_unstable();
        out.dedup();
        out
    }

    pub fn rules_len(&self) -> usize {
        self.rules.len()
    }

    pub fn backends_len(&self) -> usize {
        self.backends.len()
    }

    /// The route key the filter stamps for a decision.
    pub fn route_key(&self, d: &Decision) -> String {
        let names = d.order.iter().map(|&b| self.backends[b].name.as_str());
        let rule = d
            .rule
            .map_or(orders::UNRULED, |r| self.rules[r].name.as_str());
        orders::route_key(rule, names)
    }

    /// What the request headers say about routing: its classifications (lower-cased), whether
    /// one is sensitive, and its task complexity.
    pub(crate) fn signals(&self, headers: &RequestHeaders) -> Signals {
        let classes: Vec<String> = headers.items(&self.classification_header).collect();
        let sensitive = classes.iter().any(|c| self.sensitive.contains(c));
        let complexity = headers
            .all(&self.complexity_header)
            .next()
            .map(|v| v.trim().to_ascii_lowercase());
        Signals {
            classes,
            sensitive,
            complexity,
        }
    }

    /// Whether `rule` matches, or the first of its conditions that fails. The decision and
    /// `explain` both ask this, so an explanation cannot disagree with the gateway.
    pub(crate) fn check_rule(
        &self,
        rule: &Rule,
        model: &str,
        headers: &RequestHeaders,
        classes: &[String],
        complexity: Option<&str>,
    ) -> Result<(), Miss> {
        // A rule whose backends lack the required capabilities can never serve: it never matches.
        if rule.candidates.is_empty() {
            return Err(Miss::NoCapableBackend);
        }
        if !rule.globs.is_empty() && !rule.globs.iter().any(|g| g.matches(model)) {
            return Err(Miss::Model);
        }
        if let Some(want) = rule.complexity {
            if complexity != Some(want.as_str()) {
                return Err(Miss::TaskComplexity);
            }
        }
        if !rule.classes.is_empty() && !classes.iter().any(|c| rule.classes.contains(c)) {
            return Err(Miss::Classification);
        }
        match rule
            .headers
            .iter()
            .position(|(name, value)| !headers.all(name).any(|v| v == value))
        {
            Some(i) => Err(Miss::Header(i)),
            None => Ok(()),
        }
    }

    fn unruled(
        &self,
        backend: usize,
        sensitive: bool,
        healthy: &dyn Fn(usize) -> bool,
        classes: &[String],
        what: &str,
    ) -> Result<Decision, ApiError> {
        if sensitive && self.backends[backend].tier != Tier::Local {
            return Err(self.refuse(classes, true, what));
        }
        if !healthy(backend) {
            return Err(if sensitive {
                ApiError::fail_closed(format!("{what} is quarantined"))
            } else {
                ApiError::all_backends_failed(503)
            });
        }
        Ok(Decision {
            rule: None,
            order: vec![backend],
            sensitive,
        })
    }

    fn refuse(&self, classes: &[String], sensitive: bool, route: &str) -> ApiError {
        if !sensitive {
            return ApiError::fail_closed(format!(
                "{route} is fail-closed and none of its backends may serve this request"
            ));
        }
        let class = classes
            .iter()
            .find(|c| self.sensitive.contains(c))
            .map(String::as_str)
            .unwrap_or("sensitive");
        ApiError::fail_closed(format!(
            "request classified {class:?} may only be served by local-tier backends, and {route} has none"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(extra: serde_json::Value) -> Router {
        let mut cfg = serde_json::json!({
            "router": "llm/demo",
            "backends": [
                {"name": "qwen-small", "display_name": "qwen3-8b", "capabilities": ["tools"]},
                {"name": "llama-big", "capabilities": ["tools", "long-context"]},
                {"name": "vision-local", "capabilities": ["vision"]},
                {"name": "gpt", "tier": "cloud", "external_model": "gpt-5", "capabilities": ["tools", "vision"]}
            ],
            "default_route": "qwen-small",
            "rules": [
                {"name": "regulated", "data_classification": ["PII", "phi"], "fail_closed": true,
                 "backends": ["llama-big", "qwen-small"]},
                {"name": "research", "headers": [{"name": "X-Team", "value": "research"}], "backends": ["gpt", "llama-big"]},
                {"name": "hard", "task_complexity": "complex", "backends": ["llama-big"]},
                {"name": "qwen", "models": ["qwen3-*"], "backends": ["qwen-small"]},
                {"name": "see", "models": ["vis-*"], "required_capabilities": ["vision"], "backends": ["llama-big", "gpt", "vision-local"]},
                {"name": "impossible", "models": ["never"], "required_capabilities": ["teleport"], "backends": ["gpt"]}
            ]
        });
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        Router::new(serde_json::from_value(cfg).unwrap()).unwrap()
    }

    fn hdrs(pairs: &[(&str, &str)]) -> RequestHeaders {
        let mut h = RequestHeaders::new();
        for (n, v) in pairs {
            h.push(n.to_ascii_lowercase(), v.to_string());
        }
        h
    }

    fn pick(r: &Router, model: &str, h: &[(&str, &str)]) -> (Option<String>, String) {
        let d = r.decide(model, &hdrs(h), &mut || 0).unwrap();
        (
            d.rule.map(|i| r.rule(i).name.clone()),
            r.backend(d.backend()).name.clone(),
        )
    }

    fn rule_backend(rule: &str, backend: &str) -> (Option<String>, String) {
        (Some(rule.to_string()), backend.to_string())
    }

    #[test]
    fn first_matching_rule_wins_in_order() {
        let r = router(serde_json::json!({}));
        // Both "regulated" and "qwen" match; the earlier one wins.
        assert_eq!(
            pick(&r, "qwen3-8b", &[("x-llmkube-classification", "pii")]),
            rule_backend("regulated", "llama-big")
        );
        assert_eq!(
            pick(&r, "qwen3-8b", &[]),
            rule_backend("qwen", "qwen-small")
        );
        assert_eq!(
            pick(&r, "qwen3-8b", &[("x-llmkube-task-complexity", "complex")]),
            rule_backend("hard", "llama-big")
        );
    }

    #[test]
    fn classification_is_compared_lower_cased_and_any_value_counts() {
        let r = router(serde_json::json!({}));
        assert_eq!(
            pick(&r, "m", &[("x-llmkube-classification", "PhI")]),
            rule_backend("regulated", "llama-big")
        );
        // A second header or a list item cannot hide a sensitive class.
        assert_eq!(
            pick(
                &r,
                "m",
                &[
                    ("x-llmkube-classification", "public"),
                    ("x-llmkube-classification", "pii")
                ]
            ),
            rule_backend("regulated", "llama-big")
        );
        assert_eq!(
            pick(&r, "m", &[("x-llmkube-classification", "public, pii")]),
            rule_backend("regulated", "llama-big")
        );
    }

    #[test]
    fn header_rules_match_names_case_insensitively_and_values_exactly() {
        let r = router(serde_json::json!({}));
        assert_eq!(
            pick(&r, "m", &[("x-team", "research")]),
            rule_backend("research", "gpt")
        );
        assert_eq!(
            pick(&r, "m", &[("X-TEAM", "research")]),
            rule_backend("research", "gpt")
        );
        assert_eq!(
            pick(&r, "m", &[("x-team", "Research")]),
            (None, "qwen-small".into())
        );
    }

    #[test]
    fn required_capabilities_filter_backends_and_can_disable_a_rule() {
        let r = router(serde_json::json!({}));
        // llama-big lacks vision: never tried, not even first.
        assert_eq!(pick(&r, "vis-1", &[]), rule_backend("see", "gpt"));
        // Sensitive + capability: only the local vision backend qualifies... but the
        // regulated rule comes first.
        // A rule no backend can serve never matches: falls to the default route.
        assert_eq!(pick(&r, "never", &[]), (None, "qwen-small".into()));
    }

    #[test]
    fn backend_name_match_uses_display_name_then_name() {
        let r = router(serde_json::json!({"default_route_strategy": "BackendNameMatch"}));
        assert_eq!(pick(&r, "llama-big", &[]), (None, "llama-big".into()));
        assert_eq!(pick(&r, "gpt", &[]), (None, "gpt".into()));
        // qwen-small is published as qwen3-8b; its name no longer addresses it by name match,
        // but the qwen rule covers it anyway.
        assert_eq!(
            pick(&r, "qwen3-8b", &[]),
            rule_backend("qwen", "qwen-small")
        );
        assert_eq!(pick(&r, "unknown", &[]), (None, "qwen-small".into()));
        // Static strategy ignores names.
        let s = router(serde_json::json!({}));
        assert_eq!(pick(&s, "gpt", &[]), (None, "qwen-small".into()));
    }

    #[test]
    fn no_route_is_404_model_not_found() {
        let r = router(serde_json::json!({"default_route": null}));
        let e = r.decide("unknown", &hdrs(&[]), &mut || 0).unwrap_err();
        assert_eq!((e.status, e.code), (404, "model_not_found"));
    }

    #[test]
    fn sensitive_requests_never_get_a_cloud_backend() {
        // A cloud default route and name match: a sensitive request gets 503, not the cloud.
        let r = router(serde_json::json!({
            "default_route": "gpt",
            "default_route_strategy": "BackendNameMatch",
            "sensitive_classifications": ["secret"],
        }));
        for model in ["gpt", "unknown"] {
            let e = r
                .decide(
                    model,
                    &hdrs(&[("x-llmkube-classification", "SECRET")]),
                    &mut || 0,
                )
                .unwrap_err();
            assert_eq!((e.status, e.code), (503, "fail_closed"), "{model}");
        }
        // A non-fail-closed rule naming cloud first: the local backend behind it serves.
        assert_eq!(
            pick(
                &r,
                "m",
                &[
                    ("x-team", "research"),
                    ("x-llmkube-classification", "secret")
                ]
            ),
            rule_backend("research", "llama-big")
        );
        // Not sensitive: the cloud default serves.
        assert_eq!(pick(&r, "unknown", &[]), (None, "gpt".into()));
    }

    #[test]
    fn config_errors_name_the_problem() {
        let bad = serde_json::json!({
            "router": "x", "backends": [{"name": "a"}],
            "rules": [{"name": "r", "backends": ["zzz"]}]
        });
        let e = Router::new(serde_json::from_value(bad).unwrap()).unwrap_err();
        assert!(e.contains("rule \"r\"") && e.contains("\"zzz\""), "{e}");
        let glob = serde_json::json!({
            "router": "x", "backends": [{"name": "a"}],
            "rules": [{"name": "r", "models": ["x[a"], "backends": ["a"]}]
        });
        assert!(Router::new(serde_json::from_value(glob).unwrap()).is_err());
        let provider = serde_json::json!({
            "router": "x", "backends": [{"name": "a", "provider": "azure"}], "default_route": "a"
        });
        let e = Router::new(serde_json::from_value(provider).unwrap()).unwrap_err();
        assert!(e.contains("\"a\"") && e.contains("\"azure\""), "{e}");
        let unknown = serde_json::json!({"router": "x", "backends": [], "surprise": 1});
        assert!(serde_json::from_value::<PluginConfig>(unknown).is_err());
    }

    #[test]
    fn models_list_publishes_display_names_and_model_info() {
        let r = router(serde_json::json!({}));
        let v: serde_json::Value = serde_json::from_slice(r.models_body()).unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["qwen3-8b", "llama-big", "vision-local", "gpt"]);
        assert!(v["data"][0].get("input_modalities").is_none());
        let r = router(serde_json::json!({"backends": [
            {"name": "v", "capabilities": ["vision"], "model_info": {"context_length": 32768}},
            {"name": "t", "model_info": {"output_modalities": ["text", "audio"]}}
        ], "default_route": "v", "rules": []}));
        let v: serde_json::Value = serde_json::from_slice(r.models_body()).unwrap();
        assert_eq!(v["data"][0]["context_length"], 32768);
        assert_eq!(
            v["data"][0]["input_modalities"],
            serde_json::json!(["text", "image"])
        );
        assert_eq!(
            v["data"][1]["input_modalities"],
            serde_json::json!(["text"])
        );
        assert_eq!(
            v["data"][1]["output_modalities"],
            serde_json::json!(["text", "audio"])
        );
    }

    #[test]
    fn quarantined_backends_are_skipped_and_empty_rules_fall_through() {
        let r = router(serde_json::json!({}));
        let q = |name: &str| r.backend_index(name).unwrap();
        let (llama, qwen, gpt) = (q("llama-big"), q("qwen-small"), q("gpt"));
        let without = |bad: Vec<usize>| move |b: usize| !bad.contains(&b);
        let names = |d: &Decision| -> Vec<String> {
            d.order.iter().map(|&b| r.backend(b).name.clone()).collect()
        };
        // Shortened order, same rule.
        let d = r
            .decide_among(
                "x",
                &hdrs(&[("x-team", "research")]),
                &without(vec![gpt]),
                &mut || 0,
            )
            .unwrap();
        assert_eq!(
            (d.rule, names(&d)),
            (Some(1), vec!["llama-big".to_string()])
        );
        // A non-fail-closed rule with nobody healthy falls through to the default route.
        let d = r
            .decide_among("qwen3-8b", &hdrs(&[]), &without(vec![qwen]), &mut || 0)
            .map(|d| (d.rule, names(&d)));
        assert_eq!(
            d.unwrap_err().code,
            "all_backends_failed",
            "default route quarantined too"
        );
        let d = r
            .decide_among(
                "x",
                &hdrs(&[("x-llmkube-task-complexity", "complex")]),
                &without(vec![llama]),
                &mut || 0,
            )
            .unwrap();
        assert_eq!((d.rule, names(&d)), (None, vec!["qwen-small".to_string()]));
        // Fail-closed rules and sensitive requests never fall through.
        let e = r
            .decide_among(
                "x",
                &hdrs(&[("x-llmkube-classification", "pii")]),
                &without(vec![llama, qwen]),
                &mut || 0,
            )
            .unwrap_err();
        assert_eq!((e.status, e.code), (503, "fail_closed"));
        // No default route: a matched rule with nobody healthy is 502, not "model not found".
        let r2 = router(serde_json::json!({"default_route": null}));
        let e = r2
            .decide_among("qwen3-8b", &hdrs(&[]), &without(vec![qwen]), &mut || 0)
            .unwrap_err();
        assert_eq!((e.status, e.code), (502, "all_backends_failed"));
        let e = r2
            .decide_among("zzz", &hdrs(&[]), &without(vec![qwen]), &mut || 0)
            .unwrap_err();
        assert_eq!(e.code, "model_not_found");
    }
}
