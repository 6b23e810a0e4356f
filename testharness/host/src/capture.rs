//! What a test asserts on: log lines, WASI output, property lookups and callouts, each kept up
//! to a bound (the oldest entries go first) so a soak test cannot exhaust memory.

use llmkube_wasm_runtime::{Callouts, HttpCallRecord, HttpCallReply, LogLevel, LogSink};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

/// Log lines (and property lookups) a [`Captured`] keeps.
pub const MAX_CAPTURED_LINES: usize = 200_000;
/// Bytes of WASI stdout / stderr kept per VM.
const MAX_CAPTURED_OUTPUT: usize = 1 << 20;
/// Callouts a [`RecordedCallouts`] keeps.
pub const MAX_CAPTURED_CALLS: usize = 10_000;

fn push_bounded<T>(q: &mut VecDeque<T>, item: T, max: usize) {
    if q.len() >= max {
        q.pop_front();
    }
    q.push_back(item);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock must not poison every later assertion.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Default)]
struct Inner {
    lines: VecDeque<(LogLevel, String)>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    property_reads: VecDeque<Vec<String>>,
}

/// The log sink of a test VM.
#[derive(Default)]
pub struct Captured(Mutex<Inner>);

impl Captured {
    pub fn lines(&self) -> Vec<(LogLevel, String)> {
        lock(&self.0).lines.iter().cloned().collect()
    }
    pub fn any_line(&self, needle: &str) -> bool {
        lock(&self.0).lines.iter().any(|(_, l)| l.contains(needle))
    }
    pub fn lines_matching(&self, needle: &str) -> Vec<String> {
        lock(&self.0)
            .lines
            .iter()
            .filter(|(_, l)| l.contains(needle))
            .map(|(_, l)| l.clone())
            .collect()
    }
    pub fn clear_lines(&self) {
        lock(&self.0).lines.clear();
    }
    pub fn property_reads(&self) -> Vec<Vec<String>> {
        lock(&self.0).property_reads.iter().cloned().collect()
    }
    /// WASI output of fd 1 (stdout) or 2 (stderr).
    pub fn output(&self, fd: u32) -> Vec<u8> {
        let inner = lock(&self.0);
        match fd {
            1 => inner.stdout.clone(),
            2 => inner.stderr.clone(),
            _ => Vec::new(),
        }
    }
}

impl LogSink for Captured {
    fn log(&self, level: LogLevel, message: &str) {
        push_bounded(
            &mut lock(&self.0).lines,
            (level, message.to_string()),
            MAX_CAPTURED_LINES,
        );
    }
    fn wasi_output(&self, fd: u32, bytes: &[u8]) {
        let mut inner = lock(&self.0);
        let out = if fd == 1 {
            &mut inner.stdout
        } else {
            &mut inner.stderr
        };
        let room = MAX_CAPTURED_OUTPUT.saturating_sub(out.len());
        out.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
    fn property_read(&self, path: &[String]) {
        push_bounded(
            &mut lock(&self.0).property_reads,
            path.to_vec(),
            MAX_CAPTURED_LINES,
        );
    }
}

/// Records every callout, then lets the scripted responder (if any) answer it.
pub struct RecordedCallouts {
    calls: Mutex<VecDeque<HttpCallRecord>>,
    responder: Option<Arc<dyn Callouts>>,
}

impl RecordedCallouts {
    pub fn new(responder: Option<Arc<dyn Callouts>>) -> RecordedCallouts {
        RecordedCallouts {
            calls: Mutex::default(),
            responder,
        }
    }
    pub fn calls(&self) -> Vec<HttpCallRecord> {
        lock(&self.calls).iter().cloned().collect()
    }
}

impl Callouts for RecordedCallouts {
    fn dispatch(&self, call: &HttpCallRecord) -> Option<HttpCallReply> {
        push_bounded(&mut lock(&self.calls), call.clone(), MAX_CAPTURED_CALLS);
        self.responder.as_ref().and_then(|r| r.dispatch(call))
    }
}
