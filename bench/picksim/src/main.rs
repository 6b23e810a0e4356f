//! The picking benchmark in virtual time:
//! `cargo run --release -p picksim --bin picksim [-- --sweep] [--like-envoy] [--pods N]
//! [--only WORKLOAD] [--set name=value]...`.
//!
//! Prints, per workload, hit rate, TTFT mean/p99 and imbalance for round-robin, least-loaded,
//! the picker (1 and 3 replicas) and the oracle, and the targets checked against them.
//! `--sweep` also tries picker parameters on every workload.
use picksim::workload::{generate, Shape};
use picksim::{simulate, Policy, Report, Setup};

const SEED: u64 = 20_261_201;

fn workload(shape: Shape, like_envoy: bool) -> Vec<picksim::workload::SimRequest> {
    if like_envoy {
        return generate(shape, 300, 25.0, SEED);
    }
    let rate = match shape {
        Shape::SharedPrompt => 90.0,
        Shape::MultiTurn => 70.0,
        Shape::Agent => 40.0,
        Shape::Unique => 100.0,
    };
    generate(shape, 3000, rate, SEED)
}

fn row(name: &str, r: &Report) {
    println!(
        "  {name:<22} hit {:>5.1}%  ttft mean {:>7.1} ms  p99 {:>8.1} ms  imbalance {:>4.2}",
        r.hit_rate * 100.0,
        r.ttft_mean_ms,
        r.ttft_p99_ms,
        r.imbalance
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let sweep = args.iter().any(|a| a == "--sweep");
    let mut base = Setup::default();
    // The shape `pick_envoy` replays through Envoy: 300 requests at 25 req/s, 4 pods, faster
    // engines (2 ms per computed block, 16 tokens of 1 ms).
    let like_envoy = args.iter().any(|a| a == "--like-envoy");
    if like_envoy {
        base.pods = 4;
        base.engine.prefill_per_block = std::time::Duration::from_millis(2);
        base.engine.decode_per_token = std::time::Duration::from_millis(1);
        base.engine.reply_tokens = 16;
    }
    if let Some(n) = flag(&args, "--pods") {
        base.pods = n as usize;
    }
    for (i, a) in args.iter().enumerate() {
        if a == "--set" {
            if let Some(kv) = args.get(i + 1) {
                set(&mut base.picker, kv);
            }
        }
    }
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    for shape in Shape::ALL {
        if only.is_some_and(|o| o != shape.name()) {
            continue;
        }
        let reqs = workload(shape, like_envoy);
        println!(
            "{} ({} requests, {} pods)",
            shape.name(),
            reqs.len(),
            base.pods
        );
        let mut got = std::collections::HashMap::new();
        for p in Policy::ALL {
            let r = simulate(p, &base, &reqs);
            row(p.name(), &r);
            got.insert(p.name(), r);
        }
        let three = Setup {
            replicas: 3,
            ..base.clone()
        };
        let r3 = simulate(Policy::Picker, &three, &reqs);
        row("picker, 3 replicas", &r3);
        row(
            "least-loaded, 3 repl.",
            &simulate(Policy::LeastLoaded, &three, &reqs),
        );
        let (pk, rr, ll, or) = (
            &got["picker"],
            &got["round-robin"],
            &got["least-loaded"],
            &got["oracle"],
        );
        let check = |ok: bool| if ok { "ok" } else { "MISSED" };
        if matches!(shape, Shape::SharedPrompt | Shape::MultiTurn) {
            println!(
                "  targets: hit >= 95% oracle [{}] ({:.2}), >= 2x round-robin [{}] ({:.2}x)",
                check(pk.hit_rate >= 0.95 * or.hit_rate),
                pk.hit_rate / or.hit_rate.max(1e-9),
                check(pk.hit_rate >= 2.0 * rr.hit_rate),
                pk.hit_rate / rr.hit_rate.max(1e-9)
            );
        }
        if shape == Shape::Unique {
            println!(
                "  targets: ttft mean within 5% of least-loaded [{}] ({:.3})",
                check(pk.ttft_mean_ms <= 1.05 * ll.ttft_mean_ms),
                pk.ttft_mean_ms / ll.ttft_mean_ms.max(1e-9)
            );
        }
        println!(
            "  targets: p99 <= 1.2x oracle [{}] ({:.2}), imbalance <= 1.3 [{}], 3 replicas >= 90% of 1 [{}] ({:.2})",
            check(pk.ttft_p99_ms <= 1.2 * or.ttft_p99_ms),
            pk.ttft_p99_ms / or.ttft_p99_ms.max(1e-9),
            check(pk.imbalance <= 1.3),
            check(r3.hit_rate >= 0.9 * pk.hit_rate),
            r3.hit_rate / pk.hit_rate.max(1e-9)
        );
        if sweep {
            for balance in [0u64, 110, 120, 150] {
                for known in [false, true] {
                    for half_life_s in [5u64, 20] {
                        if balance == 0 && (known || half_life_s != 5) {
                            continue;
                        }
                        let mut s = base.clone();
                        s.picker.balance_percent = balance;
                        s.picker.balance_known = known;
                        s.picker.recent_half_life_ns = half_life_s * 1_000_000_000;
                        let r = simulate(Policy::Picker, &s, &reqs);
                        let r3 = simulate(
                            Policy::Picker,
                            &Setup {
                                replicas: 3,
                                ..s.clone()
                            },
                            &reqs,
                        );
                        let name = format!("bal{balance} known={known} hl{half_life_s}s");
                        row(&name, &r);
                        row(&format!("{name} r3"), &r3);
                    }
                }
            }
        }
    }
}

/// Sets one picker parameter from `name=value` (`--set`, for trying settings by hand).
fn set(c: &mut router_core::pick::Config, kv: &str) {
    let Some((k, v)) = kv.split_once('=') else {
        eprintln!("--set wants name=value, got {kv}");
        std::process::exit(2);
    };
    let Ok(n) = v.parse::<u64>() else {
        eprintln!("--set {k}: {v} is not a number");
        std::process::exit(2);
    };
    match k {
        "engine_counts" => c.engine_counts = n != 0,
        "unseen_load_percent" => c.unseen_load_percent = n,
        "balance_percent" => c.balance_percent = n,
        "balance_known" => c.balance_known = n != 0,
        "spread_bytes" => c.spread_bytes = n,
        "request_cost_bytes" => c.request_cost_bytes = n,
        "half_life_s" => c.recent_half_life_ns = n * 1_000_000_000,
        _ => {
            eprintln!("--set: unknown parameter {k}");
            std::process::exit(2);
        }
    }
}

/// The number after `name`, if given.
fn flag(args: &[String], name: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}
