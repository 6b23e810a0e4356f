//! The model-router filter: reads `model` from the request body, matches the ModelRouter rules,
//! and stamps the decision headers the route table dispatches on.
//!
//! This layer only moves headers and bytes; `router_core` decides. Every hostcall goes through
//! `filter_edge`, which returns errors instead of panicking.

// A filter must not panic (in Envoy a trap fails every later request on the worker, closed).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod budget;
mod budget_headers;
mod budget_lease;
mod budget_remote;
mod http;
mod metrics;
mod pick;
mod quarantine;
mod shadow;
mod usage;

use filter_edge::{self as edge, Level};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, LogLevel};
use router_core::audit::Cidr;
use router_core::orders::Rng;
use router_core::router::Router;
use router_core::scan::Scanner;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// Per-VM state: every request on this worker reads it (not the host's shared data, which
/// spans workers; see `quarantine`).
pub(crate) struct Worker {
    pub router: Router,
    /// Lower-cased decision-header names stripped from every request.
    pub stamped: Vec<String>,
    /// Scratch reused across requests (one VM runs one request callback at a time).
    pub scanner: RefCell<Scanner>,
    /// Weighted picks; seeded from the host's entropy (WASI random_get) once per VM.
    pub rng: RefCell<Rng>,
    pub metrics: metrics::Metrics,
    /// `gen_ai.client.token.usage` per backend, model and team.
    pub usage: usage::UsageStats,
    /// `auditLog.trustedProxyCIDRs`, parsed once.
    pub trusted_proxies: Vec<Cidr>,
    /// Backends this filter keeps out of attempt orders (stream-idle quarantine).
    pub quarantine: quarantine::QuarantineTable,
    /// Whether the host keeps info-level logs (the audit line): asked at configure time and on
    /// every tick, not per request.
    pub audit_logged: Cell<bool>,
    /// `spec.policy.budgets`; `None` when the router has none.
    pub budgets: Option<budget::Budgets>,
    /// Pod picking for endpoint-picked backends (state shared with the other workers).
    pub pick: pick::Pick,
    /// When this worker saw each backend fail (Envoy ejects it), for `Retry-After`.
    pub ejections: RefCell<router_core::quarantine::Ejections>,
    /// Request ids for requests that arrive without one; apart from `rng` so that weighted
    /// picks draw the same sequence whether or not the gateway sets ids.
    pub ids: RefCell<Rng>,
    /// Shadow copies this filter sends itself; `None` where the gateway mirrors them.
    pub shadow: Option<shadow::Shadow>,
}

#[derive(Default)]
struct Root {
    worker: Option<Rc<Worker>>,
}

impl Context for Root {
    /// The root's calls: vLLM metrics scrapes (`pick`), shadow copies (`shadow`) and the shared
    /// ledger's settles and releases (`budget_remote`); a scrape token is claimed first.
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(worker) = &self.worker {
            if worker.pick.on_scrape(token, body_size, edge::now_nanos()) {
                return;
            }
            if let Some(shadow) = &worker.shadow {
                if shadow.answered(token, num_headers) {
                    return;
                }
            }
            if let Some(budgets) = &worker.budgets {
                budgets.ended(token, num_headers, body_size);
            }
        }
    }

    /// The VM is stopping: lease mode releases this gateway's leases first (the host waits for
    /// `proxy_done`, sent when the releases are answered).
    fn on_done(&mut self) -> bool {
        match self.worker.as_ref().and_then(|w| w.budgets.as_ref()) {
            Some(budgets) => !budgets.release_leases(),
            None => true,
        }
    }
}

impl RootContext for Root {
    /// A request rang: its shadow copies are waiting to be sent from here.
    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(shadow) = self.worker.as_ref().and_then(|w| w.shadow.as_ref()) {
            shadow.on_ring(queue_id);
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        match edge::configured_router() {
            Ok(router) => {
                let stamped = router.config.stamped_headers();
                edge::log(
                    Level::Info,
                    &format!("model-router: configured for {}", router.config.router),
                );
                let mut seed = [0u8; 8];
                if let Err(e) = getrandom::fill(&mut seed) {
                    // Weighted picks would still spread, just predictably: say so, don't fail.
                    edge::log(
                        Level::Warn,
                        &format!("model-router: no entropy for weighted picks: {e}"),
                    );
                }
                let trusted_proxies = router
                    .config
                    .audit
                    .trusted_proxy_cidrs
                    .iter()
                    .filter_map(|c| Cidr::parse(c))
                    .collect();
                let metrics = metrics::Metrics::new(&router);
                let budgets = match budget::Budgets::configure(&router) {
                    Ok(b) => b,
                    Err(e) => {
                        edge::log(Level::Error, &format!("model-router: {e}"));
                        return false;
                    }
                };
                let nonce = u64::from_le_bytes(seed) ^ 0x2545_f491_4f6c_dd1d;
                let shadow = match shadow::Shadow::configure(&router, nonce) {
                    Ok(s) => s,
                    Err(e) => {
                        edge::log(Level::Error, &format!("model-router: {e}"));
                        return false;
                    }
                };
                let quarantine = quarantine::QuarantineTable::new(&router);
                quarantine.refresh();
                if let Err(e) = edge::set_tick_period(edge::shared_table::REFRESH_MS) {
                    // Without ticks a quarantine still holds on the worker that set it.
                    edge::log(
                        Level::Warn,
                        &format!("model-router: no tick, quarantines stay per worker: {e}"),
                    );
                }
                let pick =
                    pick::Pick::new(&router, u64::from_le_bytes(seed) ^ 0x9e37_79b9_7f4a_7c15);
                let ejections = RefCell::new(router_core::quarantine::Ejections::new(
                    router.backends_len(),
                ));
                let usage = usage::UsageStats::new(
                    (0..router.backends_len()).map(|i| router.backend(i).name.clone()),
                );
                self.worker = Some(Rc::new(Worker {
                    shadow,
                    pick,
                    metrics,
                    usage,
                    budgets,
                    quarantine,
                    audit_logged: Cell::new(edge::log_enabled(Level::Info)),
                    trusted_proxies,
                    router,
                    stamped,
                    scanner: RefCell::new(Scanner::new()),
                    rng: RefCell::new(Rng::new(u64::from_le_bytes(seed))),
                    ejections,
                    ids: RefCell::new(Rng::new(
                        u64::from_le_bytes(seed).rotate_left(29) ^ 0x5851_f42d_4c95_7f2d,
                    )),
                }));
                true
            }
            Err(e) => {
                edge::log(
                    Level::Error,
                    &format!("model-router: invalid configuration: {e}"),
                );
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(worker) = &self.worker {
            worker.quarantine.refresh();
            worker.audit_logged.set(edge::log_enabled(Level::Info));
            worker.pick.on_tick(edge::now_nanos());
            if let Some(budgets) = &worker.budgets {
                budgets.flush();
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(http::Request::new(self.worker.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
