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

/// A counter's key: (rule, backend, outcome).
type CounterKey = (Option<usize>, Option<usize>, Outcome);
/// Counter key → the counter's id, `None` if the host refused to define it.
type CounterIds = FnvHashMap<CounterKey, Option<u32>>;

pub(crate) struct Metrics {
    rule_names: Vec<String>,
    backend_names: Vec<String>,
    ids: RefCell<CounterIds>,
    /// The last key counted and its id: most requests in a row share one (no hashing then).
    last: std::cell::Cell<Option<(CounterKey, Option<u32>)>>,
    violations: Option<u32>,
    /// `llmkube.failover_skipped`, defined only under a replay limit.
    failover_skipped: Option<u32>,
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
            last: std::cell::Cell::new(None),
            violations: edge::define_metric(MetricKind::Counter, "llmkube.sensitive_violations")
                .ok(),
            failover_skipped: router
                .config
                .failover_replay_limit
                .and_then(|_| counter("llmkube.failover_skipped")),
        }
    }

    pub fn count(&self, rule: Option<usize>, backend: Option<usize>, outcome: Outcome) {
        let key = (rule, backend, outcome);
        let id = match self.last.get() {
            Some((last, id)) if last == key => id,
            _ => {
                let id = self.id(key);
                self.last.set(Some((key, id)));
                id
            }
        };
        if let Some(id) = id {
            edge::increment_metric(id, 1);
        }
    }

    fn id(&self, (rule, backend, outcome): CounterKey) -> Option<u32> {
        let mut ids = self.ids.borrow_mut();
        *ids.entry((rule, backend, outcome)).or_insert_with(|| {
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
        })
    }

    pub fn violation(&self) {
        if let Some(id) = self.violations {
            edge::increment_metric(id, 1);
        }
    }

    /// A request served by its first backend only, its body over the replay limit.
    pub fn failover_skipped(&self) {
        if let Some(id) = self.failover_skipped {
            edge::increment_metric(id, 1);
        }
    }
}

/// Per-budget stats (`wasmcustom.llmkube.budget.<budget>[.team.<team>].*`): gauges of what a
/// ledger holds, set after each settle, release or refusal on that ledger, never per
/// chunk; counters of refusals and estimated charges per budget. Gauges are per ledger, so a team
/// budget has one set per team it tracks (at most its `max_teams`).
pub(crate) struct BudgetStats {
    names: Vec<String>,
    caps: Vec<router_core::budget::Caps>,
    refusals: Vec<Option<u32>>,
    estimated: Vec<Option<u32>>,
    unenforced: Vec<Option<u32>>,
    gauges: RefCell<FnvHashMap<LedgerKey, Option<[u32; 4]>>>,
    /// Shared ledgers only: where the newest state of each ledger is kept in shared data
    /// (`<prefix><budget>[|<team>]`), `None` for embedded ledgers.
    shared_prefix: Option<String>,
    /// Ledgers this worker set gauges for, with the shared-data key of their newest state and
    /// what it set, until a tick finds shared data still holding that
    /// (`router_core::budget::gauge`).
    unconfirmed: RefCell<FnvHashMap<LedgerKey, (String, Reading)>>,
    /// Shared ledgers only: team gauge sets per budget so far, at most `max_team_gauges`.
    team_gauges: RefCell<Vec<usize>>,
    max_team_gauges: usize,
    dropped: Vec<Option<u32>>,
}

use filter_edge::shared_table::HostStore;
use router_core::budget::admit::LedgerKey;
use router_core::budget::gauge::{self, Reading};

/// A counter, or `None` (logged) when the host refuses to define it.
pub(crate) fn counter(name: &str) -> Option<u32> {
    match edge::define_metric(MetricKind::Counter, name) {
        Ok(id) => Some(id),
        Err(e) => {
            edge::log(Level::Warn, &format!("model-router: metric {name}: {e}"));
            None
        }
    }
}

/// Percent of the tightest cap `spent` uses (rounded down).
fn percent(caps: &router_core::budget::Caps, tokens: u64, pico: u64) -> u64 {
    let of = |used: u64, cap: Option<u64>| {
        // In u64 when `used × 100` fits (always for tokens): a u128 division is a library
        // call on wasm32, and this runs for every ledger a request settles.
        cap.filter(|&c| c > 0)
            .map_or(0, |c| match used.checked_mul(100) {
                Some(x) => x / c,
                None => (u128::from(used) * 100 / u128::from(c)) as u64,
            })
    };
    of(tokens, caps.tokens).max(of(pico, caps.pico))
}

impl BudgetStats {
    pub fn new(budgets: &[router_core::budget::Budget]) -> Self {
        let per = |what: &str| {
            budgets
                .iter()
                .map(|b| counter(&format!("llmkube.budget.{}.{what}", b.name)))
                .collect()
        };
        BudgetStats {
            names: budgets.iter().map(|b| b.name.clone()).collect(),
            caps: budgets.iter().map(|b| b.caps).collect(),
            refusals: per("refusals"),
            estimated: per("estimated_charges"),
            unenforced: per("unenforced"),
            gauges: RefCell::new(FnvHashMap::default()),
            shared_prefix: None,
            unconfirmed: RefCell::new(FnvHashMap::default()),
            team_gauges: RefCell::new(vec![0; budgets.len()]),
            max_team_gauges: usize::MAX,
            dropped: Vec::new(),
        }
    }

    /// For ledgers kept by `llmkube-budgets`: their gauges follow the newest state any worker
    /// got, kept in shared data under `prefix`. A team budget gets gauges (and a shared-data
    /// key) for its first `max_teams` teams on this worker: the service admits at most that
    /// many at a time, but teams come and go, and Envoy cannot drop a stat once defined.
    /// Later teams are counted in `gauges_dropped` (their spend is in `llmkube-budgets
    /// status`).
    pub fn shared_by_workers(mut self, prefix: String, max_teams: usize) -> Self {
        self.shared_prefix = Some(prefix);
        self.max_team_gauges = max_teams;
        self.dropped = self
            .names
            .iter()
            .map(|n| counter(&format!("llmkube.budget.{n}.gauges_dropped")))
            .collect();
        self
    }

    /// Whether `key` may have gauges: always for router and rule ledgers and for teams that
    /// have them already; a new team only while its budget has fewer than the bound.
    fn may_track(&self, key: &LedgerKey) -> bool {
        if key.team.is_none() || self.gauges.borrow().contains_key(key) {
            return true;
        }
        let mut counts = self.team_gauges.borrow_mut();
        let Some(n) = counts.get_mut(key.budget) else {
            return false;
        };
        if *n >= self.max_team_gauges {
            if let Some(Some(id)) = self.dropped.get(key.budget) {
                edge::increment_metric(*id, 1);
            }
            return false;
        }
        *n += 1;
        true
    }

    pub fn refused(&self, budget: usize) {
        if let Some(Some(id)) = self.refusals.get(budget) {
            edge::increment_metric(*id, 1);
        }
    }

    pub fn estimated(&self, budget: usize) {
        if let Some(Some(id)) = self.estimated.get(budget) {
            edge::increment_metric(*id, 1);
        }
    }

    /// A request admitted without its budgets (the shared ledger down, fail-open).
    pub fn unenforced(&self, budget: usize) {
        if let Some(Some(id)) = self.unenforced.get(budget) {
            edge::increment_metric(*id, 1);
        }
    }

    fn ids(&self, key: &LedgerKey) -> Option<[u32; 4]> {
        // Looked up before inserting: the key (a team's name) is cloned once, not per set.
        if let Some(ids) = self.gauges.borrow().get(key) {
            return *ids;
        }
        let mut gauges = self.gauges.borrow_mut();
        *gauges.entry(key.clone()).or_insert_with(|| {
            let base = match &key.team {
                Some(t) => format!("llmkube.budget.{}.team.{t}", self.names.get(key.budget)?),
                None => format!("llmkube.budget.{}", self.names.get(key.budget)?),
            };
            let mut ids = [0u32; 4];
            for (id, what) in ids.iter_mut().zip([
                "tokens_used",
                "usd_micro_used",
                "utilization_percent",
                "tokens_reserved",
            ]) {
                *id = edge::define_metric(MetricKind::Gauge, &format!("{base}.{what}")).ok()?;
            }
            Some(ids)
        })
    }

    /// Sets the gauges of an embedded ledger from the state a settle, release or refusal left
    /// (or read) in shared data, under `shared` (its key there), and remembers it until a tick
    /// finds that state still the ledger's newest ([`BudgetStats::republish`]): another worker
    /// may have changed the ledger, and set the gauges, between this worker's compare-and-swap
    /// and its set, which then left the older state on the gauge.
    pub fn record_ledger(&self, key: &LedgerKey, shared: &str, r: Reading) {
        self.record(key, r.spent, r.held_tokens);
        let mut unconfirmed = self.unconfirmed.borrow_mut();
        // Updated in place when present: no allocation on the request path after the first.
        match unconfirmed.get_mut(key) {
            Some(entry) => entry.1 = r,
            None => {
                unconfirmed.insert(key.clone(), (shared.to_string(), r));
            }
        }
    }

    /// Sets the gauges of shared ledgers from what the service reported: each to the newest
    /// state of its ledger any worker has got (this answer may be older than one another
    /// worker already processed).
    pub fn record_all(&self, gauges: &[router_core::budget::remote::Gauge]) {
        for g in gauges.iter().filter(|g| self.may_track(&g.key)) {
            let Some(key) = self.shared_key(&g.key) else {
                self.record(&g.key, g.reading.spent, g.reading.held_tokens);
                continue;
            };
            let newest = gauge::publish(&HostStore, &key, g.reading);
            self.record(&g.key, newest.spent, newest.held_tokens);
            self.unconfirmed
                .borrow_mut()
                .insert(g.key.clone(), (key, newest));
        }
    }

    /// The root's tick: a gauge this worker set since shared data got a newer state (another
    /// worker recorded that one before this worker's older write) is set again, so the last
    /// write to every gauge is its ledger's newest state within a tick. A ledger is dropped
    /// from the list once a tick finds nothing newer. `newest` reads what shared data holds
    /// under a key (the service's newest answer, or an embedded ledger itself).
    pub fn republish(&self, newest: impl Fn(&LedgerKey, &str) -> Option<Reading>) {
        let mut unconfirmed = self.unconfirmed.borrow_mut();
        if unconfirmed.is_empty() {
            return;
        }
        unconfirmed.retain(
            |ledger, (key, set)| match gauge::on_tick(set, newest(ledger, key)) {
                Some(newer) => {
                    self.record(ledger, newer.spent, newer.held_tokens);
                    *set = newer;
                    true
                }
                None => false,
            },
        );
    }

    fn shared_key(&self, key: &LedgerKey) -> Option<String> {
        let prefix = self.shared_prefix.as_ref()?;
        let name = self.names.get(key.budget)?;
        Some(match &key.team {
            Some(t) => format!("{prefix}{name}|{t}"),
            None => format!("{prefix}{name}"),
        })
    }

    pub(crate) fn record(
        &self,
        key: &LedgerKey,
        spent: router_core::budget::Amount,
        held_tokens: u64,
    ) {
        let Some(ids) = self.ids(key) else { return };
        let caps = self.caps.get(key.budget).copied().unwrap_or_default();
        edge::record_metric(ids[0], spent.tokens);
        edge::record_metric(ids[1], spent.pico / 1_000_000);
        edge::record_metric(ids[2], percent(&caps, spent.tokens, spent.pico));
        edge::record_metric(ids[3], held_tokens);
    }
}
