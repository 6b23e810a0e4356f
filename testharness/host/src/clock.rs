//! A clock that moves only when the test moves it.

use llmkube_wasm_runtime::Clock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Realtime starts at a fixed instant, monotonic at one second; both advance together.
#[derive(Debug)]
pub struct ManualClock {
    start_realtime: u64,
    elapsed: AtomicU64,
}

const MONOTONIC_START: u64 = 1_000_000_000;

impl ManualClock {
    pub fn starting_at(realtime_nanos: u64) -> ManualClock {
        ManualClock {
            start_realtime: realtime_nanos,
            elapsed: AtomicU64::new(0),
        }
    }

    /// Moves to monotonic time `nanos`; never backwards.
    pub fn set_monotonic(&self, nanos: u64) {
        let elapsed = nanos.saturating_sub(MONOTONIC_START);
        self.elapsed.fetch_max(elapsed, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn realtime_nanos(&self) -> u64 {
        self.start_realtime + self.elapsed.load(Ordering::SeqCst)
    }
    fn monotonic_nanos(&self) -> u64 {
        MONOTONIC_START + self.elapsed.load(Ordering::SeqCst)
    }
}
