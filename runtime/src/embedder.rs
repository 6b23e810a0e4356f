//! What the embedder supplies to a VM: the clock, the callout transport and the log sink.
//!
//! The runtime keeps no per-request record of its own (no log buffer, no list of callouts, no
//! property trace): everything observable goes through these traits, so a long-running server
//! stays bounded and a test kit can capture what it wants to assert on.

use crate::types::{find_header, LogLevel};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Time as the guest sees it (`proxy_get_current_time_nanoseconds`, WASI clocks) and as timers
/// (ticks, callout timeouts) are scheduled.
pub trait Clock: Send + Sync {
    /// Nanoseconds since the Unix epoch.
    fn realtime_nanos(&self) -> u64;
    /// Nanoseconds on a clock that never goes back; ticks and timeouts are due on this one.
    fn monotonic_nanos(&self) -> u64;
}

/// The host's clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn realtime_nanos(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
    fn monotonic_nanos(&self) -> u64 {
        static BASE: OnceLock<Instant> = OnceLock::new();
        // Offset by a second so "0" never reads as "unset" in a guest.
        (BASE.get_or_init(Instant::now).elapsed() + Duration::from_secs(1)).as_nanos() as u64
    }
}

/// Where the guest's output goes: `proxy_log`, WASI stdout/stderr, and (for tests that count
/// them) property lookups. Every method must be cheap: it runs inside a hostcall.
pub trait LogSink: Send + Sync {
    fn enabled(&self, _level: LogLevel) -> bool {
        true
    }
    fn log(&self, level: LogLevel, message: &str);
    /// Raw bytes of one WASI `fd_write` to stdout (1) or stderr (2), before they become a log line.
    fn wasi_output(&self, _fd: u32, _bytes: &[u8]) {}
    /// A property path the guest asked for, found or not.
    fn property_read(&self, _path: &[String]) {}
}

/// Drops everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardLogs;

impl LogSink for DiscardLogs {
    fn enabled(&self, _level: LogLevel) -> bool {
        false
    }
    fn log(&self, _level: LogLevel, _message: &str) {}
}

/// One line per message on stderr, from `min` up, tagged with the plugin's name.
#[derive(Clone, Debug)]
pub struct StderrLogs {
    pub min: LogLevel,
    pub tag: String,
}

impl LogSink for StderrLogs {
    fn enabled(&self, level: LogLevel) -> bool {
        level >= self.min
    }
    fn log(&self, level: LogLevel, message: &str) {
        if level >= self.min {
            eprintln!("[{}] {:?}: {message}", self.tag, level);
        }
    }
}

/// A `proxy_http_call` as the filter made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCallRecord {
    pub token: u32,
    pub context_id: u32,
    pub upstream: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
    pub timeout: Duration,
    /// Set for a `proxy_grpc_call`: `headers` are then its initial metadata, `body` the
    /// serialized request message, `upstream` the cluster; the answer goes back through
    /// [`crate::Vm::reply_http_call`] with a `grpc-status` header (and `grpc-message`).
    pub grpc: Option<GrpcMethod>,
}

/// The method a gRPC callout calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcMethod {
    pub service: String,
    pub method: String,
}

impl HttpCallRecord {
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }
}

/// The upstream's answer to a `proxy_http_call`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpCallReply {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
}

impl HttpCallReply {
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        HttpCallReply {
            headers: vec![(":status".into(), status.to_string())],
            body: body.into(),
            trailers: vec![],
        }
    }
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }
    pub fn with_trailer(mut self, name: &str, value: &str) -> Self {
        self.trailers
            .push((name.to_ascii_lowercase(), value.to_string()));
        self
    }
}

/// The callout transport. `dispatch` sees each `proxy_http_call` once, right after the callback
/// that made it returned; an immediate answer is delivered then, `None` leaves the call pending
/// until [`crate::Vm::reply_http_call`] or its timeout.
pub trait Callouts: Send + Sync {
    fn dispatch(&self, call: &HttpCallRecord) -> Option<HttpCallReply>;
}

impl<F> Callouts for F
where
    F: Fn(&HttpCallRecord) -> Option<HttpCallReply> + Send + Sync,
{
    fn dispatch(&self, call: &HttpCallRecord) -> Option<HttpCallReply> {
        self(call)
    }
}
