//! Ledgers kept by the shared budget service `llmkube-budgets` (`--budgets-service`): one
//! ledger set for every gateway replica, surviving restarts. The request reserves by an HTTP
//! callout and stays paused until the answer; settling and releasing are queued for the
//! worker's root context, which sends them on its next tick.
//!
//! Why the root: Envoy cancels a context's callouts when the context is destroyed, and a
//! request's context is destroyed right after `on_log`, where most settles and releases are
//! decided. The root lives as long as the VM, so its calls complete and their failures are
//! logged. A settle that never arrives (the queue full, Envoy stopping, the service down) is
//! bounded: the service drops the hold at its TTL.
//!
//! `router_core::budget::remote` builds the calls and reads the answers; this moves them.

use filter_edge::{self as edge, HttpCall, Level};
use router_core::budget::admit::LedgerKey;
use router_core::budget::config::{CompiledBudgets, ServiceConfig};
use router_core::budget::remote::{self, Admission, MAX_REPLY_BYTES, RESERVE_PATH};
use router_core::budget::window::Amount;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Duration;

/// Settles and releases waiting for the next tick, per worker. Past this the oldest is
/// dropped (logged): its hold expires at its TTL, so dropping costs room, never money.
const MAX_QUEUED_ENDS: usize = 4096;

/// A request's reservation on the service, from the reserve call to its settle or release.
pub(crate) struct RemoteHold {
    pub keys: Vec<LedgerKey>,
    /// The reserve call's token while its answer is out.
    pub pending: Option<u32>,
    /// The service's id of the reservation, once admitted.
    pub reservation: Option<String>,
}

/// The shared ledger as one worker reaches it.
pub(crate) struct Remote {
    cluster: String,
    timeout: Duration,
    pub fail_open: bool,
    router: String,
    ends: RefCell<VecDeque<(&'static str, Vec<u8>)>>,
}

impl Remote {
    pub fn new(router: &str, service: &ServiceConfig) -> Remote {
        Remote {
            cluster: service.cluster.clone(),
            timeout: Duration::from_millis(service.timeout_ms.max(1)),
            fail_open: service.fail_open,
            router: router.to_string(),
            ends: RefCell::new(VecDeque::new()),
        }
    }

    /// Sends the reservation of `amount` on `keys`; the answer arrives in the request's
    /// `on_http_call_response` with the returned token. `Err`: nothing was sent (the store is
    /// unavailable: e.g. the cluster is missing).
    pub fn reserve(
        &self,
        c: &CompiledBudgets,
        keys: &[LedgerKey],
        amount: Amount,
    ) -> Result<u32, String> {
        let body = remote::reserve_body(&self.router, c, keys, amount);
        self.send(RESERVE_PATH, &body)
    }

    /// Reads the reserve answer being delivered (only inside `on_http_call_response`).
    pub fn answer(&self, num_headers: usize, body_size: usize) -> Admission {
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
        let call = remote::end_call(&self.router, c, keys, reservation, charge);
        let mut ends = self.ends.borrow_mut();
        if ends.len() >= MAX_QUEUED_ENDS {
            ends.pop_front();
            edge::log(
                Level::Warn,
                "model-router: budgets: too many settles queued for llmkube-budgets; the oldest is dropped and its hold expires at its TTL",
            );
        }
        ends.push_back(call);
    }

    /// Sends every queued settle and release (from the root context, on tick).
    pub fn flush(&self) {
        let queued: Vec<_> = self.ends.borrow_mut().drain(..).collect();
        for (path, body) in queued {
            if let Err(e) = self.send(path, &body) {
                edge::log(
                    Level::Error,
                    &format!(
                        "model-router: budgets: {path} not sent ({e}); the hold expires at its TTL"
                    ),
                );
            }
        }
    }

    /// Logs a settle or release answer that says it failed (root `on_http_call_response`).
    pub fn ended(&self, num_headers: usize, body_size: usize) {
        let (status, body) = if num_headers == 0 {
            (0, Vec::new())
        } else {
            let headers = edge::call_response_headers().unwrap_or_default();
            let body = edge::call_response_body(body_size.min(MAX_REPLY_BYTES)).unwrap_or_default();
            (edge::response_status(&headers), body)
        };
        if let Err(why) = remote::read_end(status, &body) {
            edge::log(
                Level::Error,
                &format!("model-router: budgets: settle/release failed ({why}); the hold expires at its TTL"),
            );
        }
    }

    fn send(&self, path: &'static str, body: &[u8]) -> Result<u32, String> {
        let headers = remote::call_headers(path);
        let call = HttpCall {
            upstream: &self.cluster,
            headers: &headers,
            body,
            trailers: &[],
            timeout: self.timeout,
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
            Duration::from_millis(u64::from(edge::timeout_ms(self.timeout))),
        )
        .map_err(|s| format!("calling cluster {}: {s:?}", self.cluster))
    }
}
