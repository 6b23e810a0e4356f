//! The runtime's bounds and timers, on tiny text-format modules (no filter build needed): what a
//! long-running embedder relies on so that no guest and no traffic grows the host without limit.

use llmkube_wasm_runtime::{
    Clock, HostError, Limits, LogLevel, LogSink, SharedStore, Status, Vm, VmOptions,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Headers continue, every body chunk asks to be buffered, every tick logs "tick".
const BUFFERING_GUEST: &str = r#"(module
  (import "env" "proxy_log" (func $log (param i32 i32 i32) (result i32)))
  (import "env" "proxy_set_tick_period_milliseconds" (func $tick (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "tick")
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
  (func (export "proxy_on_configure") (param i32 i32) (result i32)
    (drop (call $tick (i32.const 100))) i32.const 1)
  (func (export "proxy_on_tick") (param i32)
    (drop (call $log (i32.const 2) (i32.const 16) (i32.const 4))))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) i32.const 0)
  (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32) i32.const 1))"#;

#[derive(Default)]
struct TestClock(AtomicU64);

impl Clock for TestClock {
    fn realtime_nanos(&self) -> u64 {
        1_700_000_000_000_000_000 + self.0.load(Ordering::SeqCst)
    }
    fn monotonic_nanos(&self) -> u64 {
        1_000_000_000 + self.0.load(Ordering::SeqCst)
    }
}

#[derive(Default)]
struct CountTicks(AtomicUsize);

impl LogSink for CountTicks {
    fn log(&self, _level: LogLevel, message: &str) {
        if message == "tick" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn vm(limits: Limits) -> (Vm, Arc<TestClock>, Arc<CountTicks>) {
    let clock = Arc::new(TestClock::default());
    let ticks = Arc::new(CountTicks::default());
    let opts = VmOptions {
        clock: clock.clone(),
        log_sink: ticks.clone(),
        limits,
        ..Default::default()
    };
    let vm = Vm::new(BUFFERING_GUEST.as_bytes(), opts).expect("loads");
    assert!(vm.configure_ok());
    (vm, clock, ticks)
}

#[test]
fn a_body_over_the_buffer_limit_is_answered_413_and_not_delivered() {
    let (mut vm, _, _) = vm(Limits {
        max_buffered_body: 10,
        ..Limits::default()
    });
    let id = vm.new_http_stream().unwrap();
    vm.request_headers(id, &[(":method", "POST"), (":path", "/")], false)
        .unwrap();
    vm.request_body(id, b"12345", false).unwrap();
    vm.request_body(id, b"67890", false).unwrap();
    assert!(vm.request_outcome(id).unwrap().local_response.is_none());
    vm.request_body(id, b"x", true).unwrap();
    let out = vm.request_outcome(id).unwrap();
    let reply = out.local_response.expect("413");
    assert_eq!(reply.status, 413);
    assert!(out.forwarded_body.is_empty());
    vm.log_and_done(id).unwrap();
    assert_eq!(vm.open_streams(), 0);
}

#[test]
fn open_streams_are_bounded_and_freed_when_done() {
    let (mut vm, _, _) = vm(Limits {
        max_streams: 2,
        ..Limits::default()
    });
    let a = vm.new_http_stream().unwrap();
    let b = vm.new_http_stream().unwrap();
    assert_eq!(
        vm.new_http_stream(),
        Err(HostError::LimitReached("open streams per VM"))
    );
    vm.log_and_done(a).unwrap();
    vm.cancel_stream(b).unwrap();
    assert_eq!(vm.open_streams(), 0);
    let c = vm.new_http_stream().unwrap();
    assert!(c != a && c != b, "ids are not reused while in flight");
}

#[test]
fn ticks_fire_when_due_and_a_late_tick_is_not_repeated() {
    let (mut vm, clock, ticks) = vm(Limits::default());
    assert_eq!(vm.next_due_nanos(), Some(1_000_000_000 + 100_000_000));
    vm.run_due().unwrap();
    assert_eq!(ticks.0.load(Ordering::SeqCst), 0, "not due yet");
    clock.0.store(100_000_000, Ordering::SeqCst);
    vm.run_due().unwrap();
    assert_eq!(ticks.0.load(Ordering::SeqCst), 1);
    // The embedder was busy for ten periods: one tick, the next a whole period later.
    clock.0.store(1_100_000_000, Ordering::SeqCst);
    vm.run_due().unwrap();
    assert_eq!(ticks.0.load(Ordering::SeqCst), 2);
    assert_eq!(vm.next_due_nanos(), Some(1_000_000_000 + 1_200_000_000));
}

#[test]
fn shared_data_and_queues_refuse_growth_past_their_bounds() {
    let store = SharedStore::new();
    let huge = vec![0u8; (1 << 20) + 1];
    assert_eq!(store.set("vm", "k", &huge, 0), Err(Status::InternalFailure));
    assert_eq!(store.get("vm", "k"), None);
    assert_eq!(store.set("vm", "k", b"ok", 0), Ok(()));
}
