//! Where a routed request's fixed cost goes in the model-router filter, in numbers machine load
//! cannot blur: the guest's wasm instructions (wasmtime fuel) per callback, the hostcalls it makes
//! by name, and one request printed as the instructions between its hostcalls.
//!
//! `WASM_HOST_FUEL=1 target/debug/examples/request_cost --config PLUGIN.json --body BODY.json
//!  [--wasm A.wasm[,B.wasm]] [--log-level info|warn]`
//!
//! `PLUGIN.json` is the model-router's plugin configuration (the `configuration` value of the
//! wasm filter `llmkube-gen` generates; `bench/outside.py` writes the bodies). The request carries
//! the headers Envoy's HTTP connection manager hands a filter (with `x-request-id`); the body
//! arrives in one end-of-stream callback as Envoy hands over a small buffered body, or, with
//! `--pieces N`, in N callbacks and an empty end-of-stream one. The log level is what
//! `proxy_get_log_level` reports: the bench's Envoy runs at `warn` (no audit line), a gateway's
//! default is `info`. With several modules each is run in turn.
//!
//! `--with budgets` or `--with pick` adds a budget step (a router and a team budget on the local
//! ledger) or endpoint picking (four pods, prefix affinity) to the route the body takes: what
//! that step costs per request, by callback and hostcall.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use wasm_host::{Host, LogLevel, VmOptions};

const WARM: usize = 5;
/// Requests measured per module (`REQUEST_COST_ROUNDS`, e.g. many under `perf record` with
/// `WASM_HOST_PERFMAP=1` and a module built with its name section kept).
fn measured() -> usize {
    std::env::var("REQUEST_COST_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20)
}
const PHASES: [&str; 5] = [
    "request headers",
    "request body",
    "response headers",
    "response body",
    "log + done",
];

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The guest's instructions so far (0 without `WASM_HOST_FUEL=1`, e.g. under `perf`, where
/// metering would distort the profile).
fn fuel(h: &Host) -> u64 {
    h.fuel_used().unwrap_or(0)
}

/// One request and its response; the fuel count at each callback's start and after the last.
fn one(h: &mut Host, body: &[u8], pieces: usize) -> [u64; 6] {
    let len = body.len().to_string();
    let headers = [
        (":authority", "gateway.example"),
        (":path", "/v1/chat/completions"),
        (":method", "POST"),
        (":scheme", "http"),
        ("user-agent", "wrk"),
        ("content-type", "application/json"),
        ("content-length", len.as_str()),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "0f6c4b8e-3f3c-4d8e-9a57-2b1f5d0c9e11"),
    ];
    let mut marks = [0u64; 6];
    marks[0] = fuel(h);
    let id = h.new_http_stream().unwrap();
    h.request_headers(id, &headers, false).unwrap();
    marks[1] = fuel(h);
    if pieces > 1 {
        for chunk in body.chunks(body.len().div_ceil(pieces)) {
            h.request_body(id, chunk, false).unwrap();
        }
        h.request_body(id, &[], true).unwrap();
    } else {
        h.request_body(id, body, true).unwrap();
    }
    let out = h.request_outcome(id).unwrap();
    assert!(out.local_response.is_none(), "{:?}", out.local_response);
    marks[2] = fuel(h);
    let resp = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":200,"completion_tokens":16,"total_tokens":216}}"#;
    let rlen = resp.len().to_string();
    h.response_headers(
        id,
        &[
            (":status", "200"),
            ("content-type", "application/json"),
            ("content-length", rlen.as_str()),
            ("x-envoy-upstream-service-time", "1"),
        ],
        false,
    )
    .unwrap();
    marks[3] = fuel(h);
    h.response_body(id, resp, true).unwrap();
    marks[4] = fuel(h);
    h.log_and_done(id).unwrap();
    marks[5] = fuel(h);
    h.advance_clock(Duration::from_millis(10)).unwrap();
    marks
}

/// The same router with a budget or picking step on the path of the bench's request
/// (`--with budgets|pick`): what that step adds per request.
fn with_step(config: &[u8], step: &str) -> Vec<u8> {
    let mut c: Value = serde_json::from_slice(config).expect("PLUGIN.json is JSON");
    match step {
        // As `bash bench/budgets` and `budget_cost`: a router budget and a team budget, caps
        // no request reaches, on the worker's local ledger.
        "budgets" => {
            c["budgets"] = json!({"budgets": [
                {"name": "all", "scope": "router", "max_tokens": 1_000_000_000_000u64, "window_s": 3600},
                {"name": "teams", "scope": "team", "max_tokens": 1_000_000_000_000u64, "window_s": 3600}
            ]});
        }
        // Four pods with prefix affinity on the backend the bench's model routes to.
        "pick" => {
            let backends = c["backends"].as_array_mut().expect("backends");
            let be = backends
                .iter_mut()
                .find(|b| b["name"] == "llama-3-70b")
                .expect("the bench route's backend, llama-3-70b");
            be["pick"] = json!({
                "endpoints": ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"],
                "prefix_affinity": {"block_bytes": 256}
            });
        }
        other => panic!("--with {other}: budgets or pick"),
    }
    serde_json::to_vec(&c).unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let config = std::fs::read(arg(&args, "--config").expect("--config PLUGIN.json")).unwrap();
    let config = match arg(&args, "--with").as_deref() {
        None => config,
        Some(step) => with_step(&config, step),
    };
    let body = std::fs::read(arg(&args, "--body").expect("--body BODY.json")).unwrap();
    let pieces: usize = arg(&args, "--pieces").map_or(1, |p| p.parse().unwrap());
    let level = match arg(&args, "--log-level").as_deref() {
        Some("info") => LogLevel::Info,
        _ => LogLevel::Warn,
    };
    let wasms: Vec<std::path::PathBuf> = match arg(&args, "--wasm") {
        Some(list) => list.split(',').map(Into::into).collect(),
        None => vec![e2e::wasm::build_filter(
            "llmkube-model-router",
            "llmkube_model_router",
        )],
    };
    for wasm in &wasms {
        let size = std::fs::metadata(wasm).map(|m| m.len()).unwrap_or(0);
        let opts = VmOptions {
            root_id: "model-router".into(),
            log_level: level,
            ..Default::default()
        }
        .with_plugin_config(config.clone())
        .allow_stop_iteration(true);
        let mut h = Host::from_file(wasm, opts).expect("module loads");
        assert!(h.configure_ok(), "{:?}", h.logs());
        for _ in 0..WARM {
            one(&mut h, &body, pieces);
        }
        let calls0: BTreeMap<_, _> = h.hostcalls().into_iter().collect();
        let mut per_phase = [0u64; 5];
        for _ in 0..measured() {
            let m = one(&mut h, &body, pieces);
            for (i, p) in per_phase.iter_mut().enumerate() {
                *p += m[i + 1] - m[i];
            }
        }
        let total: u64 = per_phase.iter().sum::<u64>() / measured() as u64;
        println!(
            "== {} ({size} bytes): {} body bytes, {total} instructions per request",
            wasm.display(),
            body.len()
        );
        for (i, phase) in PHASES.iter().enumerate() {
            println!("    {phase:<17} {:>10}", per_phase[i] / measured() as u64);
        }
        let mut calls = 0.0;
        for (name, n) in h.hostcalls() {
            let d = (n - calls0.get(name).copied().unwrap_or(0)) as f64 / measured() as f64;
            if d > 0.0 {
                calls += d;
                println!("    hostcall {name:<37} {d:>5.2}");
            }
        }
        println!("    hostcalls per request                  {calls:>5.2}");
        // One more request, as the instructions before each hostcall (callback starts marked).
        // A module built with `--features cost-marks` logs `cost-mark <step>` at the end of each
        // step: its `proxy_log` calls are named by those lines, in order.
        h.clear_logs();
        h.trace_hostcalls(true);
        let start = fuel(&h);
        let marks = one(&mut h, &body, pieces);
        let mut steps = h
            .logs()
            .into_iter()
            .filter_map(|(_, l)| l.strip_prefix("cost-mark ").map(str::to_string))
            .collect::<Vec<_>>()
            .into_iter();
        let mut events: Vec<(u64, String)> = h
            .take_hostcall_trace()
            .into_iter()
            .map(|(n, f)| {
                let step = (n == "proxy_log").then(|| steps.next()).flatten();
                let what = match step {
                    Some(step) => format!("[{step}]"),
                    None => n.trim_start_matches("proxy_").to_string(),
                };
                (f, what)
            })
            .collect();
        h.trace_hostcalls(false);
        for (i, m) in marks.iter().enumerate() {
            events.push((*m, format!("-- {}", PHASES.get(i).unwrap_or(&"end"))));
        }
        events.sort_by_key(|(f, what)| (*f, !what.starts_with("--")));
        let mut last = start;
        for (f, what) in events {
            let d = f - last;
            last = f;
            if what.starts_with("--") {
                if d > 0 {
                    println!("      {d:>8}  (end of callback)");
                }
                println!("    {what}");
            } else {
                println!("      {d:>8}  {what}");
            }
        }
    }
}
