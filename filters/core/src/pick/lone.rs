//! A lone gateway's balancing of conversations (`Company::Alone`): where the engines' counters
//! show no other gateway, nothing needs to agree with a replica, and a conversation can be
//! placed, and moved, by the work it will bring.
//!
//! A chat grows turn by turn on the pod where it started, and its first turn says nothing of
//! how long it will be. So the work to come on a pod is estimated from what is known: the
//! prefill it has done for its conversations over a long memory (`PodLoad::total`), its recent
//! prefill (the rate of the conversations still live) and a share per conversation started
//! there recently (`start_cost_bytes`, for those too new to show a rate). New conversations go
//! to the least; a conversation on a pod far above the mean moves to the least while moving it
//! (re-prefilling what its old pod held) still leaves that pod lighter than its old one.

use super::Picker;

impl Picker {
    /// Pod `i`'s work to come, in prompt bytes, as a lone gateway weighs it.
    pub(crate) fn work_to_come(&self, i: usize, now: u64) -> f64 {
        let Some(l) = self.loads.get(i) else {
            return f64::INFINITY;
        };
        let c = &self.cfg;
        let total = match c.lone_total_half_life_ns {
            0 => 0.0,
            h => l.total.at(now, h),
        };
        total
            + l.recent.at(now, c.recent_half_life_ns)
            + c.start_cost_bytes as f64 * l.starts.at(now, c.start_half_life_ns)
    }

    /// Whether a lone gateway moves the conversation of a request whose prefix `home` holds
    /// (`held` bytes of it cached there) to another pod: `home`'s work to come is past
    /// `lone_move_percent` of the eligible pods' mean, and the lightest other pod, charged the
    /// re-prefill of `held` bytes and a conversation's share, would still be below `home`. So a
    /// move never just swaps which pod is heavy, and a long conversation (much held, costly to
    /// move) moves only off a pod far heavier than the lightest.
    pub(crate) fn lone_moves(
        &self,
        home: usize,
        held: u64,
        avoid: Option<usize>,
        now: u64,
    ) -> bool {
        let percent = self.cfg.lone_move_percent;
        if percent == 0 || !self.eligible(home, now, avoid) {
            return false;
        }
        let work: Vec<(usize, f64)> = (0..self.pods.len())
            .filter(|&i| self.eligible(i, now, avoid))
            .map(|i| (i, self.work_to_come(i, now)))
            .collect();
        let mean = work.iter().map(|w| w.1).sum::<f64>() / work.len().max(1) as f64;
        let here = self.work_to_come(home, now);
        let lightest = work
            .iter()
            .filter(|w| w.0 != home)
            .map(|w| w.1)
            .fold(f64::INFINITY, f64::min);
        let after = lightest + held as f64 + self.cfg.start_cost_bytes as f64;
        here > mean * percent as f64 / 100.0 && after < here
    }
}
