use super::*;
use crate::budget::admit::admit_all;
use crate::budget::shared::create_missing;
use crate::budget::test_store::Envoyish;
use crate::shared_data::{ReadFailed, SetError};
use std::cell::Cell;

/// Envoy's shared data, counting the calls the filter would make.
#[derive(Default)]
struct Counted {
    data: Envoyish,
    gets: Cell<usize>,
    sets: Cell<usize>,
}

impl SharedData for Counted {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, ReadFailed> {
        self.gets.set(self.gets.get() + 1);
        self.data.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError> {
        self.sets.set(self.sets.get() + 1);
        self.data.set(key, value, cas)
    }
}

impl Counted {
    fn calls(&self) -> (usize, usize) {
        (self.gets.get(), self.sets.get())
    }
}

const NAMES: [&str; 2] = ["ledger-0", "ledger-1"];

fn key(budget: usize) -> LedgerKey {
    LedgerKey { budget, team: None }
}

fn t(n: u64) -> Amount {
    Amount::new(n, 0)
}

/// Ledger `i` has a token cap of `caps[i]`, a 60 s window and a 900 s hold TTL.
fn ledgers(caps: &[u64]) -> impl Fn(&LedgerKey) -> Option<SharedLedger<'static>> + '_ {
    move |k| {
        Some(SharedLedger {
            key: NAMES.get(k.budget)?,
            shape: Shape::new(60, 900),
            caps: Caps {
                tokens: Some(*caps.get(k.budget)?),
                pico: None,
            },
        })
    }
}

fn create<S: SharedData>(data: &S, caps: &[u64]) {
    let all: Vec<_> = (0..caps.len())
        .filter_map(|i| ledgers(caps)(&key(i)))
        .collect();
    create_missing(data, &all).unwrap();
}

/// Admits a request of bound `b` on `leases` at `now`: `Some(Err)` refused.
fn admit<S: SharedData>(
    data: &S,
    caps: &[u64],
    leases: &mut Leases,
    keys: &[LedgerKey],
    b: u64,
    now_ms: u64,
) -> Result<(), Wait> {
    admit_asking(data, caps, leases, keys, b, now_ms).0
}

/// [`admit`], and whether a refusal asked other workers for their room back.
fn admit_asking<S: SharedData>(
    data: &S,
    caps: &[u64],
    leases: &mut Leases,
    keys: &[LedgerKey],
    b: u64,
    now_ms: u64,
) -> (Result<(), Wait>, bool) {
    let mut store = LeasedLedgers {
        shared: SharedLedgers {
            data,
            ledger: ledgers(caps),
            now_ms,
        },
        leases,
        readings: Vec::new(),
        reclaimed: false,
    };
    let r = match admit_all(&mut store, keys, t(b)).unwrap() {
        Ok(_) => Ok(()),
        Err(refusal) => Err(refusal.wait),
    };
    (r, store.reclaimed)
}

/// Spent and held tokens of ledger `i` at `now`.
fn ledger<S: SharedData>(data: &S, caps: &[u64], i: usize, now_ms: u64) -> (u64, u64) {
    let store = SharedLedgers {
        data,
        ledger: ledgers(caps),
        now_ms,
    };
    let r = store.usage(&key(i)).unwrap();
    (r.spent.tokens, r.held_tokens)
}

fn tick<S: SharedData>(data: &S, leases: &mut Leases, now_ms: u64) -> Report {
    let r = leases.report(data, now_ms, false, |_, _| true);
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    r
}

#[test]
fn requests_that_fit_the_lease_cost_no_shared_data_call_and_the_tick_charges_them() {
    let caps = [1_000_000];
    let data = Counted::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    let before = data.calls();
    // The first request has no lease: one read and one compare-and-swap take it, with room
    // for twice the demand (100) beside it (and one read of the give-back mark, as every
    // renewal that leases room makes).
    admit(&data, &caps, &mut leases, &[key(0)], 100, 1_000).unwrap();
    assert_eq!(data.calls(), (before.0 + 2, before.1 + 1));
    assert_eq!(ledger(&data, &caps, 0, 1_000), (0, 300));
    let after_lease = data.calls();
    // Two more fit the lease, and all three settle on it: no shared-data call at all.
    admit(&data, &caps, &mut leases, &[key(0)], 100, 1_010).unwrap();
    admit(&data, &caps, &mut leases, &[key(0)], 100, 1_020).unwrap();
    for at in [1_030, 1_040, 1_050] {
        leases.end(NAMES[0], t(100), t(30), at);
    }
    assert_eq!(data.calls(), after_lease);
    assert_eq!(leases.get(NAMES[0]).unwrap().unreported(), t(90));
    // The tick: one read and one compare-and-swap charge the 90 and lease room for twice
    // the 200 admitted since the last renewal (and the mark's read).
    let reported = tick(&data, &mut leases, 1_100);
    assert_eq!(data.calls(), (after_lease.0 + 2, after_lease.1 + 1));
    assert_eq!(reported.readings.len(), 1);
    assert_eq!(reported.readings[0].2.spent, t(90));
    assert_eq!(ledger(&data, &caps, 0, 1_100), (90, 400));
    // A quiet period: the lease is released and forgotten.
    tick(&data, &mut leases, 1_200);
    assert_eq!(ledger(&data, &caps, 0, 1_200), (90, 0));
    assert!(leases.is_empty());
}

/// Two workers leasing one ledger, requests settling at their bound (no settle error), leases
/// renewed every other step. With the leases held the total charged stays within the cap; the
/// control (`Leases::unsafe_unheld`: all the free room granted, not held) lets the same traffic
/// overshoot.
fn two_workers(unheld: bool) -> u64 {
    let caps = [1_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let leases = || {
        if unheld {
            Leases::unsafe_unheld()
        } else {
            Leases::default()
        }
    };
    let mut workers = [leases(), leases()];
    // Per worker: the steps at which its requests in flight end.
    let mut in_flight: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for step in 0..60u64 {
        let now = 1_000 + step * 10;
        for w in 0..2 {
            let ends = in_flight[w].iter().filter(|&&e| e == step).count() as u64;
            for _ in 0..ends {
                if workers[w].end(NAMES[0], t(100), t(100), now) {
                    workers[w].renew_now(&data, NAMES[0], now, |_, _| true);
                }
            }
            in_flight[w].retain(|&e| e != step);
            for _ in 0..2 {
                if admit(&data, &caps, &mut workers[w], &[key(0)], 100, now).is_ok() {
                    in_flight[w].push(step + 3);
                }
            }
            if step % 2 == w as u64 {
                tick(&data, &mut workers[w], now);
            }
        }
    }
    for (w, leases) in workers.iter_mut().enumerate() {
        let now = 2_000;
        for _ in 0..in_flight[w].len() {
            leases.end(NAMES[0], t(100), t(100), now);
        }
        leases.report(&data, now, true, |_, _| true);
    }
    ledger(&data, &caps, 0, 2_000).0
}

#[test]
fn leases_of_two_workers_stay_within_the_cap_and_unheld_leases_overshoot() {
    let held = two_workers(false);
    assert!(held <= 1_000, "charged {held} > cap 1000");
    assert!(
        held >= 800,
        "the leases kept most of the cap unused: {held}"
    );
    let unheld = two_workers(true);
    assert!(unheld > 1_000, "unheld leases should overshoot: {unheld}");
}

/// A charge reported a tick after its settle lands in its settle's bucket: it rolls off, and a
/// refusal's Retry-After counts, from that second, as a per-request settle's would.
#[test]
fn late_reported_charges_keep_the_second_they_were_settled_in() {
    let caps = [100];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    admit(&data, &caps, &mut leases, &[key(0)], 80, 500).unwrap();
    // Settled in bucket 1 (1.5 s), reported on a tick in bucket 2.
    leases.end(NAMES[0], t(80), t(80), 1_500);
    tick(&data, &mut leases, 2_050);
    // Settled at 1.5 s, it rolls off at 61.5 s: from 2.1 s that is 59.4 s, so 60.
    assert_eq!(
        admit(&data, &caps, &mut leases, &[key(0)], 80, 2_100),
        Err(Wait::Seconds(60))
    );
    assert_eq!(ledger(&data, &caps, 0, 61_499).0, 80);
    assert_eq!(ledger(&data, &caps, 0, 61_500).0, 0);
    assert_eq!(
        admit(&data, &caps, &mut leases, &[key(0)], 80, 61_500),
        Ok(())
    );
}

/// Before the tick reports it, a request that does not fit renews the lease with this worker's
/// own use charged first, so the refusal waits for that use to roll off instead of answering 1
/// ("only holds are in the way": the use would still be inside the lease's hold).
#[test]
fn a_refusal_before_the_report_counts_from_the_workers_own_use() {
    let caps = [100];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    admit(&data, &caps, &mut leases, &[key(0)], 80, 500).unwrap();
    leases.end(NAMES[0], t(80), t(80), 1_500);
    // Settled at 1.5 s, it rolls off at 61.5 s: from 1.6 s that is 59.9 s, so 60.
    assert_eq!(
        admit(&data, &caps, &mut leases, &[key(0)], 80, 1_600),
        Err(Wait::Seconds(60))
    );
    assert_eq!(ledger(&data, &caps, 0, 1_600), (80, 0));
}

/// Near the cap a renewal leases no room (a quarter of what is free would not hold another
/// request like the last), so the lease is exact: a request that ends on it asks for a renewal,
/// after which the ledger shows its charge and its freed hold as per-request mode would, and
/// another worker can use that room at once. Far from the cap, ends stay in memory.
#[test]
fn near_the_cap_a_lease_is_exact_and_an_end_renews_it_at_once() {
    let caps = [200];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut a = Leases::default();
    admit(&data, &caps, &mut a, &[key(0)], 64, 0).unwrap();
    // (200 - 64) / 4 = 34 < 64: no room leased, only the request is held.
    assert_eq!(ledger(&data, &caps, 0, 0), (0, 64));
    assert!(
        a.end(NAMES[0], t(64), t(30), 10),
        "an exact lease asks for a renewal"
    );
    a.renew_now(&data, NAMES[0], 10, |_, _| true);
    assert_eq!(ledger(&data, &caps, 0, 10), (30, 0));
    // Another worker now fits two requests of 64 beside the 30 spent (30 + 128 ≤ 200), as
    // per-request mode would let it.
    let mut b = Leases::default();
    for at in [20, 21] {
        admit(&data, &caps, &mut b, &[key(0)], 64, at).unwrap();
    }
    // Far from the cap the lease has room, and an end stays in memory.
    let caps = [1_000_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut far = Leases::default();
    admit(&data, &caps, &mut far, &[key(0)], 64, 0).unwrap();
    assert!(!far.end(NAMES[0], t(64), t(30), 10));
    assert_eq!(ledger(&data, &caps, 0, 10), (0, 64 + 128));
}

#[test]
fn requests_in_flight_stay_held_through_renewals_and_a_quiet_lease_goes() {
    let caps = [1_000_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    admit(&data, &caps, &mut leases, &[key(0)], 100, 0).unwrap();
    tick(&data, &mut leases, 100);
    // Nothing admitted in the last period: the lease shrinks to what is in flight.
    tick(&data, &mut leases, 200);
    assert_eq!(ledger(&data, &caps, 0, 200), (0, 100));
    tick(&data, &mut leases, 300);
    assert_eq!(ledger(&data, &caps, 0, 300), (0, 100));
    leases.end(NAMES[0], t(100), t(40), 350);
    tick(&data, &mut leases, 400);
    assert_eq!(ledger(&data, &caps, 0, 400), (40, 0));
    assert!(leases.is_empty());
}

#[test]
fn a_lease_stops_admitting_half_a_hold_ttl_after_its_last_renewal() {
    let caps = [1_000_000];
    let data = Counted::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    admit(&data, &caps, &mut leases, &[key(0)], 100, 0).unwrap();
    let calls = data.calls();
    admit(&data, &caps, &mut leases, &[key(0)], 100, 449_999).unwrap();
    assert_eq!(data.calls(), calls, "within half the TTL: on the lease");
    // Past it (ticks failed to renew all that time): the request renews the lease itself.
    admit(&data, &caps, &mut leases, &[key(0)], 100, 450_000).unwrap();
    assert_eq!(
        data.calls(),
        (calls.0 + 2, calls.1 + 1),
        "read, mark, write"
    );
}

#[test]
fn admission_on_leases_is_all_or_nothing_across_a_requests_ledgers() {
    let caps = [1_000_000, 100];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    let both = [key(0), key(1)];
    admit(&data, &caps, &mut leases, &both, 50, 0).unwrap();
    // 60 fits ledger 0's lease but not ledger 1 (50 of 100 in flight): refused, and ledger 0's
    // lease gives its room back.
    assert_eq!(
        admit(&data, &caps, &mut leases, &both, 60, 10),
        Err(Wait::Seconds(1))
    );
    assert_eq!(leases.get(NAMES[0]).unwrap().admitted(), t(50));
    assert_eq!(leases.get(NAMES[1]).unwrap().admitted(), t(50));
}

#[test]
fn closing_charges_the_use_and_holds_only_what_is_in_flight() {
    let caps = [1_000_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    for at in [0, 1, 2] {
        admit(&data, &caps, &mut leases, &[key(0)], 100, at).unwrap();
    }
    leases.end(NAMES[0], t(100), t(30), 5);
    leases.report(&data, 10, true, |_, _| true);
    assert_eq!(ledger(&data, &caps, 0, 10), (30, 200));
}

#[test]
fn a_lease_whose_ledger_is_no_longer_its_own_is_dropped_untouched() {
    let caps = [1_000_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut leases = Leases::default();
    admit(&data, &caps, &mut leases, &[key(0)], 100, 0).unwrap();
    leases.end(NAMES[0], t(100), t(30), 5);
    let before = ledger(&data, &caps, 0, 10);
    let r = leases.report(&data, 10, false, |_, _| false);
    assert!(r.readings.is_empty());
    assert!(leases.is_empty());
    assert_eq!(ledger(&data, &caps, 0, 10), before);
}

#[test]
fn a_refusal_only_other_leases_cause_asks_for_their_room_and_their_next_renewal_gives_it() {
    let caps = [1_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let (mut a, mut b) = (Leases::default(), Leases::default());
    // Worker A leases room beside its request (300 held), admits a second request on it (its
    // demand since the renewal) and both end, charged 100 each: unreported, still held.
    admit(&data, &caps, &mut a, &[key(0)], 100, 1_000).unwrap();
    admit(&data, &caps, &mut a, &[key(0)], 100, 1_001).unwrap();
    a.end(NAMES[0], t(100), t(100), 1_002);
    a.end(NAMES[0], t(100), t(100), 1_002);
    assert_eq!(ledger(&data, &caps, 0, 1_002), (0, 300));
    // Worker B's 800 fits what is spent (200 with A's) but not beside A's hold: refused, and
    // it asks for the room back.
    let (refused, asked) = admit_asking(&data, &caps, &mut b, &[key(0)], 800, 1_003);
    assert_eq!(refused, Err(Wait::Seconds(1)));
    assert!(asked);
    let (mark, _) = data.get(&give_back_key(NAMES[0])).unwrap().unwrap();
    assert_eq!(mark, 2_003u64.to_le_bytes());
    // A's tick: its demand would lease 200 again; asked, it leases none.
    tick(&data, &mut a, 1_100);
    assert_eq!(ledger(&data, &caps, 0, 1_100), (200, 0));
    assert!(a.get(NAMES[0]).is_none_or(WorkerLease::is_exact));
    // B tries again and fits: 200 spent + 800.
    assert_eq!(admit(&data, &caps, &mut b, &[key(0)], 800, 1_101), Ok(()));
    // A refusal that what is spent alone explains asks for nothing.
    let (refused, asked) = admit_asking(&data, &caps, &mut a, &[key(0)], 900, 1_102);
    assert!(refused.is_err());
    assert!(!asked);
}

#[test]
fn once_the_mark_is_over_renewals_lease_room_again() {
    let caps = [1_000];
    let data = Envoyish::default();
    create(&data, &caps);
    let mut a = Leases::default();
    data.set(&give_back_key(NAMES[0]), &1_500u64.to_le_bytes(), None)
        .unwrap();
    // Within the mark: an admission leases no room beside the request.
    admit(&data, &caps, &mut a, &[key(0)], 100, 1_000).unwrap();
    assert_eq!(ledger(&data, &caps, 0, 1_000), (0, 100));
    a.end(NAMES[0], t(100), t(50), 1_001);
    // After it: a renewal leases room beside the request again.
    admit(&data, &caps, &mut a, &[key(0)], 100, 1_600).unwrap();
    let (_, held) = ledger(&data, &caps, 0, 1_600);
    assert!(held > 100, "{held}");
}
