//! Among gateway replicas, where a prompt new to this gateway goes: rendezvous weighted by the
//! engines' own account of the prefill each pod did.
//!
//! A prompt new here is most likely already on its rendezvous home, put there by another
//! replica; a replica that skips the home because *its own* sends say the home did too much
//! prefill lands its copy where the others never look, and keeps it there. A hard bound read
//! from each replica's own traffic is crossed at a different moment by each replica, so every
//! prefix first seen near the crossing is split. The engines' computed-prompt counters count
//! every replica's traffic, and every replica reads them at the same scrape, so a weight made
//! of them is (nearly) the same number at every replica; and a weighted rendezvous moves a
//! prefix's home only when the weights move enough to swap its first two pods, a fraction of
//! the prefixes proportional to the drift instead of every prefix near a threshold.

use super::blocks::mix;
use super::Picker;

/// A pod that did this many times the mean prefill is weighted as if it did this many (and
/// as few): past it the weight says nothing a smaller one would not.
const MAX_RATIO: f64 = 4.0;

impl Picker {
    /// The prompt bytes pod `i`'s engine reports computing recently (every replica's traffic,
    /// decaying with `recent_half_life_ns`), if its counters are fresh.
    pub(crate) fn engine_computed(&self, i: usize, now: u64) -> Option<f64> {
        let l = self.loads.get(i)?;
        l.fresh_metrics(now, self.cfg.metrics_max_age_ns)
            .and(l.scrape.computed)
            .map(|c| c.at(now, self.cfg.recent_half_life_ns))
    }

    /// Each pod's weight for placing a new prompt among replicas (`shared`), from the engines'
    /// recent computed prompt: `((mean + prior) / (own + prior)) ^ (shared_unseen_weight_percent
    /// / 100)` over the pods left open in `costs` (not `u64::MAX`), the prior being
    /// `shared_weight_prior_bytes`. None (unweighted) for a lone gateway, when it is off, when
    /// an open pod has no fresh counters (not vLLM, or not two scrapes yet), or before the
    /// engines have computed anything.
    pub(crate) fn placement_weights(
        &self,
        shared: bool,
        costs: &[u64],
        now: u64,
    ) -> Option<Vec<f64>> {
        let power = self.cfg.shared_unseen_weight_percent as f64 / 100.0;
        if !shared || power <= 0.0 {
            return None;
        }
        let live = |i: usize| costs.get(i).is_some_and(|&c| c != u64::MAX);
        let work: Vec<Option<f64>> = (0..self.pods.len())
            .map(|i| match live(i) {
                false => Some(0.0),
                true => self.engine_computed(i, now),
            })
            .collect();
        let count = (0..self.pods.len()).filter(|&i| live(i)).count();
        let sum: f64 = work.iter().map(|w| w.unwrap_or(f64::NAN)).sum();
        if count == 0 || !sum.is_finite() || sum <= 0.0 {
            return None;
        }
        let mean = sum / count as f64;
        let prior = self.cfg.shared_weight_prior_bytes as f64;
        let weights = work
            .iter()
            .map(|w| {
                let ratio = ((w.unwrap_or(mean) + prior) / (mean + prior))
                    .clamp(1.0 / MAX_RATIO, MAX_RATIO);
                (-power * ln(ratio)).exp()
            })
            .collect();
        Some(weights)
    }
}

/// The weighted rendezvous score of a pod with rendezvous hash `h` and weight `w`: the pod with
/// the highest score wins, each with probability proportional to its weight over random keys.
pub(crate) fn score(key: u64, id: u64, w: f64) -> f64 {
    let h = mix(key ^ id);
    // In (0, 1): never 0 or 1, whose logarithms would give no order.
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    w / -ln(u)
}

/// The natural logarithm of a positive normal `x`, to about 1e-7: the exponent's bits plus the
/// atanh series on the mantissa. `f64::ln` (and `powf`) pull about 20 KB of libm into the
/// filter module; `exp` is there already.
fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    // The mantissa in [1, 2).
    let m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    let t = (m - 1.0) / (m + 1.0);
    let t2 = t * t;
    let series =
        1.0 + t2 * (1.0 / 3.0 + t2 * (1.0 / 5.0 + t2 * (1.0 / 7.0 + t2 * (1.0 / 9.0 + t2 / 11.0))));
    e as f64 * std::f64::consts::LN_2 + 2.0 * t * series
}

#[cfg(test)]
mod tests {
    use super::score;

    #[test]
    fn a_pod_wins_in_proportion_to_its_weight() {
        let weights = [1.0, 2.0, 1.0, 0.5];
        let mut wins = [0u32; 4];
        for key in 0..40_000u64 {
            let key = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let best = (0..4)
                .max_by(|&a, &b| {
                    score(key, a as u64 + 1, weights[a]).total_cmp(&score(
                        key,
                        b as u64 + 1,
                        weights[b],
                    ))
                })
                .unwrap_or(0);
            wins[best] += 1;
        }
        let total: f64 = weights.iter().sum();
        for (i, w) in weights.iter().enumerate() {
            let share = wins[i] as f64 / 40_000.0;
            assert!(
                (share - w / total).abs() < 0.02,
                "pod {i}: {share} vs {}",
                w / total
            );
        }
    }

    #[test]
    fn the_logarithm_is_close_to_std() {
        for k in 1..10_000u64 {
            let x = k as f64 / 10_000.0;
            for v in [x, x * 4.0, 1.0 / x] {
                assert!((super::ln(v) - v.ln()).abs() < 1e-6, "{v}");
            }
        }
    }

    #[test]
    fn equal_weights_rank_as_plain_rendezvous() {
        use super::mix;
        for key in 0..1000u64 {
            let plain = (1..=5u64).max_by_key(|&id| mix(key ^ id));
            let weighted =
                (1..=5u64).max_by(|&a, &b| score(key, a, 1.0).total_cmp(&score(key, b, 1.0)));
            assert_eq!(plain, weighted);
        }
    }
}
