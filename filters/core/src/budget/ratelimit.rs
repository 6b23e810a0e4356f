//! The rate-limit headers a budgeted response carries: OpenAI's `x-ratelimit-*-tokens` for the
//! tightest token cap the request was under, and the same three in USD under our own names for
//! the tightest USD cap (docs/budgets.md "Answers clients get").
//!
//! "Tightest" is the ledger with the least room left; `remaining` is what a request admitted now
//! could still reserve there (cap − spent − held, the answering request's own hold included, as
//! OpenAI counts a request's own tokens); `reset` is the time until everything that ledger has
//! spent has rolled off (its full cap is back), in OpenAI's duration format (`6m0s`, `1s`,
//! `250ms`).

use super::ledger::Caps;
use super::money::format_usd;
use super::window::Amount;

pub const LIMIT_TOKENS: &str = "x-ratelimit-limit-tokens";
pub const REMAINING_TOKENS: &str = "x-ratelimit-remaining-tokens";
pub const RESET_TOKENS: &str = "x-ratelimit-reset-tokens";
pub const LIMIT_USD: &str = "x-llmkube-ratelimit-limit-usd";
pub const REMAINING_USD: &str = "x-llmkube-ratelimit-remaining-usd";
pub const RESET_USD: &str = "x-llmkube-ratelimit-reset-usd";

/// One ledger as the answering gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub caps: Caps,
    /// Spent in the window.
    pub spent: Amount,
    /// Held by requests in flight (leases: only what they admitted).
    pub held: Amount,
    /// Until everything spent has rolled off.
    pub reset_ms: u64,
}

/// One cap's room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub limit: u64,
    pub remaining: u64,
    pub reset_ms: u64,
}

impl Room {
    fn of(cap: Option<u64>, spent: u64, held: u64, reset_ms: u64) -> Option<Room> {
        let limit = cap?;
        Some(Room {
            limit,
            remaining: limit.saturating_sub(spent.saturating_add(held)),
            reset_ms,
        })
    }

    /// The tighter of two: less room, then the later reset.
    fn tighter(a: Option<Room>, b: Option<Room>) -> Option<Room> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if (b.remaining, a.reset_ms) < (a.remaining, b.reset_ms) {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        }
    }
}

/// The tightest token cap and the tightest USD cap of the ledgers a request is under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimit {
    pub tokens: Option<Room>,
    /// In pico-dollars.
    pub usd: Option<Room>,
}

impl RateLimit {
    /// Counts ledger `s` in.
    pub fn add(&mut self, s: &Seen) {
        let tokens = Room::of(s.caps.tokens, s.spent.tokens, s.held.tokens, s.reset_ms);
        let usd = Room::of(s.caps.pico, s.spent.pico, s.held.pico, s.reset_ms);
        self.tokens = Room::tighter(self.tokens, tokens);
        self.usd = Room::tighter(self.usd, usd);
    }

    /// The headers, by name and value.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(6);
        self.each_header(|name, value| out.push((name, value.to_string())));
        out
    }

    /// Hands each header to `set`, its value formatted on the stack (no allocation for the
    /// token headers: they go on every budgeted response).
    pub fn each_header(&self, mut set: impl FnMut(&'static str, &str)) {
        let mut buf = Text::default();
        if let Some(r) = self.tokens {
            set(LIMIT_TOKENS, buf.decimal(r.limit));
            set(REMAINING_TOKENS, buf.decimal(r.remaining));
            set(RESET_TOKENS, buf.duration(r.reset_ms));
        }
        if let Some(r) = self.usd {
            set(LIMIT_USD, &format_usd(r.limit));
            set(REMAINING_USD, &format_usd(r.remaining));
            set(RESET_USD, buf.duration(r.reset_ms));
        }
    }
}

/// A header value built on the stack: ASCII digits and units, at most 40 bytes (a `u64` of
/// milliseconds as a duration is 25).
struct Text {
    b: [u8; 40],
    n: usize,
}

impl Default for Text {
    fn default() -> Text {
        Text { b: [0; 40], n: 0 }
    }
}

impl Text {
    fn push(&mut self, bytes: &[u8]) {
        let end = (self.n + bytes.len()).min(self.b.len());
        self.b[self.n..end].copy_from_slice(&bytes[..end - self.n]);
        self.n = end;
    }

    fn push_decimal(&mut self, v: u64) {
        let mut digits = [0u8; 20];
        self.push(decimal(v, &mut digits));
    }

    fn as_str(&self) -> &str {
        // Only ASCII is ever pushed.
        std::str::from_utf8(&self.b[..self.n]).unwrap_or("")
    }

    fn decimal(&mut self, v: u64) -> &str {
        self.n = 0;
        self.push_decimal(v);
        self.as_str()
    }

    /// Go's duration format at millisecond precision, as OpenAI writes its resets.
    fn duration(&mut self, ms: u64) -> &str {
        self.n = 0;
        if ms == 0 {
            self.push(b"0s");
            return self.as_str();
        }
        if ms < 1000 {
            self.push_decimal(ms);
            self.push(b"ms");
            return self.as_str();
        }
        let (h, m) = (ms / 3_600_000, ms / 60_000 % 60);
        let (s, frac) = (ms / 1000 % 60, ms % 1000);
        if h > 0 {
            self.push_decimal(h);
            self.push(b"h");
        }
        if h > 0 || m > 0 {
            self.push_decimal(m);
            self.push(b"m");
        }
        self.push_decimal(s);
        if frac > 0 {
            // Three digits, trailing zeros dropped: 500 → ".5", 40 → ".04".
            let digits = [frac / 100, frac / 10 % 10, frac % 10].map(|d| b'0' + d as u8);
            let kept = digits.iter().rposition(|&d| d != b'0').map_or(0, |p| p + 1);
            self.push(b".");
            self.push(&digits[..kept]);
        }
        self.push(b"s");
        self.as_str()
    }
}

/// `v` in decimal, written at the end of `digits` (20 bytes hold every u64), without the
/// allocation `format!` makes: the written digits.
pub fn decimal(mut v: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &digits[i..];
        }
    }
}

/// `ms` as OpenAI writes its resets (Go's duration format at millisecond precision): `0s`,
/// `250ms`, `1s`, `8.64s`, `6m0s`, `1h0m0s`.
pub fn duration(ms: u64) -> String {
    Text::default().duration(ms).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_openai_writes_them() {
        for (ms, want) in [
            (0, "0s"),
            (1, "1ms"),
            (250, "250ms"),
            (1000, "1s"),
            (8640, "8.64s"),
            (60_000, "1m0s"),
            (360_000, "6m0s"),
            (3_599_001, "59m59.001s"),
            (3_600_000, "1h0m0s"),
            (90_061_500, "25h1m1.5s"),
            (61_040, "1m1.04s"),
            (u64::MAX, "5124095576030h25m51.615s"),
        ] {
            assert_eq!(duration(ms), want, "{ms}");
        }
    }

    fn seen(
        tokens: Option<u64>,
        pico: Option<u64>,
        spent: Amount,
        held: Amount,
        reset: u64,
    ) -> Seen {
        Seen {
            caps: Caps { tokens, pico },
            spent,
            held,
            reset_ms: reset,
        }
    }

    #[test]
    fn the_tightest_cap_of_each_kind_answers() {
        let mut r = RateLimit::default();
        // Tokens: 1000 − 300 − 100 = 600 left.
        r.add(&seen(
            Some(1000),
            None,
            Amount::new(300, 0),
            Amount::new(100, 0),
            5_000,
        ));
        // Tokens: 5000 − 4800 = 200 left (tighter); USD: 2 $ − 0.5 $ − 0.25 $ held.
        r.add(&seen(
            Some(5000),
            Some(2_000_000_000_000),
            Amount::new(4800, 500_000_000_000),
            Amount::new(0, 250_000_000_000),
            60_000,
        ));
        // Over its cap (a window changed): no room, not an underflow.
        let mut over = RateLimit::default();
        over.add(&seen(Some(10), None, Amount::new(30, 0), Amount::ZERO, 1));
        assert_eq!(over.tokens.map(|r| r.remaining), Some(0));
        let h = r.headers();
        let get = |n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(LIMIT_TOKENS), Some("5000"));
        assert_eq!(get(REMAINING_TOKENS), Some("200"));
        assert_eq!(get(RESET_TOKENS), Some("1m0s"));
        assert_eq!(get(LIMIT_USD), Some("2.0"));
        assert_eq!(get(REMAINING_USD), Some("1.25"));
        assert_eq!(get(RESET_USD), Some("1m0s"));
        // No USD cap anywhere: no USD headers.
        let mut t = RateLimit::default();
        t.add(&seen(Some(1), None, Amount::ZERO, Amount::ZERO, 0));
        assert_eq!(t.headers().len(), 3);
        assert_eq!(RateLimit::default().headers(), vec![]);
    }
}
