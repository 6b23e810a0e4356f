//! Lease mode of the shared ledger on the compiled module, two workers (two VMs on one
//! shared-data store, as Envoy's `--concurrency 2`): a request that finds no lease reserves on
//! its own and the next tick asks for one; once granted, either worker admits on it with no
//! callout; the tick's report charges what the lease's requests used, and while a report is
//! out nothing is admitted on the lease.

use serde_json::{json, Value};
use wasm_host::{Host, HttpCallReply, SharedStore};

mod support;
use support::*;

const BODY: &str =
    r#"{"model":"qwen3-8b","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;

fn worker(shared: &SharedStore) -> Host {
    budget_worker(
        shared,
        json!({
            "budgets": [{"name": "all", "scope": "router", "max_tokens": 100000, "window_s": 60}],
            "service": {"cluster": "llmkube-budgets", "timeout_ms": 1000,
                        "lease": {"max_tokens": 5000}},
        }),
    )
}

/// The calls made since `from`, by path.
fn calls_to(h: &Host, from: usize, path: &str) -> Vec<(u32, Value)> {
    h.http_calls()
        .into_iter()
        .skip(from)
        .filter(|c| c.header(":path") == Some(path))
        .map(|c| (c.token, serde_json::from_slice(&c.body).unwrap()))
        .collect()
}

/// The response with usage 10 + 20, and the request's end.
fn respond(h: &mut Host, stream: wasm_host::StreamId) {
    h.run_response(
        stream,
        &[(":status", "200"), ("content-type", "application/json")],
        br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#,
        0,
    )
    .unwrap();
    h.log_and_done(stream).unwrap();
}

fn lease_answer(tokens: u64) -> HttpCallReply {
    let a = json!({"granted": {"tokens": tokens, "usd": "0"}, "applied": true,
        "ledger": {"budget": "all", "tokens_used": 0, "usd_used": "0", "tokens_reserved": tokens}});
    HttpCallReply::new(200, a.to_string())
}

#[test]
fn a_granted_lease_admits_on_every_worker_without_a_callout_and_reports_the_use() {
    let shared = SharedStore::new();
    let (mut a, mut b) = (worker(&shared), worker(&shared));
    // No lease yet: the request reserves on its own.
    let req = post(&mut a, &[], BODY);
    assert!(req.local_response.is_none(), "{:?}", a.logs());
    let reserve = calls_to(&a, 0, "/v1/reserve");
    assert_eq!(reserve.len(), 1);
    // The service may hold it for four report periods while leases give their room back (only
    // holds in its way): the call's timeout grows by as much.
    assert_eq!(
        reserve[0].1["wait_ms"].as_u64(),
        Some(400),
        "{}",
        reserve[0].1
    );
    let call = a
        .http_calls()
        .into_iter()
        .find(|c| c.token == reserve[0].0)
        .unwrap();
    assert_eq!(call.timeout, std::time::Duration::from_millis(1400));
    let admitted = json!({"admitted": true, "reservation": "r", "ledgers": []});
    a.reply_http_call(reserve[0].0, HttpCallReply::new(200, admitted.to_string()))
        .unwrap();
    respond(&mut a, req.stream);
    // Its tick asks for a lease (nothing used on one yet).
    a.tick().unwrap();
    let first = calls_to(&a, 0, "/v1/lease");
    assert_eq!(first.len(), 1, "{:?}", a.http_calls());
    let (token, body) = &first[0];
    assert!(body.get("old").is_none(), "{body}");
    assert_eq!(
        (
            body["used"]["tokens"].as_u64(),
            body["max"]["tokens"].as_u64()
        ),
        (Some(0), Some(5000))
    );
    let lease_id = body["id"].as_str().unwrap().to_string();
    a.reply_http_call(*token, lease_answer(5000)).unwrap();
    assert_eq!(
        a.metric("llmkube.budget.all.lease_tokens").map(|m| m.value),
        Some(5000)
    );
    // A response admitted on the lease carries the rate-limit headers of its ledger as the
    // lease report answered it (the lease's 5000 held).
    let on_lease = post(&mut a, &[], BODY);
    assert!(on_lease.local_response.is_none());
    let res = a
        .run_response(
            on_lease.stream,
            &[(":status", "200"), ("content-type", "application/json")],
            br#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#,
            0,
        )
        .unwrap();
    a.log_and_done(on_lease.stream).unwrap();
    assert_eq!(res.header("x-ratelimit-limit-tokens"), Some("100000"));
    assert_eq!(res.header("x-ratelimit-remaining-tokens"), Some("95000"));
    // The other worker admits on it: no callout at all.
    let before = b.http_calls().len();
    let req = post(&mut b, &[], BODY);
    assert!(req.local_response.is_none(), "{:?}", b.logs());
    assert_eq!(
        b.http_calls().len(),
        before,
        "admitted on the lease, no callout"
    );
    respond(&mut b, req.stream);
    b.tick().unwrap();
    assert_eq!(
        b.http_calls().len(),
        before,
        "nothing to settle with the service"
    );
    assert_eq!(
        b.metric("llmkube.budget.all.lease_admitted")
            .map(|m| m.value),
        Some(1)
    );
    // A report period later the report charges the 30 used and renews the lease.
    let from = a.http_calls().len();
    a.advance_clock(std::time::Duration::from_millis(150))
        .unwrap();
    let report = calls_to(&a, from, "/v1/lease");
    assert_eq!(report.len(), 1, "{:?}", a.http_calls());
    let (token, body) = &report[0];
    assert_eq!(body["old"].as_str(), Some(lease_id.as_str()));
    assert_eq!(
        body["used"]["tokens"].as_u64(),
        Some(60),
        "two requests of 30"
    );
    // While it is out, a request is not admitted on the lease: it reserves on its own.
    let before = b.http_calls().len();
    let req = post(&mut b, &[], BODY);
    assert!(req.local_response.is_none());
    assert_eq!(
        calls_to(&b, before, "/v1/reserve").len(),
        1,
        "the lease is frozen during its report"
    );
    a.reply_http_call(*token, lease_answer(5000)).unwrap();
    // Answered: the lease admits again.
    let before = b.http_calls().len();
    let req2 = post(&mut b, &[], BODY);
    assert!(req2.local_response.is_none());
    assert_eq!(
        b.http_calls().len(),
        before,
        "admitted on the renewed lease"
    );
    let _ = req;
}

/// A router budget and a team budget, both leased; two team-lease slots per team budget.
fn team_worker(shared: &SharedStore) -> Host {
    budget_worker(
        shared,
        json!({
            "budgets": [
                {"name": "all", "scope": "router", "max_tokens": 100000, "window_s": 60},
                {"name": "t", "scope": "team", "max_tokens": 100000, "window_s": 60}
            ],
            "service": {"cluster": "llmkube-budgets", "timeout_ms": 1000,
                        "lease": {"max_tokens": 5000, "team_slots": 2}},
        }),
    )
}

fn granted(budget: &str, team: Option<&str>, tokens: u64) -> HttpCallReply {
    let mut ledger = json!({"budget": budget, "tokens_used": 0, "usd_used": "0",
        "tokens_reserved": tokens});
    if let Some(t) = team {
        ledger["team"] = json!(t);
    }
    let a = json!({"granted": {"tokens": tokens, "usd": "0"}, "applied": true, "ledger": ledger});
    HttpCallReply::new(200, a.to_string())
}

/// A request of `team` on `h`; the number of reserve callouts it made (answered admitted).
fn team_request(h: &mut Host, team: &str) -> usize {
    let before = h.http_calls().len();
    let req = post(h, &[("x-llmkube-team", team)], BODY);
    assert!(req.local_response.is_none(), "{:?}", h.logs());
    let reserves = calls_to(h, before, "/v1/reserve");
    for (token, _) in &reserves {
        let admitted = json!({"admitted": true, "reservation": "r", "ledgers": []});
        h.reply_http_call(*token, HttpCallReply::new(200, admitted.to_string()))
            .unwrap();
    }
    respond(h, req.stream);
    reserves.len()
}

/// The lease reports `h`'s tick sends from call `from` on: (token, ledger's team, body).
fn lease_reports(h: &mut Host) -> Vec<(u32, Option<String>, Value)> {
    let from = h.http_calls().len();
    h.tick().unwrap();
    calls_to(h, from, "/v1/lease")
        .into_iter()
        .map(|(t, b)| {
            let team = b["ledger"]["team"].as_str().map(String::from);
            (t, team, b)
        })
        .collect()
}

#[test]
fn team_leases_admit_on_every_worker_per_team_and_a_team_past_the_slots_reserves_per_request() {
    let shared = SharedStore::new();
    let (mut a, mut b) = (team_worker(&shared), team_worker(&shared));
    // Red's first request finds no lease: it reserves on its own, and binds a free slot.
    assert_eq!(team_request(&mut a, "red"), 1);
    let reports = lease_reports(&mut a);
    assert_eq!(reports.len(), 2, "the router lease and red's: {reports:?}");
    for (token, team, body) in &reports {
        if let Some(t) = team {
            assert_eq!(t, "red");
            assert_eq!(body["ledger"]["budget"], "t");
            assert_eq!(body["max_teams"], 1024, "{body}");
        }
        a.reply_http_call(
            *token,
            granted(
                body["ledger"]["budget"].as_str().unwrap(),
                team.as_deref(),
                5000,
            ),
        )
        .unwrap();
    }
    // The other worker admits red on both leases, with no callout.
    let before = b.http_calls().len();
    assert_eq!(team_request(&mut b, "red"), 0, "{:?}", b.logs());
    b.tick().unwrap();
    assert_eq!(b.http_calls().len(), before, "no callout for red on b");
    assert_eq!(
        b.metric("llmkube.budget.t.lease_admitted").map(|m| m.value),
        Some(1)
    );
    // Blue gets a lease of its own, on the other slot.
    assert_eq!(team_request(&mut b, "blue"), 1, "blue has no lease yet");
    let reports = lease_reports(&mut b);
    let blue: Vec<_> = reports
        .iter()
        .filter(|r| r.1.as_deref() == Some("blue"))
        .collect();
    assert_eq!(blue.len(), 1, "{reports:?}");
    assert!(blue[0].2.get("old").is_none());
    b.reply_http_call(blue[0].0, granted("t", Some("blue"), 5000))
        .unwrap();
    assert_eq!(
        team_request(&mut a, "blue"),
        0,
        "blue admitted on its lease, on a"
    );
    assert_eq!(team_request(&mut a, "red"), 0, "red still on its own");
    // Green: both slots are taken, so green reserves per request, every time, and no lease
    // is asked for it.
    assert_eq!(team_request(&mut a, "green"), 1);
    let reports = lease_reports(&mut a);
    assert!(
        reports.iter().all(|r| r.1.as_deref() != Some("green")),
        "{reports:?}"
    );
    assert_eq!(team_request(&mut b, "green"), 1);
    assert_eq!(team_request(&mut a, "green"), 1);
    let no_slot = |h: &Host| h.metric("llmkube.budget.t.lease_no_slot").map(|m| m.value);
    assert_eq!((no_slot(&a), no_slot(&b)), (Some(2), Some(1)), "counted");
    // Red's report (a report period on) charges red's use on red's ledger and no other.
    let from = a.http_calls().len();
    a.advance_clock(std::time::Duration::from_millis(150))
        .unwrap();
    let reports = calls_to(&a, from, "/v1/lease");
    let red: Vec<_> = reports
        .iter()
        .filter(|r| r.1["ledger"]["team"] == "red")
        .collect();
    assert_eq!(red.len(), 1, "{reports:?}");
    assert_eq!(
        red[0].1["used"]["tokens"], 60,
        "red's two requests on a lease: 2 × 30"
    );
}
