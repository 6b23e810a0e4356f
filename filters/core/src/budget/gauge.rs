//! The gauges of ledgers, newest first across a gateway's workers.
//!
//! Embedded ledgers (shared data) carry their own version, the ledger's `seq`, bumped by every
//! change: a worker sets the gauges from the state its own compare-and-swap left, and another
//! worker can change the ledger and set the gauges in between, so the older state is set last.
//! Each worker therefore remembers what it set, and its tick reads the ledger: a newer `seq` is
//! set again ([`on_tick`]), the same one means the gauge shows the newest and the ledger is
//! forgotten. Shared ledgers (`llmkube-budgets`) work the same way over a copy of the newest
//! answer, as follows.
//!
//! Every service answer carries each ledger's state with a version (wire `LedgerState`) that
//! orders it after every earlier answer on that ledger. A gateway's workers process their
//! answers independently: a worker can record an older state after another worker recorded a
//! newer one (a settle sent on one worker's tick, answered after a later one sent on the
//! other's). The gauge is one stat for every worker, so it would then show the older state
//! until the next request on that ledger, however long the ledger stays idle.
//!
//! So the newest state of each ledger is kept in shared data, written by compare-and-swap only
//! when it is newer ([`publish`]), and the gauges are set from what shared data holds. A worker
//! that recorded a state since overtaken sets the newest one on its next tick ([`newest`]), so
//! every worker's last write to the gauge is the newest state within a tick.

use super::varint;
use super::window::Amount;
use crate::shared_data::{compare_and_swap, SharedData, Swap};

/// One ledger as one service answer reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reading {
    /// Larger is later; 0 from a service that sends no versions.
    pub version: u64,
    pub spent: Amount,
    pub held_tokens: u64,
}

/// A CAS token no stored value is expected to have: Envoy's shared data accepts any token for a
/// key that does not exist yet and refuses a mismatching one for a key that does, so a write
/// with it creates the key only if it is absent (instead of overwriting a newer state another
/// worker created in between). Envoy hands out tokens from a counter; meeting this one takes
/// 2³² writes to the store.
const ABSENT: u32 = u32::MAX;

impl Reading {
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.version,
            self.spent.tokens,
            self.spent.pico,
            self.held_tokens,
        ] {
            varint::put(out, v);
        }
    }

    /// `None` for bytes this code never wrote.
    pub fn decode(b: &[u8]) -> Option<Reading> {
        let mut i = 0;
        let mut next = || varint::get(b, &mut i);
        let r = Reading {
            version: next()?,
            spent: Amount::new(next()?, next()?),
            held_tokens: next()?,
        };
        (i == b.len()).then_some(r)
    }
}

/// Keeps `r` under `key` unless shared data holds a newer state of the ledger (an equal version
/// is replaced: a service without versions sends 0 every time, and then the last answer wins as
/// it always did). Returns what the gauges should show: the newest state known. When the host
/// fails or the key stays contended, `r` itself (the next tick sets the gauges from shared data
/// again).
pub fn publish<S: SharedData>(data: &S, key: &str, r: Reading) -> Reading {
    let mut buf = Vec::with_capacity(40);
    r.encode(&mut buf);
    let kept = compare_and_swap(data, key, Some(ABSENT), |value| {
        Ok::<_, ()>(match value.as_deref().map(Reading::decode) {
            Some(Some(held)) if held.version > r.version => Swap::Keep(held),
            Some(Some(held)) if held == r => Swap::Keep(r),
            // Absent, older, equal-versioned, or unreadable: replaced.
            _ => Swap::Write(&buf, r),
        })
    });
    kept.unwrap_or(r)
}

/// What a worker's tick does with a ledger whose gauges it set from `set`, given the newest
/// state shared data holds now: `Some(newer)` — set the gauges again from it (and keep watching:
/// another worker may still set an older one after this); `None` — what this worker set is
/// the newest (or nothing can be read), forget the ledger until it sets its gauges again.
pub fn on_tick(set: &Reading, newest: Option<Reading>) -> Option<Reading> {
    newest.filter(|n| n != set)
}

/// The newest state shared data holds for `key`, if any.
pub fn newest<S: SharedData>(data: &S, key: &str) -> Option<Reading> {
    data.get(key)
        .ok()
        .flatten()
        .and_then(|(b, _)| Reading::decode(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::test_store::Envoyish;

    /// Another worker stores `other` under `key` between this worker's read and its write.
    fn interleave(s: &Envoyish, key: &'static str, other: Reading) {
        *s.interleave.borrow_mut() = Some(Box::new(move |s: &Envoyish| {
            let mut b = Vec::new();
            other.encode(&mut b);
            s.set(key, &b, None).unwrap();
        }));
    }

    fn at(version: u64, tokens: u64) -> Reading {
        Reading {
            version,
            spent: Amount::new(tokens, tokens * 7),
            held_tokens: tokens / 2,
        }
    }

    const K: &str = "llmkube.budget|ns/r|gauge|all";

    #[test]
    fn an_older_answer_after_a_newer_one_leaves_the_newer() {
        let s = Envoyish::default();
        assert_eq!(publish(&s, K, at(5, 3946)), at(5, 3946));
        assert_eq!(publish(&s, K, at(9, 5919)), at(9, 5919));
        // The other worker's answer, older, processed last: the gauges show the newer.
        assert_eq!(publish(&s, K, at(7, 3946)), at(9, 5919));
        assert_eq!(newest(&s, K), Some(at(9, 5919)));
        // A repeat of the newest writes nothing.
        let tokens = s.tokens.get();
        assert_eq!(publish(&s, K, at(9, 5919)), at(9, 5919));
        assert_eq!(s.tokens.get(), tokens);
    }

    #[test]
    fn a_newer_state_written_in_between_wins_over_an_older_one() {
        let s = Envoyish::default();
        publish(&s, K, at(1, 10));
        // Between this worker's read and its write, the other worker stores version 9.
        interleave(&s, K, at(9, 90));
        assert_eq!(publish(&s, K, at(4, 40)), at(9, 90));
        assert_eq!(newest(&s, K), Some(at(9, 90)));
        // And when the key is created by the other worker in between, not overwritten.
        let s = Envoyish::default();
        interleave(&s, "new", at(9, 90));
        assert_eq!(publish(&s, "new", at(4, 40)), at(9, 90));
        assert_eq!(newest(&s, "new"), Some(at(9, 90)));
    }

    #[test]
    fn versionless_answers_keep_the_last_one_and_bad_bytes_are_replaced() {
        let s = Envoyish::default();
        publish(&s, K, at(0, 10));
        assert_eq!(
            publish(&s, K, at(0, 4)),
            at(0, 4),
            "without versions the last wins"
        );
        s.set(K, b"\xff", None).unwrap();
        assert_eq!(newest(&s, K), None);
        assert_eq!(publish(&s, K, at(2, 1)), at(2, 1));
        let max = Reading {
            version: u64::MAX,
            spent: Amount::new(u64::MAX, u64::MAX),
            held_tokens: u64::MAX,
        };
        let mut b = Vec::new();
        max.encode(&mut b);
        assert_eq!(Reading::decode(&b), Some(max));
        b.push(0);
        assert_eq!(Reading::decode(&b), None, "trailing bytes");
    }
}
