//! Request counters through the gateway's own stats (Envoy: `wasmcustom.llmkube.*`, also on
//! `/stats/prometheus`). Quarantines and backend health are Envoy's own outlier-detection and
//! health-check stats of the `backend-<name>` clusters; these count what only the filter knows.
//!
//! Counters are defined on first use and remembered by (rule, backend, outcome) index, so the
//! request path formats no names after warm-up.

use filter_edge::{self as edge, Level, MetricKind};
use fnv::FnvHashMap;
use router_core::audit::Outcome;
use router_core::router::Router;
use std::cell::RefCell;

/// (rule, backend, outcome) → the counter's id, `None` if the host refused to define it.
type CounterIds = FnvHashMap<(Option<usize>, Option<usize>, Outcome), Option<u32>>;

pub(crate) struct Metrics {
    rule_names: Vec<String>,
    backend_names: Vec<String>,
    ids: RefCell<CounterIds>,
    violations: Option<u32>,
}

impl Metrics {
    pub fn new(router: &Router) -> Self {
        Metrics {
            rule_names: (0..router.rules_len())
                .map(|i| router.rule(i).name.clone())
                .collect(),
            backend_names: (0..router.backends_len())
                .map(|i| router.backend(i).name.clone())
                .collect(),
            ids: RefCell::new(FnvHashMap::default()),
            violations: edge::define_metric(MetricKind::Counter, "llmkube.sensitive_violations")
                .ok(),
        }
    }

    pub fn count(&self, rule: Option<usize>, backend: Option<usize>, outcome: Outcome) {
        let mut ids = self.ids.borrow_mut();
        let id = *ids.entry((rule, backend, outcome)).or_insert_with(|| {
            let name = format!(
                "llmkube.requests.rule.{}.backend.{}.outcome.{}",
                rule.and_then(|r| self.rule_names.get(r))
                    .map_or("none", String::as_str),
                backend
                    .and_then(|b| self.backend_names.get(b))
                    .map_or("none", String::as_str),
                outcome.as_str()
            );
            match edge::define_metric(MetricKind::Counter, &name) {
                Ok(id) => Some(id),
                Err(e) => {
                    edge::log(Level::Warn, &format!("model-router: metric {name}: {e}"));
                    None
                }
            }
        });
        if let Some(id) = id {
            edge::increment_metric(id, 1);
        }
    }

    pub fn violation(&self) {
        if let Some(id) = self.violations {
            edge::increment_metric(id, 1);
        }
    }
}
