//! What the model-router filter does with a request and with its response, decided here so the
//! filter only carries it out.
//!
//! A request's plan is built in steps: check the scanned model (`check_request`), decide the
//! attempt order and list the decision headers to stamp (`plan_request`). Each step either refuses (an error for the client and the
//! outcome to count) or adds to the plan. Steps that will join later slot in the same way: a
//! budget reservation after the decision (refusing with `budget_exceeded`, or carrying a
//! reservation the response settles) and endpoint picking (a pod, stamped as
//! `x-gateway-destination-endpoint`).

use crate::audit::Outcome;
use crate::config::Tier;
use crate::errors::ApiError;
use crate::headers::{
    ATTEMPT_COUNT_HEADER, BACKEND_HEADER, MODEL_SPAN_HEADER, ROUTE_HEADER, RULE_HEADER,
    SENSITIVE_HEADER,
};
use crate::rewrite::format_span;
use crate::router::{Backend, Decision, RequestHeaders, Router};
use crate::scan::{Fields, ScanError, Span};

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

/// What a routing decision needs besides the body: the headers it reads, which backends are
/// eligible now (not quarantined), and entropy for weighted picks.
pub struct RequestInputs<'a> {
    pub headers: &'a RequestHeaders,
    pub eligible: &'a dyn Fn(usize) -> bool,
    pub random: &'a mut dyn FnMut() -> u64,
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

/// A request the filter forwards.
#[derive(Debug, Clone)]
pub struct Forward<'r> {
    pub decision: Decision,
    /// Headers to set on the request, in this order (decision headers, already cleared of
    /// whatever the client sent).
    pub stamps: Vec<(&'r str, String)>,
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
    let judge = ResponseJudge {
        fail_closed: decision.rule.is_some_and(|r| router.rule(r).fail_closed),
        sensitive: decision.sensitive,
        alternatives: decision.order.len() > 1,
    };
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
) -> Vec<(&'r str, String)> {
    let mut stamps = vec![
        (router.config.model_header.as_str(), request.model.clone()),
        (
            BACKEND_HEADER,
            router.backend(decision.backend()).name.clone(),
        ),
        (ROUTE_HEADER, router.route_key(decision)),
    ];
    if let Some(ri) = decision.rule {
        stamps.push((RULE_HEADER, router.rule(ri).name.clone()));
    }
    if decision.sensitive {
        stamps.push((SENSITIVE_HEADER, "true".to_string()));
    }
    // An attempt to an external backend gets its `model` rewritten by the per-attempt filter;
    // tell it where the value is so it need not scan the body again.
    let external = || {
        decision
            .order
            .iter()
            .any(|&b| router.backend(b).external_model.is_some())
    };
    if let Some(span) = request.model_span.filter(|_| external()) {
        stamps.push((MODEL_SPAN_HEADER, format_span(span, body_len)));
    }
    stamps
}

/// How the response to a forwarded request is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseJudge {
    fail_closed: bool,
    sensitive: bool,
    /// The order has other backends Envoy may fail over to.
    alternatives: bool,
}

/// What the response path reads of a response's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// `:status`; 0 when absent or not a number.
    pub status: u32,
    /// `content-type: text/event-stream`.
    pub streaming: bool,
    /// Envoy's attempt count (`include_attempt_count_in_response`); 0 when absent.
    pub attempts: u32,
    /// The attempt count header is there, to be removed (the client needs none of it).
    pub attempt_count_sent: bool,
}

impl ResponseHead {
    /// Reads the response header map (as the host hands it over, names lower-cased).
    pub fn read(pairs: &[(Vec<u8>, Vec<u8>)]) -> Self {
        let number = |v: &[u8]| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let mut head = ResponseHead {
            status: 0,
            streaming: false,
            attempts: 0,
            attempt_count_sent: false,
        };
        for (k, v) in pairs {
            head.attempt_count_sent |= k.eq_ignore_ascii_case(ATTEMPT_COUNT_HEADER.as_bytes());
            match k.as_slice() {
                b":status" => head.status = number(v),
                b"content-type" => head.streaming = v.starts_with(b"text/event-stream"),
                b"x-envoy-attempt-count" => head.attempts = number(v),
                _ => {}
            }
        }
        head
    }

    /// The host would not hand the map over: nothing is known, and the attempt count header is
    /// removed in case it is there.
    pub fn unreadable() -> Self {
        ResponseHead {
            status: 0,
            streaming: false,
            attempts: 0,
            attempt_count_sent: true,
        }
    }
}

/// The judgement of a response's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    /// The filter answers this instead of the response (the last attempt failed).
    pub replace: Option<ApiError>,
}

impl ResponseJudge {
    /// Whether the answering backend must be read from the endpoint: only when it may differ
    /// from the one decided, or to check a sensitive request's tier (the alarm for a route
    /// table that sent it somewhere it must not go).
    pub fn ask_endpoint(&self) -> bool {
        self.alternatives || self.sensitive
    }

    /// A sensitive request answered by a backend of tier `tier` (`None`: the endpoint says no
    /// tier we know) is a violation unless that tier is local.
    pub fn violation(&self, tier: Option<Tier>) -> bool {
        self.sensitive && tier != Some(Tier::Local)
    }

    /// A final 5xx becomes 503 `fail_closed` for a fail-closed rule or a sensitive request,
    /// else 502 `all_backends_failed`; anything else passes with its outcome.
    pub fn verdict(&self, status: u32, streaming: bool) -> Verdict {
        if status >= 500 {
            let (error, outcome) = if self.fail_closed || self.sensitive {
                let err = ApiError::fail_closed(format!(
                    "no eligible backend could serve this request (last status {status}); the rule is fail-closed"
                ));
                (err, Outcome::FailClosedRuntime)
            } else {
                (
                    ApiError::all_backends_failed(status),
                    Outcome::AllBackendsFailed,
                )
            };
            return Verdict {
                outcome,
                replace: Some(error),
            };
        }
        let outcome = match (status, streaming) {
            (200..=299, true) => Outcome::OkStream,
            (200..=299, false) => Outcome::Ok,
            _ => Outcome::UpstreamError,
        };
        Verdict {
            outcome,
            replace: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::Scanner;

    fn router() -> Router {
        Router::from_json(
            serde_json::json!({
                "router": "ns/r",
                "model_header": "x-model",
                "backends": [
                    {"name": "loc"},
                    {"name": "loc2"},
                    {"name": "gpt", "tier": "cloud", "external_model": "gpt-5", "provider": "openai"}
                ],
                "rules": [
                    {"name": "safe", "models": ["safe-*"], "fail_closed": true, "backends": ["loc"]},
                    {"name": "mixed", "models": ["mix"], "backends": ["loc", "gpt"]},
                    {"name": "pair", "models": ["pair"], "backends": ["loc", "loc2"]}
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
        f.stamps.iter().map(|(n, v)| (*n, v.as_str())).collect()
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
    fn the_response_head_is_read_once() {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = [
            (":status", "200"),
            ("content-type", "text/event-stream; charset=utf-8"),
            ("x-envoy-attempt-count", "3"),
        ]
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        let head = ResponseHead::read(&pairs);
        assert_eq!(
            head,
            ResponseHead {
                status: 200,
                streaming: true,
                attempts: 3,
                attempt_count_sent: true
            }
        );
        let head = ResponseHead::read(&pairs[..1]);
        assert!(!head.streaming && !head.attempt_count_sent && head.attempts == 0);
        let garbage = vec![(b":status".to_vec(), b"2x".to_vec())];
        assert_eq!(ResponseHead::read(&garbage).status, 0);
        assert!(ResponseHead::unreadable().attempt_count_sent);
    }

    #[test]
    fn a_final_5xx_is_replaced_by_the_filter() {
        let r = router();
        let judge = |body: &str, h: &[(&str, &str)]| plan(&r, body, h, &|_| true).unwrap().judge;
        let open = judge(r#"{"model":"pair"}"#, &[]);
        let closed = judge(r#"{"model":"safe-1"}"#, &[]);
        let sensitive = judge(
            r#"{"model":"pair"}"#,
            &[("x-llmkube-classification", "phi")],
        );
        let v = open.verdict(503, false);
        assert_eq!(v.outcome, Outcome::AllBackendsFailed);
        assert_eq!(
            v.replace.map(|e| (e.status, e.code)),
            Some((502, "all_backends_failed"))
        );
        for j in [closed, sensitive] {
            let v = j.verdict(500, true);
            assert_eq!(v.outcome, Outcome::FailClosedRuntime);
            assert_eq!(
                v.replace.map(|e| (e.status, e.code)),
                Some((503, "fail_closed"))
            );
        }
        let pass = |status, streaming| {
            let v = open.verdict(status, streaming);
            assert_eq!(v.replace, None);
            v.outcome
        };
        assert_eq!(pass(200, false), Outcome::Ok);
        assert_eq!(pass(204, true), Outcome::OkStream);
        assert_eq!(pass(429, false), Outcome::UpstreamError);
        assert_eq!(pass(0, false), Outcome::UpstreamError);
    }
}
