//! Ledgers kept by the shared budget service `llmkube-budgets` (`--budgets-service`): one
//! ledger set for every gateway replica, surviving restarts. The request reserves by an HTTP
//! callout and stays paused until the answer. A served request settles by a callout of its own
//! on its last response chunk, which it holds until the answer, so its hold is gone before the
//! client has the last byte ([`Remote::end_now`]). Everything else (a release, a settle decided
//! in `on_log`, an end that got no answer in time) is queued for the worker's root context,
//! which sends it on its next tick.
//!
//! Why the root for those: Envoy cancels a context's callouts when the context is destroyed,
//! and a request's context is destroyed right after `on_log`. The root lives as long as the
//! VM, so its calls complete and their failures are logged. A settle or release that gets no answer, or the service's 5xx, is sent again on
//! later ticks (backing off, until the hold's TTL has passed): the service applies a settle
//! once however often it arrives, so a settle outlives a restart of the service. One that
//! never arrives (the queue full, Envoy stopping) is bounded: the service drops the hold at
//! its TTL.
//!
//! Reservation ids are this worker's (a random prefix and a counter), so a request whose
//! reserve answer never came (the client left, the call timed out) still releases its id; the
//! service remembers ended ids, so a reserve arriving after its release holds nothing.
//!
//! What the root holds is the gauge `llmkube.budget_service.ends_pending` (Envoy:
//! `wasmcustom.llmkube.budget_service.ends_pending`, summed over workers): settles and releases
//! queued or sent and not yet answered, retries included. At 0 nothing more reaches the
//! service from this gateway but new requests' ends. The counter
//! `llmkube.budget_service.end_calls` counts the calls the roots sent them in.
//!
//! `router_core::budget::remote` builds the calls and reads the answers; this moves them.

use filter_edge::{self as edge, HttpCall, Level, MetricKind};
use router_core::budget::admit::LedgerKey;
use router_core::budget::compiled::{CompiledBudgets, ServiceConfig};
use router_core::budget::protocol::MAX_ENDS;
use router_core::budget::protocol::{LedgerState, SettleResponse};
use router_core::budget::remote::{
    self, Admission, END_PATH, MAX_BATCH_BYTES, MAX_REPLY_BYTES, RESERVE_PATH,
};
use router_core::budget::window::Amount;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::Duration;

/// Settles and releases waiting to be sent (or answered), per worker. Past this the oldest is
/// dropped (logged): its hold expires at its TTL, so dropping costs room, never money.
const MAX_QUEUED_ENDS: usize = 4096;
/// Longest wait between two sends of a settle the service did not answer.
const MAX_BACKOFF_MS: u64 = 2000;

/// A request's reservation on the service, from the reserve call to its settle or release.
pub(crate) struct RemoteHold {
    pub keys: Vec<LedgerKey>,
    /// The reserve call's token while its answer is out.
    pub pending: Option<u32>,
    /// This worker's id of the reservation, chosen before the reserve is sent.
    pub reservation: String,
}

/// A settle or release on its way to the service.
struct End {
    path: &'static str,
    body: Vec<u8>,
    /// Sends so far, and when the next may go (ms).
    sends: u32,
    next_ms: u64,
    /// Past this (the hold's TTL after the request ended) it is not sent again.
    give_up_ms: u64,
    /// The root holds it: counted in `ends_pending` until it is answered or given up.
    counted: bool,
}

/// An end a request sent itself and waits for ([`Remote::end_now`]).
pub(crate) struct PendingEnd(End);

/// The status and body of the callout answer being delivered (status 0: none, the call failed
/// or timed out); `ends` results at most (a batch's answer is one result per end).
fn read_call_answer(num_headers: usize, body_size: usize, ends: usize) -> (u32, Vec<u8>) {
    if num_headers == 0 {
        // Envoy delivers a failed or timed-out call with no headers at all.
        return (0, Vec::new());
    }
    let headers = edge::call_response_headers().unwrap_or_default();
    let most = MAX_REPLY_BYTES.saturating_mul(ends.max(1));
    let body = edge::call_response_body(body_size.min(most)).unwrap_or_default();
    (edge::response_status(&headers), body)
}

/// The shared ledger as one worker reaches it.
pub(crate) struct Remote {
    cluster: String,
    timeout: Duration,
    pub fail_open: bool,
    /// Lease mode: how long the service may hold a reserve that only holds refuse while leases
    /// give their room back (0: refused at once); the reserve call's timeout grows by it.
    wait_ms: u64,
    router: String,
    hold_ttl_ms: u64,
    /// Random per worker VM: ids of two workers or two Envoys do not meet.
    id_prefix: String,
    next_id: Cell<u64>,
    ends: RefCell<VecDeque<End>>,
    /// Ends sent and not answered yet, by call token: one end, or a batch (`/v1/end`).
    sent: RefCell<Vec<(u32, Vec<End>)>>,
    /// `llmkube.budget_service.ends_pending` (gauge) and `.end_calls` (counter).
    pending: Option<u32>,
    calls: Option<u32>,
}

fn now_ms() -> u64 {
    edge::now_nanos() / 1_000_000
}

impl Remote {
    pub fn new(router: &str, service: &ServiceConfig, hold_ttl_s: u64, wait_ms: u64) -> Remote {
        let mut seed = [0u8; 8];
        if getrandom::fill(&mut seed).is_err() {
            // Without entropy the clock tells workers apart (they start at different nanos).
            seed = edge::now_nanos().to_le_bytes();
        }
        Remote {
            cluster: service.cluster.clone(),
            timeout: Duration::from_millis(service.timeout_ms.max(1)),
            fail_open: service.fail_open,
            wait_ms,
            router: router.to_string(),
            hold_ttl_ms: hold_ttl_s.saturating_mul(1000),
            id_prefix: seed.iter().map(|b| format!("{b:02x}")).collect(),
            next_id: Cell::new(0),
            ends: RefCell::new(VecDeque::new()),
            sent: RefCell::new(Vec::new()),
            pending: edge::define_metric(MetricKind::Gauge, "llmkube.budget_service.ends_pending")
                .ok(),
            calls: edge::define_metric(MetricKind::Counter, "llmkube.budget_service.end_calls")
                .ok(),
        }
    }

    /// An end the root held was answered, or given up: `ends_pending` goes down by one.
    fn let_go(&self, end: &End) {
        if let (true, Some(id)) = (end.counted, self.pending) {
            edge::increment_metric(id, -1);
        }
    }

    /// The router's name, as the service keys its ledgers.
    pub fn router(&self) -> &str {
        &self.router
    }

    /// A reservation id unique to this request: the worker's prefix and a counter.
    pub fn new_id(&self) -> String {
        let n = self.next_id.get().wrapping_add(1);
        self.next_id.set(n);
        format!("{}-{n:x}", self.id_prefix)
    }

    /// Sends the reservation `id` of `amount` on `keys`; the answer arrives in the request's
    /// `on_http_call_response` with the returned token. `Err`: nothing was sent (the store is
    /// unavailable: e.g. the cluster is missing).
    pub fn reserve(
        &self,
        c: &CompiledBudgets,
        keys: &[LedgerKey],
        amount: Amount,
        id: &str,
    ) -> Result<u32, String> {
        let body = remote::reserve_body(&self.router, c, keys, amount, id, self.wait_ms);
        let timeout = self.timeout + Duration::from_millis(self.wait_ms);
        self.send_within(RESERVE_PATH, &body, timeout)
    }

    /// Reads the reserve answer being delivered (only inside `on_http_call_response`), with the
    /// ledgers as the service left them.
    pub fn answer(&self, num_headers: usize, body_size: usize) -> (Admission, Vec<LedgerState>) {
        if num_headers == 0 {
            // Envoy delivers a failed or timed-out call with no headers at all.
            return remote::read_reserve(0, None, b"");
        }
        let headers = edge::call_response_headers().unwrap_or_default();
        let status = edge::response_status(&headers);
        let retry_after = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(b"retry-after"))
            .and_then(|(_, v)| std::str::from_utf8(v).ok());
        let body = edge::call_response_body(body_size.min(MAX_REPLY_BYTES)).unwrap_or_default();
        remote::read_reserve(status, retry_after, &body)
    }

    /// Queues the settle (`charge`: the real usage or its estimate) or release (`None`) of
    /// `reservation`; the root sends it on its next tick.
    pub fn end(
        &self,
        c: &CompiledBudgets,
        keys: &[LedgerKey],
        reservation: &str,
        charge: Option<Amount>,
    ) {
        let end = self.end_of(c, keys, reservation, charge);
        self.queue(end);
    }

    fn end_of(
        &self,
        c: &CompiledBudgets,
        keys: &[LedgerKey],
        reservation: &str,
        charge: Option<Amount>,
    ) -> End {
        let (path, body) = remote::end_call(&self.router, c, keys, reservation, charge);
        let now = now_ms();
        End {
            path,
            body,
            sends: 0,
            next_ms: now,
            give_up_ms: now.saturating_add(self.hold_ttl_ms),
            counted: false,
        }
    }

    /// Sends the settle or release of `reservation` at once, from the request's own context,
    /// which holds its last response bytes until the answer ([`Remote::end_answered`]): the
    /// hold is gone from the ledger before the client has the whole response, so the client's
    /// next request never meets it. `None`: it could not be sent, and is queued for the root.
    pub fn end_now(
        &self,
        c: &CompiledBudgets,
        keys: &[LedgerKey],
        reservation: &str,
        charge: Option<Amount>,
    ) -> Option<(u32, PendingEnd)> {
        let mut end = self.end_of(c, keys, reservation, charge);
        end.sends = 1;
        match self.send(end.path, &end.body) {
            Ok(token) => Some((token, PendingEnd(end))),
            Err(why) => {
                self.failed(end, &why, true, now_ms());
                None
            }
        }
    }

    /// The answer to an end a request sent itself ([`Remote::end_now`]): the ledgers as it left
    /// them, or `None` when it failed or timed out, and then it is queued for the root's
    /// retries (the service applies a settle once, however often it arrives).
    pub fn end_answered(
        &self,
        end: PendingEnd,
        num_headers: usize,
        body_size: usize,
    ) -> Option<SettleResponse> {
        let (status, body) = read_call_answer(num_headers, body_size, 1);
        match remote::read_end(status, &body) {
            Ok(answer) => Some(answer),
            Err(f) => {
                self.failed(end.0, &f.why, f.retry, now_ms());
                None
            }
        }
    }

    /// The request ends while its own end's answer is still out (the client left): Envoy
    /// cancels the request's callouts, so the root sends it again.
    pub fn requeue(&self, end: PendingEnd) {
        let mut end = end.0;
        end.next_ms = now_ms();
        self.queue(end);
    }

    fn queue(&self, mut end: End) {
        if !end.counted {
            end.counted = true;
            if let Some(id) = self.pending {
                edge::increment_metric(id, 1);
            }
        }
        let mut ends = self.ends.borrow_mut();
        if ends.len() + self.sent.borrow().len() >= MAX_QUEUED_ENDS {
            if let Some(dropped) = ends.pop_front() {
                self.let_go(&dropped);
            }
            edge::log(
                Level::Warn,
                "model-router: budgets: too many settles queued for llmkube-budgets; the oldest is dropped and its hold expires at its TTL",
            );
        }
        ends.push_back(end);
    }

    /// Sends the queued settles and releases that are due (from the root context, on tick):
    /// one alone as its own call, several together in `/v1/end` batches (one callout, one
    /// service request and one Redis round trip for a tick's worth of requests).
    pub fn flush(&self) {
        let now = now_ms();
        let due: Vec<End> = {
            let mut ends = self.ends.borrow_mut();
            let (due, later): (VecDeque<End>, VecDeque<End>) =
                ends.drain(..).partition(|e| e.next_ms <= now);
            *ends = later;
            due.into()
        };
        let mut batch: Vec<End> = Vec::new();
        let mut bytes = 0;
        for mut end in due {
            end.sends = end.sends.saturating_add(1);
            if !batch.is_empty()
                && (batch.len() >= MAX_ENDS || bytes + end.body.len() > MAX_BATCH_BYTES)
            {
                self.send_ends(std::mem::take(&mut batch), now);
                bytes = 0;
            }
            bytes += end.body.len();
            batch.push(end);
        }
        if !batch.is_empty() {
            self.send_ends(batch, now);
        }
    }

    fn send_ends(&self, ends: Vec<End>, now: u64) {
        let sent = if let [one] = ends.as_slice() {
            self.send(one.path, &one.body)
        } else {
            self.send(
                END_PATH,
                &remote::end_batch_body(ends.iter().map(|e| e.body.as_slice())),
            )
        };
        match sent {
            Ok(token) => {
                if let Some(id) = self.calls {
                    edge::increment_metric(id, 1);
                }
                self.sent.borrow_mut().push((token, ends));
            }
            Err(e) => {
                for end in ends {
                    self.failed(end, &e, true, now);
                }
            }
        }
    }

    /// A settle or release did not get through: sent again later while its hold could still
    /// be there, else logged and left to the TTL.
    fn failed(&self, mut end: End, why: &str, retry: bool, now: u64) {
        if retry && now < end.give_up_ms {
            let backoff = (100u64 << end.sends.min(5)).min(MAX_BACKOFF_MS);
            end.next_ms = now.saturating_add(backoff);
            if end.sends == 1 {
                edge::log(
                    Level::Warn,
                    &format!(
                        "model-router: budgets: {} failed ({why}); sending it again",
                        end.path
                    ),
                );
            }
            self.queue(end);
            return;
        }
        self.let_go(&end);
        edge::log(
            Level::Error,
            &format!(
                "model-router: budgets: {} failed ({why}) after {} sends; the hold expires at its TTL",
                end.path, end.sends
            ),
        );
    }

    /// Settles or releases answered (root `on_http_call_response`): the service's answers, empty
    /// when the token is not one of these calls or they failed (then they are sent again, or
    /// logged).
    pub fn ended(&self, token: u32, num_headers: usize, body_size: usize) -> Vec<SettleResponse> {
        let ends = {
            let mut sent = self.sent.borrow_mut();
            let Some(i) = sent.iter().position(|(t, _)| *t == token) else {
                return Vec::new();
            };
            sent.swap_remove(i).1
        };
        let (status, body) = read_call_answer(num_headers, body_size, ends.len());
        let now = now_ms();
        let results = if ends.len() == 1 {
            remote::read_end(status, &body).map(|a| vec![Ok(a)])
        } else {
            remote::read_end_batch(status, &body, ends.len())
        };
        match results {
            Ok(results) => ends
                .into_iter()
                .zip(results)
                .filter_map(|(end, r)| match r {
                    Ok(answer) => {
                        self.let_go(&end);
                        Some(answer)
                    }
                    Err(f) => {
                        self.failed(end, &f.why, f.retry, now);
                        None
                    }
                })
                .collect(),
            Err(f) => {
                for end in ends {
                    self.failed(end, &f.why, f.retry, now);
                }
                Vec::new()
            }
        }
    }

    pub(crate) fn send(&self, path: &'static str, body: &[u8]) -> Result<u32, String> {
        self.send_within(path, body, self.timeout)
    }

    fn send_within(
        &self,
        path: &'static str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<u32, String> {
        let headers = remote::call_headers(path);
        let call = HttpCall {
            upstream: &self.cluster,
            headers: &headers,
            body,
            trailers: &[],
            timeout,
        };
        edge::check_http_call(&call).map_err(|e| e.to_string())?;
        // The SDK's own dispatch, not the edge's: only calls made through it are registered with
        // the SDK's dispatcher, which otherwise traps on the answer's unknown token. It panics
        // only on statuses Envoy's http_call never returns (Ok, BadArgument for an unknown
        // cluster, InternalFailure are all handled), and the call was checked above.
        proxy_wasm::hostcalls::dispatch_http_call(
            &self.cluster,
            headers.to_vec(),
            Some(body),
            Vec::new(),
            Duration::from_millis(u64::from(edge::timeout_ms(timeout))),
        )
        .map_err(|s| format!("calling cluster {}: {s:?}", self.cluster))
    }
}
