//! How long the embedded-mode budget work of one request takes natively: take a ledger's bytes
//! as shared data hands them over, reserve in place, hand the bytes back (the compare-and-swap
//! body), then the same for the settle. A rough guide for the filter's cost (wasm on V8 is
//! slower); not a test.
//!
//!   cargo run --release -p llmkube-router-core --example budget_speed

use router_core::budget::{Amount, Caps, Ledger, Price, Shape};
use std::time::Instant;

fn main() {
    let shape = Shape::new(3600, 900);
    let caps = Caps {
        tokens: Some(u64::MAX / 2),
        pico: Some(u64::MAX / 2),
    };
    let price = Price {
        prompt: 3_000_000,
        completion: 15_000_000,
    };
    let mut bytes = Ledger::new(&shape).as_bytes().to_vec();
    let n = 200_000u64;
    let start = Instant::now();
    let mut now = 1_764_600_000_000u64;
    for _ in 0..n {
        now += 20;
        // Shared data hands over a fresh copy per read: so does this loop.
        let mut l =
            Ledger::from_vec(bytes.clone(), &shape, now).unwrap_or_else(|_| Ledger::new(&shape));
        let hold = l
            .try_reserve(
                &shape,
                &caps,
                Amount::new(9000, price.cost(1000, 8000)),
                now,
            )
            .ok();
        let mut l = Ledger::from_vec(l.as_bytes().to_vec(), &shape, now)
            .unwrap_or_else(|_| Ledger::new(&shape));
        l.settle(
            &shape,
            hold.as_ref(),
            Amount::new(2000, price.cost(1500, 500)),
            now,
        );
        bytes.clear();
        bytes.extend_from_slice(l.as_bytes());
    }
    let per = start.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "reserve + settle on one ledger (read in place, update, hand back, twice): {per:.0} ns; ledger {} bytes",
        bytes.len()
    );
    let start = Instant::now();
    let mut total = 0u64;
    for _ in 0..n {
        let l =
            Ledger::from_vec(bytes.clone(), &shape, now).unwrap_or_else(|_| Ledger::new(&shape));
        total += l.spent(&shape, now).tokens;
    }
    let per = start.elapsed().as_nanos() as f64 / n as f64;
    println!("of which a read + one sum: {per:.0} ns ({total})");
}
