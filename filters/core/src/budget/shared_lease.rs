//! Lease mode of the shared ledger (`budgets.service.lease`, docs/budgets.md "Lease mode"): a
//! gateway holds one reservation in Redis per ledger — its lease — and admits requests against
//! it locally, by compare-and-swap on shared data, with no callout on the request path. The
//! root's tick reports what the lease's requests used and takes a new lease in one script call
//! (`lease` in ledger.lua), so every admission stays covered by a hold in Redis: the bound of
//! per-request mode holds, except for a crashed gateway's unreported use (at most its lease).
//! A request no lease of its gateway can admit reserves on its own; room other leases hold and
//! do not use is given back when only holds refuse it (`reclaim` in ledger.lua, waited for by
//! the service up to [`super::lease_config::Lease::reserve_wait_ms`]).
//!
//! The lease state lives in shared data (one key per ledger), so every worker of the Envoy
//! admits against the same lease; one worker at a time reports it (the `reporting` deadline
//! taken by CAS). While a report is out, or its outcome is unknown (no answer: the script may
//! have run), the lease admits nothing and requests reserve per request: a report that ran
//! replaced the old hold by one of at least the `admitted` it was sent with, so only the
//! requests admitted before it are sure to be covered. The report is then sent again as it was
//! (same ids and amounts): the script recognises a report it already applied by its new id.

use super::lease::Account;
use super::lease_config::Lease;
use super::ledger::Caps;
use super::shared::SharedError;
use super::window::Amount;
use crate::shared_data::{compare_and_swap, SharedData, Swap};

/// A lease without admissions for this many report periods shrinks to its requests in flight
/// (and goes when they are done): it holds room other gateways could use.
pub const IDLE_REPORTS: u64 = 10;
pub use crate::config::budgets::{LeaseConfig, DEFAULT_REPORT_MS};

/// The size of a new lease, per dimension: `min(max, free / (2 × leaseholders))`, at least
/// `admitted` (the requests already admitted on the lease, which the new hold must cover).
/// `taken` = spent + held on the ledger once the old lease's hold is dropped and its use
/// charged; `holders` counts the live leases on the ledger including this one. A dimension
/// without a cap gets `max`. `unheld` (test-only) takes all the free room, not a share.
pub fn grant(
    caps: &Caps,
    taken: Amount,
    max: Amount,
    admitted: Amount,
    holders: u64,
    unheld: bool,
) -> Amount {
    let share = if unheld {
        1
    } else {
        holders.max(1).saturating_mul(2)
    };
    let dim = |cap: Option<u64>, taken: u64, max: u64, admitted: u64| {
        let chunk = match cap {
            Some(c) => max.min(c.saturating_sub(taken) / share),
            None => max,
        };
        chunk.max(admitted)
    };
    Amount::new(
        dim(caps.tokens, taken.tokens, max.tokens, admitted.tokens),
        dim(caps.pico, taken.pico, max.pico, admitted.pico),
    )
}

/// A report sent whose answer has not been applied: resent as it is until one is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pending {
    /// The id of the lease the report takes.
    pub new_id: String,
    /// What it charges (the `used` of the lease when it was sent).
    pub used: Amount,
    /// The `admitted` it was sent with: the new hold covers at least this.
    pub admitted: Amount,
    /// The most the new lease may take (zero: release, keeping only `admitted`).
    pub max: Amount,
    pub sent_ms: u64,
}

/// One ledger's lease, as every worker of the gateway sees it (shared data).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseState {
    /// The team whose ledger this lease is on (a team-lease slot, `super::lease_slots`); empty
    /// for a router or rule budget's lease, and for a free slot. Admission checks it in the
    /// same compare-and-swap that admits, and a report names it, so a slot's lease only ever
    /// admits and charges its own team.
    pub team: String,
    /// The lease's reservation id in Redis; empty: no lease.
    pub id: String,
    /// Its room, in flight and unreported use.
    pub account: Account,
    /// When the lease's hold expires in Redis (the report's send time + hold TTL, local clock;
    /// the script set it later, so this is early, never late).
    pub hold_expires_ms: u64,
    /// The last report's send time.
    pub reported_ms: u64,
    /// A request found no room on the lease (or no lease) and reserved on its own: the next
    /// report asks for room.
    pub wanted: bool,
    /// A request was admitted since the last report.
    pub active: bool,
    /// When a request was last admitted on the lease.
    pub last_admit_ms: u64,
    /// A worker's report is out until then (0: none).
    pub reporting_until_ms: u64,
    pub pending: Option<Pending>,
}

/// Layout 2 adds the team; layout 1 (written before team leases) is read as team "".
const LAYOUT: u8 = 2;
const LAYOUT_1: u8 = 1;
/// Longest lease id kept (the wire's reservation id limit).
const MAX_ID: usize = super::protocol::MAX_RESERVATION_ID;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt;

fn put_amount(out: &mut Vec<u8>, a: Amount) {
    out.extend_from_slice(&a.tokens.to_le_bytes());
    out.extend_from_slice(&a.pico.to_le_bytes());
}

fn put_id(out: &mut Vec<u8>, id: &str) {
    put_str(out, id, MAX_ID);
}

/// A string of at most `max` (≤ 255) bytes, after its length byte. Ids and team keys are
/// ASCII (checked where they are made), so the cut never splits a character.
fn put_str(out: &mut Vec<u8>, v: &str, max: usize) {
    let b = &v.as_bytes()[..v.len().min(max).min(255)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], Corrupt> {
        if self.0.len() < n {
            return Err(Corrupt);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, Corrupt> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn amount(&mut self) -> Result<Amount, Corrupt> {
        Ok(Amount::new(self.u64()?, self.u64()?))
    }
    fn id(&mut self) -> Result<String, Corrupt> {
        let n = self.take(1)?[0] as usize;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| Corrupt)
    }
}

impl LeaseState {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(200);
        out.push(LAYOUT);
        let flags = u8::from(self.wanted)
            | (u8::from(self.active) << 1)
            | (u8::from(self.pending.is_some()) << 2);
        out.push(flags);
        put_str(&mut out, &self.team, super::admit::MAX_TEAM_KEY);
        put_id(&mut out, &self.id);
        let a = &self.account;
        for v in [a.granted, a.admitted, a.used] {
            put_amount(&mut out, v);
        }
        for v in [
            self.hold_expires_ms,
            self.reported_ms,
            self.reporting_until_ms,
            self.last_admit_ms,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(p) = &self.pending {
            put_id(&mut out, &p.new_id);
            put_amount(&mut out, p.used);
            put_amount(&mut out, p.admitted);
            put_amount(&mut out, p.max);
            out.extend_from_slice(&p.sent_ms.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<LeaseState, Corrupt> {
        let mut r = Reader(bytes);
        let layout = r.take(1)?[0];
        if layout != LAYOUT && layout != LAYOUT_1 {
            return Err(Corrupt);
        }
        let flags = r.take(1)?[0];
        let team = if layout == LAYOUT {
            r.id()?
        } else {
            String::new()
        };
        let mut s = LeaseState {
            team,
            id: r.id()?,
            account: Account {
                granted: r.amount()?,
                admitted: r.amount()?,
                used: r.amount()?,
            },
            hold_expires_ms: r.u64()?,
            reported_ms: r.u64()?,
            reporting_until_ms: r.u64()?,
            last_admit_ms: r.u64()?,
            wanted: flags & 1 != 0,
            active: flags & 2 != 0,
            pending: None,
        };
        if flags & 4 != 0 {
            s.pending = Some(Pending {
                new_id: r.id()?,
                used: r.amount()?,
                admitted: r.amount()?,
                max: r.amount()?,
                sent_ms: r.u64()?,
            });
        }
        if !r.0.is_empty() {
            return Err(Corrupt);
        }
        Ok(s)
    }

    /// Nothing on the lease: no hold, no report out or in doubt, nothing admitted, used or
    /// wanted. Only such a team-lease slot may change teams: nothing of the old team's is in it.
    pub fn is_blank(&self) -> bool {
        self.id.is_empty()
            && self.pending.is_none()
            && self.reporting_until_ms == 0
            && self.account.is_settled()
            && !self.wanted
    }

    /// Whether a request of bound `b` may be admitted on this lease at `now`: there is a
    /// lease, no report of it is out or in doubt, its hold outlives `now` by `margin_ms` (a
    /// request admitted now must settle before the hold goes), and `b` fits its room.
    pub fn fits(&self, b: Amount, now_ms: u64, margin_ms: u64) -> bool {
        !self.id.is_empty()
            && self.pending.is_none()
            && now_ms >= self.reporting_until_ms
            && now_ms.saturating_add(margin_ms) < self.hold_expires_ms
            && self.account.fits(b)
    }

    pub fn admit(&mut self, b: Amount, now_ms: u64) {
        self.account.admit(b);
        self.active = true;
        self.last_admit_ms = now_ms;
    }

    /// The report due at `now`, if any, with `new_id` as the next lease's id (used only when a
    /// new report starts; a report in doubt is resent with its own). `max`: the most a lease of
    /// this ledger takes.
    pub fn due(
        &self,
        now_ms: u64,
        lease: &Lease,
        max: Amount,
        hold_ttl_ms: u64,
        new_id: &str,
    ) -> Option<Pending> {
        if now_ms < self.reporting_until_ms {
            return None;
        }
        if let Some(p) = &self.pending {
            return Some(p.clone());
        }
        let report = |max: Amount| {
            Some(Pending {
                new_id: new_id.to_string(),
                used: self.account.used,
                admitted: self.account.admitted,
                max,
                sent_ms: now_ms,
            })
        };
        if self.id.is_empty() {
            return match (self.wanted, self.account.used.is_zero()) {
                (true, _) => report(max),
                (false, false) => report(Amount::ZERO),
                (false, true) => None,
            };
        }
        if now_ms < self.reported_ms.saturating_add(lease.report_ms) {
            return None;
        }
        if self.active || self.wanted {
            return report(max);
        }
        let renew_at = self.hold_expires_ms.saturating_sub(hold_ttl_ms / 2);
        let quiet_since = self.last_admit_ms;
        if now_ms < quiet_since.saturating_add(IDLE_REPORTS.saturating_mul(lease.report_ms)) {
            // A pause in the traffic keeps the lease (requests after it find it there); only
            // use is reported, or the hold renewed when half its TTL is gone.
            return (!self.account.used.is_zero() || now_ms >= renew_at)
                .then(|| report(max))
                .flatten();
        }
        // Idle for a while: shrink the lease to its requests in flight (nothing, once
        // they are done), unless it is that already and its hold is far from expiry.
        let a = &self.account;
        if a.used.is_zero() && a.granted == a.admitted && now_ms < renew_at {
            return None;
        }
        report(Amount::ZERO)
    }

    /// The release of this lease when the gateway stops: its use charged and nothing more
    /// held than its requests in flight. `None` when there is no lease and nothing to report,
    /// or another worker's report is out.
    pub fn release_due(&self, now_ms: u64, new_id: &str) -> Option<Pending> {
        if now_ms < self.reporting_until_ms
            || (self.id.is_empty() && self.account.used.is_zero() && self.pending.is_none())
        {
            return None;
        }
        // A report in doubt goes as it was (it may have been applied); the next tick, if any,
        // releases after it.
        if let Some(p) = &self.pending {
            return Some(p.clone());
        }
        Some(Pending {
            new_id: new_id.to_string(),
            used: self.account.used,
            admitted: self.account.admitted,
            max: Amount::ZERO,
            sent_ms: now_ms,
        })
    }

    /// Marks `report` as out until `until_ms` (the call's timeout past now); the flags it
    /// consumed start again.
    pub fn start(&mut self, report: Pending, until_ms: u64) {
        self.pending = Some(report);
        self.reporting_until_ms = until_ms;
        if self.wanted {
            // Demand counts as use: a lease taken for it is not idle before it could be used.
            self.last_admit_ms = self.pending.as_ref().map_or(0, |p| p.sent_ms);
        }
        self.wanted = false;
        self.active = false;
    }

    /// The script answered `report` with a lease of `granted` under `report.new_id` (zero: no
    /// lease, nothing held). A stale answer (another report was applied since) changes nothing.
    pub fn applied(&mut self, report: &Pending, granted: Amount, hold_ttl_ms: u64) -> bool {
        if self.pending.as_ref() != Some(report) {
            return false;
        }
        self.account.renewed(report.used, granted);
        self.id = if granted.is_zero() {
            String::new()
        } else {
            report.new_id.clone()
        };
        self.hold_expires_ms = report.sent_ms.saturating_add(hold_ttl_ms);
        self.reported_ms = report.sent_ms;
        self.pending = None;
        self.reporting_until_ms = 0;
        if self.is_blank() {
            // Released with nothing left (an idle team's lease): the slot is free for any
            // team (`lease_slots`).
            self.team.clear();
        }
        true
    }

    /// The report got no usable answer. `in_doubt`: the script may have run (no answer, a 5xx),
    /// so the report stays pending and is resent as it is; otherwise (never sent, or refused
    /// as malformed) it is dropped and the lease goes on as before the report.
    pub fn failed(&mut self, report: &Pending, in_doubt: bool) {
        if self.pending.as_ref() != Some(report) {
            return;
        }
        self.reporting_until_ms = 0;
        if !in_doubt {
            self.pending = None;
            self.wanted = true;
        }
    }
}

/// `POST /v1/lease`.
pub const LEASE_PATH: &str = "/v1/lease";

/// The body of `report` on the lease of budget `budget` (for a team budget, on `team`'s ledger:
/// the slot's team, never empty there), replacing lease `old` (empty: none).
pub fn lease_body(
    router: &str,
    c: &super::compiled::CompiledBudgets,
    budget: usize,
    team: &str,
    old: &str,
    report: &Pending,
    unheld: bool,
) -> Option<Vec<u8>> {
    use super::protocol::{AmountJson, LeaseRequest};
    let team = (!team.is_empty()).then(|| team.to_string());
    let is_team = team.is_some();
    let key = super::admit::LedgerKey { budget, team };
    let ledger = super::remote::ledger_refs(c, std::slice::from_ref(&key)).pop()?;
    let req = LeaseRequest {
        router: router.to_string(),
        ledger,
        old: (!old.is_empty()).then(|| old.to_string()),
        id: report.new_id.clone(),
        used: AmountJson::from_amount(report.used),
        admitted: AmountJson::from_amount(report.admitted),
        max: AmountJson::from_amount(report.max),
        ttl_s: Some(c.hold_ttl_s),
        // The service's bound on a team budget's teams, as a reserve sends it.
        max_teams: is_team.then_some(c.max_teams as u64),
        unsafe_unheld: unheld,
    };
    serde_json::to_vec(&req).ok()
}

/// Why a lease report got no usable answer, and whether it may have been applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFailed {
    pub why: String,
    /// No answer or a 5xx: the script may have run; resend the report as it is.
    pub in_doubt: bool,
}

/// Reads a lease report's answer: the granted size and the ledger after it.
pub fn read_lease(
    status: u32,
    body: &[u8],
) -> Result<(Amount, super::protocol::LedgerState), ReportFailed> {
    let fail = |why: String, in_doubt| Err(ReportFailed { why, in_doubt });
    match status {
        0 => fail(
            "no answer from llmkube-budgets (timed out or unreachable)".into(),
            true,
        ),
        200 => match serde_json::from_slice::<super::protocol::LeaseResponse>(body) {
            Ok(r) => match r.granted.parse() {
                Ok(g) => Ok((g, r.ledger)),
                Err(e) => fail(
                    format!("llmkube-budgets granted an unreadable lease: {e}"),
                    true,
                ),
            },
            // The service answered but this code cannot read it: the report ran or not; treat
            // it as in doubt (a resend is applied once).
            Err(_) => fail(
                "llmkube-budgets answered 200 with an unreadable lease".into(),
                true,
            ),
        },
        s => fail(
            format!("llmkube-budgets answered {s} to a lease report"),
            s >= 500,
        ),
    }
}

/// Reads, changes and compare-and-swaps the lease under `key`; `change` answers whether it
/// changed the state (nothing is written otherwise) and a value. A missing key is a new
/// (empty) lease, created by the first write: lease keys are created at configuration, so
/// this is only a fallback.
pub fn update<S: SharedData, T>(
    data: &S,
    key: &str,
    mut change: impl FnMut(&mut LeaseState) -> (bool, T),
) -> Result<T, SharedError> {
    compare_and_swap(data, key, None, |value| {
        let mut state = match value {
            Some(bytes) if !bytes.is_empty() => {
                LeaseState::decode(&bytes).map_err(|_| SharedError::Corrupt(key.to_string()))?
            }
            _ => LeaseState::default(),
        };
        let (changed, out) = change(&mut state);
        Ok(if changed {
            Swap::Write(state.encode(), out)
        } else {
            Swap::Keep(out)
        })
    })
    .map_err(|e| SharedError::from_cas(key, e))
}

/// What [`admit_all`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Admitted on every lease.
    Admitted,
    /// Some lease had no room (those without are marked `wanted`): reserve per request.
    NoRoom,
    /// The lease of `keys[i]` is another team's (the caller's idea of the team's slot is
    /// stale): reserve per request, and find the slot again.
    Taken(usize),
}

/// Admits a request of bound `b` on the leases under `keys` (one per ledger of the request:
/// the shared-data key and the team the lease must be on, "" for a router or rule budget),
/// all or nothing: each lease with room takes `admitted += b`; when one has none, those taken
/// are given back and every lease without room is marked `wanted`. A free team-lease slot
/// (blank, no team) is bound to the request's team in the same compare-and-swap (the claim:
/// `lease_slots`); it has no lease yet, so the request reserves per request and the slot asks
/// for one.
pub fn admit_all<S: SharedData>(
    data: &S,
    keys: &[(&str, &str)],
    b: Amount,
    now_ms: u64,
    margin_ms: u64,
) -> Result<Admission, SharedError> {
    let mut taken = 0;
    let mut outcome = Admission::Admitted;
    for (i, (key, team)) in keys.iter().enumerate() {
        // After a refusal the rest are only visited to bind a free slot and mark those
        // without room wanted (a team's slot must ask for its lease even while the router's
        // lease has no room), never to admit.
        let admitting = outcome == Admission::Admitted;
        let ok = update(data, key, |s| {
            let mut changed = false;
            if s.team != *team {
                if team.is_empty() || !s.team.is_empty() || !s.is_blank() {
                    return (false, Admission::Taken(i));
                }
                s.team = team.to_string();
                changed = true;
            }
            let fits = s.fits(b, now_ms, margin_ms);
            if admitting && fits {
                s.admit(b, now_ms);
                (true, Admission::Admitted)
            } else {
                if !fits {
                    changed |= !s.wanted;
                    s.wanted = true;
                }
                (changed, Admission::NoRoom)
            }
        });
        match ok {
            Ok(Admission::Admitted) => taken += 1,
            // A stale slot is what the caller can act on: it wins over no room.
            Ok(t @ Admission::Taken(_)) if !matches!(outcome, Admission::Taken(_)) => outcome = t,
            Ok(other) => {
                if outcome == Admission::Admitted {
                    outcome = other;
                }
            }
            Err(e) => {
                undo(data, &keys[..taken], b);
                return Err(e);
            }
        }
    }
    if outcome != Admission::Admitted {
        undo(data, &keys[..taken], b);
    }
    Ok(outcome)
}

fn undo<S: SharedData>(data: &S, keys: &[(&str, &str)], b: Amount) {
    for (key, _) in keys {
        // A failed give-back keeps `b` counted as admitted: room lost until the lease shrinks,
        // never an admission past it.
        let _ = update(data, key, |s| {
            s.account.end(b, Amount::ZERO);
            (true, ())
        });
    }
}

/// A request admitted on the leases under `keys` with bound `b` ended, charged `actual`
/// (zero: released).
pub fn settle_all<S: SharedData>(
    data: &S,
    keys: &[&str],
    b: Amount,
    actual: Amount,
) -> Result<(), SharedError> {
    let mut first = Ok(());
    for key in keys {
        let r = update(data, key, |s| {
            s.account.end(b, actual);
            (true, ())
        });
        if first.is_ok() {
            first = r;
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::lease_config::{UNLIMITED_PICO, UNLIMITED_TOKENS};
    use crate::budget::test_store::Envoyish as Mem;

    fn lease(granted: u64) -> LeaseState {
        LeaseState {
            id: "g-1".into(),
            account: Account {
                granted: Amount::new(granted, granted * 10),
                ..Account::default()
            },
            hold_expires_ms: 10_000,
            ..LeaseState::default()
        }
    }

    fn put(m: &Mem, key: &str, s: &LeaseState) {
        m.set(key, &s.encode(), None).unwrap();
    }

    fn get(m: &Mem, key: &str) -> LeaseState {
        LeaseState::decode(&m.get(key).unwrap().unwrap().0).unwrap()
    }

    const CFG: Lease = Lease {
        max_tokens: Some(1000),
        max_pico: None,
        report_ms: 100,
        team_slots: 4,
        unheld: false,
    };

    #[test]
    fn admission_is_all_or_nothing_across_a_requests_leases() {
        let m = Mem::default();
        put(&m, "a", &lease(100));
        put(&m, "b", &lease(30));
        let b = Amount::new(20, 200);
        assert_eq!(
            admit_all(&m, &[("a", ""), ("b", "")], b, 0, 0),
            Ok(Admission::Admitted)
        );
        assert_eq!(get(&m, "a").account.admitted, b);
        assert_eq!(get(&m, "b").account.admitted, b);
        // b has 10 left: refused there, and a gives its admission back.
        assert_eq!(
            admit_all(&m, &[("a", ""), ("b", "")], b, 0, 0),
            Ok(Admission::NoRoom)
        );
        assert_eq!(get(&m, "a").account.admitted, b, "nothing stays taken on a");
        assert!(get(&m, "b").wanted, "the lease without room asks for more");
        assert!(!get(&m, "a").wanted);
        // The USD dimension counts too.
        assert_eq!(
            admit_all(&m, &[("a", "")], Amount::new(1, 801), 0, 0),
            Ok(Admission::NoRoom),
            "800 pico left on a"
        );
    }

    #[test]
    fn settle_and_release_move_admitted_to_used() {
        let m = Mem::default();
        put(&m, "a", &lease(100));
        let b = Amount::new(40, 400);
        assert_eq!(
            admit_all(&m, &[("a", "")], b, 0, 0),
            Ok(Admission::Admitted)
        );
        assert_eq!(
            admit_all(&m, &[("a", "")], b, 0, 0),
            Ok(Admission::Admitted)
        );
        assert_eq!(get(&m, "a").account.room(), Amount::new(20, 200));
        settle_all(&m, &["a"], b, Amount::new(15, 150)).unwrap();
        let s = get(&m, "a");
        assert_eq!(
            (s.account.admitted, s.account.used),
            (b, Amount::new(15, 150))
        );
        assert_eq!(s.account.room(), Amount::new(45, 450));
        settle_all(&m, &["a"], b, Amount::ZERO).unwrap();
        let s = get(&m, "a");
        assert_eq!(
            (s.account.admitted, s.account.used),
            (Amount::ZERO, Amount::new(15, 150))
        );
        // A settle above its bound (an estimate that under-counted the bound) saturates.
        settle_all(&m, &["a"], b, Amount::new(90, 900)).unwrap();
        assert_eq!(get(&m, "a").account.room(), Amount::ZERO);
    }

    #[test]
    fn a_lease_within_the_margin_of_its_expiry_or_in_report_admits_nothing() {
        let s = lease(100);
        let b = Amount::new(1, 0);
        assert!(s.fits(b, 4_999, 5_000));
        assert!(
            !s.fits(b, 5_000, 5_000),
            "the hold may go before it settles"
        );
        assert!(!LeaseState::default().fits(b, 0, 0), "no lease");
        let mut out = s.clone();
        out.start(
            s.due(1000, &CFG, Amount::new(1000, 0), 10_000, "g-2")
                .unwrap(),
            900,
        );
        assert!(!out.fits(b, 100, 0), "a report is out");
        assert!(
            !out.fits(b, 950, 0),
            "its outcome is unknown until answered"
        );
        assert!(!s.fits(Amount::new(101, 0), 0, 0), "a bound over the room");
    }

    #[test]
    fn a_report_charges_used_and_takes_the_new_lease_once() {
        let mut s = lease(100);
        s.reported_ms = 0;
        s.admit(Amount::new(30, 0), 0);
        s.account.end(Amount::new(10, 0), Amount::new(7, 70));
        assert_eq!(s.due(50, &CFG, Amount::new(1000, 0), 10_000, "g-2"), None);
        let r = s
            .due(100, &CFG, Amount::new(1000, 0), 10_000, "g-2")
            .unwrap();
        assert_eq!(
            (r.used, r.admitted, r.max),
            (Amount::new(7, 70), Amount::new(20, 0), Amount::new(1000, 0))
        );
        s.start(r.clone(), 1100);
        // Meanwhile a request settles: its use stays for the next report.
        s.account.end(Amount::new(10, 0), Amount::new(3, 30));
        assert_eq!(s.due(500, &CFG, Amount::new(1000, 0), 10_000, "x"), None);
        assert!(s.applied(&r, Amount::new(200, 2000), 10_000));
        assert_eq!(
            (
                s.id.as_str(),
                s.account.granted,
                s.account.used,
                s.account.admitted
            ),
            (
                "g-2",
                Amount::new(200, 2000),
                Amount::new(3, 30),
                Amount::new(10, 0)
            )
        );
        assert_eq!(s.hold_expires_ms, 10_100);
        assert!(!s.applied(&r, Amount::new(1, 1), 10_000), "applied once");
    }

    #[test]
    fn a_report_in_doubt_is_resent_as_it_was_and_freezes_the_lease() {
        let mut s = lease(100);
        s.admit(Amount::new(5, 0), 0);
        let r = s
            .due(200, &CFG, Amount::new(1000, 0), 10_000, "g-2")
            .unwrap();
        s.start(r.clone(), 1200);
        s.failed(&r, true);
        assert!(!s.fits(Amount::new(1, 0), 300, 0));
        assert_eq!(
            s.due(300, &CFG, Amount::new(1000, 0), 10_000, "g-3"),
            Some(r.clone()),
            "the same ids and amounts"
        );
        // Never sent: dropped, the old lease admits again.
        let mut t = lease(100);
        t.wanted = true;
        let r = t
            .due(200, &CFG, Amount::new(1000, 0), 10_000, "g-2")
            .unwrap();
        t.start(r.clone(), 1200);
        t.failed(&r, false);
        assert!(t.fits(Amount::new(1, 0), 300, 0));
        assert!(t.pending.is_none() && t.wanted);
    }

    #[test]
    fn an_idle_lease_shrinks_to_its_requests_then_goes() {
        let mut s = lease(100);
        s.admit(Amount::new(10, 0), 0);
        s.active = false;
        assert_eq!(
            s.due(999, &CFG, Amount::new(1000, 0), 10_000, "g-2"),
            None,
            "a pause of less than IDLE_REPORTS periods keeps the lease"
        );
        let r = s
            .due(1000, &CFG, Amount::new(1000, 0), 10_000, "g-2")
            .unwrap();
        assert_eq!(
            r.max,
            Amount::ZERO,
            "idle: nothing beyond what is in flight"
        );
        s.start(r.clone(), 1100);
        assert!(s.applied(&r, Amount::new(10, 0), 10_000));
        assert_eq!(
            s.due(300, &CFG, Amount::new(1000, 0), 10_000, "g-3"),
            None,
            "already that size, hold far from expiry"
        );
        s.account.end(Amount::new(10, 0), Amount::new(4, 0));
        let r = s
            .due(1100, &CFG, Amount::new(1000, 0), 10_000, "g-3")
            .unwrap();
        assert_eq!(
            (r.used, r.max),
            (Amount::new(4, 0), Amount::ZERO),
            "still idle: the use is charged and nothing more taken"
        );
        s.start(r.clone(), 1300);
        assert!(s.applied(&r, Amount::ZERO, 10_000));
        assert!(s.id.is_empty(), "released");
        assert_eq!(s.due(1000, &CFG, Amount::new(1000, 0), 10_000, "g-4"), None);
        // A request that found no lease asks for one.
        s.wanted = true;
        assert_eq!(
            s.due(1000, &CFG, Amount::new(1000, 0), 10_000, "g-4")
                .map(|r| r.max),
            Some(Amount::new(1000, 0))
        );
    }

    #[test]
    fn a_stopping_gateway_releases_its_lease_keeping_only_what_is_in_flight() {
        let mut s = lease(100);
        s.admit(Amount::new(10, 0), 0);
        s.account.used = Amount::new(7, 0);
        let r = s.release_due(5, "g-9").unwrap();
        assert_eq!(
            (r.used, r.admitted, r.max),
            (Amount::new(7, 0), Amount::new(10, 0), Amount::ZERO)
        );
        s.start(r, 1000);
        assert_eq!(
            s.release_due(6, "g-10"),
            None,
            "another worker's report is out"
        );
        assert_eq!(
            LeaseState::default().release_due(0, "x"),
            None,
            "nothing to release"
        );
    }

    #[test]
    fn grants_split_the_free_room_and_cover_what_is_admitted() {
        let caps = Caps {
            tokens: Some(1000),
            pico: None,
        };
        let max = Amount::new(300, UNLIMITED_PICO);
        let g = |taken, admitted, holders| {
            grant(
                &caps,
                Amount::new(taken, 0),
                max,
                Amount::new(admitted, 0),
                holders,
                false,
            )
        };
        assert_eq!(
            g(0, 0, 1),
            Amount::new(300, UNLIMITED_PICO),
            "max bounds it"
        );
        assert_eq!(g(600, 0, 1).tokens, 200, "half the free room");
        assert_eq!(g(600, 0, 2).tokens, 100, "split over two leaseholders");
        assert_eq!(g(990, 0, 2).tokens, 2, "near the cap leases shrink");
        assert_eq!(g(990, 40, 2).tokens, 40, "never below what is admitted");
        assert_eq!(g(1200, 0, 1).tokens, 0);
        let unheld = grant(&caps, Amount::new(600, 0), max, Amount::ZERO, 2, true);
        assert_eq!(
            unheld.tokens, 300,
            "unheld takes all the free room, max-bounded"
        );
    }

    #[test]
    fn config_compiles_with_field_paths_and_leases_only_capped_dimensions_it_covers() {
        let c = |json: &str| {
            serde_json::from_str::<LeaseConfig>(json)
                .map_err(|e| e.to_string())
                .and_then(|c| c.compile().map_err(|(p, w)| format!("{p}: {w}")))
        };
        let l = c(r#"{"max_tokens":500}"#).unwrap();
        assert_eq!(l.report_ms, 100);
        assert_eq!(l.reserve_wait_ms(), 400, "four report periods");
        let slow = c(r#"{"max_tokens":500,"report_ms":60000}"#).unwrap();
        assert_eq!(slow.reserve_wait_ms(), 2000, "bounded");
        assert!(c(r#"{"max_tokens":500,"bogus":1}"#)
            .unwrap_err()
            .contains("unknown field"));
        assert!(c(r#"{}"#).unwrap_err().contains("service.lease.max_tokens"));
        assert!(c(r#"{"max_tokens":0}"#).unwrap_err().contains("at least 1"));
        assert!(c(r#"{"max_usd":"x"}"#)
            .unwrap_err()
            .contains("service.lease.max_usd"));
        assert!(c(r#"{"max_tokens":1,"report_ms":0}"#)
            .unwrap_err()
            .contains("report_ms"));
        let tokens = Caps {
            tokens: Some(10),
            pico: None,
        };
        let usd = Caps {
            tokens: None,
            pico: Some(10),
        };
        assert_eq!(l.max_for(&tokens), Some(Amount::new(500, UNLIMITED_PICO)));
        assert_eq!(l.max_for(&usd), None, "a USD cap needs max_usd");
        let both = c(r#"{"max_tokens":5,"max_usd":"0.5"}"#).unwrap();
        assert_eq!(
            both.max_for(&usd),
            Some(Amount::new(UNLIMITED_TOKENS, 500_000_000_000))
        );
    }

    #[test]
    fn a_report_is_sent_as_the_service_reads_it_and_its_answers_are_read() {
        let c = serde_json::from_str::<crate::budget::compiled::BudgetsConfig>(
            r#"{"budgets":[{"name":"all","scope":"router","max_tokens":1000,"window_s":60}],
                "hold_ttl_s":120,"service":{"cluster":"c","lease":{"max_tokens":300}}}"#,
        )
        .unwrap()
        .compile()
        .unwrap();
        let lease = match &c.mode {
            crate::budget::compiled::Mode::Shared { lease, .. } => *lease,
            _ => None,
        };
        assert_eq!(lease.map(|l| l.max_tokens), Some(Some(300)));
        let r = Pending {
            new_id: "w-2".into(),
            used: Amount::new(5, 7),
            admitted: Amount::new(3, 0),
            max: Amount::new(300, UNLIMITED_PICO),
            sent_ms: 1,
        };
        let body = lease_body("ns/r", &c, 0, "", "w-1", &r, false).unwrap();
        let req: crate::budget::protocol::LeaseRequest = serde_json::from_slice(&body).unwrap();
        assert_eq!((req.old.as_deref(), req.id.as_str()), (Some("w-1"), "w-2"));
        assert_eq!(req.used.parse().unwrap(), Amount::new(5, 7));
        assert_eq!(req.max.parse().unwrap(), r.max);
        assert_eq!((req.ledger.max_tokens, req.ttl_s), (Some(1000), Some(120)));
        let none = lease_body("ns/r", &c, 0, "", "", &r, false).unwrap();
        assert!(
            serde_json::from_slice::<crate::budget::protocol::LeaseRequest>(&none)
                .unwrap()
                .old
                .is_none()
        );
        assert!(lease_body("ns/r", &c, 9, "", "", &r, false).is_none());
        let ok = br#"{"granted":{"tokens":40,"usd":"0.5"},"applied":true,
            "ledger":{"budget":"all","tokens_used":1,"usd_used":"0","tokens_reserved":40}}"#;
        let (g, l) = read_lease(200, ok).unwrap();
        assert_eq!(
            (g, l.tokens_reserved),
            (Amount::new(40, 500_000_000_000), 40)
        );
        assert!(read_lease(0, b"").unwrap_err().in_doubt);
        assert!(read_lease(503, b"").unwrap_err().in_doubt);
        assert!(!read_lease(400, b"").unwrap_err().in_doubt);
        assert!(read_lease(200, b"nope").unwrap_err().in_doubt);
    }

    #[test]
    fn the_state_round_trips_and_refuses_garbage() {
        let mut s = lease(7);
        s.admit(Amount::new(3, 4), 0);
        s.account.used = Amount::new(1, 2);
        s.wanted = true;
        assert_eq!(LeaseState::decode(&s.encode()), Ok(s.clone()));
        let r = s
            .due(1000, &CFG, Amount::new(9, 9), 10_000, "next")
            .unwrap();
        s.start(r, 77);
        assert_eq!(LeaseState::decode(&s.encode()), Ok(s.clone()));
        let bytes = s.encode();
        for n in 0..bytes.len() {
            assert!(LeaseState::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        assert!(LeaseState::decode(&[9]).is_err());
    }
}
