//! What the speed examples share (a directory without `main.rs`, so cargo does not take it for
//! an example of its own).
use std::time::Instant;

/// Seconds per call of `f`, the best of seven rounds of `iters` calls: the machines these run on
/// are shared and noisy, and the minimum is the figure that moves with the code rather than with
/// the neighbours.
pub fn best<F: FnMut()>(iters: usize, mut f: F) -> f64 {
    (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}
