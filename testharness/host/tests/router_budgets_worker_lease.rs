//! Worker leases over the embedded ledgers (the default for embedded budgets) on the compiled
//! module, with the test kit's manual clock: a request the worker's leases cover makes no shared-data
//! call and no gauge write (the tick charges its use and sets the gauges), in-flight holds
//! still refuse, and Retry-After is the second the request fits again (near a cap, where a
//! lease holds no spare room and every end is written at once).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use wasm_host::{Host, SharedStore};

mod support;
use support::*;

/// 81 bytes: a hold is 81 + 672 (template margin) + max_tokens.
const BODY: &str =
    r#"{"model":"qwen3-8b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
const USAGE: &[u8] = br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#;
const RED: [(&str, &str); 1] = [("x-llmkube-team", "red")];

fn with_budgets(budgets: Value) -> Host {
    let mut c = router_config();
    c["budgets"] = json!({ "budgets": budgets });
    host_with("llmkube_model_router", &c)
}

/// A router budget and a team budget: two ledgers per request.
fn two_ledgers() -> Value {
    json!([
        {"name": "all", "scope": "router", "max_tokens": 100000000, "window_s": 3600},
        {"name": "t", "scope": "team", "max_tokens": 100000000, "window_s": 3600}
    ])
}

fn gauge(h: &Host, name: &str) -> i64 {
    h.metric(&format!("llmkube.budget.{name}"))
        .map_or(-1, |m| m.value)
}

/// One request of the red team, answered with 10 + 20 tokens, the clock standing still.
fn serve(h: &mut Host) {
    let req = post(h, &RED, BODY);
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    let json = [(":status", "200"), ("content-type", "application/json")];
    h.run_response(req.stream, &json, USAGE, 0).unwrap();
    h.log_and_done(req.stream).unwrap();
}

fn retry_after(o: &wasm_host::StreamOutcome) -> u64 {
    let r = o.local_response.as_ref().expect("a local response");
    r.header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap()
}

/// Hostcalls of `n` requests on `h`, by name.
fn calls_of(h: &mut Host, n: usize) -> BTreeMap<&'static str, u64> {
    let before: BTreeMap<_, _> = h.hostcalls().into_iter().collect();
    for _ in 0..n {
        serve(h);
    }
    h.hostcalls()
        .into_iter()
        .map(|(k, c)| (k, c - before.get(k).copied().unwrap_or(0)))
        .collect()
}

#[test]
fn requests_on_worker_leases_make_no_shared_data_call_and_the_tick_charges_them() {
    let mut plain = host_with("llmkube_model_router", &router_config());
    let mut h = with_budgets(two_ledgers());
    // The first request takes a lease on each ledger (one renewal each).
    serve(&mut h);
    serve(&mut plain);
    let base = calls_of(&mut plain, 5);
    let with = calls_of(&mut h, 5);
    let n = |m: &BTreeMap<&str, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    for call in [
        "proxy_get_shared_data",
        "proxy_set_shared_data",
        "proxy_record_metric",
    ] {
        assert_eq!(
            n(&with, call),
            n(&base, call),
            "{call}: {base:?} vs {with:?}"
        );
    }
    // Nothing of the six requests is in the ledgers yet; the tick charges all of it.
    assert_eq!(gauge(&h, "all.tokens_used"), 0);
    h.advance_clock(Duration::from_millis(100)).unwrap();
    assert_eq!(gauge(&h, "all.tokens_used"), 6 * 30);
    assert_eq!(gauge(&h, "t.team.red.tokens_used"), 6 * 30);
    assert!(
        gauge(&h, "all.tokens_reserved") > 0,
        "the lease for the next tick"
    );
    // Two quiet ticks: the lease shrinks to what is in flight (nothing), then goes.
    h.advance_clock(Duration::from_millis(200)).unwrap();
    assert_eq!(gauge(&h, "all.tokens_reserved"), 0);
    assert_eq!(gauge(&h, "t.team.red.tokens_reserved"), 0);
    assert_eq!(gauge(&h, "all.tokens_used"), 6 * 30);
}

#[test]
fn holds_in_flight_on_a_lease_refuse_and_an_unanswered_request_releases() {
    let mut h = with_budgets(
        json!([{"name": "all", "scope": "router", "max_tokens": 896, "window_s": 60}]),
    );
    let first = post(&mut h, &[], BODY);
    assert!(first.local_response.is_none(), "admitted");
    // 853 held in the lease: a second request does not fit until the first ends. Only a hold
    // is in the way, so it waits (four ticks) for the room, then is answered from the root.
    let second = post(&mut h, &[], BODY);
    assert!(second.local_response.is_none() && !second.complete, "held");
    h.advance_clock(Duration::from_millis(300)).unwrap();
    let waiting = h.request_outcome(second.stream).unwrap();
    assert!(
        waiting.local_response.is_none() && !waiting.complete,
        "still held"
    );
    h.advance_clock(Duration::from_millis(100)).unwrap();
    let second = h.request_outcome(second.stream).unwrap();
    assert_eq!(error_of(&second), (429, "budget_exceeded".into()));
    assert_eq!(retry_after(&second), 1, "only a hold is in the way");
    h.log_and_done(second.stream).unwrap();
    let audit = h.logs_matching("\"outcome\"");
    assert!(
        audit
            .last()
            .is_some_and(|l| l.contains("\"budget_exceeded\"")),
        "{audit:?}"
    );
    // Never answered (client gone before a response): released on the lease.
    h.log_and_done(first.stream).unwrap();
    let third = post(&mut h, &[], BODY);
    assert!(third.local_response.is_none(), "the released room is back");
    h.log_and_done(third.stream).unwrap();
    h.advance_clock(Duration::from_millis(300)).unwrap();
    assert_eq!(gauge(&h, "all.tokens_used"), 0);
    assert_eq!(gauge(&h, "all.tokens_reserved"), 0);
    assert_eq!(gauge(&h, "all.refusals"), 1);
}

#[test]
fn retry_after_on_a_lease_is_the_second_the_request_fits_again() {
    // A hold is 81 + 672 + 100 = 853; two charges of 30 leave no room under 896.
    let mut h =
        with_budgets(json!([{"name": "w", "scope": "router", "max_tokens": 896, "window_s": 2}]));
    for _ in 0..2 {
        let r = post(&mut h, &[], BODY);
        assert!(r.local_response.is_none());
        let json = [(":status", "200"), ("content-type", "application/json")];
        h.run_response(r.stream, &json, USAGE, 7).unwrap();
        h.log_and_done(r.stream).unwrap();
    }
    // Near this cap the lease holds no spare room, so each end was written at once: the
    // refusal counts from the charges' second, not "1, a hold is in the way". (A refusal that
    // finds them still unreported charges them first: the core's
    // `a_refusal_before_the_report_counts_from_the_workers_own_use`.)
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

/// 400 tokens.
const USAGE_400: &[u8] = br#"{"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":100}}"#;

/// Two workers on one ledger (cap 4,265; a hold is 853). Worker A's first request leases room
/// for one more beside it (1,706 held). Worker B's requests, one after another and charged 400
/// each, fit beside that lease five times; the sixth fits what is spent (2,030 with A's) but not
/// beside A's lease: it waits instead of being refused, A's tick gives the room back, and B's
/// tick admits and resumes it.
#[test]
fn a_request_refused_only_for_room_another_workers_lease_holds_waits_for_it() {
    let shared = SharedStore::new();
    let budgets = json!({"budgets": [
        {"name": "all", "scope": "router", "max_tokens": 4265, "window_s": 3600}
    ]});
    let mut a = budget_worker(&shared, budgets.clone());
    let mut b = budget_worker(&shared, budgets);
    serve(&mut a);
    let json = [(":status", "200"), ("content-type", "application/json")];
    let mut served = 0;
    let held = loop {
        let r = post(&mut b, &[], BODY);
        if let Some(answer) = &r.local_response {
            panic!(
                "refused after {served}: {}",
                String::from_utf8_lossy(&answer.body)
            );
        }
        if !r.complete {
            break r;
        }
        b.run_response(r.stream, &json, USAGE_400, 0).unwrap();
        b.log_and_done(r.stream).unwrap();
        served += 1;
        assert!(served < 10, "never held");
    };
    assert_eq!(served, 5);
    a.advance_clock(Duration::from_millis(100)).unwrap();
    b.advance_clock(Duration::from_millis(100)).unwrap();
    let resumed = b.request_outcome(held.stream).unwrap();
    assert!(
        resumed.local_response.is_none(),
        "{:?}",
        resumed.local_response
    );
    assert!(resumed.complete, "resumed upstream");
    let done = b.run_response(held.stream, &json, USAGE_400, 0).unwrap();
    assert_eq!(done.header("x-ratelimit-limit-tokens"), Some("4265"));
    b.log_and_done(held.stream).unwrap();
    b.advance_clock(Duration::from_millis(100)).unwrap();
    assert_eq!(gauge(&b, "all.tokens_used"), 30 + 6 * 400);
    assert_eq!(gauge(&b, "all.refusals"), 0);
    assert_eq!(gauge(&b, "room_waits"), 1, "held once");
    assert_eq!(gauge(&b, "room_waits_refused"), 0);
}
