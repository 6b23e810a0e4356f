//! The HTTP/JSON wire format between a gateway filter and `llmkube-budgets` (budgets/README.md),
//! here so the filter that sends it and the service that reads it share one definition.
//!
//! Every request names the ledgers it touches with the budget's caps and window, so the filter's
//! configuration (compiled by the generator) stays the one source of truth and the service
//! needs none of its own. USD amounts travel as decimal strings: exact, and safe for any JSON
//! reader (pico-dollar integers pass 2^53).

use super::money::{format_usd, parse_usd};
use super::{Amount, Caps};
use serde::{Deserialize, Serialize};

/// Longest router, budget or team name accepted on the wire.
pub const MAX_NAME: usize = 256;
/// Most ledgers one request may touch.
pub const MAX_LEDGERS: usize = 32;
/// Longest reservation id accepted.
pub const MAX_RESERVATION_ID: usize = 64;
/// Longest reservation time-to-live accepted (a day).
pub const MAX_TTL_S: u64 = 86_400;
/// Longest window accepted (a year).
pub const MAX_WINDOW_S: u64 = 366 * 86_400;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerRef {
    pub budget: String,
    /// The team value for `scope: team` budgets; absent for router and rule budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub window_s: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmountJson {
    pub tokens: u64,
    #[serde(default = "zero_usd")]
    pub usd: String,
}

fn zero_usd() -> String {
    "0".to_string()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    pub router: String,
    pub ledgers: Vec<LedgerRef>,
    pub amount: AmountJson,
    /// How long the hold lives if the request never settles (default 900 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// The gateway's id for the reservation (unique per request), so it can release a
    /// reservation whose answer it never got; absent: the service picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Most teams a team budget of this request keeps ledgers for at a time (the gateway's
    /// `max_teams`): a new team beyond them is refused until one has rolled off. Absent: no
    /// bound (a gateway older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_teams: Option<u64>,
    /// Lease mode: when only holds refuse the request and leases hold room, the service asks
    /// them to give it back and tries again for up to this long (ms, at most
    /// [`MAX_RESERVE_WAIT_MS`]) before it refuses. Absent or 0: refused at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// Longest a reserve waits for leases to give their room back (`ReserveRequest::wait_ms`).
pub const MAX_RESERVE_WAIT_MS: u64 = 5_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    pub router: String,
    pub reservation: String,
    pub ledgers: Vec<LedgerRef>,
    /// The real usage (or its estimate); absent for a release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<AmountJson>,
    /// How long the ended id is remembered (so a late reserve or a repeated settle does
    /// nothing): the hold's ttl (default 900 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
}

/// One ledger as a reserve, settle or release left it (at most one per ledger of the call):
/// what the gateway's per-budget gauges show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerState {
    pub budget: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub tokens_used: u64,
    pub usd_used: String,
    pub tokens_reserved: u64,
    /// Orders the states of one ledger: a larger version is a later state. Answers reach a
    /// gateway out of order (its workers process them independently), so its gauges keep the
    /// newest. Absent (a service older than this field) is 0, the oldest.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl LedgerState {
    pub fn of(l: &LedgerRef, spent: Amount, held: Amount, version: u64) -> LedgerState {
        LedgerState {
            budget: l.budget.clone(),
            team: l.team.clone(),
            tokens_used: spent.tokens,
            usd_used: format_usd(spent.pico),
            tokens_reserved: held.tokens,
            version,
        }
    }
    /// (spent, held tokens); `None` when the USD amount does not parse.
    pub fn amounts(&self) -> Option<(Amount, u64)> {
        let pico = parse_usd(&self.usd_used).ok()?;
        Some((Amount::new(self.tokens_used, pico), self.tokens_reserved))
    }
}

/// The answer to a settle or release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettleResponse {
    pub ok: bool,
    /// Ledgers on which the hold was still there (it may have expired, or ended already).
    #[serde(default)]
    pub holds_found: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ledgers: Vec<LedgerState>,
    /// In a batch's results, why this end was not applied (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Most settles and releases in one `POST /v1/end`.
pub const MAX_ENDS: usize = 64;

/// `POST /v1/end`: several settles and releases at once (what a gateway's tick has due). Each is
/// a settle when it carries `amount`, else a release.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndBatch {
    pub ends: Vec<SettleRequest>,
}

/// The answer to a batch: one result per end, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndBatchResponse {
    pub results: Vec<SettleResponse>,
}

/// A reservation id: 1 to 64 printable ASCII bytes.
pub fn validate_reservation(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_RESERVATION_ID || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "reservation: must be 1 to {MAX_RESERVATION_ID} printable ASCII bytes"
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveResponse {
    pub admitted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// When refused: whole seconds until the same request would be admitted (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// When refused: the request alone is over a cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub never: bool,
    /// When refused: `budget` or `budget/team` of every ledger that refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// When refused because a new team found its budget at `max_teams` active teams: that
    /// bound (`refused` names the team ledger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teams_full: Option<u64>,
    /// Every ledger of the request after the reserve (the gateway's gauges).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ledgers: Vec<LedgerState>,
}

/// `POST /v1/lease`: report a lease's use and take the next lease, on one ledger, in one
/// script call (`lease` in ledger.lua; docs/budgets.md "Lease mode"). The old lease's hold is
/// dropped, `used` charged at report time, and a new hold of
/// `max(min(max, free / (2 × leaseholders)), admitted)` taken under `id` (none when that is
/// zero). A report whose `id` is already held was applied before (its answer was lost): the
/// answer is that lease, and nothing is charged again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    pub router: String,
    pub ledger: LedgerRef,
    /// The lease being replaced; absent: the gateway holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<String>,
    /// The new lease's id.
    pub id: String,
    /// Settled on the old lease since the last report: charged now.
    pub used: AmountJson,
    /// Admitted on the lease and not ended: the new hold covers at least this.
    pub admitted: AmountJson,
    /// The most the new lease takes (zero: shrink to `admitted`, release when that is zero).
    pub max: AmountJson,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// A team ledger's lease: the gateway's `max_teams`, the bound on the budget's active teams
    /// (as in a reserve). A lease that would place a new team past it grants nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_teams: Option<u64>,
    /// UNSAFE, tests only: grant without holding (see `LeaseConfig::unsafe_lease_unheld`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsafe_unheld: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseResponse {
    /// The new lease's size (zero: no lease is held).
    pub granted: AmountJson,
    /// `false` when this report had been applied already (a resend).
    #[serde(default)]
    pub applied: bool,
    /// A new team's lease found its budget's `max_teams` places taken: nothing granted; ms
    /// until a place frees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teams_full: Option<u64>,
    /// The ledger after the call (the gauges).
    pub ledger: LedgerState,
}

/// One entry of the seed's `status.budgetUtilization`; team budgets add their teams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Utilization {
    pub name: String,
    pub tokens_used: u64,
    pub usd_used: String,
    pub utilization: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Tokens and USD held by requests in flight (not part of the seed's shape).
    #[serde(default)]
    pub tokens_reserved: u64,
    #[serde(default = "zero_usd")]
    pub usd_reserved: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub teams: Vec<Utilization>,
}

impl Utilization {
    /// One ledger's entry: what is spent now against its caps, and what is held.
    pub fn of(name: String, caps: &Caps, spent: Amount, held: Amount) -> Utilization {
        Utilization {
            name,
            tokens_used: spent.tokens,
            usd_used: format_usd(spent.pico),
            utilization: caps.utilization(spent),
            team: None,
            tokens_reserved: held.tokens,
            usd_reserved: format_usd(held.pico),
            teams: Vec::new(),
        }
    }
}

impl LedgerRef {
    pub fn caps(&self) -> Result<Caps, String> {
        let pico = match &self.max_usd {
            Some(s) => Some(parse_usd(s).map_err(|e| format!("ledgers[].max_usd: {e}"))?),
            None => None,
        };
        if self.max_tokens.is_none() && pico.is_none() {
            return Err(format!(
                "ledgers[{}]: neither max_tokens nor max_usd is set",
                self.budget
            ));
        }
        Ok(Caps {
            tokens: self.max_tokens,
            pico,
        })
    }

    /// `budget` or `budget/team`, as refusals and logs name a ledger.
    pub fn label(&self) -> String {
        match &self.team {
            Some(t) => format!("{}/{}", self.budget, t),
            None => self.budget.clone(),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.budget.is_empty() || self.budget.len() > MAX_NAME {
            return Err("ledgers[].budget: must be 1 to 256 bytes".into());
        }
        if self
            .team
            .as_ref()
            .is_some_and(|t| t.is_empty() || t.len() > MAX_NAME)
        {
            return Err("ledgers[].team: must be 1 to 256 bytes".into());
        }
        if self.window_s == 0 || self.window_s > MAX_WINDOW_S {
            return Err(format!("ledgers[].window_s: must be 1 to {MAX_WINDOW_S}"));
        }
        self.caps().map(|_| ())
    }
}

impl AmountJson {
    pub fn parse(&self) -> Result<Amount, String> {
        Ok(Amount::new(
            self.tokens,
            parse_usd(&self.usd).map_err(|e| format!("amount.usd: {e}"))?,
        ))
    }
    pub fn from_amount(a: Amount) -> AmountJson {
        AmountJson {
            tokens: a.tokens,
            usd: format_usd(a.pico),
        }
    }
}

pub fn validate_common(router: &str, ledgers: &[LedgerRef]) -> Result<(), String> {
    if router.is_empty() || router.len() > MAX_NAME {
        return Err("router: must be 1 to 256 bytes".into());
    }
    if ledgers.len() > MAX_LEDGERS {
        return Err(format!("ledgers: at most {MAX_LEDGERS}"));
    }
    ledgers.iter().try_for_each(LedgerRef::validate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_strictly_and_validate_with_field_names() {
        let r: ReserveRequest = serde_json::from_str(
            r#"{"router":"ns/r","ledgers":[{"budget":"b","team":"alpha","window_s":60,"max_usd":"1.5"}],"amount":{"tokens":3,"usd":"0.000002"}}"#,
        )
        .unwrap();
        assert!(validate_common(&r.router, &r.ledgers).is_ok());
        assert_eq!(r.amount.parse().unwrap(), Amount::new(3, 2_000_000));
        assert_eq!(r.ledgers[0].label(), "b/alpha");
        assert!(serde_json::from_str::<ReserveRequest>(
            r#"{"router":"r","ledgers":[],"amount":{"tokens":1},"extra":1}"#
        )
        .is_err());
        let l = |json: &str| serde_json::from_str::<LedgerRef>(json).unwrap().validate();
        assert!(l(r#"{"budget":"b","window_s":60}"#)
            .unwrap_err()
            .contains("neither max_tokens nor max_usd"));
        assert!(l(r#"{"budget":"b","window_s":0,"max_tokens":1}"#)
            .unwrap_err()
            .contains("window_s"));
        assert!(l(r#"{"budget":"b","window_s":1,"max_usd":"x"}"#)
            .unwrap_err()
            .contains("max_usd"));
        assert!(l(r#"{"budget":"","window_s":1,"max_tokens":1}"#)
            .unwrap_err()
            .contains("budget"));
        let many =
            vec![
                serde_json::from_str::<LedgerRef>(r#"{"budget":"b","window_s":1,"max_tokens":1}"#)
                    .unwrap();
                MAX_LEDGERS + 1
            ];
        assert!(validate_common("r", &many).is_err());
        assert_eq!(
            AmountJson::from_amount(Amount::new(1, 1)).usd,
            "0.000000000001"
        );
    }

    #[test]
    fn utilization_serialises_in_the_seed_shape() {
        let caps = Caps {
            tokens: Some(10),
            pico: None,
        };
        let u = Utilization::of("b".into(), &caps, Amount::new(5, 0), Amount::ZERO);
        let v = serde_json::to_value(&u).unwrap();
        assert_eq!(v["name"], "b");
        assert_eq!(v["tokensUsed"], 5);
        assert_eq!(v["usdUsed"], "0.0");
        assert_eq!(v["utilization"], "0.5");
        assert!(v.get("teams").is_none());
    }
}
