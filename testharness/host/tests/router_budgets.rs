//! The model-router filter's budget step on the compiled module, with the test kit's manual clock:
//! holds of requests in flight refuse others, a settle frees what was not used, an unanswered
//! request releases, Retry-After is right to the second, and a stream read in tiny pieces is
//! charged its usage with the usage-only chunk it did not ask for removed.

use serde_json::{json, Value};
use std::time::Duration;
use wasm_host::{Host, StreamOutcome};

mod support;
use support::*;

/// 81 bytes: a hold is 81 + 672 (template margin) + max_tokens.
const BODY: &str =
    r#"{"model":"qwen3-8b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

/// A request that only holds refuse waits (worker leases: at most four ticks) for the room to
/// come back: its outcome once that wait is over.
fn after_the_wait(h: &mut Host, o: wasm_host::StreamOutcome) -> wasm_host::StreamOutcome {
    if o.local_response.is_some() || o.complete {
        return o;
    }
    h.advance_clock(std::time::Duration::from_millis(400))
        .unwrap();
    h.request_outcome(o.stream).unwrap()
}

fn with_budgets(budgets: Value) -> Host {
    let mut c = router_config();
    c["budgets"] = json!({ "budgets": budgets });
    host_with("llmkube_model_router", &c)
}

fn gauge(h: &Host, name: &str) -> i64 {
    h.metric(&format!("llmkube.budget.{name}"))
        .map_or(-1, |m| m.value)
}

/// Lets the worker's tick run: on worker leases (the default) it charges the leases' use to the
/// ledgers and sets the gauges, which per response it does not.
fn after_a_tick(h: &mut Host) {
    h.advance_clock(Duration::from_millis(100)).unwrap();
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
        json!([{"name": "all", "scope": "router", "max_tokens": 896, "window_s": 60}]),
    );
    let first = post(&mut h, &[], BODY);
    assert!(first.local_response.is_none(), "admitted");
    assert_eq!(first.forwarded_body, BODY.as_bytes(), "no edit needed");
    // 853 held: a second request does not fit until the first settles. Only a hold is in the
    // way: it waits for the room (worker leases) and is refused when the wait is over.
    let second = post(&mut h, &[], BODY);
    let second = after_the_wait(&mut h, second);
    assert_eq!(error_of(&second), (429, "budget_exceeded".into()));
    assert_eq!(retry_after(&second), 1, "only a hold is in the way");
    // The 429 carries the rate-limit headers of the ledger that refused: 896 − 853 held.
    let refused = second.local_response.as_ref().unwrap();
    assert_eq!(refused.header("x-ratelimit-limit-tokens"), Some("896"));
    assert_eq!(refused.header("x-ratelimit-remaining-tokens"), Some("43"));
    h.log_and_done(second.stream).unwrap();
    usage_json(&mut h, &first);
    assert_eq!(gauge(&h, "all.tokens_used"), 30);
    assert_eq!(gauge(&h, "all.tokens_reserved"), 0);
    assert_eq!(gauge(&h, "all.refusals"), 1);
    // 30 spent + 853 ≤ 896.
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
    // A hold is 81 + 672 + 100 = 853; two charges of 30 leave no room under 896.
    let mut h =
        with_budgets(json!([{"name": "w", "scope": "router", "max_tokens": 896, "window_s": 2}]));
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
    after_a_tick(&mut h);
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
        with_budgets(json!([{"name": "t", "scope": "team", "max_tokens": 896, "window_s": 60}]));
    // The hold is the whole body's (853: its 81 bytes and its max_tokens), though the filter
    // saw the body nine bytes at a time.
    let first = send_body(&mut h, &red, BODY, 9);
    assert!(first.local_response.is_none(), "admitted");
    assert_eq!(first.forwarded_body, BODY.as_bytes());
    let second = send_body(&mut h, &red, BODY, 9);
    let second = after_the_wait(&mut h, second);
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

/// Hostcalls of one request and its response on `h`, by name (after warm-up, the same every
/// request).
fn calls_of(
    h: &mut Host,
    extra: &[(&str, &str)],
    chunk: usize,
) -> std::collections::BTreeMap<&'static str, u64> {
    let before: std::collections::BTreeMap<_, _> = h.hostcalls().into_iter().collect();
    let mut headers = vec![(":authority", "gw"), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    let req = send_body(h, &headers, BODY, chunk);
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    let usage = br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#;
    let json = [(":status", "200"), ("content-type", "application/json")];
    h.run_response(req.stream, &json, usage, 0).unwrap();
    h.log_and_done(req.stream).unwrap();
    h.advance_clock(Duration::from_millis(10)).unwrap();
    h.hostcalls()
        .into_iter()
        .map(|(n, c)| (n, c - before.get(n).copied().unwrap_or(0)))
        .filter(|(_, c)| *c > 0)
        .collect()
}

fn two_ledgers(extra: Value) -> Value {
    let mut c = router_config();
    let mut b = json!({"budgets": [
        {"name": "all", "scope": "router", "max_tokens": 100000000, "window_s": 3600},
        {"name": "t", "scope": "team", "max_tokens": 100000000, "window_s": 3600}
    ]});
    for (k, v) in extra.as_object().into_iter().flatten() {
        b[k] = v.clone();
    }
    c["budgets"] = b;
    c
}

/// The budget step's hostcalls in per-request mode (`per_request`) are what its guarantees need
/// and no more: one read and one compare-and-swap per ledger to reserve, the same to settle (the
/// gauges come from the settle's own read); a known team's
/// slot costs nothing, and a body that arrived in pieces is not read back. (Worker leases, the
/// default, make none of these shared-data calls per request: router_budgets_worker_lease.rs.)
#[test]
fn a_budgeted_request_costs_one_cas_per_ledger_each_way_and_no_body_read_back() {
    let red = [("x-llmkube-team", "red")];
    for chunk in [0, 9] {
        let mut plain = router();
        let per_request = two_ledgers(json!({"per_request": true}));
        let mut h = host_with("llmkube_model_router", &per_request);
        for _ in 0..3 {
            calls_of(&mut plain, &red, chunk);
            calls_of(&mut h, &red, chunk);
        }
        let base = calls_of(&mut plain, &red, chunk);
        let with = calls_of(&mut h, &red, chunk);
        let n = |m: &std::collections::BTreeMap<&str, u64>, k: &str| m.get(k).copied().unwrap_or(0);
        assert_eq!(
            n(&with, "proxy_get_shared_data"),
            n(&base, "proxy_get_shared_data") + 4,
            "{with:?}"
        );
        assert_eq!(
            n(&with, "proxy_set_shared_data"),
            n(&base, "proxy_set_shared_data") + 4,
            "{with:?}"
        );
        // The response body is read for its usage on every request, budget or not
        // (router_usage.rs); the request body exactly as often as routing reads it.
        assert_eq!(
            n(&with, "proxy_get_buffer_bytes"),
            n(&base, "proxy_get_buffer_bytes"),
            "chunk {chunk}: {base:?} vs {with:?}"
        );
        assert_eq!(
            n(&with, "proxy_set_buffer_bytes"),
            n(&base, "proxy_set_buffer_bytes"),
            "no edit needed"
        );
        // Four gauges per ledger, after the settle.
        assert_eq!(
            n(&with, "proxy_record_metric"),
            n(&base, "proxy_record_metric") + 8,
            "{with:?}"
        );
        assert_eq!(gauge(&h, "all.tokens_used"), 4 * 30);
        assert_eq!(gauge(&h, "t.team.red.tokens_used"), 4 * 30);
        assert_eq!(gauge(&h, "all.tokens_reserved"), 0);
    }
}

/// A worker remembers its teams' slots only while the table must keep them: once a quiet
/// team's slot went to another team (on another worker), the first worker asks the table again
/// and is refused, and never charges the other team's ledger.
#[test]
fn a_remembered_slot_given_to_another_team_is_asked_again_not_charged() {
    let config = two_ledgers(json!({"max_teams": 1, "hold_ttl_s": 2}));
    let mut c = config.clone();
    c["budgets"]["budgets"][1]["window_s"] = json!(1);
    let a_opts = wasm_host::VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&c).unwrap())
    .allow_stop_iteration(true);
    let shared = a_opts.shared.clone();
    let mut a = Host::from_file(wasm("llmkube_model_router"), a_opts.clone()).unwrap();
    let mut b = Host::from_file(wasm("llmkube_model_router"), a_opts.with_shared(&shared)).unwrap();
    assert!(a.configure_ok() && b.configure_ok());
    let red = [("x-llmkube-team", "red")];
    let blue = [("x-llmkube-team", "blue")];
    for _ in 0..2 {
        let r = post(&mut a, &red, BODY);
        assert!(r.local_response.is_none());
        usage_json(&mut a, &r);
    }
    // Red's ledger rolls off (1 s window, 2 s hold TTL, table bound plus its bucket of slack).
    for h in [&mut a, &mut b] {
        h.advance_clock(Duration::from_secs(10)).unwrap();
    }
    let r = post(&mut b, &blue, BODY);
    assert!(r.local_response.is_none(), "blue takes red's quiet slot");
    usage_json(&mut b, &r);
    let again = post(&mut a, &red, BODY);
    assert_eq!(
        error_of(&again),
        (429, "budget_exceeded".into()),
        "the table is full (blue)"
    );
    a.log_and_done(again.stream).unwrap();
    // Blue's ledger holds blue's charges only.
    let r = post(&mut b, &blue, BODY);
    assert!(r.local_response.is_none());
    usage_json(&mut b, &r);
    after_a_tick(&mut b);
    assert_eq!(gauge(&b, "t.team.blue.tokens_used"), 60);
}

/// A worker keeps the ledger key of each team's slot with the slot it remembers: when the
/// team's slot went to another team and the table gives it another one, its requests are
/// charged on the new slot's ledger, never on the old one's (which is the other team's now).
#[test]
fn a_team_given_another_slot_is_charged_on_that_slots_ledger() {
    let mut c = two_ledgers(json!({"max_teams": 2, "hold_ttl_s": 2}));
    c["budgets"]["budgets"][1]["window_s"] = json!(1);
    let opts = wasm_host::VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&c).unwrap())
    .allow_stop_iteration(true);
    let shared = opts.shared.clone();
    let mut a = Host::from_file(wasm("llmkube_model_router"), opts.clone()).unwrap();
    let mut b = Host::from_file(wasm("llmkube_model_router"), opts.with_shared(&shared)).unwrap();
    assert!(a.configure_ok() && b.configure_ok());
    let team = |t: &'static str| [("x-llmkube-team", t)];
    // Red takes slot 0 on worker a, green slot 1 on worker b.
    for (h, t) in [(&mut a, "red"), (&mut b, "green")] {
        let r = post(h, &team(t), BODY);
        assert!(r.local_response.is_none());
        usage_json(h, &r);
    }
    // Both roll off; blue takes the first quiet slot, red's.
    for h in [&mut a, &mut b] {
        h.advance_clock(Duration::from_secs(10)).unwrap();
    }
    let r = post(&mut b, &team("blue"), BODY);
    assert!(r.local_response.is_none());
    usage_json(&mut b, &r);
    // Red (remembered on a at slot 0) asks the table again and gets green's quiet slot 1.
    let r = post(&mut a, &team("red"), BODY);
    assert!(r.local_response.is_none(), "red gets the other quiet slot");
    usage_json(&mut a, &r);
    after_a_tick(&mut a);
    assert_eq!(gauge(&a, "t.team.red.tokens_used"), 30);
    // Blue's ledger holds blue's charges only.
    let r = post(&mut b, &team("blue"), BODY);
    assert!(r.local_response.is_none());
    usage_json(&mut b, &r);
    after_a_tick(&mut b);
    assert_eq!(gauge(&b, "t.team.blue.tokens_used"), 60);
}

/// A request whose bound alone is over a cap can never be admitted: it gets a code of its own
/// and `x-should-retry: false` (which the OpenAI and Anthropic SDKs obey), no `Retry-After`, and
/// a message saying what to lower; one that only has to wait gets `budget_exceeded` and
/// `Retry-After` as before.
#[test]
fn a_request_over_a_cap_on_its_own_is_told_not_to_retry() {
    // A hold is 81 + 672 + 100 = 853 tokens, over a cap of 800 on its own.
    let mut h = with_budgets(
        json!([{"name": "small", "scope": "router", "max_tokens": 800, "window_s": 60}]),
    );
    let r = post(&mut h, &[], BODY);
    assert_eq!(error_of(&r), (429, "budget_request_over_cap".into()));
    let reply = r.local_response.as_ref().unwrap();
    assert_eq!(reply.header("x-should-retry"), Some("false"));
    assert_eq!(reply.header("retry-after"), None);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens") && m.contains("small")),
        "{v}"
    );
    h.log_and_done(r.stream).unwrap();
}

/// A request with `tools` holds what its chat template may add for them (a tool-use preamble
/// and the tools printed again, indented): the same request that fits without them is over
/// the cap on its own with one small tool.
#[test]
fn tools_raise_the_hold_by_what_a_template_prints_for_them() {
    let mut h =
        with_budgets(json!([{"name": "b", "scope": "router", "max_tokens": 1200, "window_s": 60}]));
    let plain = post(&mut h, &[], BODY);
    assert!(plain.local_response.is_none(), "853 ≤ 1200: admitted");
    h.log_and_done(plain.stream).unwrap();
    let with_tools = BODY.replacen(
        r#""max_tokens":100,"#,
        r#""max_tokens":100,"tools":[{"type":"function","function":{"name":"f"}}],"#,
        1,
    );
    // Without the tools' margin this would hold 909 and fit.
    let r = post(&mut h, &[], &with_tools);
    assert_eq!(error_of(&r), (429, "budget_request_over_cap".into()));
    h.log_and_done(r.stream).unwrap();
}
