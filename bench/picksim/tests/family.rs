//! The workload family: draws are fixed by their seed, span the parameters they promise, and
//! tuning and report seeds never meet.
use picksim::family::{held_out_seeds, tuning_seeds, Draw, Instance, Kind};

#[test]
fn a_draw_is_fixed_by_its_seed() {
    for seed in held_out_seeds(3) {
        let (a, b) = (
            Instance::new(&Draw::new(seed)),
            Instance::new(&Draw::new(seed)),
        );
        assert_eq!(a.draw, b.draw);
        assert_eq!(a.reqs.len(), b.reqs.len());
        assert!(a
            .reqs
            .iter()
            .zip(&b.reqs)
            .all(|(x, y)| x.at_ns == y.at_ns && x.body == y.body && x.session == y.session));
        assert_eq!(a.setup.engine.cache_blocks, b.setup.engine.cache_blocks);
    }
}

#[test]
fn draws_span_the_family_and_report_seeds_are_not_tuning_seeds() {
    let draws: Vec<Draw> = held_out_seeds(200).into_iter().map(Draw::new).collect();
    let span = |f: &dyn Fn(&Draw) -> f64| {
        let v: Vec<f64> = draws.iter().map(f).collect();
        (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let (lo, hi) = span(&|d| d.pods as f64);
    assert!(lo == 2.0 && hi == 16.0, "pods {lo}..{hi}");
    let (lo, hi) = span(&|d| d.cache_ratio);
    assert!(
        (0.125..0.2).contains(&lo) && hi <= 4.0 && hi > 3.0,
        "cache {lo}..{hi}"
    );
    let (lo, hi) = span(&|d| d.tenants as f64);
    assert!(
        lo <= 6.0 && hi >= 180.0 && lo >= 5.0 && hi <= 200.0,
        "tenants {lo}..{hi}"
    );
    let (lo, hi) = span(&|d| d.zipf);
    assert!(lo == 0.0 && hi == 1.2, "zipf {lo}..{hi}");
    let lo = span(&|d| d.head_kib.0 as f64).0;
    assert!(lo == 1.0, "system prompts from {lo} KiB");
    assert!(span(&|d| d.head_kib.1 as f64).1 == 32.0, "up to 32 KiB");
    assert!(span(&|d| d.replicas as f64) == (2.0, 4.0));
    for k in [Kind::Tenants, Kind::Chats, Kind::Mixed, Kind::Unique] {
        assert!(draws.iter().any(|d| d.kind == k), "{k:?}");
    }
    assert!(draws.iter().any(|d| d.bursts) && draws.iter().any(|d| d.tools_share > 0.0));
    let tuning = tuning_seeds(64);
    assert!(held_out_seeds(1000).iter().all(|s| !tuning.contains(s)));
}

#[test]
fn each_pods_cache_is_its_share_of_the_hot_set_times_the_draws_ratio() {
    for seed in held_out_seeds(4) {
        let d = Draw::new(seed);
        let inst = Instance::new(&d);
        let block = inst.setup.engine.block_bytes;
        let share = inst.hot_bytes as f64 / d.pods as f64 / block as f64;
        let want = (d.cache_ratio * share) as usize;
        // At least two of the largest prompt, so every prompt fits.
        assert!(inst.setup.engine.cache_blocks >= want, "{seed:x}");
        assert_eq!(inst.setup.pods, d.pods);
        assert_eq!(inst.reqs.len(), d.requests);
    }
}
