//! The HTTP/1.1 JSON service: reserve, settle, release, status (README.md has the wire format).

use crate::store::lease::LeaseCall;
use crate::store::{Clock, LedgerUse, RedisStore, Reserve, StoreError};
use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use router_core::budget::admit::DEFAULT_HOLD_TTL_S;
use router_core::budget::protocol::{
    validate_common, validate_reservation, AmountJson, EndBatch, EndBatchResponse, LeaseRequest,
    LeaseResponse, LedgerRef, LedgerState, ReserveRequest, ReserveResponse, SettleRequest,
    SettleResponse, MAX_ENDS, MAX_RESERVE_WAIT_MS, MAX_TTL_S,
};
use router_core::errors::ApiError;
use std::sync::Arc;

/// Request bodies over this are refused (32 ledgers of long names fit easily, and a batch of
/// `MAX_ENDS` ends as a gateway sends them).
pub const MAX_BODY: usize = 256 * 1024;

/// How often a reserve waiting for leases to give their room back is tried again: a few times
/// per lease report period (100 ms by default).
const RECLAIM_POLL: std::time::Duration = std::time::Duration::from_millis(20);

pub struct Service {
    pub store: RedisStore,
}

type Reply = Response<Full<Bytes>>;

fn json(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: u16, kind: &'static str, code: &'static str, message: String) -> Reply {
    let e = ApiError {
        status: status as u32,
        kind,
        code,
        param: None,
        message,
    };
    json(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        e.body(),
    )
}

fn bad_request(message: String) -> Reply {
    error(400, "invalid_request_error", "invalid_request", message)
}

fn store_error(e: StoreError) -> Reply {
    match e {
        StoreError::Unavailable(why) => error(
            503,
            "api_error",
            "budget_store_unavailable",
            format!("the budget store (Redis) cannot be reached: {why}"),
        ),
        StoreError::Internal(why) => error(
            500,
            "api_error",
            "internal_error",
            format!("the budget service failed: {why}"),
        ),
    }
}

fn ok<T: serde::Serialize>(v: &T) -> Reply {
    match serde_json::to_vec(v) {
        Ok(b) => json(StatusCode::OK, b),
        Err(e) => store_error(StoreError::Internal(e.to_string())),
    }
}

fn reservation_id() -> Result<String, StoreError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| StoreError::Internal(format!("no randomness: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn ttl_ms(ttl_s: Option<u64>) -> Result<u64, String> {
    match ttl_s.unwrap_or(DEFAULT_HOLD_TTL_S) {
        0 => Err("ttl_s: must be at least 1".into()),
        t if t > MAX_TTL_S => Err(format!("ttl_s: at most {MAX_TTL_S}")),
        t => Ok(t * 1000),
    }
}

impl Service {
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Reply, hyper::Error> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let method = req.method().clone();
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                return Ok(bad_request(format!(
                    "body over {MAX_BODY} bytes or unreadable"
                )))
            }
        };
        let reply = match (method, path.as_str()) {
            (Method::POST, "/v1/reserve") => match serde_json::from_slice(&body) {
                Ok(r) => self.reserve(None, r).await,
                Err(e) => bad_request(format!("reserve: {e}")),
            },
            (Method::POST, "/v1/settle") => match serde_json::from_slice(&body) {
                Ok(r) => self.settle(None, r, true).await,
                Err(e) => bad_request(format!("settle: {e}")),
            },
            (Method::POST, "/v1/release") => match serde_json::from_slice(&body) {
                Ok(r) => self.settle(None, r, false).await,
                Err(e) => bad_request(format!("release: {e}")),
            },
            (Method::POST, "/v1/end") => match serde_json::from_slice(&body) {
                Ok(b) => self.end_batch(None, b).await,
                Err(e) => bad_request(format!("end: {e}")),
            },
            (Method::POST, "/v1/lease") => match serde_json::from_slice(&body) {
                Ok(r) => self.lease(None, r).await,
                Err(e) => bad_request(format!("lease: {e}")),
            },
            (Method::GET, "/v1/status") => match router_param(&query) {
                Some(router) => match self.store.status(None, &router).await {
                    Ok(u) => ok(&serde_json::json!({ "budgetUtilization": u })),
                    Err(e) => store_error(e),
                },
                None => bad_request("status: the query must name ?router=<namespace/name>".into()),
            },
            (Method::GET, "/healthz") => match self.store.ping().await {
                Ok(()) => json(StatusCode::OK, b"{\"ok\":true}".to_vec()),
                Err(e) => store_error(e),
            },
            _ => error(
                404,
                "invalid_request_error",
                "not_found",
                format!("no such endpoint: {path} (see the llmkube-budgets README)"),
            ),
        };
        Ok(reply)
    }

    /// All or nothing across the ledgers: each is reserved atomically (all in one round trip);
    /// if any refuses, the holds taken on the others are released, and the answer names every
    /// ledger in the way and the longest wait.
    pub async fn reserve(&self, clock: Clock, r: ReserveRequest) -> Reply {
        if let Err(e) = validate_common(&r.router, &r.ledgers) {
            return bad_request(e);
        }
        let (amount, ttl) = match (r.amount.parse(), ttl_ms(r.ttl_s)) {
            (Ok(a), Ok(t)) => (a, t),
            (Err(e), _) | (_, Err(e)) => return bad_request(e),
        };
        let id = match &r.reservation {
            Some(id) => match validate_reservation(id) {
                Ok(()) => id.clone(),
                Err(e) => return bad_request(e),
            },
            None => match reservation_id() {
                Ok(id) => id,
                Err(e) => return store_error(e),
            },
        };
        // Every ledger in one script call (a single Redis: atomic, all or nothing), or one per
        // ledger at once with the holds undone on a refusal (a cluster: `RedisStore::reserve_all`).
        if r.max_teams == Some(0) {
            return bad_request("max_teams: must be at least 1".into());
        }
        let outcomes = match self.reserve_waiting(clock, &r, &id, amount, ttl).await {
            Ok(o) => o,
            Err(e) => return store_error(e),
        };
        let mut refused = Vec::new();
        // Per refusing ledger: seconds to wait, or None when the request can never fit it.
        let mut waits: Vec<Option<u64>> = Vec::new();
        let mut states = Vec::with_capacity(r.ledgers.len());
        let mut teams_full = None;
        for (l, (what, now)) in r.ledgers.iter().zip(outcomes) {
            match what {
                Reserve::Refused(w) => {
                    refused.push(l.label());
                    waits.push(w);
                }
                Reserve::Reclaiming => {
                    // Only holds were in the way: they end with their requests and leases.
                    refused.push(l.label());
                    waits.push(Some(1));
                }
                Reserve::TeamsFull(w) => {
                    refused.push(l.label());
                    waits.push(Some(w));
                    teams_full = r.max_teams;
                    // A team refused its place has no ledger to show (no gauges for it).
                    continue;
                }
                _ => {}
            }
            if teams_full.is_none() {
                states.push(state(l, now));
            }
        }
        if teams_full.is_some() {
            // Nothing was asked of the ledgers: their states are not known.
            states.clear();
        }
        if !refused.is_empty() {
            let never = waits.iter().any(Option::is_none);
            let longest_window = r.ledgers.iter().map(|l| l.window_s).max().unwrap_or(1);
            let retry = if never {
                longest_window
            } else {
                waits.iter().flatten().copied().max().unwrap_or(1)
            };
            return ok(&ReserveResponse {
                admitted: false,
                reservation: None,
                retry_after_s: Some(retry.max(1)),
                never,
                refused,
                teams_full,
                ledgers: states,
            });
        }
        ok(&ReserveResponse {
            admitted: true,
            reservation: Some(id),
            retry_after_s: None,
            never: false,
            refused: Vec::new(),
            teams_full: None,
            ledgers: states,
        })
    }

    /// The reserve, tried again while leases are giving their room back (`Reserve::Reclaiming`:
    /// only holds refused it, what is spent leaves room) for up to the request's `wait_ms`:
    /// the leases' next reports hold only their requests in flight, so a request that fits
    /// what is spent is admitted within a report period or two instead of refused. Only on
    /// the service's clock (a test clock does not move while it waits).
    async fn reserve_waiting(
        &self,
        clock: Clock,
        r: &ReserveRequest,
        id: &str,
        amount: router_core::budget::window::Amount,
        ttl: u64,
    ) -> Result<Vec<(Reserve, LedgerUse)>, StoreError> {
        let wait = r.wait_ms.unwrap_or(0).min(MAX_RESERVE_WAIT_MS);
        let until = std::time::Instant::now() + std::time::Duration::from_millis(wait);
        loop {
            let outcomes = self
                .store
                .reserve_all(clock, &r.router, &r.ledgers, id, amount, ttl, r.max_teams)
                .await?;
            let reclaiming = outcomes.iter().any(|(w, _)| *w == Reserve::Reclaiming);
            let refused_otherwise = outcomes
                .iter()
                .any(|(w, _)| w.refused() && *w != Reserve::Reclaiming);
            let next = std::time::Instant::now() + RECLAIM_POLL;
            if !reclaiming || refused_otherwise || clock.is_some() || next > until {
                return Ok(outcomes);
            }
            tokio::time::sleep(RECLAIM_POLL).await;
        }
    }

    /// Settle (charge the real usage) or release (charge nothing) on every ledger.
    pub async fn settle(&self, clock: Clock, r: SettleRequest, charge: bool) -> Reply {
        match self.end_one(clock, &r, charge).await {
            Ok(answer) => ok(&answer),
            Err(EndError::Bad(e)) => bad_request(e),
            Err(EndError::Store(e)) => store_error(e),
        }
    }

    /// `POST /v1/end`: several settles (those with an amount) and releases in one call, each
    /// applied as its own `/v1/settle` or `/v1/release` would be, all at once (their scripts go
    /// to Redis together). One that is malformed answers `ok: false` with its error; when
    /// Redis fails the whole call does (503 or 500), and the gateway sends it again (each end
    /// applies once however often it arrives).
    pub async fn end_batch(&self, clock: Clock, b: EndBatch) -> Reply {
        if b.ends.len() > MAX_ENDS {
            return bad_request(format!("ends: at most {MAX_ENDS}"));
        }
        let results = join_all(
            b.ends
                .iter()
                .map(|r| self.end_one(clock, r, r.amount.is_some())),
        )
        .await;
        let mut answers = Vec::with_capacity(results.len());
        for r in results {
            answers.push(match r {
                Ok(a) => a,
                Err(EndError::Store(e)) => return store_error(e),
                Err(EndError::Bad(why)) => SettleResponse {
                    ok: false,
                    holds_found: 0,
                    ledgers: Vec::new(),
                    error: Some(why),
                },
            });
        }
        ok(&EndBatchResponse { results: answers })
    }

    async fn end_one(
        &self,
        clock: Clock,
        r: &SettleRequest,
        charge: bool,
    ) -> Result<SettleResponse, EndError> {
        validate_common(&r.router, &r.ledgers).map_err(EndError::Bad)?;
        validate_reservation(&r.reservation).map_err(EndError::Bad)?;
        let ttl = ttl_ms(r.ttl_s).map_err(EndError::Bad)?;
        let actual = match (charge, &r.amount) {
            (true, Some(a)) => Some(a.parse().map_err(EndError::Bad)?),
            (true, None) => return Err(EndError::Bad("settle: amount is required".into())),
            (false, _) => None,
        };
        let results = self
            .store
            .settle_all(clock, &r.router, &r.ledgers, &r.reservation, actual, ttl)
            .await
            .map_err(EndError::Store)?;
        let mut found = 0;
        let mut states = Vec::with_capacity(r.ledgers.len());
        for (l, (f, now)) in r.ledgers.iter().zip(results) {
            found += u64::from(f);
            states.push(state(l, now));
        }
        Ok(SettleResponse {
            ok: true,
            holds_found: found,
            ledgers: states,
            error: None,
        })
    }
}

impl Service {
    /// `POST /v1/lease` (lease mode): the old lease's use charged, its hold replaced by the
    /// next lease's, in one script call on the one ledger.
    pub async fn lease(&self, clock: Clock, r: LeaseRequest) -> Reply {
        if let Err(e) = validate_common(&r.router, std::slice::from_ref(&r.ledger)) {
            return bad_request(e);
        }
        for id in r.old.iter().chain(std::iter::once(&r.id)) {
            if let Err(e) = validate_reservation(id) {
                return bad_request(e);
            }
        }
        if r.max_teams == Some(0) {
            return bad_request("max_teams: must be at least 1".into());
        }
        let amounts = (
            r.used.parse(),
            r.admitted.parse(),
            r.max.parse(),
            ttl_ms(r.ttl_s),
        );
        let (used, admitted, max, ttl) = match amounts {
            (Ok(u), Ok(a), Ok(m), Ok(t)) => (u, a, m, t),
            (Err(e), ..) | (_, Err(e), ..) | (_, _, Err(e), _) | (.., Err(e)) => {
                return bad_request(e)
            }
        };
        let call = LeaseCall {
            old: r.old.as_deref(),
            id: &r.id,
            used,
            admitted,
            max,
            ttl_ms: ttl,
            max_teams: r.max_teams,
            unheld: r.unsafe_unheld,
        };
        match self.store.lease(clock, &r.router, &r.ledger, call).await {
            Ok(l) => ok(&LeaseResponse {
                granted: AmountJson::from_amount(l.granted),
                applied: l.applied,
                teams_full: l.teams_full,
                ledger: state(&r.ledger, l.ledger),
            }),
            Err(e) => store_error(e),
        }
    }
}

/// Why one settle or release was not applied.
enum EndError {
    /// The request is malformed (400; in a batch, that end's `error`).
    Bad(String),
    Store(StoreError),
}

fn state(l: &LedgerRef, now: LedgerUse) -> LedgerState {
    LedgerState::of(l, now.spent, now.held, now.version)
}

/// `router=<value>` from a query string, percent-decoded.
fn router_param(query: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "router").then(|| percent_decode(v))?
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}
