//! The gauges of an embedded ledger (Envoy's shared data) across two workers: the gauge is one
//! stat for every worker, and a worker can set it from the state its own compare-and-swap left
//! after another worker changed the ledger and set the gauge. The ledger's `seq` says which state
//! is newer, and the worker's tick sets the newest. That race is per-request mode's (a gauge set
//! by each settle), so those workers pin `per_request`; on worker leases (the default) only the
//! tick's renewal sets a gauge.

use serde_json::json;
use std::time::Duration;
use wasm_host::{Host, SharedStore};

mod support;
use support::*;

const BODY: &str =
    r#"{"model":"qwen3-8b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
const GAUGE: &str = "llmkube.budget.all.tokens_used";
/// The router budget's ledger in shared data (`llmkube.budget|<router>|<budget>`).
const LEDGER: &str = "llmkube.budget|llm/demo|all";

fn worker(shared: &SharedStore) -> Host {
    budget_worker(
        shared,
        json!({
            "budgets": [{"name": "all", "scope": "router", "max_tokens": 100000, "window_s": 60}],
            "per_request": true,
        }),
    )
}

/// One request charged 30 tokens (its usage) on `h`.
fn served(h: &mut Host) {
    served_with(
        h,
        br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#,
    );
}

/// One request on `h` answered 200 with the JSON `response`.
fn served_with(h: &mut Host, response: &[u8]) {
    let req = post(h, &[], BODY);
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    h.run_response(
        req.stream,
        &[(":status", "200"), ("content-type", "application/json")],
        response,
        0,
    )
    .unwrap();
    h.log_and_done(req.stream).unwrap();
}

fn gauge(h: &Host) -> i64 {
    h.metric(GAUGE).map_or(-1, |m| m.value)
}

/// The race: worker a charges 30 and, between its compare-and-swap and its gauge set, another
/// worker charges 30 more and sets the gauge to 60; a's 30 lands last. (Modelled with the other
/// worker on a copy of the ledger whose result is put back, so the only gauge set is a's.)
#[test]
fn a_worker_that_set_an_overtaken_ledger_state_sets_the_newest_on_its_tick() {
    let shared = SharedStore::new();
    let mut a = worker(&shared);
    served(&mut a);
    assert_eq!(gauge(&a), 30);
    let (after_a, _) = a.shared_data_get(LEDGER).expect("the ledger");
    let mut other = worker(&SharedStore::new());
    other.shared_data_set(LEDGER, &after_a, 0).unwrap();
    served(&mut other);
    let (newer, _) = other.shared_data_get(LEDGER).unwrap();
    a.shared_data_set(LEDGER, &newer, 0).unwrap();
    assert_eq!(
        gauge(&a),
        30,
        "a's set came last: the older state is on the gauge"
    );
    a.tick().unwrap();
    assert_eq!(gauge(&a), 60, "a's tick sets the ledger's newest state");
    // Confirmed on the next tick and forgotten: later ticks set nothing.
    let seq = a.metric(GAUGE).unwrap().set_seq;
    a.tick().unwrap();
    a.tick().unwrap();
    assert_eq!(a.metric(GAUGE).unwrap().set_seq, seq);
    // And a tick after a request whose state nobody overtook sets nothing either.
    served(&mut a);
    assert_eq!(gauge(&a), 90);
    let seq = a.metric(GAUGE).unwrap().set_seq;
    a.tick().unwrap();
    assert_eq!(a.metric(GAUGE).unwrap().set_seq, seq);
}

/// `utilization_percent` is the tightest cap's share, rounded down, in u64 arithmetic where
/// `used × 100` fits and in u128 where it does not: a USD cap's pico-dollars pass u64 / 100
/// (≈ 184 467 USD) well below the largest cap accepted (1 000 000 USD).
#[test]
fn utilization_percent_is_exact_for_tokens_and_for_usd_past_u64_range() {
    let mut c = router_config();
    c["budgets"] = json!({
        "budgets": [
            {"name": "usd", "scope": "router", "max_usd": "1000000", "window_s": 60},
            {"name": "tok", "scope": "router", "max_tokens": 1000000, "window_s": 60}
        ],
        "prices": [{"backend": "qwen-small", "prompt_usd": "1000000"}],
    });
    let mut h = host_with("llmkube_model_router", &c);
    // 300 001 prompt tokens at 1 USD each: 3.00001e17 pico-dollars, 30.0001 % of each cap.
    served_with(
        &mut h,
        br#"{"choices":[],"usage":{"prompt_tokens":300001,"completion_tokens":0}}"#,
    );
    // Worker leases (the default) set the gauges on the worker's tick.
    h.advance_clock(Duration::from_millis(100)).unwrap();
    let g = |name: &str| h.metric(name).map_or(-1, |m| m.value);
    assert_eq!(g("llmkube.budget.usd.usd_micro_used"), 300_001_000_000);
    assert_eq!(g("llmkube.budget.usd.utilization_percent"), 30);
    assert_eq!(g("llmkube.budget.tok.utilization_percent"), 30);
}
