//! `explain`: where one request would go, and why, decided offline by the filter's own code.
//!
//! The manifests are validated as `validate` does, mapped to the plugin config as `compile`
//! does, and the request is run through the core's request plan in the model-router filter's
//! order (`plan_head`, the body-size check, the scan, `check_request`, the allowlists,
//! `plan_request`). The
//! per-rule reasons come from `router_core::explain::trace_rules`, which asks the same matcher.
//! What the filter does not decide yet (budgets, endpoint picking) is reported from the
//! manifest as the inputs those steps will read.

use serde::Serialize;
use serde_json::Value;

use router_core::config::{DefaultRouteStrategy, PluginConfig, Strategy};
use router_core::errors::ApiError;
use router_core::explain::{trace_rules, Miss};
use router_core::plan::{
    check_body_size, check_request, plan_head, plan_request, Forward, HeadPlan, Refusal,
    RequestInputs,
};
use router_core::router::{RequestHeaders, Router};
use router_core::scan::Scanner;

use crate::inputs::{self, router_key, Source};
use crate::ir::{select_router, CompileOptions};
use crate::model::{BudgetScope, ModelRouter, RouterBackend, DEFAULT_TEAM_HEADER};
use crate::plugin::{plugin_config, PluginContext};
use crate::{validate_sources, Diagnostics, Problem};

/// The path `explain` posts to when `--path` is not given.
pub const DEFAULT_PATH: &str = "/v1/chat/completions";

/// One request, as a client would send it.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// In the order sent; names in any case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Backends (`spec.backends[].name`) to count as quarantined.
    pub quarantined: Vec<String>,
}

impl Request {
    /// A `POST` of `body` to [`DEFAULT_PATH`].
    pub fn post(body: impl Into<Vec<u8>>) -> Self {
        Request {
            method: "POST".into(),
            path: DEFAULT_PATH.into(),
            body: body.into(),
            ..Default::default()
        }
    }
}

/// The answer. `status`, `backend`, `rule`, `order` and `error` are the outside contract of
/// `explain --json`; the rest explains them.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// The HTTP status the gateway would answer (200 when a backend would serve).
    pub status: u32,
    /// The backend tried first.
    pub backend: Option<String>,
    /// The matched rule.
    pub rule: Option<String>,
    /// The attempt order (backend names).
    pub order: Vec<String>,
    /// The error body the gateway would send.
    pub error: Option<Value>,
    /// `namespace/name` of the router.
    pub router: String,
    /// What handled the request: `models` (the filter answers `/v1/models`), `pass` (not an
    /// inference request: no route), `refused` (the filter answers with `error`), `forward`.
    pub outcome: &'static str,
    /// The body's model, once it scanned.
    pub model: Option<String>,
    pub classifications: Vec<String>,
    /// A classification is sensitive: only `tier: local` backends may serve.
    pub sensitive: bool,
    /// Every rule in order with its verdict.
    pub rules: Vec<RuleStep>,
    /// How a request no rule served found its backend (`backendNameMatch`, `defaultRoute`).
    pub fallback: Option<String>,
    /// The `x-llmkube-route` value (rule and attempt order) the gateway's route table matches.
    pub route_key: Option<String>,
    /// The matched rule is fail-closed: no fallback outside its backends.
    pub fail_closed: bool,
    /// Headers the filter stamps on the request, in order.
    pub stamps: Vec<(String, String)>,
    pub budgets: Vec<BudgetUse>,
    /// The team key team-scoped budgets would charge (the team header's value).
    pub team: Option<String>,
    pub endpoint_picking: Vec<EndpointInputs>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RuleStep {
    pub name: String,
    /// `matched`, `no-match` or `not-reached` (after the rule that decided).
    pub verdict: &'static str,
    pub why: String,
}

/// A configured budget whose scope covers this request (its ledger state is the gateway's).
#[derive(Debug, Clone, Serialize)]
pub struct BudgetUse {
    pub name: String,
    pub scope: &'static str,
    /// What the ledger would key the charge on: the router, the rule, or `team:<value>`.
    pub key: String,
    pub max_tokens: Option<i64>,
    pub max_usd: Option<String>,
    pub window_seconds: Option<i64>,
}

/// What endpoint picking would read for one backend of the order.
#[derive(Debug, Clone, Serialize)]
pub struct EndpointInputs {
    pub backend: String,
    pub resolution: &'static str,
    pub balancing: Option<String>,
    pub prefix_affinity: bool,
    /// Session-affinity headers with the value this request sends (if any).
    pub session_headers: Vec<(String, Option<String>)>,
    pub endpoint_picker: Option<String>,
}

/// Validates `sources` and explains `request` against the one ModelRouter in them (or the one
/// `opts.router` names), with the warnings `validate` would print. `Err`: the problems
/// `validate` would print, or why no router applies.
pub fn explain_sources(
    sources: &[Source],
    opts: &CompileOptions,
    request: &Request,
) -> Result<(Explanation, Vec<Problem>), Diagnostics> {
    let mut diags = validate_sources(sources);
    if !diags.errors.is_empty() {
        return Err(diags);
    }
    let inputs = inputs::load(sources, &mut Diagnostics::default());
    let Some(router) = select_router(&inputs, opts.router.as_deref(), "explain", &mut diags) else {
        return Err(diags);
    };
    let label = crate::ir::label_of(router);
    let plugin = plugin_config(
        router,
        &PluginContext {
            inputs: &inputs,
            model_header: opts.model_header.as_deref(),
            max_body_bytes: opts.max_body_bytes,
        },
    );
    let core = match Router::new(plugin) {
        Ok(r) => r,
        Err(e) => {
            diags.error(Problem::new(
                &label,
                "spec",
                format!("the filter refuses the plugin config: {e}"),
            ));
            return Err(diags);
        }
    };
    let mut quarantined = Vec::new();
    for name in &request.quarantined {
        match core.backend_index(name) {
            Some(i) => quarantined.push(i),
            None => diags.error(Problem::new(
                "options",
                "--quarantined",
                format!("{name:?} is not a backend of {label}"),
            )),
        }
    }
    if !diags.errors.is_empty() {
        return Err(diags);
    }
    Ok((
        explain(router, &core, request, &quarantined),
        diags.warnings,
    ))
}

/// Runs `request` through the filter's request plan for `core` (built from `manifest`).
pub fn explain(
    manifest: &ModelRouter,
    core: &Router,
    request: &Request,
    quarantined: &[usize],
) -> Explanation {
    let cfg = &core.config;
    let mut ex = Explanation {
        status: 200,
        backend: None,
        rule: None,
        order: Vec::new(),
        error: None,
        router: router_key(manifest),
        outcome: "forward",
        model: None,
        classifications: Vec::new(),
        sensitive: false,
        rules: Vec::new(),
        fallback: None,
        route_key: None,
        fail_closed: false,
        stamps: Vec::new(),
        budgets: Vec::new(),
        team: None,
        endpoint_picking: Vec::new(),
        notes: Vec::new(),
    };
    let headers = routing_headers(core, &request.headers, &mut ex.notes);
    let body = &request.body;
    let head = plan_head(
        cfg,
        request.method.as_bytes(),
        request.path.as_bytes(),
        Some(body.len() as u64),
        body.is_empty(),
    );
    match head {
        HeadPlan::Models => {
            ex.outcome = "models";
            ex.notes
                .push("the filter answers the model list from the config".into());
            return ex;
        }
        HeadPlan::Model(id) => {
            let listed = id.as_deref().and_then(|id| core.model_body(id)).is_some();
            ex.outcome = "models";
            ex.status = if listed { 200 } else { 404 };
            ex.notes.push(if listed {
                "the filter answers this model's entry of the model list from the config".into()
            } else {
                "the model list has no such id: 404 model_not_found".into()
            });
            return ex;
        }
        HeadPlan::Pass => {
            ex.outcome = "pass";
            ex.status = 404;
            ex.notes.push(format!(
                "not a POST to an inference path ({}): the filter leaves it alone, and with no decision headers no gateway route sends it to a backend",
                cfg.inference_paths.join(", ")
            ));
            return ex;
        }
        HeadPlan::Refuse(r) => return refused(ex, &r),
        HeadPlan::ReadBody => {}
    }
    if let Err(r) = check_body_size(cfg, body.len() as u64) {
        return refused(ex, &r);
    }
    let checked = match check_request(Scanner::new().scan(body)) {
        Ok(c) => c,
        Err(r) => return refused(ex, &r),
    };
    ex.model = Some(checked.model.clone());
    if let Some(allow) = core.allowlists() {
        // Offline there is no token: the team header given is taken as the verified claim.
        ex.notes.push(format!("allowlists: the {} header stands for the verified team claim (the gateway sets it from the JWT and removes the client's)", allow.team_header()));
        if let Err(r) = allow.check(&headers, &checked.model) {
            return refused(ex, &r);
        }
    }
    let (signals, verdicts) = trace_rules(core, &checked.model, &headers);
    ex.classifications = signals.classes;
    ex.sensitive = signals.sensitive;
    let eligible = |b: usize| !quarantined.contains(&b);
    let planned = plan_request(
        core,
        &checked,
        body.len(),
        RequestInputs {
            headers: &headers,
            eligible: &eligible,
            // Weighted picks draw from this; a fixed value keeps explain reproducible.
            random: &mut || 0,
        },
    );
    let decided = planned.as_ref().ok().and_then(|f| f.decision.rule);
    ex.rules = rule_steps(cfg, &verdicts, decided);
    match planned {
        Ok(f) => forwarded(&mut ex, manifest, core, &f, &request.headers),
        Err(r) => return refused(ex, &r),
    }
    ex
}

/// The headers a decision reads, as the filter collects them: only the names the router needs,
/// lower-cased; decision headers a client sent are removed by the filter, never read.
fn routing_headers(
    core: &Router,
    sent: &[(String, String)],
    notes: &mut Vec<String>,
) -> RequestHeaders {
    let needed = core.needed_headers();
    let stamped = core.config.stamped_headers();
    let mut h = RequestHeaders::new();
    for (name, value) in sent {
        let lower = name.to_ascii_lowercase();
        if stamped.contains(&lower) {
            notes.push(format!(
                "the gateway removes the client's {lower} header (the filter decides it)"
            ));
        } else if needed.contains(&lower) {
            h.push(lower, value.clone());
        }
    }
    h
}

fn refused(mut ex: Explanation, r: &Refusal) -> Explanation {
    ex.outcome = "refused";
    ex.status = r.error.status;
    ex.error = Some(error_body(&r.error));
    ex
}

fn error_body(e: &ApiError) -> Value {
    serde_json::from_slice(&e.body()).unwrap_or(Value::Null)
}

fn rule_steps(
    cfg: &PluginConfig,
    verdicts: &[Result<(), Miss>],
    decided: Option<usize>,
) -> Vec<RuleStep> {
    cfg.rules
        .iter()
        .zip(verdicts)
        .enumerate()
        .map(|(i, (rule, verdict))| {
            let (verdict, why) = match (verdict, decided) {
                (_, Some(d)) if i > d => ("not-reached", "an earlier rule decided".to_string()),
                (Ok(()), Some(d)) if i == d => ("matched", "every condition holds".to_string()),
                (Ok(()), _) => (
                    "matched",
                    "every condition holds, but none of its backends may serve this request (quarantined, or not local for a sensitive request)".to_string(),
                ),
                (Err(miss), _) => ("no-match", miss_reason(cfg, i, *miss)),
            };
            RuleStep {
                name: rule.name.clone(),
                verdict,
                why,
            }
        })
        .collect()
}

fn miss_reason(cfg: &PluginConfig, rule: usize, miss: Miss) -> String {
    let r = &cfg.rules[rule];
    match miss {
        Miss::NoCapableBackend => format!(
            "none of its backends advertises every required capability ({})",
            r.required_capabilities.join(", ")
        ),
        Miss::Model => format!("the model matches none of {:?}", r.models),
        Miss::TaskComplexity => format!(
            "{} is not {:?}",
            cfg.complexity_header,
            r.task_complexity.map(|c| c.as_str()).unwrap_or_default()
        ),
        Miss::Classification => format!(
            "no {} value in {:?}",
            cfg.classification_header, r.data_classification
        ),
        Miss::Header(h) => match r.headers.get(h) {
            Some(m) => format!("header {} is not exactly {:?}", m.name, m.value),
            None => "a header condition fails".into(),
        },
    }
}

fn forwarded(
    ex: &mut Explanation,
    manifest: &ModelRouter,
    core: &Router,
    f: &Forward<'_>,
    sent: &[(String, String)],
) {
    let d = &f.decision;
    ex.backend = Some(f.backend().name.clone());
    ex.rule = f.rule_name().map(str::to_string);
    ex.order = d
        .order
        .iter()
        .map(|&b| core.backend(b).name.clone())
        .collect();
    ex.route_key = Some(core.route_key(d));
    ex.stamps = f
        .stamps
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    match d.rule {
        Some(ri) => {
            let rule = core.rule(ri);
            ex.fail_closed = rule.fail_closed;
            if rule.strategy == Strategy::Weighted && rule.candidates.len() > 1 {
                ex.notes.push(format!(
                    "rule {:?} is weighted: the gateway picks the first backend at random by weight per request; shown is one such pick",
                    rule.name
                ));
            }
        }
        None => ex.fallback = Some(fallback(&core.config, ex.model.as_deref(), &ex.order)),
    }
    if ex.sensitive {
        ex.notes.push(
            "sensitive request: only tier local backends are in its order, and a cloud answer is refused".into(),
        );
    }
    budgets(ex, manifest, sent);
    ex.endpoint_picking = d
        .order
        .iter()
        .filter_map(|&b| manifest.spec.backends.get(b))
        .filter_map(|b| endpoint_inputs(b, sent))
        .collect();
}

/// Which unruled path served (the backend itself is the decision's).
fn fallback(cfg: &PluginConfig, model: Option<&str>, order: &[String]) -> String {
    let served = order.first().map(String::as_str).unwrap_or_default();
    let by_name = cfg.default_route_strategy == DefaultRouteStrategy::BackendNameMatch
        && cfg
            .backends
            .iter()
            .find(|b| Some(b.display_name.as_deref().unwrap_or(&b.name)) == model)
            .is_some_and(|b| b.name == served);
    if by_name {
        format!("backendNameMatch: the model names backend {served}")
    } else {
        format!("defaultRoute: {served}")
    }
}

fn header_value<'a>(sent: &'a [(String, String)], name: &str) -> Option<&'a str> {
    sent.iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn budgets(ex: &mut Explanation, manifest: &ModelRouter, sent: &[(String, String)]) {
    let Some(policy) = &manifest.spec.policy else {
        return;
    };
    for b in &policy.budgets {
        let (scope, key) = match b.scope {
            BudgetScope::Router => ("router", Some(ex.router.clone())),
            BudgetScope::Rule => (
                "rule",
                b.rule_name
                    .clone()
                    .filter(|r| ex.rule.as_deref() == Some(r.as_str())),
            ),
            BudgetScope::Team => {
                let header = b.header_key.as_deref().unwrap_or(DEFAULT_TEAM_HEADER);
                let team = header_value(sent, header).map(str::to_string);
                if team.is_none() {
                    ex.notes.push(format!(
                        "team budget {:?} does not apply: no {header} header",
                        b.name
                    ));
                }
                if ex.team.is_none() {
                    ex.team.clone_from(&team);
                }
                ("team", team.map(|t| format!("team:{t}")))
            }
        };
        if let Some(key) = key {
            ex.budgets.push(BudgetUse {
                name: b.name.clone(),
                scope,
                key,
                max_tokens: b.max_tokens,
                max_usd: b.max_usd.clone(),
                window_seconds: b.window_seconds,
            });
        }
    }
    if !ex.budgets.is_empty() {
        ex.notes.push(
            "budgets are reported, not checked: whether a ledger has room is known only to the running gateway".into(),
        );
    }
}

fn endpoint_inputs(b: &RouterBackend, sent: &[(String, String)]) -> Option<EndpointInputs> {
    let endpoint = b.resolution() == crate::model::Resolution::Endpoint;
    if !endpoint && b.balancing.is_none() && b.endpoint_picker.is_none() {
        return None;
    }
    let balancing = b.balancing.as_ref();
    Some(EndpointInputs {
        backend: b.name.clone(),
        resolution: if endpoint { "endpoint" } else { "service" },
        balancing: balancing
            .and_then(|x| x.mode)
            .map(|m| format!("{m:?}"))
            .or_else(|| balancing.map(|_| "RoundRobin".into())),
        prefix_affinity: balancing.is_some_and(|x| x.prefix_affinity.is_some()),
        session_headers: balancing
            .and_then(|x| x.session_affinity.as_ref())
            .map(|s| {
                s.headers
                    .iter()
                    .map(|h| (h.clone(), header_value(sent, h).map(str::to_string)))
                    .collect()
            })
            .unwrap_or_default(),
        endpoint_picker: b
            .endpoint_picker
            .as_ref()
            .and_then(|p| p.service.as_ref())
            .map(|s| format!("{}:{}", s.name, s.port)),
    })
}

/// The explanation for people.
pub fn render_text(ex: &Explanation) -> String {
    let mut out = format!("router: {}\n", ex.router);
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    if let Some(m) = &ex.model {
        line(format!("model: {m:?}"));
    }
    if !ex.classifications.is_empty() {
        line(format!(
            "classification: {}{}",
            ex.classifications.join(", "),
            if ex.sensitive {
                " (sensitive: local backends only)"
            } else {
                ""
            }
        ));
    }
    if !ex.rules.is_empty() {
        line("rules, in order:".into());
        for (i, r) in ex.rules.iter().enumerate() {
            line(format!(
                "  {}. {}: {} ({})",
                i + 1,
                r.name,
                r.verdict,
                r.why
            ));
        }
    }
    if let Some(f) = &ex.fallback {
        line(format!("no rule served; {f}"));
    }
    if !ex.order.is_empty() {
        line(format!("attempt order: {}", ex.order.join(" -> ")));
    }
    if let Some(k) = &ex.route_key {
        line(format!("route key: {k}"));
    }
    if ex.fail_closed {
        line("fail-closed: no fallback outside this rule's backends".into());
    }
    for (n, v) in &ex.stamps {
        line(format!("stamps {n}: {v}"));
    }
    for b in &ex.budgets {
        let mut limits = Vec::new();
        limits.extend(b.max_tokens.map(|t| format!("maxTokens {t}")));
        limits.extend(b.max_usd.as_ref().map(|u| format!("maxUSD {u}")));
        limits.extend(b.window_seconds.map(|w| format!("window {w}s")));
        line(format!(
            "budget {} ({} scope, key {}): {}",
            b.name,
            b.scope,
            b.key,
            limits.join(", ")
        ));
    }
    for e in &ex.endpoint_picking {
        let sessions: Vec<String> = e
            .session_headers
            .iter()
            .map(|(h, v)| format!("{h}={}", v.as_deref().unwrap_or("(not sent)")))
            .collect();
        line(format!(
            "endpoint picking for {}: resolution {}, balancing {}, prefix affinity {}, session headers [{}], endpoint picker {}",
            e.backend,
            e.resolution,
            e.balancing.as_deref().unwrap_or("-"),
            if e.prefix_affinity { "on" } else { "off" },
            sessions.join(", "),
            e.endpoint_picker.as_deref().unwrap_or("-"),
        ));
    }
    for n in &ex.notes {
        line(format!("note: {n}"));
    }
    match (&ex.backend, &ex.error) {
        (Some(b), _) => line(format!("answer: {} from backend {b}", ex.status)),
        (None, Some(e)) => line(format!("answer: {} {e}", ex.status)),
        (None, None) => line(format!("answer: {} ({})", ex.status, ex.outcome)),
    }
    out
}
