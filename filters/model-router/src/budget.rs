//! The budget step of a request (`spec.policy.budgets`, docs/budgets.md): after routing has
//! decided, reserve the request's upper bound on every ledger it is under (all or nothing) or
//! answer 429 before anything goes upstream; on the response, read usage as the body streams by
//! and settle at the serving backend's price; release what never settled, in `on_log`.
//! `router_core::budget` decides every step; this module moves bytes.
//!
//! Ledgers are reached through [`LedgerBackend`]. `Local` keeps them in this Envoy's shared
//! data (exact across workers by compare-and-swap, `router_core::budget::shared`). Another kind
//! (the shared `llmkube-budgets` service) implements the same three operations — reserve all,
//! settle, release — by callout.
//!
//! Shared-data keys (`<prefix>` = `llmkube.budget|<router>|`): `<prefix><budget>` for router and
//! rule budgets; for a team budget a table `<prefix><budget>|teams` (team → slot,
//! `router_core::budget::table`) and one ledger per slot, `<prefix><budget>#<slot>`. Every key is
//! created at configure time: Envoy accepts any CAS token for a key that does not exist, so
//! creating keys on the request path could lose a concurrent update. A slot is reused only once
//! its old team's ledger has fully rolled off, so a reused slot's ledger is already empty.

use crate::budget_lease::{LeaseHold, Leases};
use crate::budget_remote::{PendingEnd, Remote, RemoteHold};
use crate::metrics::BudgetStats;
use filter_edge::{self as edge, table::HostStore, Buffer, Level, Map};
use router_core::audit::{AuditRecord, AuditTokens};
use router_core::budget::admit::{admit_all, LedgerKey, LedgerStore, Refusal, Scope};
use router_core::budget::bound::request_facts;
use router_core::budget::config::CompiledBudgets;
use router_core::budget::inject::{edits, stream_needs_asking, Splice};
use router_core::budget::ledger::{Hold, Shape, Wait};
use router_core::budget::money::format_usd;
use router_core::budget::plan::{charged, plan, Attempt, BudgetPlan};
use router_core::budget::remote::Admission;
use router_core::budget::reply::{self, Refused};
use router_core::budget::shared::{
    create_missing, SharedData, SharedError, SharedLedger, SharedLedgers,
};
use router_core::budget::table::{TableError, TeamTable};
use router_core::budget::template;
use router_core::budget::usage::{charge, BodyKind, Charge, Usage, UsageReader};
use router_core::budget::window::Amount;
use router_core::budget::worker_lease::{LeasedLedgers, Leases as WorkerLeases};
use router_core::errors::ApiError;
use router_core::router::{RequestHeaders, Router};
use router_core::scan::Fields;
use std::cell::RefCell;
use std::rc::Rc;

/// Per team budget (by index), team → its slot, a time until which the team table is known
/// to keep that slot the team's (`quiet_until` as this worker last wrote or read it), and the
/// slot ledger's shared-data key (built once per team, shared by the requests that hold it).
/// Keyed by the team alone so a lookup borrows the request's team instead of building a key.
type SlotCache = Vec<fnv::FnvHashMap<String, Known>>;

/// A team's slot as this worker knows it ([`SlotCache`]).
#[derive(Clone)]
struct Known {
    slot: usize,
    until: u64,
    name: Rc<str>,
}

/// Where ledgers live.
pub(crate) enum LedgerBackend {
    /// This Envoy's shared data, shared by its workers.
    Local(HostStore),
    /// `llmkube-budgets` (`budgets.service`), shared by every gateway replica.
    Remote(Remote),
}

/// The budgets of one router, per worker VM.
pub(crate) struct Budgets {
    compiled: CompiledBudgets,
    ledgers: LedgerBackend,
    prefix: String,
    /// Per budget, the shared-data key of its ledger (router and rule budgets; a team budget's
    /// ledgers are per slot): built at configuration, so a request's holds share it.
    fixed: Vec<Rc<str>>,
    /// Per budget, its ledgers' geometry.
    shapes: Vec<Shape>,
    /// Per backend index: its price and `modelInfo.contextLength`.
    attempts: Vec<Attempt>,
    stats: BudgetStats,
    /// The team slots this worker knows, so a request of a known team neither reads nor writes
    /// the team table ([`Budgets::team_slot`]).
    slots: RefCell<SlotCache>,
    /// Lease mode of the shared ledger (`budgets.service.lease`).
    leases: Option<Leases>,
    /// This worker's leases on the embedded ledgers (the default; not with `budgets.per_request`).
    worker: Option<RefCell<WorkerLeases>>,
}

/// What the client gets instead of an upstream answer.
pub(crate) enum Answer {
    /// 429 with `Retry-After`.
    Refused(Refused),
    /// 503 `budget_store_unavailable` (the ledgers cannot be read or written).
    Unavailable(ApiError),
}

/// One ledger an admitted request holds, by key in the ledger store.
struct Held {
    key: LedgerKey,
    /// The shared-data key of its ledger (for a team: of its slot).
    shared: Rc<str>,
    /// `None` in charge-after mode, which holds nothing.
    hold: Option<Hold>,
    /// For a team ledger: until when the team table keeps this slot the team's.
    owned_until: u64,
}

/// An admitted request, from admission to settlement.
pub(crate) struct Metered {
    held: Vec<Held>,
    request_bytes: u64,
    /// The gateway added `include_usage`: the usage-only chunk is not the client's.
    strip: bool,
    reader: Option<UsageReader>,
    /// The backend whose response headers came through with a 2xx.
    served: Option<usize>,
    out: Vec<u8>,
    /// The reservation on `llmkube-budgets` (remote ledgers only).
    remote: Option<RemoteHold>,
    /// Admitted on this gateway's leases instead (lease mode).
    lease: Option<LeaseHold>,
    /// The holds are on this worker's leases of the embedded ledgers: they end in its memory.
    on_worker_lease: bool,
    /// The settle this request sent the shared ledger itself, by call token: the last response
    /// chunk waits for its answer.
    ending: Option<(u32, PendingEnd)>,
}

impl Metered {
    /// The reservation was sent and its answer is still out: the request waits for it.
    pub fn awaiting(&self) -> bool {
        self.remote.as_ref().is_some_and(|h| h.pending.is_some())
    }
}

/// What admission did to the request: the holds, and the edit to make to its body.
pub(crate) struct Admitted {
    pub metered: Metered,
    /// `max_tokens` set, `include_usage` asked: the splice of the body's head to send upstream.
    pub splice: Option<Splice>,
}

/// The request as the budget step reads it.
pub(crate) struct RequestView<'a> {
    pub rule: Option<&'a str>,
    pub headers: &'a RequestHeaders,
    /// The body, when the filter holds it whole (one that arrived in pieces is not kept).
    pub body: Option<&'a [u8]>,
    pub body_len: usize,
    pub fields: &'a Fields,
    /// The attempt order (backend indexes).
    pub order: &'a [usize],
    pub path: &'a [u8],
}

/// The chat-template margin of a request with `tools` or tool calls, from those values' bytes
/// (the body the filter holds, else read back from the host's buffer).
fn template_margin(r: &RequestView) -> Result<u64, Answer> {
    let read = |span: Option<router_core::scan::Span>| -> Result<Option<Vec<u8>>, Answer> {
        let Some((start, end)) = span else {
            return Ok(None);
        };
        let len = end.saturating_sub(start);
        if let Some(b) = r.body {
            return Ok(b.get(start..end).map(<[u8]>::to_vec));
        }
        edge::buffer(Buffer::RequestBody, start, len).map_err(|e| {
            let why = format!("reading the request body: {e}");
            edge::log(Level::Error, &format!("model-router: budgets: {why}"));
            Answer::Unavailable(ApiError::internal(&why))
        })
    };
    let spans = &r.fields.spans;
    let tools = read(spans.tools)?;
    let messages = read(spans.messages)?;
    let shape = template::shape_of(
        tools.as_deref(),
        messages.as_deref(),
        r.fields.knobs.tool_calls,
    );
    Ok(template::margin(&shape))
}

fn now_ms() -> u64 {
    edge::now_nanos() / 1_000_000
}

fn unavailable(e: &SharedError) -> Answer {
    let why = match e {
        SharedError::Missing(_) => "a ledger is missing from shared data",
        SharedError::Corrupt(_) => "a ledger does not decode",
        SharedError::Contended(_) => "shared data refused the update",
    };
    edge::log(Level::Error, &format!("model-router: budgets: {e:?}"));
    Answer::Unavailable(reply::store_unavailable(why))
}

impl Budgets {
    /// Compiles the router's budgets and creates every ledger key that is missing. `Ok(None)`:
    /// the router has no budgets.
    pub fn configure(router: &Router) -> Result<Option<Budgets>, String> {
        let Some(config) = &router.config.budgets else {
            return Ok(None);
        };
        let compiled = config.compile().map_err(|e| format!("budgets: {e}"))?;
        if compiled.budgets.is_empty() {
            return Ok(None);
        }
        let attempts = (0..router.backends_len())
            .map(|i| {
                let b = &router.config.backends[i];
                Attempt {
                    price: compiled.price(&b.name),
                    context_length: b.model_info.as_ref().and_then(|m| m.context_length),
                }
            })
            .collect();
        let prefix = format!("llmkube.budget|{}|", router.config.router);
        let stats = BudgetStats::new(&compiled.budgets);
        let mut budgets = Budgets {
            fixed: Vec::new(),
            shapes: Vec::new(),
            stats: match &config.service {
                Some(_) => stats.shared_by_workers(format!("{prefix}gauge|"), compiled.max_teams),
                None => stats,
            },
            prefix,
            ledgers: match &config.service {
                Some(service) => LedgerBackend::Remote(Remote::new(
                    &router.config.router,
                    service,
                    compiled.hold_ttl_s,
                )),
                None => LedgerBackend::Local(HostStore),
            },
            attempts,
            leases: config
                .service
                .as_ref()
                .and_then(|s| Leases::configure(&compiled, &router.config.router, s.timeout_ms)),
            worker: compiled.worker_leases.then(|| {
                RefCell::new(if compiled.worker_leases_unheld {
                    WorkerLeases::unsafe_unheld()
                } else {
                    WorkerLeases::default()
                })
            }),
            compiled,
            slots: RefCell::new(SlotCache::default()),
        };
        let ttl = budgets.compiled.hold_ttl_s;
        budgets.shapes = budgets
            .compiled
            .budgets
            .iter()
            .map(|b| b.shape(ttl))
            .collect();
        budgets.fixed = (0..budgets.compiled.budgets.len())
            .map(|i| Rc::from(budgets.ledger_name(i, None)))
            .collect();
        if matches!(budgets.ledgers, LedgerBackend::Local(_)) {
            budgets.create_keys()?;
        }
        Ok(Some(budgets))
    }

    fn data(&self) -> &HostStore {
        match &self.ledgers {
            LedgerBackend::Local(store) => store,
            // Remote ledgers never reach shared data; the same (stateless) handle serves the
            // paths both kinds share, which then find no local ledgers.
            LedgerBackend::Remote(_) => &HostStore,
        }
    }

    fn ledger_name(&self, budget: usize, slot: Option<usize>) -> String {
        // Built by hand, not `format!`: this runs for every request's ledgers.
        let name = &self.compiled.budgets[budget].name;
        let mut key = String::with_capacity(self.prefix.len() + name.len() + 6);
        key.push_str(&self.prefix);
        key.push_str(name);
        if let Some(s) = slot {
            key.push('#');
            push_decimal(&mut key, s as u64);
        }
        key
    }

    fn table_name(&self, budget: usize) -> String {
        format!(
            "{}{}|teams",
            self.prefix, self.compiled.budgets[budget].name
        )
    }

    fn shared_ledger<'k>(&self, budget: usize, key: &'k str) -> SharedLedger<'k> {
        let b = &self.compiled.budgets[budget];
        SharedLedger {
            key,
            shape: self.shape(budget),
            caps: b.caps,
        }
    }

    /// Budget `budget`'s ledger geometry (computed at configuration: every update needs it).
    fn shape(&self, budget: usize) -> Shape {
        self.shapes[budget]
    }

    fn create_keys(&self) -> Result<(), String> {
        let data = self.data();
        let mut names = Vec::new();
        for (i, b) in self.compiled.budgets.iter().enumerate() {
            if matches!(b.scope, Scope::Team { .. }) {
                let table = self.table_name(i);
                if data.get(&table).is_none() {
                    let mut empty = Vec::new();
                    TeamTable::default().encode(&mut empty);
                    data.set(&table, &empty, None)
                        .map_err(|e| format!("budgets: creating {table}: {e:?}"))?;
                }
                for slot in 0..self.compiled.max_teams {
                    names.push((i, self.ledger_name(i, Some(slot))));
                }
            } else {
                names.push((i, self.ledger_name(i, None)));
            }
        }
        let ledgers: Vec<_> = names
            .iter()
            .map(|(i, name)| self.shared_ledger(*i, name))
            .collect();
        create_missing(data, &ledgers).map_err(|e| format!("budgets: creating ledgers: {e:?}"))?;
        self.outlast_tables();
        Ok(())
    }

    /// At configuration (the budget's window may have changed since the team tables were
    /// written): every slot stays its team's while its ledger, read under the current window,
    /// still counts anything (`TeamTable::outlast`). Best effort: a table or ledger that cannot
    /// be read is left as it is, and the request path reports it.
    fn outlast_tables(&self) {
        let data = self.data();
        let now = now_ms();
        for (i, b) in self.compiled.budgets.iter().enumerate() {
            if !matches!(b.scope, Scope::Team { .. }) {
                continue;
            }
            let shape = b.shape(self.compiled.hold_ttl_s);
            let key = self.table_name(i);
            for _ in 0..router_core::budget::shared::MAX_CAS_ATTEMPTS {
                let Some((raw, cas)) = data.get(&key) else {
                    break;
                };
                let Ok(mut table) = TeamTable::decode(&raw, self.compiled.max_teams) else {
                    break;
                };
                let changed = table.outlast(now, |slot| {
                    let (bytes, _) = data.get(&self.ledger_name(i, Some(slot)))?;
                    let l = router_core::budget::Ledger::from_vec(bytes, &shape, now).ok()?;
                    Some(l.quiet_at(&shape, now))
                });
                if !changed {
                    break;
                }
                let mut buf = Vec::new();
                table.encode(&mut buf);
                match data.set(&key, &buf, Some(cas)) {
                    Err(router_core::budget::shared::SetError::CasMismatch) => continue,
                    _ => break,
                }
            }
        }
    }

    /// The store over the ledgers `find` names (by their shared-data key).
    fn store<'s>(
        &'s self,
        find: impl Fn(&LedgerKey) -> Option<&'s str> + 's,
        now_ms: u64,
    ) -> SharedLedgers<'s, HostStore, impl Fn(&LedgerKey) -> Option<SharedLedger<'s>> + 's> {
        SharedLedgers {
            data: self.data(),
            ledger: move |k: &LedgerKey| find(k).map(|name| self.shared_ledger(k.budget, name)),
            now_ms,
        }
    }

    /// The slot of `team` in team budget `budget`, taking one if it has none, and until when
    /// the table keeps it the team's. Table entries are only given to another team once their
    /// `quiet_until` has passed, and it only grows, so a slot this worker knows the table keeps
    /// past what this request needs is still the team's: no hostcall. Otherwise the table is
    /// updated (compare-and-swap), with `quiet_until` pushed a window bucket past what this
    /// request needs, so a busy team's entry is written about once per bucket per worker (a
    /// team's slot is then kept up to one bucket longer before another team may take it).
    fn team_slot(&self, budget: usize, team: &str, now_ms: u64) -> Result<Known, Answer> {
        let shape = self.shape(budget);
        let needed = TeamTable::quiet_bound(&shape, now_ms);
        let known = self
            .slots
            .borrow()
            .get(budget)
            .and_then(|m| m.get(team).cloned());
        if let Some(k) = known.as_ref().filter(|k| k.until >= needed) {
            return Ok(k.clone());
        }
        let until = needed.saturating_add(shape.window.width_ms);
        let slot = self.claim_slot(budget, team, until, now_ms)?;
        let name = match known {
            // The same slot as before: its name is already built.
            Some(k) if k.slot == slot => k.name,
            _ => Rc::from(self.ledger_name(budget, Some(slot))),
        };
        let known = Known { slot, until, name };
        let mut slots = self.slots.borrow_mut();
        if slots.len() <= budget {
            slots.resize_with(budget + 1, Default::default);
        }
        let teams = &mut slots[budget];
        // Bounded: teams that went quiet are forgotten with the rest.
        if teams.len() >= self.compiled.max_teams {
            teams.clear();
        }
        teams.insert(team.to_string(), known.clone());
        Ok(known)
    }

    /// Gives `team` its slot in the table of team budget `budget`, busy until at least
    /// `until` (compare-and-swap on the team table).
    fn claim_slot(
        &self,
        budget: usize,
        team: &str,
        until: u64,
        now_ms: u64,
    ) -> Result<usize, Answer> {
        let data = self.data();
        let key = self.table_name(budget);
        let b = &self.compiled.budgets[budget];
        let max = self.compiled.max_teams;
        let mut buf = Vec::new();
        for _ in 0..router_core::budget::shared::MAX_CAS_ATTEMPTS {
            let (raw, cas) = data
                .get(&key)
                .ok_or_else(|| unavailable(&SharedError::Missing(key.clone())))?;
            let mut table = TeamTable::decode(&raw, max)
                .map_err(|_| unavailable(&SharedError::Corrupt(key.clone())))?;
            let slot = match table.admit(team, until, now_ms, max) {
                Ok(s) => s,
                Err(TableError::Full { max }) => {
                    let free_at = table.next_free_at().unwrap_or(now_ms);
                    let wait = free_at.saturating_sub(now_ms).div_ceil(1000);
                    self.stats.refused(budget);
                    return Err(Answer::Refused(reply::teams_full(&b.name, max, wait)));
                }
                Err(TableError::Corrupt) => {
                    return Err(unavailable(&SharedError::Corrupt(key.clone())))
                }
            };
            buf.clear();
            table.encode(&mut buf);
            match data.set(&key, &buf, Some(cas)) {
                Ok(()) => return Ok(slot.index),
                Err(router_core::budget::shared::SetError::CasMismatch) => continue,
                Err(_) => break,
            }
        }
        Err(unavailable(&SharedError::Contended(key)))
    }

    fn label(&self, key: &LedgerKey) -> String {
        let name = &self.compiled.budgets[key.budget].name;
        match &key.team {
            // By hand, not `format!` (every admitted team request has one).
            Some(t) => {
                let mut label = String::with_capacity(name.len() + 1 + t.len());
                label.push_str(name);
                label.push('/');
                label.push_str(t);
                label
            }
            None => name.clone(),
        }
    }

    /// Admission. `Ok(None)`: no budget applies, the request goes as it is.
    pub fn admit(
        &self,
        r: &RequestView,
        audit: &mut AuditRecord,
    ) -> Result<Option<Admitted>, Answer> {
        let mut facts = request_facts(r.body_len, r.fields);
        if facts.template_needs_shape {
            facts.template_margin = template_margin(r)?;
        }
        let attempts = r
            .order
            .iter()
            .filter_map(|&b| self.attempts.get(b).copied());
        let Some(p) = plan(
            &self.compiled,
            r.rule,
            |h| r.headers.first(h),
            &facts,
            attempts,
        ) else {
            return Ok(None);
        };
        // Before any hold: a body that cannot be edited holds nothing.
        let splice = self.splice(r, &facts, &p)?;
        if let LedgerBackend::Remote(remote) = &self.ledgers {
            audit.budgets = p.keys.iter().map(|k| self.label(k)).collect();
            if let Some(hold) = self
                .leases
                .as_ref()
                .and_then(|l| l.admit(&p.keys, p.amount))
            {
                // Covered by this gateway's leases: no callout.
                let mut a = admitted(&facts, splice, Vec::new(), None);
                a.metered.lease = Some(hold);
                return Ok(Some(a));
            }
            let id = remote.new_id();
            let pending = match remote.reserve(&self.compiled, &p.keys, p.amount, &id) {
                Ok(token) => RemoteHold {
                    keys: p.keys.clone(),
                    pending: Some(token),
                    reservation: id,
                },
                Err(why) => {
                    return self
                        .store_unavailable(remote, &p.keys, &why, audit)
                        .map(|()| None);
                }
            };
            return Ok(Some(admitted(&facts, splice, Vec::new(), Some(pending))));
        }
        let now = now_ms();
        // Per key of `p.keys`, in its order: the ledger's shared-data name and until when the
        // team table keeps its slot (no copy of the key itself).
        let mut names: Vec<(Rc<str>, u64)> = Vec::with_capacity(p.keys.len());
        for key in &p.keys {
            names.push(match &key.team {
                Some(team) => {
                    let k = self.team_slot(key.budget, team, now)?;
                    (k.name, k.until)
                }
                // `fixed` has every budget's (a key's budget is an index into the budgets).
                None => (self.fixed[key.budget].clone(), 0),
            });
        }
        audit.budgets = p.keys.iter().map(|k| self.label(k)).collect();
        let mut store = self.store(|k| named(&p.keys, &names, k), now);
        let admitted_holds = match &self.worker {
            Some(worker) => {
                let mut leases = worker.borrow_mut();
                let mut leased = LeasedLedgers {
                    shared: store,
                    leases: &mut leases,
                    readings: Vec::new(),
                };
                let r = admit_all(&mut leased, &p.keys, p.amount);
                // Only a renewal read the ledger: its gauges follow that state.
                for (key, reading) in &leased.readings {
                    if let Some(shared) = named(&p.keys, &names, key) {
                        self.stats.record_ledger(key, shared, *reading);
                    }
                }
                store = leased.shared;
                r
            }
            None if self.compiled.charge_after => charge_after_check(&mut store, &p.keys, p.amount),
            None => admit_all(&mut store, &p.keys, p.amount),
        };
        let holds = match admitted_holds.map_err(|e| unavailable(&e))? {
            Ok(holds) => holds,
            Err(refusal) => {
                let answer = self.refusal(&refusal);
                for key in &refusal.refused {
                    if let (Ok(r), Some(shared)) = (store.usage(key), named(&p.keys, &names, key)) {
                        self.stats.record_ledger(key, shared, r);
                    }
                }
                return Err(answer);
            }
        };
        // Gauges follow settle, release and refusal, not admission: one ledger read fewer on
        // the request path.
        drop(store);
        // The holds come back in key order, the order `names` was built in: the keys and names
        // move into the holds instead of being looked up and copied.
        // Charge-after holds nothing: no holds, `None` for every ledger.
        let holds = holds.into_iter().map(Some).chain(std::iter::repeat(None));
        let held = p
            .keys
            .into_iter()
            .zip(holds)
            .zip(names)
            .map(|((key, hold), (shared, owned_until))| Held {
                key,
                shared,
                hold,
                owned_until,
            })
            .collect();
        let mut a = admitted(&facts, splice, held, None);
        a.metered.on_worker_lease = self.worker.is_some();
        Ok(Some(a))
    }

    /// The body edits admission makes (ask the stream for usage; cap the completion when
    /// nothing else does), as a splice of the body's head: from the body when the filter holds
    /// it, else from the few head bytes it needs (none when the body starts with its brace and
    /// only members are added there).
    fn splice(
        &self,
        r: &RequestView,
        facts: &router_core::budget::bound::RequestFacts,
        p: &BudgetPlan,
    ) -> Result<Option<Splice>, Answer> {
        let path = std::str::from_utf8(r.path).unwrap_or("");
        let Some(e) = edits(
            r.fields,
            facts,
            stream_needs_asking(path),
            p.bound.set_max_tokens,
        ) else {
            return Ok(None);
        };
        let needed = e.needed();
        let read;
        let head: &[u8] = match r.body {
            Some(b) => b,
            None if needed == 1 => b"{",
            None => match edge::buffer(Buffer::RequestBody, 0, needed) {
                Ok(b) => {
                    read = b.unwrap_or_default();
                    &read
                }
                Err(e) => {
                    let why = format!("reading the request body: {e}");
                    edge::log(Level::Error, &format!("model-router: budgets: {why}"));
                    return Err(Answer::Unavailable(ApiError::internal(&why)));
                }
            },
        };
        Ok(e.splice(head))
    }

    /// The shared ledger gave no usable answer: 503 `budget_store_unavailable`, or with
    /// `fail_open` the request goes on unbudgeted (`Ok`), said in the log and the audit line
    /// and counted per budget (`unenforced`).
    fn store_unavailable(
        &self,
        remote: &Remote,
        keys: &[LedgerKey],
        why: &str,
        audit: &mut AuditRecord,
    ) -> Result<(), Answer> {
        match router_core::budget::remote::unavailable_reply(why, remote.fail_open) {
            Some(e) => {
                edge::log(Level::Error, &format!("model-router: budgets: {why}"));
                Err(Answer::Unavailable(e))
            }
            None => {
                edge::log(
                    Level::Warn,
                    &format!("model-router: budgets: {why}; admitted unbudgeted (fail_open)"),
                );
                audit.budgets_unenforced = true;
                for k in keys {
                    self.stats.unenforced(k.budget);
                }
                Ok(())
            }
        }
    }

    /// The answer to a reservation call (`on_http_call_response`). `None`: not this request's
    /// reservation. `Some(Ok)`: admitted (or fail-open), resume the request; `Some(Err)`: answer
    /// the client instead.
    pub fn answered(
        &self,
        m: &mut Metered,
        token: u32,
        num_headers: usize,
        body_size: usize,
        audit: &mut AuditRecord,
    ) -> Option<Result<(), Answer>> {
        let (LedgerBackend::Remote(remote), Some(h)) = (&self.ledgers, m.remote.as_mut()) else {
            return None;
        };
        if h.pending != Some(token) {
            return None;
        }
        h.pending = None;
        let (admission, states) = remote.answer(num_headers, body_size);
        self.stats.record_all(&router_core::budget::remote::gauges(
            &self.compiled,
            &states,
        ));
        Some(match admission {
            Admission::Admitted { .. } => Ok(()),
            Admission::Refused(refused) => {
                for k in &h.keys {
                    self.stats.refused(k.budget);
                }
                m.remote = None;
                Err(Answer::Refused(refused))
            }
            Admission::Unavailable { why } => {
                // A reserve that timed out here may still be applied there: release its id
                // (a release that arrives first leaves nothing for the reserve to hold).
                let keys = h.keys.clone();
                self.end_remote(m, None, false);
                self.store_unavailable(remote, &keys, &why, audit)
            }
        })
    }

    /// Sends the queued settles and releases of remote ledgers, and sets again the gauges
    /// another worker's newer answer overtook (the root's tick).
    pub fn flush(&self) {
        match &self.ledgers {
            LedgerBackend::Remote(remote) => {
                remote.flush();
                if let Some(l) = &self.leases {
                    l.report(&self.compiled, remote);
                }
                self.stats
                    .republish(|_, key| router_core::budget::gauge::newest(&HostStore, key));
            }
            LedgerBackend::Local(data) => {
                let now = now_ms();
                self.report_worker_leases(now, false);
                // The embedded ledgers this worker set gauges for, as they are now (their `seq`
                // says whether another worker changed them since).
                self.stats.republish(|k, key| {
                    let shape = self
                        .compiled
                        .budgets
                        .get(k.budget)?
                        .shape(self.compiled.hold_ttl_s);
                    let (bytes, _) = data.get(key)?;
                    let l = router_core::budget::Ledger::from_vec(bytes, &shape, now).ok()?;
                    Some(router_core::budget::shared::reading(&l, &shape, now))
                });
            }
        }
    }

    /// The VM is stopping: releases this gateway's leases (lease mode). `true` when releases
    /// went out and the VM should wait for their answers.
    pub fn release_leases(&self) -> bool {
        match (&self.ledgers, &self.leases) {
            (LedgerBackend::Remote(remote), Some(l)) => l.release_all(&self.compiled, remote),
            _ => {
                // Embedded: synchronous, nothing to wait for.
                self.report_worker_leases(now_ms(), true);
                false
            }
        }
    }

    /// Renews this worker's leases on the embedded ledgers (one compare-and-swap each: their
    /// use is charged, their holds resized; `close`: only what is in flight stays held), and
    /// sets the gauges of each from the state its renewal left. A team's lease is renewed only
    /// while its slot is still the team's (the table is pushed on as for a request).
    fn report_worker_leases(&self, now: u64, close: bool) {
        let Some(worker) = &self.worker else {
            return;
        };
        let report = worker
            .borrow_mut()
            .report(self.data(), now, close, |key, ledger| {
                self.still_ours(key, ledger, now)
            });
        self.recorded(&report);
    }

    /// A worker lease's ledger is still the one its key names: always for router and rule
    /// budgets; for a team, while the team's slot is still that ledger's (and the table is
    /// pushed on as for a request).
    fn still_ours(&self, key: &LedgerKey, ledger: &str, now: u64) -> bool {
        key.team.as_ref().is_none_or(|team| {
            self.team_slot(key.budget, team, now)
                .is_ok_and(|k| *k.name == *ledger)
        })
    }

    /// The gauges of the ledgers worker-lease renewals wrote, from the state each left.
    fn recorded(&self, report: &router_core::budget::worker_lease::Report) {
        for (key, shared, reading) in &report.readings {
            self.stats.record_ledger(key, shared, *reading);
        }
        for e in &report.failed {
            edge::log(
                Level::Warn,
                &format!("model-router: budgets: renewing a worker lease: {e:?}; next tick"),
            );
        }
    }

    /// Ends the request's holds on this worker's leases, charging `amount` (zero: a release).
    /// `false`: its holds are in the ledgers themselves.
    fn end_on_worker_lease(&self, m: &mut Metered, amount: Amount) -> bool {
        let Some(worker) = self.worker.as_ref().filter(|_| m.on_worker_lease) else {
            return false;
        };
        let now = now_ms();
        let mut leases = worker.borrow_mut();
        for h in std::mem::take(&mut m.held) {
            let Some(hold) = &h.hold else { continue };
            // Near the cap a lease holds no spare room: the end is written at once, as a
            // per-request settle would be, so other workers see the room it frees.
            if leases.end(&h.shared, hold.amount, amount, now) {
                let report = leases.renew_now(self.data(), &h.shared, now, |key, ledger| {
                    self.still_ours(key, ledger, now)
                });
                self.recorded(&report);
            }
        }
        true
    }

    /// A settle or release answered (the root's `on_http_call_response`): the gauges follow
    /// the ledgers it reports, each set once to its newest state in the call (a batch's ends
    /// mostly report the same few ledgers).
    pub fn ended(&self, token: u32, num_headers: usize, body_size: usize) {
        if let LedgerBackend::Remote(remote) = &self.ledgers {
            if let Some(state) = self
                .leases
                .as_ref()
                .and_then(|l| l.answered(token, num_headers, body_size))
            {
                let gauges = router_core::budget::remote::gauges(
                    &self.compiled,
                    state
                        .as_ref()
                        .map(|(_, s)| std::slice::from_ref(s))
                        .unwrap_or(&[]),
                );
                self.stats.record_all(&gauges);
                return;
            }
            let answers = remote.ended(token, num_headers, body_size);
            let gauges = router_core::budget::remote::newest_per_ledger(
                answers
                    .iter()
                    .flat_map(|a| router_core::budget::remote::gauges(&self.compiled, &a.ledgers)),
            );
            self.stats.record_all(&gauges);
        }
    }

    /// Ends the request's remote reservation: settles `charge`, or releases (`None`). A
    /// reservation whose answer is still out (the client left first) is released by its id.
    /// `now`: sent from the request, which waits for the answer (`Metered::ending`); else
    /// queued for the root.
    fn end_remote(&self, m: &mut Metered, charge: Option<Amount>, now: bool) {
        if let (Some(l), Some(h)) = (&self.leases, m.lease.take()) {
            l.end(&h, charge);
        }
        let (LedgerBackend::Remote(remote), Some(h)) = (&self.ledgers, m.remote.take()) else {
            return;
        };
        if now && h.pending.is_none() {
            m.ending = remote.end_now(&self.compiled, &h.keys, &h.reservation, charge);
        } else {
            remote.end(&self.compiled, &h.keys, &h.reservation, charge);
        }
    }

    fn refusal(&self, refusal: &Refusal) -> Answer {
        let names: Vec<String> = refusal.refused.iter().map(|k| self.label(k)).collect();
        let window = refusal
            .refused
            .iter()
            .map(|k| self.compiled.budgets[k.budget].window_s)
            .max()
            .unwrap_or(1);
        for k in &refusal.refused {
            self.stats.refused(k.budget);
        }
        Answer::Refused(reply::exceeded(
            &names,
            refusal.retry_after_s(window),
            refusal.wait == Wait::Never,
        ))
    }

    /// The response headers came through with `status` from backend `served`.
    pub fn on_response_headers(
        &self,
        m: &mut Metered,
        status: u32,
        streaming: bool,
        served: Option<usize>,
    ) {
        if (200..300).contains(&status) {
            m.served = served;
            let kind = if streaming {
                BodyKind::EventStream
            } else {
                BodyKind::Json
            };
            m.reader = Some(UsageReader::new(kind, m.strip));
        }
    }

    /// A piece of the response body (`size` bytes, as Envoy hands it over: this chunk only).
    /// Returns `true` when this chunk must wait: the request settled on the shared ledger and
    /// the answer is out ([`Budgets::settle_answered`] resumes it).
    pub fn on_response_body(
        &self,
        m: &mut Metered,
        size: usize,
        end: bool,
        audit: &mut AuditRecord,
    ) -> bool {
        let Some(reader) = m.reader.as_mut() else {
            return false;
        };
        let chunk = if size > 0 {
            match edge::buffer(Buffer::ResponseBody, 0, size) {
                Ok(c) => c.unwrap_or_default(),
                Err(e) => {
                    // Usage is then estimated from what was read; the body goes on unchanged.
                    edge::log(
                        Level::Warn,
                        &format!("model-router: budgets: response body: {e}"),
                    );
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        m.out.clear();
        reader.feed(&chunk, &mut m.out);
        let usage = end.then(|| reader.finish(&mut m.out));
        if reader.strips() && (size > 0 || !m.out.is_empty()) {
            if let Err(e) = edge::replace_buffer(Buffer::ResponseBody, size, &m.out) {
                edge::log(
                    Level::Warn,
                    &format!("model-router: budgets: stripping usage: {e}"),
                );
            }
        }
        match usage {
            Some(u) => {
                self.settle(m, u, audit, true);
                m.ending.is_some()
            }
            None => false,
        }
    }

    /// The response ended without a body. `true`: the response headers wait for the shared
    /// ledger's answer to the settle, as [`Budgets::on_response_body`]'s last chunk does.
    pub fn on_response_end(&self, m: &mut Metered, audit: &mut AuditRecord) -> bool {
        if m.reader.is_some() {
            self.settle(m, Usage::default(), audit, true);
        }
        m.ending.is_some()
    }

    /// The answer to the settle the request sent itself (its `on_http_call_response`). `true`:
    /// it was that call, and the response goes on (answered, or queued for the root's retries).
    pub fn settle_answered(
        &self,
        m: &mut Metered,
        token: u32,
        num_headers: usize,
        body_size: usize,
    ) -> bool {
        let LedgerBackend::Remote(remote) = &self.ledgers else {
            return false;
        };
        if m.ending.as_ref().is_none_or(|(t, _)| *t != token) {
            return false;
        }
        let Some((_, end)) = m.ending.take() else {
            return false;
        };
        if let Some(answer) = remote.end_answered(end, num_headers, body_size) {
            self.stats.record_all(&router_core::budget::remote::gauges(
                &self.compiled,
                &answer.ledgers,
            ));
        }
        true
    }

    /// The request ended (`on_log`) with holds left: a served response cut short is charged its
    /// estimate; anything else (refused locally, failed upstream, client gone before an answer)
    /// releases.
    pub fn end(&self, m: &mut Metered, audit: &mut AuditRecord) {
        if let (LedgerBackend::Remote(remote), Some((_, end))) = (&self.ledgers, m.ending.take()) {
            // Its answer would come to a context that is going: the root sends it again.
            remote.requeue(end);
        }
        if m.held.is_empty() && m.remote.is_none() && m.lease.is_none() {
            return;
        }
        let streamed = m.reader.as_ref().is_some_and(|r| r.content_bytes() > 0);
        if m.served.is_some() && streamed {
            let mut sink = Vec::new();
            let usage = m
                .reader
                .as_mut()
                .map(|r| r.finish(&mut sink))
                .unwrap_or_default();
            self.settle(m, usage, audit, false);
            return;
        }
        self.end_remote(m, None, false);
        if self.end_on_worker_lease(m, Amount::ZERO) {
            return;
        }
        let now = now_ms();
        let held = std::mem::take(&mut m.held);
        let store = self.store(|k| held_name(&held, k), now);
        for h in &held {
            let Some(hold) = &h.hold else { continue };
            // A settle of nothing: the hold goes, and the gauges get the ledger as it left it.
            match store.settle(&h.key, Some(hold), Amount::ZERO) {
                Ok(r) => self.stats.record_ledger(&h.key, &h.shared, r),
                Err(e) => edge::log(
                    Level::Error,
                    &format!("model-router: budgets: release: {e:?}"),
                ),
            }
        }
    }

    /// Charges the request. `now`: the request is still there to wait for the shared ledger's
    /// answer (its last response chunk), so the settle goes out at once instead of being queued.
    fn settle(&self, m: &mut Metered, usage: Usage, audit: &mut AuditRecord, now: bool) {
        let content = m.reader.as_ref().map_or(0, |r| r.content_bytes());
        let c: Charge = charge(usage, m.request_bytes, content);
        let price = m
            .served
            .and_then(|b| self.attempts.get(b))
            .map(|a| a.price)
            .unwrap_or_default();
        let amount = charged(&price, &c);
        if c.estimated {
            for k in m.remote.iter().flat_map(|h| &h.keys) {
                self.stats.estimated(k.budget);
            }
            for &b in m.lease.iter().flat_map(|h| h.budgets()) {
                self.stats.estimated(b);
            }
            for h in &m.held {
                self.stats.estimated(h.key.budget);
            }
        }
        self.end_remote(m, Some(amount), now);
        if !self.end_on_worker_lease(m, amount) {
            self.settle_in_ledgers(std::mem::take(&mut m.held), amount);
        }
        audit.tokens = Some(AuditTokens {
            prompt: c.prompt,
            completion: c.completion,
        });
        audit.usd = Some(format_usd(amount.pico));
        audit.usage_estimated = c.estimated;
    }

    /// Settles the holds in the ledgers themselves (per-request mode): one compare-and-swap
    /// each, and the gauges from the state it left.
    fn settle_in_ledgers(&self, held: Vec<Held>, amount: Amount) {
        let now = now_ms();
        let store = self.store(|k| held_name(&held, k), now);
        for h in &held {
            if !self.slot_still_owned(h, now) {
                continue;
            }
            match store.settle(&h.key, h.hold.as_ref(), amount) {
                Ok(r) => self.stats.record_ledger(&h.key, &h.shared, r),
                Err(e) => edge::log(
                    Level::Error,
                    &format!("model-router: budgets: settle: {e:?}"),
                ),
            }
        }
    }

    /// A team slot is only reused once its team's ledger has rolled off, and a request's hold
    /// keeps it busy for the hold TTL; a request that outlived the TTL finds its slot may belong
    /// to another team by now, and must not charge that team.
    fn slot_still_owned(&self, h: &Held, now: u64) -> bool {
        let Some(team) = &h.key.team else {
            return true;
        };
        if now < h.owned_until {
            // The table cannot have given the slot away yet (`team_slot`): no read.
            return true;
        }
        let table = self
            .data()
            .get(&self.table_name(h.key.budget))
            .and_then(|(raw, _)| TeamTable::decode(&raw, self.compiled.max_teams).ok());
        let slot = table.and_then(|t| t.slot_of(team));
        slot.is_some_and(|s| *h.shared == *self.ledger_name(h.key.budget, Some(s)))
    }
}

/// The shared-data key `names` gives ledger `k` (`names[i]` is that of `keys[i]`).
fn named<'n>(keys: &[LedgerKey], names: &'n [(Rc<str>, u64)], k: &LedgerKey) -> Option<&'n str> {
    let i = keys.iter().position(|h| h == k)?;
    names.get(i).map(|(n, _)| &**n)
}

/// The shared-data key of the held ledger `k`.
fn held_name<'h>(held: &'h [Held], k: &LedgerKey) -> Option<&'h str> {
    held.iter().find(|h| h.key == *k).map(|h| &*h.shared)
}

/// Appends `v` in decimal (ledger keys are built per request; `format!` costs more).
fn push_decimal(s: &mut String, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        s.push(char::from(d));
    }
}

/// An admitted request, its holds and its body edit.
fn admitted(
    facts: &router_core::budget::bound::RequestFacts,
    splice: Option<Splice>,
    held: Vec<Held>,
    remote: Option<RemoteHold>,
) -> Admitted {
    Admitted {
        metered: Metered {
            held,
            request_bytes: facts.body_bytes,
            strip: splice.as_ref().is_some_and(|s| s.asked),
            reader: None,
            served: None,
            out: Vec::new(),
            remote,
            lease: None,
            on_worker_lease: false,
            ending: None,
        },
        splice,
    }
}

/// Charge-after (test-only, unsafe): every ledger is asked whether the request fits now and
/// nothing is held, so concurrent requests all see the same room.
fn charge_after_check<S: LedgerStore>(
    store: &mut S,
    keys: &[LedgerKey],
    amount: Amount,
) -> Result<Result<Vec<Hold>, Refusal>, S::Error> {
    for k in keys {
        if let Err(wait) = store.check(k, amount)? {
            return Ok(Err(Refusal {
                refused: vec![k.clone()],
                wait,
            }));
        }
    }
    Ok(Ok(Vec::new()))
}

/// The edited head goes upstream in place of the client's first bytes, the rest of the body
/// untouched (Envoy does not fix `content-length` itself). `len`: the client's body length.
pub(crate) fn send_splice(len: usize, splice: &Splice) -> Result<(), String> {
    edge::replace_buffer(Buffer::RequestBody, splice.replace, &splice.with)
        .map_err(|e| format!("editing the request body: {e}"))?;
    edge::set_header(
        Map::RequestHeaders,
        "content-length",
        &splice.new_len(len).to_string(),
    )
    .map_err(|e| format!("setting content-length: {e}"))
}
