//! A lone gateway's balancing of conversations (`Company::Alone`): where the engines' counters
//! show no other gateway, nothing needs to agree with a replica, and a conversation can be
//! placed, and moved, by the work it will bring.
//!
//! A chat grows turn by turn on the pod where it started, and its first turn says nothing of
//! how long it will be. So the work to come on a pod is estimated from what is known: the
//! prefill it has done for its conversations over a long memory (`PodLoad::total`), its recent
//! prefill (the rate of the conversations still live) and a share per conversation started
//! there recently (`start_cost_bytes`, for those too new to show a rate). New conversations go
//! to the least; a conversation on a pod far above the mean moves to the pod where it would
//! add the least work (re-prefilling what its old pod held, less what the new pod holds of it),
//! while that still leaves the new pod lighter than the old one.
//!
//! A move is paid by the request that moves: its time to first token carries the re-prefill.
//! So a move is bounded by how much it re-prefills (`lone_move_max_bytes`): an agent loop
//! deep into its steps (a large tool set and a long history) stays, and the balance is made by
//! the conversations that are still cheap to move, mostly at their start.

use super::Picker;

/// A lone gateway's verdict on a conversation whose prefix a pod holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Move {
    Stay,
    /// To this pod (the least work after the re-prefill, within the load bound).
    To(usize),
    /// Away, to the pod with the least work to come (`lone_move_reuse` off).
    Away,
}

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

    /// Where a lone gateway moves the conversation of a request whose prefix `home` holds, if
    /// it does. `cached[i]` is the bytes of the request pod `i` holds. It moves when `home`'s
    /// work to come is past `lone_move_percent`
    /// of the eligible pods' mean and some other pod, charged the re-prefill (what `home`
    /// holds of the request beyond what that pod holds) and a conversation's share, would
    /// still be below `home`; it goes to the pod where that charge is least. So a move never
    /// just swaps which pod is heavy, and a long conversation (much held, costly to move)
    /// moves only off a pod far heavier than the lightest, and never past
    /// `lone_move_max_bytes` of re-prefill.
    pub(crate) fn lone_move(
        &self,
        home: usize,
        cached: &[u64],
        avoid: Option<usize>,
        now: u64,
    ) -> Move {
        let c = &self.cfg;
        let percent = c.lone_move_percent;
        if c.lone_move_percent == 0 || !self.eligible(home, now, avoid) {
            return Move::Stay;
        }
        let eligible: Vec<usize> = (0..self.pods.len())
            .filter(|&i| self.eligible(i, now, avoid))
            .collect();
        let mean = eligible
            .iter()
            .map(|&i| self.work_to_come(i, now))
            .sum::<f64>()
            / eligible.len().max(1) as f64;
        let here = self.work_to_come(home, now);
        if here <= mean * percent as f64 / 100.0 {
            return Move::Stay;
        }
        let held = cached.get(home).copied().unwrap_or(0);
        let reuse = c.lone_move_reuse;
        let reprefill = |i: usize| match reuse {
            true => held.saturating_sub(cached.get(i).copied().unwrap_or(0)),
            false => held,
        };
        // The load bound of consistent hashing over the pods but `home`.
        let others: Vec<u64> = eligible
            .iter()
            .filter(|&&i| i != home)
            .map(|&i| self.load_bytes(i, now))
            .collect();
        let mean_load = others.iter().sum::<u64>() / others.len().max(1) as u64;
        let bound =
            (mean_load as u128 * c.unseen_load_percent as u128 / 100) as u64 + c.request_cost_bytes;
        let cap = match c.lone_move_max_bytes {
            0 => u64::MAX,
            m => m,
        };
        let (after, to) = eligible
            .iter()
            .filter(|&&i| i != home && reprefill(i) <= cap)
            .filter(|&&i| !reuse || self.load_bytes(i, now) <= bound)
            .map(|&i| {
                let after =
                    self.work_to_come(i, now) + reprefill(i) as f64 + c.start_cost_bytes as f64;
                (after, i)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .unwrap_or((f64::INFINITY, home));
        match (after < here, reuse) {
            (false, _) => Move::Stay,
            (true, true) => Move::To(to),
            (true, false) => Move::Away,
        }
    }
}
