//! One budget ledger: what was spent in the rolling window, what is held by requests in flight,
//! and the byte form it takes in shared data (proxy-wasm) so workers update it by compare-and-swap.

use super::varint::put;
use super::window::{Amount, Geometry, Ring};

/// The geometry of a ledger: its budget's window and the reservation time-to-live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub window: Geometry,
    pub hold: Geometry,
}

impl Shape {
    pub fn new(window_s: u64, hold_ttl_s: u64) -> Shape {
        Shape {
            window: Geometry::window(window_s),
            hold: Geometry::hold(hold_ttl_s),
        }
    }
}

/// A budget's caps; `None` is "no cap on this dimension" (the seed requires at least one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    pub tokens: Option<u64>,
    pub pico: Option<u64>,
}

impl Caps {
    /// `used + amount` stays within every cap.
    pub fn admits(&self, used: Amount, amount: Amount) -> bool {
        let t = used.tokens.saturating_add(amount.tokens);
        let p = used.pico.saturating_add(amount.pico);
        self.tokens.is_none_or(|c| t <= c) && self.pico.is_none_or(|c| p <= c)
    }

    /// The seed's `utilization`: the larger of the token and USD fractions of the caps spent.
    pub fn utilization(&self, spent: Amount) -> String {
        use super::money::format_fraction;
        let t = self.tokens.map(|c| format_fraction(spent.tokens, c));
        let u = self.pico.map(|c| format_fraction(spent.pico, c));
        // Both are `0.dddd` or `1.0`, so string order is numeric order.
        match (t, u) {
            (Some(a), Some(b)) => a.max(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => format_fraction(0, 1),
        }
    }

    /// How far `used` is over what still lets `amount` in, per capped dimension.
    fn excess(&self, used: Amount, amount: Amount) -> Amount {
        let over = |cap: Option<u64>, u: u64, a: u64| {
            cap.map_or(0, |c| u.saturating_add(a).saturating_sub(c))
        };
        Amount::new(
            over(self.tokens, used.tokens, amount.tokens),
            over(self.pico, used.pico, amount.pico),
        )
    }
}

/// What a request holds on one ledger until it settles or releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub bucket: u64,
    pub amount: Amount,
}

/// How long until the same request would be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Whole seconds, at least 1.
    Seconds(u64),
    /// The request alone is over the cap: no amount of waiting admits it.
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    spent: Ring,
    held: Ring,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    Truncated,
    BadVersion(u8),
    TooManyCells,
    Trailing,
}

const VERSION: u8 = 1;
/// Longest LEB128 encoding of a u64.
const MAX_VARINT: usize = 10;

impl Ledger {
    pub fn new(shape: &Shape) -> Ledger {
        Ledger {
            spent: Ring::new(&shape.window),
            held: Ring::new(&shape.hold),
        }
    }

    pub fn spent(&self, shape: &Shape, now_ms: u64) -> Amount {
        self.spent.sum(&shape.window, now_ms)
    }

    pub fn held(&self, shape: &Shape, now_ms: u64) -> Amount {
        self.held.sum(&shape.hold, now_ms)
    }

    /// Holds `amount` if spent + held + amount stays within the caps.
    pub fn try_reserve(
        &mut self,
        shape: &Shape,
        caps: &Caps,
        amount: Amount,
        now_ms: u64,
    ) -> Result<Hold, Wait> {
        self.check(shape, caps, amount, now_ms)?;
        let bucket = self.held.add(&shape.hold, now_ms, amount);
        Ok(Hold { bucket, amount })
    }

    /// `Ok` if `amount` fits now, else how long until it would.
    pub fn check(
        &self,
        shape: &Shape,
        caps: &Caps,
        amount: Amount,
        now_ms: u64,
    ) -> Result<(), Wait> {
        let used = self.spent(shape, now_ms).plus(self.held(shape, now_ms));
        if caps.admits(used, amount) {
            Ok(())
        } else {
            Err(self.wait(shape, caps, amount, now_ms))
        }
    }

    /// Charges `actual` (the real usage, or its estimate) now and drops the hold, if any. The
    /// charge lands in the window at settle time, so it rolls off no earlier than it should.
    pub fn settle(&mut self, shape: &Shape, hold: Option<&Hold>, actual: Amount, now_ms: u64) {
        if let Some(h) = hold {
            self.release(shape, h, now_ms);
        }
        if !actual.is_zero() {
            self.spent.add(&shape.window, now_ms, actual);
        }
    }

    /// Drops a hold without charging (the request was refused elsewhere, or aborted before any
    /// upstream work).
    pub fn release(&mut self, shape: &Shape, hold: &Hold, now_ms: u64) {
        self.held
            .take(&shape.hold, now_ms, hold.bucket, hold.amount);
    }

    /// Seconds until `amount` would fit. Spending rolls off on a known schedule; holds of
    /// requests in flight do not, so when they alone keep the request out the answer is 1 (retry
    /// soon), and [`Wait::Never`] when the request is over a cap on its own.
    fn wait(&self, shape: &Shape, caps: &Caps, amount: Amount, now_ms: u64) -> Wait {
        if !caps.admits(Amount::ZERO, amount) {
            return Wait::Never;
        }
        let held = self.held(shape, now_ms);
        if !caps.admits(held, amount) {
            return Wait::Seconds(1);
        }
        let spent = self.spent(shape, now_ms);
        let need = caps.excess(spent.plus(held), amount);
        if need.is_zero() {
            return Wait::Seconds(1);
        }
        match self.spent.freed_by(&shape.window, now_ms, need) {
            Some(at) => Wait::Seconds(at.saturating_sub(now_ms).div_ceil(1000).max(1)),
            None => Wait::Seconds(1),
        }
    }

    /// When nothing is spent or held any more: after that the ledger can be forgotten losslessly.
    pub fn quiet_at(&self, shape: &Shape, now_ms: u64) -> u64 {
        self.spent
            .quiet_at(&shape.window, now_ms)
            .max(self.held.quiet_at(&shape.hold, now_ms))
    }

    /// The most bytes [`Ledger::encode`] writes for `shape`.
    pub fn max_encoded_len(shape: &Shape) -> usize {
        let ring = |g: &Geometry| 3 * MAX_VARINT + 2 * MAX_VARINT * g.slots as usize;
        1 + ring(&shape.window) + ring(&shape.hold)
    }

    /// Version, then per ring: bucket width in seconds, head, cell count, cells (tokens, pico),
    /// all LEB128. An idle ledger is a few dozen bytes (zero cells are one byte each).
    pub fn encode(&self, shape: &Shape, out: &mut Vec<u8>) {
        out.push(VERSION);
        for (ring, g) in [(&self.spent, &shape.window), (&self.held, &shape.hold)] {
            put(out, g.width_ms / 1000);
            put(out, ring.head);
            put(out, ring.cells.len() as u64);
            for c in &ring.cells {
                put(out, c.tokens);
                put(out, c.pico);
            }
        }
    }

    /// Reads what [`Ledger::encode`] wrote. A ring written under another geometry (the budget's
    /// window changed) is folded into the bucket of `now`: its amounts then roll off later than
    /// they would have, never earlier.
    pub fn decode(bytes: &[u8], shape: &Shape, now_ms: u64) -> Result<Ledger, CodecError> {
        let mut r = Reader { b: bytes, i: 0 };
        let v = r.byte()?;
        if v != VERSION {
            return Err(CodecError::BadVersion(v));
        }
        let spent = r.ring(&shape.window, now_ms)?;
        let held = r.ring(&shape.hold, now_ms)?;
        if r.i != bytes.len() {
            return Err(CodecError::Trailing);
        }
        Ok(Ledger { spent, held })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

/// More cells than any geometry has: a bound on what decoding allocates.
const MAX_CELLS: u64 = 4096;

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, CodecError> {
        let c = *self.b.get(self.i).ok_or(CodecError::Truncated)?;
        self.i += 1;
        Ok(c)
    }

    fn varint(&mut self) -> Result<u64, CodecError> {
        super::varint::get(self.b, &mut self.i).ok_or(CodecError::Truncated)
    }

    fn ring(&mut self, g: &Geometry, now_ms: u64) -> Result<Ring, CodecError> {
        let width_s = self.varint()?;
        let head = self.varint()?;
        let n = self.varint()?;
        if n == 0 || n > MAX_CELLS {
            return Err(CodecError::TooManyCells);
        }
        let mut cells = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let tokens = self.varint()?;
            let pico = self.varint()?;
            cells.push(Amount::new(tokens, pico));
        }
        if width_s * 1000 == g.width_ms && n == g.slots {
            return Ok(Ring { head, cells });
        }
        let total = cells.iter().fold(Amount::ZERO, |a, c| a.plus(*c));
        let mut ring = Ring::new(g);
        ring.add(g, now_ms, total);
        Ok(ring)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    fn caps(tokens: u64) -> Caps {
        Caps {
            tokens: Some(tokens),
            pico: None,
        }
    }

    #[test]
    fn reserve_holds_settle_charges_release_frees() {
        let shape = Shape::new(60, 900);
        let mut l = Ledger::new(&shape);
        let c = caps(100);
        let h = l.try_reserve(&shape, &c, Amount::new(60, 0), 0).unwrap();
        assert_eq!(l.held(&shape, 0).tokens, 60);
        // 60 held + 50 > 100.
        assert_eq!(
            l.try_reserve(&shape, &c, Amount::new(50, 0), 0),
            Err(Wait::Seconds(1))
        );
        l.settle(&shape, Some(&h), Amount::new(20, 0), 2 * S);
        assert_eq!(l.held(&shape, 2 * S).tokens, 0);
        assert_eq!(l.spent(&shape, 2 * S).tokens, 20);
        let h2 = l
            .try_reserve(&shape, &c, Amount::new(80, 0), 3 * S)
            .unwrap();
        l.release(&shape, &h2, 3 * S);
        assert_eq!(l.held(&shape, 3 * S).tokens, 0);
        assert_eq!(l.spent(&shape, 3 * S).tokens, 20);
        assert_eq!(
            l.try_reserve(&shape, &c, Amount::new(101, 0), 3 * S),
            Err(Wait::Never)
        );
    }

    #[test]
    fn retry_after_is_right_to_the_second() {
        let shape = Shape::new(30, 900);
        let c = caps(100);
        let mut l = Ledger::new(&shape);
        l.settle(&shape, None, Amount::new(40, 0), 1_500); // expires at 2 s + 30 s
        l.settle(&shape, None, Amount::new(50, 0), 10_200); // expires at 11 s + 30 s
        let want = Amount::new(30, 0);
        // Needs 20 freed: the first charge rolls off at 32 s.
        let now = 20_000;
        assert_eq!(l.wait(&shape, &c, want, now), Wait::Seconds(12));
        // And it is admitted exactly then, not a second before.
        assert!(l.clone().try_reserve(&shape, &c, want, 31_999).is_err());
        assert!(l.clone().try_reserve(&shape, &c, want, 32_000).is_ok());
        // Needs 60 freed: both must go, the second at 41 s.
        assert_eq!(
            l.wait(&shape, &c, Amount::new(70, 0), now),
            Wait::Seconds(21)
        );
        // A fraction of a second left still says 1.
        assert_eq!(l.wait(&shape, &c, want, 31_999), Wait::Seconds(1));
    }

    #[test]
    fn usd_caps_bind_independently_of_tokens() {
        let shape = Shape::new(60, 900);
        let c = Caps {
            tokens: Some(1_000_000),
            pico: Some(1_000),
        };
        let mut l = Ledger::new(&shape);
        assert!(l.try_reserve(&shape, &c, Amount::new(1, 999), 0).is_ok());
        assert!(l.try_reserve(&shape, &c, Amount::new(1, 2), 0).is_err());
        assert!(l.try_reserve(&shape, &c, Amount::new(1, 1), 0).is_ok());
    }

    #[test]
    fn utilization_is_the_larger_fraction() {
        let c = Caps {
            tokens: Some(1000),
            pico: Some(2_000),
        };
        assert_eq!(c.utilization(Amount::new(100, 1_500)), "0.75");
        assert_eq!(c.utilization(Amount::new(900, 1_500)), "0.9");
        assert_eq!(c.utilization(Amount::new(5, 0)), "0.005");
        assert_eq!(caps(10).utilization(Amount::new(20, 0)), "1.0");
        assert_eq!(Caps::default().utilization(Amount::new(20, 0)), "0.0");
    }

    #[test]
    fn abandoned_holds_expire_with_their_ttl() {
        let shape = Shape::new(60, 16);
        let c = caps(10);
        let mut l = Ledger::new(&shape);
        l.try_reserve(&shape, &c, Amount::new(10, 0), 0).unwrap();
        assert!(l
            .try_reserve(&shape, &c, Amount::new(1, 0), 15_999)
            .is_err());
        // TTL 16 s in 2 s buckets: gone by 18 s, never before 16 s.
        assert!(l.try_reserve(&shape, &c, Amount::new(1, 0), 18_000).is_ok());
    }

    #[test]
    fn codec_round_trips_and_is_bounded() {
        let shape = Shape::new(60, 900);
        let mut l = Ledger::new(&shape);
        let empty_len = {
            let mut b = Vec::new();
            l.encode(&shape, &mut b);
            b.len()
        };
        assert!(empty_len < 160, "{empty_len}");
        let c = Caps::default();
        for s in 0..200u64 {
            let h = l
                .try_reserve(&shape, &c, Amount::new(u64::MAX / 4, s), s * 700)
                .unwrap();
            l.settle(
                &shape,
                Some(&h),
                Amount::new(u64::MAX / 4, u64::MAX / 4),
                s * 700,
            );
        }
        let mut b = Vec::new();
        l.encode(&shape, &mut b);
        assert!(b.len() <= Ledger::max_encoded_len(&shape));
        let back = Ledger::decode(&b, &shape, 200 * 700).unwrap();
        assert_eq!(back, l);
        for cut in 0..b.len() {
            assert!(Ledger::decode(&b[..cut], &shape, 0).is_err(), "cut {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Ledger::decode(&long, &shape, 0), Err(CodecError::Trailing));
    }

    #[test]
    fn a_changed_window_keeps_what_was_spent_until_the_new_window_passed() {
        let old = Shape::new(60, 900);
        let mut l = Ledger::new(&old);
        l.settle(&old, None, Amount::new(70, 5), 1_000);
        let mut b = Vec::new();
        l.encode(&old, &mut b);
        let new = Shape::new(120, 900);
        let now = 30_000;
        let l2 = Ledger::decode(&b, &new, now).unwrap();
        assert_eq!(l2.spent(&new, now), Amount::new(70, 5));
        assert_eq!(l2.spent(&new, now + 120_000 - 1), Amount::new(70, 5));
    }
}
