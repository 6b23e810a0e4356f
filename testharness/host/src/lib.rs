//! A proxy-wasm ABI 0.2.1 host on wasmtime that drives a compiled filter the way Envoy 1.40
//! does, including the behaviours that bite in production (see `docs/architecture.md` and
//! `/work/shared/reference/envoy.md`):
//! - without `allow_on_headers_stop_iteration`, `Pause` from request headers stops everything and
//!   the body callback never runs: the request hangs;
//! - header writes after the headers phase continued fail with `BadArgument`;
//! - a guest trap kills the VM (Envoy's fail-closed answers 503 from then on);
//! - shared data CAS, including "a set on a missing key always succeeds".
//!
//! The host is deterministic: a manual clock, scripted HTTP callouts, a seeded WASI random.

mod abi;
mod shared;
mod wasi;

pub use shared::SharedStore;

use anyhow::{anyhow, Context as _};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use wasmtime::{Engine, Instance, Linker, Module, Store, Val};

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
        }
    }
}

impl std::error::Error for HostError {}

/// A context id of an HTTP stream.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

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

/// Answers callouts as they are made; `None` leaves the call pending for
/// [`Host::reply_http_call`] (or its timeout on the manual clock).
pub type HttpCallResponder = Arc<dyn Fn(&HttpCallRecord) -> Option<HttpCallReply> + Send + Sync>;

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
    /// Every value recorded into a histogram.
    pub samples: Vec<u64>,
}

/// How the VM and plugin are configured, mirroring Envoy's `vm_config` / plugin `config`.
#[derive(Clone)]
pub struct VmOptions {
    pub vm_id: String,
    pub root_id: String,
    pub vm_configuration: Vec<u8>,
    pub plugin_configuration: Vec<u8>,
    /// Envoy's `allow_on_headers_stop_iteration` (>= 1.35). Off by default, as in Envoy.
    pub allow_on_headers_stop_iteration: bool,
    /// Properties by path (`["request","path"]`, `["xds","cluster_name"]`, ...). Request/response
    /// properties not set here are derived from the stream's headers.
    pub properties: HashMap<Vec<String>, Vec<u8>>,
    pub http_call_responder: Option<HttpCallResponder>,
    /// If set, `proxy_http_call` to any other cluster fails with BadArgument, as Envoy does
    /// for unknown clusters.
    pub known_clusters: Option<Vec<String>>,
    /// What `proxy_get_log_level` reports. Envoy's default is Info; tests want everything.
    pub log_level: LogLevel,
    /// Share with another Host to model two Envoy workers of the same plugin.
    pub shared: SharedStore,
    /// Environment variables visible through WASI (Envoy's `vm_config.environment_variables`).
    pub environment: Vec<(String, String)>,
    /// Realtime clock start, nanoseconds since the Unix epoch.
    pub start_time_nanos: u64,
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            vm_id: String::new(),
            root_id: String::new(),
            vm_configuration: Vec::new(),
            plugin_configuration: Vec::new(),
            allow_on_headers_stop_iteration: false,
            properties: HashMap::new(),
            http_call_responder: None,
            known_clusters: None,
            log_level: LogLevel::Trace,
            shared: SharedStore::new(),
            environment: Vec::new(),
            start_time_nanos: 1_700_000_000_000_000_000,
        }
    }
}

impl VmOptions {
    pub fn with_plugin_config(mut self, config: impl Into<Vec<u8>>) -> Self {
        self.plugin_configuration = config.into();
        self
    }
    pub fn allow_stop_iteration(mut self, allow: bool) -> Self {
        self.allow_on_headers_stop_iteration = allow;
        self
    }
    pub fn with_property(mut self, path: &[&str], value: impl Into<Vec<u8>>) -> Self {
        self.properties
            .insert(path.iter().map(|s| s.to_string()).collect(), value.into());
        self
    }
    pub fn with_shared(mut self, shared: &SharedStore) -> Self {
        self.shared = shared.clone();
        self
    }
    pub fn with_responder(
        mut self,
        f: impl Fn(&HttpCallRecord) -> Option<HttpCallReply> + Send + Sync + 'static,
    ) -> Self {
        self.http_call_responder = Some(Arc::new(f));
        self
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
    pub end_seen: bool,
    pub forwarded_body: Vec<u8>,
    pub trailers_forwarded: bool,
    pub complete: bool,
    pub resume_requested: bool,
    pub actions: Vec<Action>,
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
}

impl Stream {
    fn ended(&self) -> bool {
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
    pub deadline_nanos: u64,
}

/// Everything the hostcalls can see; lives inside the wasmtime Store.
pub(crate) struct HostState {
    pub opts: VmOptions,
    pub host_key: u64,
    pub effective: u32,
    pub streams: BTreeMap<u32, Stream>,
    pub logs: Vec<(LogLevel, String)>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub clock_nanos: u64,
    pub monotonic_nanos: u64,
    pub tick_period_ms: u32,
    pub next_tick_nanos: u64,
    pub metrics: Vec<Metric>,
    pub pending_calls: BTreeMap<u32, PendingCall>,
    pub new_calls: Vec<u32>,
    pub calls: Vec<HttpCallRecord>,
    pub next_token: u32,
    pub call_response: Option<HttpCallReply>,
    pub rng: u64,
    pub done_called: bool,
    pub foreign_calls: Vec<String>,
    /// Every property path the module asked for, in order (found or not).
    pub property_reads: Vec<Vec<String>>,
}

static NEXT_HOST_KEY: AtomicU64 = AtomicU64::new(1);

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        // `WASM_HOST_PERFMAP=1` writes /tmp/perf-<pid>.map so `perf report` names the module's
        // functions (profiling a filter's own code: testharness/host/examples/filter_cost.rs).
        if std::env::var_os("WASM_HOST_PERFMAP").is_some() {
            let mut config = wasmtime::Config::new();
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
            if let Ok(engine) = Engine::new(&config) {
                return engine;
            }
        }
        Engine::default()
    })
}

/// Compiling a filter with cranelift takes seconds; every test of a process shares one compile.
/// Each key has its own cell so parallel tests wait for one compile instead of racing.
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

/// Builds a workspace cdylib for `wasm32-wasip1` (release, as it ships) and returns the `.wasm`
/// path. Run once per test process: cargo is a no-op when fresh and it prevents testing a stale
/// module. Uses `$CARGO_TARGET_DIR` if set, else `<workspace>/target`.
///
/// `package` is the cargo package (`probe-filter`), `artifact` the file stem (`probe_filter`).
pub fn build_wasm(package: &str, artifact: &str) -> anyhow::Result<std::path::PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(&workspace)
        .env("CARGO_TARGET_DIR", &target)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip1",
            "-p",
            package,
        ])
        .output()
        .context("running cargo")?;
    if !out.status.success() {
        return Err(anyhow!(
            "building {package} for wasm32-wasip1 failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let wasm = target.join(format!("wasm32-wasip1/release/{artifact}.wasm"));
    if !wasm.exists() {
        return Err(anyhow!("{} missing after build", wasm.display()));
    }
    Ok(wasm)
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
        "env" => abi::FUNCTIONS.contains(&name),
        "wasi_snapshot_preview1" | "wasi_unstable" => wasi::FUNCTIONS.contains(&name),
        _ => false,
    }
}

/// One Envoy worker's VM of a plugin: a wasmtime Store + Instance, plus the host-side state.
pub struct Host {
    store: Store<HostState>,
    instance: Instance,
    configure_ok: bool,
    vm_start_ok: bool,
    next_context_id: u32,
    dead: Option<String>,
}

impl Host {
    /// Load from a file. Modules are cached by content, so a rebuilt file is recompiled.
    pub fn from_file(path: impl AsRef<Path>, opts: VmOptions) -> anyhow::Result<Host> {
        let path = path.as_ref();
        let wasm = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Host::new(&wasm, opts)
    }

    pub fn new(wasm: &[u8], opts: VmOptions) -> anyhow::Result<Host> {
        let module = cached_module(bytes_key(wasm), || Ok(wasm.to_vec()))?;
        Host::from_module(module, opts)
    }

    /// Instantiates and starts the plugin like Envoy: `_initialize`/`_start`, root context
    /// creation, `on_vm_start`, `on_configure`. A failing start/configure is reported by
    /// [`Host::vm_start_ok`]/[`Host::configure_ok`], not as an error, so tests can assert on it.
    fn from_module(module: Module, opts: VmOptions) -> anyhow::Result<Host> {
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
        let seed = opts.start_time_nanos ^ 0x9E37_79B9_7F4A_7C15;
        let state = HostState {
            clock_nanos: opts.start_time_nanos,
            monotonic_nanos: 1_000_000_000,
            opts,
            host_key: NEXT_HOST_KEY.fetch_add(1, Ordering::Relaxed),
            effective: ROOT_CONTEXT_ID,
            streams: BTreeMap::new(),
            logs: Vec::new(),
            stdout: Vec::new(),
            stderr: Vec::new(),
            tick_period_ms: 0,
            next_tick_nanos: 0,
            metrics: Vec::new(),
            pending_calls: BTreeMap::new(),
            new_calls: Vec::new(),
            calls: Vec::new(),
            next_token: 1,
            call_response: None,
            rng: seed | 1,
            done_called: false,
            foreign_calls: Vec::new(),
            property_reads: Vec::new(),
        };
        let mut store = Store::new(engine(), state);
        let mut linker: Linker<HostState> = Linker::new(engine());
        abi::add_to_linker(&mut linker)?;
        wasi::add_to_linker(&mut linker, "wasi_snapshot_preview1")?;
        wasi::add_to_linker(&mut linker, "wasi_unstable")?;
        let instance = linker
            .instantiate(&mut store, &module)
            .map_err(anyhow::Error::from)
            .context("instantiating wasm module")?;
        let mut host = Host {
            store,
            instance,
            configure_ok: false,
            vm_start_ok: false,
            next_context_id: ROOT_CONTEXT_ID + 1,
            dead: None,
        };
        let start = if host
            .instance
            .get_func(&mut host.store, "_initialize")
            .is_some()
        {
            Some("_initialize")
        } else if host.instance.get_func(&mut host.store, "_start").is_some() {
            Some("_start")
        } else {
            None
        };
        if let Some(f) = start {
            host.call(f, &[], ROOT_CONTEXT_ID)?;
        }
        host.call(
            "proxy_on_context_create",
            &[ROOT_CONTEXT_ID as i32, 0],
            ROOT_CONTEXT_ID,
        )?;
        let vm_len = host.store.data().opts.vm_configuration.len() as i32;
        host.vm_start_ok = host
            .call(
                "proxy_on_vm_start",
                &[ROOT_CONTEXT_ID as i32, vm_len],
                ROOT_CONTEXT_ID,
            )?
            .is_none_or(|r| r != 0);
        let cfg_len = host.store.data().opts.plugin_configuration.len() as i32;
        host.configure_ok = host
            .call(
                "proxy_on_configure",
                &[ROOT_CONTEXT_ID as i32, cfg_len],
                ROOT_CONTEXT_ID,
            )?
            .is_none_or(|r| r != 0);
        host.pump()?;
        Ok(host)
    }

    pub fn configure_ok(&self) -> bool {
        self.configure_ok
    }

    pub fn vm_start_ok(&self) -> bool {
        self.vm_start_ok
    }

    /// Why the VM died, if a trap killed it.
    pub fn dead_reason(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Calls a guest export with `effective` as the current context. Missing exports are a
    /// no-op (`Ok(None)`), as in Envoy. A trap kills the VM for good.
    fn call(&mut self, name: &str, args: &[i32], effective: u32) -> Result<Option<i32>, HostError> {
        if let Some(reason) = &self.dead {
            return Err(HostError::VmDead {
                reason: reason.clone(),
            });
        }
        let Some(func) = self.instance.get_func(&mut self.store, name) else {
            return Ok(None);
        };
        self.store.data_mut().effective = effective;
        let params: Vec<Val> = args.iter().map(|a| Val::I32(*a)).collect();
        let n_results = func.ty(&self.store).results().len();
        let mut results = vec![Val::I32(0); n_results];
        match func.call(&mut self.store, &params, &mut results) {
            Ok(()) => Ok(results.first().and_then(|v| v.i32())),
            Err(e) => {
                let message = format!("{e:#}");
                self.dead = Some(format!("{name}: {message}"));
                Err(HostError::Trap {
                    function: name.to_string(),
                    message,
                })
            }
        }
    }

    fn check_alive(&self) -> Result<(), HostError> {
        match &self.dead {
            Some(reason) => Err(HostError::VmDead {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Creates an HTTP stream context (`proxy_on_context_create(new_id, root_id)`).
    pub fn new_http_stream(&mut self) -> Result<StreamId, HostError> {
        self.check_alive()?;
        let id = self.next_context_id;
        self.next_context_id += 1;
        self.store.data_mut().streams.insert(id, Stream::default());
        self.call(
            "proxy_on_context_create",
            &[id as i32, ROOT_CONTEXT_ID as i32],
            id,
        )?;
        Ok(StreamId(id))
    }

    fn stream(&self, id: StreamId) -> Result<&Stream, HostError> {
        self.store
            .data()
            .streams
            .get(&id.0)
            .ok_or(HostError::UnknownStream(id))
    }

    fn dir_mut(&mut self, id: StreamId, dir: Dir) -> Result<&mut Direction, HostError> {
        let s = self
            .store
            .data_mut()
            .streams
            .get_mut(&id.0)
            .ok_or(HostError::UnknownStream(id))?;
        Ok(match dir {
            Dir::Request => &mut s.req,
            Dir::Response => &mut s.resp,
        })
    }

    fn ended(&self, id: StreamId) -> Result<bool, HostError> {
        Ok(self.stream(id)?.ended())
    }

    pub fn request_headers(
        &mut self,
        id: StreamId,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.headers(id, Dir::Request, headers, end_of_stream)
    }

    pub fn response_headers(
        &mut self,
        id: StreamId,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.headers(id, Dir::Response, headers, end_of_stream)
    }

    /// Envoy semantics: the filter's `body_size` is the whole body buffered so far when the
    /// previous body callback stopped iteration, else just this chunk.
    pub fn request_body(
        &mut self,
        id: StreamId,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.body(id, Dir::Request, chunk, end_of_stream)
    }

    pub fn response_body(
        &mut self,
        id: StreamId,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Result<Action, HostError> {
        self.body(id, Dir::Response, chunk, end_of_stream)
    }

    pub fn request_trailers(
        &mut self,
        id: StreamId,
        trailers: &[(&str, &str)],
    ) -> Result<Action, HostError> {
        self.trailers(id, Dir::Request, trailers)
    }

    pub fn response_trailers(
        &mut self,
        id: StreamId,
        trailers: &[(&str, &str)],
    ) -> Result<Action, HostError> {
        self.trailers(id, Dir::Response, trailers)
    }

    fn record(&mut self, id: StreamId, dir: Dir, a: Action) -> Result<Action, HostError> {
        self.dir_mut(id, dir)?.actions.push(a);
        Ok(a)
    }

    fn headers(
        &mut self,
        id: StreamId,
        dir: Dir,
        headers: &[(&str, &str)],
        eos: bool,
    ) -> Result<Action, HostError> {
        self.check_alive()?;
        if self.ended(id)? {
            return self.record(id, dir, Action::NotDelivered);
        }
        let d = self.dir_mut(id, dir)?;
        d.headers = headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        d.headers_seen = true;
        d.end_seen = eos;
        let n = d.headers.len() as i32;
        let export = match dir {
            Dir::Request => "proxy_on_request_headers",
            Dir::Response => "proxy_on_response_headers",
        };
        let raw = self
            .call(export, &[id.0 as i32, n, eos as i32], id.0)?
            .unwrap_or(0);
        let action = Action::from_raw(raw);
        if !self.ended(id)? {
            let allow = self.store.data().opts.allow_on_headers_stop_iteration;
            let d = self.dir_mut(id, dir)?;
            match action {
                Action::Continue => {
                    d.headers_continued = true;
                    d.complete = eos;
                }
                // Without the flag Envoy 1.40 does not deliver the body to a filter that paused
                // in headers: the request waits (in production until the idle timeout).
                Action::Pause if !allow => d.stop_all = true,
                Action::Pause => {}
                // ContinueAndEndStream / StopAllIteration* from the 0.2.1 header statuses.
                Action::Other(2) => {
                    d.headers_continued = true;
                    d.complete = true;
                }
                _ => d.stop_all = true,
            }
        }
        self.pump()?;
        self.record(id, dir, action)
    }

    fn body(
        &mut self,
        id: StreamId,
        dir: Dir,
        chunk: &[u8],
        eos: bool,
    ) -> Result<Action, HostError> {
        self.check_alive()?;
        if self.ended(id)? {
            return self.record(id, dir, Action::NotDelivered);
        }
        let d = self.dir_mut(id, dir)?;
        if d.stop_all {
            d.held.push_back(Held::Body(chunk.to_vec(), eos));
            d.end_seen |= eos;
            return self.record(id, dir, Action::NotDelivered);
        }
        let action = self.deliver_body(id, dir, chunk, eos)?;
        self.pump()?;
        self.record(id, dir, action)
    }

    fn deliver_body(
        &mut self,
        id: StreamId,
        dir: Dir,
        chunk: &[u8],
        eos: bool,
    ) -> Result<Action, HostError> {
        let d = self.dir_mut(id, dir)?;
        if !d.buffering {
            d.buffer.clear();
        }
        d.buffer.extend_from_slice(chunk);
        d.end_seen |= eos;
        let size = d.buffer.len() as i32;
        let export = match dir {
            Dir::Request => "proxy_on_request_body",
            Dir::Response => "proxy_on_response_body",
        };
        let raw = self
            .call(export, &[id.0 as i32, size, eos as i32], id.0)?
            .unwrap_or(0);
        let action = Action::from_raw(raw);
        if self.ended(id)? {
            return Ok(action);
        }
        let d = self.dir_mut(id, dir)?;
        if action == Action::Continue {
            let buf = std::mem::take(&mut d.buffer);
            d.forwarded_body.extend_from_slice(&buf);
            d.buffering = false;
            d.headers_continued = true;
            if eos {
                d.complete = true;
            }
        } else {
            // StopIterationAndBuffer and the other stop codes: Envoy keeps buffering.
            d.buffering = true;
        }
        Ok(action)
    }

    fn trailers(
        &mut self,
        id: StreamId,
        dir: Dir,
        trailers: &[(&str, &str)],
    ) -> Result<Action, HostError> {
        self.check_alive()?;
        if self.ended(id)? {
            return self.record(id, dir, Action::NotDelivered);
        }
        let owned: Vec<(String, String)> = trailers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
            .collect();
        let d = self.dir_mut(id, dir)?;
        if d.stop_all {
            d.held.push_back(Held::Trailers(owned));
            d.end_seen = true;
            return self.record(id, dir, Action::NotDelivered);
        }
        let action = self.deliver_trailers(id, dir, owned)?;
        self.pump()?;
        self.record(id, dir, action)
    }

    fn deliver_trailers(
        &mut self,
        id: StreamId,
        dir: Dir,
        trailers: Vec<(String, String)>,
    ) -> Result<Action, HostError> {
        let d = self.dir_mut(id, dir)?;
        let n = trailers.len() as i32;
        d.trailers = trailers;
        d.end_seen = true;
        let export = match dir {
            Dir::Request => "proxy_on_request_trailers",
            Dir::Response => "proxy_on_response_trailers",
        };
        let raw = self.call(export, &[id.0 as i32, n], id.0)?.unwrap_or(0);
        let action = Action::from_raw(raw);
        if !self.ended(id)? && action == Action::Continue {
            let d = self.dir_mut(id, dir)?;
            let buf = std::mem::take(&mut d.buffer);
            d.forwarded_body.extend_from_slice(&buf);
            d.buffering = false;
            d.headers_continued = true;
            d.trailers_forwarded = true;
            d.complete = true;
        }
        Ok(action)
    }

    /// Runs what Envoy's event loop would run next: resumes requested by `proxy_continue_stream`,
    /// scripted callout replies and queue notifications.
    fn pump(&mut self) -> Result<(), HostError> {
        loop {
            self.check_alive()?;
            let mut progressed = false;
            let resumes: Vec<(u32, Dir)> = self
                .store
                .data()
                .streams
                .iter()
                .flat_map(|(id, s)| {
                    let mut v = vec![];
                    if s.req.resume_requested {
                        v.push((*id, Dir::Request));
                    }
                    if s.resp.resume_requested {
                        v.push((*id, Dir::Response));
                    }
                    v
                })
                .collect();
            for (id, dir) in resumes {
                progressed = true;
                self.resume(StreamId(id), dir)?;
            }
            let new_calls = std::mem::take(&mut self.store.data_mut().new_calls);
            if let Some(responder) = self.store.data().opts.http_call_responder.clone() {
                for token in new_calls {
                    let Some(call) = self.store.data().pending_calls.get(&token) else {
                        continue;
                    };
                    if let Some(reply) = responder(&call.record) {
                        progressed = true;
                        self.deliver_http_call_response(token, Some(reply))?;
                    }
                }
            }
            let owner = self.store.data().host_key;
            if let Some((root, queue)) = self.store.data().opts.shared.take_notification(owner) {
                progressed = true;
                self.call("proxy_on_queue_ready", &[root as i32, queue as i32], root)?;
            }
            if !progressed {
                return Ok(());
            }
        }
    }

    fn resume(&mut self, id: StreamId, dir: Dir) -> Result<(), HostError> {
        if self.ended(id)? {
            return Ok(());
        }
        let d = self.dir_mut(id, dir)?;
        d.resume_requested = false;
        d.stop_all = false;
        d.headers_continued = true;
        if d.buffering {
            let buf = std::mem::take(&mut d.buffer);
            d.forwarded_body.extend_from_slice(&buf);
            d.buffering = false;
        }
        if d.end_seen && d.held.is_empty() {
            d.complete = true;
        }
        while let Some(held) = self.dir_mut(id, dir)?.held.pop_front() {
            if self.ended(id)? {
                break;
            }
            match held {
                Held::Body(chunk, eos) => {
                    self.deliver_body(id, dir, &chunk, eos)?;
                }
                Held::Trailers(t) => {
                    self.deliver_trailers(id, dir, t)?;
                }
            }
            if self.dir_mut(id, dir)?.stop_all {
                break;
            }
        }
        Ok(())
    }

    /// Explicitly delivers pending `on_queue_ready` notifications (e.g. after another Host
    /// enqueued onto a queue this VM registered).
    pub fn deliver_queues(&mut self) -> Result<(), HostError> {
        self.pump()
    }

    /// `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`, in the order Envoy 1.40 calls them
    /// (access logging runs before filters are destroyed). Pending callouts are cancelled.
    pub fn log_and_done(&mut self, id: StreamId) -> Result<(), HostError> {
        self.check_alive()?;
        self.stream(id)?;
        self.call("proxy_on_log", &[id.0 as i32], id.0)?;
        self.call("proxy_on_done", &[id.0 as i32], id.0)?;
        self.call("proxy_on_delete", &[id.0 as i32], id.0)?;
        let st = self.store.data_mut();
        st.streams.remove(&id.0);
        st.pending_calls.retain(|_, c| c.record.context_id != id.0);
        self.pump()
    }

    /// Sends a whole request: headers, then the body in `chunk_size` pieces (one piece if 0),
    /// `end_of_stream` on the last. The stream stays open for the response phase.
    pub fn run_request(
        &mut self,
        headers: &[(&str, &str)],
        body: &[u8],
        chunk_size: usize,
    ) -> Result<StreamOutcome, HostError> {
        let id = self.new_http_stream()?;
        self.request_headers(id, headers, body.is_empty())?;
        let chunk = if chunk_size == 0 {
            body.len().max(1)
        } else {
            chunk_size
        };
        let chunks: Vec<&[u8]> = body.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            self.request_body(id, c, i + 1 == chunks.len())?;
        }
        self.request_outcome(id)
    }

    /// Sends a whole response on a stream whose request already ran.
    pub fn run_response(
        &mut self,
        id: StreamId,
        headers: &[(&str, &str)],
        body: &[u8],
        chunk_size: usize,
    ) -> Result<StreamOutcome, HostError> {
        self.response_headers(id, headers, body.is_empty())?;
        let chunk = if chunk_size == 0 {
            body.len().max(1)
        } else {
            chunk_size
        };
        let chunks: Vec<&[u8]> = body.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            self.response_body(id, c, i + 1 == chunks.len())?;
        }
        self.response_outcome(id)
    }

    pub fn request_outcome(&self, id: StreamId) -> Result<StreamOutcome, HostError> {
        let s = self.stream(id)?;
        Ok(StreamOutcome::of(id, s, &s.req))
    }

    pub fn response_outcome(&self, id: StreamId) -> Result<StreamOutcome, HostError> {
        let s = self.stream(id)?;
        Ok(StreamOutcome::of(id, s, &s.resp))
    }

    /// Fires `proxy_on_tick` once on the root context, whatever the tick period.
    pub fn tick(&mut self) -> Result<(), HostError> {
        self.call("proxy_on_tick", &[ROOT_CONTEXT_ID as i32], ROOT_CONTEXT_ID)?;
        self.pump()
    }

    /// Moves the manual clock forward, firing every tick period and callout timeout that
    /// elapses, in time order, with the clock set to each event's time.
    pub fn advance_clock(&mut self, by: Duration) -> Result<(), HostError> {
        self.check_alive()?;
        let target = self
            .store
            .data()
            .clock_nanos
            .saturating_add(by.as_nanos() as u64);
        loop {
            let st = self.store.data();
            let tick_at = (st.tick_period_ms > 0).then_some(st.next_tick_nanos);
            let timeout = st
                .pending_calls
                .iter()
                .map(|(t, c)| (c.deadline_nanos, *t))
                .min();
            let next_tick = tick_at.filter(|t| *t <= target);
            let next_timeout = timeout.filter(|(d, _)| *d <= target);
            match (next_tick, next_timeout) {
                (None, None) => break,
                (Some(t), to) if to.is_none_or(|(d, _)| t <= d) => {
                    self.set_clock(t);
                    let period = self.store.data().tick_period_ms as u64 * 1_000_000;
                    self.store.data_mut().next_tick_nanos = t + period;
                    self.tick()?;
                }
                (_, Some((d, token))) => {
                    self.set_clock(d);
                    // Envoy reports a timed-out callout as a response with nothing in it.
                    self.deliver_http_call_response(token, None)?;
                    self.pump()?;
                }
                _ => unreachable!(),
            }
        }
        self.set_clock(target);
        Ok(())
    }

    fn set_clock(&mut self, nanos: u64) {
        let st = self.store.data_mut();
        if nanos > st.clock_nanos {
            st.monotonic_nanos += nanos - st.clock_nanos;
            st.clock_nanos = nanos;
        }
    }

    /// Current realtime clock, nanoseconds since the Unix epoch.
    pub fn now_nanos(&self) -> u64 {
        self.store.data().clock_nanos
    }

    pub fn tick_period(&self) -> Option<Duration> {
        let ms = self.store.data().tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(ms as u64))
    }

    /// Every callout the filter made, in order.
    pub fn http_calls(&self) -> &[HttpCallRecord] {
        &self.store.data().calls
    }

    /// Tokens of callouts still waiting for a reply.
    pub fn pending_http_calls(&self) -> Vec<u32> {
        self.store.data().pending_calls.keys().copied().collect()
    }

    /// Answers a pending callout: `proxy_on_http_call_response(context, token, nheaders,
    /// body_size, ntrailers)`, with the reply readable through the HttpCallResponse* types.
    pub fn reply_http_call(&mut self, token: u32, reply: HttpCallReply) -> Result<(), HostError> {
        self.check_alive()?;
        if !self.store.data().pending_calls.contains_key(&token) {
            return Err(HostError::UnknownHttpCall(token));
        }
        self.deliver_http_call_response(token, Some(reply))?;
        self.pump()
    }

    fn deliver_http_call_response(
        &mut self,
        token: u32,
        reply: Option<HttpCallReply>,
    ) -> Result<(), HostError> {
        let Some(call) = self.store.data_mut().pending_calls.remove(&token) else {
            return Err(HostError::UnknownHttpCall(token));
        };
        let ctx = call.record.context_id;
        let (nh, nb, nt) = reply.as_ref().map_or((0, 0, 0), |r| {
            (r.headers.len(), r.body.len(), r.trailers.len())
        });
        self.store.data_mut().call_response = reply;
        let r = self.call(
            "proxy_on_http_call_response",
            &[ctx as i32, token as i32, nh as i32, nb as i32, nt as i32],
            ctx,
        );
        self.store.data_mut().call_response = None;
        r.map(|_| ())
    }

    /// Property paths the module has read so far (each a list of segments).
    pub fn property_reads(&self) -> &[Vec<String>] {
        &self.store.data().property_reads
    }

    pub fn logs(&self) -> &[(LogLevel, String)] {
        &self.store.data().logs
    }

    /// True if any log line contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.logs().iter().any(|(_, l)| l.contains(needle))
    }

    /// Log lines containing `needle`.
    pub fn logs_matching(&self, needle: &str) -> Vec<String> {
        self.logs()
            .iter()
            .filter(|(_, l)| l.contains(needle))
            .map(|(_, l)| l.clone())
            .collect()
    }

    pub fn clear_logs(&mut self) {
        self.store.data_mut().logs.clear();
    }

    /// Raw bytes the guest wrote to WASI stdout / stderr.
    pub fn stdout(&self) -> &[u8] {
        &self.store.data().stdout
    }
    pub fn stderr(&self) -> &[u8] {
        &self.store.data().stderr
    }

    pub fn metrics(&self) -> &[Metric] {
        &self.store.data().metrics
    }

    pub fn metric(&self, name: &str) -> Option<&Metric> {
        self.metrics().iter().find(|m| m.name == name)
    }

    pub fn shared(&self) -> &SharedStore {
        &self.store.data().opts.shared
    }

    /// Shared data of this VM's vm_id: (value, cas).
    pub fn shared_data_get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let st = self.store.data();
        st.opts.shared.get(&st.opts.vm_id, key)
    }

    pub fn shared_data_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
        let st = self.store.data();
        st.opts.shared.set(&st.opts.vm_id, key, value, cas)
    }

    pub fn set_property(&mut self, path: &[&str], value: impl Into<Vec<u8>>) {
        self.store
            .data_mut()
            .opts
            .properties
            .insert(path.iter().map(|s| s.to_string()).collect(), value.into());
    }

    pub fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let key: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        self.store.data().opts.properties.get(&key).cloned()
    }

    /// Names passed to `proxy_call_foreign_function`.
    pub fn foreign_calls(&self) -> &[String] {
        &self.store.data().foreign_calls
    }

    /// Whether the plugin called `proxy_done`.
    pub fn done_called(&self) -> bool {
        self.store.data().done_called
    }
}

/// Where one direction of a stream stands, as the next hop would see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOutcome {
    pub stream: StreamId,
    /// What each delivered (or withheld) callback of this direction answered.
    pub actions: Vec<Action>,
    pub local_response: Option<LocalResponse>,
    /// The header map as the next hop sees it, once headers were let through.
    pub forwarded_headers: Option<Vec<(String, String)>>,
    pub forwarded_body: Vec<u8>,
    pub forwarded_trailers: Option<Vec<(String, String)>>,
    /// Headers, whole body and trailers went through.
    pub complete: bool,
    /// Neither forwarded nor answered: in Envoy this stream waits until a timeout.
    pub paused_forever: bool,
    /// The filter stopped all iteration: data arrived but was never delivered to it.
    pub withheld: bool,
    pub reset: bool,
}

impl StreamOutcome {
    fn of(id: StreamId, s: &Stream, d: &Direction) -> StreamOutcome {
        StreamOutcome {
            stream: id,
            actions: d.actions.clone(),
            local_response: s.local_response.clone(),
            forwarded_headers: d.headers_continued.then(|| d.headers.clone()),
            forwarded_body: d.forwarded_body.clone(),
            forwarded_trailers: d.trailers_forwarded.then(|| d.trailers.clone()),
            complete: d.complete && !s.ended(),
            paused_forever: d.headers_seen && !d.complete && !s.ended(),
            withheld: d.stop_all,
            reset: s.reset,
        }
    }

    /// A forwarded header's first value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.forwarded_headers
            .as_ref()
            .and_then(|h| find_header(h, name))
    }

    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.forwarded_body).into_owned()
    }
}

/// Kept for teammates who think of the request side only.
pub type RequestOutcome = StreamOutcome;

pub(crate) fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}
