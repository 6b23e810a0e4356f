//! What local budgets cost the model-router filter per request, in numbers machine load cannot
//! blur: the guest's wasm instructions (wasmtime fuel) per callback and the hostcalls it makes,
//! by name, for the routing filter alone and with the budgets of `bash bench/budgets` (a router
//! budget and a team budget: two ledgers in shared data), at 1 KiB and 256 KiB, as JSON and as
//! a stream whose usage the gateway must ask for (the body edit).
//!
//! `WASM_HOST_FUEL=1 cargo run -p wasm-host --example budget_cost [-- --wasm A.wasm[,B.wasm]]`
//!
//! `BUDGET_COST_TRACE=1` also prints one budgeted request as the instructions between its
//! hostcalls (where in a callback the budget step's work goes, e.g. per ledger compare-and-swap);
//! `BUDGET_COST_TRACE=all` prints the routing filter's request alone the same way before it.
//!
//! With several modules (e.g. a copy of the build before a change, then the current one) each is
//! run in turn and printed side by side. Bodies are handed over as Envoy does when it buffers:
//! 1 KiB in one end-of-stream callback, 256 KiB whole without end of stream, then an empty
//! end-of-stream callback. The clock moves 10 ms per request. The first requests (metric
//! definitions, the team's slot) are warm-up; the numbers are the mean of the next ones, which
//! are all alike (the count is deterministic).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use wasm_host::{Host, VmOptions};

const WARM: usize = 5;

/// Requests measured per case (`BUDGET_COST_ROUNDS`, e.g. many under `perf record`).
fn measured() -> usize {
    std::env::var("BUDGET_COST_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20)
}

fn config(budgets: bool) -> Value {
    let mut c = json!({
        "router": "bench/r", "max_body_bytes": 8388608, "default_route": "a",
        "backends": [{"name": "a"}],
        "rules": [{"name": "q", "models": ["qwen3-*"], "backends": ["a"]}]
    });
    if budgets {
        c["budgets"] = json!({"budgets": [
            {"name": "all", "scope": "router", "max_tokens": 1_000_000_000_000u64, "window_s": 3600},
            {"name": "teams", "scope": "team", "max_tokens": 1_000_000_000_000u64, "window_s": 3600}
        ]});
        // `BUDGET_COST_PER_REQUEST=1`: the same budgets reserved and settled per request
        // instead of on worker leases (the default).
        if std::env::var_os("BUDGET_COST_PER_REQUEST").is_some() {
            c["budgets"]["per_request"] = json!(true);
        }
    }
    c
}

const PHASES: [&str; 5] = [
    "request headers",
    "request body",
    "response headers",
    "response body",
    "log + done",
];

#[derive(Default)]
struct Tally {
    fuel: [u64; 5],
    calls: BTreeMap<&'static str, u64>,
}

fn fuel(h: &Host) -> u64 {
    h.fuel_used()
        .expect("run with WASM_HOST_FUEL=1 (the engine must meter fuel)")
}

/// One request and its response through `h`, adding what each phase cost to `t`.
fn one(h: &mut Host, req: &[u8], stream: bool, t: Option<&mut Tally>) {
    one_marked(h, req, stream, t, &mut Vec::new());
}

/// [`one`], also giving the fuel count at each callback's start and after the last one.
fn one_marked(
    h: &mut Host,
    req: &[u8],
    stream: bool,
    t: Option<&mut Tally>,
    at_marks: &mut Vec<u64>,
) {
    let len = req.len().to_string();
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("content-length", len.as_str()),
        ("content-type", "application/json"),
        ("x-llmkube-team", "bench"),
    ];
    let calls0 = h.hostcalls();
    let mut marks = [0u64; 6];
    marks[0] = fuel(h);
    let id = h.new_http_stream().unwrap();
    h.request_headers(id, &headers, false).unwrap();
    marks[1] = fuel(h);
    if req.len() > 64 * 1024 {
        h.request_body(id, req, false).unwrap();
        h.request_body(id, &[], true).unwrap();
    } else {
        h.request_body(id, req, true).unwrap();
    }
    let out = h.request_outcome(id).unwrap();
    assert!(out.local_response.is_none(), "{:?}", out.local_response);
    marks[2] = fuel(h);
    let (ctype, resp): (&str, Vec<u8>) = if stream {
        let chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\n";
        let usage =
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":200,\"completion_tokens\":16}}\n\n";
        (
            "text/event-stream",
            format!("{}{usage}data: [DONE]\n\n", chunk.repeat(16)).into_bytes(),
        )
    } else {
        (
            "application/json",
            br#"{"id":"x","choices":[{"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":200,"completion_tokens":16}}"#.to_vec(),
        )
    };
    h.response_headers(id, &[(":status", "200"), ("content-type", ctype)], false)
        .unwrap();
    marks[3] = fuel(h);
    h.response_body(id, &resp, true).unwrap();
    marks[4] = fuel(h);
    h.log_and_done(id).unwrap();
    marks[5] = fuel(h);
    at_marks.extend_from_slice(&marks);
    h.advance_clock(Duration::from_millis(10)).unwrap();
    if let Some(t) = t {
        for (i, f) in t.fuel.iter_mut().enumerate() {
            *f += marks[i + 1] - marks[i];
        }
        let before: BTreeMap<_, _> = calls0.into_iter().collect();
        for (name, n) in h.hostcalls() {
            let d = n - before.get(name).copied().unwrap_or(0);
            if d > 0 {
                *t.calls.entry(name).or_default() += d;
            }
        }
    }
}

/// One more request on `h`, printed as the guest's instructions between its hostcalls: the
/// work before each call is shown next to the call (`BUDGET_COST_TRACE=1`). Callback starts are
/// marked; what a callback does after its last hostcall is shown as its `end`.
fn trace(h: &mut Host, req: &[u8], stream: bool) {
    h.trace_hostcalls(true);
    let mut t = Tally::default();
    let start = fuel(h);
    let mut marks = Vec::new();
    one_marked(h, req, stream, Some(&mut t), &mut marks);
    let mut events: Vec<(u64, String)> = h
        .take_hostcall_trace()
        .into_iter()
        .map(|(n, f)| (f, n.trim_start_matches("proxy_").to_string()))
        .collect();
    h.trace_hostcalls(false);
    for (i, m) in marks.iter().enumerate() {
        let what = match PHASES.get(i) {
            Some(p) => format!("-- {p}"),
            None => "-- end".to_string(),
        };
        events.push((*m, what));
    }
    // A phase mark and the first hostcall of its callback can share a fuel count: marks first.
    events.sort_by_key(|(f, what)| (*f, !what.starts_with("--")));
    let mut last = start;
    for (f, what) in events {
        let d = f - last;
        last = f;
        if what.starts_with("--") {
            if d > 0 {
                println!("      {:>8}  (end of callback)", d);
            }
            println!("    {what}");
        } else {
            println!("      {:>8}  {what}", d);
        }
    }
}

fn measure(wasm: &std::path::Path, budgets: bool, req: &[u8], stream: bool) -> Tally {
    let opts = VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&config(budgets)).unwrap())
    .allow_stop_iteration(true);
    let mut h = Host::from_file(wasm, opts).expect("module loads");
    assert!(h.configure_ok(), "{:?}", h.logs());
    for _ in 0..WARM {
        one(&mut h, req, stream, None);
    }
    let mut t = Tally::default();
    for _ in 0..measured() {
        one(&mut h, req, stream, Some(&mut t));
    }
    // `BUDGET_COST_TRACE=all`: the routing filter alone too (to subtract it phase by phase).
    let tracing = std::env::var("BUDGET_COST_TRACE").ok();
    if tracing.as_deref() == Some("all") || (budgets && tracing.is_some()) {
        println!(
            "  trace ({}):",
            if budgets {
                "local budgets"
            } else {
                "routing alone"
            }
        );
        trace(&mut h, req, stream);
    }
    t
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let wasms: Vec<std::path::PathBuf> = match args.iter().position(|a| a == "--wasm") {
        Some(i) => args[i + 1].split(',').map(Into::into).collect(),
        None => vec![e2e::wasm::build_filter(
            "llmkube-model-router",
            "llmkube_model_router",
        )],
    };
    let cases = [
        ("1 KiB json", 1024usize, false),
        ("256 KiB json", 256 * 1024, false),
        ("1 KiB stream", 1024, true),
        ("256 KiB stream", 256 * 1024, true),
    ];
    let mut report = Vec::new();
    // `BUDGET_COST_CASE=json` runs only the cases whose name contains it.
    let only = std::env::var("BUDGET_COST_CASE").unwrap_or_default();
    for wasm in &wasms {
        let size = std::fs::metadata(wasm).map(|m| m.len()).unwrap_or(0);
        println!("== {} ({size} bytes)", wasm.display());
        for (name, kib, stream) in cases {
            if !name.contains(only.as_str()) {
                continue;
            }
            let head = if stream {
                r#""stream":true,"max_tokens":16,"#
            } else {
                r#""max_tokens":16,"#
            };
            let req = e2e::bench::chat_body(kib, head);
            let base = measure(wasm, false, &req, stream);
            let with = measure(wasm, true, &req, stream);
            let per = |x: u64| x / measured() as u64;
            let total = |t: &Tally| per(t.fuel.iter().sum());
            println!(
                "{name}: instructions per request routing {} / + local budgets {} (+{}, {:.1} %)",
                total(&base),
                total(&with),
                total(&with) - total(&base),
                100.0 * (total(&with) as f64 - total(&base) as f64) / total(&base) as f64
            );
            for (i, phase) in PHASES.iter().enumerate() {
                println!(
                    "    {phase:<17} {:>10} {:>10} {:>+10}",
                    per(base.fuel[i]),
                    per(with.fuel[i]),
                    per(with.fuel[i]) as i64 - per(base.fuel[i]) as i64
                );
            }
            let names: std::collections::BTreeSet<_> = base
                .calls
                .keys()
                .chain(with.calls.keys())
                .copied()
                .collect();
            let mut calls = serde_json::Map::new();
            for n in names {
                let (b, w) = (
                    base.calls.get(n).copied().unwrap_or(0) as f64 / measured() as f64,
                    with.calls.get(n).copied().unwrap_or(0) as f64 / measured() as f64,
                );
                if b != w {
                    println!("    hostcall {n:<37} {b:>5.1} {w:>5.1} {:>+5.1}", w - b);
                }
                calls.insert(n.to_string(), json!([b, w]));
            }
            let sum = |t: &Tally| t.calls.values().sum::<u64>() as f64 / measured() as f64;
            println!(
                "    hostcalls per request            {:>5.1} {:>5.1} {:>+5.1}",
                sum(&base),
                sum(&with),
                sum(&with) - sum(&base)
            );
            report.push(json!({"wasm": wasm.display().to_string(), "wasm_bytes": size,
                "case": name, "instructions_routing": total(&base),
                "instructions_local_budgets": total(&with),
                "phases": PHASES.iter().enumerate().map(|(i, p)| json!({"phase": p,
                    "routing": per(base.fuel[i]), "local_budgets": per(with.fuel[i])})).collect::<Vec<_>>(),
                "hostcalls_per_request": calls}));
        }
    }
    if let Ok(path) = std::env::var("BUDGET_COST_JSON") {
        let out = json!({"what": "wasm instructions (wasmtime fuel) and hostcalls per request of the model-router filter, routing alone vs + local budgets (router + team ledger)", "results": report});
        std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
        println!("wrote {path}");
    }
}
