//! The per-VM state every request on a worker reads, built once from the plugin configuration.

use crate::{budget, metrics, pick, quarantine, shadow, usage};
use filter_edge::{self as edge, Level};
use router_core::audit::Cidr;
use router_core::orders::Rng;
use router_core::router::Router;
use router_core::scan::Scanner;
use std::cell::{Cell, RefCell};

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

impl Worker {
    /// The worker's state for `router`; an error names what in the configuration is unusable.
    pub fn new(router: Router) -> Result<Worker, String> {
        let stamped = router.config.stamped_headers();
        let mut seed = [0u8; 8];
        if let Err(e) = getrandom::fill(&mut seed) {
            // Weighted picks would still spread, just predictably: say so, don't fail.
            edge::log(
                Level::Warn,
                &format!("model-router: no entropy for weighted picks: {e}"),
            );
        }
        let seed = u64::from_le_bytes(seed);
        let trusted_proxies = router
            .config
            .audit
            .trusted_proxy_cidrs
            .iter()
            .filter_map(|c| Cidr::parse(c))
            .collect();
        let metrics = metrics::Metrics::new(&router);
        let budgets = budget::Budgets::configure(&router)?;
        let shadow = shadow::Shadow::configure(&router, seed ^ 0x2545_f491_4f6c_dd1d)?;
        let quarantine = quarantine::QuarantineTable::new(&router);
        quarantine.refresh();
        let pick = pick::Pick::new(&router, seed ^ 0x9e37_79b9_7f4a_7c15);
        let ejections = RefCell::new(router_core::quarantine::Ejections::new(
            router.backends_len(),
        ));
        let usage = usage::UsageStats::new(
            (0..router.backends_len()).map(|i| router.backend(i).name.clone()),
        );
        Ok(Worker {
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
            rng: RefCell::new(Rng::new(seed)),
            ejections,
            ids: RefCell::new(Rng::new(seed.rotate_left(29) ^ 0x5851_f42d_4c95_7f2d)),
        })
    }
}
