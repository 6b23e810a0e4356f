//! Lease mode of the shared ledger (`budgets.service.lease`): requests are admitted against a
//! lease this gateway holds in `llmkube-budgets` per ledger, by compare-and-swap on shared
//! data (`router_core::budget::lease`), with no callout; the root's tick reports each busy
//! lease (its use charged, a new lease taken) by one `POST /v1/lease`. A request that does not
//! fit its leases reserves per request as without leases, and marks them wanted, so the next
//! report asks for room.
//!
//! Only router and rule budgets are leased: a team's lease key would have to be created on the
//! request path, which shared data cannot do safely (see `budget.rs`). A request under a team
//! budget reserves per request.
//!
//! Shared-data keys: `llmkube.budget|<router>|lease|<budget>`, created at configuration.

use crate::budget_remote::Remote;
use filter_edge::{self as edge, table::HostStore, Level, MetricKind};
use router_core::budget::admit::{LedgerKey, Scope};
use router_core::budget::config::CompiledBudgets;
use router_core::budget::lease::{self, Lease, LeaseState, Pending, LEASE_PATH};
use router_core::budget::remote::MAX_REPLY_BYTES;
use router_core::budget::shared::SharedData;
use router_core::budget::window::Amount;
use router_core::budget::wire::LedgerState;
use std::cell::{Cell, RefCell};

/// An admitted request's part of its leases: which, and the bound it took on each.
pub(crate) struct LeaseHold {
    keys: Vec<usize>,
    bound: Amount,
}

/// The leases of one router, per worker VM.
pub(crate) struct Leases {
    lease: Lease,
    /// Per budget: the most one lease takes, `None` when the budget is not leased.
    max: Vec<Option<Amount>>,
    /// Per budget: its lease's shared-data key.
    keys: Vec<String>,
    hold_ttl_ms: u64,
    /// A lease admits nothing within this of its hold's expiry: a request admitted on it has
    /// at least this long to settle before the hold goes (half the hold TTL).
    margin_ms: u64,
    /// How long a worker's report may stay out before another worker may send it again.
    report_timeout_ms: u64,
    /// Reports sent by this worker: call token → (budget, the report).
    sent: RefCell<Vec<(u32, usize, Pending)>>,
    /// Per budget: `llmkube.budget.<budget>.lease_admitted` (requests admitted on the lease,
    /// counter) and `.lease_tokens` (the lease's size after its last report, gauge).
    admitted_ids: Vec<Option<u32>>,
    size_ids: Vec<Option<u32>>,
    /// The VM is stopping (`on_done`): leases are being released, and the host is told when
    /// the last release is answered.
    stopping: Cell<bool>,
}

fn metric(kind: MetricKind, name: &str) -> Option<u32> {
    edge::define_metric(kind, name).ok()
}

fn now_ms() -> u64 {
    edge::now_nanos() / 1_000_000
}

impl Leases {
    /// `None` when lease mode is off or no budget can be leased. Creates the lease keys that
    /// are missing (configuration time).
    pub fn configure(c: &CompiledBudgets, router: &str, timeout_ms: u64) -> Option<Leases> {
        let lease = c.lease?;
        let max: Vec<Option<Amount>> = c
            .budgets
            .iter()
            .map(|b| match b.scope {
                Scope::Team { .. } => None,
                _ => lease.max_for(&b.caps),
            })
            .collect();
        if max.iter().all(Option::is_none) {
            edge::log(
                Level::Warn,
                "model-router: budgets: lease mode is on but no budget can be leased (team budgets are not; a cap needs its lease maximum); every request reserves on its own",
            );
            return None;
        }
        let keys: Vec<String> = c
            .budgets
            .iter()
            .map(|b| format!("llmkube.budget|{router}|lease|{}", b.name))
            .collect();
        for (k, m) in keys.iter().zip(&max) {
            if m.is_some() && HostStore.get(k).is_none() {
                if let Err(e) = HostStore.set(k, &LeaseState::default().encode(), None) {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: budgets: creating lease key {k}: {e:?}"),
                    );
                }
            }
        }
        let hold_ttl_ms = c.hold_ttl_s.saturating_mul(1000);
        let per = |kind, what: &str| {
            c.budgets
                .iter()
                .zip(&max)
                .map(|(b, m)| {
                    m.and_then(|_| metric(kind, &format!("llmkube.budget.{}.{what}", b.name)))
                })
                .collect()
        };
        Some(Leases {
            admitted_ids: per(MetricKind::Counter, "lease_admitted"),
            size_ids: per(MetricKind::Gauge, "lease_tokens"),
            lease,
            max,
            keys,
            hold_ttl_ms,
            margin_ms: hold_ttl_ms / 2,
            report_timeout_ms: timeout_ms.saturating_add(1000),
            sent: RefCell::new(Vec::new()),
            stopping: Cell::new(false),
        })
    }

    /// Admits a request of bound `b` on `keys`' leases, all or nothing, when every one of its
    /// ledgers is leased. `None`: not admitted (no lease, no room, a team ledger, or shared data
    /// failed); the request reserves per request.
    pub fn admit(&self, keys: &[LedgerKey], b: Amount) -> Option<LeaseHold> {
        let mut budgets = Vec::with_capacity(keys.len());
        for k in keys {
            if k.team.is_some() || self.max.get(k.budget).copied().flatten().is_none() {
                return None;
            }
            budgets.push(k.budget);
        }
        let names: Vec<&str> = budgets.iter().map(|&i| self.keys[i].as_str()).collect();
        match lease::admit_all(&HostStore, &names, b, now_ms(), self.margin_ms) {
            Ok(true) => {
                for &i in &budgets {
                    if let Some(Some(id)) = self.admitted_ids.get(i) {
                        edge::increment_metric(*id, 1);
                    }
                }
                Some(LeaseHold {
                    keys: budgets,
                    bound: b,
                })
            }
            Ok(false) => None,
            Err(e) => {
                edge::log(
                    Level::Warn,
                    &format!(
                        "model-router: budgets: lease admission: {e:?}; reserving per request"
                    ),
                );
                None
            }
        }
    }

    /// The request admitted on leases ended: `charge` its usage (or estimate), `None` a release.
    pub fn end(&self, h: &LeaseHold, charge: Option<Amount>) {
        let names: Vec<&str> = h.keys.iter().map(|&i| self.keys[i].as_str()).collect();
        if let Err(e) =
            lease::settle_all(&HostStore, &names, h.bound, charge.unwrap_or(Amount::ZERO))
        {
            // The lease keeps the bound counted as admitted: room lost until it is reported,
            // never room gained.
            edge::log(
                Level::Error,
                &format!("model-router: budgets: lease settle: {e:?}"),
            );
        }
    }

    /// The root's tick: sends the report of every lease that is due and that no other worker
    /// is reporting (the `reporting` deadline, taken by compare-and-swap).
    pub fn report(&self, c: &CompiledBudgets, remote: &Remote) {
        self.send_reports(c, remote, false);
    }

    /// The VM is stopping: every lease this gateway holds is reported and released (its
    /// requests in flight keep a hold of what they were admitted with). `true` when releases
    /// went out: the host is told it may stop once they are answered (`proxy_done`).
    pub fn release_all(&self, c: &CompiledBudgets, remote: &Remote) -> bool {
        self.stopping.set(true);
        self.send_reports(c, remote, true);
        !self.sent.borrow().is_empty()
    }

    fn send_reports(&self, c: &CompiledBudgets, remote: &Remote, release: bool) {
        let now = now_ms();
        let router = remote.router();
        for (budget, max) in self.max.iter().enumerate() {
            let Some(max) = *max else { continue };
            let key = &self.keys[budget];
            let new_id = remote.new_id();
            let until = now.saturating_add(self.report_timeout_ms);
            let taken = lease::update(&HostStore, key, |s| {
                let due = if release {
                    s.release_due(now, &new_id)
                } else {
                    s.due(now, &self.lease, max, self.hold_ttl_ms, &new_id)
                };
                match due {
                    Some(r) => {
                        let old = s.id.clone();
                        s.start(r.clone(), until);
                        (true, Some((r, old)))
                    }
                    None => (false, None),
                }
            });
            let (report, old) = match taken {
                Ok(Some(t)) => t,
                Ok(None) => continue,
                Err(e) => {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: budgets: lease report: {e:?}"),
                    );
                    continue;
                }
            };
            let sent = lease::lease_body(router, c, budget, &old, &report, self.lease.unheld)
                .ok_or_else(|| "no such budget".to_string())
                .and_then(|body| remote.send(LEASE_PATH, &body));
            match sent {
                Ok(token) => self.sent.borrow_mut().push((token, budget, report)),
                Err(why) => {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: budgets: lease report not sent: {why}"),
                    );
                    self.settle_report(budget, &report, None, false);
                }
            }
        }
    }

    /// A report's answer (root `on_http_call_response`). `None`: not a lease call. Otherwise
    /// the ledger's state for the gauges, when the service answered one.
    pub fn answered(
        &self,
        token: u32,
        num_headers: usize,
        body_size: usize,
    ) -> Option<Option<(usize, LedgerState)>> {
        let (budget, report) = {
            let mut sent = self.sent.borrow_mut();
            let i = sent.iter().position(|(t, _, _)| *t == token)?;
            let (_, b, r) = sent.swap_remove(i);
            (b, r)
        };
        let (status, body) = if num_headers == 0 {
            (0, Vec::new())
        } else {
            let headers = edge::call_response_headers().unwrap_or_default();
            let body = edge::call_response_body(body_size.min(MAX_REPLY_BYTES)).unwrap_or_default();
            (edge::response_status(&headers), body)
        };
        let out = Some(match lease::read_lease(status, &body) {
            Ok((granted, state)) => {
                self.settle_report(budget, &report, Some(granted), false);
                if let Some(Some(id)) = self.size_ids.get(budget) {
                    edge::record_metric(*id, granted.tokens);
                }
                Some((budget, state))
            }
            Err(f) => {
                edge::log(
                    Level::Warn,
                    &format!(
                        "model-router: budgets: lease report failed ({}){}",
                        f.why,
                        if f.in_doubt {
                            "; the lease admits nothing until it is sent again and answered"
                        } else {
                            ""
                        }
                    ),
                );
                self.settle_report(budget, &report, None, f.in_doubt);
                None
            }
        });
        if self.stopping.get() && self.sent.borrow().is_empty() {
            // The last release is answered: the VM may go.
            let _ = proxy_wasm::hostcalls::done();
        }
        out
    }

    fn settle_report(&self, budget: usize, r: &Pending, granted: Option<Amount>, in_doubt: bool) {
        let ttl = self.hold_ttl_ms;
        let done = lease::update(&HostStore, &self.keys[budget], |s| match granted {
            Some(g) => (s.applied(r, g, ttl), ()),
            None => {
                let before = s.clone();
                s.failed(r, in_doubt);
                (*s != before, ())
            }
        });
        if let Err(e) = done {
            edge::log(
                Level::Error,
                &format!("model-router: budgets: lease state: {e:?}"),
            );
        }
    }
}

impl LeaseHold {
    /// The budgets (indexes) whose leases the request was admitted on.
    pub fn budgets(&self) -> &[usize] {
        &self.keys
    }
}
