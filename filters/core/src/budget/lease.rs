//! The accounting of one lease, whichever ledger holds it: a worker's lease on an embedded
//! ledger ([`super::worker_lease`], renewed by compare-and-swap on shared data) and a gateway's
//! lease on the shared ledger ([`super::shared_lease`], renewed by a report to
//! `llmkube-budgets`) admit, settle and report through this one type. What differs between
//! them is only how a renewal reaches the ledger and when its answer lands.
//!
//! The invariant both rely on: every request admitted on a lease is covered by the lease's hold
//! in the ledger, so `admitted + used ≤ granted` holds for what the lease admits (a settle above
//! its bound, an estimate that under-counted it, saturates the room to zero: room lost, never
//! gained), and a renewal charges `used` and holds at least `admitted` again.

use super::lease_config::{UNLIMITED_PICO, UNLIMITED_TOKENS};
use super::ledger::Caps;
use super::window::Amount;

/// One lease's room and what is taken from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Account {
    /// What the lease may admit against: its hold in the ledger. A dimension the ledger has
    /// no cap in is granted without limit (the hold there limits nothing).
    pub granted: Amount,
    /// Σ bounds of the requests admitted on the lease that have not ended.
    pub admitted: Amount,
    /// Σ charges settled on the lease and not reported to the ledger yet.
    pub used: Amount,
}

impl Account {
    /// Room left: granted − used − admitted.
    pub fn room(&self) -> Amount {
        self.granted.minus(self.used).minus(self.admitted)
    }

    /// Whether a request of bound `b` fits the room in every dimension.
    pub fn fits(&self, b: Amount) -> bool {
        let room = self.room();
        !self.granted.is_zero() && b.tokens <= room.tokens && b.pico <= room.pico
    }

    pub fn admit(&mut self, b: Amount) {
        self.admitted = self.admitted.plus(b);
    }

    /// A request admitted with bound `b` ended, charged `actual` (zero: released, or an
    /// admission taken back).
    pub fn end(&mut self, b: Amount, actual: Amount) {
        self.admitted = self.admitted.minus(b);
        self.used = self.used.plus(actual);
    }

    /// A renewal that charged `reported` of the use landed with a lease of `granted`.
    pub fn renewed(&mut self, reported: Amount, granted: Amount) {
        self.used = self.used.minus(reported);
        self.granted = granted;
    }

    /// Nothing in flight or unreported.
    pub fn is_settled(&self) -> bool {
        self.admitted.is_zero() && self.used.is_zero()
    }
}

/// `granted` with every dimension `caps` leaves uncapped made unlimited.
pub fn unlimited_where_uncapped(caps: &Caps, granted: Amount) -> Amount {
    Amount::new(
        caps.tokens.map_or(UNLIMITED_TOKENS, |_| granted.tokens),
        caps.pico.map_or(UNLIMITED_PICO, |_| granted.pico),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_fit_the_room_left_by_what_is_in_flight_and_unreported() {
        let mut a = Account {
            granted: Amount::new(100, 1000),
            ..Account::default()
        };
        assert!(a.fits(Amount::new(60, 600)));
        a.admit(Amount::new(60, 600));
        assert!(!a.fits(Amount::new(41, 0)), "41 tokens over the room");
        assert!(!a.fits(Amount::new(0, 401)), "the USD dimension counts too");
        a.end(Amount::new(60, 600), Amount::new(30, 300));
        assert_eq!(a.room(), Amount::new(70, 700), "the use stays taken");
        a.end(Amount::ZERO, Amount::new(500, 0));
        assert_eq!(a.room(), Amount::new(0, 700), "an over-settle saturates");
        a.renewed(Amount::new(530, 300), Amount::new(50, 50));
        assert!(a.is_settled());
        assert!(a.fits(Amount::new(50, 50)));
        assert!(
            !Account::default().fits(Amount::ZERO),
            "no lease admits nothing"
        );
        let caps = Caps {
            tokens: Some(1),
            pico: None,
        };
        assert_eq!(
            unlimited_where_uncapped(&caps, Amount::new(7, 7)),
            Amount::new(7, UNLIMITED_PICO)
        );
    }
}
