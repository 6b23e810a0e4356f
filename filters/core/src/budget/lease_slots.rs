//! Team leases (lease mode for `scope: team` budgets, docs/budgets.md "Team leases"): a team
//! budget gets a fixed number of lease slots, each a [`LeaseState`] under its own shared-data
//! key (`llmkube.budget|<router>|lease|<budget>|<slot>`) created at configuration — Envoy's
//! shared data cannot safely create a key on the request path (two workers creating one key
//! can overwrite each other), so no key is ever created for a team there.
//!
//! Ownership lives in the slot itself: its `team` field, read and written in the same
//! compare-and-swap that admits (`lease::admit_all`). A free slot (blank: no lease, nothing
//! admitted, used, reported or wanted) is bound to the first team whose request tries it; it
//! then asks for a lease on that team's ledger; once idle, the lease is released and the
//! slot, blank again, unbinds (`LeaseState::applied`). So a slot changes teams only with
//! nothing of the old team's in it, and a request admitted on a slot holds room on its own
//! team's ledger, whatever a worker's cache of team → slot believes.
//!
//! Where a team looks: [`PROBES`] slots from a hash of its name (so finding a team's slot costs
//! no directory read: the slot is the key admission reads anyway). A team finding every one
//! of them another team's reserves per request, as without leases; it is never refused for
//! want of a slot.

use super::shared_lease::LeaseState;
use crate::shared_data::SharedData;

pub use crate::config::budgets::DEFAULT_TEAM_SLOTS;
/// Slots a team may use: this many from its hash (fewer when the budget has fewer).
pub const PROBES: usize = 8;

/// FNV-1a: stable across workers and builds (every worker must look in the same places).
fn hash(team: &str) -> u64 {
    team.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The slots `team` may use, in the order it tries them.
pub fn candidates(team: &str, slots: usize) -> impl Iterator<Item = usize> {
    let start = match slots {
        0 => 0,
        n => (hash(team) % n as u64) as usize,
    };
    (0..PROBES.min(slots)).map(move |i| (start + i) % slots)
}

/// The slot `team` should admit on: the first candidate bound to it, else the first free one
/// (bound by the admission that uses it). `None`: every candidate is another team's (or
/// unreadable): reserve per request. Reads only; no write happens here.
pub fn find<S: SharedData>(
    data: &S,
    team: &str,
    slots: usize,
    key: impl Fn(usize) -> String,
) -> Option<usize> {
    let mut free = None;
    for slot in candidates(team, slots) {
        let Ok(Some((bytes, _))) = data.get(&key(slot)) else {
            continue;
        };
        let state = if bytes.is_empty() {
            LeaseState::default()
        } else {
            match LeaseState::decode(&bytes) {
                Ok(s) => s,
                Err(_) => continue,
            }
        };
        if state.team == team {
            return Some(slot);
        }
        if free.is_none() && state.team.is_empty() && state.is_blank() {
            free = Some(slot);
        }
    }
    free
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::lease_config::Lease;
    use crate::budget::shared_lease::{admit_all, settle_all, update, Admission};
    use crate::budget::test_store::Envoyish as Mem;
    use crate::budget::window::Amount;

    const CFG: Lease = Lease {
        max_tokens: Some(1000),
        max_pico: None,
        report_ms: 100,
        team_slots: 2,
        unheld: false,
    };

    fn key(slot: usize) -> String {
        format!("s{slot}")
    }

    /// `slots` blank slot keys, as configuration creates them.
    fn store(slots: usize) -> Mem {
        let m = Mem::default();
        for s in 0..slots {
            m.set(&key(s), &LeaseState::default().encode(), None)
                .unwrap();
        }
        m
    }

    fn state(m: &Mem, slot: usize) -> LeaseState {
        LeaseState::decode(&m.get(&key(slot)).unwrap().unwrap().0).unwrap()
    }

    /// The tick's report of `slot` at `now` (a release when `idle`: max 0) answered with a
    /// lease of `granted` tokens.
    fn report(m: &Mem, slot: usize, now: u64, granted: u64, idle: bool) {
        let max = Amount::new(1000, 0);
        update(m, &key(slot), |s| {
            let r = s.due(now, &CFG, max, 10_000, &format!("L{now}")).unwrap();
            assert_eq!(r.max.is_zero(), idle, "{r:?}");
            s.start(r.clone(), now + 1000);
            assert!(s.applied(&r, Amount::new(granted, 0), 10_000));
            (true, ())
        })
        .unwrap();
    }

    const B: Amount = Amount {
        tokens: 10,
        pico: 0,
    };

    #[test]
    fn a_team_binds_a_free_slot_asks_for_a_lease_then_admits_only_its_own_requests() {
        let m = store(2);
        let s = find(&m, "red", 2, key).unwrap();
        let keys = [(key(s), "red")];
        let k: Vec<(&str, &str)> = keys.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        assert_eq!(admit_all(&m, &k, B, 0, 0), Ok(Admission::NoRoom));
        let st = state(&m, s);
        assert_eq!((st.team.as_str(), st.wanted), ("red", true), "bound, wants");
        assert_eq!(find(&m, "red", 2, key), Some(s), "found again");
        report(&m, s, 0, 100, false);
        assert_eq!(admit_all(&m, &k, B, 1, 0), Ok(Admission::Admitted));
        // Another team trying this slot (a stale cache) is told it is taken: it must never
        // admit on red's lease (red's ledger would be charged for it).
        let ks = key(s);
        let blue = [(ks.as_str(), "blue")];
        assert_eq!(admit_all(&m, &blue, B, 1, 0), Ok(Admission::Taken(0)));
        assert_eq!(state(&m, s).account.admitted, B, "blue took nothing");
        assert_ne!(find(&m, "blue", 2, key), Some(s), "blue looks elsewhere");
    }

    #[test]
    fn a_third_team_past_the_slots_finds_none_and_a_slot_frees_once_its_lease_is_released() {
        let m = store(2);
        for team in ["red", "blue"] {
            let s = find(&m, team, 2, key).unwrap();
            let k = key(s);
            assert_eq!(
                admit_all(&m, &[(k.as_str(), team)], B, 0, 0),
                Ok(Admission::NoRoom)
            );
        }
        assert_ne!(state(&m, 0).team, state(&m, 1).team, "two teams, two slots");
        assert_eq!(find(&m, "green", 2, key), None, "no slot: per request");
        let red = find(&m, "red", 2, key).unwrap();
        report(&m, red, 0, 100, false);
        let k = key(red);
        let red_keys = [(k.as_str(), "red")];
        assert_eq!(admit_all(&m, &red_keys, B, 1, 0), Ok(Admission::Admitted));
        settle_all(&m, &[k.as_str()], B, Amount::new(7, 0)).unwrap();
        report(&m, red, 500, 100, false);
        assert_eq!(state(&m, red).team, "red", "a busy lease keeps its slot");
        // Idle past IDLE_REPORTS periods: the report charges the 7 and releases (max 0)...
        report(&m, red, 2_000, 0, true);
        let st = state(&m, red);
        assert!(st.id.is_empty() && st.team.is_empty(), "{st:?}");
        // ... and the slot is green's to take.
        assert_eq!(find(&m, "green", 2, key), Some(red));
    }

    #[test]
    fn a_slot_with_anything_of_its_team_left_does_not_change_teams() {
        let m = store(1);
        let k = key(0);
        assert_eq!(
            admit_all(&m, &[(k.as_str(), "red")], B, 0, 0),
            Ok(Admission::NoRoom)
        );
        report(&m, 0, 0, 100, false);
        assert_eq!(
            admit_all(&m, &[(k.as_str(), "red")], B, 1, 0),
            Ok(Admission::Admitted)
        );
        report(&m, 0, 500, 100, false);
        // Released while a request is in flight: the hold keeps what is admitted (the service
        // grants max(0, admitted)), the slot stays red's until that request ends.
        report(&m, 0, 2_000, 10, true);
        let st = state(&m, 0);
        assert_eq!((st.team.as_str(), st.account.granted), ("red", B), "{st:?}");
        assert_eq!(
            admit_all(&m, &[(k.as_str(), "blue")], B, 2_001, 0),
            Ok(Admission::Taken(0))
        );
        // A bound slot that wants a lease (no hold yet) is not free either.
        let m = store(1);
        let _ = admit_all(&m, &[(k.as_str(), "red")], B, 0, 0);
        assert_eq!(find(&m, "blue", 1, key), None);
    }

    #[test]
    fn admission_across_a_router_lease_and_a_team_slot_is_all_or_nothing() {
        let m = store(1);
        m.set("router", &LeaseState::default().encode(), None)
            .unwrap();
        update(&m, "router", |s| {
            s.id = "R".into();
            s.account.granted = Amount::new(100, 0);
            s.hold_expires_ms = 10_000;
            (true, ())
        })
        .unwrap();
        let k = key(0);
        let both = [("router", ""), (k.as_str(), "red")];
        // The slot has no lease yet: the router lease's admission is given back.
        assert_eq!(admit_all(&m, &both, B, 0, 0), Ok(Admission::NoRoom));
        let r = LeaseState::decode(&m.get("router").unwrap().unwrap().0).unwrap();
        assert_eq!(r.account.admitted, Amount::ZERO);
        report(&m, 0, 0, 100, false);
        assert_eq!(admit_all(&m, &both, B, 1, 0), Ok(Admission::Admitted));
        // The slot taken by another team: nothing stays on the router lease.
        let blue = [("router", ""), (k.as_str(), "blue")];
        assert_eq!(admit_all(&m, &blue, B, 1, 0), Ok(Admission::Taken(1)));
        let r = LeaseState::decode(&m.get("router").unwrap().unwrap().0).unwrap();
        assert_eq!(r.account.admitted, B, "only red's admission");
    }

    #[test]
    fn a_team_slot_asks_for_its_lease_even_when_the_router_lease_before_it_has_no_room() {
        let m = store(1);
        m.set("router", &LeaseState::default().encode(), None)
            .unwrap();
        let k = key(0);
        // Neither has a lease (the first request): both must ask for one on the next tick.
        let both = [("router", ""), (k.as_str(), "red")];
        assert_eq!(admit_all(&m, &both, B, 0, 0), Ok(Admission::NoRoom));
        let st = state(&m, 0);
        assert_eq!((st.team.as_str(), st.wanted), ("red", true), "{st:?}");
        assert!(
            LeaseState::decode(&m.get("router").unwrap().unwrap().0)
                .unwrap()
                .wanted
        );
    }

    #[test]
    fn candidates_are_bounded_stable_and_cover_small_tables() {
        let a: Vec<usize> = candidates("red", 64).collect();
        assert_eq!(a.len(), PROBES);
        assert_eq!(a, candidates("red", 64).collect::<Vec<_>>());
        let mut small: Vec<usize> = candidates("red", 3).collect();
        small.sort();
        assert_eq!(small, vec![0, 1, 2], "every slot of a small table");
        assert_eq!(candidates("red", 0).count(), 0);
    }

    #[test]
    fn a_lease_of_the_previous_layout_reads_as_a_router_lease() {
        // Layout 1: version, flags, id, granted, admitted, used, four times.
        let mut v = vec![1u8, 0, 1, b'g'];
        v.extend([0u8; 48 + 32]);
        let s = LeaseState::decode(&v).unwrap();
        assert_eq!((s.team.as_str(), s.id.as_str()), ("", "g"));
        let mut t = s.clone();
        t.team = "red".into();
        assert_eq!(LeaseState::decode(&t.encode()), Ok(t));
    }
}
