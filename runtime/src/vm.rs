//! One VM of a plugin: a wasmtime Store + Instance and the stream state Envoy would keep for it,
//! driven callback by callback.

use crate::abi::grpc;
use crate::embedder::{Clock, HttpCallReply, SystemClock};
use crate::engine::{engine, linker, WasmModule};
use crate::hostcall::FUNCTIONS;
use crate::options::VmOptions;
use crate::shared::SharedStore;
use crate::state::{Dir, HostState, LocalResponse, Metric};
use crate::state::{Direction, Held, Stream};
use crate::types::{find_header, Action, HostError, Status, StreamId, ROOT_CONTEXT_ID};
use anyhow::Context as _;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use wasmtime::{Instance, Store, Val};

/// Callback answers kept per stream direction ([`StreamOutcome::actions`]).
pub const MAX_RECORDED_ACTIONS: usize = 256;

/// Properties an embedder may set on one stream.
pub const MAX_STREAM_PROPERTIES: usize = 32;

static NEXT_HOST_KEY: AtomicU64 = AtomicU64::new(1);

fn os_seed() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    SystemClock.realtime_nanos() ^ (NEXT_HOST_KEY.load(Ordering::Relaxed) << 32)
}

/// One Envoy worker's VM of a plugin: a wasmtime Store + Instance, plus the host-side state.
pub struct Vm {
    store: Store<HostState>,
    instance: Instance,
    configure_ok: bool,
    vm_start_ok: bool,
    next_context_id: u32,
    dead: Option<String>,
}

impl Vm {
    /// Load from a file. Modules are cached by content, so a rebuilt file is recompiled.
    pub fn from_file(path: impl AsRef<Path>, opts: VmOptions) -> anyhow::Result<Vm> {
        let path = path.as_ref();
        let wasm = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        Vm::new(&wasm, opts)
    }

    pub fn new(wasm: &[u8], opts: VmOptions) -> anyhow::Result<Vm> {
        Vm::from_module(&WasmModule::compile(wasm)?, opts)
    }

    /// Instantiates and starts the plugin like Envoy: `_initialize`/`_start`, root context
    /// creation, `on_vm_start`, `on_configure`. A failing start/configure is reported by
    /// [`Vm::vm_start_ok`]/[`Vm::configure_ok`], not as an error, so tests can assert on it.
    pub fn from_module(module: &WasmModule, opts: VmOptions) -> anyhow::Result<Vm> {
        let seed = opts.random_seed.unwrap_or_else(os_seed) ^ 0x9E37_79B9_7F4A_7C15;
        let state = HostState {
            opts,
            host_key: NEXT_HOST_KEY.fetch_add(1, Ordering::Relaxed),
            effective: ROOT_CONTEXT_ID,
            streams: BTreeMap::new(),
            tick_period_ms: 0,
            next_tick_nanos: 0,
            metrics: Vec::new(),
            pending_calls: BTreeMap::new(),
            new_calls: Vec::new(),
            next_token: 1,
            call_response: None,
            rng: seed | 1,
            done_called: false,
            foreign_calls: VecDeque::new(),
            hostcalls: vec![0; FUNCTIONS.len()],
            hostcall_trace: None,
        };
        let mut store = Store::new(engine(), state);
        // Only an engine built with `WASM_HOST_FUEL` meters fuel; otherwise this is refused.
        let _ = store.set_fuel(u64::MAX);
        let instance = linker()?
            .instantiate(&mut store, &module.0)
            .map_err(anyhow::Error::from)
            .context("instantiating wasm module")?;
        let mut host = Vm {
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

    /// Wasm instructions the guest has executed so far (wasmtime fuel: about one per operator),
    /// when the process runs with `WASM_HOST_FUEL=1`; `None` otherwise. Unlike time, it does not
    /// move with machine load: compare a filter's callbacks before and after a change by it.
    pub fn fuel_used(&self) -> Option<u64> {
        self.store.get_fuel().ok().map(|left| u64::MAX - left)
    }

    /// How many times the guest called each `env.proxy_*` function so far (those it called).
    pub fn hostcalls(&self) -> Vec<(&'static str, u64)> {
        FUNCTIONS
            .iter()
            .zip(&self.store.data().hostcalls)
            .filter(|(_, n)| **n > 0)
            .map(|(f, n)| (*f, *n))
            .collect()
    }

    /// Starts (or stops) recording every hostcall with the fuel used when the guest made it
    /// (`WASM_HOST_FUEL=1` only): the differences are the guest's instructions between its
    /// hostcalls, which splits a callback into its steps without touching the module.
    pub fn trace_hostcalls(&mut self, on: bool) {
        self.store.data_mut().hostcall_trace = on.then(Vec::new);
    }

    /// The hostcalls recorded since the trace started or was last taken: (name, fuel used at
    /// the call, as [`Vm::fuel_used`] counts it).
    pub fn take_hostcall_trace(&mut self) -> Vec<(&'static str, u64)> {
        let Some(trace) = self.store.data_mut().hostcall_trace.as_mut() else {
            return Vec::new();
        };
        std::mem::take(trace)
            .into_iter()
            .filter_map(|(slot, fuel)| Some((*FUNCTIONS.get(slot)?, fuel)))
            .collect()
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
        let st = self.store.data();
        if st.streams.len() >= st.opts.limits.max_streams {
            return Err(HostError::LimitReached("open streams per VM"));
        }
        // Ids wrap in a long-lived VM; skip the root context and streams still open.
        let mut id = self.next_context_id;
        while id <= ROOT_CONTEXT_ID || st.streams.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_context_id = id.wrapping_add(1);
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
        let actions = &mut self.dir_mut(id, dir)?.actions;
        // A long stream delivers one callback per chunk; the first ones tell the story.
        if actions.len() < MAX_RECORDED_ACTIONS {
            actions.push(a);
        }
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
        let limit = self.store.data().opts.limits.max_buffered_body;
        let d = self.dir_mut(id, dir)?;
        if d.stop_all {
            if d.held_bytes.saturating_add(chunk.len()) > limit {
                self.buffer_overflow(id, dir)?;
                return self.record(id, dir, Action::NotDelivered);
            }
            d.held_bytes += chunk.len();
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
        let limit = self.store.data().opts.limits.max_buffered_body;
        let d = self.dir_mut(id, dir)?;
        if !d.buffering {
            d.buffer.clear();
        }
        if d.buffer.len().saturating_add(chunk.len()) > limit {
            self.buffer_overflow(id, dir)?;
            return Ok(Action::NotDelivered);
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

    /// Envoy's answer when a buffering filter's data exceeds the buffer limit: 413 for a
    /// request, 500 for a response, and the filter sees nothing more of the stream.
    fn buffer_overflow(&mut self, id: StreamId, dir: Dir) -> Result<(), HostError> {
        let (status, body, details) = match dir {
            Dir::Request => (413, "Payload Too Large", "request_payload_too_large"),
            Dir::Response => (500, "Internal Server Error", "response_payload_too_large"),
        };
        let s = self
            .store
            .data_mut()
            .streams
            .get_mut(&id.0)
            .ok_or(HostError::UnknownStream(id))?;
        s.req.buffer = Vec::new();
        s.resp.buffer = Vec::new();
        s.req.held.clear();
        s.resp.held.clear();
        s.local_response = Some(LocalResponse {
            status,
            details: details.into(),
            headers: vec![("content-type".into(), "text/plain".into())],
            body: body.as_bytes().to_vec(),
            grpc_status: -1,
        });
        Ok(())
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
            if let Some(callouts) = self.store.data().opts.callouts.clone() {
                for token in new_calls {
                    let Some(call) = self.store.data().pending_calls.get(&token) else {
                        continue;
                    };
                    if let Some(reply) = callouts.dispatch(&call.record) {
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
        while let Some(held) = self.dir_mut(id, dir)?.pop_held() {
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
        self.forget_stream(id);
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

    /// When the next tick or callout timeout is due, on the monotonic clock.
    pub fn next_due_nanos(&self) -> Option<u64> {
        let st = self.store.data();
        let tick = (st.tick_period_ms > 0).then_some(st.next_tick_nanos);
        let timeout = st.pending_calls.values().map(|c| c.deadline_nanos).min();
        match (tick, timeout) {
            (Some(t), Some(d)) => Some(t.min(d)),
            (t, d) => t.or(d),
        }
    }

    /// Fires every tick and callout timeout due by the clock's now, in time order (a tick first
    /// when both are due at once). A late tick is not repeated to catch up: the next one is due
    /// a whole period later.
    pub fn run_due(&mut self) -> Result<(), HostError> {
        self.check_alive()?;
        loop {
            let st = self.store.data();
            let now = st.opts.clock.monotonic_nanos();
            let tick_at = (st.tick_period_ms > 0)
                .then_some(st.next_tick_nanos)
                .filter(|t| *t <= now);
            let timeout = st
                .pending_calls
                .iter()
                .map(|(t, c)| (c.deadline_nanos, *t))
                .filter(|(d, _)| *d <= now)
                .min();
            match (tick_at, timeout) {
                (None, None) => return Ok(()),
                (Some(t), to) if to.is_none_or(|(d, _)| t <= d) => {
                    let period = self.store.data().tick_period_ms as u64 * 1_000_000;
                    let mut next = t + period;
                    if next <= now {
                        next = now + period;
                    }
                    self.store.data_mut().next_tick_nanos = next;
                    self.tick()?;
                }
                (_, Some((_, token))) => {
                    // Envoy reports a timed-out http callout as a response with nothing in it,
                    // a gRPC one as closed with DEADLINE_EXCEEDED.
                    let grpc = self.store.data().pending_calls[&token]
                        .record
                        .grpc
                        .is_some();
                    let reply = grpc.then(grpc::timed_out);
                    self.deliver_http_call_response(token, reply)?;
                    self.pump()?;
                }
                (Some(_), None) => return Ok(()),
            }
        }
    }

    pub fn tick_period(&self) -> Option<Duration> {
        let ms = self.store.data().tick_period_ms;
        (ms > 0).then(|| Duration::from_millis(ms as u64))
    }

    /// Tokens of callouts still waiting for a reply.
    pub fn pending_http_calls(&self) -> Vec<u32> {
        self.store.data().pending_calls.keys().copied().collect()
    }

    /// Answers a pending callout: `proxy_on_http_call_response(context, token, nheaders,
    /// body_size, ntrailers)`, with the reply readable through the HttpCallResponse* types.
    pub fn reply_http_call(&mut self, token: u32, reply: HttpCallReply) -> Result<(), HostError> {
        self.settle_http_call(token, Some(reply))
    }

    /// Reports a pending callout as failed (connection refused, reset, reply too large, the
    /// transport's own timeout): `proxy_on_http_call_response` with no headers, body or trailers,
    /// as Envoy reports a failed call.
    pub fn fail_http_call(&mut self, token: u32) -> Result<(), HostError> {
        self.settle_http_call(token, None)
    }

    fn settle_http_call(
        &mut self,
        token: u32,
        reply: Option<HttpCallReply>,
    ) -> Result<(), HostError> {
        self.check_alive()?;
        if !self.store.data().pending_calls.contains_key(&token) {
            return Err(HostError::UnknownHttpCall(token));
        }
        self.deliver_http_call_response(token, reply)?;
        self.pump()
    }

    /// Callouts still waiting for a reply that were made from this stream's context.
    pub fn pending_http_calls_of(&self, id: StreamId) -> usize {
        self.store
            .data()
            .pending_calls
            .values()
            .filter(|c| c.record.context_id == id.0)
            .count()
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
        if call.record.grpc.is_some() {
            let (export, arg) = match grpc::delivery(reply.as_ref()) {
                grpc::Delivery::Receive(size) => ("proxy_on_grpc_receive", size as i32),
                grpc::Delivery::Close(status) => ("proxy_on_grpc_close", status as i32),
            };
            self.store.data_mut().call_response = reply;
            let r = self.call(export, &[ctx as i32, token as i32, arg], ctx);
            self.store.data_mut().call_response = None;
            return r.map(|_| ());
        }
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

    /// The most recent names passed to `proxy_call_foreign_function`.
    pub fn foreign_calls(&self) -> Vec<String> {
        self.store.data().foreign_calls.iter().cloned().collect()
    }

    /// Sets a property for one stream only (at most [`MAX_STREAM_PROPERTIES`]; more are ignored).
    pub fn set_stream_property(
        &mut self,
        id: StreamId,
        path: &[&str],
        value: impl Into<Vec<u8>>,
    ) -> Result<(), HostError> {
        let s = self
            .store
            .data_mut()
            .streams
            .get_mut(&id.0)
            .ok_or(HostError::UnknownStream(id))?;
        let path: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        let value = value.into();
        if let Some(slot) = s.properties.iter_mut().find(|(p, _)| *p == path) {
            slot.1 = value;
        } else if s.properties.len() < MAX_STREAM_PROPERTIES {
            s.properties.push((path, value));
        }
        Ok(())
    }

    /// HTTP stream contexts created and not yet done.
    pub fn open_streams(&self) -> usize {
        self.store.data().streams.len()
    }

    /// Takes the body bytes forwarded so far in one direction (what the next hop gets), so an
    /// embedder streaming a long body holds only what it has not passed on yet.
    pub fn take_forwarded_body(
        &mut self,
        id: StreamId,
        response: bool,
    ) -> Result<Vec<u8>, HostError> {
        let dir = if response {
            Dir::Response
        } else {
            Dir::Request
        };
        Ok(std::mem::take(&mut self.dir_mut(id, dir)?.forwarded_body))
    }

    /// Ends a stream the way a reset downstream does in Envoy: `on_done` and `on_delete`
    /// without the access log, pending callouts cancelled.
    pub fn cancel_stream(&mut self, id: StreamId) -> Result<(), HostError> {
        self.stream(id)?;
        if self.check_alive().is_ok() {
            let r = self
                .call("proxy_on_done", &[id.0 as i32], id.0)
                .and_then(|_| self.call("proxy_on_delete", &[id.0 as i32], id.0));
            self.forget_stream(id);
            r?;
            return self.pump();
        }
        self.forget_stream(id);
        Ok(())
    }

    fn forget_stream(&mut self, id: StreamId) {
        let st = self.store.data_mut();
        st.streams.remove(&id.0);
        st.pending_calls.retain(|_, c| c.record.context_id != id.0);
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
