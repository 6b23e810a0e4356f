//! Lease mode of the shared ledger (`budgets.service.lease`): requests are admitted against a
//! lease this gateway holds in `llmkube-budgets` per ledger, by compare-and-swap on shared
//! data (`router_core::budget::shared_lease`), with no callout; the root's tick reports each busy
//! lease (its use charged, a new lease taken) by one `POST /v1/lease`. A request that does not
//! fit its leases reserves per request as without leases, and marks them wanted, so the next
//! report asks for room. When only holds refuse that reserve (what is spent leaves room for it)
//! while leases hold room, the service asks the leases for their unused room back (their next
//! reports take none) and tries the reserve again for up to `Lease::reserve_wait_ms`, so the
//! room a lease does not use never refuses a request that per-request mode would admit.
//!
//! Team budgets are leased per team through a fixed table of slots per team budget
//! (`router_core::budget::lease_slots`): a slot's key is created at configuration (shared
//! data cannot safely create one on the request path), a team binds a free slot in the
//! admission's compare-and-swap, and the slot frees once its lease is released idle. A team
//! that finds no free slot reserves per request.
//!
//! Shared-data keys, created at configuration: `llmkube.budget|<router>|lease|<budget>` for a
//! router or rule budget, `llmkube.budget|<router>|lease|<budget>|<slot>` per team-lease slot.

use crate::budget_remote::Remote;
use filter_edge::{self as edge, shared_table::HostStore, Level, MetricKind};
use router_core::budget::admit::{LedgerKey, Scope};
use router_core::budget::compiled::CompiledBudgets;
use router_core::budget::lease_config::Lease;
use router_core::budget::lease_slots;
use router_core::budget::protocol::LedgerState;
use router_core::budget::remote::MAX_REPLY_BYTES;
use router_core::budget::shared_lease::{self, Admission, LeaseState, Pending, LEASE_PATH};
use router_core::budget::window::Amount;
use router_core::shared_data::SharedData;
use std::cell::{Cell, RefCell};

/// An admitted request's part of its leases: which (units), their budgets, and the bound it
/// took on each.
pub(crate) struct LeaseHold {
    units: Vec<usize>,
    budgets: Vec<usize>,
    bound: Amount,
}

/// One lease in shared data: a router or rule budget's, or one slot of a team budget's.
struct Unit {
    budget: usize,
    key: String,
    /// A team-lease slot: its lease is on the team its state names.
    team: bool,
}

/// How long a team that found no free slot reserves per request before it looks again.
const NO_SLOT_RETRY_MS: u64 = 1000;

/// Per team budget: team → (its slot, or none found, and until when that answer is trusted).
type SlotCache = Vec<fnv::FnvHashMap<String, (Option<usize>, u64)>>;

/// The leases of one router, per worker VM.
pub(crate) struct Leases {
    lease: Lease,
    /// Per budget: the most one lease takes, `None` when the budget is not leased.
    max: Vec<Option<Amount>>,
    /// Every lease kept: one per router or rule budget, `team_slots` per team budget.
    units: Vec<Unit>,
    /// Per budget: the index of its first unit (a team budget's slot `s` is `first + s`).
    first: Vec<usize>,
    /// Team → slot as this worker last found it; the slot's state decides, this only saves
    /// the look-up (a stale entry is corrected when admission finds the slot another team's).
    slots: RefCell<SlotCache>,
    hold_ttl_ms: u64,
    /// A lease admits nothing within this of its hold's expiry: a request admitted on it has
    /// at least this long to settle before the hold goes (half the hold TTL).
    margin_ms: u64,
    /// How long a worker's report may stay out before another worker may send it again.
    report_timeout_ms: u64,
    /// Reports sent by this worker: call token → (unit, the report).
    sent: RefCell<Vec<(u32, usize, Pending)>>,
    /// Per budget: `llmkube.budget.<budget>.lease_admitted` (requests admitted on the lease,
    /// counter) and `.lease_tokens` (the lease's size after its last report, gauge).
    admitted_ids: Vec<Option<u32>>,
    size_ids: Vec<Option<u32>>,
    /// Per team budget: `.lease_no_slot` (requests of a team that found every candidate slot
    /// another team's and reserved per request, counter): the sign `team_slots` is too small.
    no_slot_ids: Vec<Option<u32>>,
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
    pub fn configure(
        c: &CompiledBudgets,
        lease: &Lease,
        router: &str,
        timeout_ms: u64,
    ) -> Option<Leases> {
        let lease = *lease;
        let max: Vec<Option<Amount>> = c
            .budgets
            .iter()
            .map(|b| match b.scope {
                Scope::Team { .. } if lease.team_slots == 0 => None,
                _ => lease.max_for(&b.caps),
            })
            .collect();
        if max.iter().all(Option::is_none) {
            edge::log(
                Level::Warn,
                "model-router: budgets: lease mode is on but no budget can be leased (a cap needs its lease maximum; team budgets need team_slots > 0); every request reserves on its own",
            );
            return None;
        }
        let mut units = Vec::new();
        let mut first = Vec::with_capacity(c.budgets.len());
        for (i, (b, m)) in c.budgets.iter().zip(&max).enumerate() {
            first.push(units.len());
            if m.is_none() {
                continue;
            }
            let base = format!("llmkube.budget|{router}|lease|{}", b.name);
            match b.scope {
                Scope::Team { .. } => units.extend((0..lease.team_slots).map(|s| Unit {
                    budget: i,
                    key: format!("{base}|{s}"),
                    team: true,
                })),
                _ => units.push(Unit {
                    budget: i,
                    key: base,
                    team: false,
                }),
            }
        }
        for u in &units {
            if matches!(HostStore.get(&u.key), Ok(None)) {
                if let Err(e) = HostStore.set(&u.key, &LeaseState::default().encode(), None) {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: budgets: creating lease key {}: {e:?}", u.key),
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
            no_slot_ids: c
                .budgets
                .iter()
                .zip(&max)
                .map(|(b, m)| match (&b.scope, m) {
                    (Scope::Team { .. }, Some(_)) => metric(
                        MetricKind::Counter,
                        &format!("llmkube.budget.{}.lease_no_slot", b.name),
                    ),
                    _ => None,
                })
                .collect(),
            lease,
            max,
            units,
            first,
            slots: RefCell::new(SlotCache::default()),
            hold_ttl_ms,
            margin_ms: hold_ttl_ms / 2,
            report_timeout_ms: timeout_ms.saturating_add(1000),
            sent: RefCell::new(Vec::new()),
            stopping: Cell::new(false),
        })
    }

    /// Admits a request of bound `b` on `keys`' leases, all or nothing, when every one of its
    /// ledgers is leased. `None`: not admitted (no lease, no room, a team without a slot, or
    /// shared data failed); the request reserves per request.
    pub fn admit(&self, keys: &[LedgerKey], b: Amount) -> Option<LeaseHold> {
        let now = now_ms();
        let mut units = Vec::with_capacity(keys.len());
        for k in keys {
            self.max.get(k.budget).copied().flatten()?;
            let first = *self.first.get(k.budget)?;
            let unit = match &k.team {
                Some(team) => match self.team_slot(k.budget, team, now) {
                    Some(s) => first + s,
                    None => {
                        if let Some(Some(id)) = self.no_slot_ids.get(k.budget) {
                            edge::increment_metric(*id, 1);
                        }
                        return None;
                    }
                },
                None => first,
            };
            units.push(unit);
        }
        let names: Vec<(&str, &str)> = units
            .iter()
            .zip(keys)
            .map(|(&u, k)| (self.units[u].key.as_str(), k.team.as_deref().unwrap_or("")))
            .collect();
        match shared_lease::admit_all(&HostStore, &names, b, now, self.margin_ms) {
            Ok(Admission::Admitted) => {
                let budgets: Vec<usize> = keys.iter().map(|k| k.budget).collect();
                for &i in &budgets {
                    if let Some(Some(id)) = self.admitted_ids.get(i) {
                        edge::increment_metric(*id, 1);
                    }
                }
                Some(LeaseHold {
                    units,
                    budgets,
                    bound: b,
                })
            }
            Ok(Admission::NoRoom) => None,
            Ok(Admission::Taken(i)) => {
                // The slot this worker knew is another team's now: look again next time.
                if let Some(k) = keys.get(i) {
                    if let (Some(team), Some(m)) =
                        (&k.team, self.slots.borrow_mut().get_mut(k.budget))
                    {
                        m.remove(team.as_str());
                    }
                }
                None
            }
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

    /// The slot of `team` in team budget `budget` (relative to its first), as this worker
    /// knows it or finds it (`lease_slots::find`, reading the team's candidate slots). `None`:
    /// every candidate is another team's; looked up again after [`NO_SLOT_RETRY_MS`].
    fn team_slot(&self, budget: usize, team: &str, now: u64) -> Option<usize> {
        let known = self
            .slots
            .borrow()
            .get(budget)
            .and_then(|m| m.get(team).copied());
        if let Some((slot, until)) = known {
            if now < until {
                return slot;
            }
        }
        let n = self.lease.team_slots;
        let first = *self.first.get(budget)?;
        let found = lease_slots::find(&HostStore, team, n, |s| {
            self.units
                .get(first + s)
                .map_or_else(String::new, |u| u.key.clone())
        });
        let until = match found {
            Some(_) => u64::MAX,
            None => now.saturating_add(NO_SLOT_RETRY_MS),
        };
        let mut slots = self.slots.borrow_mut();
        if slots.len() <= budget {
            slots.resize_with(budget + 1, Default::default);
        }
        let m = &mut slots[budget];
        // Bounded: teams come and go; forgetting only costs a look-up.
        if m.len() >= 4 * n.max(64) {
            m.clear();
        }
        m.insert(team.to_string(), (found, until));
        found
    }

    /// The request admitted on leases ended: `charge` its usage (or estimate), `None` a release.
    pub fn end(&self, h: &LeaseHold, charge: Option<Amount>) {
        let names: Vec<&str> = h
            .units
            .iter()
            .map(|&i| self.units[i].key.as_str())
            .collect();
        if let Err(e) =
            shared_lease::settle_all(&HostStore, &names, h.bound, charge.unwrap_or(Amount::ZERO))
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
        for (unit, u) in self.units.iter().enumerate() {
            let Some(max) = self.max.get(u.budget).copied().flatten() else {
                continue;
            };
            let new_id = remote.new_id();
            let until = now.saturating_add(self.report_timeout_ms);
            let taken = shared_lease::update(&HostStore, &u.key, |s| {
                if u.team && s.team.is_empty() {
                    // A free slot: nothing on it to report.
                    return (false, None);
                }
                let due = if release {
                    s.release_due(now, &new_id)
                } else {
                    s.due(now, &self.lease, max, self.hold_ttl_ms, &new_id)
                };
                match due {
                    Some(r) => {
                        let old = s.id.clone();
                        let team = s.team.clone();
                        s.start(r.clone(), until);
                        (true, Some((r, old, team)))
                    }
                    None => (false, None),
                }
            });
            let (report, old, team) = match taken {
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
            let body = shared_lease::lease_body(
                router,
                c,
                u.budget,
                &team,
                &old,
                &report,
                self.lease.unheld,
            );
            let sent = body
                .ok_or_else(|| "no such budget".to_string())
                .and_then(|body| remote.send(LEASE_PATH, &body));
            match sent {
                Ok(token) => self.sent.borrow_mut().push((token, unit, report)),
                Err(why) => {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: budgets: lease report not sent: {why}"),
                    );
                    self.settle_report(unit, &report, None, false);
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
        let (unit, report) = {
            let mut sent = self.sent.borrow_mut();
            let i = sent.iter().position(|(t, _, _)| *t == token)?;
            let (_, u, r) = sent.swap_remove(i);
            (u, r)
        };
        let budget = self.units.get(unit).map_or(usize::MAX, |u| u.budget);
        let (status, body) = if num_headers == 0 {
            (0, Vec::new())
        } else {
            let headers = edge::call_response_headers().unwrap_or_default();
            let body = edge::call_response_body(body_size.min(MAX_REPLY_BYTES)).unwrap_or_default();
            (edge::response_status(&headers), body)
        };
        let out = Some(match shared_lease::read_lease(status, &body) {
            Ok((granted, state)) => {
                self.settle_report(unit, &report, Some(granted), false);
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
                self.settle_report(unit, &report, None, f.in_doubt);
                None
            }
        });
        if self.stopping.get() && self.sent.borrow().is_empty() {
            // The last release is answered: the VM may go.
            let _ = proxy_wasm::hostcalls::done();
        }
        out
    }

    fn settle_report(&self, unit: usize, r: &Pending, granted: Option<Amount>, in_doubt: bool) {
        let ttl = self.hold_ttl_ms;
        let Some(u) = self.units.get(unit) else {
            return;
        };
        let done = shared_lease::update(&HostStore, &u.key, |s| match granted {
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
        &self.budgets
    }
}
