//! Failover under a gateway that replays only small bodies (`failover_replay_limit`, written by
//! `--target agentgateway --failover-within-replay-limit`): a request whose body is over the
//! limit and whose order has other backends is forwarded as usual, counted
//! (`llmkube.failover_skipped`) and audited (`failover_skipped: true`); nothing else is.

use serde_json::Value;
use wasm_host::Host;

mod support;
use support::*;

const LIMIT: usize = 200;

fn host(limit: Option<usize>) -> Host {
    let mut cfg = router_config();
    if let Some(l) = limit {
        cfg["failover_replay_limit"] = l.into();
    }
    host_with("llmkube_model_router", &cfg)
}

/// A chat body of exactly `len` bytes for `model`.
fn body_of(model: &str, len: usize) -> String {
    let head = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":""#);
    let tail = r#""}]}"#;
    let fill = len - head.len() - tail.len();
    format!("{head}{}{tail}", "x".repeat(fill))
}

/// Sends one request, answers it 200, and returns its audit record and the route it was sent on.
fn send(h: &mut Host, extra: &[(&str, &str)], body: &str) -> (Value, String) {
    let req = post(h, extra, body);
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    let route = req
        .header("x-llmkube-route")
        .expect("a route key")
        .to_string();
    h.run_response(
        req.stream,
        &[(":status", "200"), ("content-type", "application/json")],
        b"{}",
        0,
    )
    .unwrap();
    h.log_and_done(req.stream).unwrap();
    let line = h.logs_matching("llmkube-audit ").pop().unwrap();
    let audit = serde_json::from_str(line.split_once("llmkube-audit ").unwrap().1).unwrap();
    (audit, route)
}

fn skipped(h: &Host) -> i64 {
    h.metric("llmkube.failover_skipped")
        .expect("the counter is defined under a replay limit")
        .value
}

#[test]
fn a_body_over_the_replay_limit_with_alternatives_is_counted_and_audited() {
    let mut h = host(Some(LIMIT));
    let research = [("x-team", "research")]; // order gpt, llama-big
    assert_eq!(skipped(&h), 0);

    // At the limit: fails over as usual, nothing recorded.
    let (audit, route) = send(&mut h, &research, &body_of("m", LIMIT));
    assert_eq!(route, "research/gpt,llama-big");
    assert!(audit.get("failover_skipped").is_none(), "{audit}");
    assert_eq!(skipped(&h), 0);

    // One byte over: the same route (agentgateway gives it one attempt), counted and audited.
    let (audit, route) = send(&mut h, &research, &body_of("m", LIMIT + 1));
    assert_eq!(route, "research/gpt,llama-big");
    assert_eq!(audit["failover_skipped"], true, "{audit}");
    assert_eq!(audit["outcome"], "ok");
    assert_eq!(skipped(&h), 1);

    // One backend in the order: there is nothing to fail over to, so nothing is skipped.
    let (audit, route) = send(&mut h, &[], &body_of("qwen3-8b", LIMIT * 4));
    assert_eq!(route, "qwen/qwen-small");
    assert!(audit.get("failover_skipped").is_none(), "{audit}");
    assert_eq!(skipped(&h), 1);

    // A sensitive request over the limit: its local order, also one attempt, also recorded.
    let (audit, route) = send(
        &mut h,
        &[("x-llmkube-classification", "pii")],
        &body_of("m", LIMIT * 4),
    );
    assert_eq!(route, "regulated/llama-big,qwen-small");
    assert_eq!(audit["failover_skipped"], true, "{audit}");
    assert_eq!(skipped(&h), 2);
}

#[test]
fn without_a_replay_limit_nothing_is_recorded() {
    let mut h = host(None);
    let (audit, _) = send(&mut h, &[("x-team", "research")], &body_of("m", 4000));
    assert!(audit.get("failover_skipped").is_none(), "{audit}");
    assert!(h.metric("llmkube.failover_skipped").is_none());
}
