//! The pick step: for an attempt order that reaches a backend whose pods the filter picks
//! (`resolution: endpoint`, `balancing` LoadAware), hash the prompt, let `router_core::pick`
//! choose the pod, and name it in `x-gateway-destination-endpoint` for the backend's
//! `ORIGINAL_DST` cluster. The request holds the pick's ticket until its last callback.
//!
//! Workers: every worker's VM has its own `Picker` per backend. Each change (a charge, a
//! release, a scrape) is applied at once on the worker that made it and broadcast as a small
//! event through shared queues (`filter_edge::broadcast`); a worker applies what the others sent
//! before each pick and on every root tick. Cost per request: two events (~60 B plus 8 B per
//! prompt block) enqueued to each other worker, and their dequeues there. Staleness: a worker
//! misses only the events of picks happening on other workers at the same instant.
//!
//! Engine gauges (vLLM): one worker per scrape period wins a shared-data lease (CAS on the
//! period number) and asks each pod for `/metrics` through the backend's own cluster, with the
//! pod named in the header; the gauges are broadcast like any other event.
//!
//! Failover: Envoy's retry to the same backend is never configured for a picked backend (a route
//! attempts each backend of its order once), and `ORIGINAL_DST` follows the header, so any
//! attempt of this backend goes to the pod stamped here, never elsewhere. A failed attempt
//! counts towards that pod's quarantine.

use filter_edge::broadcast::Broadcast;
use filter_edge::{self as edge, Buffer, Level, Map, MetricKind};
use router_core::errors::ApiError;
use router_core::headers::DESTINATION_ENDPOINT_HEADER;
use router_core::pick::events::{self, Event};
use router_core::pick::load::MAX_METRICS_BYTES;
use router_core::pick::usage_watch::{Seen, UsageWatch};
use router_core::pick::wire::DEFAULT_SCRAPE_MS;
use router_core::pick::{
    hash_prompt, parse_vllm_metrics, prompt_parts, session_key, Choice, Company, Outcome, Picker,
    Prompt, Request as PickRequest, Ticket,
};
use router_core::quarantine::went_silent;
use router_core::router::{Decision, Router};
use router_core::scan::TopLevel;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

const CHANNEL: &str = "pick-events";
const SCRAPE_LEASE: &str = "pick-scrape";
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(800);
/// Scrape answers still awaited; more means the pods stopped answering, and old tokens go.
const MAX_SCRAPES: usize = 4096;
const SESSION_EXPIRY_NS: u64 = 1_000_000_000;
/// Comma-separated `ip:port` candidates the pick must stay within (see `router_core::pick`'s
/// `subset`).
const SUBSET_PROPERTY: [&str; 2] = ["llmkube", "endpoint_subset"];

struct Backend {
    name: String,
    picker: RefCell<Picker>,
    session_headers: Vec<String>,
    /// The cluster to scrape through and the period, for a vLLM backend.
    scrape: Option<(String, u64)>,
    lease_key: String,
    last_period: Cell<u64>,
    in_flight: Option<u32>,
    /// Counter of picks made while the engines' counters showed this gateway alone (so new
    /// conversations went by the work to come, not rendezvous): how early and how often a
    /// deployment reads "alone" is otherwise invisible.
    alone: Option<u32>,
}

/// The pick step's state on one worker.
pub(crate) struct Pick {
    backends: Vec<Option<Backend>>,
    bus: Option<Broadcast>,
    prompt: RefCell<Prompt>,
    scrapes: RefCell<HashMap<u32, (usize, usize)>>,
    last_expiry: Cell<u64>,
}

/// A request's pick inputs, between [`Pick::prepare`] and [`Pick::commit`].
pub(crate) struct Pending {
    backend: usize,
    position: usize,
    /// The backend is the last of the order: no pod means no answer.
    last: bool,
    prompt: Prompt,
    session: Option<u64>,
}

/// A request's hold on a pod, until its last callback.
pub(crate) struct Held {
    backend: usize,
    /// Where the backend sits in the attempt order.
    position: usize,
    ticket: Ticket,
    status: Option<u32>,
    attempts: u32,
    complete: bool,
    usage: Option<UsageWatch>,
}

impl Pick {
    /// The pickers of `router`'s endpoint-picked backends. `nonce` names this worker's queue.
    pub fn new(router: &Router, nonce: u64) -> Pick {
        let cfg = &router.config;
        let backends: Vec<Option<Backend>> = cfg
            .backends
            .iter()
            .map(|b| {
                let w = b.pick.as_ref()?;
                if let Some(why) = w.problem() {
                    edge::log(
                        Level::Error,
                        &format!("model-router: backend {}: not picking pods: {why}", b.name),
                    );
                    return None;
                }
                // Its own block chain per backend: two models never share blocks.
                let seed = {
                    use std::hash::Hasher;
                    let mut h = fnv::FnvHasher::default();
                    h.write(b.name.as_bytes());
                    h.finish()
                };
                let pc = w.picker_config(cfg.quarantine_ms, seed);
                let session_headers = pc
                    .session
                    .as_ref()
                    .map(|s| s.headers.clone())
                    .unwrap_or_default();
                Some(Backend {
                    picker: RefCell::new(Picker::new(pc, &w.endpoints)),
                    session_headers,
                    scrape: w.scrape_cluster.clone().map(|c| {
                        let ms = w.scrape_ms.unwrap_or(DEFAULT_SCRAPE_MS).max(100);
                        (c, ms.saturating_mul(1_000_000))
                    }),
                    lease_key: router_core::shared_codec::key(
                        SCRAPE_LEASE,
                        &format!("{}/{}", cfg.router, b.name),
                    ),
                    last_period: Cell::new(0),
                    in_flight: edge::define_metric(
                        MetricKind::Gauge,
                        &format!("llmkube.pick.in_flight.backend.{}", b.name),
                    )
                    .ok(),
                    alone: edge::define_metric(
                        MetricKind::Counter,
                        &format!("llmkube.pick.alone.backend.{}", b.name),
                    )
                    .ok(),
                    name: b.name.clone(),
                })
            })
            .collect();
        let bus = if backends.iter().any(Option::is_some) {
            let vm_id = edge::property(&["plugin_vm_id"])
                .ok()
                .flatten()
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_default();
            match Broadcast::join(CHANNEL, &cfg.router, &vm_id, nonce) {
                Ok(b) => Some(b),
                Err(e) => {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: pod picks stay per worker (no shared queue: {e})"),
                    );
                    None
                }
            }
        } else {
            None
        };
        Pick {
            backends,
            bus,
            prompt: RefCell::new(Prompt::default()),
            scrapes: RefCell::new(HashMap::new()),
            last_expiry: Cell::new(0),
        }
    }

    fn send(&self, backend: usize, e: &Event) {
        if let Some(bus) = &self.bus {
            bus.send(&events::encode(backend as u16, e));
        }
    }

    /// Applies what the other workers did.
    fn catch_up(&self) {
        let Some(bus) = &self.bus else { return };
        bus.drain(|raw| {
            let Some((b, e)) = events::decode(raw) else {
                return;
            };
            if let Some(Some(be)) = self.backends.get(b as usize) {
                be.picker.borrow_mut().apply(&e);
            }
        });
    }

    /// The pick's inputs for `decision`, if its order reaches an endpoint-picked backend: the
    /// prompt hashed from `body` as the client sent it (read back from the buffer when the
    /// caller has no copy) and the session key. Nothing is charged yet: a request refused after
    /// this (budgets) must leave no blocks or load on any pod, so [`Pick::commit`] runs only
    /// once the request is admitted.
    pub fn prepare(
        &self,
        decision: &Decision,
        spans: &TopLevel,
        body: Option<&[u8]>,
        body_len: usize,
    ) -> Option<Pending> {
        let (position, b, be) = decision.order.iter().enumerate().find_map(|(k, &b)| {
            self.backends
                .get(b)
                .and_then(Option::as_ref)
                .map(|be| (k, b, be))
        })?;
        // The worker's buffer, lent to this request (kept by a request that waits for a callout).
        let mut prompt = std::mem::take(&mut *self.prompt.borrow_mut());
        let picker = be.picker.borrow();
        match picker.block_bytes() {
            Some(block) => {
                let read;
                let body = match body {
                    Some(b) => b,
                    None => {
                        read = edge::buffer(Buffer::RequestBody, 0, body_len)
                            .ok()
                            .flatten()
                            .unwrap_or_default();
                        &read
                    }
                };
                hash_prompt(
                    &prompt_parts(body, spans),
                    block,
                    picker.config().seed,
                    &mut prompt,
                );
            }
            None => {
                prompt.blocks.clear();
                prompt.bytes = body_len;
                prompt.head_bytes = 0;
            }
        }
        let session = if be.session_headers.is_empty() {
            None
        } else {
            let pairs = edge::header_pairs(Map::RequestHeaders).unwrap_or_default();
            let text: Vec<(&str, &str)> = pairs
                .iter()
                .filter_map(|(n, v)| {
                    Some((std::str::from_utf8(n).ok()?, std::str::from_utf8(v).ok()?))
                })
                .collect();
            session_key(&be.session_headers, text.iter().copied())
        };
        Some(Pending {
            backend: b,
            position,
            last: position + 1 == decision.order.len(),
            prompt,
            session,
        })
    }

    /// Picks the pod for a prepared request and charges it: `Ok(Some(ip:port))` for the header
    /// (the hold goes into `held`). `Err` when every pod is quarantined and the order has
    /// nothing after that backend; with a backend after it, no header, so that attempt fails at
    /// once and Envoy moves on.
    pub fn commit(
        &self,
        pending: Pending,
        now: u64,
        held: &mut Option<Held>,
    ) -> Result<Option<String>, ApiError> {
        let Some(Some(be)) = self.backends.get(pending.backend) else {
            return Ok(None);
        };
        self.catch_up();
        let mut picker = be.picker.borrow_mut();
        let req = PickRequest {
            prompt: &pending.prompt,
            session: pending.session,
            avoid: None,
        };
        // The candidates an endpoint picker's proxy allows (set by llmkube-ext-proc in picker
        // mode; Envoy has no such property, so a client can never set it).
        let choice = match edge::property(&SUBSET_PROPERTY).ok().flatten() {
            Some(list) => {
                let allowed = picker.subset_mask(&String::from_utf8_lossy(&list));
                picker.pick_within(&req, &allowed, now)
            }
            None => picker.pick(&req, now),
        };
        if let Some(id) = be.alone.filter(|_| picker.company(now) == Company::Alone) {
            edge::increment_metric(id, 1);
        }
        let (addr, event) = match &choice {
            Choice::Pod(t) => (
                picker.address(t.pod()).map(str::to_string),
                Some(picker.charged_event(t, &pending.prompt, pending.session, now)),
            ),
            Choice::NoEligiblePod => (None, None),
        };
        drop(picker);
        let usage = pending.prompt.blocks.first().map(|_| UsageWatch::default());
        // The buffer goes back to the worker for the next request.
        *self.prompt.borrow_mut() = pending.prompt;
        let (Choice::Pod(ticket), Some(event)) = (choice, event) else {
            return if pending.last {
                Err(ApiError::no_eligible_pod(&be.name))
            } else {
                Ok(None)
            };
        };
        self.send(pending.backend, &event);
        if let Some(id) = be.in_flight {
            edge::increment_metric(id, 1);
        }
        *held = Some(Held {
            backend: pending.backend,
            position: pending.position,
            ticket,
            status: None,
            attempts: 1,
            complete: false,
            usage,
        });
        Ok(addr)
    }

    /// Ends the hold: releases the ticket everywhere, with what the response said of the pod.
    pub fn release(&self, held: Held, now: u64) {
        let Some(Some(be)) = self.backends.get(held.backend) else {
            return;
        };
        let outcome = held.outcome();
        let pod = held.ticket.pod();
        let event = Picker::released_event(&held.ticket, outcome, now);
        let mut picker = be.picker.borrow_mut();
        let was = picker.is_quarantined(pod, now);
        picker.release(held.ticket, outcome, now);
        // Sent before the log line: once the line is out, every other worker has the event
        // queued and applies it before its next pick (tests wait for the line).
        self.send(held.backend, &event);
        if !was && picker.is_quarantined(pod, now) {
            edge::log(
                Level::Warn,
                &format!(
                    "model-router: pod {} of backend {} quarantined after failures",
                    picker.address(pod).unwrap_or("?"),
                    be.name
                ),
            );
        }
        drop(picker);
        if let Some(id) = be.in_flight {
            edge::increment_metric(id, -1);
        }
    }

    /// Root tick: new members, the others' events, idle sessions, scrapes that are due.
    pub fn on_tick(&self, now: u64) {
        if let Some(bus) = &self.bus {
            bus.refresh();
            self.catch_up();
        }
        if now.saturating_sub(self.last_expiry.get()) >= SESSION_EXPIRY_NS {
            self.last_expiry.set(now);
            for be in self.backends.iter().flatten() {
                be.picker.borrow_mut().expire_sessions(now);
            }
        }
        for (b, be) in self.backends.iter().enumerate() {
            let Some(be) = be else { continue };
            let Some((cluster, period_ns)) = &be.scrape else {
                continue;
            };
            let period = now / (*period_ns).max(1);
            if period <= be.last_period.get() {
                continue;
            }
            be.last_period.set(period);
            if win_lease(&be.lease_key, period) {
                self.scrape(b, be, cluster);
            }
        }
    }

    fn scrape(&self, b: usize, be: &Backend, cluster: &str) {
        let picker = be.picker.borrow();
        let mut scrapes = self.scrapes.borrow_mut();
        if scrapes.len() >= MAX_SCRAPES {
            scrapes.clear();
        }
        for pod in 0..picker.pods() {
            let Some(addr) = picker.address(pod) else {
                continue;
            };
            let headers = [
                (":method", "GET"),
                (":path", "/metrics"),
                (":authority", addr),
                (DESTINATION_ENDPOINT_HEADER, addr),
            ];
            let call = edge::HttpCall {
                upstream: cluster,
                headers: &headers,
                body: &[],
                trailers: &[],
                timeout: SCRAPE_TIMEOUT,
            };
            if edge::check_http_call(&call).is_err() {
                continue;
            }
            // The SDK's own dispatch registers the token, so the answer comes back to this root
            // context; it returns an error for every status Envoy gives a refused call.
            match proxy_wasm::hostcalls::dispatch_http_call(
                cluster,
                headers.to_vec(),
                None,
                Vec::new(),
                SCRAPE_TIMEOUT,
            ) {
                Ok(token) => {
                    scrapes.insert(token, (b, pod));
                }
                Err(e) => edge::log(
                    Level::Warn,
                    &format!("model-router: cannot scrape {addr} through {cluster}: {e:?}"),
                ),
            }
        }
    }

    /// A scrape answered (root context's `on_http_call_response`).
    pub fn on_scrape(&self, token: u32, body_size: usize, now: u64) -> bool {
        let Some((b, pod)) = self.scrapes.borrow_mut().remove(&token) else {
            return false;
        };
        let ok = edge::call_response_headers()
            .map(|h| edge::response_status(&h) == 200)
            .unwrap_or(false);
        if !ok {
            return true;
        }
        let Ok(body) = edge::call_response_body(body_size.min(MAX_METRICS_BYTES)) else {
            return true;
        };
        let Some(metrics) = parse_vllm_metrics(&body, now) else {
            return true;
        };
        if let Some(Some(be)) = self.backends.get(b) {
            let event = Event::Metrics {
                pod: pod as u16,
                metrics,
            };
            be.picker.borrow_mut().apply(&event);
            self.send(b, &event);
        }
        true
    }
}

/// Whether this worker takes scrape period `period`: the first to write it wins.
fn win_lease(key: &str, period: u64) -> bool {
    let (value, cas) = match edge::shared_data(key) {
        Ok(Some(v)) => v,
        Ok(None) => (Vec::new(), 0),
        Err(_) => return false,
    };
    let taken = value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes);
    // A key never written accepts any write, CAS or not: two workers may both take the very
    // first period, which only costs one extra scrape.
    taken < period && edge::set_shared_data(key, &period.to_le_bytes(), cas).is_ok()
}

impl Held {
    /// The response headers came back (`attempts`: Envoy's attempt count, 0 when absent).
    pub fn response(&mut self, status: u32, attempts: u32, end_of_stream: bool) {
        self.status = Some(status);
        self.attempts = attempts.max(1);
        self.complete = end_of_stream;
    }

    /// A piece of the response body (`size` bytes buffered, the piece at its end).
    pub fn body(&mut self, size: usize, end_of_stream: bool) {
        if end_of_stream {
            self.complete = true;
        }
        if let Some(w) = self.usage.as_mut() {
            if let Ok(Some(piece)) = edge::buffer(Buffer::ResponseBody, 0, size) {
                w.feed(&piece);
            }
        }
    }

    /// What this request says about its pod (`router_core::pick::usage_watch::Seen` decides).
    fn outcome(&self) -> Outcome {
        let started = self.status.is_some_and(|s| s < 500);
        let went_silent = started && !self.complete && {
            let details = edge::property(&["response", "code_details"]).ok().flatten();
            went_silent(Some(0), false, details.as_deref()).is_some()
        };
        Seen {
            position: self.position,
            status: self.status,
            attempts: self.attempts,
            complete: self.complete,
            went_silent,
            prompt_tokens: self.usage.as_ref().and_then(|u| u.prompt_tokens),
            cached_tokens: self.usage.as_ref().and_then(|u| u.cached_tokens),
        }
        .outcome()
    }
}
