//! The budget step of a request (`spec.policy.budgets`, docs/budgets.md): after routing has
//! decided, reserve the request's upper bound on every ledger it is under (all or nothing) or
//! answer 429 before anything goes upstream; on the response, read usage as the body streams by
//! and settle at the serving backend's price; release what never settled, in `on_log`.
//! `router_core::budget` decides every step; this module moves bytes.
//!
//! One mode per router ([`Ledgers`], from `router_core::budget::compiled::Mode`) behind one
//! interface the filter calls: reserve ([`Budgets::admit`]), settle (on the last response
//! chunk), release ([`Budgets::end`]) and tick ([`Budgets::flush`]). An admitted request carries
//! what its mode holds ([`Holding`]). Embedded modes keep the ledgers in this Envoy's shared
//! data (exact across workers by compare-and-swap, `router_core::budget::shared`); the shared
//! mode keeps them in `llmkube-budgets` and reaches them by callout.
//!
//! Shared-data keys (`<prefix>` = `llmkube.budget|<router>|`): `<prefix><budget>` for router and
//! rule budgets; for a team budget a table `<prefix><budget>|teams` (team → slot,
//! `router_core::budget::team_slots`) and one ledger per slot, `<prefix><budget>#<slot>`. Every key is
//! created at configure time: Envoy accepts any CAS token for a key that does not exist, so
//! creating keys on the request path could lose a concurrent update. A slot is reused only once
//! its old team's ledger has fully rolled off, so a reused slot's ledger is already empty.

use crate::budget_lease::{LeaseHold, Leases};
use crate::budget_remote::{PendingEnd, Remote, RemoteHold};
use crate::metrics::{counter, BudgetStats};
use crate::usage::Meter;
use filter_edge::{self as edge, shared_table::HostStore, Buffer, Level};
use router_core::audit::{AuditRecord, Outcome};
use router_core::budget::admit::{admit_all, LedgerKey, LedgerStore, Refusal, Scope};
use router_core::budget::bound::{request_facts, RequestFacts};
use router_core::budget::compiled::{CompiledBudgets, Mode, UnsafeMode};
use router_core::budget::inject::{edits, stream_needs_asking, Splice};
use router_core::budget::ledger::{Hold, Shape, Wait};
use router_core::budget::money::format_usd;
use router_core::budget::protocol::LedgerState;
use router_core::budget::ratelimit::{RateLimit, Seen};
use router_core::budget::remote::Admission;
use router_core::budget::reply::{self, Refused};
use router_core::budget::shared::{
    create_missing, Seeing, SharedError, SharedLedger, SharedLedgers,
};
use router_core::budget::step::{charged, plan, Attempt, BudgetPlan};
use router_core::budget::team_slots::{TableError, TeamTable};
use router_core::budget::template;
use router_core::budget::usage::Charge;
use router_core::budget::window::Amount;
use router_core::budget::worker_lease::{LeasedLedgers, Leases as WorkerLeases};
use router_core::errors::{ApiError, ErrorShape};
use router_core::router::{RequestHeaders, Router};
use router_core::scan::Fields;
use router_core::shared_data::{compare_and_swap, CasError, SharedData, Swap};
use std::cell::RefCell;
use std::rc::Rc;

/// Lease states a worker keeps for the rate-limit headers (every lease it can hold reports one).
const LEASE_SEEN_MAX: usize = 4096;

/// How long a request refused on worker leases only because other workers' leases hold the
/// room it needs waits for them to give it back: four of the root's ticks (each worker's tick
/// renews its leases, and gives room back once asked).
const WAIT_FOR_ROOM_MS: u64 = 4 * filter_edge::shared_table::REFRESH_MS as u64;
/// Requests one worker holds waiting for room at most; more are refused at once.
const WAITING_MAX: usize = 1024;

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

/// Where this router's ledgers live and how its requests are admitted on them. One per router
/// and worker, so the size of its largest variant costs nothing per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Ledgers {
    /// This Envoy's shared data: one reserve and one settle per request. `hold: false` is the
    /// test-only charge-after control, which checks and holds nothing.
    PerRequest { hold: bool },
    /// This Envoy's shared data, admitted on this worker's leases of it.
    WorkerLeases(RefCell<WorkerLeases>),
    /// `llmkube-budgets`, shared by every gateway replica; with `leases`, admitted first on this
    /// gateway's leases held there.
    Shared {
        remote: Remote,
        leases: Option<Leases>,
    },
}

/// The budgets of one router, per worker VM.
pub(crate) struct Budgets {
    compiled: CompiledBudgets,
    ledgers: Ledgers,
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
    /// Lease mode of the shared ledger: each leased ledger's state as the last lease report
    /// this worker got answered it (the rate-limit headers of lease-admitted responses).
    lease_seen: RefCell<Vec<LedgerState>>,
    /// Worker leases: the requests held for room other workers' leases hold ([`Budgets::wake`]).
    waiting: RefCell<Vec<Waiting>>,
    /// Worker leases only: counters `llmkube.budget.room_waits` (requests put on `waiting`)
    /// and `llmkube.budget.room_waits_refused` (held requests the root answered 429).
    room_waits: Option<u32>,
    room_waits_refused: Option<u32>,
}

/// A request held for room on worker leases: the root's tick tries it again until it is
/// admitted (and resumed) or its wait is over (and it is answered from the root).
struct Waiting {
    /// Its HTTP context, which the root resumes or answers.
    context_id: u32,
    keys: Vec<LedgerKey>,
    amount: Amount,
    until_ms: u64,
    /// For the answer: the client's error shape and the request id its body names.
    shape: ErrorShape,
    request_id: Option<String>,
    state: Rc<RefCell<RoomWait>>,
}

/// Where a held request stands, shared by the request ([`Holding::Waiting`]) and the root.
enum RoomWait {
    Waiting,
    /// Admitted by the root: these holds on the worker's leases, and the ledgers as admission
    /// saw them.
    Admitted(Vec<Held>, RateLimit),
    /// Answered by the root with this status (a refusal, or the store unavailable).
    Answered(u32, Outcome),
    /// The request ended while it waited: the root forgets it.
    Gone,
}

/// What the client gets instead of an upstream answer.
pub(crate) enum Answer {
    /// 429 with `Retry-After`, and the rate-limit headers of the ledgers as admission saw them
    /// (none when it read none).
    Refused(Refused, Box<RateLimit>),
    /// 503 `budget_store_unavailable` (the ledgers cannot be read or written).
    Unavailable(ApiError),
}

/// One ledger an admitted request holds, by key in the ledger store.
struct Held {
    key: LedgerKey,
    /// The shared-data key of its ledger (for a team: of its slot).
    shared: Rc<str>,
    /// `None` under the charge-after control, which holds nothing.
    hold: Option<Hold>,
    /// For a team ledger: until when the team table keeps this slot the team's.
    owned_until: u64,
}

/// What an admitted request holds, in its router's mode, until it settles or releases.
enum Holding {
    /// Holds in the embedded ledgers themselves, one per ledger (per request).
    Ledgers(Vec<Held>),
    /// Holds on this worker's leases of the embedded ledgers: they end in its memory.
    WorkerLeases(Vec<Held>),
    /// A reservation on `llmkube-budgets` (its answer may still be out).
    Remote(RemoteHold),
    /// Admitted on this gateway's leases of the shared ledger.
    Lease(LeaseHold),
    /// The settle this request sent the shared ledger itself, by call token: the last response
    /// chunk waits for its answer.
    Settling(u32, PendingEnd),
    /// Held for room on worker leases: the root admits it later, or answers it.
    Waiting(Rc<RefCell<RoomWait>>),
    /// Nothing left: settled or released.
    Ended,
}

/// An admitted request, from admission to settlement.
pub(crate) struct Metered {
    holding: Holding,
    /// The response headers came through with a 2xx, from this backend (if known).
    served: Option<Option<usize>>,
    /// The room left on its budgets as admission saw it (embedded: in the reserve's own
    /// compare-and-swap, or the worker's leases; shared: the reservation's answer), for the
    /// rate-limit headers.
    rate: Option<RateLimit>,
}

impl Metered {
    /// The reservation was sent and its answer is still out: the request waits for it.
    pub fn awaiting(&self) -> bool {
        matches!(&self.holding, Holding::Remote(h) if h.pending.is_some())
    }

    /// Its settle went to the shared ledger and the answer is still out.
    fn settling(&self) -> bool {
        matches!(self.holding, Holding::Settling(..))
    }

    /// Held for room on worker leases: the request waits, and the root resumes or answers it.
    pub fn held_for_room(&self) -> bool {
        matches!(&self.holding, Holding::Waiting(w) if matches!(*w.borrow(), RoomWait::Waiting))
    }

    /// The root answered the request while it was held for room: the status and outcome.
    pub fn answered_while_held(&self) -> Option<(u32, Outcome)> {
        match &self.holding {
            Holding::Waiting(w) => match *w.borrow() {
                RoomWait::Answered(status, outcome) => Some((status, outcome)),
                _ => None,
            },
            _ => None,
        }
    }

    /// A request the root admitted after holding it now carries its holds itself.
    fn take_admitted(&mut self) {
        let Holding::Waiting(w) = &self.holding else {
            return;
        };
        // Taken out first: the borrow ends before the state is put back.
        let state = std::mem::replace(&mut *w.borrow_mut(), RoomWait::Gone);
        let admitted = match state {
            RoomWait::Admitted(held, rate) => (held, rate),
            other => {
                *w.borrow_mut() = other;
                return;
            }
        };
        self.holding = Holding::WorkerLeases(admitted.0);
        self.rate = Some(admitted.1);
    }

    /// The budgets whose ledgers it holds.
    fn budgets(&self) -> Vec<usize> {
        match &self.holding {
            Holding::Ledgers(held) | Holding::WorkerLeases(held) => {
                held.iter().map(|h| h.key.budget).collect()
            }
            Holding::Remote(h) => h.keys.iter().map(|k| k.budget).collect(),
            Holding::Lease(h) => h.budgets().to_vec(),
            Holding::Settling(..) | Holding::Waiting(_) | Holding::Ended => Vec::new(),
        }
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
    /// Its HTTP context: a request refused only for room other workers' leases hold may wait
    /// for it, and the root resumes or answers it by this id.
    pub context_id: u32,
    /// `false`: the request may not wait (it has shadow copies to send as it goes upstream).
    pub may_wait: bool,
    /// The client's error shape (an answer from the root is in it).
    pub shape: ErrorShape,
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

impl Answer {
    /// The reply: its error, the headers beside the request id (the rate-limit headers of the
    /// ledgers that refused, then `Retry-After`, or `x-should-retry: false` for a request no
    /// wait admits) and the audit outcome.
    pub fn parts(&self) -> (&ApiError, Vec<(&'static str, String)>, Outcome) {
        let (err, retry_after, rate) = match self {
            Answer::Refused(r, rate) if r.never => (&r.error, None, Some(rate)),
            Answer::Refused(r, rate) => (&r.error, Some(r.retry_after_s.to_string()), Some(rate)),
            Answer::Unavailable(e) => (e, None, None),
        };
        let outcome = if rate.is_some() {
            Outcome::BudgetExceeded
        } else {
            Outcome::FailClosedRuntime
        };
        let mut headers = rate.map(|r| r.headers()).unwrap_or_default();
        match (retry_after, rate.is_some()) {
            (Some(s), _) => headers.push(("retry-after", s)),
            (None, true) => headers.push(("x-should-retry", "false".to_string())),
            (None, false) => {}
        }
        (err, headers, outcome)
    }
}

/// What reserving on the embedded ledgers came to.
enum Reserved {
    /// The holds in key order (none under charge-after), and the ledgers as admission saw them.
    Held(Vec<Hold>, RateLimit),
    /// Refused; `reclaimed`: on worker leases, only because other workers' leases hold the room
    /// (what is spent leaves room for it), and they were asked to give it back.
    Refused {
        refusal: Refusal,
        rate: RateLimit,
        reclaimed: bool,
    },
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
        let ledgers = match &compiled.mode {
            Mode::WorkerLeases => Ledgers::WorkerLeases(RefCell::new(WorkerLeases::default())),
            Mode::Unsafe(UnsafeMode::WorkerLeasesUnheld) => {
                Ledgers::WorkerLeases(RefCell::new(WorkerLeases::unsafe_unheld()))
            }
            Mode::PerRequest => Ledgers::PerRequest { hold: true },
            Mode::Unsafe(UnsafeMode::ChargeAfter) => Ledgers::PerRequest { hold: false },
            Mode::Shared { service, lease } => Ledgers::Shared {
                remote: Remote::new(
                    &router.config.router,
                    service,
                    compiled.hold_ttl_s,
                    lease.as_ref().map_or(0, |l| l.reserve_wait_ms()),
                ),
                leases: lease.as_ref().and_then(|lease| {
                    Leases::configure(&compiled, lease, &router.config.router, service.timeout_ms)
                }),
            },
        };
        let on_worker_leases = matches!(ledgers, Ledgers::WorkerLeases(_));
        let room_counter = |name: &str| on_worker_leases.then(|| counter(name)).flatten();
        let mut budgets = Budgets {
            room_waits: room_counter("llmkube.budget.room_waits"),
            room_waits_refused: room_counter("llmkube.budget.room_waits_refused"),
            fixed: Vec::new(),
            shapes: Vec::new(),
            stats: match &ledgers {
                Ledgers::Shared { .. } => {
                    stats.shared_by_workers(format!("{prefix}gauge|"), compiled.max_teams)
                }
                _ => stats,
            },
            prefix,
            ledgers,
            attempts,
            compiled,
            slots: RefCell::new(SlotCache::default()),
            lease_seen: RefCell::new(Vec::new()),
            waiting: RefCell::new(Vec::new()),
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
        if budgets.compiled.mode.embedded() {
            budgets.create_keys()?;
        }
        Ok(Some(budgets))
    }

    /// This Envoy's shared data (the embedded ledgers, the team tables, the shared ledger's
    /// gauges).
    fn data(&self) -> &'static HostStore {
        &HostStore
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
                // A table that could not be read is not taken for a missing one (and reset).
                if data
                    .get(&table)
                    .map_err(|_| format!("budgets: reading {table} failed"))?
                    .is_none()
                {
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
            // Best effort: a table that is absent, unreadable or contended is left as it is.
            let _ = compare_and_swap(data, &key, None, |raw| -> Result<_, ()> {
                let raw = raw.ok_or(())?;
                let mut table = TeamTable::decode(&raw, self.compiled.max_teams).map_err(|_| ())?;
                let changed = table.outlast(now, |slot| {
                    let (bytes, _) = data.get(&self.ledger_name(i, Some(slot))).ok()??;
                    let l = router_core::budget::Ledger::from_vec(bytes, &shape, now).ok()?;
                    Some(l.quiet_at(&shape, now))
                });
                if !changed {
                    return Ok(Swap::<(), Vec<u8>>::Keep(()));
                }
                let mut buf = Vec::new();
                table.encode(&mut buf);
                Ok(Swap::Write(buf, ()))
            });
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
        let claimed = compare_and_swap(data, &key, None, |raw| {
            let raw = raw.ok_or_else(|| unavailable(&SharedError::Missing(key.clone())))?;
            let mut table = TeamTable::decode(&raw, max)
                .map_err(|_| unavailable(&SharedError::Corrupt(key.clone())))?;
            let slot = match table.admit(team, until, now_ms, max) {
                Ok(s) => s,
                Err(TableError::Full { max }) => {
                    let free_at = table.next_free_at().unwrap_or(now_ms);
                    let wait = free_at.saturating_sub(now_ms).div_ceil(1000);
                    return Err(Answer::Refused(
                        reply::teams_full(&b.name, max, wait),
                        Box::default(),
                    ));
                }
                Err(TableError::Corrupt) => {
                    return Err(unavailable(&SharedError::Corrupt(key.clone())))
                }
            };
            let mut buf = Vec::new();
            table.encode(&mut buf);
            Ok(Swap::Write(buf, slot.index))
        });
        claimed.map_err(|e| match e {
            CasError::Step(answer) => {
                if matches!(answer, Answer::Refused(..)) {
                    self.stats.refused(budget);
                }
                answer
            }
            CasError::Host | CasError::Contended => {
                unavailable(&SharedError::Contended(key.clone()))
            }
        })
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
        let Some((facts, p)) = self.plan_of(r)? else {
            return Ok(None);
        };
        // Before any hold: a body that cannot be edited holds nothing.
        let splice = self.splice(r, &facts, &p)?;
        if let Ledgers::Shared { remote, leases } = &self.ledgers {
            audit.budgets = p.keys.iter().map(|k| self.label(k)).collect();
            return self.admit_shared(remote, leases.as_ref(), p, splice, audit);
        }
        let now = now_ms();
        let names = self.ledger_names(&p.keys, now)?;
        audit.budgets = p.keys.iter().map(|k| self.label(k)).collect();
        match self.reserve_embedded(&p.keys, p.amount, &names, now)? {
            Reserved::Held(holds, rate) => {
                let mut a = admitted(splice, self.holding(p.keys, holds, names));
                a.metered.rate = Some(rate);
                Ok(Some(a))
            }
            Reserved::Refused {
                reclaimed: true, ..
            } if r.may_wait && self.waiting.borrow().len() < WAITING_MAX => {
                let state = Rc::new(RefCell::new(RoomWait::Waiting));
                self.waiting.borrow_mut().push(Waiting {
                    context_id: r.context_id,
                    keys: p.keys,
                    amount: p.amount,
                    until_ms: now.saturating_add(WAIT_FOR_ROOM_MS),
                    shape: r.shape,
                    request_id: audit.request_id.clone(),
                    state: state.clone(),
                });
                if let Some(id) = self.room_waits {
                    edge::increment_metric(id, 1);
                }
                Ok(Some(admitted(splice, Holding::Waiting(state))))
            }
            Reserved::Refused { refusal, rate, .. } => {
                Err(self.refused_embedded(&p.keys, &names, now, &refusal, rate))
            }
        }
    }

    /// What the request would reserve: its facts (what its bound is made of) and the plan (its
    /// ledgers and amount). `None`: no budget applies.
    fn plan_of(&self, r: &RequestView) -> Result<Option<(RequestFacts, BudgetPlan)>, Answer> {
        let mut facts = request_facts(r.body_len, r.fields);
        if facts.template_needs_shape {
            facts.template_margin = template_margin(r)?;
        }
        let attempts = r
            .order
            .iter()
            .filter_map(|&b| self.attempts.get(b).copied());
        let p = plan(
            &self.compiled,
            r.rule,
            |h| r.headers.first(h),
            &facts,
            attempts,
        );
        Ok(p.map(|p| (facts, p)))
    }

    /// The shared ledger: admitted on this gateway's leases when they cover the request (no
    /// callout), else reserved by a call to the service, whose answer the request waits for.
    /// `Ok(None)`: the service cannot be reached and `fail_open` lets the request go unbudgeted.
    fn admit_shared(
        &self,
        remote: &Remote,
        leases: Option<&Leases>,
        p: BudgetPlan,
        splice: Option<Splice>,
        audit: &mut AuditRecord,
    ) -> Result<Option<Admitted>, Answer> {
        if let Some(hold) = leases.and_then(|l| l.admit(&p.keys, p.amount)) {
            let mut a = admitted(splice, Holding::Lease(hold));
            a.metered.rate = self.lease_rate(&p.keys);
            return Ok(Some(a));
        }
        let id = remote.new_id();
        match remote.reserve(&self.compiled, &p.keys, p.amount, &id) {
            Ok(token) => Ok(Some(admitted(
                splice,
                Holding::Remote(RemoteHold {
                    keys: p.keys,
                    pending: Some(token),
                    reservation: id,
                }),
            ))),
            Err(why) => self
                .store_unavailable(remote, &p.keys, &why, audit)
                .map(|()| None),
        }
    }

    /// Per key, in its order: the shared-data key of its embedded ledger and until when the
    /// team table keeps a team's slot (0 for router and rule budgets). A team without a slot
    /// takes one, or is refused when the table is full.
    fn ledger_names(&self, keys: &[LedgerKey], now: u64) -> Result<Vec<(Rc<str>, u64)>, Answer> {
        keys.iter()
            .map(|key| {
                Ok(match &key.team {
                    Some(team) => {
                        let k = self.team_slot(key.budget, team, now)?;
                        (k.name, k.until)
                    }
                    // `fixed` has every budget's (a key's budget is an index into the budgets).
                    None => (self.fixed[key.budget].clone(), 0),
                })
            })
            .collect()
    }

    /// Reserves `amount` on the embedded ledgers of `keys` (shared-data keys `names`), all or
    /// nothing, in this router's mode. Gauges follow settle, release and refusal, not
    /// admission: one ledger read fewer on the request path. `Err`: the ledgers cannot be read
    /// or written.
    fn reserve_embedded(
        &self,
        keys: &[LedgerKey],
        amount: Amount,
        names: &[(Rc<str>, u64)],
        now: u64,
    ) -> Result<Reserved, Answer> {
        let mut store = self.store(|k| named(keys, names, k), now);
        let mut rate = RateLimit::default();
        let mut reclaimed = false;
        let reserved = match &self.ledgers {
            Ledgers::WorkerLeases(worker) => {
                let mut leases = worker.borrow_mut();
                let mut leased = LeasedLedgers {
                    shared: store,
                    leases: &mut leases,
                    readings: Vec::new(),
                    reclaimed: false,
                };
                let r = admit_all(&mut leased, keys, amount);
                // Only a renewal read the ledger: its gauges follow that state.
                for (key, reading) in &leased.readings {
                    if let Some(shared) = named(keys, names, key) {
                        self.stats.record_ledger(key, shared, *reading);
                    }
                }
                reclaimed = leased.reclaimed;
                for (shared, _) in names {
                    if let Some(seen) = leases.seen(shared, now) {
                        rate.add(&seen);
                    }
                }
                r
            }
            Ledgers::PerRequest { hold: false } => charge_after_check(&mut store, keys, amount),
            _ => {
                let mut seeing = Seeing {
                    store,
                    seen: Vec::new(),
                };
                let r = admit_all(&mut seeing, keys, amount);
                for seen in &seeing.seen {
                    rate.add(seen);
                }
                r
            }
        };
        Ok(match reserved.map_err(|e| unavailable(&e))? {
            Ok(holds) => Reserved::Held(holds, rate),
            Err(refusal) => Reserved::Refused {
                refusal,
                rate,
                reclaimed,
            },
        })
    }

    /// The answer to a refusal on the embedded ledgers; their gauges are set from what they
    /// hold now.
    fn refused_embedded(
        &self,
        keys: &[LedgerKey],
        names: &[(Rc<str>, u64)],
        now: u64,
        refusal: &Refusal,
        rate: RateLimit,
    ) -> Answer {
        let answer = self.refusal(refusal, rate);
        let store = self.store(|k| named(keys, names, k), now);
        for key in &refusal.refused {
            if let (Ok(r), Some(shared)) = (store.usage(key), named(keys, names, key)) {
                self.stats.record_ledger(key, shared, r);
            }
        }
        answer
    }

    /// The root's tick: each request held for room is tried again. One admitted is resumed; one
    /// whose wait is over, or refused for good, is answered from here (its request sees the
    /// answer: [`Metered::answered_while_held`]). A request whose stream is gone gives back
    /// what it was admitted with.
    fn wake(&self, now: u64) {
        let waiting = std::mem::take(&mut *self.waiting.borrow_mut());
        for w in waiting {
            if !matches!(*w.state.borrow(), RoomWait::Waiting) {
                continue;
            }
            let retried = self.ledger_names(&w.keys, now).and_then(|names| {
                let reserved = self.reserve_embedded(&w.keys, w.amount, &names, now)?;
                Ok((reserved, names))
            });
            let answer = match retried {
                Ok((Reserved::Held(holds, rate), names)) => {
                    let held = held_of(w.keys.clone(), holds, names);
                    *w.state.borrow_mut() = RoomWait::Admitted(held, rate);
                    let resumed = edge::set_effective_context(w.context_id)
                        .and_then(|()| edge::resume(edge::Stream::Request));
                    if let Err(e) = resumed {
                        edge::log(
                            Level::Warn,
                            &format!("model-router: budgets: resuming a held request: {e}"),
                        );
                        let state = std::mem::replace(&mut *w.state.borrow_mut(), RoomWait::Gone);
                        if let RoomWait::Admitted(held, _) = state {
                            self.end_on_worker_lease(held, Amount::ZERO);
                        }
                    }
                    continue;
                }
                Ok((
                    Reserved::Refused {
                        reclaimed: true, ..
                    },
                    _,
                )) if now < w.until_ms => {
                    self.waiting.borrow_mut().push(w);
                    continue;
                }
                Ok((Reserved::Refused { refusal, rate, .. }, names)) => {
                    self.refused_embedded(&w.keys, &names, now, &refusal, rate)
                }
                Err(answer) => answer,
            };
            self.answer_held(&w, &answer);
        }
    }

    /// Answers a held request from the root.
    fn answer_held(&self, w: &Waiting, answer: &Answer) {
        let (err, mut headers, outcome) = answer.parts();
        if let (429, Some(id)) = (err.status, self.room_waits_refused) {
            edge::increment_metric(id, 1);
        }
        *w.state.borrow_mut() = RoomWait::Answered(err.status, outcome);
        let body = err.body_in(w.shape, w.request_id.as_deref());
        headers.insert(0, ("content-type", "application/json".to_string()));
        let pairs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let sent = edge::set_effective_context(w.context_id)
            .and_then(|()| edge::respond(err.status, &pairs, &body, err.code));
        if let Err(e) = sent {
            edge::log(
                Level::Warn,
                &format!("model-router: budgets: answering a held request: {e}"),
            );
        }
    }

    /// What an admitted request holds on the embedded ledgers. The holds come back in key
    /// order, the order `names` was built in: the keys and names move into the holds instead of
    /// being looked up and copied. Charge-after holds nothing: `None` for every ledger.
    fn holding(
        &self,
        keys: Vec<LedgerKey>,
        holds: Vec<Hold>,
        names: Vec<(Rc<str>, u64)>,
    ) -> Holding {
        let held = held_of(keys, holds, names);
        match &self.ledgers {
            Ledgers::WorkerLeases(_) => Holding::WorkerLeases(held),
            _ => Holding::Ledgers(held),
        }
    }

    /// The body edits admission makes (ask the stream for usage; cap the completion when
    /// nothing else does), as a splice of the body's head: from the body when the filter holds
    /// it, else from the few head bytes it needs (none when the body starts with its brace and
    /// only members are added there).
    fn splice(
        &self,
        r: &RequestView,
        facts: &RequestFacts,
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
        crate::usage::splice_of(&e, r.body).map_err(|why| {
            edge::log(Level::Error, &format!("model-router: budgets: {why}"));
            Answer::Unavailable(ApiError::internal(&why))
        })
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
        let (Ledgers::Shared { remote, .. }, Holding::Remote(h)) = (&self.ledgers, &mut m.holding)
        else {
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
            Admission::Admitted { .. } => {
                m.rate = Some(self.rate_limit_of(&states));
                Ok(())
            }
            Admission::Refused(refused) => {
                for k in &h.keys {
                    self.stats.refused(k.budget);
                }
                m.holding = Holding::Ended;
                Err(Answer::Refused(
                    refused,
                    Box::new(self.rate_limit_of(&states)),
                ))
            }
            Admission::Unavailable { why } => {
                // A reserve that timed out here may still be applied there: release its id
                // (a release that arrives first leaves nothing for the reserve to hold).
                let keys = h.keys.clone();
                self.finish(m, None, false);
                self.store_unavailable(remote, &keys, &why, audit)
            }
        })
    }

    /// Sends the queued settles and releases of remote ledgers, and sets again the gauges
    /// another worker's newer answer overtook (the root's tick).
    pub fn flush(&self) {
        match &self.ledgers {
            Ledgers::Shared { remote, leases } => {
                remote.flush();
                if let Some(l) = leases {
                    l.report(&self.compiled, remote);
                }
                self.stats
                    .republish(|_, key| router_core::budget::gauge::newest(&HostStore, key));
            }
            Ledgers::PerRequest { .. } | Ledgers::WorkerLeases(_) => {
                let now = now_ms();
                self.report_worker_leases(now, false);
                self.wake(now);
                // The embedded ledgers this worker set gauges for, as they are now (their `seq`
                // says whether another worker changed them since).
                self.stats.republish(|k, key| {
                    let shape = self
                        .compiled
                        .budgets
                        .get(k.budget)?
                        .shape(self.compiled.hold_ttl_s);
                    let (bytes, _) = self.data().get(key).ok()??;
                    let l = router_core::budget::Ledger::from_vec(bytes, &shape, now).ok()?;
                    Some(router_core::budget::shared::reading(&l, &shape, now))
                });
            }
        }
    }

    /// The VM is stopping: releases this gateway's leases (lease mode). `true` when releases
    /// went out and the VM should wait for their answers.
    pub fn release_leases(&self) -> bool {
        match &self.ledgers {
            Ledgers::Shared {
                remote,
                leases: Some(l),
            } => l.release_all(&self.compiled, remote),
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
        let Ledgers::WorkerLeases(worker) = &self.ledgers else {
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

    /// Ends holds on this worker's leases, charging `amount` (zero: a release).
    fn end_on_worker_lease(&self, held: Vec<Held>, amount: Amount) {
        let Ledgers::WorkerLeases(worker) = &self.ledgers else {
            return;
        };
        let now = now_ms();
        let mut leases = worker.borrow_mut();
        for h in held {
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
    }

    /// A settle or release answered (the root's `on_http_call_response`): the gauges follow
    /// the ledgers it reports, each set once to its newest state in the call (a batch's ends
    /// mostly report the same few ledgers).
    pub fn ended(&self, token: u32, num_headers: usize, body_size: usize) {
        if let Ledgers::Shared { remote, leases } = &self.ledgers {
            if let Some(state) = leases
                .as_ref()
                .and_then(|l| l.answered(token, num_headers, body_size))
            {
                let states = state
                    .as_ref()
                    .map(|(_, s)| std::slice::from_ref(s))
                    .unwrap_or(&[]);
                let gauges = router_core::budget::remote::gauges(&self.compiled, states);
                self.stats.record_all(&gauges);
                if let Some((_, s)) = state {
                    self.lease_saw(s);
                }
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

    /// Ends what the request holds, in its mode: settles `charge`, or releases (`None`). A
    /// reservation whose answer is still out (the client left first) is released by its id.
    /// `now`: the request is still there to wait for the shared ledger's answer (its last
    /// response chunk), so a shared settle goes out at once ([`Holding::Settling`]) instead of
    /// being queued for the root.
    fn finish(&self, m: &mut Metered, charge: Option<Amount>, now: bool) {
        let amount = charge.unwrap_or(Amount::ZERO);
        match std::mem::replace(&mut m.holding, Holding::Ended) {
            Holding::Ledgers(held) => self.settle_in_ledgers(held, amount),
            Holding::WorkerLeases(held) => self.end_on_worker_lease(held, amount),
            Holding::Remote(h) => {
                let Ledgers::Shared { remote, .. } = &self.ledgers else {
                    return;
                };
                if now && h.pending.is_none() {
                    if let Some((token, end)) =
                        remote.end_now(&self.compiled, &h.keys, &h.reservation, charge)
                    {
                        m.holding = Holding::Settling(token, end);
                    }
                } else {
                    remote.end(&self.compiled, &h.keys, &h.reservation, charge);
                }
            }
            Holding::Lease(h) => {
                if let Ledgers::Shared {
                    leases: Some(l), ..
                } = &self.ledgers
                {
                    l.end(&h, charge);
                }
            }
            // Already ended; a settle still out stays this request's to wait for.
            held @ Holding::Settling(..) => m.holding = held,
            // Still held for room (admitted ones took their holds first): the root forgets it.
            Holding::Waiting(w) => *w.borrow_mut() = RoomWait::Gone,
            Holding::Ended => {}
        }
    }

    /// Keeps a lease report's ledger state, newest per ledger (at most one per lease: a worker
    /// holds a bounded number).
    fn lease_saw(&self, s: LedgerState) {
        let mut seen = self.lease_seen.borrow_mut();
        let full = seen.len() >= LEASE_SEEN_MAX;
        match seen
            .iter_mut()
            .find(|o| o.budget == s.budget && o.team == s.team)
        {
            Some(o) if o.version <= s.version => *o = s,
            Some(_) => {}
            None if !full => seen.push(s),
            None => {}
        }
    }

    /// The rate-limit view of a lease-admitted request: its ledgers as the last lease reports
    /// answered them (at most a report period old; the leases' own unused room counts as held).
    /// `None` when no report has answered yet.
    fn lease_rate(&self, keys: &[LedgerKey]) -> Option<RateLimit> {
        let seen = self.lease_seen.borrow();
        let states: Vec<LedgerState> = keys
            .iter()
            .filter_map(|k| {
                let name = &self.compiled.budgets.get(k.budget)?.name;
                seen.iter()
                    .find(|s| s.budget == *name && s.team == k.team)
                    .cloned()
            })
            .collect();
        (!states.is_empty()).then(|| self.rate_limit_of(&states))
    }

    /// The rate-limit view of the ledger states in a shared-ledger answer. The service does not
    /// say when a ledger's spend rolls off: the reset is its window, an upper bound.
    fn rate_limit_of(&self, states: &[router_core::budget::protocol::LedgerState]) -> RateLimit {
        let mut rate = RateLimit::default();
        for s in states {
            let Some(b) = self.compiled.budgets.iter().find(|b| b.name == s.budget) else {
                continue;
            };
            let pico = router_core::budget::money::parse_usd(&s.usd_used).unwrap_or(0);
            rate.add(&Seen {
                caps: b.caps,
                spent: Amount::new(s.tokens_used, pico),
                held: Amount::new(s.tokens_reserved, 0),
                reset_ms: b.window_s.saturating_mul(1000),
            });
        }
        rate
    }

    fn refusal(&self, refusal: &Refusal, rate: RateLimit) -> Answer {
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
        Answer::Refused(
            reply::exceeded(
                &names,
                refusal.retry_after_s(window),
                refusal.wait == Wait::Never,
            ),
            Box::new(rate),
        )
    }

    /// The response headers came through with `status` from backend `served`.
    pub fn on_response_headers(&self, m: &mut Metered, status: u32, served: Option<usize>) {
        m.take_admitted();
        if (200..300).contains(&status) {
            if let Some(rate) = &m.rate {
                crate::budget_headers::send(rate);
            }
            m.served = Some(served);
        }
    }

    /// The response ended (its last body chunk, or headers without a body), `meter` having
    /// read it. `true`: that chunk waits for the shared ledger's answer to the settle
    /// ([`Budgets::settle_answered`] resumes it).
    pub fn on_response_end(
        &self,
        m: &mut Metered,
        meter: &mut Meter,
        audit: &mut AuditRecord,
    ) -> bool {
        if m.served.is_some() {
            self.settle(m, meter, audit, true);
        }
        m.settling()
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
        let Ledgers::Shared { remote, .. } = &self.ledgers else {
            return false;
        };
        if !matches!(&m.holding, Holding::Settling(t, _) if *t == token) {
            return false;
        }
        let Holding::Settling(_, end) = std::mem::replace(&mut m.holding, Holding::Ended) else {
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
    pub fn end(&self, m: &mut Metered, meter: &mut Meter, audit: &mut AuditRecord) {
        m.take_admitted();
        match std::mem::replace(&mut m.holding, Holding::Ended) {
            Holding::Settling(_, end) => {
                // Its answer would come to a context that is going: the root sends it again.
                if let Ledgers::Shared { remote, .. } = &self.ledgers {
                    remote.requeue(end);
                }
                return;
            }
            Holding::Ended => return,
            held => m.holding = held,
        }
        if m.served.is_some() && meter.content_bytes() > 0 {
            self.settle(m, meter, audit, false);
            return;
        }
        self.finish(m, None, false);
    }

    /// Charges the request. `now`: the request is still there to wait for the shared ledger's
    /// answer (its last response chunk), so the settle goes out at once instead of being queued.
    fn settle(&self, m: &mut Metered, meter: &mut Meter, audit: &mut AuditRecord, now: bool) {
        let Some(c): Option<Charge> = meter.charge() else {
            self.finish(m, None, now);
            return;
        };
        let price = m
            .served
            .flatten()
            .and_then(|b| self.attempts.get(b))
            .map(|a| a.price)
            .unwrap_or_default();
        let amount = charged(&price, &c);
        if c.estimated {
            for b in m.budgets() {
                self.stats.estimated(b);
            }
        }
        self.finish(m, Some(amount), now);
        audit.usd = Some(format_usd(amount.pico));
    }

    /// Settles the holds in the ledgers themselves (per-request mode; a zero `amount` is a
    /// release): one compare-and-swap each, and the gauges from the state it left.
    fn settle_in_ledgers(&self, held: Vec<Held>, amount: Amount) {
        let now = now_ms();
        let store = self.store(|k| held_name(&held, k), now);
        for h in &held {
            // Charge-after holds nothing: a release has nothing to do.
            if (h.hold.is_none() && amount == Amount::ZERO) || !self.slot_still_owned(h, now) {
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
            .ok()
            .flatten()
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
fn push_decimal(s: &mut String, v: u64) {
    let mut digits = [0u8; 20];
    for &d in router_core::budget::ratelimit::decimal(v, &mut digits) {
        s.push(char::from(d));
    }
}

/// The ledgers a request holds: `holds[i]` on `keys[i]` under shared-data key `names[i]`
/// (charge-after holds nothing: `None` for every ledger).
fn held_of(keys: Vec<LedgerKey>, holds: Vec<Hold>, names: Vec<(Rc<str>, u64)>) -> Vec<Held> {
    let holds = holds.into_iter().map(Some).chain(std::iter::repeat(None));
    keys.into_iter()
        .zip(holds)
        .zip(names)
        .map(|((key, hold), (shared, owned_until))| Held {
            key,
            shared,
            hold,
            owned_until,
        })
        .collect()
}

/// An admitted request, what it holds and its body edit.
fn admitted(splice: Option<Splice>, holding: Holding) -> Admitted {
    Admitted {
        metered: Metered {
            holding,
            served: None,
            rate: None,
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
