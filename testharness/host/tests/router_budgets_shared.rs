//! The shared ledger's gauges on the compiled module, two workers (two VMs on one shared-data
//! store, as Envoy's `--concurrency 2`): the service's answers reach the workers out of order,
//! and the gauges (one stat for every worker) show the newest state of the ledger, not the
//! answer processed last.

use serde_json::{json, Value};
use wasm_host::{Host, HttpCallReply, SharedStore};

mod support;
use support::*;

const BODY: &str =
    r#"{"model":"qwen3-8b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
const GAUGE: &str = "llmkube.budget.all.tokens_used";
/// Where the filter keeps the newest state of the ledger (`llmkube.budget|<router>|gauge|<budget>`).
const NEWEST: &str = "llmkube.budget|llm/demo|gauge|all";

fn worker(shared: &SharedStore) -> Host {
    budget_worker(
        shared,
        json!({
            "budgets": [{"name": "all", "scope": "router", "max_tokens": 100000, "window_s": 60}],
            "service": {"cluster": "llmkube-budgets", "timeout_ms": 1000},
        }),
    )
}

fn ledger(tokens: u64, version: Option<u64>) -> Value {
    let mut l =
        json!({"budget": "all", "tokens_used": tokens, "usd_used": "0", "tokens_reserved": 0});
    if let Some(v) = version {
        l["version"] = json!(v);
    }
    l
}

fn only_pending(h: &Host) -> u32 {
    let p = h.pending_http_calls();
    assert_eq!(p.len(), 1, "{p:?}");
    p[0]
}

/// A request through one worker, reserved, answered and ended: its settle is queued for the
/// worker's next tick.
fn served(h: &mut Host) {
    let req = post(h, &[], BODY);
    assert!(req.local_response.is_none(), "{:?}", h.logs());
    let reserve = only_pending(h);
    let admitted = json!({"admitted": true, "reservation": "r", "ledgers": []});
    h.reply_http_call(reserve, HttpCallReply::new(200, admitted.to_string()))
        .unwrap();
    h.run_response(
        req.stream,
        &[(":status", "200"), ("content-type", "application/json")],
        br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#,
        0,
    )
    .unwrap();
    h.log_and_done(req.stream).unwrap();
}

/// [`served`], then the tick that sends its settle. Returns the settle call's token (its answer
/// is the test's to give).
fn served_until_settle_is_out(h: &mut Host) -> u32 {
    served(h);
    h.tick().unwrap();
    let settle = only_pending(h);
    let call = h.http_calls().into_iter().last().unwrap();
    assert_eq!(call.header(":path"), Some("/v1/settle"));
    settle
}

fn settled(h: &mut Host, token: u32, ledger: Value) {
    let answer = json!({"ok": true, "holds_found": 1, "ledgers": [ledger]});
    h.reply_http_call(token, HttpCallReply::new(200, answer.to_string()))
        .unwrap();
}

/// The gauge as Envoy's one stat holds it: the value of the most recent set on any worker.
fn gauge(workers: &[&Host]) -> i64 {
    workers
        .iter()
        .filter_map(|h| h.metric(GAUGE))
        .max_by_key(|m| m.set_seq)
        .map_or(-1, |m| m.value)
}

#[test]
fn an_older_answer_processed_last_leaves_the_gauge_at_the_newest_state() {
    let shared = SharedStore::new();
    let (mut a, mut b) = (worker(&shared), worker(&shared));
    let settle_a = served_until_settle_is_out(&mut a);
    let settle_b = served_until_settle_is_out(&mut b);
    // Redis applied b's settle first (version 7, two requests spent), then a's (version 9, three
    // requests); a's answer is processed first, b's older one last.
    settled(&mut a, settle_a, ledger(5919, Some(9)));
    assert_eq!(gauge(&[&a, &b]), 5919);
    settled(&mut b, settle_b, ledger(3946, Some(7)));
    assert_eq!(gauge(&[&a, &b]), 5919, "the older answer must not win");
    // Ticks change nothing once every worker shows the newest.
    a.tick().unwrap();
    b.tick().unwrap();
    assert_eq!(gauge(&[&a, &b]), 5919);
    // In order, the newer answer wins as before.
    let settle_b = served_until_settle_is_out(&mut b);
    settled(&mut b, settle_b, ledger(7892, Some(12)));
    assert_eq!(gauge(&[&a, &b]), 7892);
}

/// LEB128, as the filter stores a ledger's newest state: version, tokens, pico, held tokens.
fn newest_bytes(version: u64, tokens: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for mut v in [version, tokens, 0, 0] {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    out
}

/// The race the tick closes: a worker stores a state and, before it sets the gauge, the other
/// worker stores a newer one and sets the gauge; the first then sets its older value last.
/// Shared data holds the newer; on its next tick the first worker sets the gauge again from it.
#[test]
fn a_worker_that_set_an_overtaken_state_sets_the_newest_on_its_tick() {
    let shared = SharedStore::new();
    let (mut a, mut b) = (worker(&shared), worker(&shared));
    let settle_b = served_until_settle_is_out(&mut b);
    settled(&mut b, settle_b, ledger(3946, Some(7)));
    assert_eq!(gauge(&[&a, &b]), 3946);
    // The other worker's newer state, stored between b's store and b's set.
    b.shared_data_set(NEWEST, &newest_bytes(9, 5919), 0)
        .unwrap();
    assert_eq!(gauge(&[&a, &b]), 3946, "b's set came last");
    b.tick().unwrap();
    assert_eq!(gauge(&[&a, &b]), 5919, "b's tick sets the newest");
    // Nothing is set again on later ticks (the ledger is confirmed and leaves the list).
    let seq = b.metric(GAUGE).unwrap().set_seq;
    b.tick().unwrap();
    b.tick().unwrap();
    assert_eq!(b.metric(GAUGE).unwrap().set_seq, seq);
    a.tick().unwrap();
    assert_eq!(gauge(&[&a, &b]), 5919);
}

/// A service that sends no versions (older than the field): every answer is as new as any
/// other, and the last one processed wins, as before versions existed.
#[test]
fn answers_without_versions_keep_the_last_one() {
    let shared = SharedStore::new();
    let (mut a, mut b) = (worker(&shared), worker(&shared));
    let settle_a = served_until_settle_is_out(&mut a);
    let settle_b = served_until_settle_is_out(&mut b);
    settled(&mut a, settle_a, ledger(5919, None));
    settled(&mut b, settle_b, ledger(3946, None));
    assert_eq!(gauge(&[&a, &b]), 3946);
    a.tick().unwrap();
    b.tick().unwrap();
    assert_eq!(gauge(&[&a, &b]), 3946);
}

/// Requests that end between two ticks settle in one callout: `/v1/end` with every settle due
/// (one service request, one Redis round trip), each end's answer setting the gauges; a batch
/// the service could not apply (503) is sent again whole, since each end applies once however
/// often it arrives.
#[test]
fn settles_due_on_one_tick_go_out_in_one_batch() {
    let shared = SharedStore::new();
    let mut h = worker(&shared);
    served(&mut h);
    served(&mut h);
    h.tick().unwrap();
    let first = only_pending(&h);
    let call = h.http_calls().into_iter().last().unwrap();
    assert_eq!(call.header(":path"), Some("/v1/end"));
    let batch: Value = serde_json::from_slice(&call.body).unwrap();
    let ends = batch["ends"].as_array().unwrap();
    assert_eq!(ends.len(), 2, "{batch}");
    assert!(ends.iter().all(|e| e["amount"]["tokens"] == 30), "{batch}");
    assert_ne!(ends[0]["reservation"], ends[1]["reservation"]);
    h.reply_http_call(first, HttpCallReply::new(503, "{}".to_string()))
        .unwrap();
    assert!(h.pending_http_calls().is_empty());
    h.advance_clock(std::time::Duration::from_millis(500))
        .unwrap();
    h.tick().unwrap();
    let again = only_pending(&h);
    let resent = h.http_calls().into_iter().last().unwrap();
    assert_eq!(resent.header(":path"), Some("/v1/end"));
    assert_eq!(resent.body, call.body, "the same two ends, sent again");
    let answer = json!({"results": [
        {"ok": true, "holds_found": 1, "ledgers": [ledger(30, Some(3))]},
        {"ok": true, "holds_found": 1, "ledgers": [ledger(60, Some(4))]}]});
    h.reply_http_call(again, HttpCallReply::new(200, answer.to_string()))
        .unwrap();
    assert_eq!(gauge(&[&h]), 60);
    h.advance_clock(std::time::Duration::from_secs(5)).unwrap();
    h.tick().unwrap();
    assert!(h.pending_http_calls().is_empty(), "nothing more is sent");
}

/// A served request settles from its own context on its last response chunk and holds that
/// chunk until the service answers: the client gets the last byte only once the hold is gone
/// from the shared ledger, and nothing is left for the worker's tick. A settle that gets no
/// answer in time (the call fails) lets the chunk go and is queued for the tick.
#[test]
fn the_last_chunk_waits_for_the_settle_and_a_failed_one_goes_to_the_tick() {
    let shared = SharedStore::new();
    let mut h = worker(&shared);
    let answered = [true, false];
    for answer in answered {
        let req = post(&mut h, &[], BODY);
        let reserve = only_pending(&h);
        let admitted = json!({"admitted": true, "reservation": "r", "ledgers": []});
        h.reply_http_call(reserve, HttpCallReply::new(200, admitted.to_string()))
            .unwrap();
        let body = br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#;
        let out = h
            .run_response(
                req.stream,
                &[(":status", "200"), ("content-type", "application/json")],
                body,
                0,
            )
            .unwrap();
        assert!(!out.complete, "the last chunk waits for the settle");
        let settle = only_pending(&h);
        let call = h.http_calls().into_iter().last().unwrap();
        assert_eq!(call.header(":path"), Some("/v1/settle"));
        if answer {
            settled(&mut h, settle, ledger(30, Some(5)));
        } else {
            h.fail_http_call(settle).unwrap();
        }
        let out = h.response_outcome(req.stream).unwrap();
        assert!(
            out.complete,
            "the response goes on once the settle is answered"
        );
        assert_eq!(out.forwarded_body, body.to_vec());
        h.log_and_done(req.stream).unwrap();
        // Past the retry's back-off.
        h.advance_clock(std::time::Duration::from_millis(500))
            .unwrap();
        h.tick().unwrap();
        if answer {
            assert_eq!(gauge(&[&h]), 30);
            assert!(
                h.pending_http_calls().is_empty(),
                "nothing left for the tick"
            );
        } else {
            let again = only_pending(&h);
            let resent = h.http_calls().into_iter().last().unwrap();
            assert_eq!(resent.header(":path"), Some("/v1/settle"));
            assert_eq!(resent.body, call.body, "the same settle, sent again");
            settled(&mut h, again, ledger(60, Some(6)));
            assert_eq!(gauge(&[&h]), 60);
        }
    }
}
