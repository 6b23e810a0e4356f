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
mod grpc;
mod shared;
mod state;
mod vm;
mod wasi;

pub use embedder::{
    Callouts, Clock, DiscardLogs, GrpcMethod, HttpCallRecord, HttpCallReply, LogSink, StderrLogs,
    SystemClock,
};
pub use engine::{module_imports, unsupported_imports, WasmModule};
pub use grpc::{DEADLINE_EXCEEDED, UNAVAILABLE};
pub use shared::{GetHook, SharedStore};
pub use state::{Limits, LocalResponse, Metric, MetricKind};
pub use vm::{StreamOutcome, Vm, VmOptions};

pub(crate) use state::{Dir, HostState, PendingCall};

use std::fmt;

/// Root context id Envoy gives the (only) plugin root context of a VM.
pub const ROOT_CONTEXT_ID: u32 = 1;

/// The WASI (wasi_snapshot_preview1 / wasi_unstable) functions Envoy's V8 host provides.
/// A module importing anything else fails to load in Envoy.
pub const ENVOY_WASI_FUNCTIONS: &[&str] = wasi::FUNCTIONS;

/// The `env.proxy_*` functions this host provides (the ABI 0.2.1 surface the Rust SDK 0.2.5 uses).
pub const PROXY_WASM_FUNCTIONS: &[&str] = abi::FUNCTIONS;

/// proxy-wasm status codes as the ABI defines them.
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

impl LogLevel {
    fn from_raw(raw: i32) -> Option<LogLevel> {
        Some(match raw {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

/// What a filter callback answered, or that the host did not deliver the callback at all.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// StopIteration (headers) / StopIterationAndBuffer (body).
    Pause,
    /// Any other raw value the guest returned.
    Other(u32),
    /// The callback was not delivered: stream ended by a local reply / close, or the filter stopped
    /// all iteration (Envoy holds the data until the filter resumes).
    NotDelivered,
}

impl Action {
    fn from_raw(raw: i32) -> Action {
        match raw {
            0 => Action::Continue,
            1 => Action::Pause,
            other => Action::Other(other as u32),
        }
    }
}

/// Why a call into the VM failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// The guest trapped (a Rust panic under `panic=abort` is `unreachable`). The VM is now dead.
    Trap {
        function: String,
        message: String,
    },
    /// An earlier trap killed this VM; Envoy (fail-closed) would answer 503 to this request.
    VmDead {
        reason: String,
    },
    UnknownStream(StreamId),
    UnknownHttpCall(u32),
    /// A bound in [`Limits`] was reached (open streams); nothing was delivered to the guest.
    LimitReached(&'static str),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Trap { function, message } => {
                write!(f, "wasm trap in {function}: {message}")
            }
            HostError::VmDead { reason } => write!(f, "wasm VM is dead: {reason}"),
            HostError::UnknownStream(id) => write!(f, "unknown stream {}", id.0),
            HostError::UnknownHttpCall(t) => write!(f, "no pending http call with token {t}"),
            HostError::LimitReached(what) => write!(f, "limit reached: {what}"),
        }
    }
}

impl std::error::Error for HostError {}

/// A context id of an HTTP stream.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

pub(crate) fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    // Names are stored lower-cased; only the probe needs lowering, and only when it has capitals.
    let lowered;
    let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
        lowered = name.to_ascii_lowercase();
        lowered.as_str()
    } else {
        name
    };
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
