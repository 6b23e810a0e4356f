//! A fixture filter for the harness host: every host feature is reachable from its plugin
//! configuration, so host tests can steer it without a second crate per scenario.
//!
//! Configuration is a JSON object; every key is optional:
//! - `pause_headers` (bool): `on_http_request_headers` returns `Pause`.
//! - `buffer_body` (bool): `on_http_request_body` returns `Pause` until end of stream.
//! - `route_from_body` (bool): at end of body, read the whole body, parse `{"model": ..}` and
//!   set request header `x-model` (raw hostcall; status logged as `route_status=N`).
//! - `late_write` (bool): in the body phase, try to set `x-late: 1` with the raw hostcall and log
//!   `late_write_status=N` instead of panicking like the SDK setter would.
//! - `local_response` (`{"status":u32,"body":str,"phase":"headers"|"body"}`).
//! - `cas_key` (str): CAS-increment a decimal counter in shared data per request; header `x-count`.
//! - `naive_key` (str): read-modify-write without CAS (for lost-update demonstrations).
//! - `queue` (str): register the queue at VM start; each request enqueues its `:path`;
//!   `on_queue_ready` dequeues and logs `dequeued=<item>`.
//! - `tick_ms` (u64): tick period; each tick increments shared key `ticks` and logs `tick=N`.
//! - `metric` (str): counter incremented per request; `<metric>_gauge` set to request count;
//!   `<metric>_hist` records the request body size.
//! - `http_call` (str): cluster for a call from request headers; headers pause until the reply,
//!   which is copied into `x-call-status` / `x-call-body` before resuming.
//! - `property` ([str]): header `x-prop` gets that property's value.
//! - `panic_on` ("configure"|"headers"|"body"|"tick"): panic there (a trap under panic=abort).
//! - `time` (bool): header `x-now` with `get_current_time` in nanoseconds.
//! - `stdout` (bool): `println!` from `on_configure` (exercises WASI `fd_write`).
//! - `reset` (bool): reset the stream from request headers (`proxy_close_stream`).
//! - `response_header` (bool): response headers get `x-probe: 1`; trailers/body logged.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType, MetricType};
use serde_json::Value;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

#[link(wasm_import_module = "env")]
extern "C" {
    // Declared again by hand: the SDK's setter panics on any non-Ok status, and the probe must
    // report the status (Envoy answers BadArgument for late header writes).
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
}

fn raw_set_request_header(name: &str, value: &str) -> u32 {
    unsafe {
        proxy_replace_header_map_value(
            MapType::HttpRequestHeaders as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> {
        Box::new(ProbeRoot { cfg: Rc::new(Config::default()), queue_id: None, ticks: 0, metrics: None })
    });
}}

#[derive(Default)]
struct Config {
    raw: Value,
}

impl Config {
    fn flag(&self, key: &str) -> bool {
        self.raw.get(key).and_then(Value::as_bool).unwrap_or(false)
    }
    fn str(&self, key: &str) -> Option<&str> {
        self.raw.get(key).and_then(Value::as_str)
    }
    fn panic_on(&self, phase: &str) {
        if self.str("panic_on") == Some(phase) {
            panic!("probe asked to panic in {phase}");
        }
    }
}

#[derive(Clone, Copy)]
struct Metrics {
    counter: u32,
    gauge: u32,
    hist: u32,
}

struct ProbeRoot {
    cfg: Rc<Config>,
    queue_id: Option<u32>,
    ticks: u64,
    metrics: Option<Metrics>,
}

impl Context for ProbeRoot {}

impl RootContext for ProbeRoot {
    fn on_vm_start(&mut self, size: usize) -> bool {
        let vm_cfg = self.get_vm_configuration().unwrap_or_default();
        proxy_wasm::hostcalls::log(
            LogLevel::Info,
            &format!(
                "vm_start size={size} vm_config={}",
                String::from_utf8_lossy(&vm_cfg)
            ),
        )
        .ok();
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let raw: Value = if bytes.is_empty() {
            Value::Object(Default::default())
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => {
                    log(LogLevel::Error, &format!("bad config: {e}"));
                    return false;
                }
            }
        };
        self.cfg = Rc::new(Config { raw });
        self.cfg.panic_on("configure");
        if self.cfg.flag("stdout") {
            println!("hello from stdout");
            eprintln!("hello from stderr");
        }
        if let Some(q) = self.cfg.str("queue") {
            match hostcalls::register_shared_queue(q) {
                Ok(id) => {
                    self.queue_id = Some(id);
                    log(LogLevel::Info, &format!("queue_registered={id}"));
                }
                Err(s) => log(LogLevel::Error, &format!("queue register failed {s:?}")),
            }
        }
        if let Some(ms) = self.cfg.raw.get("tick_ms").and_then(Value::as_u64) {
            self.set_tick_period(Duration::from_millis(ms));
        }
        if let Some(name) = self.cfg.str("metric") {
            let counter = hostcalls::define_metric(MetricType::Counter, name).unwrap_or(0);
            let gauge =
                hostcalls::define_metric(MetricType::Gauge, &format!("{name}_gauge")).unwrap_or(0);
            let hist = hostcalls::define_metric(MetricType::Histogram, &format!("{name}_hist"))
                .unwrap_or(0);
            self.metrics = Some(Metrics {
                counter,
                gauge,
                hist,
            });
        }
        true
    }

    fn on_tick(&mut self) {
        self.cfg.panic_on("tick");
        self.ticks += 1;
        let now = self
            .get_current_time()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        hostcalls::set_shared_data("ticks", Some(self.ticks.to_string().as_bytes()), None).ok();
        log(LogLevel::Info, &format!("tick={} now={now}", self.ticks));
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(item)) = hostcalls::dequeue_shared_queue(queue_id) {
            log(
                LogLevel::Info,
                &format!("dequeued={}", String::from_utf8_lossy(&item)),
            );
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(ProbeHttp {
            id: context_id,
            cfg: self.cfg.clone(),
            queue_id: self.queue_id,
            metrics: self.metrics,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

fn log(level: LogLevel, msg: &str) {
    hostcalls::log(level, msg).ok();
}

struct ProbeHttp {
    id: u32,
    cfg: Rc<Config>,
    queue_id: Option<u32>,
    metrics: Option<Metrics>,
}

impl ProbeHttp {
    fn local_response(&self, phase: &str) -> bool {
        let Some(lr) = self.cfg.raw.get("local_response") else {
            return false;
        };
        if lr.get("phase").and_then(Value::as_str).unwrap_or("headers") != phase {
            return false;
        }
        let status = lr.get("status").and_then(Value::as_u64).unwrap_or(403) as u32;
        let body = lr.get("body").and_then(Value::as_str).unwrap_or("");
        self.send_http_response(
            status,
            vec![("content-type", "text/plain"), ("x-probe-local", "1")],
            Some(body.as_bytes()),
        );
        true
    }

    fn cas_increment(&self, key: &str) -> u64 {
        loop {
            let (value, cas) = self.get_shared_data(key);
            let n: u64 = value
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            match self.set_shared_data(key, Some((n + 1).to_string().as_bytes()), cas) {
                Ok(()) => return n + 1,
                Err(_) => log(LogLevel::Debug, "cas_retry"),
            }
        }
    }
}

impl Context for ProbeHttp {
    fn on_http_call_response(&mut self, token: u32, _nh: usize, body_size: usize, _nt: usize) {
        let status = self
            .get_http_call_response_header(":status")
            .unwrap_or_default();
        let body = self
            .get_http_call_response_body(0, body_size)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let trailer = self
            .get_http_call_response_trailer("grpc-status")
            .unwrap_or_default();
        log(
            LogLevel::Info,
            &format!("call_response token={token} status={status} body={body} trailer={trailer}"),
        );
        self.set_http_request_header("x-call-status", Some(&status));
        self.set_http_request_header("x-call-body", Some(&body));
        self.resume_http_request();
    }
}

impl HttpContext for ProbeHttp {
    fn on_http_request_headers(&mut self, nheaders: usize, eos: bool) -> Action {
        // llmkube-ext-proc's health watchdog runs this request through every instance; like the
        // routing filter, the probe passes it untouched (no callout, no counting, no log line).
        if self.get_http_request_header(":path").as_deref() == Some("/llmkube-ext-proc/watchdog") {
            return Action::Continue;
        }
        self.cfg.panic_on("headers");
        log(
            LogLevel::Info,
            &format!("request_headers id={} n={nheaders} eos={eos}", self.id),
        );
        if self.local_response("headers") {
            return Action::Pause;
        }
        if let Some(key) = self.cfg.str("cas_key") {
            let n = self.cas_increment(key);
            self.set_http_request_header("x-count", Some(&n.to_string()));
        }
        if let Some(key) = self.cfg.str("naive_key") {
            let (value, _) = self.get_shared_data(key);
            let n: u64 = value
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            self.set_shared_data(key, Some((n + 1).to_string().as_bytes()), None)
                .ok();
        }
        if let Some(q) = self.queue_id {
            let path = self.get_http_request_header(":path").unwrap_or_default();
            if let Err(s) = hostcalls::enqueue_shared_queue(q, Some(path.as_bytes())) {
                log(LogLevel::Error, &format!("enqueue failed {s:?}"));
            }
        }
        if let Some(m) = self.metrics {
            hostcalls::increment_metric(m.counter, 1).ok();
            let total = hostcalls::get_metric(m.counter).unwrap_or(0);
            hostcalls::record_metric(m.gauge, total).ok();
        }
        if let Some(path) = self.cfg.raw.get("property").and_then(Value::as_array) {
            let path: Vec<&str> = path.iter().filter_map(Value::as_str).collect();
            let value = match self.get_property(path) {
                Some(v) => String::from_utf8_lossy(&v).into_owned(),
                None => "<none>".to_string(),
            };
            self.set_http_request_header("x-prop", Some(&value));
        }
        if self.cfg.flag("time") {
            let nanos = self
                .get_current_time()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            self.set_http_request_header("x-now", Some(&nanos.to_string()));
        }
        if let Some(cluster) = self.cfg.str("http_call") {
            let path = self.get_http_request_header(":path").unwrap_or_default();
            match self.dispatch_http_call(
                cluster,
                vec![
                    (":method", "POST"),
                    (":path", "/lookup"),
                    (":authority", cluster),
                    ("x-orig-path", &path),
                ],
                Some(b"lookup-body"),
                vec![],
                Duration::from_millis(1500),
            ) {
                Ok(token) => log(LogLevel::Info, &format!("dispatched token={token}")),
                Err(s) => log(LogLevel::Error, &format!("dispatch failed {s:?}")),
            }
            return Action::Pause;
        }
        if self.cfg.flag("reset") {
            self.reset_http_request();
            return Action::Pause;
        }
        // Decision headers must not be client-controlled: drop any incoming copy.
        self.set_http_request_header("x-model", None);
        if self.cfg.flag("pause_headers") {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, eos: bool) -> Action {
        self.cfg.panic_on("body");
        log(LogLevel::Info, &format!("body_size={body_size} eos={eos}"));
        if self.cfg.flag("late_write") {
            let status = raw_set_request_header("x-late", "1");
            log(LogLevel::Info, &format!("late_write_status={status}"));
        }
        if self.local_response("body") {
            return Action::Pause;
        }
        if !eos && self.cfg.flag("buffer_body") {
            return Action::Pause;
        }
        if eos {
            if let Some(m) = self.metrics {
                hostcalls::record_metric(m.hist, body_size as u64).ok();
            }
        }
        if eos && self.cfg.flag("route_from_body") {
            let body = self.get_http_request_body(0, body_size).unwrap_or_default();
            log(LogLevel::Info, &format!("whole_body_len={}", body.len()));
            let model = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("model").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| "unknown".to_owned());
            let status = raw_set_request_header("x-model", &model);
            log(LogLevel::Info, &format!("route_status={status}"));
            // Prove body rewrites reach the upstream too.
            if self.cfg.flag("rewrite_body") {
                self.set_http_request_body(0, body_size, b"{\"rewritten\":true}");
            }
        }
        Action::Continue
    }

    fn on_http_request_trailers(&mut self, n: usize) -> Action {
        log(LogLevel::Info, &format!("request_trailers n={n}"));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, n: usize, eos: bool) -> Action {
        log(LogLevel::Info, &format!("response_headers n={n} eos={eos}"));
        if self.cfg.flag("response_header") {
            self.set_http_response_header("x-probe", Some("1"));
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, eos: bool) -> Action {
        log(
            LogLevel::Info,
            &format!("response_body_size={body_size} eos={eos}"),
        );
        if self.cfg.flag("response_header") {
            // Response headers already went downstream: Envoy refuses this write.
            let name = "x-late-resp";
            let status = unsafe {
                proxy_replace_header_map_value(
                    MapType::HttpResponseHeaders as u32,
                    name.as_ptr(),
                    name.len(),
                    b"1".as_ptr(),
                    1,
                )
            };
            log(LogLevel::Info, &format!("late_resp_write_status={status}"));
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, n: usize) -> Action {
        log(LogLevel::Info, &format!("response_trailers n={n}"));
        Action::Continue
    }

    fn on_log(&mut self) {
        log(LogLevel::Info, &format!("on_log id={}", self.id));
    }
}
