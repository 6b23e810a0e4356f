//! A pool of module instances. Each instance is one VM (like one Envoy worker) behind its own
//! lock; a stream is pinned to the instance it started on and takes that lock only for the
//! duration of one callback, so there is no global lock per request. A trapped instance is
//! replaced by a fresh one and never reused: the streams it held fail closed.

use llmkube_wasm_runtime::{HostError, StreamId, Vm, VmOptions, WasmModule};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

pub struct Pool {
    module: WasmModule,
    opts: VmOptions,
    slots: Vec<Slot>,
}

struct Slot {
    vm: Mutex<Instance>,
    open: AtomicUsize,
}

struct Instance {
    vm: Vm,
    /// Bumped when the VM is replaced: leases of the old one are void.
    generation: u64,
}

/// A stream's place in the pool.
#[derive(Debug, Clone, Copy)]
pub struct Lease {
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
    pub fn new(module: WasmModule, opts: VmOptions, instances: usize) -> anyhow::Result<Pool> {
        let mut slots = Vec::with_capacity(instances);
        for _ in 0..instances {
            let vm = start(&module, &opts)?;
            slots.push(Slot {
                vm: Mutex::new(Instance { vm, generation: 0 }),
                open: AtomicUsize::new(0),
            });
        }
        Ok(Pool {
            module,
            opts,
            slots,
        })
    }

    pub fn instances(&self) -> usize {
        self.slots.len()
    }

    /// Opens a stream on the instance with the fewest open streams.
    pub fn open(&self) -> Result<Lease, PoolError> {
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
        Ok(Lease {
            slot,
            generation: inst.generation,
            id,
        })
    }

    /// Runs `f` on the stream's instance. A trap replaces the instance.
    pub fn with<R>(
        &self,
        lease: &Lease,
        f: impl FnOnce(&mut Vm, StreamId) -> Result<R, HostError>,
    ) -> Result<R, PoolError> {
        let mut inst = lock(&self.slots[lease.slot].vm);
        if inst.generation != lease.generation {
            return Err(PoolError::Replaced);
        }
        f(&mut inst.vm, lease.id).map_err(|e| self.failed(&mut inst, e))
    }

    /// Ends a stream: access log and teardown when the instance is the one it started on.
    pub fn close(&self, lease: Lease) {
        let s = &self.slots[lease.slot];
        s.open.fetch_sub(1, Ordering::Relaxed);
        let mut inst = lock(&s.vm);
        if inst.generation == lease.generation {
            if let Err(e) = inst.vm.log_and_done(lease.id) {
                let _ = self.failed(&mut inst, e);
            }
        }
    }

    /// Fires due ticks on every instance (quarantine tables are refreshed from shared data on
    /// ticks), one lock at a time.
    pub fn run_due(&self) {
        for s in &self.slots {
            let mut inst = lock(&s.vm);
            if let Err(e) = inst.vm.run_due() {
                let _ = self.failed(&mut inst, e);
            }
        }
    }

    fn failed(&self, inst: &mut Instance, e: HostError) -> PoolError {
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
        match start(&self.module, &self.opts) {
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
        Pool::new(module, VmOptions::default(), instances).unwrap()
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
