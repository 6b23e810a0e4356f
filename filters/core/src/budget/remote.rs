//! The filter's side of the shared ledger `llmkube-budgets`: the calls it sends (reserve before
//! upstream, settle or release at the end) and what each answer means for the request. Moving
//! the bytes is the filter's job (`dispatch_http_call`); deciding on them is here.
//!
//! Failure policy: a reserve that gets no usable answer (timeout, connection refused, the
//! service's own 503 when Redis is down, or an answer this code cannot read) makes the store
//! "unavailable", which fails closed with 503 `budget_store_unavailable` unless the budgets
//! are configured fail-open. A settle or release that fails is only logged: the hold it would
//! have dropped expires at its TTL on the service, so nothing leaks beyond that bound.

use super::admit::LedgerKey;
use super::compiled::CompiledBudgets;
use super::gauge::Reading;
use super::money::format_usd;
use super::protocol::{
    AmountJson, EndBatchResponse, LedgerRef, LedgerState, ReserveRequest, ReserveResponse,
    SettleRequest, SettleResponse, MAX_LEDGERS,
};
use super::reply::{self, Refused};
use super::window::Amount;
use crate::errors::ApiError;

pub const RESERVE_PATH: &str = "/v1/reserve";
pub const SETTLE_PATH: &str = "/v1/settle";
pub const RELEASE_PATH: &str = "/v1/release";
/// Several settles and releases in one call (`wire::EndBatch`).
pub const END_PATH: &str = "/v1/end";
/// Most bytes of ends a gateway puts in one batch (the service takes up to 256 KiB).
pub const MAX_BATCH_BYTES: usize = 48 * 1024;
/// The `:authority` of calls to the service (Envoy routes by cluster, not by this name).
pub const AUTHORITY: &str = "llmkube-budgets";
/// Most bytes of a service answer the filter reads; its answers are a few hundred bytes.
pub const MAX_REPLY_BYTES: usize = 16 * 1024;

/// The headers of one call to the service.
pub fn call_headers(path: &'static str) -> [(&'static str, &'static str); 4] {
    [
        (":method", "POST"),
        (":path", path),
        (":authority", AUTHORITY),
        ("content-type", "application/json"),
    ]
}

/// The wire names of `keys`, each with its budget's caps and window (the gateway's
/// configuration is the one source of truth; the service keeps none of its own). Keys whose
/// budget index is out of range are skipped, never guessed.
pub fn ledger_refs(c: &CompiledBudgets, keys: &[LedgerKey]) -> Vec<LedgerRef> {
    keys.iter()
        .filter_map(|k| {
            let b = c.budgets.get(k.budget)?;
            Some(LedgerRef {
                budget: b.name.clone(),
                team: k.team.clone(),
                window_s: b.window_s,
                max_tokens: b.caps.tokens,
                max_usd: b.caps.pico.map(format_usd),
            })
        })
        .collect()
}

/// `POST /v1/reserve`: hold `amount` on every ledger of `keys`, all or nothing, under the
/// gateway's id `reservation` (so the gateway can release it without the answer). `wait_ms`
/// (lease mode; 0: none): how long the service may wait for leases to give back room that is
/// all that refuses the request.
pub fn reserve_body(
    router: &str,
    c: &CompiledBudgets,
    keys: &[LedgerKey],
    amount: Amount,
    reservation: &str,
    wait_ms: u64,
) -> Vec<u8> {
    let req = ReserveRequest {
        router: router.to_string(),
        ledgers: ledger_refs(c, keys),
        amount: AmountJson::from_amount(amount),
        ttl_s: Some(c.hold_ttl_s),
        reservation: Some(reservation.to_string()),
        max_teams: Some(c.max_teams as u64),
        wait_ms: (wait_ms > 0).then_some(wait_ms),
    };
    // Serialising plain strings and integers cannot fail; an empty body would only be refused
    // by the service with a 400, which the caller reports.
    serde_json::to_vec(&req).unwrap_or_default()
}

/// `POST /v1/settle` with the real usage (`Some`), or `POST /v1/release` (`None`): the path and
/// the body of the call that ends a reservation.
pub fn end_call(
    router: &str,
    c: &CompiledBudgets,
    keys: &[LedgerKey],
    reservation: &str,
    charge: Option<Amount>,
) -> (&'static str, Vec<u8>) {
    let req = SettleRequest {
        router: router.to_string(),
        reservation: reservation.to_string(),
        ledgers: ledger_refs(c, keys),
        amount: charge.map(AmountJson::from_amount),
        ttl_s: Some(c.hold_ttl_s),
    };
    let path = if charge.is_some() {
        SETTLE_PATH
    } else {
        RELEASE_PATH
    };
    (path, serde_json::to_vec(&req).unwrap_or_default())
}

/// What a reserve call's answer means for the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Held on every ledger: forward the request, settle or release `reservation` at its end.
    Admitted { reservation: String },
    /// No room: answer 429 `budget_exceeded` with its `Retry-After`.
    Refused(Refused),
    /// No usable answer; `why` names the failure (never request content).
    Unavailable { why: String },
}

/// One ledger's state from a service answer, as the gateway's gauges take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gauge {
    pub key: LedgerKey,
    pub reading: Reading,
}

/// The ledgers of an answer that name one of this gateway's budgets (others, and amounts that
/// do not parse, are skipped), at most [`MAX_LEDGERS`].
pub fn gauges(c: &CompiledBudgets, states: &[LedgerState]) -> Vec<Gauge> {
    states
        .iter()
        .take(MAX_LEDGERS)
        .filter_map(|s| {
            let budget = c.budgets.iter().position(|b| b.name == s.budget)?;
            let (spent, held_tokens) = s.amounts()?;
            Some(Gauge {
                key: LedgerKey {
                    budget,
                    team: s.team.clone(),
                },
                reading: Reading {
                    version: s.version,
                    spent,
                    held_tokens,
                },
            })
        })
        .collect()
}

/// The newest state of each ledger among `gauges` (the answers of one settle batch, up to 64
/// ends on the same few ledgers), in first-seen order: setting a gauge costs a shared-data
/// compare-and-swap and four stats, and only the newest state would be left by setting them
/// all (ties, a service without versions, go to the later one, as setting them in order did).
pub fn newest_per_ledger(gauges: impl IntoIterator<Item = Gauge>) -> Vec<Gauge> {
    let mut out: Vec<Gauge> = Vec::new();
    for g in gauges {
        match out.iter_mut().find(|o| o.key == g.key) {
            Some(o) if g.reading.version >= o.reading.version => *o = g,
            Some(_) => {}
            None => out.push(g),
        }
    }
    out
}

/// Reads a reserve answer: `status` is the call's `:status` (0 when the call failed or timed
/// out and there is no response), `retry_after` its `Retry-After` header, `body` its body.
/// With it, the ledgers as the service left them (empty when it did not say).
pub fn read_reserve(
    status: u32,
    retry_after: Option<&str>,
    body: &[u8],
) -> (Admission, Vec<LedgerState>) {
    if status == 200 {
        return match serde_json::from_slice::<ReserveResponse>(body) {
            Ok(ReserveResponse {
                admitted: true,
                reservation: Some(id),
                ledgers,
                ..
            }) if !id.is_empty() => (Admission::Admitted { reservation: id }, ledgers),
            Ok(r) if !r.admitted => {
                let wait = r.retry_after_s.unwrap_or(1);
                let refused = match (r.teams_full, r.refused.first()) {
                    // The same answer as the embedded team table's when it is full.
                    (Some(max), Some(label)) => {
                        let budget = label.split_once('/').map_or(label.as_str(), |(b, _)| b);
                        reply::teams_full(budget, max as usize, wait)
                    }
                    _ => reply::exceeded(&r.refused, wait, r.never),
                };
                (Admission::Refused(refused), r.ledgers)
            }
            _ => (
                Admission::Unavailable {
                    why: "llmkube-budgets answered 200 with an unreadable reserve result".into(),
                },
                Vec::new(),
            ),
        };
    }
    (read_failed_reserve(status, retry_after, body), Vec::new())
}

fn read_failed_reserve(status: u32, retry_after: Option<&str>, body: &[u8]) -> Admission {
    match status {
        0 => Admission::Unavailable {
            why: "no answer from llmkube-budgets (timed out or unreachable)".into(),
        },
        // A service (or a proxy in front of it) that answers with a plain 429: its wait counts.
        429 => Admission::Refused(reply::exceeded(
            &[],
            retry_after.and_then(|v| v.trim().parse().ok()).unwrap_or(1),
            false,
        )),
        // Envoy's own answer when the call outlived its timeout.
        504 => Admission::Unavailable {
            why: "no answer from llmkube-budgets in time (the call timed out)".into(),
        },
        s => Admission::Unavailable {
            why: format!("llmkube-budgets answered {s}{}", error_detail(body)),
        },
    }
}

/// The fail-closed answer for an unavailable store, or `None` when the budgets fail open (the
/// request goes on unbudgeted; the caller audits that).
pub fn unavailable_reply(why: &str, fail_open: bool) -> Option<ApiError> {
    (!fail_open).then(|| reply::store_unavailable(why))
}

/// Why a settle or release failed, and whether sending it again may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndFailed {
    pub why: String,
    /// No answer, or the service or Redis unavailable: the call is worth repeating (a settle
    /// is applied once however often it arrives). A 4xx or an unreadable answer is not.
    pub retry: bool,
}

/// Reads a settle or release answer: the service's answer (holds found, the ledgers after), or
/// why it failed.
pub fn read_end(status: u32, body: &[u8]) -> Result<SettleResponse, EndFailed> {
    let failed = |why: String, retry: bool| Err(EndFailed { why, retry });
    match status {
        0 => failed(
            "no answer from llmkube-budgets (timed out or unreachable)".into(),
            true,
        ),
        200 => match serde_json::from_slice::<SettleResponse>(body) {
            Ok(e) if e.ok => Ok(e),
            _ => failed(
                "llmkube-budgets answered 200 with an unreadable result".into(),
                false,
            ),
        },
        s => failed(
            format!("llmkube-budgets answered {s}{}", error_detail(body)),
            s >= 500,
        ),
    }
}

/// `POST /v1/end` of ends already built by [`end_call`] (each body is one `SettleRequest`):
/// the batch is their bodies in a list, so nothing is encoded twice.
pub fn end_batch_body<'a>(bodies: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut out = b"{\"ends\":[".to_vec();
    for (i, b) in bodies.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b);
    }
    out.extend_from_slice(b"]}");
    out
}

/// Reads a batch's answer for its `n` ends: per end its answer or why it failed (a malformed
/// end is not sent again), or, when the whole call failed, why and whether to send every end
/// again.
#[allow(clippy::type_complexity)]
pub fn read_end_batch(
    status: u32,
    body: &[u8],
    n: usize,
) -> Result<Vec<Result<SettleResponse, EndFailed>>, EndFailed> {
    if status != 200 {
        // Not 200: `read_end` reads it as a failure, the same for one end or many.
        return Err(read_end(status, body).err().unwrap_or(EndFailed {
            why: format!("llmkube-budgets answered {status}"),
            retry: false,
        }));
    }
    match serde_json::from_slice::<EndBatchResponse>(body) {
        Ok(b) if b.results.len() == n => Ok(b
            .results
            .into_iter()
            .map(|r| {
                if r.ok {
                    Ok(r)
                } else {
                    Err(EndFailed {
                        why: format!(
                            "llmkube-budgets refused it: {}",
                            r.error.as_deref().unwrap_or("no reason given")
                        ),
                        retry: false,
                    })
                }
            })
            .collect()),
        _ => Err(EndFailed {
            why: format!("llmkube-budgets answered 200 with an unreadable result for {n} ends"),
            retry: false,
        }),
    }
}

/// `: <message>` of an OpenAI-shaped error body, bounded; empty when there is none.
fn error_detail(body: &[u8]) -> String {
    // Only the one field, not a `serde_json::Value` of the body (whose parser is code the
    // filter module carries for nothing else).
    #[derive(serde::Deserialize)]
    struct Body {
        error: Detail,
    }
    #[derive(serde::Deserialize)]
    struct Detail {
        message: String,
    }
    let message = serde_json::from_slice::<Body>(body)
        .ok()
        .map(|b| b.error.message);
    match message {
        Some(m) => {
            let cut = (0..=m.len().min(200))
                .rev()
                .find(|&i| m.is_char_boundary(i))
                .unwrap_or(0);
            format!(": {}", &m[..cut])
        }
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::compiled::BudgetsConfig;
    use crate::budget::protocol::validate_common;

    fn compiled() -> CompiledBudgets {
        serde_json::from_str::<BudgetsConfig>(
            r#"{"budgets":[
                {"name":"all","scope":"router","max_tokens":1000,"window_s":60},
                {"name":"teams","scope":"team","max_usd":"2.5","window_s":3600}],
              "hold_ttl_s":120}"#,
        )
        .unwrap()
        .compile()
        .unwrap()
    }

    #[test]
    fn a_batch_sets_each_ledger_once_to_its_newest_state() {
        let g = |budget: usize, team: Option<&str>, version: u64, tokens: u64| Gauge {
            key: LedgerKey {
                budget,
                team: team.map(String::from),
            },
            reading: Reading {
                version,
                spent: Amount::new(tokens, 0),
                held_tokens: 0,
            },
        };
        let got = newest_per_ledger([
            g(0, None, 5, 50),
            g(1, Some("a"), 6, 60),
            g(0, None, 9, 90),
            g(1, Some("b"), 1, 10),
            g(0, None, 7, 70),
            g(1, Some("a"), 3, 30),
        ]);
        assert_eq!(
            got,
            vec![
                g(0, None, 9, 90),
                g(1, Some("a"), 6, 60),
                g(1, Some("b"), 1, 10)
            ]
        );
        // Without versions the later answer wins, as setting them one by one did.
        assert_eq!(
            newest_per_ledger([g(0, None, 0, 1), g(0, None, 0, 2)]),
            vec![g(0, None, 0, 2)]
        );
    }

    fn keys() -> Vec<LedgerKey> {
        vec![
            LedgerKey {
                budget: 0,
                team: None,
            },
            LedgerKey {
                budget: 1,
                team: Some("alpha".into()),
            },
        ]
    }

    #[test]
    fn calls_carry_every_ledger_with_its_caps_and_the_service_accepts_them() {
        let c = compiled();
        let body = reserve_body("ns/r", &c, &keys(), Amount::new(7, 3_000_000), "w1-7", 0);
        let r: ReserveRequest = serde_json::from_slice(&body).unwrap();
        assert!(validate_common(&r.router, &r.ledgers).is_ok());
        assert_eq!(r.ttl_s, Some(120));
        assert_eq!(r.reservation.as_deref(), Some("w1-7"));
        assert_eq!(r.amount.parse().unwrap(), Amount::new(7, 3_000_000));
        assert_eq!(r.ledgers[0].max_tokens, Some(1000));
        assert_eq!(r.ledgers[0].team, None);
        assert_eq!(r.ledgers[1].label(), "teams/alpha");
        assert_eq!(r.ledgers[1].max_usd.as_deref(), Some("2.5"));
        assert_eq!(r.ledgers[1].window_s, 3600);

        let (path, body) = end_call("ns/r", &c, &keys(), "id1", Some(Amount::new(3, 0)));
        assert_eq!(path, SETTLE_PATH);
        let s: SettleRequest = serde_json::from_slice(&body).unwrap();
        assert_eq!((s.reservation.as_str(), s.ledgers.len()), ("id1", 2));
        assert_eq!(s.amount.unwrap().tokens, 3);
        assert_eq!(
            s.ttl_s,
            Some(120),
            "the ended id is remembered for the hold's ttl"
        );
        let (path, body) = end_call("ns/r", &c, &keys(), "id1", None);
        assert_eq!(path, RELEASE_PATH);
        let s: SettleRequest = serde_json::from_slice(&body).unwrap();
        assert!(s.amount.is_none());
        // A key naming no budget is dropped, not invented.
        let odd = [LedgerKey {
            budget: 9,
            team: None,
        }];
        assert!(ledger_refs(&c, &odd).is_empty());
        assert_eq!(call_headers(RESERVE_PATH)[1], (":path", "/v1/reserve"));
    }

    #[test]
    fn reserve_answers_admit_refuse_or_make_the_store_unavailable() {
        let read_reserve = |s, r, b| super::read_reserve(s, r, b).0;
        assert_eq!(
            read_reserve(200, None, br#"{"admitted":true,"reservation":"abc"}"#),
            Admission::Admitted {
                reservation: "abc".into()
            }
        );
        let Admission::Refused(r) = read_reserve(
            200,
            None,
            br#"{"admitted":false,"retry_after_s":12,"refused":["teams/alpha"]}"#,
        ) else {
            panic!("not refused")
        };
        assert_eq!((r.error.status, r.retry_after_s), (429, 12));
        assert!(
            r.error.message.contains("teams/alpha"),
            "{}",
            r.error.message
        );
        let Admission::Refused(r) = read_reserve(
            200,
            None,
            br#"{"admitted":false,"retry_after_s":60,"never":true,"refused":["all"]}"#,
        ) else {
            panic!("not refused")
        };
        assert!(r.error.message.contains("lower max_tokens"));
        let Admission::Refused(r) = read_reserve(429, Some(" 7"), b"") else {
            panic!("not refused")
        };
        assert_eq!(r.retry_after_s, 7);

        let down = br#"{"error":{"message":"redis: connection refused","type":"api_error","param":null,"code":"budget_store_unavailable"}}"#;
        let Admission::Unavailable { why } = read_reserve(503, None, down) else {
            panic!("not unavailable")
        };
        assert_eq!(
            why,
            "llmkube-budgets answered 503: redis: connection refused"
        );
        let Admission::Unavailable { why } = read_reserve(504, None, b"upstream request timeout")
        else {
            panic!("not unavailable")
        };
        assert!(why.contains("timed out"), "{why}");
        for (status, body) in [
            (0, &b""[..]),
            (200, b"not json"),
            (200, br#"{"admitted":true}"#),
            (200, br#"{"admitted":true,"reservation":""}"#),
            (400, b""),
            (500, b"{}"),
        ] {
            assert!(
                matches!(
                    read_reserve(status, None, body),
                    Admission::Unavailable { .. }
                ),
                "{status} {body:?}"
            );
        }
    }

    #[test]
    fn unavailable_fails_closed_unless_configured_open() {
        let e = unavailable_reply("no answer", false).unwrap();
        assert_eq!((e.status, e.code), (503, "budget_store_unavailable"));
        assert!(e.message.contains("no answer"));
        assert_eq!(unavailable_reply("no answer", true), None);
    }

    #[test]
    fn answers_carry_the_ledgers_for_the_gauges() {
        let c = compiled();
        let body = br#"{"admitted":true,"reservation":"r","ledgers":[
            {"budget":"all","tokens_used":40,"usd_used":"0","tokens_reserved":7,"version":12},
            {"budget":"teams","team":"alpha","tokens_used":3,"usd_used":"0.25","tokens_reserved":0},
            {"budget":"gone","tokens_used":1,"usd_used":"0","tokens_reserved":0},
            {"budget":"all","tokens_used":1,"usd_used":"bad","tokens_reserved":0}]}"#;
        let (a, states) = read_reserve(200, None, body);
        assert!(matches!(a, Admission::Admitted { .. }));
        let g = gauges(&c, &states);
        assert_eq!(
            g.len(),
            2,
            "unknown budgets and bad amounts are skipped: {g:?}"
        );
        let r = g[0].reading;
        assert_eq!(
            (g[0].key.budget, r.spent.tokens, r.held_tokens, r.version),
            (0, 40, 7, 12)
        );
        assert_eq!(g[1].key, keys()[1]);
        assert_eq!(g[1].reading.spent.pico, 250_000_000_000);
        assert_eq!(g[1].reading.version, 0, "a missing version is the oldest");
        let refused = br#"{"admitted":false,"retry_after_s":3,"refused":["all"],"ledgers":[
            {"budget":"all","tokens_used":1000,"usd_used":"0","tokens_reserved":0}]}"#;
        let (a, states) = read_reserve(200, None, refused);
        assert!(matches!(a, Admission::Refused(_)));
        assert_eq!(gauges(&c, &states)[0].reading.spent.tokens, 1000);
        let settled = read_end(
            200,
            br#"{"ok":true,"holds_found":1,"ledgers":[{"budget":"all","tokens_used":9,"usd_used":"0","tokens_reserved":0}]}"#,
        )
        .unwrap();
        assert_eq!(gauges(&c, &settled.ledgers)[0].reading.spent.tokens, 9);
        assert!(read_reserve(503, None, b"").1.is_empty());
    }

    #[test]
    fn settle_answers_are_read_for_the_log_and_the_retry() {
        assert_eq!(
            read_end(200, br#"{"ok":true,"holds_found":2}"#).map(|e| e.holds_found),
            Ok(2)
        );
        let e = read_end(0, b"").unwrap_err();
        assert!(e.why.contains("no answer") && e.retry);
        assert!(read_end(503, b"").unwrap_err().retry);
        assert!(!read_end(400, b"").unwrap_err().retry);
        assert!(!read_end(200, b"[]").unwrap_err().retry);
        let long = format!(
            r#"{{"error":{{"message":"{}","code":"x"}}}}"#,
            "é".repeat(300)
        );
        let e = read_end(400, long.as_bytes()).unwrap_err().why;
        assert!(e.starts_with("llmkube-budgets answered 400: é"));
        assert!(e.len() < 260, "{}", e.len());
    }

    #[test]
    fn a_batch_is_the_ends_bodies_and_its_answer_is_read_per_end() {
        let c = compiled();
        let (_, a) = end_call("ns/r", &c, &keys(), "id1", Some(Amount::new(3, 0)));
        let (_, b) = end_call("ns/r", &c, &keys(), "id2", None);
        let body = end_batch_body([a.as_slice(), b.as_slice()]);
        let batch: crate::budget::protocol::EndBatch = serde_json::from_slice(&body).unwrap();
        assert_eq!(batch.ends.len(), 2);
        assert_eq!(batch.ends[0].amount.as_ref().map(|a| a.tokens), Some(3));
        assert!(batch.ends[1].amount.is_none(), "no amount: a release");
        let answer =
            br#"{"results":[{"ok":true,"holds_found":2},{"ok":false,"error":"reservation: bad"}]}"#;
        let r = read_end_batch(200, answer, 2).unwrap();
        assert_eq!(r[0].as_ref().map(|a| a.holds_found), Ok(2));
        let e = r[1].as_ref().unwrap_err();
        assert!(e.why.contains("reservation: bad") && !e.retry, "{e:?}");
        // The whole call failing: every end is sent again (5xx, no answer) or not (4xx).
        assert!(read_end_batch(503, b"", 2).unwrap_err().retry);
        assert!(read_end_batch(0, b"", 2).unwrap_err().retry);
        assert!(!read_end_batch(400, b"", 2).unwrap_err().retry);
        // An answer for a different number of ends is not guessed at.
        assert!(read_end_batch(200, answer, 3).is_err());
    }

    #[test]
    fn a_new_team_refused_by_a_full_budget_gets_the_embedded_tables_answer() {
        let body = reserve_body("ns/r", &compiled(), &keys(), Amount::new(1, 0), "w1-1", 0);
        let r: ReserveRequest = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            r.max_teams,
            Some(1024),
            "the gateway's max_teams bounds the service's"
        );
        let Admission::Refused(r) = read_reserve(
            200,
            None,
            br#"{"admitted":false,"retry_after_s":30,"refused":["teams/new"],"teams_full":1024}"#,
        )
        .0
        else {
            panic!("not refused")
        };
        assert_eq!(r, reply::teams_full("teams", 1024, 30));
    }
}
