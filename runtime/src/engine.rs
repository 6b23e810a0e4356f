//! One wasmtime engine per process and compiled modules cached by content.

use crate::state::HostState;
use crate::{abi, wasi};
use anyhow::{anyhow, Context as _};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use wasmtime::{Engine, Linker, Module};

pub(crate) fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let perfmap = std::env::var_os("WASM_HOST_PERFMAP").is_some();
        let fuel = std::env::var_os("WASM_HOST_FUEL").is_some();
        if perfmap || fuel {
            let mut config = wasmtime::Config::new();
            // `WASM_HOST_PERFMAP=1` writes /tmp/perf-<pid>.map so `perf report` names the
            // module's functions (profiling a filter's own code: testharness/host/examples).
            if perfmap {
                config.profiler(wasmtime::ProfilingStrategy::PerfMap);
            }
            // `WASM_HOST_FUEL=1` counts the guest's instructions ([`crate::Vm::fuel_used`]):
            // a measure of a filter's own work that machine load cannot blur.
            config.consume_fuel(fuel);
            if let Ok(engine) = Engine::new(&config) {
                return engine;
            }
        }
        Engine::default()
    })
}

/// The hostcalls are the same for every VM: link them once, instantiate many times.
pub(crate) fn linker() -> anyhow::Result<&'static Linker<HostState>> {
    static LINKER: OnceLock<Linker<HostState>> = OnceLock::new();
    if let Some(l) = LINKER.get() {
        return Ok(l);
    }
    let mut linker: Linker<HostState> = Linker::new(engine());
    abi::add_to_linker(&mut linker)?;
    wasi::add_to_linker(&mut linker, "wasi_snapshot_preview1")?;
    wasi::add_to_linker(&mut linker, "wasi_unstable")?;
    Ok(LINKER.get_or_init(|| linker))
}

/// A compiled filter module. Cheap to clone; instantiate it with [`crate::Vm::from_module`].
#[derive(Clone)]
pub struct WasmModule(pub(crate) Module);

impl WasmModule {
    /// Compiles `wasm` (binary or text), or returns the copy compiled earlier in this process.
    /// Refuses a module importing anything Envoy does not provide, naming every such import.
    pub fn compile(wasm: &[u8]) -> anyhow::Result<WasmModule> {
        let module = cached_module(bytes_key(wasm), || Ok(wasm.to_vec()))?;
        let bad: Vec<String> = module
            .imports()
            .filter(|i| !is_supported_import(i.module(), i.name()))
            .map(|i| format!("{}.{}", i.module(), i.name()))
            .collect();
        if !bad.is_empty() {
            return Err(anyhow!(
                "module imports functions Envoy does not provide: {}",
                bad.join(", ")
            ));
        }
        Ok(WasmModule(module))
    }
}

/// Compiling a filter with cranelift takes seconds; every VM of a process shares one compile.
/// Each key has its own cell so parallel loads wait for one compile instead of racing.
fn cached_module(
    key: String,
    wasm: impl FnOnce() -> anyhow::Result<Vec<u8>>,
) -> anyhow::Result<Module> {
    type Cell = Arc<OnceLock<Module>>;
    static CACHE: OnceLock<Mutex<HashMap<String, Cell>>> = OnceLock::new();
    let cell: Cell = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone();
    if let Some(m) = cell.get() {
        return Ok(m.clone());
    }
    // `OnceLock::get_or_try_init` is unstable; a losing racer just drops its module.
    let bytes = wasm()?;
    let module = Module::new(engine(), &bytes)
        .map_err(anyhow::Error::from)
        .context("compiling wasm module")?;
    Ok(cell.get_or_init(|| module).clone())
}

fn bytes_key(wasm: &[u8]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    wasm.hash(&mut h);
    format!("bytes:{}:{:x}", wasm.len(), h.finish())
}

/// `(module, name)` of every import, so a test can assert a filter only imports what Envoy has.
pub fn module_imports(wasm: &[u8]) -> anyhow::Result<Vec<(String, String)>> {
    let module = cached_module(bytes_key(wasm), || Ok(wasm.to_vec()))?;
    Ok(module
        .imports()
        .map(|i| (i.module().to_string(), i.name().to_string()))
        .collect())
}

/// Imports Envoy would refuse (anything but `env.proxy_*` it implements and its WASI set).
pub fn unsupported_imports(wasm: &[u8]) -> anyhow::Result<Vec<(String, String)>> {
    Ok(module_imports(wasm)?
        .into_iter()
        .filter(|(m, n)| !is_supported_import(m, n))
        .collect())
}

fn is_supported_import(module: &str, name: &str) -> bool {
    match module {
        "env" => crate::hostcall::FUNCTIONS.contains(&name),
        "wasi_snapshot_preview1" | "wasi_unstable" => wasi::FUNCTIONS.contains(&name),
        _ => false,
    }
}
