//! The `lease` op of ledger.lua (lease mode, docs/budgets.md): one ledger's lease reported and
//! renewed in one script call.

use super::{Clock, LedgerUse, RedisStore, StoreError, REPLY_FIELDS};
use router_core::budget::protocol::LedgerRef;
use router_core::budget::window::{Amount, Geometry};

/// What a lease call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    /// The new lease's size (zero: nothing is held).
    pub granted: Amount,
    /// `false`: this report had been applied already (sent again after a lost answer).
    pub applied: bool,
    pub ledger: LedgerUse,
    /// A new team's lease refused a place in its budget's index of active teams (`max_teams`
    /// live already): nothing granted, nothing run; ms until a place frees.
    pub teams_full: Option<u64>,
}

/// One lease report: see `router_core::budget::protocol::LeaseRequest`.
#[derive(Debug, Clone, Copy)]
pub struct LeaseCall<'a> {
    pub old: Option<&'a str>,
    pub id: &'a str,
    pub used: Amount,
    pub admitted: Amount,
    pub max: Amount,
    pub ttl_ms: u64,
    /// A team ledger's bound on its budget's active teams (`teams.lua`).
    pub max_teams: Option<u64>,
    pub unheld: bool,
}

impl RedisStore {
    /// The live leases of a ledger, by expiry (same hash tag as its other keys).
    pub fn leases_key(router: &str, l: &LedgerRef) -> String {
        format!("{}:l", Self::ledger_key(router, l))
    }

    /// Reports `c.used` on the old lease and takes the next one, atomically on the ledger.
    pub async fn lease(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        c: LeaseCall<'_>,
    ) -> Result<Leased, StoreError> {
        let caps = l.caps().map_err(StoreError::Internal)?;
        if let Some(wait) = self.place_team(clock, router, l, &c).await? {
            return Ok(Leased {
                granted: Amount::ZERO,
                applied: true,
                ledger: LedgerUse::default(),
                teams_full: Some(wait),
            });
        }
        let key = Self::ledger_key(router, l);
        let g = Geometry::window(l.window_s);
        let mut inv = self.script.prepare_invoke();
        inv.arg("lease")
            .arg(clock.map_or(-1, |t| t as i64))
            .arg(c.old.unwrap_or(""))
            .arg(c.used.tokens)
            .arg(c.used.pico.to_string())
            .arg(c.ttl_ms)
            .key(format!("{key}:w"))
            .key(format!("{key}:r"))
            .key(format!("{key}:x"))
            .key(Self::leases_key(router, l))
            .arg(g.width_ms)
            .arg(g.lifetime_ms)
            .arg(caps.tokens.map_or(-1i64, |t| t.min(i64::MAX as u64) as i64))
            .arg(caps.pico.map_or("-1".to_string(), |p| p.to_string()))
            .arg(c.id)
            .arg(c.admitted.tokens)
            .arg(c.admitted.pico.to_string())
            .arg(c.max.tokens)
            .arg(c.max.pico.to_string())
            .arg(if c.unheld { "1" } else { "0" });
        let mut conn = self.conn.get().await?;
        let f: Vec<String> = inv.invoke_async(&mut conn).await?;
        if f.len() != REPLY_FIELDS + 2 {
            return Err(StoreError::Internal(format!(
                "ledger script answered {} fields for a lease",
                f.len()
            )));
        }
        let int = |s: &str| {
            s.parse::<u64>()
                .map_err(|e| StoreError::Internal(format!("bad number {s:?} in Redis: {e}")))
        };
        let ledger = LedgerUse {
            spent: Amount::new(int(&f[2])?, int(&f[3])?),
            held: Amount::new(int(&f[4])?, int(&f[5])?),
            version: int(&f[6])?,
        };
        self.remember(router, l).await?;
        Ok(Leased {
            granted: Amount::new(int(&f[7])?, int(&f[8])?),
            applied: f[0] == "1",
            ledger,
            teams_full: None,
        })
    }

    /// A team ledger's lease keeps its team in the budget's index of active teams, as a
    /// reserve and a settle do: a lease that starts a team's use (no old lease, nothing to
    /// charge, room asked for) must take a place, and gets none when `max_teams` live teams
    /// hold them all (`Some(ms until one frees)`: nothing is granted); any other report only
    /// refreshes the team's time (its use is charged whatever the index says: nothing is
    /// forgotten). Router and rule ledgers: nothing to do.
    async fn place_team(
        &self,
        clock: Clock,
        router: &str,
        l: &LedgerRef,
        c: &LeaseCall<'_>,
    ) -> Result<Option<u64>, StoreError> {
        if l.team.is_none() {
            return Ok(None);
        }
        let starts = c.old.is_none() && c.used.is_zero() && !c.max.is_zero();
        if starts && !self.active.is_fresh(router, l) {
            let max = c.max_teams.unwrap_or(u64::MAX);
            let w = self
                .teams(
                    "admit",
                    clock,
                    router,
                    std::slice::from_ref(l),
                    max,
                    c.ttl_ms,
                )
                .await?;
            if let Some(Some(ms)) = w.first() {
                return Ok(Some(*ms));
            }
            self.active.admitted(router, l, c.ttl_ms);
            return Ok(None);
        }
        // A failed touch is not the report's failure: the place bounds admissions of new
        // teams, it keeps no spend.
        let _ = self
            .teams(
                "touch",
                clock,
                router,
                std::slice::from_ref(l),
                u64::MAX,
                c.ttl_ms,
            )
            .await;
        Ok(None)
    }
}
