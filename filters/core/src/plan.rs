//! What the model-router filter does with a request, decided here so the filter only carries it
//! out (the response side is `response`).
//!
//! A request's plan is built in steps: the headers say whether it is ours (`plan_head`), the
//! scanned body must name a usable model (`check_request`), then the attempt order is decided and
//! the decision headers listed (`plan_request`). Each step either refuses (an error for the
//! client and the outcome to count) or adds to the plan. Steps that will join later slot in the
//! same way: a budget reservation after the decision (refusing with `budget_exceeded`, or
//! carrying a reservation the response settles) and endpoint picking (a pod, stamped as
//! `x-gateway-destination-endpoint`).

use crate::allow::Allowlists;
use crate::audit::Outcome;
use crate::config::PluginConfig;
use crate::errors::ApiError;
use crate::headers::{
    BACKEND_HEADER, MODEL_SPAN_HEADER, ROUTE_HEADER, RULE_HEADER, SENSITIVE_HEADER,
};
use crate::response::ResponseJudge;
use crate::rewrite::format_span;
use crate::router::{Backend, Decision, RequestHeaders, Router};
use crate::scan::{Fields, ScanError, Span};
use std::borrow::Cow;

/// Longest `model` put into a header; longer ones are refused rather than forwarded.
pub const MAX_MODEL_BYTES: usize = 256;

/// A request answered by the filter itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: ApiError,
    pub outcome: Outcome,
}

impl Refusal {
    /// The client's request is at fault.
    pub fn invalid(error: ApiError) -> Self {
        Refusal {
            error,
            outcome: Outcome::InvalidRequest,
        }
    }

    /// A request body that did not scan.
    pub fn scan(e: &ScanError) -> Self {
        Refusal::invalid(ApiError::from_scan(e))
    }

    /// No route resolved: the outcome follows the error the rule engine chose.
    fn undecided(error: ApiError) -> Self {
        let outcome = match error.code {
            "model_not_found" => Outcome::NoRoute,
            "all_backends_failed" => Outcome::AllBackendsFailed,
            _ => Outcome::FailClosed,
        };
        Refusal { error, outcome }
    }
}

impl Allowlists {
    /// The request-plan step: refuses a request the allowlists do not grant.
    pub fn check(&self, headers: &RequestHeaders, model: &str) -> Result<(), Refusal> {
        let teams = headers.all(self.team_header());
        self.decide(teams, model).map_err(|why| {
            let team = headers.first(self.team_header()).unwrap_or_default();
            Refusal {
                error: ApiError::model_not_allowed(self.team_header(), team, model, &why),
                outcome: Outcome::NotAllowed,
            }
        })
    }
}

/// What a routing decision needs besides the body: the headers it reads, which backends are
/// eligible now (not quarantined), and entropy for weighted picks.
pub struct RequestInputs<'a> {
    pub headers: &'a RequestHeaders,
    pub eligible: &'a dyn Fn(usize) -> bool,
    pub random: &'a mut dyn FnMut() -> u64,
}

/// What the request headers alone decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadPlan {
    /// `GET` of the models path: answered from the config.
    Models,
    /// `GET` of the models path + `/{id}`: that entry, or 404 (`None`: an id that does not
    /// decode).
    Model(Option<String>),
    /// Not ours to route: with the decision headers gone, no route sends it to a backend.
    Pass,
    /// An inference request refused before its body (none, or too large by `content-length`).
    Refuse(Refusal),
    /// An inference request: read its body for the decision.
    ReadBody,
}

/// Plans a request from its method, path (query included), `content-length` and whether the
/// headers end the stream.
pub fn plan_head(
    config: &PluginConfig,
    method: &[u8],
    path: &[u8],
    content_length: Option<u64>,
    end_of_stream: bool,
) -> HeadPlan {
    let path = match path.iter().position(|&b| b == b'?') {
        Some(q) => &path[..q],
        None => path,
    };
    if method == b"GET" {
        if let Some(tail) = path.strip_prefix(config.models_path.as_bytes()) {
            if tail.is_empty() {
                return HeadPlan::Models;
            }
            if let Some(id) = tail.strip_prefix(b"/") {
                return HeadPlan::Model(crate::models::decode_id(id));
            }
        }
    }
    if method != b"POST" || !config.inference_paths.iter().any(|p| p.as_bytes() == path) {
        return HeadPlan::Pass;
    }
    if end_of_stream {
        return HeadPlan::Refuse(Refusal::invalid(ApiError::empty_body()));
    }
    if let Err(refusal) = check_body_size(config, content_length.unwrap_or(0)) {
        return HeadPlan::Refuse(refusal);
    }
    HeadPlan::ReadBody
}

/// A body (or its announced length) over `max_body_bytes` is refused with 413.
pub fn check_body_size(config: &PluginConfig, bytes: u64) -> Result<(), Refusal> {
    if bytes > config.max_body_bytes {
        return Err(Refusal::invalid(ApiError::body_too_large(
            config.max_body_bytes,
        )));
    }
    Ok(())
}

/// A request body that scanned and names a model routing can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub model: String,
    /// The byte span of the `model` string token.
    pub model_span: Option<Span>,
}

/// The first step: the scan succeeded and its model may go into a header (bounded, no control
/// characters).
pub fn check_request(scanned: Result<Fields, ScanError>) -> Result<Checked, Refusal> {
    let fields = scanned.map_err(|e| Refusal::scan(&e))?;
    let model = fields.model;
    if model.len() > MAX_MODEL_BYTES || model.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(Refusal::invalid(ApiError::invalid_model(MAX_MODEL_BYTES)));
    }
    Ok(Checked {
        model,
        model_span: fields.spans.model,
    })
}

/// A request refused because backends it could use are in the filter's quarantine table: the
/// seconds until the first of them is back and the request would be served — the same decision
/// re-run with the table as it will stand at each coming deadline (at most one run per
/// backend). `None` when no deadline changes the answer: the refusal is not about quarantine.
pub fn retry_after_quarantine(
    router: &Router,
    model: &str,
    headers: &RequestHeaders,
    table: &crate::quarantine::Quarantine,
    now: u64,
) -> Option<u64> {
    table
        .deadlines_after(now)
        .into_iter()
        .find(|&at| {
            router
                .decide_among(model, headers, &|b| !table.is_quarantined(b, at), &mut || 0)
                .is_ok()
        })
        .map(|at| crate::quarantine::seconds_until(at, now))
}

/// A request the filter forwards.
#[derive(Debug, Clone)]
pub struct Forward<'r> {
    pub decision: Decision,
    /// Headers to set on the request, in this order (decision headers, already cleared of
    /// whatever the client sent). Names from the configuration are borrowed, not copied.
    pub stamps: Vec<(&'r str, Cow<'r, str>)>,
    /// What the response path judges the answer by.
    pub judge: ResponseJudge,
    router: &'r Router,
}

impl<'r> Forward<'r> {
    /// The backend tried first.
    pub fn backend(&self) -> &'r Backend {
        self.router.backend(self.decision.backend())
    }

    pub fn rule_name(&self) -> Option<&'r str> {
        let router = self.router;
        self.decision.rule.map(|r| router.rule(r).name.as_str())
    }
}

/// The routing steps for a checked request of `body_len` bytes: decide the attempt order, then
/// the headers that carry it.
pub fn plan_request<'r>(
    router: &'r Router,
    request: &Checked,
    body_len: usize,
    inputs: RequestInputs<'_>,
) -> Result<Forward<'r>, Refusal> {
    let decision = router
        .decide_among(
            &request.model,
            inputs.headers,
            inputs.eligible,
            inputs.random,
        )
        .map_err(Refusal::undecided)?;
    let stamps = stamps(router, request, &decision, body_len);
    let judge = ResponseJudge::new(
        decision.rule.is_some_and(|r| router.rule(r).fail_closed),
        decision.sensitive,
        decision.order.len() > 1,
    );
    Ok(Forward {
        decision,
        stamps,
        judge,
        router,
    })
}

fn stamps<'r>(
    router: &'r Router,
    request: &Checked,
    decision: &Decision,
    body_len: usize,
) -> Vec<(&'r str, Cow<'r, str>)> {
    let mut stamps = Vec::with_capacity(6);
    stamps.extend([
        (
            router.config.model_header.as_str(),
            Cow::Owned(request.model.clone()),
        ),
        (
            BACKEND_HEADER,
            Cow::Borrowed(router.backend(decision.backend()).name.as_str()),
        ),
        (ROUTE_HEADER, Cow::Owned(router.route_key(decision))),
    ]);
    if let Some(ri) = decision.rule {
        stamps.push((RULE_HEADER, Cow::Borrowed(router.rule(ri).name.as_str())));
    }
    if decision.sensitive {
        stamps.push((SENSITIVE_HEADER, Cow::Borrowed("true")));
    }
    // An attempt to an external backend, or a local one whose served model name is known, gets
    // its `model` rewritten by the per-attempt filter; tell it where the value is so it need not
    // scan the body again.
    let rewritten = || {
        decision
            .order
            .iter()
            .any(|&b| router.backend(b).rewrite_model().is_some())
    };
    if let Some(span) = request.model_span.filter(|_| rewritten()) {
        stamps.push((MODEL_SPAN_HEADER, Cow::Owned(format_span(span, body_len))));
    }
    stamps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tier;
    use crate::scan::Scanner;

    fn router() -> Router {
        Router::from_json(
            serde_json::json!({
                "router": "ns/r",
                "model_header": "x-model",
                "backends": [
                    {"name": "loc"},
                    {"name": "loc2"},
                    {"name": "gpt", "tier": "cloud", "external_model": "gpt-5", "provider": "openai"},
                    {"name": "vllm", "served_model": "Qwen/Qwen3-8B"}
                ],
                "rules": [
                    {"name": "safe", "models": ["safe-*"], "fail_closed": true, "backends": ["loc"]},
                    {"name": "mixed", "models": ["mix"], "backends": ["loc", "gpt"]},
                    {"name": "pair", "models": ["pair"], "backends": ["loc", "loc2"]},
                    {"name": "served", "models": ["qwen"], "backends": ["vllm"]},
                    {"name": "either", "models": ["either"], "fail_closed": true, "backends": ["loc", "loc2"]}
                ],
                "default_route": "loc2"
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    fn plan<'r>(
        r: &'r Router,
        body: &str,
        headers: &[(&str, &str)],
        eligible: &dyn Fn(usize) -> bool,
    ) -> Result<Forward<'r>, Refusal> {
        let mut h = RequestHeaders::new();
        for (n, v) in headers {
            h.push(n.to_string(), v.to_string());
        }
        let checked = check_request(Scanner::new().scan(body.as_bytes()))?;
        let inputs = RequestInputs {
            headers: &h,
            eligible,
            random: &mut || 0,
        };
        plan_request(r, &checked, body.len(), inputs)
    }

    fn stamped<'a>(f: &'a Forward<'_>) -> Vec<(&'a str, &'a str)> {
        f.stamps.iter().map(|(n, v)| (*n, v.as_ref())).collect()
    }

    #[test]
    fn a_rule_match_stamps_model_backend_route_and_rule() {
        let r = router();
        let f = plan(&r, r#"{"model":"safe-1"}"#, &[], &|_| true).unwrap();
        assert_eq!(
            stamped(&f),
            [
                ("x-model", "safe-1"),
                ("x-llmkube-backend", "loc"),
                ("x-llmkube-route", "safe/loc"),
                ("x-llmkube-rule", "safe"),
            ]
        );
        assert_eq!(
            (f.backend().name.as_str(), f.rule_name()),
            ("loc", Some("safe"))
        );
        assert!(
            !f.judge.ask_endpoint(),
            "one backend: it is the one that answers"
        );
    }

    #[test]
    fn an_order_with_an_external_backend_carries_the_model_span() {
        let r = router();
        let body = r#"{"model":"mix","messages":[]}"#;
        let f = plan(&r, body, &[], &|_| true).unwrap();
        assert!(stamped(&f).contains(&("x-llmkube-model-span", "9-14/29")));
        assert!(f.judge.ask_endpoint());
        let f = plan(&r, r#"{"model":"pair"}"#, &[], &|_| true).unwrap();
        assert!(stamped(&f).iter().all(|(n, _)| *n != MODEL_SPAN_HEADER));
        // A local backend whose served model name is known is rewritten as well.
        let f = plan(&r, r#"{"model":"qwen"}"#, &[], &|_| true).unwrap();
        assert!(stamped(&f).contains(&("x-llmkube-model-span", "9-15/16")));
    }

    #[test]
    fn retry_after_is_the_first_deadline_that_lets_the_request_through() {
        use crate::quarantine::Quarantine;
        const S: u64 = 1_000_000_000;
        let r = router();
        let retry = |model: &str, q: &Quarantine, now: u64| {
            retry_after_quarantine(&r, model, &RequestHeaders::new(), q, now)
        };
        let mut q = Quarantine::new(4);
        q.mark(0, 20 * S);
        q.mark(1, 30 * S);
        // "safe" (fail-closed on loc): back when loc is.
        assert!(plan(&r, r#"{"model":"safe-1"}"#, &[], &|b| b > 1).is_err());
        assert_eq!(retry("safe-1", &q, 10 * S), Some(10));
        assert_eq!(retry("safe-1", &q, 19 * S + 1), Some(1));
        // "either" needs loc or loc2: the earlier of the two.
        q.mark(0, 40 * S);
        assert_eq!(retry("either", &q, 10 * S), Some(20));
        // Nothing quarantined that matters: no Retry-After.
        assert_eq!(retry("safe-1", &Quarantine::new(4), 10 * S), None);
        let sensitive = {
            let mut h = RequestHeaders::new();
            h.push("x-llmkube-classification".into(), "pii".into());
            h
        };
        // A sensitive request to a route with no local backend is refused for good.
        let r2 = Router::from_json(
            br#"{"router":"r","backends":[{"name":"gpt","tier":"cloud","external_model":"g","provider":"openai"}],"default_route":"gpt"}"#,
        )
        .unwrap();
        let mut q1 = Quarantine::new(1);
        q1.mark(0, 20 * S);
        assert_eq!(
            retry_after_quarantine(&r2, "m", &sensitive, &q1, 10 * S),
            None
        );
    }

    #[test]
    fn sensitive_requests_are_stamped_and_kept_local() {
        let r = router();
        let f = plan(
            &r,
            r#"{"model":"mix"}"#,
            &[("x-llmkube-classification", "pii")],
            &|_| true,
        )
        .unwrap();
        assert!(stamped(&f).contains(&("x-llmkube-sensitive", "true")));
        assert_eq!(f.decision.order, [0], "the cloud backend left the order");
        assert!(
            f.judge.ask_endpoint(),
            "a sensitive request always checks the tier"
        );
        assert!(f.judge.violation(Some(Tier::Cloud)));
        assert!(f.judge.violation(None));
        assert!(!f.judge.violation(Some(Tier::Local)));
        let f = plan(&r, r#"{"model":"mix"}"#, &[], &|_| true).unwrap();
        assert!(!f.judge.violation(Some(Tier::Cloud)));
    }

    #[test]
    fn refusals_carry_their_error_and_outcome() {
        let r = router();
        let refused = |body: &str, eligible: &dyn Fn(usize) -> bool| {
            let e = plan(&r, body, &[], eligible).unwrap_err();
            (e.error.status, e.error.code, e.outcome)
        };
        let all = |_: usize| true;
        assert_eq!(
            refused("{", &all),
            (400, "invalid_json", Outcome::InvalidRequest)
        );
        let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(MAX_MODEL_BYTES + 1));
        assert_eq!(
            refused(&long, &all),
            (400, "invalid_model", Outcome::InvalidRequest)
        );
        assert_eq!(
            refused(r#"{"model":"a\u0001b"}"#, &all),
            (400, "invalid_model", Outcome::InvalidRequest)
        );
        let at_limit = format!(r#"{{"model":"{}"}}"#, "m".repeat(MAX_MODEL_BYTES));
        assert!(plan(&r, &at_limit, &[], &all).is_ok());
        // loc quarantined: the fail-closed rule answers for its requests.
        assert_eq!(
            refused(r#"{"model":"safe-1"}"#, &|b| b != 0),
            (503, "fail_closed", Outcome::FailClosed)
        );
        // Nothing eligible at all: the matched rule makes it 502, not 404.
        assert_eq!(
            refused(r#"{"model":"pair"}"#, &|_| false),
            (502, "all_backends_failed", Outcome::AllBackendsFailed)
        );
    }

    #[test]
    fn no_route_is_counted_as_such() {
        let r = Router::from_json(br#"{"router":"r","backends":[{"name":"a"}]}"#).unwrap();
        let e = plan(&r, r#"{"model":"x"}"#, &[], &|_| true).unwrap_err();
        assert_eq!(
            (e.error.code, e.outcome),
            ("model_not_found", Outcome::NoRoute)
        );
    }

    #[test]
    fn the_head_decides_models_pass_refuse_or_read() {
        let r = router();
        let cfg = &r.config;
        let head = |m: &str, p: &str, len: Option<u64>, eos: bool| {
            plan_head(cfg, m.as_bytes(), p.as_bytes(), len, eos)
        };
        assert_eq!(head("GET", "/v1/models?x=1", None, true), HeadPlan::Models);
        assert_eq!(head("POST", "/v1/models", None, false), HeadPlan::Pass);
        assert_eq!(
            head("GET", "/v1/models/meta-llama%2FL?x", None, true),
            HeadPlan::Model(Some("meta-llama/L".into()))
        );
        assert_eq!(
            head("GET", "/v1/models/a/b", None, true),
            HeadPlan::Model(Some("a/b".into()))
        );
        assert_eq!(
            head("GET", "/v1/models/", None, true),
            HeadPlan::Model(None)
        );
        assert_eq!(head("GET", "/v1/modelsx", None, true), HeadPlan::Pass);
        assert_eq!(head("POST", "/v1/models/a", None, false), HeadPlan::Pass);
        assert_eq!(
            head("GET", "/v1/chat/completions", None, true),
            HeadPlan::Pass
        );
        assert_eq!(head("POST", "/v2/chat", Some(5), false), HeadPlan::Pass);
        assert_eq!(
            head("POST", "/v1/chat/completions?a", Some(5), false),
            HeadPlan::ReadBody
        );
        assert_eq!(
            head("POST", "/v1/messages", None, false),
            HeadPlan::ReadBody
        );
        let refused = |plan: HeadPlan| match plan {
            HeadPlan::Refuse(r) => (r.error.status, r.error.code, r.outcome),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            refused(head("POST", "/v1/completions", Some(0), true)),
            (400, "invalid_json", Outcome::InvalidRequest)
        );
        let max = cfg.max_body_bytes;
        assert_eq!(
            head("POST", "/v1/completions", Some(max), false),
            HeadPlan::ReadBody
        );
        assert_eq!(
            refused(head("POST", "/v1/completions", Some(max + 1), false)),
            (413, "request_too_large", Outcome::InvalidRequest)
        );
        assert!(check_body_size(cfg, max).is_ok());
        assert!(check_body_size(cfg, max + 1).is_err());
    }
}
