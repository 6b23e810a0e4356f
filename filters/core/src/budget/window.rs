//! Rolling windows as bucketed counters that never expire a charge early.
//!
//! A window of `L` ms is cut into buckets of `width` ms; a charge at time `t` lands in bucket
//! `t / width`, and each bucket keeps the time of its latest charge: the bucket counts until that
//! time plus `L`. So every charge counts for at least `L` (never early), and a bucket is gone
//! at most `L` after its last charge: a refusal's wait is never longer than the window. (A
//! charge made early in a bucket that is charged again later is kept for as long as the later
//! one: late by less than one bucket.) With at most [`WINDOW_SLOTS`] buckets per window the ring
//! is a fixed size. The same ring, with a coarser width, holds reservations until their
//! time-to-live passes, so a reservation whose request never finished cannot leak.
//!
//! Bucket `k` is live at `now` iff `now < last(k) + L`, where `last(k) < (k + 1) × width` (a
//! bucket whose latest charge time is unknown, written by an older layout, is taken to end
//! with its bucket). At most `ceil(L / width) + 1` buckets are live at once, which is the
//! ring's size: a bucket's cell is reused only after it died.

/// Most buckets a budget window is cut into (plus one, see the module doc).
pub const WINDOW_SLOTS: u64 = 60;
/// Most buckets a reservation time-to-live is cut into (plus one).
pub const HOLD_SLOTS: u64 = 8;

/// Tokens and pico-dollars, added and subtracted saturating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amount {
    pub tokens: u64,
    pub pico: u64,
}

impl Amount {
    pub const ZERO: Amount = Amount { tokens: 0, pico: 0 };

    pub fn new(tokens: u64, pico: u64) -> Amount {
        Amount { tokens, pico }
    }
    pub fn plus(self, o: Amount) -> Amount {
        Amount::new(
            self.tokens.saturating_add(o.tokens),
            self.pico.saturating_add(o.pico),
        )
    }
    pub fn minus(self, o: Amount) -> Amount {
        Amount::new(
            self.tokens.saturating_sub(o.tokens),
            self.pico.saturating_sub(o.pico),
        )
    }
    pub fn is_zero(self) -> bool {
        self == Amount::ZERO
    }
}

/// How a lifetime is cut into buckets. Derived from configuration, never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub width_ms: u64,
    pub lifetime_ms: u64,
    /// Cells in the ring: `ceil(lifetime / width) + 1`.
    pub slots: u64,
}

impl Geometry {
    /// `lifetime_s` (at least 1) cut into whole-second buckets, at most `max_slots` of them.
    pub fn new(lifetime_s: u64, max_slots: u64) -> Geometry {
        let lifetime_s = lifetime_s.max(1);
        let width_s = lifetime_s.div_ceil(max_slots.max(1));
        Geometry {
            width_ms: width_s * 1000,
            lifetime_ms: lifetime_s * 1000,
            slots: lifetime_s.div_ceil(width_s) + 1,
        }
    }
    pub fn window(window_s: u64) -> Geometry {
        Geometry::new(window_s, WINDOW_SLOTS)
    }
    pub fn hold(ttl_s: u64) -> Geometry {
        Geometry::new(ttl_s, HOLD_SLOTS)
    }
    pub fn bucket(&self, now_ms: u64) -> u64 {
        now_ms / self.width_ms
    }
    /// When everything charged into bucket `k` has rolled off at the latest (whatever the
    /// time of its last charge): the bucket's end plus the lifetime.
    pub fn expires_at(&self, k: u64) -> u64 {
        (k + 1)
            .saturating_mul(self.width_ms)
            .saturating_add(self.lifetime_ms)
    }
    pub fn live(&self, k: u64, now_ms: u64) -> bool {
        now_ms < self.expires_at(k)
    }
}

/// Bytes of a ring's header: bucket width in seconds (u32), cell count (u32), `head` (u64),
/// then the running totals of every cell (tokens, pico; u128 each, so they never saturate).
pub(crate) const RING_HEADER: usize = 48;
/// Bytes per cell: tokens, pico, and the time of the bucket's latest charge in ms plus one
/// (0: unknown, the bucket's end is taken), u64 each.
pub(crate) const CELL: usize = 24;

/// Bytes of a ring of `g`.
pub(crate) const fn ring_len(g: &Geometry) -> usize {
    RING_HEADER + CELL * g.slots as usize
}

pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn get_u128(b: &[u8], at: usize) -> u128 {
    b.get(at..at + 16)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u128::from_le_bytes)
}

pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

fn put_u128(b: &mut [u8], at: usize, v: u128) {
    if let Some(s) = b.get_mut(at..at + 16) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// The cells of one rolling lifetime, kept as fixed-width little-endian bytes
/// ([`ring_len`]) so a ledger is read and changed where shared data hands it over, with no
/// decoding into a list and no encoding back. `head` is the newest bucket written; cell
/// `k % slots` holds bucket `k` for `head - slots < k <= head`. The running totals are the sum
/// of every cell, so what still counts is the total minus the few oldest cells that died since
/// the ring last moved (none or one when it is written every bucket): O(1), not a walk over all
/// buckets.
#[derive(Debug, Clone, Copy)]
pub struct Ring<B> {
    pub(crate) b: B,
}

const HEAD: usize = 8;
const TOTAL_TOKENS: usize = 16;
const TOTAL_PICO: usize = 32;

/// Writes an empty ring of `g` into `b` ([`ring_len`] bytes).
pub(crate) fn init_ring(b: &mut [u8], g: &Geometry) {
    b.fill(0);
    put_u32(b, 0, (g.width_ms / 1000) as u32);
    put_u32(b, 4, g.slots as u32);
}

impl Ring<Vec<u8>> {
    /// An empty ring of `g`, on its own bytes.
    pub fn new(g: &Geometry) -> Ring<Vec<u8>> {
        let mut b = vec![0; ring_len(g)];
        init_ring(&mut b, g);
        Ring { b }
    }
}

impl Ring<Vec<u8>> {
    /// A ring of `g` whose cells (bucket `k` in cell `k % slots`) and head are given; cells
    /// beyond the geometry's count are dropped (callers pass exactly that many).
    pub(crate) fn from_cells(g: &Geometry, head: u64, cells: &[Amount]) -> Ring<Vec<u8>> {
        let mut r = Ring::new(g);
        put_u64(&mut r.b, HEAD, head);
        for (i, c) in cells.iter().take(g.slots as usize).enumerate() {
            r.replace(i as u64, *c);
        }
        r
    }
}

impl<B: AsRef<[u8]>> Ring<B> {
    fn bytes(&self) -> &[u8] {
        self.b.as_ref()
    }

    /// Bucket width in seconds and cell count, as written.
    pub(crate) fn geometry(&self) -> (u32, u32) {
        (get_u32(self.bytes(), 0), get_u32(self.bytes(), 4))
    }

    pub(crate) fn head(&self) -> u64 {
        get_u64(self.bytes(), HEAD)
    }

    fn slots(&self) -> u64 {
        u64::from(get_u32(self.bytes(), 4)).max(1)
    }

    pub(crate) fn cell(&self, k: u64) -> Amount {
        let at = RING_HEADER + CELL * (k % self.slots()) as usize;
        Amount::new(get_u64(self.bytes(), at), get_u64(self.bytes(), at + 8))
    }

    /// The time of bucket `k`'s latest charge, if it was recorded.
    fn last(&self, k: u64) -> Option<u64> {
        let at = RING_HEADER + CELL * (k % self.slots()) as usize + 16;
        get_u64(self.bytes(), at).checked_sub(1)
    }

    /// When bucket `k` rolls off: its latest charge plus the lifetime, and never later than
    /// the bucket's end plus the lifetime.
    pub fn expires(&self, g: &Geometry, k: u64) -> u64 {
        let end = g.expires_at(k);
        match self.last(k) {
            Some(t) => t.saturating_add(g.lifetime_ms).min(end),
            None => end,
        }
    }

    /// Bucket `k` still counts at `now`.
    pub fn live(&self, g: &Geometry, k: u64, now_ms: u64) -> bool {
        now_ms < self.expires(g, k)
    }

    /// Every cell's amount added up (dead ones included, until the ring moves past them).
    pub(crate) fn total(&self) -> (u128, u128) {
        (
            get_u128(self.bytes(), TOTAL_TOKENS),
            get_u128(self.bytes(), TOTAL_PICO),
        )
    }

    /// The oldest bucket the ring may hold something in.
    fn first(&self) -> u64 {
        self.head().saturating_sub(self.slots() - 1)
    }

    /// (bucket, cell) of the buckets that may hold something, oldest first.
    fn entries(&self) -> impl Iterator<Item = (u64, Amount)> + '_ {
        (self.first()..=self.head()).map(move |k| (k, self.cell(k)))
    }

    /// Everything still counting at `now`: the totals less the cells of buckets that died
    /// (the oldest ones: every bucket before `(now - lifetime) / width` has ended its
    /// lifetime, and of the rest only that first one can be dead by its latest charge, since
    /// the next one's charges are all after its end).
    pub fn sum(&self, g: &Geometry, now_ms: u64) -> Amount {
        let first_live = now_ms.saturating_sub(g.lifetime_ms) / g.width_ms;
        let (mut t, mut p) = self.total();
        let head = self.head();
        let mut dead_end = first_live.min(head.saturating_add(1));
        if first_live <= head && first_live >= self.first() && !self.live(g, first_live, now_ms) {
            dead_end = first_live + 1;
        }
        for k in self.first()..dead_end {
            let c = self.cell(k);
            // Saturating: bytes another writer got wrong must not panic the filter.
            t = t.saturating_sub(u128::from(c.tokens));
            p = p.saturating_sub(u128::from(c.pico));
        }
        Amount::new(
            t.min(u128::from(u64::MAX)) as u64,
            p.min(u128::from(u64::MAX)) as u64,
        )
    }

    /// The earliest time at which at least `need` (in every dimension that is non-zero) has
    /// rolled off, or `None` if less than `need` is in the ring at all.
    pub fn freed_by(&self, g: &Geometry, now_ms: u64, need: Amount) -> Option<u64> {
        let mut freed = Amount::ZERO;
        for (k, c) in self.entries().filter(|&(k, _)| self.live(g, k, now_ms)) {
            freed = freed.plus(c);
            if freed.tokens >= need.tokens && freed.pico >= need.pico {
                return Some(self.expires(g, k));
            }
        }
        None
    }

    /// When the ring will be empty (`now` if it already is).
    pub fn quiet_at(&self, g: &Geometry, now_ms: u64) -> u64 {
        self.entries()
            .filter(|&(k, c)| self.live(g, k, now_ms) && !c.is_zero())
            .map(|(k, _)| self.expires(g, k))
            .max()
            .unwrap_or(now_ms)
    }
}

impl<B: AsRef<[u8]> + AsMut<[u8]>> Ring<B> {
    fn set_cell(&mut self, k: u64, c: Amount) {
        let at = RING_HEADER + CELL * (k % self.slots()) as usize;
        let b = self.b.as_mut();
        put_u64(b, at, c.tokens);
        put_u64(b, at + 8, c.pico);
    }

    /// Records a charge made at `at_ms` in bucket `k` (at least the bucket's start: a clock
    /// that stepped back charges the newest bucket, which then counts from its own start).
    fn charged_at(&mut self, g: &Geometry, k: u64, at_ms: u64) {
        let t = at_ms
            .max(k.saturating_mul(g.width_ms))
            .min(g.expires_at(k).saturating_sub(g.lifetime_ms + 1))
            .max(self.last(k).unwrap_or(0));
        let at = RING_HEADER + CELL * (k % self.slots()) as usize + 16;
        put_u64(self.b.as_mut(), at, t.saturating_add(1));
    }

    /// Forgets bucket `k`'s latest charge time (its cell is reused for a new bucket).
    fn clear_last(&mut self, k: u64) {
        let at = RING_HEADER + CELL * (k % self.slots()) as usize + 16;
        put_u64(self.b.as_mut(), at, 0);
    }

    /// Replaces bucket `k`'s cell, keeping the totals the sum of all cells.
    fn replace(&mut self, k: u64, new: Amount) {
        let old = self.cell(k);
        let (t, p) = self.total();
        let t = t.saturating_sub(u128::from(old.tokens)) + u128::from(new.tokens);
        let p = p.saturating_sub(u128::from(old.pico)) + u128::from(new.pico);
        self.set_cell(k, new);
        let b = self.b.as_mut();
        put_u128(b, TOTAL_TOKENS, t);
        put_u128(b, TOTAL_PICO, p);
    }

    /// Moves `head` forward to `now`'s bucket, clearing the cells that are reused.
    fn advance(&mut self, g: &Geometry, now_ms: u64) {
        let target = g.bucket(now_ms);
        let head = self.head();
        if target <= head {
            return;
        }
        let steps = (target - head).min(self.slots());
        for k in (target + 1 - steps)..=target {
            self.replace(k, Amount::ZERO);
            self.clear_last(k);
        }
        put_u64(self.b.as_mut(), HEAD, target);
    }

    /// Adds `a` at `now` and returns the bucket it went to. A clock that stepped back (another
    /// worker's slightly older `now`) lands in the newest bucket: later expiry, never earlier.
    pub fn add(&mut self, g: &Geometry, now_ms: u64, a: Amount) -> u64 {
        self.advance(g, now_ms);
        let k = self.head();
        let c = self.cell(k).plus(a);
        self.replace(k, c);
        self.charged_at(g, k, now_ms);
        k
    }

    /// Adds `a` as charged at `at_ms` (earlier than `now`: a charge made then and written now,
    /// by a worker lease's report), so it rolls off when it would have had it been written at
    /// once. A charge that already rolled off adds nothing; one after `now`'s bucket (another
    /// worker's clock) lands in `now`'s: later, never earlier.
    pub fn add_at(&mut self, g: &Geometry, now_ms: u64, at_ms: u64, a: Amount) {
        self.advance(g, now_ms);
        let head = self.head();
        let k = g.bucket(at_ms).min(head);
        if k + self.slots() > head && now_ms < at_ms.saturating_add(g.lifetime_ms) {
            let c = self.cell(k).plus(a);
            self.replace(k, c);
            self.charged_at(g, k, at_ms);
        }
    }

    /// Adds in what `old`, a ring written under another geometry (the budget's window or the
    /// hold TTL changed), still counts, as if this geometry had applied when it was charged:
    /// each cell goes to the bucket of the latest instant its charges can have been made (its
    /// old bucket's end, or `now` if that is later than `now`), so it rolls off this geometry's
    /// lifetime after that instant at the earliest: never early, late by less than one old
    /// bucket plus one new. A cell that had already rolled off under the old geometry stays off
    /// (its lifetime is at most `slots - 1` of its buckets), and so does one that is past this
    /// geometry's lifetime (the window shrank). Folding everything into `now`'s bucket, as this
    /// replaced, counted the old cells for a whole new window from the change on, dead ones
    /// included.
    pub(crate) fn fold_in<C: AsRef<[u8]>>(&mut self, g: &Geometry, now_ms: u64, old: &Ring<C>) {
        self.advance(g, now_ms);
        let head = self.head();
        let now_k = g.bucket(now_ms);
        let old_width = u64::from(old.geometry().0).max(1).saturating_mul(1000);
        for (k, c) in old.entries() {
            let dead_before = k.saturating_add(old.slots()).saturating_mul(old_width);
            if c.is_zero() || dead_before <= now_ms {
                continue;
            }
            // The latest instant its charges can have been made: its recorded last charge, or
            // its old bucket's last millisecond.
            let end = k.saturating_add(1).saturating_mul(old_width);
            let last = old
                .last(k)
                .unwrap_or(end.saturating_sub(1))
                .min(now_ms)
                .min(end.saturating_sub(1));
            let to = (last / g.width_ms).min(now_k);
            if g.live(to, now_ms)
                && now_ms < last.saturating_add(g.lifetime_ms)
                && to <= head
                && to + self.slots() > head
            {
                let sum = self.cell(to).plus(c);
                self.replace(to, sum);
                self.charged_at(g, to, last);
            }
        }
    }

    /// Takes `a` out of bucket `k` if that bucket is still held (it may have expired, or its cell
    /// been reused, in which case there is nothing left to take).
    pub fn take(&mut self, g: &Geometry, now_ms: u64, k: u64, a: Amount) {
        self.advance(g, now_ms);
        let head = self.head();
        if k <= head && k + self.slots() > head && self.live(g, k, now_ms) {
            let c = self.cell(k).minus(a);
            self.replace(k, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u64) -> Amount {
        Amount::new(n, 0)
    }

    #[test]
    fn geometry_keeps_short_windows_to_the_second() {
        let g = Geometry::window(60);
        assert_eq!((g.width_ms, g.slots), (1000, 61));
        let g = Geometry::window(1);
        assert_eq!((g.width_ms, g.slots), (1000, 2));
        let g = Geometry::window(3600);
        assert_eq!((g.width_ms, g.slots), (60_000, 61));
        let g = Geometry::window(61);
        assert_eq!((g.width_ms, g.slots), (2000, 32));
        let g = Geometry::hold(900);
        assert!(g.slots <= HOLD_SLOTS + 1);
    }

    #[test]
    fn a_charge_counts_for_the_whole_window_and_at_most_one_bucket_more() {
        for window in [1u64, 7, 60, 61, 100, 3600, 86_400] {
            let g = Geometry::window(window);
            for at in [0u64, 1, 999, 1000, 12_345, 5_000_000] {
                let mut r = Ring::new(&g);
                r.add(&g, at, t(5));
                // Never early: still counted just before `at + window`.
                assert_eq!(
                    r.sum(&g, at + window * 1000 - 1).tokens,
                    5,
                    "w={window} at={at}"
                );
                // Late by less than one bucket.
                assert_eq!(r.sum(&g, at + window * 1000 + g.width_ms).tokens, 0);
            }
        }
    }

    #[test]
    fn cells_are_reused_only_after_their_bucket_died() {
        let g = Geometry::window(10);
        let mut r = Ring::new(&g);
        // One charge per second for 100 s: the charge from exactly 10 s ago has just rolled
        // off, the nine after it count.
        for s in 0..100u64 {
            r.add(&g, s * 1000 + 500, t(1));
            let sum = r.sum(&g, s * 1000 + 500).tokens;
            assert_eq!(sum, (s + 1).min(10), "at {s}s");
        }
        // Long idle: everything gone, even with the head far behind.
        assert_eq!(r.sum(&g, 10_000_000).tokens, 0);
        r.add(&g, 10_000_000, t(3));
        assert_eq!(r.sum(&g, 10_000_000).tokens, 3);
    }

    #[test]
    fn take_only_touches_a_live_bucket() {
        let g = Geometry::hold(8);
        let mut r = Ring::new(&g);
        let k = r.add(&g, 0, t(10));
        r.take(&g, 500, k, t(4));
        assert_eq!(r.sum(&g, 500).tokens, 6);
        r.take(&g, 500, k, t(100));
        assert_eq!(r.sum(&g, 500).tokens, 0);
        let k = r.add(&g, 1000, t(10));
        // After expiry, take is a no-op and does not disturb newer buckets.
        r.add(&g, 20_000, t(1));
        r.take(&g, 20_000, k, t(10));
        assert_eq!(r.sum(&g, 20_000).tokens, 1);
    }

    /// The running totals against the plain definition (every live cell added up), over a
    /// long run of charges, takes, idle gaps and clocks stepping back.
    #[test]
    fn the_running_sum_is_the_sum_of_the_live_buckets() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for g in [
            Geometry::window(1),
            Geometry::window(10),
            Geometry::window(61),
            Geometry::window(3600),
            Geometry::hold(900),
        ] {
            let mut r = Ring::new(&g);
            let mut now = 0u64;
            let mut holds = Vec::new();
            for _ in 0..3000 {
                now = match next(20) {
                    0 => now + g.lifetime_ms * next(3),
                    1 => now.saturating_sub(next(1500)),
                    _ => now + next(g.width_ms),
                };
                match next(3) {
                    0 if !holds.is_empty() => {
                        let (k, a) = holds.swap_remove(next(holds.len() as u64) as usize);
                        r.take(&g, now, k, a);
                    }
                    _ => {
                        let a = Amount::new(next(1000), next(1 << 40));
                        holds.push((r.add(&g, now, a), a));
                    }
                }
                for at in [now, now + next(2 * g.lifetime_ms)] {
                    let plain = r
                        .entries()
                        .filter(|&(k, _)| r.live(&g, k, at))
                        .fold(Amount::ZERO, |acc, (_, c)| acc.plus(c));
                    assert_eq!(r.sum(&g, at), plain, "{g:?} at {at}");
                }
            }
        }
    }

    #[test]
    fn freed_by_names_the_bucket_end_that_makes_room() {
        let g = Geometry::window(10);
        let mut r = Ring::new(&g);
        r.add(&g, 1_200, t(3));
        r.add(&g, 4_700, t(4));
        // Each rolls off the window after its charge, not after its bucket's end.
        assert_eq!(r.freed_by(&g, 5_000, t(2)), Some(11_200));
        assert_eq!(r.freed_by(&g, 5_000, t(5)), Some(14_700));
        assert_eq!(r.freed_by(&g, 5_000, t(8)), None);
        assert_eq!(r.quiet_at(&g, 5_000), 14_700);
        assert_eq!(Ring::new(&g).quiet_at(&g, 5_000), 5_000);
    }
}
