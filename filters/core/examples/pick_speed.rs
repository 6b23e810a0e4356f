//! Time the picker spends on a 64 KiB chat prompt: block hashing alone, and hashing plus a pick
//! and its release over 8 pods whose tables hold the prompt's prefix.
//!
//! Native: `cargo run --release -p llmkube-router-core --example pick_speed`
//!
//! In V8 (the engine Envoy embeds):
//! ```text
//! cargo build --release --target wasm32-wasip1 -p llmkube-router-core --example pick_speed
//! node --no-warnings --no-liftoff filters/core/examples/wasi_run.mjs target/wasm32-wasip1/release/examples/pick_speed.wasm
//! ```
//! The body is scanned once up front (the filter scans it anyway); only the picking is timed.
mod support;

use router_core::pick::{
    hash_prompt, prompt_parts, Choice, Config, Outcome, Picker, Prompt, Request,
};
use router_core::scan::Scanner;

fn body(kib: usize, salt: usize) -> Vec<u8> {
    let sentence = "The quick brown fox jumps over the lazy dog; numbers 12345 and text. ";
    let mut content = format!("{salt} ");
    while content.len() < kib * 1024 {
        content.push_str(sentence);
    }
    format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"You are helpful."}},{{"role":"user","content":"{content}"}}]}}"#
    )
    .into_bytes()
}

fn main() {
    let b = body(64, 0);
    let f = Scanner::new().scan(&b).expect("valid body");
    let parts = prompt_parts(&b, &f.spans);
    let mut prompt = Prompt::default();
    let hash = support::best(2000, || hash_prompt(&parts, 1024, 0, &mut prompt));
    let pods: Vec<String> = (0..8).map(|i| format!("10.0.0.{i}:8000")).collect();
    let mut picker = Picker::new(Config::default(), &pods);
    // Warm every table with other prompts, and one pod with this one.
    for k in 0..2000 {
        let other = body(16, k + 1);
        let g = Scanner::new().scan(&other).expect("valid body");
        let mut p = Prompt::default();
        hash_prompt(&prompt_parts(&other, &g.spans), 1024, 0, &mut p);
        let r = Request {
            prompt: &p,
            session: None,
            avoid: None,
        };
        if let Choice::Pod(t) = picker.pick(&r, 0) {
            picker.release(t, Outcome::Aborted, 0);
        }
    }
    let mut now = 0u64;
    let pick = support::best(2000, || {
        hash_prompt(&parts, 1024, 0, &mut prompt);
        let r = Request {
            prompt: &prompt,
            session: None,
            avoid: None,
        };
        now += 1000;
        if let Choice::Pod(t) = picker.pick(&r, now) {
            picker.release(t, Outcome::Aborted, now);
        }
    });
    println!(
        "64 KiB prompt ({} blocks of 1 KiB): hash {:.1} µs, hash + pick + release over 8 pods {:.1} µs",
        prompt.blocks.len(),
        hash * 1e6,
        pick * 1e6
    );
}
