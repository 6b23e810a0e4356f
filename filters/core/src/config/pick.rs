//! The pick step's part of the plugin config: one backend's pods and `balancing`, as the
//! generator writes it for a backend whose pods the filter picks (`resolution: endpoint`,
//! `mode: LoadAware`). Turned into the picker's config by `crate::pick::wire`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    RoundRobin,
    LoadAware,
}

/// Default `sessionAffinity.idleTimeout` (the seed's 30m).
pub const DEFAULT_IDLE_MS: u64 = 30 * 60 * 1000;
/// Default period of the engine-metrics scrape.
pub const DEFAULT_SCRAPE_MS: u64 = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PickConfig {
    /// The pods, `ip:port`: a pick is always one of these.
    pub endpoints: Vec<String>,
    #[serde(default = "load_aware")]
    pub mode: Mode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_affinity: Option<PrefixWire>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionWire>,
    /// For a vLLM backend: the cluster that reaches a pod named in
    /// `x-gateway-destination-endpoint`, to scrape each pod's `/metrics` through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_cluster: Option<String>,
    /// The scrape period (default [`DEFAULT_SCRAPE_MS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_ms: Option<u64>,
    /// Overrides of the picker's prefill-work bounds. Not in the ModelRouter CRD and never
    /// written by the generator: tests that assert placement pin what they depend on with it
    /// (the bounds read prefill work that decays with wall time), and an operator can try
    /// other settings by editing the plugin config. Absent: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bounds: Option<BoundsWire>,
}

/// `pick.bounds` of the plugin config; each field absent keeps the picker's default.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundsWire {
    /// `Config::known_balance_percent` (0: a known prefix is never shed for prefill balance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_balance_percent: Option<u64>,
    /// `Config::recent_half_life_ns`, in ms (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_half_life_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_blocks_per_endpoint: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionWire {
    /// Lower-cased header names, in priority order.
    pub headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
}

fn load_aware() -> Mode {
    Mode::LoadAware
}
