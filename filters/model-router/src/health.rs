//! The filter's own quarantine (see `router_core::quarantine`): a backend whose stream went silent
//! past the idle timeout stays out of stamped attempt orders for `quarantine_ms`.
//!
//! The table lives in the host's shared data so every worker honours it. Each worker keeps a copy
//! refreshed on its root tick, so the request path makes no extra hostcall; a quarantine set on
//! another worker is seen within one tick, one set on this worker at once.

use filter_edge::{self as edge, Level, MetricKind, CAS_MISMATCH};
use router_core::quarantine::Quarantine;
use router_core::router::Router;
use std::cell::RefCell;

/// How often each worker re-reads the shared table.
pub const REFRESH_MS: u32 = 100;
/// Writers racing on the table retry this often before giving up (the quarantine is then lost,
/// and logged: the backend keeps its Envoy-side health only).
const CAS_ATTEMPTS: usize = 8;

pub(crate) struct Health {
    key: String,
    backends: usize,
    duration_ns: u64,
    table: RefCell<Quarantine>,
    names: Vec<String>,
    /// `llmkube.quarantines.backend.<name>` per backend index.
    counters: Vec<Option<u32>>,
}

impl Health {
    pub fn new(router: &Router) -> Self {
        let backends = router.backends_len();
        let names: Vec<String> = (0..backends)
            .map(|b| router.backend(b).name.clone())
            .collect();
        Health {
            key: format!("llmkube.quarantine/{}", router.config.router),
            backends,
            duration_ns: router.config.quarantine_ms.saturating_mul(1_000_000),
            table: RefCell::new(Quarantine::new(backends)),
            counters: names
                .iter()
                .map(|n| {
                    edge::define_metric(
                        MetricKind::Counter,
                        &format!("llmkube.quarantines.backend.{n}"),
                    )
                    .ok()
                })
                .collect(),
            names,
        }
    }

    /// Re-reads the shared table (root tick).
    pub fn refresh(&self) {
        if let Ok(Some((raw, _))) = edge::shared_data(&self.key) {
            *self.table.borrow_mut() = Quarantine::decode(&raw, self.backends);
        }
    }

    /// This worker's copy of the table, when anyone is quarantined at `now` (the common answer
    /// is no, and routing then skips the health checks altogether).
    pub fn table(&self, now: u64) -> Option<std::cell::Ref<'_, Quarantine>> {
        let table = self.table.borrow();
        table.any(now).then_some(table)
    }

    /// Quarantines `backend` from `now` for the configured duration, for every worker.
    pub fn quarantine(&self, backend: usize, now: u64, why: &str) {
        let deadline = now.saturating_add(self.duration_ns);
        for _ in 0..CAS_ATTEMPTS {
            let (mut table, cas) = match edge::shared_data(&self.key) {
                Ok(Some((raw, cas))) => (Quarantine::decode(&raw, self.backends), cas),
                Ok(None) => (Quarantine::new(self.backends), 0),
                Err(e) => return self.lost(backend, deadline, &e.to_string()),
            };
            if !table.mark(backend, deadline) {
                *self.table.borrow_mut() = table;
                return;
            }
            match edge::set_shared_data(&self.key, &table.encode(), cas) {
                Ok(()) => {
                    *self.table.borrow_mut() = table;
                    if let Some(Some(id)) = self.counters.get(backend) {
                        edge::increment_metric(*id, 1);
                    }
                    edge::log(
                        Level::Warn,
                        &format!(
                            "model-router: backend {} quarantined for {} ms: {why}",
                            self.name(backend),
                            self.duration_ns / 1_000_000
                        ),
                    );
                    return;
                }
                Err(e) if e.status == CAS_MISMATCH => continue,
                Err(e) => return self.lost(backend, deadline, &e.to_string()),
            }
        }
        self.lost(backend, deadline, "too many concurrent writers");
    }

    fn lost(&self, backend: usize, deadline: u64, why: &str) {
        // Still keep it out on this worker (until the next refresh overwrites the copy).
        self.table.borrow_mut().mark(backend, deadline);
        edge::log(
            Level::Error,
            &format!(
                "model-router: could not share the quarantine of backend {}: {why}",
                self.name(backend)
            ),
        );
    }

    fn name(&self, backend: usize) -> &str {
        self.names.get(backend).map_or("?", String::as_str)
    }
}
