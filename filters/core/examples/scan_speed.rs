//! Throughput of the body scanner on realistic chat bodies (native; the wasm figure comes from
//! the Envoy benchmark in bench/). `cargo run --release -p llmkube-router-core --example scan_speed`
use router_core::scan::Scanner;
use std::time::Instant;

fn body(kib: usize) -> Vec<u8> {
    let sentence = "The quick brown fox jumps over the lazy dog; \\\"quoted\\\" text, numbers 12345 and unicode é. ";
    let mut content = String::new();
    while content.len() < kib * 1024 {
        content.push_str(sentence);
    }
    format!(
        r#"{{"messages":[{{"role":"system","content":"You are helpful."}},{{"role":"user","content":"{content}"}}],"temperature":0.2,"stream":false,"model":"qwen3-8b"}}"#
    )
    .into_bytes()
}

fn main() {
    let mut s = Scanner::new();
    for kib in [1usize, 16, 256, 2048] {
        let b = body(kib);
        let iters = (64 * 1024 * 1024 / b.len()).max(10);
        let t = Instant::now();
        for _ in 0..iters {
            let f = s.scan(std::hint::black_box(&b)).expect("valid");
            std::hint::black_box(f.stream);
        }
        let per = t.elapsed().as_secs_f64() / iters as f64;
        println!(
            "{kib:>5} KiB: {:>9.2} µs/scan  {:>6.3} µs/KiB  {:>6.2} GB/s",
            per * 1e6,
            per * 1e6 / (b.len() as f64 / 1024.0),
            b.len() as f64 / per / 1e9
        );
    }
}
