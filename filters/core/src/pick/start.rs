//! Among gateway replicas, where a conversation starts on a prefix every conversation of its
//! application shares (an agent loop on its tool set).
//!
//! Replicas share nothing, and a loop's steps are dealt to all of them. A replica that has not
//! seen the loop knows at most its tool set, so every replica sends every step to the tool
//! set's pod, and all loops of one tool set pile up there (a lone gateway spreads them by moving
//! loops, which needs to know the loop). Here such a request is ranked by rendezvous on the
//! loop's first own block (the first block past the tools and top-level system prompt: the same
//! hash in every step, at every replica) among the first half of the pods
//! (`shared_start_percent`) in the tool set's own rendezvous order (where replicas place and
//! spill it). So step 2 sent by another replica
//! lands where step 1 went, loops of one tool set spread over those pods, and a tool set is
//! copied to at most that many of them. Between those pods the loop goes to the first by its
//! own rendezvous weight whose engine reports computing at most the least of them plus this
//! prompt: the engines' counters are the one view of the load the replicas share. A replica
//! that knows more of the loop follows it there, and only there.

use super::blocks::mix;
use super::{Picker, Request};

impl Picker {
    /// The pod for `req` when it has whole blocks of head (tools, top-level system prompt) and
    /// an own block after them, and `shared_start_percent` is on: of that share of the
    /// eligible pods ranked first by rendezvous on the prompt's first block and left open by
    /// `costs` (not past the shed bound), the first by rendezvous on its first own block whose
    /// engine-computed recent prompt is at most the least of theirs plus this prompt; None if this gateway knows more of the conversation than its head but
    /// not on that pod (then the usual ranking follows what it knows), or without a head.
    pub(crate) fn start_on_known_prefix(
        &self,
        req: &Request<'_>,
        matched: &[usize],
        costs: &[u64],
        now: u64,
    ) -> Option<usize> {
        let n = self.pods.len();
        let k = (n * self.cfg.shared_start_percent.min(100) as usize).div_ceil(100);
        let block = self.block_bytes()?;
        let own = req.prompt.head_bytes / block;
        if k == 0 || own == 0 {
            return None;
        }
        let blocks = &req.prompt.blocks;
        let (&first, &own_key) = (blocks.first()?, blocks.get(own)?);
        let weight = |key: u64, i: usize| mix(key ^ self.pods[i].id);
        let mut homes: Vec<usize> = (0..n)
            .filter(|&i| self.eligible(i, now, req.avoid))
            .collect();
        // Highest weight first. Chosen among all eligible pods, not the open ones, so a pod
        // one replica sees past its shed bound does not change the others' set.
        homes.sort_unstable_by_key(|&i| std::cmp::Reverse(weight(first, i)));
        homes.truncate(k);
        // The engines' computed prompt (every replica's traffic, so every replica reads about
        // the same) balances loops between those pods; the prompt's bytes of slack keep the
        // choice from flipping while a loop's first steps are sent by different replicas.
        let engine_work = |i: usize| self.engine_computed(i, now);
        let mut open: Vec<usize> = homes
            .into_iter()
            .filter(|&i| costs[i] != u64::MAX)
            .collect();
        open.sort_unstable_by_key(|&i| std::cmp::Reverse(weight(own_key, i)));
        let least = open
            .iter()
            .filter_map(|&i| engine_work(i))
            .fold(f64::INFINITY, f64::min);
        let slack = req.prompt.bytes as f64;
        let pick = open
            .iter()
            .copied()
            .find(|&i| engine_work(i).is_none_or(|w| w <= least + slack))?;
        let known = matched.iter().copied().max().unwrap_or(0);
        (known <= own || matched[pick] >= known).then_some(pick)
    }
}
