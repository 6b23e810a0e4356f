//! Worker leases on embedded ledgers (default; off: `budgets.per_request`; docs/budgets.md "Worker
//! leases"). Per-request admission costs each ledger a shared-data read and a compare-and-swap
//! to reserve and the same to settle, and in Envoy those calls, not the ledger arithmetic, are
//! most of the budget step's time. So each worker holds, per ledger it uses, one hold in the
//! shared ledger (a *lease*) and admits, settles and releases the requests that fit it in its own
//! memory, with no shared-data call. On the worker's tick (or when a request does not fit) one
//! compare-and-swap renews the lease: it charges what the lease's requests used (each charge in
//! the window bucket it was settled in, so it rolls off to the second as if written at once),
//! drops the old hold and takes a new one covering what is still in flight plus room sized from
//! the worker's recent demand.
//!
//! The bound is per-request mode's: every admitted request is covered by a hold in the ledger
//! (the lease's hold covers admitted + used, and a renewal never holds less than what is in
//! flight), so `spent + held ≤ cap + settle errors` at every instant. A request the lease cannot
//! cover renews the lease with that request in it, checked against the ledger exactly as a
//! per-request reserve is, after this worker's own use was charged, so a refusal's `Retry-After`
//! comes from the ledger's own schedule. What a worker loses if it stops without reporting is its
//! unreported use, at most one lease.
//!
//! Near the cap a renewal leases no room (a share of what is free would not hold one more
//! request like the last ones): the lease is then *exact*, every request that ends on it renews
//! it at once, and the ledger sees each charge and freed hold as per-request mode shows it, so
//! a lease never keeps other workers from room that per-request mode would let them have for
//! longer than a renewal's tick.
//!
//! Further from the cap, other workers' leases may hold room a request needs although what is
//! spent leaves room for it (`spent + bound ≤ cap < spent + held + bound`). Such a refusal
//! *asks for room back* ([`Renewal::reclaim`]): it marks the ledger for [`GIVE_BACK_MS`] (a
//! shared-data key of its own, `<ledger>|give-back`), and while the mark is live every renewal
//! leases no room, so each worker's next tick gives its unused room back to the ledger. The
//! filter holds such a request and tries it again on its worker's ticks, a bounded wait.

use super::admit::{LedgerKey, LedgerStore};
use super::gauge::Reading;
use super::lease::{unlimited_where_uncapped, Account};
use super::ledger::{Caps, Hold, Ledger, Shape, Wait};
use super::ratelimit::Seen;
use super::shared::{reading, SharedError, SharedLedger, SharedLedgers};
use super::window::Amount;
use crate::shared_data::SharedData;
use std::rc::Rc;

/// A renewal leases at most this share of the room left free after it, so the other workers
/// (and requests that do not fit a lease) keep the rest, and leases shrink near the cap.
pub const FREE_SHARE: u64 = 4;
/// A renewal leases room for this many times the bounds the worker admitted since the last one:
/// enough for the next tick's traffic, growing threefold per renewal in a burst.
pub const DEMAND_FACTOR: u64 = 2;
/// How long a refusal that asked for room back keeps every renewal of its ledger from leasing
/// room: longer than the filter's wait for it, so every worker's tick gives its room back.
pub const GIVE_BACK_MS: u64 = 1000;

/// One worker's lease on one ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerLease {
    /// The lease's hold in the shared ledger (`None`: no lease).
    hold: Option<Hold>,
    /// Its room, in flight and unreported use (the granted room is the hold's amount, but for
    /// the unsafe control, [`Leases::unsafe_unheld`], whose room is not in the hold).
    account: Account,
    /// When the hold was taken: a hold expires at the hold TTL, so the lease stops admitting
    /// half a TTL after its last renewal (renewals come every tick, long before).
    renewed_ms: u64,
    /// The unreported use by window bucket of its settle: (window bucket, time of its latest
    /// settle, amount); charged to those buckets at the renewal.
    used: Vec<(u64, u64, Amount)>,
    /// Σ bounds admitted since the last renewal: the next lease's size.
    demand: Amount,
    /// The largest bound admitted since the last renewal, per dimension: room smaller than
    /// that is not leased (it would admit nothing).
    largest: Amount,
    /// The last renewal leased no room: requests that end renew at once ([`Leases::end`]).
    exact: bool,
    /// The ledger as the last renewal left it, less this lease's hold.
    view: View,
}

/// A ledger as a renewal left it, less the renewing lease's own hold: what the rest of the
/// gateway spends and holds there (for the rate-limit headers, with no ledger read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct View {
    spent: Amount,
    others_held: Amount,
    spent_quiet_at: u64,
}

/// What a renewal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// A request of this bound did not fit the lease: admit it in the renewed one, or refuse.
    Admit(Amount),
    /// The tick: report, and lease again for what the last period admitted.
    Renew,
    /// The worker stops: report, and hold only what is still in flight.
    Close,
}

/// What one renewal did to the ledger, computed inside its compare-and-swap (which may run it
/// more than once) and applied to the lease once the write landed ([`WorkerLease::renewed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewal {
    hold: Option<Hold>,
    granted: Amount,
    admitted: Option<Amount>,
    exact: bool,
    now_ms: u64,
    /// `Ask::Admit` refused: how long until the request would fit.
    pub refused: Option<Wait>,
    /// Refused although what is spent alone would admit it: holds (other workers' leased room,
    /// requests in flight) are in the way, and other workers should give their room back.
    pub reclaim: bool,
    view: View,
    /// The ledger as the renewal left it (its gauges).
    pub reading: Reading,
}

/// Leased room per capped dimension: a share of what is free, at most `factor × demand`, and
/// none when that is less than the `largest` bound lately admitted (it would admit nothing, and
/// only keep the room from other workers).
fn extra(cap: Option<u64>, used: u64, demand: u64, largest: u64) -> u64 {
    cap.map_or(0, |c| {
        let x = (c.saturating_sub(used) / FREE_SHARE).min(demand.saturating_mul(DEMAND_FACTOR));
        if x < largest {
            0
        } else {
            x
        }
    })
}

fn max(a: Amount, b: Amount) -> Amount {
    Amount::new(a.tokens.max(b.tokens), a.pico.max(b.pico))
}

impl WorkerLease {
    /// The lease's hold in the ledger, if any.
    pub fn hold(&self) -> Option<Hold> {
        self.hold
    }

    /// Σ bounds of the requests in flight on the lease.
    pub fn admitted(&self) -> Amount {
        self.account.admitted
    }

    /// Charges settled on the lease that the ledger does not have yet.
    pub fn unreported(&self) -> Amount {
        self.account.used
    }

    /// The last renewal leased no room: a request that ends should renew the lease at once.
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// Nothing held, in flight or unreported: the lease can be forgotten.
    pub fn is_idle(&self) -> bool {
        self.hold.is_none() && self.account.is_settled()
    }

    /// Admits a request of bound `b` on the lease if its hold has room for it beside what is in
    /// flight and used.
    pub fn try_admit(&mut self, b: Amount, now_ms: u64, hold_ttl_ms: u64) -> bool {
        let fits = now_ms < self.renewed_ms.saturating_add(hold_ttl_ms / 2) && self.account.fits(b);
        if fits {
            self.account.admit(b);
            self.demand = self.demand.plus(b);
            self.largest = max(self.largest, b);
        }
        fits
    }

    /// Takes back an admission of bound `b` (another of the request's ledgers refused it).
    pub fn unadmit(&mut self, b: Amount) {
        self.account.end(b, Amount::ZERO);
        self.demand = self.demand.minus(b);
    }

    /// A request of bound `b` admitted on the lease ended, charged `actual` (zero: released) at
    /// `at_ms`, a time in window bucket `bucket`.
    pub fn end(&mut self, b: Amount, actual: Amount, bucket: u64, at_ms: u64) {
        self.account.end(b, actual);
        if actual.is_zero() {
            return;
        }
        match self.used.last_mut() {
            Some((k, t, a)) if *k == bucket => {
                *a = a.plus(actual);
                *t = (*t).max(at_ms);
            }
            _ => self.used.push((bucket, at_ms, actual)),
        }
    }

    /// The renewal, on the ledger `l` (inside its compare-and-swap): the old hold goes, the
    /// unreported use is charged to the buckets it was settled in, what is in flight is held
    /// again whatever the caps say (the old hold covered it), then `ask`'s request is checked as
    /// a per-request reserve would be, and room for the next period is leased. `hold_room`
    /// false is the unsafe control ([`Leases::unsafe_unheld`]): all the free room is granted,
    /// none of it held. `give_back()`: another worker asked for room back (the ledger's mark is
    /// live), and no room is leased; asked only when room would be (near the cap none is, and
    /// the mark costs no read).
    #[allow(clippy::too_many_arguments)]
    pub fn renew(
        &self,
        l: &mut Ledger,
        shape: &Shape,
        caps: &Caps,
        now_ms: u64,
        ask: Ask,
        hold_room: bool,
        give_back: impl Fn() -> bool,
    ) -> Renewal {
        if let Some(h) = &self.hold {
            l.release(shape, h, now_ms);
        }
        for &(_, t, a) in &self.used {
            l.charge_at(shape, t, a, now_ms);
        }
        // Both holds land in the held ring's newest bucket (same `now`): one hold of their sum.
        let mut held = self.account.admitted;
        let mut bucket = (!held.is_zero()).then(|| l.hold(shape, held, now_ms).bucket);
        let (admitted, refused) = match ask {
            Ask::Admit(b) => match l.check(shape, caps, b, now_ms) {
                Ok(()) => (Some(b), None),
                Err(w) => (None, Some(w)),
            },
            Ask::Renew | Ask::Close => (None, None),
        };
        let reclaim = match ask {
            Ask::Admit(b) => refused.is_some() && caps.admits(l.spent(shape, now_ms), b),
            Ask::Renew | Ask::Close => false,
        };
        let take = admitted.unwrap_or(Amount::ZERO);
        let room = if ask == Ask::Close || refused.is_some() {
            Amount::ZERO
        } else {
            let used = l
                .spent(shape, now_ms)
                .plus(l.held(shape, now_ms))
                .plus(take);
            let demand = self.demand.plus(take);
            let largest = max(self.largest, take);
            if hold_room {
                Amount::new(
                    extra(caps.tokens, used.tokens, demand.tokens, largest.tokens),
                    extra(caps.pico, used.pico, demand.pico, largest.pico),
                )
            } else {
                // The unsafe control: all of the free room, as if no other worker leased any.
                let free = |cap: Option<u64>, used: u64| cap.map_or(0, |c| c.saturating_sub(used));
                Amount::new(free(caps.tokens, used.tokens), free(caps.pico, used.pico))
            }
        };
        let room = if room.is_zero() || !give_back() {
            room
        } else {
            Amount::ZERO
        };
        let view = View {
            spent: l.spent(shape, now_ms),
            others_held: l.held(shape, now_ms).minus(held),
            spent_quiet_at: l.spent_quiet_at(shape, now_ms),
        };
        let granted = unlimited_where_uncapped(caps, held.plus(take).plus(room));
        let more = if hold_room { take.plus(room) } else { take };
        if !more.is_zero() {
            bucket = Some(l.hold(shape, more, now_ms).bucket);
            held = held.plus(more);
        }
        Renewal {
            hold: bucket.map(|bucket| Hold {
                bucket,
                amount: held,
            }),
            granted,
            admitted,
            exact: room.is_zero(),
            now_ms,
            refused,
            reclaim,
            view,
            reading: reading(l, shape, now_ms),
        }
    }

    /// The renewal's write landed: the lease is what it says.
    pub fn renewed(&mut self, r: &Renewal) {
        self.hold = r.hold;
        let reported = self.account.used;
        self.account.renewed(reported, r.granted);
        self.renewed_ms = r.now_ms;
        self.used.clear();
        self.demand = Amount::ZERO;
        self.largest = Amount::ZERO;
        self.exact = r.exact;
        self.view = r.view;
        if let Some(b) = r.admitted {
            self.account.admit(b);
        }
    }
}

/// A lease and the ledger it is on.
#[derive(Debug, Clone)]
struct Leased {
    key: LedgerKey,
    shape: Shape,
    caps: Caps,
    lease: WorkerLease,
}

/// One worker's leases, by the shared-data key of their ledger.
#[derive(Debug, Default)]
pub struct Leases {
    by_ledger: fnv::FnvHashMap<Rc<str>, Leased>,
    /// See [`Leases::unsafe_unheld`].
    unheld: bool,
}

/// What a tick's renewals did.
#[derive(Debug, Default)]
pub struct Report {
    /// Per ledger renewed: its key, shared-data key and state after the renewal (its gauges).
    pub readings: Vec<(LedgerKey, Rc<str>, Reading)>,
    /// Renewals that could not be written: the lease stays as it was and the next tick tries
    /// again (its hold is valid for half a TTL after its last renewal).
    pub failed: Vec<SharedError>,
}

impl Leases {
    /// UNSAFE, tests only (`budgets.unsafe_worker_leases_unheld`): leases granted all of the
    /// free room and not holding it in the ledger (only what is in flight is held; what they
    /// charged is not until reported), so every worker admits on room the others also see as
    /// free.
    /// The control that shows the hold is what keeps the bound: the same traffic overshoots.
    pub fn unsafe_unheld() -> Leases {
        Leases {
            unheld: true,
            ..Leases::default()
        }
    }

    /// The lease on the ledger under shared-data key `ledger`.
    pub fn get(&self, ledger: &str) -> Option<&WorkerLease> {
        self.by_ledger.get(ledger).map(|l| &l.lease)
    }

    pub fn len(&self) -> usize {
        self.by_ledger.len()
    }

    /// The ledger under `ledger` as this worker sees it now: as its lease's last renewal left
    /// it, plus what the lease has in flight and charged since (no shared-data call).
    pub fn seen(&self, ledger: &str, now_ms: u64) -> Option<Seen> {
        let l = self.by_ledger.get(ledger)?;
        let (lease, window_ms) = (&l.lease, l.shape.window.lifetime_ms);
        let own_latest = lease.used.iter().map(|&(_, t, _)| t).max();
        let quiet = own_latest.map_or(lease.view.spent_quiet_at, |t| {
            lease.view.spent_quiet_at.max(t.saturating_add(window_ms))
        });
        Some(Seen {
            caps: l.caps,
            spent: lease.view.spent.plus(lease.account.used),
            held: lease.view.others_held.plus(lease.account.admitted),
            reset_ms: quiet.saturating_sub(now_ms),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.by_ledger.is_empty()
    }

    /// A request of bound `b` admitted on the lease of `ledger` ended, charged `actual` at
    /// `now_ms` (zero: released). In memory only: the tick reports it. `true`: the lease is
    /// exact (no room leased, near the cap) and should be renewed now ([`Leases::renew_now`]).
    pub fn end(&mut self, ledger: &str, b: Amount, actual: Amount, now_ms: u64) -> bool {
        let Some(l) = self.by_ledger.get_mut(ledger) else {
            return false;
        };
        let bucket = l.shape.window.bucket(now_ms);
        l.lease.end(b, actual, bucket, now_ms);
        l.lease.is_exact()
    }

    /// Renews the lease of `ledger` now (an exact lease after a request ended on it), as the
    /// tick would; `keep` as for [`Leases::report`].
    pub fn renew_now<S: SharedData>(
        &mut self,
        data: &S,
        ledger: &str,
        now_ms: u64,
        keep: impl FnOnce(&LedgerKey, &str) -> bool,
    ) -> Report {
        let mut out = Report::default();
        let Some((name, mut e)) = self.by_ledger.remove_entry(ledger) else {
            return out;
        };
        if e.lease.is_idle() || !keep(&e.key, &name) {
            return out;
        }
        let hold_room = !self.unheld;
        if renew_one(data, &name, &mut e, now_ms, Ask::Renew, hold_room, &mut out) {
            self.by_ledger.insert(name, e);
        }
        out
    }

    /// Renews every lease in one compare-and-swap each (`close`: the worker stops, and only what
    /// is in flight stays held); forgets the leases left idle. `keep(key, ledger)` false: the
    /// ledger is no longer this lease's (a team's slot went to another team), and the lease is
    /// dropped without touching it (its hold expires at the TTL; its unreported use is lost, as a
    /// request outliving its hold is).
    pub fn report<S: SharedData>(
        &mut self,
        data: &S,
        now_ms: u64,
        close: bool,
        mut keep: impl FnMut(&LedgerKey, &str) -> bool,
    ) -> Report {
        let ask = if close { Ask::Close } else { Ask::Renew };
        let mut out = Report::default();
        let hold_room = !self.unheld;
        self.by_ledger.retain(|name, e| {
            !e.lease.is_idle()
                && keep(&e.key, name)
                && renew_one(data, name, e, now_ms, ask, hold_room, &mut out)
        });
        out
    }
}

/// Renews one lease (one compare-and-swap), recording what it did in `out`. `false`: the lease
/// is left with nothing and can be forgotten. A renewal that could not be written leaves the
/// lease as it was, for the next tick.
fn renew_one<S: SharedData>(
    data: &S,
    name: &Rc<str>,
    e: &mut Leased,
    now_ms: u64,
    ask: Ask,
    hold_room: bool,
    out: &mut Report,
) -> bool {
    let (shape, caps) = (e.shape, e.caps);
    let store = SharedLedgers {
        data,
        ledger: |_: &LedgerKey| {
            Some(SharedLedger {
                key: name,
                shape,
                caps,
            })
        },
        now_ms,
    };
    let lease = &e.lease;
    let give_back = || giving_back(data, name, now_ms);
    match store.update(&e.key, |l, shape, caps, now| {
        lease.renew(l, shape, caps, now, ask, hold_room, give_back)
    }) {
        Ok(r) => {
            e.lease.renewed(&r);
            out.readings.push((e.key.clone(), name.clone(), r.reading));
            !e.lease.is_idle()
        }
        Err(err) => {
            out.failed.push(err);
            true
        }
    }
}

/// A [`LedgerStore`] that admits on this worker's leases: a request that fits a lease costs no
/// shared-data call; one that does not renews that lease with the request in it (one
/// compare-and-swap, checked as a per-request reserve). The [`Hold`] an admission returns names
/// no bucket of the ledger: the request is settled on the lease ([`Leases::end`]), and a
/// `release` here gives its room back to the lease (all or nothing across a request's ledgers).
pub struct LeasedLedgers<'a, 'l, S: SharedData, F> {
    pub shared: SharedLedgers<'a, S, F>,
    pub leases: &'l mut Leases,
    /// The ledgers renewed on the way, as each renewal left them (their gauges).
    pub readings: Vec<(LedgerKey, Reading)>,
    /// A refusal asked for room back ([`Renewal::reclaim`]): the request would fit once other
    /// workers' ticks give their leased room back, so it may wait for them.
    pub reclaimed: bool,
}

impl<'k, S: SharedData, F: Fn(&LedgerKey) -> Option<SharedLedger<'k>>> LedgerStore
    for LeasedLedgers<'_, '_, S, F>
{
    type Error = SharedError;

    fn reserve(
        &mut self,
        key: &LedgerKey,
        amount: Amount,
    ) -> Result<Result<Hold, Wait>, SharedError> {
        let l =
            (self.shared.ledger)(key).ok_or_else(|| SharedError::Missing(format!("{key:?}")))?;
        let now = self.shared.now_ms;
        let on_lease = Hold { bucket: 0, amount };
        if let Some(e) = self.leases.by_ledger.get_mut(l.key) {
            if e.lease.try_admit(amount, now, l.shape.hold.lifetime_ms) {
                return Ok(Ok(on_lease));
            }
        }
        let hold_room = !self.leases.unheld;
        let e = self
            .leases
            .by_ledger
            .entry(Rc::from(l.key))
            .or_insert_with(|| Leased {
                key: key.clone(),
                shape: l.shape,
                caps: l.caps,
                lease: WorkerLease::default(),
            });
        let lease = &e.lease;
        let data = self.shared.data;
        let give_back = || giving_back(data, l.key, now);
        let r = self.shared.update(key, |ledger, shape, caps, now| {
            let ask = Ask::Admit(amount);
            lease.renew(ledger, shape, caps, now, ask, hold_room, give_back)
        })?;
        e.lease.renewed(&r);
        self.readings.push((key.clone(), r.reading));
        if r.reclaim {
            ask_back(self.shared.data, l.key, now);
            self.reclaimed = true;
        }
        Ok(match r.refused {
            None => Ok(on_lease),
            Some(w) => Err(w),
        })
    }

    fn release(&mut self, key: &LedgerKey, hold: &Hold) -> Result<(), SharedError> {
        let l =
            (self.shared.ledger)(key).ok_or_else(|| SharedError::Missing(format!("{key:?}")))?;
        if let Some(e) = self.leases.by_ledger.get_mut(l.key) {
            e.lease.unadmit(hold.amount);
        }
        Ok(())
    }

    fn check(&mut self, key: &LedgerKey, amount: Amount) -> Result<Result<(), Wait>, SharedError> {
        self.shared.check(key, amount)
    }
}

/// The shared-data key of ledger `ledger`'s give-back mark: until when (ms, u64 little-endian)
/// renewals of that ledger lease no room.
pub fn give_back_key(ledger: &str) -> String {
    let mut k = String::with_capacity(ledger.len() + 10);
    k.push_str(ledger);
    k.push_str("|give-back");
    k
}

/// Whether a refusal asked for the room leased on `ledger` back and the mark is still live. A
/// mark that cannot be read is taken as absent: leasing room is what renewals do anyway.
fn giving_back<S: SharedData>(data: &S, ledger: &str, now_ms: u64) -> bool {
    match data.get(&give_back_key(ledger)) {
        Ok(Some((b, _))) => {
            <[u8; 8]>::try_from(b.as_slice()).is_ok_and(|until| u64::from_le_bytes(until) > now_ms)
        }
        _ => false,
    }
}

/// Marks `ledger` so that renewals lease no room for [`GIVE_BACK_MS`]. Written unconditionally
/// (every writer writes about the same time); best effort: without it the room still comes back
/// at the other workers' next quiet tick.
fn ask_back<S: SharedData>(data: &S, ledger: &str, now_ms: u64) {
    let until = now_ms.saturating_add(GIVE_BACK_MS);
    let _ = data.set(&give_back_key(ledger), &until.to_le_bytes(), None);
}

#[cfg(test)]
mod tests;
