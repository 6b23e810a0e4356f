//! Time the compiled model-router filter spends per request on wasmtime, by body size: a quick
//! in-process estimate of the filter's own µs/KiB (no network, no Envoy). The benchmark that
//! counts is `bench/run` (Envoy's V8, side by side with native filters); this one isolates the
//! wasm code so a change to the scanner can be judged in seconds.
//!
//! `cargo run -p wasm-host --example filter_cost` (dependencies, wasmtime included, are optimised
//! in the dev profile; the release profile would LTO all of wasmtime for nothing). The harness
//! itself is unoptimised in the dev profile and copies bodies around, so read the µs/KiB column as
//! an upper bound and compare builds side by side; for the scanner on V8 use
//! `filters/core/examples/scan_speed_v8.mjs`.

use std::time::Instant;
use wasm_host::{Host, VmOptions};

fn body(kib: usize) -> Vec<u8> {
    let sentence = "The quick brown fox jumps over the lazy dog, again and again; ";
    let mut content = String::new();
    while content.len() < kib * 1024 {
        content.push_str(sentence);
        content.push_str("\\n");
    }
    format!(
        r#"{{"messages":[{{"role":"system","content":"You are helpful."}},{{"role":"user","content":"{content}"}}],"temperature":0.2,"model":"qwen3-8b"}}"#
    )
    .into_bytes()
}

fn main() {
    // Overrides for profiling (see WASM_HOST_PERFMAP in the host): a module built with its name
    // section kept, the bench's plugin config, and a fixed number of rounds over one body file.
    let wasm = match std::env::var("FILTER_COST_WASM") {
        Ok(p) => p.into(),
        Err(_) => e2e::wasm::build_filter("llmkube-model-router", "llmkube_model_router"),
    };
    let config = match std::env::var("FILTER_COST_CONFIG") {
        Ok(p) => std::fs::read(p).expect("config file"),
        Err(_) => serde_json::to_vec(&serde_json::json!({
            "router": "bench/r", "max_body_bytes": 8388608, "default_route": "a",
            "backends": [{"name": "a"}, {"name": "b"}],
            "rules": [{"name": "q", "models": ["qwen3-*"], "backends": ["b", "a"]}]
        }))
        .unwrap(),
    };
    if let Ok(p) = std::env::var("FILTER_COST_BODY") {
        let body = std::fs::read(p).expect("body file");
        let rounds: usize = std::env::var("FILTER_COST_ROUNDS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(100_000);
        let opts = VmOptions::default()
            .with_plugin_config(config)
            .allow_stop_iteration(true);
        let mut host = Host::from_file(&wasm, opts).expect("load");
        let len = body.len().to_string();
        let headers = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-length", len.as_str()),
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-bench"),
        ];
        let t = Instant::now();
        for _ in 0..rounds {
            let o = host.run_request(&headers, &body, 0).unwrap();
            assert!(o.local_response.is_none());
            let resp = [(":status", "200"), ("content-type", "application/json")];
            host.run_response(o.stream, &resp, b"{}", 0).unwrap();
            host.log_and_done(o.stream).unwrap();
        }
        let per = t.elapsed().as_secs_f64() * 1e6 / rounds as f64;
        println!(
            "{} bytes: {per:.2} µs per request (harness included)",
            body.len()
        );
        return;
    }
    let opts = VmOptions::default()
        .with_plugin_config(config)
        .allow_stop_iteration(true);
    let mut host = Host::from_file(&wasm, opts).expect("load");
    let mut base = None;
    println!("{:>8} {:>12} {:>12}", "KiB", "µs/request", "µs/KiB");
    for kib in [0usize, 1, 16, 256, 2048] {
        let b = body(kib);
        let len = b.len().to_string();
        let headers = [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-length", len.as_str()),
        ];
        // Each stream is finished (on_log/on_done/on_delete) so the host does not keep every
        // request's buffers around: with them kept, a run grew to hundreds of MiB and crawled.
        let iters = (32 * 1024 * 1024 / b.len().max(1024)).clamp(10, 2_000);
        for _ in 0..5 {
            let o = host.run_request(&headers, &b, 0).unwrap();
            host.log_and_done(o.stream).unwrap();
        }
        let t = Instant::now();
        for _ in 0..iters {
            let o = host.run_request(&headers, &b, 0).unwrap();
            assert!(o.local_response.is_none());
            host.log_and_done(o.stream).unwrap();
        }
        let per = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let base_us = *base.get_or_insert(per);
        let per_kib = if kib == 0 {
            0.0
        } else {
            (per - base_us) / (b.len() as f64 / 1024.0)
        };
        println!("{:>8} {:>12.2} {:>12.3}", b.len() / 1024, per, per_kib);
    }
}
