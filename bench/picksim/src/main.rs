//! The picking benchmark in virtual time:
//! `cargo run --release -p picksim --bin picksim [-- --like-envoy] [--pods N] [--only WORKLOAD]
//! [--set name=value]... [--seeds K] [--sweep] [--try "name=value,..."]... [--addr-draws K]`.
//!
//! Prints, per workload, hit rate, TTFT mean/p99 and imbalance for round-robin, least-loaded,
//! the picker (1 and 3 replicas) and the oracle, and the targets checked against them.
//! `--seeds K` judges the picker over K seeds instead (mean and range of the 3-replica ratio,
//! the imbalance, ...). `--sweep` (or `--try`) does so for a list of settings and prints a
//! Markdown table.
use picksim::workload::Shape;
use picksim::{
    judge, like_envoy, seeds, simulate, standard_workload, Judged, Policy, Report, Setup, Spread,
    SEED,
};

fn row(name: &str, r: &Report) {
    println!(
        "  {name:<22} hit {:>5.1}%  ttft mean {:>7.1} ms  p99 {:>8.1} ms  imbalance {:>4.2}",
        r.hit_rate * 100.0,
        r.ttft_mean_ms,
        r.ttft_p99_ms,
        r.imbalance
    );
}

/// The settings `--sweep` compares, each a list of `--set` assignments on top of the base.
const SWEEP: &[(&str, &str)] = &[
    ("defaults", ""),
    ("known shed at 130 %", "known_balance_percent=130"),
    ("known shed at 200 %", "known_balance_percent=200"),
    ("known never shed", "known_balance_percent=0"),
    ("half-life 30 s", "half_life_s=30"),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let le = args.iter().any(|a| a == "--like-envoy");
    // The shape `pick_envoy` replays through Envoy: 300 requests at 25 req/s, 4 pods, faster
    // engines (2 ms per computed block, 16 tokens of 1 ms).
    let mut base = if le { like_envoy() } else { Setup::default() };
    if let Some(n) = flag(&args, "--pods") {
        base.pods = n as usize;
    }
    if let Some(ms) = flag(&args, "--scrape-offset-ms") {
        base.scrape_offset_ns = ms * 1_000_000;
    }
    for (i, a) in args.iter().enumerate() {
        if a == "--set" {
            if let Some(kv) = args.get(i + 1) {
                picksim::set(&mut base.picker, kv);
            }
        }
    }
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let shapes: Vec<Shape> = Shape::ALL
        .into_iter()
        .filter(|s| only.is_none_or(|o| o == s.name()))
        .collect();
    let tries: Vec<(String, String)> = args
        .iter()
        .enumerate()
        .filter(|(_, a)| *a == "--try")
        .filter_map(|(i, _)| args.get(i + 1))
        .map(|t| (t.clone(), t.clone()))
        .collect();
    let sweep = args.iter().any(|a| a == "--sweep");
    let k = flag(&args, "--seeds").map(|k| k as usize);
    if sweep || !tries.is_empty() {
        let list: Vec<(String, String)> = if tries.is_empty() {
            SWEEP
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        } else {
            tries
        };
        sweep_table(&base, &shapes, le, &seeds(k.unwrap_or(8)), &list);
        return;
    }
    if let Some(k) = flag(&args, "--addr-draws") {
        // `pick_envoy`'s own workload (seed SEED) with `k` draws of pod addresses: how far one
        // run through Envoy (random ports) can land from another on the same requests.
        for &shape in &shapes {
            let reqs = standard_workload(shape, le, SEED);
            let (mut hit, mut imbalance, mut p99) = (Vec::new(), Vec::new(), Vec::new());
            let (mut ratio, mut imbalance3) = (Vec::new(), Vec::new());
            for d in 1..=k {
                let s = Setup {
                    addr_salt: d * 7919,
                    ..base.clone()
                };
                let r = simulate(Policy::Picker, &s, &reqs);
                let o = simulate(Policy::Oracle, &s, &reqs);
                hit.push(r.hit_rate);
                imbalance.push(r.imbalance);
                p99.push(r.ttft_p99_ms / o.ttft_p99_ms.max(1e-9));
                let three = Setup {
                    replicas: 3,
                    ..s.clone()
                };
                let r3 = simulate(Policy::Picker, &three, &reqs);
                ratio.push(r3.hit_rate / r.hit_rate.max(1e-9));
                imbalance3.push(r3.imbalance);
            }
            println!(
                "{} (seed {SEED}, {k} address draws, {} pods)",
                shape.name(),
                base.pods
            );
            println!("  picker hit          {:.3}", Spread::of(&hit));
            println!("  imbalance           {:.2}", Spread::of(&imbalance));
            println!("  p99 / oracle        {:.2}", Spread::of(&p99));
            println!("  3 replicas / 1      {:.3}", Spread::of(&ratio));
            println!("  imbalance, 3 repl.  {:.2}", Spread::of(&imbalance3));
        }
        return;
    }
    if let Some(k) = k {
        for &shape in &shapes {
            let j = judge(&base, shape, le, &seeds(k));
            println!("{} ({k} seeds, {} pods)", shape.name(), base.pods);
            print_judged(&j);
        }
        return;
    }
    for &shape in &shapes {
        let reqs = standard_workload(shape, le, SEED);
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
    }
}

fn print_judged(j: &Judged) {
    println!("  picker hit          {:.3}", j.hit);
    println!("  3 replicas / 1      {:.3}", j.ratio);
    println!(
        "  imbalance, 1 / 3    {:.2} / {:.2}",
        j.imbalance, j.imbalance3
    );
    println!(
        "  p99 ms, / oracle    {:.1} / {:.2}",
        j.p99_ms, j.p99_vs_oracle
    );
    println!("  hit / round-robin   {:.2}", j.vs_round_robin);
    println!("  hit / oracle        {:.2}", j.vs_oracle);
    println!(
        "  hit / ceiling       {:.3}  (ceiling / round-robin {:.2})",
        j.vs_ceiling, j.ceiling_vs_round_robin
    );
    println!("  ttft / least-loaded {:.3}", j.ttft_vs_least_loaded);
}

/// One Markdown row per setting and workload: the figures the targets are judged on, as mean
/// (min–max) over the seeds.
fn sweep_table(base: &Setup, shapes: &[Shape], le: bool, seeds: &[u64], list: &[(String, String)]) {
    println!(
        "{} seeds, {} pods{}",
        seeds.len(),
        base.pods,
        if le { ", --like-envoy" } else { "" }
    );
    println!("| setting | workload | hit | hit / round-robin | hit / oracle | 3 replicas / 1 | imbalance | imbalance, 3 replicas | p99 / oracle | TTFT / least-loaded | TTFT, 3 replicas / 1 | p99, 3 replicas / oracle |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, assignments) in list {
        let mut s = base.clone();
        for kv in assignments.split(',').filter(|kv| !kv.is_empty()) {
            picksim::set(&mut s.picker, kv);
        }
        for &shape in shapes {
            let j = judge(&s, shape, le, seeds);
            println!(
                "| {name} | {} | {:.3} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2} |",
                shape.name(),
                j.hit,
                j.vs_round_robin,
                j.vs_oracle,
                j.ratio,
                j.imbalance,
                j.imbalance3,
                j.p99_vs_oracle,
                j.ttft_vs_least_loaded,
                j.ttft3_vs_one,
                j.p99_3_vs_oracle
            );
        }
    }
}

/// Sets one picker parameter from `name=value` (`--set`, for trying settings by hand).
/// The number after `name`, if given.
fn flag(args: &[String], name: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}
