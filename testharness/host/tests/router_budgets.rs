//! The model-router filter's budget step on the compiled module, with the test kit's manual clock:
//! holds of requests in flight refuse others, a settle frees what was not used, an unanswered
//! request releases, Retry-After is right to the second, and a stream read in tiny pieces is
//! charged its usage with the usage-only chunk it did not ask for removed.

use serde_json::{json, Value};
use std::time::Duration;
use wasm_host::{Host, StreamOutcome};

mod support;
use support::*;

/// 81 bytes: a hold is 81 + 256 (template margin) + max_tokens.
const BODY: &str =
    r#"{"model":"qwen3-8b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

fn with_budgets(budgets: Value) -> Host {
    let mut c = router_config();
    c["budgets"] = json!({ "budgets": budgets });
    host_with("llmkube_model_router", &c)
}

fn gauge(h: &Host, name: &str) -> i64 {
    h.metric(&format!("llmkube.budget.{name}"))
        .map_or(-1, |m| m.value)
}

fn answer(h: &mut Host, req: &StreamOutcome, content_type: &str, body: &[u8]) -> StreamOutcome {
    let res = h
        .run_response(
            req.stream,
            &[(":status", "200"), ("content-type", content_type)],
            body,
            7,
        )
        .unwrap();
    h.log_and_done(req.stream).unwrap();
    res
}

fn usage_json(h: &mut Host, req: &StreamOutcome) {
    answer(
        h,
        req,
        "application/json",
        br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#,
    );
}

fn retry_after(o: &StreamOutcome) -> u64 {
    let r = o.local_response.as_ref().expect("a local response");
    r.header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap()
}

#[test]
fn holds_in_flight_refuse_and_settling_frees_what_was_not_used() {
    assert_eq!(BODY.len(), 81);
    let mut h = with_budgets(
        json!([{"name": "all", "scope": "router", "max_tokens": 480, "window_s": 60}]),
    );
    let first = post(&mut h, &[], BODY);
    assert!(first.local_response.is_none(), "admitted");
    assert_eq!(first.forwarded_body, BODY.as_bytes(), "no edit needed");
    // 437 held: a second request does not fit until the first settles.
    let second = post(&mut h, &[], BODY);
    assert_eq!(error_of(&second), (429, "budget_exceeded".into()));
    assert_eq!(retry_after(&second), 1, "only a hold is in the way");
    h.log_and_done(second.stream).unwrap();
    usage_json(&mut h, &first);
    assert_eq!(gauge(&h, "all.tokens_used"), 30);
    assert_eq!(gauge(&h, "all.tokens_reserved"), 0);
    assert_eq!(gauge(&h, "all.refusals"), 1);
    // 30 spent + 437 ≤ 480.
    let third = post(&mut h, &[], BODY);
    assert!(third.local_response.is_none());
    // Never answered (client gone before a response): released, nothing charged.
    h.log_and_done(third.stream).unwrap();
    assert_eq!(gauge(&h, "all.tokens_used"), 30);
    assert_eq!(gauge(&h, "all.tokens_reserved"), 0);
    let audit = h.logs_matching("llmkube-audit");
    assert!(audit[0].contains(r#""budgets":["all"]"#), "{audit:?}");
    assert!(audit
        .iter()
        .any(|l| l.contains(r#""tokens":{"prompt":10,"completion":20}"#)));
}

#[test]
fn retry_after_is_the_second_the_request_fits_again() {
    // A hold is 81 + 256 + 100 = 437; two charges of 30 leave no room under 480.
    let mut h =
        with_budgets(json!([{"name": "w", "scope": "router", "max_tokens": 480, "window_s": 2}]));
    for _ in 0..2 {
        let r = post(&mut h, &[], BODY);
        assert!(r.local_response.is_none());
        usage_json(&mut h, &r);
    }
    assert_eq!(gauge(&h, "w.tokens_used"), 60);
    let refused = post(&mut h, &[], BODY);
    assert_eq!(error_of(&refused), (429, "budget_exceeded".into()));
    let wait = retry_after(&refused);
    h.log_and_done(refused.stream).unwrap();
    assert!((2..=3).contains(&wait), "{wait}");
    h.advance_clock(Duration::from_millis(wait * 1000 - 1000))
        .unwrap();
    let early = post(&mut h, &[], BODY);
    assert_eq!(error_of(&early).0, 429, "a second early");
    h.log_and_done(early.stream).unwrap();
    h.advance_clock(Duration::from_secs(1)).unwrap();
    let on_time = post(&mut h, &[], BODY);
    assert!(on_time.local_response.is_none(), "admitted at Retry-After");
}

#[test]
fn a_stream_in_tiny_pieces_is_charged_its_usage_and_loses_the_chunk_it_did_not_ask_for() {
    let mut h =
        with_budgets(json!([{"name": "t", "scope": "team", "max_tokens": 100000, "window_s": 60}]));
    let body = r#"{"model":"qwen3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let req = post(&mut h, &[("x-llmkube-team", "red")], body);
    let sent: Value = serde_json::from_slice(&req.forwarded_body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(
        sent["max_tokens"], 4096,
        "nothing else bounds the completion"
    );
    let len = req
        .forwarded_headers
        .as_ref()
        .and_then(|hs| hs.iter().find(|(k, _)| k == "content-length"))
        .map(|(_, v)| v.clone());
    assert_eq!(len, Some(req.forwarded_body.len().to_string()));
    let content = "data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\n";
    let usage =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n";
    let done = "data: [DONE]\n\n";
    let stream = format!("{content}{usage}{done}");
    let res = answer(&mut h, &req, "text/event-stream", stream.as_bytes());
    assert_eq!(
        String::from_utf8(res.forwarded_body).unwrap(),
        format!("{content}{done}")
    );
    assert_eq!(gauge(&h, "t.team.red.tokens_used"), 15);
    let audit = h.logs_matching("llmkube-audit");
    assert!(
        audit[0].contains(r#""tokens":{"prompt":12,"completion":3}"#),
        "{audit:?}"
    );
    assert!(!audit[0].contains("usage_estimated"));
}

#[test]
fn a_body_in_pieces_is_held_and_edited_as_a_whole_one_where_a_budget_applies() {
    let head = [(":authority", "gw"), ("content-type", "application/json")];
    let red = [head[0], head[1], ("x-llmkube-team", "red")];
    let mut h =
        with_budgets(json!([{"name": "t", "scope": "team", "max_tokens": 480, "window_s": 60}]));
    // The hold is the whole body's (437: its 81 bytes and its max_tokens), though the filter
    // saw the body nine bytes at a time.
    let first = send_body(&mut h, &red, BODY, 9);
    assert!(first.local_response.is_none(), "admitted");
    assert_eq!(first.forwarded_body, BODY.as_bytes());
    let second = send_body(&mut h, &red, BODY, 9);
    assert_eq!(error_of(&second), (429, "budget_exceeded".into()));
    h.log_and_done(second.stream).unwrap();
    // No team header: no budget applies (red's is full), the request goes as it is.
    let plain = send_body(&mut h, &head, BODY, 9);
    assert!(plain.local_response.is_none());
    assert_eq!(plain.forwarded_body, BODY.as_bytes());
    // Settling the first frees red's budget for the next.
    usage_json(&mut h, &first);
    assert!(send_body(&mut h, &red, BODY, 9).local_response.is_none());

    let mut h =
        with_budgets(json!([{"name": "t", "scope": "team", "max_tokens": 100000, "window_s": 60}]));
    let body = r#"{"model":"qwen3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let req = send_body(&mut h, &red, body, 5);
    let sent: Value = serde_json::from_slice(&req.forwarded_body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(sent["max_tokens"], 4096);
    assert_eq!(sent["messages"][0]["content"], "hi");
}
