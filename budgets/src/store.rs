//! Ledgers in Redis: one Lua script (`ledger.lua`) per ledger operation, atomic on the ledger's
//! three keys, which share one hash tag so Redis Cluster keeps them on one node.

use crate::conn::Connector;
use futures_util::future::join_all;
use router_core::budget::protocol::{LedgerRef, Utilization};
use router_core::budget::window::Geometry;
use router_core::budget::{Amount, Caps};
use std::collections::HashSet;
use std::sync::Mutex;

pub mod lease;

const SCRIPT: &str = include_str!("ledger.lua");
const TEAMS_SCRIPT: &str = include_str!("teams.lua");

/// How a store call failed.
#[derive(Debug)]
pub enum StoreError {
    /// Redis cannot be reached or is not serving: the filter answers 503 `budget_store_unavailable`.
    Unavailable(String),
    /// Anything else (a script or protocol error): a bug, 500.
    Internal(String),
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        use redis::{ErrorKind, ServerErrorKind as S};
        let down = match e.kind() {
            ErrorKind::Server(k) => matches!(
                k,
                S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly
            ),
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => false,
            _ => true,
        };
        let text = e.to_string();
        if down || e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
            StoreError::Unavailable(text)
        } else {
            StoreError::Internal(text)
        }
    }
}

/// The outcome of a reservation attempt on one ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// Held (in `--unsafe-check-only` mode: would fit, not held). A reserve repeated with the
    /// same id is held once.
    Held,
    /// The id was already settled or released (its release came first): nothing is held.
    Ended,
    /// Refused: seconds to wait, or `None` when the request alone is over the cap.
    Refused(Option<u64>),
    /// Refused by holds alone (what is spent leaves room for it) while leases hold room: they
    /// are asked to give their unused room back, so the same reserve soon fits (a refusal
    /// with a wait of 1 s to a caller that does not wait for it).
    Reclaiming,
    /// Would fit, but another ledger of the request refused (or failed), so nothing is held.
    NotHeld,
    /// A new team of a team budget that already has its `max_teams` active teams: seconds
    /// until one of them has rolled off.
    TeamsFull(u64),
}

impl Reserve {
    /// This ledger refused the request.
    pub fn refused(&self) -> bool {
        matches!(self, Reserve::Refused(_) | Reserve::Reclaiming)
    }
}

/// A ledger as one script call left it: spent in the window and held by requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LedgerUse {
    pub spent: Amount,
    pub held: Amount,
    /// Orders this answer after every earlier one on the ledger (`stamp` in ledger.lua); 0 for
    /// a status read, which no gateway's gauges take.
    pub version: u64,
}

/// Strings per ledger in the script's answer: code, wait, spent tokens, spent pico, held
/// tokens, held pico, version.
const REPLY_FIELDS: usize = 7;

/// A reserve code of ledger.lua.
fn reserve_outcome(code: i64, wait: i64) -> Reserve {
    match code {
        1 => Reserve::Held,
        2 => Reserve::Ended,
        3 => Reserve::NotHeld,
        4 => Reserve::Reclaiming,
        _ if wait < 0 => Reserve::Refused(None),
        _ => Reserve::Refused(Some(wait.max(1) as u64)),
    }
}

fn ledger_use(st: u64, sp: &str, ht: u64, hp: &str) -> Result<LedgerUse, StoreError> {
    let pico = |s: &str| {
        s.parse::<u64>()
            .map_err(|e| StoreError::Internal(format!("bad amount {s:?} in Redis: {e}")))
    };
    Ok(LedgerUse {
        spent: Amount::new(st, pico(sp)?),
        held: Amount::new(ht, pico(hp)?),
        version: 0,
    })
}

pub struct RedisStore {
    conn: Connector,
    script: redis::Script,
    teams_script: redis::Script,
    /// Test-only: check without holding (what charge-after gateways do), to show the concurrency
    /// test can fail.
    hold: bool,
    /// Budget specs already recorded for status, so each is written once per process.
    known: Mutex<HashSet<String>>,
    /// Teams this process placed in their budget's index lately (no second call needed).
    active: ActiveTeams,
}

/// How the store talks to Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// `false` only for the test-only `--unsafe-check-only`.
    pub hold: bool,
    /// `url` is one node of a Redis Cluster.
    pub cluster: bool,
    /// Per Redis call; past it the answer is 503 `budget_store_unavailable`.
    pub timeout: std::time::Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            hold: true,
            cluster: false,
            timeout: std::time::Duration::from_millis(DEFAULT_TIMEOUT_MS),
        }
    }
}

/// Default `--redis-timeout-ms`.
pub const DEFAULT_TIMEOUT_MS: u64 = 1000;

/// A fixed time instead of Redis `TIME` (the shared table of cases); `None` in service.
pub type Clock = Option<u64>;

impl RedisStore {
    /// Connects lazily: the service starts without Redis and answers 503 until it is reachable.
    pub fn new(url: &str, o: &StoreOptions) -> Result<RedisStore, String> {
        Ok(RedisStore {
            conn: Connector::new(url, o.cluster, o.timeout)?,
            script: redis::Script::new(SCRIPT),
            teams_script: redis::Script::new(TEAMS_SCRIPT),
            hold: o.hold,
            known: Mutex::new(HashSet::new()),
            active: ActiveTeams::default(),
        })
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut c = self.conn.get().await?;
        redis::cmd("PING").query_async::<String>(&mut c).await?;
        Ok(())
    }

    /// `llmkube:{<router>|<budget>|<team>}`: everything in braces is the hash tag. The team goes
    /// last, so a `|` in it cannot make two ledgers' names collide.
    pub fn ledger_key(router: &str, l: &LedgerRef) -> String {
        format!(
            "llmkube:{{{}|{}|{}}}",
            router,
            l.budget,
            l.team.as_deref().unwrap_or("")
        )
    }

    /// Redis Cluster: a request's ledgers sit in different slots, so each gets its own call,
    /// all at once; the answers come back in the ledgers' order.
    #[allow(clippy::too_many_arguments)]
    async fn per_ledger(
        &self,
        op: &str,
        clock: Clock,
        router: &str,
        refs: &[&LedgerRef],
        id: &str,
        amount: Amount,
        ttl_ms: u64,
        with_caps: bool,
    ) -> Vec<Result<Vec<(i64, i64, LedgerUse)>, StoreError>> {
        join_all(refs.iter().map(|l| {
            self.call(
                op,
                clock,
                router,
                std::slice::from_ref(l),
                id,
                amount,
                ttl_ms,
                with_caps,
            )
        }))
        .await
    }

    /// One script call on `ledgers` (all in one hash slot, or any in a single Redis): the
    /// ledgers as the call left them, with the script's code and wait for each.
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        op: &str,
        clock: Clock,
        router: &str,
        ledgers: &[&LedgerRef],
        id: &str,
        amount: Amount,
        ttl_ms: u64,
        with_caps: bool,
    ) -> Result<Vec<(i64, i64, LedgerUse)>, StoreError> {
        let mut inv = self.script.prepare_invoke();
        let now: i64 = clock.map_or(-1, |t| t as i64);
        inv.arg(op)
            .arg(now)
            .arg(id)
            .arg(amount.tokens)
            .arg(amount.pico.to_string())
            .arg(ttl_ms);
        for l in ledgers {
            let key = Self::ledger_key(router, l);
            let g = Geometry::window(l.window_s);
            let caps = if with_caps {
                l.caps().map_err(StoreError::Internal)?
            } else {
                Caps::default()
            };
            inv.key(format!("{key}:w"))
                .key(format!("{key}:r"))
                .key(format!("{key}:x"))
                .arg(g.width_ms)
                .arg(g.lifetime_ms)
                .arg(caps.tokens.map_or(-1i64, |t| t.min(i64::MAX as u64) as i64))
                .arg(caps.pico.map_or("-1".to_string(), |p| p.to_string()));
        }
        let mut c = self.conn.get().await?;
        let reply: Vec<String> = inv.invoke_async(&mut c).await?;
        if reply.len() != REPLY_FIELDS * ledgers.len() {
            return Err(StoreError::Internal(format!(
                "ledger script answered {} fields for {} ledgers",
                reply.len(),
                ledgers.len()
            )));
        }
        reply
            .chunks(REPLY_FIELDS)
            .map(|f| {
                let int = |s: &str| {
                    s.parse::<i64>().map_err(|e| {
                        StoreError::Internal(format!("bad number {s:?} in Redis: {e}"))
                    })
                };
                let (st, ht, v) = (int(&f[2])?, int(&f[4])?, int(&f[6])?);
                let u = ledger_use(st.max(0) as u64, &f[3], ht.max(0) as u64, &f[5])?;
                Ok((
                    int(&f[0])?,
                    int(&f[1])?,
                    LedgerUse {
                        version: v.max(0) as u64,
                        ..u
                    },
                ))
            })
            .collect()
    }

    /// Reserves `amount` on every ledger of `ledgers` under `id`, all or nothing: in a single
    /// Redis by one script call (atomic across them, nothing held when one refuses); in a
    /// cluster, where each ledger has its own hash slot, by one call per ledger at once, then
    /// the holds taken are released when one refused or failed. A team this process has not
    /// placed lately must first get a place in its budget's index of active teams
    /// (`teams.lua`), of at most `max_teams`; when there is none, nothing is reserved and that
    /// ledger answers [`Reserve::TeamsFull`].
    #[allow(clippy::too_many_arguments)]
    pub async fn reserve_all(
        &self,
        clock: Clock,
        router: &str,
        ledgers: &[LedgerRef],
        id: &str,
        amount: Amount,
        ttl_ms: u64,
        max_teams: Option<u64>,
    ) -> Result<Vec<(Reserve, LedgerUse)>, StoreError> {
        // Every team with a ledger is in its budget's index (status lists them from it); the
        // bound applies when the gateway sends one.
        {
            let max = max_teams.unwrap_or(u64::MAX);
            let new: Vec<LedgerRef> = ledgers
                .iter()
                .filter(|l| l.team.is_some() && !self.active.is_fresh(router, l))
                .cloned()
                .collect();
            if !new.is_empty() {
                let admitted = self
                    .teams("admit", clock, router, &new, max, ttl_ms)
                    .await?;
                if admitted.iter().any(Option::is_some) {
                    return Ok(ledgers
                        .iter()
                        .map(|l| {
                            let full = new
                                .iter()
                                .zip(&admitted)
                                .find(|(n, _)| *n == l)
                                .and_then(|(_, w)| *w);
                            let what = match full {
                                Some(ms) => Reserve::TeamsFull(ms.div_ceil(1000).max(1)),
                                None => Reserve::NotHeld,
                            };
                            (what, LedgerUse::default())
                        })
                        .collect());
                }
                for l in &new {
                    self.active.admitted(router, l, ttl_ms);
                }
            }
        }
        self.reserve_holds(clock, router, ledgers, id, amount, ttl_ms)
            .await
    }

    async fn reserve_holds(
        &self,
        clock: Clock,
        router: &str,
        ledgers: &[LedgerRef],
        id: &str,
        amount: Amount,
        ttl_ms: u64,
    ) -> Result<Vec<(Reserve, LedgerUse)>, StoreError> {
        let op = if self.hold { "reserve" } else { "check" };
        let refs: Vec<&LedgerRef> = ledgers.iter().collect();
        let mut out: Vec<(Reserve, LedgerUse)> = if self.conn.is_cluster() {
            let calls = self
                .per_ledger(op, clock, router, &refs, id, amount, ttl_ms, true)
                .await;
            let mut out = Vec::with_capacity(ledgers.len());
            let mut failure = None;
            for r in calls {
                match r.and_then(|mut v| {
                    v.pop()
                        .ok_or_else(|| StoreError::Internal("empty answer".into()))
                }) {
                    Ok((code, wait, now)) => out.push((reserve_outcome(code, wait), now)),
                    Err(e) => {
                        failure = Some(e);
                        out.push((Reserve::NotHeld, LedgerUse::default()));
                    }
                }
            }
            let refused = out.iter().any(|(r, _)| r.refused());
            if refused || failure.is_some() {
                // Across nodes there is no atomic call: the holds already taken go again. A
                // failed release leaves a hold that expires at its ttl, never a leak.
                let taken: Vec<usize> = (0..out.len())
                    .filter(|&i| out[i].0 == Reserve::Held && self.hold)
                    .collect();
                let undone = join_all(taken.iter().map(|&i| {
                    self.call(
                        "release",
                        clock,
                        router,
                        std::slice::from_ref(&refs[i]),
                        id,
                        Amount::ZERO,
                        ttl_ms,
                        false,
                    )
                }))
                .await;
                for (&i, r) in taken.iter().zip(undone) {
                    out[i].0 = Reserve::NotHeld;
                    if let Ok(Some((_, _, now))) = r.map(|mut v| v.pop()) {
                        out[i].1 = now;
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            out
        } else {
            self.call(op, clock, router, &refs, id, amount, ttl_ms, true)
                .await?
                .into_iter()
                .map(|(code, wait, now)| (reserve_outcome(code, wait), now))
                .collect()
        };
        for l in ledgers {
            self.remember(router, l).await?;
        }
        if !self.hold {
            // Check-only: every ledger is asked on its own, as charge-after gateways do.
            for o in &mut out {
                if o.0 == Reserve::NotHeld {
                    o.0 = Reserve::Held;
                }
            }
        }
        Ok(out)
    }

    /// One ledger of [`RedisStore::reserve_all`].
    pub async fn reserve(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        id: &str,
        amount: Amount,
        ttl_ms: u64,
    ) -> Result<(Reserve, LedgerUse), StoreError> {
        let mut v = self
            .reserve_all(
                clock,
                router,
                std::slice::from_ref(l),
                id,
                amount,
                ttl_ms,
                None,
            )
            .await?;
        v.pop()
            .ok_or_else(|| StoreError::Internal("empty answer".into()))
    }

    /// Drops the hold `id` on every ledger (where it is still there) and charges `actual`
    /// (zero for a release), once: the id is then marked ended for `ttl_ms`, so a repeated
    /// settle charges nothing and a reserve of that id arriving late holds nothing. Per ledger:
    /// whether the hold was found (it may have expired, ended already, or not arrived yet), and
    /// the ledger after. One script call in a single Redis, one per ledger in a cluster.
    pub async fn settle_all(
        &self,
        clock: Clock,
        router: &str,
        ledgers: &[LedgerRef],
        id: &str,
        actual: Option<Amount>,
        ttl_ms: u64,
    ) -> Result<Vec<(bool, LedgerUse)>, StoreError> {
        let op = if actual.is_some() {
            "settle"
        } else {
            "release"
        };
        let amount = actual.unwrap_or(Amount::ZERO);
        let refs: Vec<&LedgerRef> = ledgers.iter().collect();
        // The ledger's keys live on after this call: so does its team's place (sent with the
        // settle, one round trip). A failed touch is not the settle's failure: the place only
        // bounds how many teams are admitted, it keeps no spend.
        let touch = async {
            if ledgers.iter().any(|l| l.team.is_some()) {
                let _ = self
                    .teams("touch", clock, router, ledgers, u64::MAX, ttl_ms)
                    .await;
            }
        };
        let (answers, ()) = futures_util::future::join(
            self.settle_calls(op, clock, router, &refs, id, amount, ttl_ms),
            touch,
        )
        .await;
        Ok(answers?
            .into_iter()
            .map(|(found, _, now)| (found == 1, now))
            .collect())
    }

    #[allow(clippy::too_many_arguments)]
    async fn settle_calls(
        &self,
        op: &str,
        clock: Clock,
        router: &str,
        refs: &[&LedgerRef],
        id: &str,
        amount: Amount,
        ttl_ms: u64,
    ) -> Result<Vec<(i64, i64, LedgerUse)>, StoreError> {
        let answers = if self.conn.is_cluster() {
            let calls = self
                .per_ledger(op, clock, router, refs, id, amount, ttl_ms, false)
                .await;
            let mut all = Vec::with_capacity(refs.len());
            for r in calls {
                all.extend(r?);
            }
            all
        } else {
            self.call(op, clock, router, refs, id, amount, ttl_ms, false)
                .await?
        };
        Ok(answers)
    }

    /// One ledger of [`RedisStore::settle_all`].
    pub async fn settle(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        id: &str,
        actual: Option<Amount>,
        ttl_ms: u64,
    ) -> Result<(bool, LedgerUse), StoreError> {
        let mut v = self
            .settle_all(clock, router, std::slice::from_ref(l), id, actual, ttl_ms)
            .await?;
        v.pop()
            .ok_or_else(|| StoreError::Internal("empty answer".into()))
    }

    /// (spent, held) on one ledger.
    pub async fn usage(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
    ) -> Result<(Amount, Amount), StoreError> {
        let mut v = self
            .call("status", clock, router, &[l], "", Amount::ZERO, 0, false)
            .await?;
        let (_, _, u) = v
            .pop()
            .ok_or_else(|| StoreError::Internal("empty answer".into()))?;
        Ok((u.spent, u.held))
    }

    fn budgets_key(router: &str) -> String {
        format!("llmkube:{{{router}}}:budgets")
    }
    /// A team budget's index of active teams (`teams.lua`).
    pub fn active_key(router: &str, budget: &str) -> String {
        format!("llmkube:{{{router}|{budget}}}:active")
    }

    /// Records a budget's spec for `status` (once per process for each; teams are in their
    /// budget's index of active teams, `teams.lua`).
    async fn remember(&self, router: &str, l: &LedgerRef) -> Result<(), StoreError> {
        let spec = LedgerRef {
            team: l.team.as_ref().map(|_| String::new()),
            ..l.clone()
        };
        let spec_json =
            serde_json::to_string(&spec).map_err(|e| StoreError::Internal(e.to_string()))?;
        let spec_mark = format!("{router}\u{0}{}\u{0}{spec_json}", l.budget);
        let known = self
            .known
            .lock()
            .map_err(|_| StoreError::Internal("lock".into()))?
            .contains(&spec_mark);
        if known {
            return Ok(());
        }
        let mut c = self.conn.get().await?;
        redis::cmd("HSET")
            .arg(Self::budgets_key(router))
            .arg(&l.budget)
            .arg(&spec_json)
            .query_async::<i64>(&mut c)
            .await?;
        if let Ok(mut known) = self.known.lock() {
            known.insert(spec_mark);
        }
        Ok(())
    }

    /// For every team ledger of a call: `admit` (a reserve: a new team is refused while its
    /// budget has `max_teams` teams whose ledgers have not rolled off) or `touch` (a settle or
    /// release: the team's time is refreshed, never refused). Per ledger, `Some(ms)` when
    /// refused: how long until a place frees.
    async fn teams(
        &self,
        op: &str,
        clock: Clock,
        router: &str,
        ledgers: &[LedgerRef],
        max_teams: u64,
        ttl_ms: u64,
    ) -> Result<Vec<Option<u64>>, StoreError> {
        let calls = ledgers.iter().map(|l| async move {
            let Some(team) = &l.team else {
                return Ok(None);
            };
            let g = Geometry::window(l.window_s);
            // As long as the ledger's keys live after this call (ledger.lua `keep_keys`), and
            // a second for the two scripts' clocks.
            let keep = g.lifetime_ms + g.width_ms + ttl_ms + 60_000 + 1000;
            let mut c = self.conn.get().await?;
            let (ok, wait): (i64, i64) = self
                .teams_script
                .key(Self::active_key(router, &l.budget))
                .arg(op)
                .arg(team)
                .arg(keep)
                .arg(max_teams)
                .arg(clock.map_or(-1, |t| t as i64))
                .invoke_async(&mut c)
                .await?;
            Ok::<_, StoreError>((ok != 1).then_some(wait.max(1) as u64))
        });
        join_all(calls).await.into_iter().collect()
    }

    /// The seed's `status.budgetUtilization` for one router, from what Redis holds now. A team
    /// budget's entry is its most utilised team, with every team listed under `teams`.
    pub async fn status(&self, clock: Clock, router: &str) -> Result<Vec<Utilization>, StoreError> {
        let mut c = self.conn.get().await?;
        let specs: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(Self::budgets_key(router))
            .query_async(&mut c)
            .await?;
        let mut out = Vec::new();
        for (name, json) in specs {
            let Ok(spec) = serde_json::from_str::<LedgerRef>(&json) else {
                continue;
            };
            let Ok(caps) = spec.caps() else { continue };
            if spec.team.is_none() {
                out.push(self.one(clock, router, &spec, &caps, name).await?);
                continue;
            }
            let mut teams: Vec<String> = redis::cmd("ZRANGE")
                .arg(Self::active_key(router, &name))
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await?;
            teams.sort();
            let mut entries = Vec::new();
            for t in teams {
                let l = LedgerRef {
                    team: Some(t.clone()),
                    ..spec.clone()
                };
                let mut u = self.one(clock, router, &l, &caps, name.clone()).await?;
                u.team = Some(t);
                entries.push(u);
            }
            let top = entries
                .iter()
                .max_by(|a, b| a.utilization.cmp(&b.utilization))
                .cloned();
            let mut head = top.unwrap_or_else(|| {
                Utilization::of(name.clone(), &caps, Amount::ZERO, Amount::ZERO)
            });
            head.teams = entries;
            out.push(head);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn one(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        caps: &Caps,
        name: String,
    ) -> Result<Utilization, StoreError> {
        let (spent, held) = self.usage(clock, router, l).await?;
        Ok(Utilization::of(name, caps, spent, held))
    }
}

/// Teams this process placed (or found) in their budget's index of active teams, with until
/// when that place is certain: `teams.lua` gives a place away only after its time, which is at
/// least the keep time after this process's call, so for half of it (by this process's own
/// clock, which need not agree with Redis' on the hour, only on how long a second is) a
/// reserve of that team needs no `admit` call. Bounded: past [`ACTIVE_CACHE`] entries the
/// stale ones go, and if all are fresh the cache starts over (costing only `admit` calls).
#[derive(Default)]
struct ActiveTeams {
    fresh: Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// Most teams [`ActiveTeams`] remembers.
const ACTIVE_CACHE: usize = 65_536;

impl ActiveTeams {
    fn key(router: &str, l: &LedgerRef) -> String {
        format!(
            "{router}\u{0}{}\u{0}{}",
            l.budget,
            l.team.as_deref().unwrap_or("")
        )
    }

    fn is_fresh(&self, router: &str, l: &LedgerRef) -> bool {
        let Ok(fresh) = self.fresh.lock() else {
            return false;
        };
        fresh
            .get(&Self::key(router, l))
            .is_some_and(|until| std::time::Instant::now() < *until)
    }

    fn admitted(&self, router: &str, l: &LedgerRef, ttl_ms: u64) {
        let g = Geometry::window(l.window_s);
        let half = (g.lifetime_ms + g.width_ms + ttl_ms + 60_000) / 2;
        let now = std::time::Instant::now();
        let Ok(mut fresh) = self.fresh.lock() else {
            return;
        };
        if fresh.len() >= ACTIVE_CACHE {
            fresh.retain(|_, until| now < *until);
            if fresh.len() >= ACTIVE_CACHE {
                fresh.clear();
            }
        }
        fresh.insert(
            Self::key(router, l),
            now + std::time::Duration::from_millis(half),
        );
    }
}
