//! The test kit for filter modules on the wasm runtime (`llmkube-wasm-runtime`): a [`Host`] is one
//! runtime [`Vm`] driven by a manual clock, with its logs, WASI output, property lookups and
//! callouts captured for assertions, and callouts answered by a scripted responder.
//!
//! Everything runs synchronously and deterministically: the clock only moves when the test
//! moves it ([`Host::advance_clock`]), WASI random is seeded, callouts are answered in-process.

mod capture;
mod clock;

pub use capture::{Captured, RecordedCallouts, MAX_CAPTURED_CALLS, MAX_CAPTURED_LINES};
pub use clock::ManualClock;
pub use llmkube_wasm_runtime::*;

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where the manual clock starts, nanoseconds since the Unix epoch (Nov 2023).
pub const START_TIME_NANOS: u64 = 1_700_000_000_000_000_000;

/// One Envoy worker's VM of a plugin under test. Derefs to the runtime [`Vm`] for everything a
/// gateway does to it (streams, ticks, shared data, properties, metrics).
pub struct Host {
    vm: Vm,
    clock: Arc<ManualClock>,
    capture: Arc<Captured>,
    calls: Arc<RecordedCallouts>,
}

impl Host {
    /// Load from a file. Modules are cached by content, so a rebuilt file is recompiled.
    pub fn from_file(path: impl AsRef<Path>, opts: VmOptions) -> anyhow::Result<Host> {
        let path = path.as_ref();
        let wasm =
            std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        Host::new(&wasm, opts)
    }

    /// The clock, log sink and callouts of `opts` are replaced by the kit's (a responder set with
    /// [`VmOptions::with_responder`] still answers, behind the recorder).
    pub fn new(wasm: &[u8], mut opts: VmOptions) -> anyhow::Result<Host> {
        let clock = Arc::new(ManualClock::starting_at(START_TIME_NANOS));
        let capture = Arc::new(Captured::default());
        let calls = Arc::new(RecordedCallouts::new(opts.callouts.take()));
        opts.clock = clock.clone();
        opts.log_sink = capture.clone();
        opts.callouts = Some(calls.clone());
        opts.random_seed.get_or_insert(START_TIME_NANOS);
        let vm = Vm::new(wasm, opts)?;
        Ok(Host {
            vm,
            clock,
            capture,
            calls,
        })
    }

    /// Moves the manual clock forward, firing every tick period and callout timeout that
    /// elapses, in time order, with the clock set to each event's time.
    pub fn advance_clock(&mut self, by: Duration) -> Result<(), HostError> {
        if let Some(reason) = self.vm.dead_reason() {
            return Err(HostError::VmDead {
                reason: reason.to_string(),
            });
        }
        let target = self
            .clock
            .monotonic_nanos()
            .saturating_add(by.as_nanos() as u64);
        while let Some(due) = self.vm.next_due_nanos().filter(|t| *t <= target) {
            self.clock.set_monotonic(due);
            self.vm.run_due()?;
        }
        self.clock.set_monotonic(target);
        Ok(())
    }

    /// Current realtime clock, nanoseconds since the Unix epoch.
    pub fn now_nanos(&self) -> u64 {
        self.clock.realtime_nanos()
    }

    /// Every callout the filter made, in order.
    pub fn http_calls(&self) -> Vec<HttpCallRecord> {
        self.calls.calls()
    }

    /// Property paths the module has read so far (each a list of segments).
    pub fn property_reads(&self) -> Vec<Vec<String>> {
        self.capture.property_reads()
    }

    pub fn logs(&self) -> Vec<(LogLevel, String)> {
        self.capture.lines()
    }

    /// True if any log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.capture.any_line(needle)
    }

    /// Log lines containing `needle`.
    pub fn logs_matching(&self, needle: &str) -> Vec<String> {
        self.capture.lines_matching(needle)
    }

    pub fn clear_logs(&mut self) {
        self.capture.clear_lines();
    }

    /// Raw bytes the guest wrote to WASI stdout / stderr.
    pub fn stdout(&self) -> Vec<u8> {
        self.capture.output(1)
    }
    pub fn stderr(&self) -> Vec<u8> {
        self.capture.output(2)
    }
}

impl Deref for Host {
    type Target = Vm;
    fn deref(&self) -> &Vm {
        &self.vm
    }
}

impl DerefMut for Host {
    fn deref_mut(&mut self) -> &mut Vm {
        &mut self.vm
    }
}
