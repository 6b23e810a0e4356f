//! What the hostcalls see and change: per-stream progress, pending callouts, metrics. Lives
//! inside the wasmtime Store of one VM.

use crate::embedder::{HttpCallRecord, HttpCallReply};
use crate::options::VmOptions;
use crate::types::{find_header, Action, LogLevel};
use std::collections::{BTreeMap, VecDeque};

/// A reply the filter generated itself with `proxy_send_local_response`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u32,
    pub details: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub grpc_status: i32,
}

impl LocalResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metric {
    pub name: String,
    pub kind: MetricKind,
    /// Counter/gauge value (gauges are signed in Envoy; stored as i64).
    pub value: i64,
    /// The most recent values recorded into a histogram ([`Limits::histogram_samples`]).
    pub samples: Vec<u64>,
    /// Values recorded into a histogram, and their sum, since the VM started.
    pub count: u64,
    pub sum: u64,
    /// When a gauge was last set (`proxy_record_metric`), in one order across every VM of the
    /// process; 0: never set (only moved by increments).
    pub set_seq: u64,
}

/// Orders gauge sets across VMs: an embedder that runs several instances as one gateway's
/// workers reports the most recently set value, as Envoy's one shared stat holds it.
static GAUGE_SETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn next_gauge_set() -> u64 {
    GAUGE_SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

impl Metric {
    pub(crate) fn record(&mut self, value: u64, keep: usize) {
        self.count += 1;
        self.sum = self.sum.saturating_add(value);
        if keep == 0 {
            return;
        }
        if self.samples.len() >= keep {
            self.samples.remove(0);
        }
        self.samples.push(value);
    }
}

/// Per-direction progress of a stream through the filter.
#[derive(Default, Debug)]
pub(crate) struct Direction {
    pub headers: Vec<(String, String)>,
    pub trailers: Vec<(String, String)>,
    pub headers_seen: bool,
    /// Headers went on (Envoy refuses header writes from then on).
    pub headers_continued: bool,
    /// The filter stopped all iteration: body/trailers are held, not delivered.
    pub stop_all: bool,
    /// The last body callback returned a stop code: the next chunk is appended.
    pub buffering: bool,
    /// The body the filter sees through `proxy_get_buffer_bytes`.
    pub buffer: Vec<u8>,
    pub held: VecDeque<Held>,
    pub held_bytes: usize,
    pub end_seen: bool,
    pub forwarded_body: Vec<u8>,
    pub trailers_forwarded: bool,
    pub complete: bool,
    pub resume_requested: bool,
    pub actions: Vec<Action>,
}

impl Direction {
    pub fn pop_held(&mut self) -> Option<Held> {
        let held = self.held.pop_front()?;
        if let Held::Body(chunk, _) = &held {
            self.held_bytes -= chunk.len();
        }
        Some(held)
    }
}

#[derive(Debug)]
pub(crate) enum Held {
    Body(Vec<u8>, bool),
    Trailers(Vec<(String, String)>),
}

#[derive(Default, Debug)]
pub(crate) struct Stream {
    pub req: Direction,
    pub resp: Direction,
    pub local_response: Option<LocalResponse>,
    /// `proxy_close_stream` reset the stream.
    pub reset: bool,
    /// Properties of this stream only (what a gateway knows per request: `source.address`, ...),
    /// looked up before the VM's.
    pub properties: Vec<(Vec<String>, Vec<u8>)>,
}

impl Stream {
    pub fn ended(&self) -> bool {
        self.local_response.is_some() || self.reset
    }
}

#[derive(Copy, Clone, PartialEq, Eq, Debug)]
pub(crate) enum Dir {
    Request,
    Response,
}

pub(crate) struct PendingCall {
    pub record: HttpCallRecord,
    /// On the monotonic clock.
    pub deadline_nanos: u64,
}

/// Everything the hostcalls can see; lives inside the wasmtime Store.
pub(crate) struct HostState {
    pub opts: VmOptions,
    pub host_key: u64,
    pub effective: u32,
    pub streams: BTreeMap<u32, Stream>,
    pub tick_period_ms: u32,
    /// On the monotonic clock.
    pub next_tick_nanos: u64,
    pub metrics: Vec<Metric>,
    pub pending_calls: BTreeMap<u32, PendingCall>,
    /// Calls made during the current callback, handed to the embedder's [`crate::Callouts`] after it.
    pub new_calls: Vec<u32>,
    pub next_token: u32,
    pub call_response: Option<HttpCallReply>,
    pub rng: u64,
    pub done_called: bool,
    /// The most recent names passed to `proxy_call_foreign_function` (at most 64).
    pub foreign_calls: VecDeque<String>,
    /// Guest calls per `env.proxy_*` function, by position in `abi::FUNCTIONS`.
    pub hostcalls: Vec<u64>,
    /// When tracing: each hostcall (position in `abi::FUNCTIONS`) with the fuel used when it
    /// was made.
    pub hostcall_trace: Option<Vec<(usize, u64)>>,
}

impl HostState {
    pub fn log(&self, level: LogLevel, message: &str) {
        self.opts.log_sink.log(level, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_keep_recent_samples_and_count_all() {
        let mut m = Metric {
            name: "h".into(),
            kind: MetricKind::Histogram,
            value: 0,
            samples: vec![],
            count: 0,
            sum: 0,
            set_seq: 0,
        };
        for v in 1..=10 {
            m.record(v, 3);
        }
        assert_eq!(m.samples, vec![8, 9, 10]);
        assert_eq!((m.count, m.sum), (10, 55));
    }
}
