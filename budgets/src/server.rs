//! The HTTP/1.1 JSON service: reserve, settle, release, status (README.md has the wire format).

use crate::store::{Clock, LedgerUse, RedisStore, Reserve, StoreError};
use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use router_core::budget::admit::DEFAULT_HOLD_TTL_S;
use router_core::budget::wire::{
    validate_common, validate_reservation, LedgerRef, LedgerState, ReserveRequest, ReserveResponse,
    SettleRequest, SettleResponse, MAX_TTL_S,
};
use router_core::errors::ApiError;
use std::sync::Arc;

/// Request bodies over this are refused (32 ledgers of long names fit easily).
pub const MAX_BODY: usize = 64 * 1024;

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
        // Every ledger at once (one round trip: the connection pipelines them); each is atomic
        // on its own. If any refuses, the holds taken on the others are released.
        let outcomes = join_all(
            r.ledgers
                .iter()
                .map(|l| self.store.reserve(clock, &r.router, l, &id, amount, ttl)),
        )
        .await;
        let mut taken: Vec<&LedgerRef> = Vec::new();
        let mut refused = Vec::new();
        // Per refusing ledger: seconds to wait, or None when the request can never fit it.
        let mut waits: Vec<Option<u64>> = Vec::new();
        let mut failure = None;
        let mut states = Vec::with_capacity(r.ledgers.len());
        for (l, outcome) in r.ledgers.iter().zip(outcomes) {
            match outcome {
                Ok((what, now)) => {
                    states.push(state(l, now));
                    match what {
                        Reserve::Held => taken.push(l),
                        // Released before this reserve arrived: nothing to hold or undo.
                        Reserve::Ended => {}
                        Reserve::Refused(w) => {
                            refused.push(l.label());
                            waits.push(w);
                        }
                    }
                }
                Err(e) => failure = Some(e),
            }
        }
        if failure.is_some() || !refused.is_empty() {
            for (l, now) in self.undo(clock, &r.router, &taken, &id, ttl).await {
                if let Some(s) = states
                    .iter_mut()
                    .find(|s| s.budget == l.budget && s.team == l.team)
                {
                    *s = state(l, now);
                }
            }
        }
        if let Some(e) = failure {
            return store_error(e);
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
                ledgers: states,
            });
        }
        ok(&ReserveResponse {
            admitted: true,
            reservation: Some(id),
            retry_after_s: None,
            never: false,
            refused: Vec::new(),
            ledgers: states,
        })
    }

    /// Releases the holds taken before a refusal; the ledgers released, as they are after.
    async fn undo<'l>(
        &self,
        clock: Clock,
        router: &str,
        taken: &[&'l LedgerRef],
        id: &str,
        ttl: u64,
    ) -> Vec<(&'l LedgerRef, LedgerUse)> {
        // A failed release leaves a hold that expires with its ttl: never a leak.
        let results = join_all(
            taken
                .iter()
                .map(|l| self.store.settle(clock, router, l, id, None, ttl)),
        )
        .await;
        taken
            .iter()
            .zip(results)
            .filter_map(|(l, r)| r.ok().map(|(_, now)| (*l, now)))
            .collect()
    }

    /// Settle (charge the real usage) or release (charge nothing) on every ledger.
    pub async fn settle(&self, clock: Clock, r: SettleRequest, charge: bool) -> Reply {
        if let Err(e) = validate_common(&r.router, &r.ledgers) {
            return bad_request(e);
        }
        if let Err(e) = validate_reservation(&r.reservation) {
            return bad_request(e);
        }
        let ttl = match ttl_ms(r.ttl_s) {
            Ok(t) => t,
            Err(e) => return bad_request(e),
        };
        let actual = match (charge, &r.amount) {
            (true, Some(a)) => match a.parse() {
                Ok(a) => Some(a),
                Err(e) => return bad_request(e),
            },
            (true, None) => return bad_request("settle: amount is required".into()),
            (false, _) => None,
        };
        let results = join_all(r.ledgers.iter().map(|l| {
            self.store
                .settle(clock, &r.router, l, &r.reservation, actual, ttl)
        }))
        .await;
        let mut found = 0;
        let mut states = Vec::with_capacity(r.ledgers.len());
        for (l, result) in r.ledgers.iter().zip(results) {
            match result {
                Ok((f, now)) => {
                    found += u64::from(f);
                    states.push(state(l, now));
                }
                Err(e) => return store_error(e),
            }
        }
        ok(&SettleResponse {
            ok: true,
            holds_found: found,
            ledgers: states,
        })
    }
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
