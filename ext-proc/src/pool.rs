//! A pool of module instances. Each instance is one VM (like one Envoy worker) behind its own
//! lock; a stream is pinned to the instance it started on and takes that lock only for the
//! duration of one callback, so there is no global lock per request. A trapped instance is
//! replaced by a fresh one and never reused: the streams it held fail closed.
//!
//! Callouts leave the instance: a `dispatch_http_call` is handed to the transport (a channel the
//! server drains) tagged with its instance and that instance's generation, the callback returns
//! and the lock is released, so other streams on the instance go on while the call is out. The
//! answer comes back through [`Pool::settle_call`], which wakes the streams waiting on that
//! instance.

use llmkube_wasm_runtime::{
    Callouts, HostError, HttpCallRecord, HttpCallReply, Metric, StreamId, Vm, VmOptions, WasmModule,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, Notify};

/// The path of the watchdog's request: not an inference or models path, so the filter passes it.
pub const WATCHDOG_PATH: &str = "/llmkube-ext-proc/watchdog";

const WATCHDOG_REQUEST: &[(&str, &str)] = &[
    (":method", "GET"),
    (":path", WATCHDOG_PATH),
    (":authority", "llmkube-ext-proc"),
    (":scheme", "http"),
];

pub struct Pool {
    module: WasmModule,
    opts: VmOptions,
    slots: Vec<Slot>,
    calls: Option<mpsc::UnboundedSender<Callout>>,
    traps: AtomicU64,
}

struct Slot {
    vm: Mutex<Instance>,
    open: AtomicUsize,
    /// Woken when a callout of this instance was settled (answered, failed, timed out).
    settled: Notify,
}

/// A callout a module made, for the transport.
pub struct Callout {
    pub slot: usize,
    pub generation: u64,
    pub record: HttpCallRecord,
}

/// Hands an instance's calls to the transport; the runtime keeps them pending meanwhile, with
/// their deadlines (the ticker times them out if the transport never answers).
struct ToTransport {
    slot: usize,
    generation: u64,
    tx: mpsc::UnboundedSender<Callout>,
}

impl Callouts for ToTransport {
    fn dispatch(&self, call: &HttpCallRecord) -> Option<HttpCallReply> {
        // The receiver lives as long as the server; if it is gone the call times out.
        let _ = self.tx.send(Callout {
            slot: self.slot,
            generation: self.generation,
            record: call.clone(),
        });
        None
    }
}

struct Instance {
    vm: Vm,
    /// Bumped when the VM is replaced: seats (and callouts) of the old one are void.
    generation: u64,
    slot: usize,
}

/// A stream's place in the pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolSeat {
    slot: usize,
    generation: u64,
    pub id: StreamId,
}

/// Why a callback could not run or failed; every one of them is answered fail-closed.
#[derive(Debug)]
pub enum PoolError {
    /// The guest trapped (this instance was replaced) or the instance was already dead.
    Vm(HostError),
    /// The instance this stream was on was replaced after a trap.
    Replaced,
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::Vm(e) => write!(f, "{e}"),
            PoolError::Replaced => write!(f, "the instance serving this stream trapped"),
        }
    }
}

fn lock(m: &Mutex<Instance>) -> MutexGuard<'_, Instance> {
    // A panic while holding the lock cannot leave the VM half-updated in a way the next
    // callback trusts: every VM call checks the VM's own state.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// Starts `instances` VMs; refuses to start if the module refuses its plugin config.
    /// `calls` receives the modules' callouts; without it a call stays pending until it times
    /// out (the module sees a failed call).
    pub fn new(
        module: WasmModule,
        opts: VmOptions,
        instances: usize,
        calls: Option<mpsc::UnboundedSender<Callout>>,
    ) -> anyhow::Result<Pool> {
        let mut pool = Pool {
            module,
            opts,
            slots: Vec::with_capacity(instances),
            calls,
            traps: AtomicU64::new(0),
        };
        for slot in 0..instances {
            let vm = pool.start(slot, 0)?;
            pool.slots.push(Slot {
                vm: Mutex::new(Instance {
                    vm,
                    generation: 0,
                    slot,
                }),
                open: AtomicUsize::new(0),
                settled: Notify::new(),
            });
        }
        Ok(pool)
    }

    fn start(&self, slot: usize, generation: u64) -> anyhow::Result<Vm> {
        let mut opts = self.opts.clone();
        if let Some(tx) = &self.calls {
            opts.callouts = Some(Arc::new(ToTransport {
                slot,
                generation,
                tx: tx.clone(),
            }));
        }
        start(&self.module, &opts)
    }

    /// Guest traps since the server started (each replaced its instance).
    pub fn traps(&self) -> u64 {
        self.traps.load(Ordering::Relaxed)
    }

    /// The woken-on-settle signal of a stream's instance.
    pub fn settled(&self, seat: &PoolSeat) -> &Notify {
        &self.slots[seat.slot].settled
    }

    /// Delivers a callout's answer (`None`: the call failed) to the instance that made it, unless
    /// that instance was replaced since; then wakes the streams waiting on it (also after a
    /// replacement: they find their seat void and fail closed). The timer task wakes them at
    /// least every 50 ms as well, so no stream waits on a call that can no longer settle.
    pub fn settle_call(&self, call: &Callout, reply: Option<HttpCallReply>) {
        let Some(s) = self.slots.get(call.slot) else {
            return;
        };
        {
            let mut inst = lock(&s.vm);
            if inst.generation == call.generation {
                let token = call.record.token;
                let r = match reply {
                    Some(reply) => inst.vm.reply_http_call(token, reply),
                    None => inst.vm.fail_http_call(token),
                };
                match r {
                    // Already settled: it timed out, or its stream ended.
                    Ok(()) | Err(HostError::UnknownHttpCall(_)) => {}
                    Err(e) => {
                        let _ = self.failed(&mut inst, e);
                    }
                }
            }
        }
        s.settled.notify_waiters();
    }

    /// Every instance's module metrics, one instance at a time.
    pub fn metrics(&self) -> Vec<Metric> {
        let mut out = Vec::new();
        for s in &self.slots {
            out.extend_from_slice(lock(&s.vm).vm.metrics());
        }
        out
    }

    /// The earliest tick or callout deadline of any instance, on the runtime's monotonic clock.
    pub fn next_due_nanos(&self) -> Option<u64> {
        self.slots
            .iter()
            .filter_map(|s| lock(&s.vm).vm.next_due_nanos())
            .min()
    }

    pub fn instances(&self) -> usize {
        self.slots.len()
    }

    /// Opens a stream on the instance with the fewest open streams.
    pub fn open(&self) -> Result<PoolSeat, PoolError> {
        let slot = (0..self.slots.len())
            .min_by_key(|i| self.slots[*i].open.load(Ordering::Relaxed))
            .unwrap_or(0);
        let s = &self.slots[slot];
        let mut inst = lock(&s.vm);
        self.replace_if_dead(&mut inst);
        let id = inst
            .vm
            .new_http_stream()
            .map_err(|e| self.failed(&mut inst, e))?;
        s.open.fetch_add(1, Ordering::Relaxed);
        Ok(PoolSeat {
            slot,
            generation: inst.generation,
            id,
        })
    }

    /// Runs the watchdog's request (a `GET` of [`WATCHDOG_PATH`], which the routing filter
    /// passes without auditing) through every instance in turn: the proof that each instance
    /// takes its lock, runs a callback and answers. An instance that traps is replaced, and the
    /// probe fails this once.
    pub fn probe(&self) -> Result<(), String> {
        for s in &self.slots {
            let mut inst = lock(&s.vm);
            self.replace_if_dead(&mut inst);
            let run = |vm: &mut Vm| -> Result<bool, HostError> {
                let id = vm.new_http_stream()?;
                vm.request_headers(id, WATCHDOG_REQUEST, true)?;
                let out = vm.request_outcome(id)?;
                vm.log_and_done(id)?;
                Ok(out.forwarded_headers.is_some() || out.local_response.is_some())
            };
            match run(&mut inst.vm) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "instance {} neither passed nor answered the watchdog request",
                        inst.slot
                    ))
                }
                Err(e) => {
                    let slot = inst.slot;
                    return Err(format!("instance {slot}: {}", self.failed(&mut inst, e)));
                }
            }
        }
        Ok(())
    }

    /// Runs `f` on the stream's instance. A trap replaces the instance.
    pub fn with<R>(
        &self,
        seat: &PoolSeat,
        f: impl FnOnce(&mut Vm, StreamId) -> Result<R, HostError>,
    ) -> Result<R, PoolError> {
        let mut inst = lock(&self.slots[seat.slot].vm);
        if inst.generation != seat.generation {
            return Err(PoolError::Replaced);
        }
        f(&mut inst.vm, seat.id).map_err(|e| self.failed(&mut inst, e))
    }

    /// Ends a stream: access log and teardown when the instance is the one it started on.
    pub fn close(&self, seat: PoolSeat) {
        let s = &self.slots[seat.slot];
        s.open.fetch_sub(1, Ordering::Relaxed);
        let mut inst = lock(&s.vm);
        if inst.generation == seat.generation {
            if let Err(e) = inst.vm.log_and_done(seat.id) {
                let _ = self.failed(&mut inst, e);
            }
        }
    }

    /// Fires due ticks on every instance (quarantine tables are refreshed from shared data on
    /// ticks), one lock at a time.
    pub fn run_due(&self) {
        for s in &self.slots {
            {
                let mut inst = lock(&s.vm);
                if let Err(e) = inst.vm.run_due() {
                    let _ = self.failed(&mut inst, e);
                }
            }
            // A callout may have timed out and its stream resumed (or been answered).
            s.settled.notify_waiters();
        }
    }

    fn failed(&self, inst: &mut Instance, e: HostError) -> PoolError {
        if matches!(e, HostError::Trap { .. }) {
            self.traps.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(e, HostError::Trap { .. } | HostError::VmDead { .. }) {
            eprintln!("llmkube-ext-proc: instance failed, replacing it: {e}");
            self.replace_if_dead(inst);
        }
        PoolError::Vm(e)
    }

    fn replace_if_dead(&self, inst: &mut Instance) {
        if !inst.vm.is_dead() {
            return;
        }
        match self.start(inst.slot, inst.generation + 1) {
            Ok(vm) => {
                inst.vm = vm;
                inst.generation += 1;
            }
            // The dead VM stays: every stream on it keeps failing closed until a restart works.
            Err(e) => eprintln!("llmkube-ext-proc: cannot replace a dead instance: {e:#}"),
        }
    }
}

fn start(module: &WasmModule, opts: &VmOptions) -> anyhow::Result<Vm> {
    let vm = Vm::from_module(module, opts.clone())?;
    if !vm.configure_ok() {
        anyhow::bail!("the module refused its plugin config (on_configure returned false)");
    }
    Ok(vm)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Traps in request headers; everything else is a no-op.
    const TRAPS_ON_HEADERS: &str = r#"(module
      (memory (export "memory") 1)
      (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
      (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable))"#;

    fn pool(instances: usize) -> Pool {
        let module = WasmModule::compile(TRAPS_ON_HEADERS.as_bytes()).unwrap();
        Pool::new(module, VmOptions::default(), instances, None).unwrap()
    }

    #[test]
    fn a_trapped_instance_is_replaced_and_its_streams_are_void() {
        let p = pool(1);
        let a = p.open().unwrap();
        let b = p.open().unwrap();
        let trap = p.with(&a, |vm, id| vm.request_headers(id, &[(":path", "/")], true));
        assert!(
            matches!(trap, Err(PoolError::Vm(HostError::Trap { .. }))),
            "{trap:?}"
        );
        // The other stream of the dead instance is refused, never run on the new one.
        assert!(matches!(
            p.with(&b, |vm, _| Ok(vm.open_streams())),
            Err(PoolError::Replaced)
        ));
        // A new stream gets a fresh instance with none of the old streams.
        let c = p.open().unwrap();
        assert_eq!(p.with(&c, |vm, _| Ok(vm.open_streams())).unwrap(), 1);
        p.close(a);
        p.close(b);
        p.close(c);
    }

    #[test]
    fn streams_spread_over_the_least_busy_instance() {
        let p = pool(2);
        let a = p.open().unwrap();
        let b = p.open().unwrap();
        assert_ne!(a.slot, b.slot);
        p.close(a);
        let c = p.open().unwrap();
        assert_eq!(c.slot, a.slot);
    }
}
