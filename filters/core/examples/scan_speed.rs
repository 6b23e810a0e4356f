//! Throughput of the body scanner on chat bodies.
//!
//! Native: `cargo run --release -p llmkube-router-core --example scan_speed`
//!
//! In V8 (the engine Envoy runs the filters on), with the filters' wasm flags (SIMD128):
//! ```text
//! cargo build --release --target wasm32-wasip1 -p llmkube-router-core --example scan_speed
//! node filters/core/examples/scan_speed_v8.mjs [BODY.json ...]
//! ```
//! Body files given as arguments (e.g. the benchmark bodies in `bench/out/bodies/`) are scanned
//! as they are; without arguments a synthetic body of each size is used. Besides the whole scan it
//! times `std::str::from_utf8` over the same bytes, the reference the scanner's UTF-8 check is
//! measured against.
mod support;

use router_core::scan::Scanner;

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

/// Content span (after the opening quote, up to the closing one) of the longest string in `b`.
fn longest_string(b: &[u8]) -> (usize, usize) {
    let (mut best, mut i) = ((0, 0), 0);
    while let Some(q) = b[i..].iter().position(|&c| c == b'"') {
        let start = i + q + 1;
        let end = match router_core::fast::skip_string(b, start, |j| Ok::<usize, ()>(j + 2)) {
            router_core::fast::Walk::Quote(e) => e,
            _ => break,
        };
        if end - start > best.1 - best.0 {
            best = (start, end);
        }
        i = end + 1;
    }
    best
}

/// Seconds per scan of a `bytes`-long body: a warm-up, then the best of several rounds sized so
/// each round reads about 64 MiB.
fn time<F: FnMut()>(bytes: usize, mut f: F) -> f64 {
    let iters = (64 * 1024 * 1024 / bytes).clamp(10, 50_000);
    for _ in 0..iters.min(50) {
        f();
    }
    support::best(iters, f)
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // `--scan-only BODY...`: just the whole-body scan's µs/KiB per body, for quick A/B runs
    // (several runs of each build interleaved; the other lines take most of a run's time).
    let scan_only = args.first().map(String::as_str) == Some("--scan-only");
    if scan_only {
        args.remove(0);
    }
    let bodies: Vec<(String, Vec<u8>)> = if args.is_empty() {
        [1usize, 16, 256, 2048]
            .iter()
            .map(|&k| (format!("synthetic {k} KiB"), body(k)))
            .collect()
    } else {
        args.iter()
            .map(|p| {
                (
                    p.rsplit('/').next().unwrap_or(p).to_string(),
                    std::fs::read(p).expect("read body"),
                )
            })
            .collect()
    };
    let mut s = Scanner::new();
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>8}",
        "body", "KiB", "µs/scan", "µs/KiB (utf8)", "pieces"
    );
    for (name, b) in &bodies {
        let kib = b.len() as f64 / 1024.0;
        let scan = time(b.len(), || {
            let f = s.scan(std::hint::black_box(b)).expect("valid");
            std::hint::black_box(f.stream);
        });
        if scan_only {
            println!(
                "{name:<28} {kib:>10.0} {:>10.2} {:>7.3}",
                scan * 1e6,
                scan * 1e6 / kib
            );
            continue;
        }
        // As the filter feeds a body that arrives in pieces (Envoy hands over a 2 MiB body in
        // about eight reads of ~256 KiB): a window keeping only what the scan may read again.
        let piece = 256 * 1024;
        let mut window = Vec::new();
        let pieces = time(b.len(), || {
            s.begin();
            window.clear();
            let (mut base, mut seen) = (0, 0);
            loop {
                let k = (seen + piece).min(b.len());
                window.extend_from_slice(&b[seen..k]);
                seen = k;
                let f = s.resume_window(&window, base, k == b.len()).expect("valid");
                if let Some(f) = f {
                    std::hint::black_box(f.stream);
                    break;
                }
                let keep = s.needed_from();
                window.drain(..keep - base);
                base = keep;
            }
        });
        let utf8 = time(b.len(), || {
            std::hint::black_box(std::str::from_utf8(std::hint::black_box(b)).is_ok());
        });
        println!(
            "{name:<28} {kib:>10.0} {:>10.2} {:>7.3} ({:.3}) {:>8.3}",
            scan * 1e6,
            scan * 1e6 / kib,
            utf8 * 1e6 / kib,
            pieces * 1e6 / kib
        );
        // As the filter reads a body Envoy already holds: each read copies `chunk` bytes into a
        // fresh allocation (the host's copy into wasm memory), which is scanned and freed.
        let per_chunk: Vec<String> = [usize::MAX, 256 * 1024, 64 * 1024, 16 * 1024]
            .iter()
            .map(|&chunk| {
                let t = time(b.len(), || {
                    let mut w = router_core::body::BodyWindow::scan();
                    let mut seen: usize = 0;
                    loop {
                        let k = seen.saturating_add(chunk).min(b.len());
                        let mut piece = Vec::with_capacity(k - seen);
                        piece.extend_from_slice(std::hint::black_box(&b[seen..k]));
                        seen = k;
                        let f = w.feed(piece, k == b.len()).expect("valid");
                        if let Some(f) = f {
                            std::hint::black_box(f.stream);
                            break;
                        }
                    }
                });
                format!("{:.3}", t * 1e6 / kib)
            })
            .collect();
        println!(
            "{:<28} copied in and scanned, µs/KiB, read whole / 256 / 64 / 16 KiB at a time: {}",
            "",
            per_chunk.join(" / ")
        );
        // The passes over every byte, each alone: the copy (as the host makes it), the UTF-8
        // check over the whole body (the scan's separate first pass until it moved into the
        // string walk) and the string walk over the body's longest string (where nearly all
        // bytes are).
        let copy = time(b.len(), || {
            let mut v = Vec::with_capacity(b.len());
            v.extend_from_slice(std::hint::black_box(b));
            std::hint::black_box(&v);
        });
        let utf8_pass = time(b.len(), || {
            std::hint::black_box(router_core::fast::validate_utf8(std::hint::black_box(b)).is_ok());
        });
        let (start, end) = longest_string(b);
        let walk = time(end - start, || {
            let w = router_core::fast::skip_string(std::hint::black_box(b), start, |j| {
                Ok::<usize, ()>(if b.get(j + 1) == Some(&b'u') {
                    j + 6
                } else {
                    j + 2
                })
            });
            std::hint::black_box(w);
        });
        println!(
            "{:<28} passes alone, µs/KiB: copy {:.3} · UTF-8 over the body {:.3} · walk of the longest string ({:.0} KiB) {:.3}",
            "",
            copy * 1e6 / kib,
            utf8_pass * 1e6 / kib,
            (end - start) as f64 / 1024.0,
            walk * 1e6 / ((end - start) as f64 / 1024.0)
        );
    }
}
