//! The workload family: `cargo run --release -p picksim --bin family [-- --held-out K]
//! [--tuning K] [--skip K] [--seed HEX] [--set name=value]... [--misses] [--oracle-stats]
//! [--knowledge] [--details]`.
//!
//! Draws K held-out workloads (32 by default; `--tuning K` draws from the tuning seeds
//! instead; `--skip K` leaves out the first K held-out seeds), runs round-robin, the picker (one replica and the draw's replicas) and the prefix
//! oracle on each, and prints a Markdown table with the worst draw of each target
//! (`--misses`: and where the picker's misses came from, per draw; `--oracle-stats`: also
//! least-loaded and the prefix oracle held to the balance target, and whether the targets can
//! be met together; `--knowledge`: the picker's rule on the true caches and the balanced
//! oracle's rule on the picker's tables, beside the picker and the balanced oracle;
//! `--details`: the balanced rule on the picker's knowledge with each of the core's details).
use picksim::family::{
    details_table, evaluate, evaluate_details, evaluate_knowledge, evaluate_with_references,
    held_out_seeds, knowledge_table, misses_table, references_table, table, tuning_seeds, Draw,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let seeds = if let Some(s) = args
        .iter()
        .position(|a| a == "--seed")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| u64::from_str_radix(v, 16).ok())
    {
        vec![s]
    } else if let Some(k) = count("--tuning") {
        tuning_seeds(k)
    } else {
        let skip = count("--skip").unwrap_or(0);
        held_out_seeds(skip + count("--held-out").unwrap_or(32)).split_off(skip)
    };
    let references = args.iter().any(|a| a == "--oracle-stats");
    let knowledge = args.iter().any(|a| a == "--knowledge");
    let details = args.iter().any(|a| a == "--details");
    let mut rows = Vec::new();
    for seed in seeds {
        let d = Draw::new(seed);
        let tweak = |s: &mut picksim::Setup| {
            for (i, a) in args.iter().enumerate() {
                if a == "--set" {
                    if let Some(kv) = args.get(i + 1) {
                        picksim::set(&mut s.picker, kv);
                    }
                }
            }
        };
        let m = if details {
            evaluate_details(&d, &tweak)
        } else if knowledge {
            evaluate_knowledge(&d, &tweak)
        } else if references {
            evaluate_with_references(&d, &tweak)
        } else {
            evaluate(&d, &tweak)
        };
        eprintln!(
            "{seed:x} {}: rr {:.3} picker {:.3} x{} {:.3} oracle {:.3}; p99 {:.0} / {:.0} ms (rr {:.0})",
            d.label(),
            m.round_robin.hit_rate,
            m.picker.hit_rate,
            d.replicas,
            m.replicas.hit_rate,
            m.oracle.hit_rate,
            m.picker.e2e_p99_ms,
            m.oracle.e2e_p99_ms,
            m.round_robin.e2e_p99_ms
        );
        if std::env::var_os("FAMILY_DEBUG").is_some() {
            eprintln!(
                "  one {:?}\n  many {:?}",
                m.picker.misses, m.replicas.misses
            );
        }
        rows.push(m);
    }
    print!("{}", table(&rows));
    if args.iter().any(|a| a == "--misses") {
        print!("\n{}", misses_table(&rows));
    }
    if references {
        print!("\n{}", references_table(&rows));
    }
    if knowledge {
        print!("\n{}", knowledge_table(&rows));
    }
    if details {
        print!("\n{}", details_table(&rows));
    }
}
