//! Prices host interactions: each request runs `<op>` `<n>` times in `on_http_request_headers`
//! (plugin configuration `"<op>:<n>"`), then continues. The cost of one `<op>` is the added Envoy
//! CPU per request divided by `n`; bench/hostcalls.py runs the listeners side by side.
//!
//! Errors are ignored on purpose: only the price of the call is of interest here.

use proxy_wasm::hostcalls as h;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { op: Op::None, n: 0, metric: 0, mode: Mode::Pass }) });
}}

#[derive(Clone, Copy)]
enum Op {
    None,
    /// `get_current_time_nanoseconds`: a hostcall that returns a number (no allocation).
    Time,
    /// One request header by name: a hostcall plus one `proxy_on_memory_allocate` entry.
    Header,
    /// The whole request header map, serialised.
    Pairs,
    /// A property path (`request.path`), evaluated by Envoy's attribute code.
    Property,
    /// Replace a request header.
    Set,
    /// Remove a request header that is absent.
    Remove,
    /// Add a request header value (`proxy_add_header_map_value`; the header grows each time).
    Add,
    /// Counter increment.
    Metric,
    /// Log at debug (below Envoy's level: dropped by the host).
    Log,
}

/// What the request callbacks do besides the loop (`"<op>:<n>:<mode>"`): `pass` continues at
/// once; `pause` holds the headers until the end of the body, as a routing filter must; `route`
/// pauses too and then sets `x-llmkube-backend: cloud-gpt` from the body phase (Envoy re-selects
/// the route), as the model/rule filter does; `mark` sets a header no route looks at.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Pass,
    Pause,
    Route,
    /// Like `route`, but the header set from the body phase is one no route looks at.
    Mark,
    /// Like `pause`, and logs (warn) when each body piece arrived, in µs after the headers.
    Trace,
}

struct Root {
    op: Op,
    n: u32,
    metric: u32,
    mode: Mode,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _: usize) -> bool {
        let cfg = h::get_buffer(
            proxy_wasm::types::BufferType::PluginConfiguration,
            0,
            usize::MAX,
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        let cfg = String::from_utf8_lossy(&cfg);
        let mut parts = cfg.split(':');
        let (op, n) = (parts.next().unwrap_or("none"), parts.next().unwrap_or("0"));
        self.mode = match parts.next() {
            Some("pause") => Mode::Pause,
            Some("route") => Mode::Route,
            Some("mark") => Mode::Mark,
            Some("trace") => Mode::Trace,
            _ => Mode::Pass,
        };
        self.op = match op {
            "time" => Op::Time,
            "header" => Op::Header,
            "pairs" => Op::Pairs,
            "property" => Op::Property,
            "set" => Op::Set,
            "remove" => Op::Remove,
            "add" => Op::Add,
            "metric" => Op::Metric,
            "log" => Op::Log,
            _ => Op::None,
        };
        self.n = n.trim().parse().unwrap_or(0);
        self.metric = h::define_metric(MetricType::Counter, "hostcall_cost").unwrap_or(0);
        true
    }

    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Req {
            op: self.op,
            n: self.n,
            metric: self.metric,
            mode: self.mode,
            t0: 0,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Req {
    op: Op,
    n: u32,
    metric: u32,
    mode: Mode,
    t0: u128,
}

fn now_us() -> u128 {
    h::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_micros())
}

impl Context for Req {}

impl HttpContext for Req {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let q = MapType::HttpRequestHeaders;
        if self.mode == Mode::Trace {
            self.t0 = now_us();
        }
        for _ in 0..self.n {
            let _ = match self.op {
                Op::None => Ok(()),
                Op::Time => h::get_current_time().map(drop),
                Op::Header => h::get_map_value(q, ":path").map(drop),
                Op::Pairs => h::get_map(q).map(drop),
                Op::Property => h::get_property(vec!["request", "path"]).map(drop),
                Op::Set => h::set_map_value(q, "x-cost", Some("1")),
                Op::Remove => h::set_map_value(q, "x-cost-absent", None),
                Op::Add => h::add_map_value(q, "x-cost-add", "1"),
                Op::Metric => h::increment_metric(self.metric, 1),
                Op::Log => h::log(LogLevel::Debug, "cost"),
            };
        }
        if self.mode == Mode::Pass {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Counts body callbacks (Envoy stat `wasmcustom.hostcall_cost`): how many pieces a body
        // arrives in decides what per-piece work would cost.
        let _ = h::increment_metric(self.metric, 1);
        if self.mode == Mode::Trace {
            let msg = format!("body +{} µs size={body_size} eos={end_of_stream}", now_us() - self.t0);
            let _ = h::log(LogLevel::Warn, &msg);
        }
        if self.mode == Mode::Pass {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let q = MapType::HttpRequestHeaders;
        match self.mode {
            Mode::Route => drop(h::set_map_value(q, "x-llmkube-backend", Some("cloud-gpt"))),
            Mode::Mark => drop(h::set_map_value(q, "x-cost-mark", Some("1"))),
            _ => {}
        }
        Action::Continue
    }
}
