//! The filter's own quarantine table (see `router_core::quarantine`): a backend whose stream went
//! silent past the idle timeout stays out of stamped attempt orders for `quarantine_ms`, on every
//! worker (a shared-data table, refreshed on the root tick).

use filter_edge::shared_table::SharedTable;
use filter_edge::{self as edge, Level, MetricKind};
use router_core::quarantine::{Quarantine, QuarantineCodec, TABLE};
use router_core::router::Router;
use std::cell::Ref;

pub(crate) struct QuarantineTable {
    table: SharedTable<QuarantineCodec>,
    duration_ns: u64,
    names: Vec<String>,
    /// `llmkube.quarantines.backend.<name>` per backend index.
    counters: Vec<Option<u32>>,
    /// `llmkube.quarantines.table_reads`: versions of the table a worker took up on its tick
    /// (how a quarantine one worker wrote reaches the others).
    reads: Option<u32>,
}

impl QuarantineTable {
    pub fn new(router: &Router) -> Self {
        let backends = router.backends_len();
        let names: Vec<String> = (0..backends)
            .map(|b| router.backend(b).name.clone())
            .collect();
        QuarantineTable {
            table: SharedTable::new(TABLE, &router.config.router, QuarantineCodec { backends }),
            duration_ns: router.config.quarantine_ms.saturating_mul(1_000_000),
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
            reads: edge::define_metric(MetricKind::Counter, "llmkube.quarantines.table_reads").ok(),
        }
    }

    /// Re-reads the shared table (root tick), counting a version not read before.
    pub fn refresh(&self) {
        if self.table.refresh() {
            if let Some(id) = self.reads {
                edge::increment_metric(id, 1);
            }
        }
    }

    /// This worker's copy of the table, when anyone is quarantined at `now()` (the common answer
    /// is no, and routing then skips the checks altogether). The clock is read only when the
    /// table holds a deadline at all: a worker that never quarantined anything reads none.
    pub fn active(&self, now: impl FnOnce() -> u64) -> Option<(Ref<'_, Quarantine>, u64)> {
        let table = self.table.local();
        if !table.any(0) {
            return None;
        }
        let now = now();
        table.any(now).then_some((table, now))
    }

    /// Quarantines `backend` from `now` for the configured duration, for every worker.
    pub fn quarantine(&self, backend: usize, now: u64, why: &str) {
        let deadline = now.saturating_add(self.duration_ns);
        match self.table.update(|q| q.mark(backend, deadline)) {
            Ok(filter_edge::shared_table::Updated::Unchanged) => {}
            Ok(filter_edge::shared_table::Updated::Written) => {
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
            }
            Err(e) => {
                // Still keep it out on this worker (until the next refresh overwrites the copy);
                // the backend keeps its Envoy-side health only.
                self.table.update_local(|q| {
                    q.mark(backend, deadline);
                });
                edge::log(
                    Level::Error,
                    &format!(
                        "model-router: could not share the quarantine of backend {}: {e}",
                        self.name(backend)
                    ),
                );
            }
        }
    }

    fn name(&self, backend: usize) -> &str {
        self.names.get(backend).map_or("?", String::as_str)
    }
}
