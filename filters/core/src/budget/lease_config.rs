//! The lease configuration of the shared ledger (`budgets.service.lease`) as the filter uses it:
//! what one lease of a budget may take and how often it is reported.

use super::ledger::Caps;
use super::money::parse_usd;
use super::window::Amount;
use crate::config::budgets::LeaseConfig;

/// A lease's size in a dimension the gateway sets no lease maximum for (its budget has no cap
/// there, so the hold's amount in it limits nothing): large, and exact in Lua's doubles.
pub const UNLIMITED_TOKENS: u64 = 1_000_000_000_000_000;
pub const UNLIMITED_PICO: u64 = 1_000_000_000_000_000_000;
/// Bound of `report_ms`.
pub const MAX_REPORT_MS: u64 = 60_000;
/// Most team-lease slots per team budget (each is a shared-data key the root's tick reads).
pub const MAX_TEAM_SLOTS: usize = 4096;

/// The lease configuration as the filter uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The most a lease takes, per dimension (`None`: not configured for it).
    pub max_tokens: Option<u64>,
    pub max_pico: Option<u64>,
    pub report_ms: u64,
    /// Team-lease slots per team budget (0: team budgets reserve per request).
    pub team_slots: usize,
    pub unheld: bool,
}

impl LeaseConfig {
    pub fn compile(&self) -> Result<Lease, (String, String)> {
        let e = |f: &str, why: &str| (format!("service.lease.{f}"), why.to_string());
        if self.max_tokens == Some(0) {
            return Err(e("max_tokens", "must be at least 1"));
        }
        let max_pico = match &self.max_usd {
            Some(s) => {
                let p = parse_usd(s).map_err(|why| e("max_usd", &why))?;
                if p == 0 {
                    return Err(e("max_usd", "must be more than 0"));
                }
                Some(p)
            }
            None => None,
        };
        if self.max_tokens.is_none() && max_pico.is_none() {
            return Err(e("max_tokens", "either max_tokens or max_usd must be set"));
        }
        if self.report_ms == 0 || self.report_ms > MAX_REPORT_MS {
            return Err(e("report_ms", "must be 1 to 60000"));
        }
        if self.team_slots > MAX_TEAM_SLOTS {
            return Err(e("team_slots", "must be 0 to 4096"));
        }
        Ok(Lease {
            max_tokens: self.max_tokens,
            max_pico,
            report_ms: self.report_ms,
            team_slots: self.team_slots,
            #[cfg(feature = "test-controls")]
            unheld: self.unsafe_lease_unheld,
            #[cfg(not(feature = "test-controls"))]
            unheld: false,
        })
    }
}

/// A reserve refused by holds alone while leases hold room waits for this many report periods
/// (at most [`MAX_LEASE_RESERVE_WAIT_MS`]) for them to give their room back: each busy lease
/// reports once a period, and the tick that sends it may run late.
pub const RESERVE_WAIT_REPORTS: u64 = 4;
/// The most a gateway asks the service to wait (the service allows up to
/// `protocol::MAX_RESERVE_WAIT_MS`).
pub const MAX_LEASE_RESERVE_WAIT_MS: u64 = 2_000;

impl Lease {
    /// How long the service may hold a reserve that only holds refuse while leases give their
    /// room back (`ReserveRequest::wait_ms`).
    pub fn reserve_wait_ms(&self) -> u64 {
        self.report_ms
            .saturating_mul(RESERVE_WAIT_REPORTS)
            .min(MAX_LEASE_RESERVE_WAIT_MS)
    }

    /// The most one lease of a budget with `caps` takes, or `None` when the budget is not
    /// leased (a cap in a dimension this lease configuration has no maximum for: its requests
    /// reserve one by one).
    pub fn max_for(&self, caps: &Caps) -> Option<Amount> {
        let tokens = match (caps.tokens, self.max_tokens) {
            (Some(_), None) => return None,
            (Some(_), Some(m)) => m,
            (None, _) => UNLIMITED_TOKENS,
        };
        let pico = match (caps.pico, self.max_pico) {
            (Some(_), None) => return None,
            (Some(_), Some(m)) => m,
            (None, _) => UNLIMITED_PICO,
        };
        Some(Amount::new(tokens, pico))
    }
}
