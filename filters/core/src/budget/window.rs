//! Rolling windows as bucketed counters that never expire a charge early.
//!
//! A window of `L` ms is cut into buckets of `width` ms; a charge at time `t` lands in bucket
//! `t / width` and counts until that bucket's *end* plus `L` has passed. So every charge counts for
//! at least `L` (never early) and at most `L + width` (late by less than one bucket). With at most
//! [`WINDOW_SLOTS`] buckets per window, windows up to 60 s are kept to the second; longer ones
//! expire up to `windowSeconds / 60` late. The same ring, with a coarser width, holds reservations
//! until their time-to-live passes, so a reservation whose request never finished cannot leak.
//!
//! Bucket `k` is live at `now` iff `now < (k + 1) × width + L`. At most `ceil(L / width) + 1`
//! buckets are live at once, which is the ring's size: a bucket's cell is reused only after it died.

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
    /// When everything charged into bucket `k` has rolled off.
    pub fn expires_at(&self, k: u64) -> u64 {
        (k + 1)
            .saturating_mul(self.width_ms)
            .saturating_add(self.lifetime_ms)
    }
    pub fn live(&self, k: u64, now_ms: u64) -> bool {
        now_ms < self.expires_at(k)
    }
}

/// The cells of one rolling lifetime. `head` is the newest bucket written; cell `k % slots`
/// holds bucket `k` for `head - slots < k <= head`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub(crate) head: u64,
    pub(crate) cells: Vec<Amount>,
}

impl Ring {
    pub fn new(g: &Geometry) -> Ring {
        Ring {
            head: 0,
            cells: vec![Amount::ZERO; g.slots as usize],
        }
    }

    /// (bucket, cell) of the buckets that may hold something, oldest first. One division per
    /// walk, not one per cell: ledgers are walked several times per request.
    fn entries(&self) -> impl Iterator<Item = (u64, Amount)> + '_ {
        let n = self.cells.len();
        let first = self.head.saturating_sub(n as u64 - 1);
        let start = (first % n as u64) as usize;
        (0..=(self.head - first) as usize).map(move |j| {
            let i = start + j;
            let i = if i >= n { i - n } else { i };
            (first + j as u64, self.cells[i])
        })
    }

    /// Moves `head` forward to `now`'s bucket, clearing the cells that are reused.
    fn advance(&mut self, g: &Geometry, now_ms: u64) {
        let target = g.bucket(now_ms);
        if target <= self.head {
            return;
        }
        let n = self.cells.len() as u64;
        let steps = (target - self.head).min(n);
        for k in (target + 1 - steps)..=target {
            self.cells[(k % n) as usize] = Amount::ZERO;
        }
        self.head = target;
    }

    /// Everything still counting at `now`.
    pub fn sum(&self, g: &Geometry, now_ms: u64) -> Amount {
        self.entries()
            .filter(|&(k, _)| g.live(k, now_ms))
            .fold(Amount::ZERO, |acc, (_, c)| acc.plus(c))
    }

    /// Adds `a` at `now` and returns the bucket it went to. A clock that stepped back (another
    /// worker's slightly older `now`) lands in the newest bucket: later expiry, never earlier.
    pub fn add(&mut self, g: &Geometry, now_ms: u64, a: Amount) -> u64 {
        self.advance(g, now_ms);
        let k = self.head;
        let n = self.cells.len() as u64;
        let i = (k % n) as usize;
        self.cells[i] = self.cells[i].plus(a);
        k
    }

    /// Takes `a` out of bucket `k` if that bucket is still held (it may have expired, or its cell
    /// been reused, in which case there is nothing left to take).
    pub fn take(&mut self, g: &Geometry, now_ms: u64, k: u64, a: Amount) {
        self.advance(g, now_ms);
        let n = self.cells.len() as u64;
        if k <= self.head && k + n > self.head && g.live(k, now_ms) {
            let i = (k % n) as usize;
            self.cells[i] = self.cells[i].minus(a);
        }
    }

    /// The earliest time at which at least `need` (in every dimension that is non-zero) has
    /// rolled off, or `None` if less than `need` is in the ring at all.
    pub fn freed_by(&self, g: &Geometry, now_ms: u64, need: Amount) -> Option<u64> {
        let mut freed = Amount::ZERO;
        for (k, c) in self.entries().filter(|&(k, _)| g.live(k, now_ms)) {
            freed = freed.plus(c);
            if freed.tokens >= need.tokens && freed.pico >= need.pico {
                return Some(g.expires_at(k));
            }
        }
        None
    }

    /// When the ring will be empty (`now` if it already is).
    pub fn quiet_at(&self, g: &Geometry, now_ms: u64) -> u64 {
        self.entries()
            .filter(|&(k, c)| g.live(k, now_ms) && !c.is_zero())
            .map(|(k, _)| g.expires_at(k))
            .max()
            .unwrap_or(now_ms)
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
        // One charge per second for 100 s: the charge from exactly 10 s ago still counts (its
        // bucket ends half a second later), older ones do not.
        for s in 0..100u64 {
            r.add(&g, s * 1000 + 500, t(1));
            let sum = r.sum(&g, s * 1000 + 500).tokens;
            assert_eq!(sum, (s + 1).min(11), "at {s}s");
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

    #[test]
    fn freed_by_names_the_bucket_end_that_makes_room() {
        let g = Geometry::window(10);
        let mut r = Ring::new(&g);
        r.add(&g, 1_200, t(3));
        r.add(&g, 4_700, t(4));
        assert_eq!(r.freed_by(&g, 5_000, t(2)), Some(12_000));
        assert_eq!(r.freed_by(&g, 5_000, t(5)), Some(15_000));
        assert_eq!(r.freed_by(&g, 5_000, t(8)), None);
        assert_eq!(r.quiet_at(&g, 5_000), 15_000);
        assert_eq!(Ring::new(&g).quiet_at(&g, 5_000), 5_000);
    }
}
