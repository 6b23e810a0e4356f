//! The options of `compile --target agentgateway`, agentgateway's limits they are checked
//! against, and the names and places of what it writes.

use std::net::SocketAddr;
use std::path::PathBuf;

use router_core::headers::{
    ATTEMPT_BACKEND_HEADER, MODEL_SPAN_HEADER, ROUTE_HEADER, SENSITIVE_HEADER,
};

use crate::ir::CompileOptions;

/// agentgateway v1.3.1 replays a request body for a retry only up to this size
/// (`MAX_BUFFERED_BYTES` in crates/agentgateway/src/proxy/httpproxy.rs); above it the request
/// gets one attempt.
pub const RETRY_REPLAY_LIMIT: u64 = 64 * 1024;
/// Where `llmkube-ext-proc` listens when `--ext-proc` is not given.
pub const DEFAULT_EXT_PROC: (&str, u16) = ("127.0.0.1", 50051);
/// Port of the in-cluster `llmkube-ext-proc` Service.
pub const EXT_PROC_PORT: u16 = 50051;
/// Where the in-cluster image keeps the filter modules.
pub const IMAGE_WASM_DIR: &str = "/opt/llmkube/wasm";
pub const DEFAULT_IMAGE: &str = "ghcr.io/llmkube/llmkube-ext-proc:latest";
/// The three files written to `-o DIR`, in this order.
pub const FILES: [&str; 3] = ["agentgateway.yaml", "ext-proc.yaml", "kubernetes.yaml"];
/// The fourth, when a backend has its pods picked: the endpoint picker's `llmkube-ext-proc`
/// config (it listens on the `--ext-proc` port plus one).
pub const PICKER_FILE: &str = "endpoint-picker.yaml";
/// Decision headers only the gateway needs: removed before a request leaves for a backend.
pub const INTERNAL_HEADERS: [&str; 4] = [
    ROUTE_HEADER,
    SENSITIVE_HEADER,
    ATTEMPT_BACKEND_HEADER,
    MODEL_SPAN_HEADER,
];

/// Options of `compile --target agentgateway`.
#[derive(Debug, Clone)]
pub struct AgentgatewayOptions {
    pub common: CompileOptions,
    /// `--listen`: agentgateway's listener (v1.3.1 binds take a port; the host is documentary).
    pub listen: SocketAddr,
    /// `--ext-proc HOST:PORT`: where agentgateway reaches `llmkube-ext-proc`.
    pub ext_proc: (String, u16),
    /// Directory holding `llmkube_model_router.wasm` (for the local `ext-proc.yaml`).
    pub wasm_dir: PathBuf,
    /// `--wasm-sha256`; otherwise computed from the built module.
    pub wasm_sha256: Option<String>,
    /// `--ext-proc-image`: the in-cluster server's image (modules in [`IMAGE_WASM_DIR`]).
    pub image: String,
    /// `--budgets-service HOST:PORT`: budgets are kept by `llmkube-budgets` there (a cluster of
    /// `ext-proc.yaml`); `None`: in the server's shared data.
    pub budgets_service: Option<(String, u16)>,
    /// What failover means for bodies over agentgateway's replay limit.
    pub failover: Failover,
}

/// Failover against agentgateway's replay limit ([`RETRY_REPLAY_LIMIT`]): a request body above
/// it gets one attempt, whatever the route's retry policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failover {
    /// A router with an attempt order of more than one backend is refused unless the body limit
    /// (`--max-body-bytes`) is within the replay limit: every request it admits can fail over.
    #[default]
    Always,
    /// `--failover-within-replay-limit`: bodies up to the replay limit fail over; a larger one
    /// is served by the first backend of its order only, and the filter counts it
    /// (`llmkube.failover_skipped`) and audits it (`failover_skipped`).
    WithinReplayLimit,
}

impl Default for AgentgatewayOptions {
    fn default() -> Self {
        AgentgatewayOptions {
            common: CompileOptions::default(),
            listen: crate::targets::DEFAULT_LISTEN,
            ext_proc: (DEFAULT_EXT_PROC.0.to_string(), DEFAULT_EXT_PROC.1),
            wasm_dir: crate::targets::module::default_wasm_dir(),
            wasm_sha256: None,
            image: DEFAULT_IMAGE.to_string(),
            budgets_service: None,
            failover: Failover::default(),
        }
    }
}

/// The provider name of the last priority group of every standalone route: the local
/// `llmkube-ext-proc`'s no-backend listener.
pub const NO_BACKEND_PROVIDER: &str = "llmkube-no-backend";

impl AgentgatewayOptions {
    /// Where the local `llmkube-ext-proc` answers the requests no backend of their route could
    /// serve (its `no_backend_listen`): the `--ext-proc` port plus two (the endpoint picker's
    /// is plus one).
    pub fn no_backend_addr(&self) -> (String, u16) {
        let (host, port) = &self.ext_proc;
        (host.clone(), port.saturating_add(2))
    }
}

/// `host:port`, an IPv6 host in brackets.
pub(crate) fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
