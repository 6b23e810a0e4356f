//! Ledgers in Redis: one Lua script (`ledger.lua`) per ledger operation, atomic on the ledger's
//! three keys, which share one hash tag so Redis Cluster keeps them on one node.

use crate::conn::Connector;
use router_core::budget::window::Geometry;
use router_core::budget::wire::{LedgerRef, Utilization};
use router_core::budget::{Amount, Caps};
use std::collections::HashSet;
use std::sync::Mutex;

const SCRIPT: &str = include_str!("ledger.lua");

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

/// The script's answer: two integers, then the ledger (spent tokens, pico, held tokens, pico)
/// and the answer's version.
type ScriptReply = (i64, i64, u64, String, u64, String, u64);

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
    /// Test-only: check without holding (what charge-after gateways do), to show the concurrency
    /// test can fail.
    hold: bool,
    /// Budgets and teams already recorded for status, so each is written once per process.
    known: Mutex<HashSet<String>>,
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
            hold: o.hold,
            known: Mutex::new(HashSet::new()),
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

    #[allow(clippy::too_many_arguments)]
    async fn call<T: redis::FromRedisValue>(
        &self,
        op: &str,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        id: &str,
        amount: Amount,
        ttl_ms: u64,
        caps: Caps,
    ) -> Result<T, StoreError> {
        let key = Self::ledger_key(router, l);
        let g = Geometry::window(l.window_s);
        let mut c = self.conn.get().await?;
        let now: i64 = clock.map_or(-1, |t| t as i64);
        let r = self
            .script
            .key(format!("{key}:w"))
            .key(format!("{key}:r"))
            .key(format!("{key}:x"))
            .arg(op)
            .arg(now)
            .arg(g.width_ms)
            .arg(g.lifetime_ms)
            .arg(id)
            .arg(amount.tokens)
            .arg(amount.pico.to_string())
            .arg(ttl_ms)
            .arg(caps.tokens.map_or(-1i64, |t| t.min(i64::MAX as u64) as i64))
            .arg(caps.pico.map_or("-1".to_string(), |p| p.to_string()))
            .invoke_async(&mut c)
            .await?;
        Ok(r)
    }

    pub async fn reserve(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        id: &str,
        amount: Amount,
        ttl_ms: u64,
    ) -> Result<(Reserve, LedgerUse), StoreError> {
        let caps = l.caps().map_err(StoreError::Internal)?;
        let op = if self.hold { "reserve" } else { "check" };
        let (ok, wait, st, sp, ht, hp, version): ScriptReply = self
            .call(op, clock, router, l, id, amount, ttl_ms, caps)
            .await?;
        self.remember(router, l).await?;
        let outcome = match (ok, wait) {
            (1, _) => Reserve::Held,
            (2, _) => Reserve::Ended,
            (_, w) if w < 0 => Reserve::Refused(None),
            (_, w) => Reserve::Refused(Some(w.max(1) as u64)),
        };
        let now = LedgerUse {
            version,
            ..ledger_use(st, &sp, ht, &hp)?
        };
        Ok((outcome, now))
    }

    /// Drops the hold `id` (if it is still there) and charges `actual` (zero for a release),
    /// once: the id is then marked ended for `ttl_ms`, so a repeated settle charges nothing and
    /// a reserve of that id arriving late holds nothing. Returns whether the hold was found (it
    /// may have expired, ended already, or not arrived yet).
    pub async fn settle(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        id: &str,
        actual: Option<Amount>,
        ttl_ms: u64,
    ) -> Result<(bool, LedgerUse), StoreError> {
        let op = if actual.is_some() {
            "settle"
        } else {
            "release"
        };
        let (found, _, st, sp, ht, hp, version): ScriptReply = self
            .call(
                op,
                clock,
                router,
                l,
                id,
                actual.unwrap_or(Amount::ZERO),
                ttl_ms,
                Caps::default(),
            )
            .await?;
        let now = LedgerUse {
            version,
            ..ledger_use(st, &sp, ht, &hp)?
        };
        Ok((found == 1, now))
    }

    /// (spent, held) on one ledger.
    pub async fn usage(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
    ) -> Result<(Amount, Amount), StoreError> {
        let (st, sp, ht, hp): (u64, String, u64, String) = self
            .call(
                "status",
                clock,
                router,
                l,
                "",
                Amount::ZERO,
                0,
                Caps::default(),
            )
            .await?;
        let u = ledger_use(st, &sp, ht, &hp)?;
        Ok((u.spent, u.held))
    }

    fn budgets_key(router: &str) -> String {
        format!("llmkube:{{{router}}}:budgets")
    }
    fn teams_key(router: &str, budget: &str) -> String {
        format!("llmkube:{{{router}|{budget}}}:teams")
    }

    /// Records a budget's spec and team for `status` (once per process for each).
    async fn remember(&self, router: &str, l: &LedgerRef) -> Result<(), StoreError> {
        let spec = LedgerRef {
            team: l.team.as_ref().map(|_| String::new()),
            ..l.clone()
        };
        let spec_json =
            serde_json::to_string(&spec).map_err(|e| StoreError::Internal(e.to_string()))?;
        let spec_mark = format!("{router}\u{0}{}\u{0}{spec_json}", l.budget);
        let team_mark = l
            .team
            .as_ref()
            .map(|t| format!("{router}\u{0}{}\u{0}\u{0}{t}", l.budget));
        let (new_spec, new_team) = {
            let known = self
                .known
                .lock()
                .map_err(|_| StoreError::Internal("lock".into()))?;
            (
                !known.contains(&spec_mark),
                team_mark.as_ref().is_some_and(|m| !known.contains(m)),
            )
        };
        let mut c = self.conn.get().await?;
        if new_spec {
            redis::cmd("HSET")
                .arg(Self::budgets_key(router))
                .arg(&l.budget)
                .arg(&spec_json)
                .query_async::<i64>(&mut c)
                .await?;
        }
        if new_team {
            redis::cmd("SADD")
                .arg(Self::teams_key(router, &l.budget))
                .arg(l.team.as_deref().unwrap_or(""))
                .query_async::<i64>(&mut c)
                .await?;
        }
        if let Ok(mut known) = self.known.lock() {
            known.insert(spec_mark);
            if let Some(m) = team_mark {
                known.insert(m);
            }
        }
        Ok(())
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
            let mut teams: Vec<String> = redis::cmd("SMEMBERS")
                .arg(Self::teams_key(router, &name))
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
