//! Ledgers in the host's shared key-value store (proxy-wasm shared data), exact across Envoy
//! workers: every update is read → change → compare-and-swap, retried when another worker wrote
//! in between.
//!
//! Creation: Envoy's shared data accepts any CAS value for a key that does not exist yet, so two
//! workers creating one key could overwrite each other's first update. Ledger keys are therefore
//! created only at configuration ([`create_missing`], run by the root context
//! before traffic, and again by each worker, which finds them present), never on the request path:
//! a request that finds its key missing gets [`SharedError::Missing`] and is refused (503), not
//! silently given an empty ledger.

use super::admit::{LedgerKey, LedgerStore};
use super::gauge::Reading;
use super::ledger::{Caps, Hold, Ledger, Shape, Wait};
use super::ratelimit::Seen;
use super::window::Amount;

use crate::shared_data::{compare_and_swap, CasError, SharedData, Swap};

impl SharedError {
    /// A [`compare_and_swap`] on `key` that gave up, as the ledgers report it.
    pub fn from_cas(key: &str, e: CasError<SharedError>) -> SharedError {
        match e {
            CasError::Step(e) => e,
            CasError::Host | CasError::Contended => SharedError::Contended(key.to_string()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedError {
    /// The ledger key was not created at configuration.
    Missing(String),
    /// The stored bytes do not decode (never written by this code).
    Corrupt(String),
    /// The host refused the write, or [`MAX_CAS_ATTEMPTS`] were lost to other writers.
    Contended(String),
}

/// One ledger's place in shared data (borrowed: no copy of the key per update), and the budget
/// it belongs to.
pub struct SharedLedger<'k> {
    pub key: &'k str,
    pub shape: Shape,
    pub caps: Caps,
}

/// Writes an empty ledger under every key that is absent (configuration time only).
pub fn create_missing<S: SharedData>(
    data: &S,
    ledgers: &[SharedLedger<'_>],
) -> Result<(), SharedError> {
    for l in ledgers {
        let contended = || SharedError::Contended(l.key.to_string());
        // A ledger that could not be read is not taken for a missing one (and reset).
        if data.get(l.key).map_err(|_| contended())?.is_none() {
            data.set(l.key, Ledger::new(&l.shape).as_bytes(), None)
                .map_err(|_| contended())?;
        }
    }
    Ok(())
}

/// What the gauges of `l` show at `now`.
pub fn reading(l: &Ledger, shape: &Shape, now_ms: u64) -> Reading {
    Reading {
        version: l.seq(),
        spent: l.spent(shape, now_ms),
        held_tokens: l.held(shape, now_ms).tokens,
    }
}

/// A [`LedgerStore`] over shared data. `ledger` maps a [`LedgerKey`] to its key and budget.
pub struct SharedLedgers<'a, S: SharedData, F> {
    pub data: &'a S,
    pub ledger: F,
    pub now_ms: u64,
}

impl<'k, S: SharedData, F: Fn(&LedgerKey) -> Option<SharedLedger<'k>>> SharedLedgers<'_, S, F> {
    /// Applies `change` to one ledger atomically; `change` may run several times (once per
    /// attempt) and must depend only on the ledger it is given.
    pub fn update<T>(
        &self,
        key: &LedgerKey,
        mut change: impl FnMut(&mut Ledger, &Shape, &Caps, u64) -> T,
    ) -> Result<T, SharedError> {
        let l = (self.ledger)(key).ok_or_else(|| SharedError::Missing(format!("{key:?}")))?;
        compare_and_swap(self.data, l.key, None, |bytes| {
            let bytes = bytes.ok_or_else(|| SharedError::Missing(l.key.to_string()))?;
            // In place: the bytes shared data handed over are the ledger, changed where they
            // are and written back as they are.
            let mut ledger = Ledger::from_vec(bytes, &l.shape, self.now_ms)
                .map_err(|e| SharedError::Corrupt(format!("{}: {e:?}", l.key)))?;
            let seq = ledger.seq();
            let out = change(&mut ledger, &l.shape, &l.caps, self.now_ms);
            Ok(if ledger.seq() == seq {
                Swap::Keep(out)
            } else {
                Swap::Write(ledger, out)
            })
        })
        .map_err(|e| SharedError::from_cas(l.key, e))
    }

    /// Drops `hold` (if any) and charges `actual` (zero: a release), in one compare-and-swap,
    /// answering the ledger as it left it: the gauges show that state, and reading it here
    /// saves reading the ledger again. Its `version` is the ledger's `seq`, which orders the
    /// states two workers set the gauges from ([`super::gauge`]).
    pub fn settle(
        &self,
        key: &LedgerKey,
        hold: Option<&Hold>,
        actual: Amount,
    ) -> Result<Reading, SharedError> {
        self.update(key, |l, shape, _, now| {
            l.settle(shape, hold, actual, now);
            reading(l, shape, now)
        })
    }

    /// The ledger now, as its gauges show it.
    pub fn usage(&self, key: &LedgerKey) -> Result<Reading, SharedError> {
        self.update(key, |l, shape, _, now| reading(l, shape, now))
    }
}

impl<'k, S: SharedData, F: Fn(&LedgerKey) -> Option<SharedLedger<'k>>> LedgerStore
    for SharedLedgers<'_, S, F>
{
    type Error = SharedError;

    fn reserve(
        &mut self,
        key: &LedgerKey,
        amount: Amount,
    ) -> Result<Result<Hold, Wait>, SharedError> {
        self.update(key, |l, shape, caps, now| {
            l.try_reserve(shape, caps, amount, now)
        })
    }

    fn release(&mut self, key: &LedgerKey, hold: &Hold) -> Result<(), SharedError> {
        self.update(key, |l, shape, _, now| l.release(shape, hold, now))
    }

    fn check(&mut self, key: &LedgerKey, amount: Amount) -> Result<Result<(), Wait>, SharedError> {
        self.update(key, |l, shape, caps, now| l.check(shape, caps, amount, now))
    }
}

/// A [`LedgerStore`] over [`SharedLedgers`] that also keeps what each reserve left of its
/// ledger, or found there when it refused (the rate-limit headers), seen inside the reserve's
/// own compare-and-swap: no extra read.
pub struct Seeing<'a, S: SharedData, F> {
    pub store: SharedLedgers<'a, S, F>,
    pub seen: Vec<Seen>,
}

impl<'k, S: SharedData, F: Fn(&LedgerKey) -> Option<SharedLedger<'k>>> LedgerStore
    for Seeing<'_, S, F>
{
    type Error = SharedError;

    fn reserve(
        &mut self,
        key: &LedgerKey,
        amount: Amount,
    ) -> Result<Result<Hold, Wait>, SharedError> {
        let r = self.store.update(key, |l, shape, caps, now| {
            let r = l.try_reserve(shape, caps, amount, now);
            // Refused too: the 429 carries the room that was there.
            let seen = Seen {
                caps: *caps,
                spent: l.spent(shape, now),
                held: l.held(shape, now),
                reset_ms: l.spent_quiet_at(shape, now).saturating_sub(now),
            };
            (r, Some(seen))
        })?;
        self.seen.extend(r.1);
        Ok(r.0)
    }

    fn release(&mut self, key: &LedgerKey, hold: &Hold) -> Result<(), SharedError> {
        self.store.release(key, hold)
    }

    fn check(&mut self, key: &LedgerKey, amount: Amount) -> Result<Result<(), Wait>, SharedError> {
        self.store.check(key, amount)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::admit::admit_all;
    use crate::budget::test_store::{envoy_set, Envoyish, Map};
    use crate::shared_data::{ReadFailed, SetError};

    fn one(_: &LedgerKey) -> Option<SharedLedger<'static>> {
        Some(SharedLedger {
            key: "llmkube.budget.all",
            shape: Shape::new(60, 900),
            caps: Caps {
                tokens: Some(100),
                pico: None,
            },
        })
    }

    const KEY: LedgerKey = LedgerKey {
        budget: 0,
        team: None,
    };

    #[test]
    fn a_write_landing_in_between_is_retried_not_lost() {
        let data = Envoyish::default();
        create_missing(&data, &[one(&KEY).unwrap()]).unwrap();
        // Another worker reserves 60 between our read and our write.
        *data.interleave.borrow_mut() = Some(Box::new(|d: &Envoyish| {
            let mut other = SharedLedgers {
                data: d,
                ledger: one,
                now_ms: 0,
            };
            assert!(other.reserve(&KEY, Amount::new(60, 0)).unwrap().is_ok());
        }));
        let mut store = SharedLedgers {
            data: &data,
            ledger: one,
            now_ms: 0,
        };
        // Our 50 no longer fits after the retry re-reads the ledger.
        assert!(store.reserve(&KEY, Amount::new(50, 0)).unwrap().is_err());
        assert!(store.reserve(&KEY, Amount::new(40, 0)).unwrap().is_ok());
        assert_eq!(store.usage(&KEY).unwrap().held_tokens, 100);
    }

    #[test]
    fn missing_keys_are_an_error_not_an_empty_ledger() {
        let data = Envoyish::default();
        let mut store = SharedLedgers {
            data: &data,
            ledger: one,
            now_ms: 0,
        };
        assert!(matches!(
            store.reserve(&KEY, Amount::new(1, 0)),
            Err(SharedError::Missing(_))
        ));
        data.set("llmkube.budget.all", b"\x07junk", None).unwrap();
        assert!(matches!(
            store.reserve(&KEY, Amount::new(1, 0)),
            Err(SharedError::Corrupt(_))
        ));
    }

    #[test]
    fn admission_and_settlement_through_shared_data() {
        let data = Envoyish::default();
        let l = one(&KEY).unwrap();
        create_missing(&data, &[l]).unwrap();
        let first = data.get("llmkube.budget.all").unwrap().unwrap();
        assert_eq!(first.0.len(), Ledger::max_encoded_len(&Shape::new(60, 900)));
        // Creating again leaves an existing ledger alone.
        create_missing(&data, &[one(&KEY).unwrap()]).unwrap();
        assert_eq!(data.get("llmkube.budget.all").unwrap().unwrap(), first);
        let mut store = SharedLedgers {
            data: &data,
            ledger: one,
            now_ms: 1000,
        };
        let holds = admit_all(&mut store, &[KEY], Amount::new(70, 0))
            .unwrap()
            .unwrap();
        let after = store
            .settle(&KEY, Some(&holds[0]), Amount::new(20, 0))
            .unwrap();
        assert_eq!((after.spent, after.held_tokens), (Amount::new(20, 0), 0));
        assert_eq!(store.usage(&KEY).unwrap(), after);
        let refusal = admit_all(&mut store, &[KEY], Amount::new(81, 0))
            .unwrap()
            .unwrap_err();
        // Settled at 1 s: gone at 61 s, never later than the window.
        assert_eq!(refusal.wait, Wait::Seconds(60));
    }

    /// Two workers settle on one ledger; the first sets the gauge (one stat for both) last,
    /// from its older state. Its tick finds the ledger's `seq` moved on and sets the newest;
    /// the other worker's tick finds its own state still the newest and sets nothing.
    #[test]
    fn the_gauge_of_an_embedded_ledger_ends_at_its_newest_state() {
        use crate::budget::gauge::on_tick;
        let data = Envoyish::default();
        create_missing(&data, &[one(&KEY).unwrap()]).unwrap();
        let worker = |now_ms| SharedLedgers {
            data: &data,
            ledger: one,
            now_ms,
        };
        let (a, b) = (worker(1_000), worker(1_001));
        let older = a.settle(&KEY, None, Amount::new(30, 0)).unwrap();
        let newer = b.settle(&KEY, None, Amount::new(20, 0)).unwrap();
        assert!(newer.version > older.version);
        // b sets the gauge from its state, then a from its older one: the last set stays.
        let mut gauge = [newer, older].into_iter().last().unwrap();
        assert_ne!(gauge, newer, "the race: the older state is on the gauge");
        let ledger_now = |w: &SharedLedgers<_, _>| w.usage(&KEY).ok();
        let mut sets = 0;
        for (w, set) in [(&a, older), (&b, newer)] {
            if let Some(again) = on_tick(&set, ledger_now(w)) {
                gauge = again;
                sets += 1;
            }
        }
        assert_eq!(gauge.spent.tokens, 50);
        assert_eq!(
            (gauge, sets),
            (newer, 1),
            "only the worker that set the older one"
        );
        // Nothing changed since: every tick confirms.
        assert_eq!(on_tick(&gauge, ledger_now(&a)), None);
    }

    /// Real threads hammering one Mutex-backed store with Envoy's CAS semantics: the cap holds.
    #[cfg(not(target_family = "wasm"))]
    #[test]
    fn concurrent_workers_never_overshoot() {
        use std::sync::Mutex;
        #[derive(Default)]
        struct Locked(Mutex<(Map, u32)>);
        impl SharedData for Locked {
            fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, ReadFailed> {
                Ok(self.0.lock().map_err(|_| ReadFailed)?.0.get(key).cloned())
            }
            fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
                let mut g = self.0.lock().map_err(|_| SetError::Host)?;
                let (map, tokens) = &mut *g;
                envoy_set(map, tokens, key, value, cas)
            }
        }
        let data = Locked::default();
        create_missing(&data, &[one(&KEY).unwrap()]).unwrap();
        let admitted: usize = std::thread::scope(|s| {
            let workers: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let mut store = SharedLedgers {
                            data: &data,
                            ledger: one,
                            now_ms: 0,
                        };
                        (0..50)
                            .filter(|_| store.reserve(&KEY, Amount::new(1, 0)).unwrap().is_ok())
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100);
        let store = SharedLedgers {
            data: &data,
            ledger: one,
            now_ms: 0,
        };
        assert_eq!(store.usage(&KEY).unwrap().held_tokens, 100);
    }
}
