//! A proxy-wasm ABI 0.2.1 host on wasmtime that runs a compiled filter the way Envoy 1.40 does,
//! including the behaviours that bite in production:
//! - without `allow_on_headers_stop_iteration`, `Pause` from request headers stops everything and
//!   the body callback never runs: the request hangs;
//! - header writes after the headers phase continued fail with `BadArgument`;
//! - a guest trap kills the VM (Envoy's fail-closed answers 503 from then on);
//! - shared data CAS, including "a set on a missing key always succeeds".
//!
//! The embedder injects the clock, the callout transport and the log sink ([`Clock`],
//! [`Callouts`], [`LogSink`]); `llmkube-ext-proc` serves gateways with it, and the test kit
//! (`wasm-host`) drives it with a manual clock and captured logs. Everything a VM keeps is bounded
//! ([`Limits`]): open streams, buffered bodies, pending callouts, metrics, shared data and queues.

mod abi;
mod embedder;
mod engine;
mod hostcall;
mod memory;
mod options;
mod shared;
mod state;
mod types;
mod vm;
mod wasi;

pub use abi::grpc::{DEADLINE_EXCEEDED, UNAVAILABLE};
pub use embedder::{
    Callouts, Clock, DiscardLogs, GrpcMethod, HttpCallRecord, HttpCallReply, LogSink, StderrLogs,
    SystemClock,
};
pub use engine::{module_imports, unsupported_imports, WasmModule};
pub use options::{Limits, VmOptions};
pub use shared::{GetHook, SharedStore};
pub use state::{LocalResponse, Metric, MetricKind};
pub use types::{Action, HostError, LogLevel, Status, StreamId, ROOT_CONTEXT_ID};
pub use vm::{StreamOutcome, Vm};

/// The WASI (wasi_snapshot_preview1 / wasi_unstable) functions Envoy's V8 host provides.
/// A module importing anything else fails to load in Envoy.
pub const ENVOY_WASI_FUNCTIONS: &[&str] = wasi::FUNCTIONS;

/// The `env.proxy_*` functions this host provides (the ABI 0.2.1 surface the Rust SDK 0.2.5 uses).
pub const PROXY_WASM_FUNCTIONS: &[&str] = hostcall::FUNCTIONS;
