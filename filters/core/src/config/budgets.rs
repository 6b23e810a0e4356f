//! `policy.budgets` in the plugin configuration, as the generator writes it and the filter reads
//! it (compiled into budgets and prices by `crate::budget::compiled`).

use serde::{Deserialize, Serialize};

/// Default time a reservation is held when its request never settles (a crashed gateway, a lost
/// callback): long enough for the slowest stream we expect, short enough not to block a budget
/// for good.
pub const DEFAULT_HOLD_TTL_S: u64 = 900;
/// Team ledgers kept per team budget by default.
pub const DEFAULT_MAX_TEAMS: usize = 1024;
/// Default of `service.lease.report_ms` (how often the root reports and renews a busy lease).
pub const DEFAULT_REPORT_MS: u64 = 100;
/// Team-lease slots per team budget by default.
pub const DEFAULT_TEAM_SLOTS: usize = 64;

pub const DEFAULT_TEAM_HEADER: &str = "x-llmkube-team";
/// `max_tokens` the gateway sets when neither the client nor the backend bounds the completion.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetsConfig {
    pub budgets: Vec<BudgetConfig>,
    /// `costPerMillionTokens` per backend; a backend not listed is free.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prices: Vec<BackendPrice>,
    #[serde(default = "default_hold_ttl_s")]
    pub hold_ttl_s: u64,
    #[serde(default = "default_max_tokens")]
    pub default_max_tokens: u64,
    #[serde(default = "default_max_teams")]
    pub max_teams: usize,
    /// The shared ledger (`--budgets-service`); absent: ledgers live in this Envoy's shared data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceConfig>,
    /// UNSAFE, tests only: admit by checking the ledgers without holding anything and charge
    /// after the response, as charge-after gateways do, so concurrent requests overshoot the cap.
    /// Exists so the end-to-end test can show the overshoot reservation prevents; the generator
    /// writes it only under a hidden flag.
    #[cfg(feature = "test-controls")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsafe_charge_after: bool,
    /// Embedded ledgers only: one reserve and one settle in the ledger per request instead of
    /// the default worker leases (`budget::worker_lease`, docs/budgets.md "Worker leases").
    /// Absent (false) means leases, so a configuration that predates the field gets the cheaper
    /// mode; the bound is the same either way, per request only keeps gauges current per
    /// response instead of per tick. Ignored with `service` (the shared ledger has its own).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_request: bool,
    /// UNSAFE, tests only: worker leases whose room is granted but not held in the ledger
    /// (`worker_lease::Leases::unsafe_unheld`), the end-to-end control that overshoots; the
    /// generator writes it only under a library option.
    #[cfg(feature = "test-controls")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsafe_worker_leases_unheld: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    pub name: String,
    pub scope: ScopeName,
    /// `ruleName` for `scope: rule`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `headerKey` for `scope: team` (default `x-llmkube-team`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<String>,
    pub window_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScopeName {
    Router,
    Rule,
    Team,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendPrice {
    pub backend: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_usd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_usd: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// The Envoy cluster the generator emits for `llmkube-budgets`.
    pub cluster: String,
    #[serde(default = "default_service_timeout_ms")]
    pub timeout_ms: u64,
    /// When the service cannot be reached: admit without budgets (audited) instead of the
    /// default 503 `budget_store_unavailable`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_open: bool,
    /// Lease mode (`budget::shared_lease`): admit against a lease held in Redis per ledger instead of
    /// one reservation call per request. Absent: per-request reservation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseConfig>,
}

fn default_hold_ttl_s() -> u64 {
    DEFAULT_HOLD_TTL_S
}
fn default_max_tokens() -> u64 {
    DEFAULT_MAX_TOKENS
}
fn default_max_teams() -> usize {
    DEFAULT_MAX_TEAMS
}
fn default_service_timeout_ms() -> u64 {
    1000
}

/// `budgets.service.lease` in the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseConfig {
    /// The most tokens one lease takes (for budgets with `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The most USD one lease takes (for budgets with `max_usd`), a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<String>,
    /// How often the root reports and renews a busy lease.
    #[serde(default = "default_report_ms")]
    pub report_ms: u64,
    /// Team leases kept per team budget (`budget::lease_slots`); 0: team budgets are not leased.
    #[serde(
        default = "default_team_slots",
        skip_serializing_if = "is_default_team_slots"
    )]
    pub team_slots: usize,
    /// UNSAFE, tests only: leases are granted without being held in Redis (and without the
    /// split over leaseholders), so other gateways do not see them: the end-to-end control that
    /// shows the hold is what keeps the bound.
    #[cfg(feature = "test-controls")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsafe_lease_unheld: bool,
}

fn default_report_ms() -> u64 {
    DEFAULT_REPORT_MS
}

fn default_team_slots() -> usize {
    DEFAULT_TEAM_SLOTS
}

fn is_default_team_slots(n: &usize) -> bool {
    *n == DEFAULT_TEAM_SLOTS
}
