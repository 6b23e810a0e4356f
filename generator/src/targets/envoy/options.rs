//! The options of `compile --target envoy` and the paths and constants derived from them, apart
//! from the compiler so the bootstrap's parts can read them without depending on their parent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::render::Format;
use crate::targets::module::{absolute, default_wasm_dir, UPSTREAM_WASM_FILE, WASM_FILE};
use crate::targets::DEFAULT_LISTEN;

pub const RETRY_ON: &str = "5xx,reset,connect-failure,refused-stream";
pub const DEFAULT_ADMIN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);
pub const DEFAULT_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Options of `compile --target envoy`.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// `--resolve NAME=HOST:PORT`: InferenceService name → address used instead of cluster DNS.
    pub resolve: BTreeMap<String, (String, u16)>,
    /// `--endpoints NAME=IP:PORT,...`: pods of `resolution: endpoint` backends on that
    /// InferenceService (instead of EndpointSlices).
    pub endpoints: BTreeMap<String, Vec<(String, u16)>>,
    /// `--router NAME`: which ModelRouter to compile when the input holds several.
    pub router: Option<String>,
    pub model_header: Option<String>,
    pub max_body_bytes: Option<u64>,
    /// Directory holding `llmkube_model_router.wasm`; made absolute in the output.
    pub wasm_dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// CA bundle for verifying https upstreams.
    pub ca_file: String,
    /// `--jwks-file`: the keys `policy.auth.jwt` verifies tokens with, instead of fetching
    /// `jwksURI` (local runs); made absolute in the output.
    pub jwks_file: Option<PathBuf>,
    pub format: Format,
    /// See [`crate::ir::CompileOptions::unsafe_budgets_charge_after`] (tests only).
    pub unsafe_budgets_charge_after: bool,
    /// `--budgets-service HOST:PORT`: budgets are kept by `llmkube-budgets` there (cluster
    /// `llmkube-budgets`) instead of in this Envoy's shared data.
    pub budgets_service: Option<(String, u16)>,
    /// `--budgets-fail-open` (only with `--budgets-service`).
    pub budgets_fail_open: bool,
    /// `--budgets-hold-ttl SECONDS`.
    pub budgets_hold_ttl_s: Option<u64>,
    /// `--budgets-per-request` (embedded ledgers only).
    pub budgets_per_request: bool,
    /// See [`crate::ir::CompileOptions::unsafe_budgets_worker_leases_unheld`] (tests only).
    pub unsafe_budgets_worker_leases_unheld: bool,
    /// `--budgets-lease-tokens` / `--budgets-lease-usd` (only with `--budgets-service`).
    pub budgets_lease: Option<router_core::budget::shared_lease::LeaseConfig>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            resolve: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            router: None,
            model_header: None,
            max_body_bytes: None,
            wasm_dir: default_wasm_dir(),
            listen: DEFAULT_LISTEN,
            admin: DEFAULT_ADMIN,
            ca_file: DEFAULT_CA_FILE.to_string(),
            jwks_file: None,
            format: Format::Yaml,
            unsafe_budgets_charge_after: false,
            budgets_service: None,
            budgets_fail_open: false,
            budgets_hold_ttl_s: None,
            budgets_per_request: false,
            unsafe_budgets_worker_leases_unheld: false,
            budgets_lease: None,
        }
    }
}

pub fn wasm_path(opts: &EnvoyOptions) -> PathBuf {
    absolute(opts.wasm_dir.join(WASM_FILE))
}

pub fn upstream_wasm_path(opts: &EnvoyOptions) -> PathBuf {
    absolute(opts.wasm_dir.join(UPSTREAM_WASM_FILE))
}
