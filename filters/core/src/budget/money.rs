//! Money as integers: pico-dollars (10⁻¹² USD).
//!
//! Why pico: prices are quoted per million tokens with a few decimals (`0.075`), so one token
//! costs `price × 10⁻⁶` USD. With prices of up to six decimals that is a whole number of
//! pico-dollars, so every charge is exact and a million one-token requests add up to exactly the
//! cost of one million-token request. A `u64` holds about 18.4 million USD, far above any window
//! cap we accept ([`MAX_USD`]); arithmetic saturates rather than wraps.

/// Pico-dollars per dollar.
pub const PICO_PER_USD: u64 = 1_000_000_000_000;
/// Decimals a price per million tokens may have: the sixth is one pico-dollar per token.
pub const PRICE_DECIMALS: usize = 6;
/// The largest `maxUSD` accepted, in whole dollars: sums of a window stay far from `u64::MAX`.
pub const MAX_USD: u64 = 1_000_000;

/// Price of one token in pico-dollars, for the prompt and the completion side of a backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    pub prompt: u64,
    pub completion: u64,
}

impl Price {
    /// From `costPerMillionTokens.promptUSD` / `completionUSD` (absent = free).
    pub fn from_per_million(
        prompt: Option<&str>,
        completion: Option<&str>,
    ) -> Result<Price, String> {
        let one = |s: Option<&str>| match s {
            None => Ok(0),
            Some(s) => parse_decimal(s, PRICE_DECIMALS).map_err(|why| format!("{s:?}: {why}")),
        };
        Ok(Price {
            prompt: one(prompt)?,
            completion: one(completion)?,
        })
    }

    /// Cost of a request, exact: `prompt × promptUSD / 10⁶ + completion × completionUSD / 10⁶`.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> u64 {
        let total = (prompt_tokens as u128) * (self.prompt as u128)
            + (completion_tokens as u128) * (self.completion as u128);
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    /// The dearer of two prices on each side: the bound for a request that may be served by
    /// either backend (fallback order).
    pub fn max(self, other: Price) -> Price {
        Price {
            prompt: self.prompt.max(other.prompt),
            completion: self.completion.max(other.completion),
        }
    }
}

/// `maxUSD` (`^[0-9]+(\.[0-9]+)?$`, at most 12 decimals, at most [`MAX_USD`]) in pico-dollars.
pub fn parse_usd(s: &str) -> Result<u64, String> {
    let pico = parse_decimal(s, 12).map_err(|why| format!("{s:?}: {why}"))?;
    if pico > MAX_USD * PICO_PER_USD {
        return Err(format!(
            "{s:?}: over the largest accepted cap of {MAX_USD} USD"
        ));
    }
    Ok(pico)
}

/// Pico-dollars as a decimal USD string: `0.0`, `1.5`, `0.00000015`. Exact, no trailing zeros
/// beyond the first decimal (the seed's `usdUsed` is a string so no float rounding creeps in).
pub fn format_usd(pico: u64) -> String {
    // By hand, not `format!`: this runs for every settled request's audit line, and the
    // formatting machinery (padding, `Display`) costs the filter more than the digits.
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = pico;
    // At least 13 digits: the twelve of the fraction (leading zeros included) and one whole.
    while v > 0 || digits.len() - i < 13 {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    let (whole, frac) = digits[i..].split_at(digits.len() - i - 12);
    let kept = frac.iter().rposition(|&d| d != b'0').map_or(0, |p| p + 1);
    let mut out = String::with_capacity(whole.len() + 1 + kept.max(1));
    out.extend(whole.iter().map(|&d| char::from(d)));
    out.push('.');
    match kept {
        0 => out.push('0'),
        _ => out.extend(frac[..kept].iter().map(|&d| char::from(d))),
    }
    out
}

/// `used / cap` as the seed's `utilization` string (`0.0` to `1.0`, four decimals at most, cut
/// not rounded up). Above the cap (settle error) it reads `1.0`.
pub fn format_fraction(used: u64, cap: u64) -> String {
    if cap == 0 || used >= cap {
        return "1.0".to_string();
    }
    let tenk = ((used as u128) * 10_000 / (cap as u128)) as u64;
    let frac = format!("{tenk:04}");
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        "0.0".to_string()
    } else {
        format!("0.{frac}")
    }
}

/// Parses `digits[.digits]` with at most `max_decimals` decimals into an integer scaled by
/// `10^max_decimals`.
fn parse_decimal(s: &str, max_decimals: usize) -> Result<u64, String> {
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (s, None),
    };
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit());
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return Err("not a decimal number like 0.15".to_string());
    }
    let frac = frac.unwrap_or("");
    if frac.len() > max_decimals {
        return Err(format!("more than {max_decimals} decimals"));
    }
    let scale = 10u128.pow(max_decimals as u32);
    let w: u128 = whole.parse().map_err(|_| "too large".to_string())?;
    let mut f: u128 = 0;
    for c in frac.bytes() {
        f = f * 10 + u128::from(c - b'0');
    }
    f *= 10u128.pow((max_decimals - frac.len()) as u32);
    let v = w
        .checked_mul(scale)
        .and_then(|x| x.checked_add(f))
        .ok_or_else(|| "too large".to_string())?;
    u64::try_from(v).map_err(|_| "too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_are_pico_dollars_per_token() {
        let p = Price::from_per_million(Some("0.15"), Some("0.6")).unwrap();
        assert_eq!(p.prompt, 150_000);
        assert_eq!(p.completion, 600_000);
        let p = Price::from_per_million(Some("3"), Some("0.000001")).unwrap();
        assert_eq!((p.prompt, p.completion), (3_000_000, 1));
        assert!(Price::from_per_million(Some("0.0000001"), None).is_err());
        for bad in ["", ".5", "1.", "1e3", "-1", "1,5", " 1"] {
            assert!(Price::from_per_million(Some(bad), None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_million_tiny_requests_add_up_exactly() {
        let p = Price::from_per_million(Some("0.075"), Some("0.3")).unwrap();
        let mut sum = 0u64;
        for _ in 0..1_000_000 {
            sum += p.cost(1, 1);
        }
        assert_eq!(sum, p.cost(1_000_000, 1_000_000));
        // 10⁶ tokens at 0.075 USD/M is 0.075 USD, and 10⁶ at 0.3 is 0.3: 0.375 USD exactly.
        assert_eq!(format_usd(sum), "0.375");
    }

    #[test]
    fn usd_caps_parse_and_print_exactly() {
        assert_eq!(parse_usd("5").unwrap(), 5 * PICO_PER_USD);
        assert_eq!(parse_usd("0.000000000001").unwrap(), 1);
        assert_eq!(parse_usd("1000000").unwrap(), MAX_USD * PICO_PER_USD);
        assert!(parse_usd("1000000.01").is_err());
        assert!(parse_usd("0.0000000000001").is_err());
        assert!(parse_usd("99999999999999999999999").is_err());
        assert_eq!(format_usd(0), "0.0");
        assert_eq!(format_usd(150_000), "0.00000015");
        assert_eq!(format_usd(2_500_000_000_000), "2.5");
        assert_eq!(parse_usd(&format_usd(123_456_789)).unwrap(), 123_456_789);
        // The hand-written digits say what `format!` said, at every magnitude and at the ends.
        let by_fmt = |pico: u64| {
            let frac = format!("{:012}", pico % PICO_PER_USD);
            let frac = frac.trim_end_matches('0');
            let whole = pico / PICO_PER_USD;
            if frac.is_empty() {
                format!("{whole}.0")
            } else {
                format!("{whole}.{frac}")
            }
        };
        let mut x: u64 = 1;
        for _ in 0..64 {
            for v in [x - 1, x, x + 1, x.wrapping_mul(7) / 3, u64::MAX - x] {
                assert_eq!(format_usd(v), by_fmt(v), "{v}");
            }
            x = x.saturating_mul(2);
        }
        for v in [
            PICO_PER_USD,
            PICO_PER_USD * 10,
            10,
            100_000_000_000,
            u64::MAX,
        ] {
            assert_eq!(format_usd(v), by_fmt(v), "{v}");
        }
    }

    #[test]
    fn utilization_is_a_fraction_cut_to_four_decimals() {
        assert_eq!(format_fraction(0, 100), "0.0");
        assert_eq!(format_fraction(50, 100), "0.5");
        assert_eq!(format_fraction(1, 3), "0.3333");
        assert_eq!(format_fraction(99_999, 100_000), "0.9999");
        assert_eq!(format_fraction(100, 100), "1.0");
        assert_eq!(format_fraction(150, 100), "1.0");
    }
}
