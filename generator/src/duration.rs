//! Go `time.ParseDuration` syntax, parsed strictly: `[-+]?(<decimal><unit>)+` or a bare `0`, units
//! `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`. Negative durations are refused (no field of the
//! ModelRouter spec can use one).

use std::time::Duration;

/// Parses a Go duration string. The error names what is wrong, for a problem line.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        Err(format!(
            "invalid duration {s:?}: {why} (Go syntax, e.g. \"15s\", \"2m\", \"1h30m\", \"500ms\")"
        ))
    };
    let mut rest = s;
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    } else if rest.starts_with('-') {
        return bad("must not be negative");
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return bad("empty");
    }
    let mut total_ns: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(r) = rest.strip_prefix('.') {
            let frac_len = r.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &r[..frac_len];
            rest = &r[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return bad("expected a number");
        }
        let unit_len = rest
            .char_indices()
            .find(|(_, c)| c.is_ascii_digit() || *c == '.')
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return bad("missing unit"),
            _ => return bad(&format!("unknown unit {unit:?}")),
        };
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            match int_part.parse::<u128>() {
                Ok(v) if v <= u64::MAX as u128 => v,
                _ => return bad("overflow"),
            }
        };
        let mut value = int.checked_mul(unit_ns);
        if !frac_part.is_empty() {
            // Fraction of the unit, truncated to whole nanoseconds as Go does.
            let digits = &frac_part[..frac_part.len().min(18)];
            let frac: u128 = digits.parse().unwrap_or(0);
            let scale = 10u128.pow(digits.len() as u32);
            value = value.and_then(|v| v.checked_add(frac * unit_ns / scale));
        }
        total_ns = match value.and_then(|v| total_ns.checked_add(v)) {
            Some(t) if t <= i64::MAX as u128 => t,
            _ => return bad("overflow"),
        };
    }
    Ok(Duration::from_nanos(total_ns as u64))
}

/// Renders a duration the way Envoy's JSON mapping of `google.protobuf.Duration` wants it.
pub fn envoy_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        let s = format!("{}.{:09}", d.as_secs(), d.subsec_nanos());
        format!("{}s", s.trim_end_matches('0'))
    }
}

/// Renders a duration for Gateway API / Envoy Gateway fields (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`):
/// whole hours, minutes, seconds and milliseconds, largest units first (`0s` for zero).
pub fn gateway_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        let n = if unit == "h" {
            ms / size
        } else {
            ms % (size * if unit == "ms" { 1000 } else { 60 }) / size
        };
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_go_syntax() {
        assert_eq!(parse_duration("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("10µs").unwrap(), Duration::from_micros(10));
        assert_eq!(
            parse_duration("1h1m1s1ms").unwrap(),
            Duration::from_millis(3_661_001)
        );
    }

    #[test]
    fn refuses_everything_else() {
        for s in [
            "",
            "15",
            "1.5",
            "s",
            "15 s",
            " 15s",
            "15s ",
            "1d",
            "15S",
            "-1s",
            "1.s.",
            "1e3s",
            "10sec",
            "9999999999999h",
        ] {
            assert!(parse_duration(s).is_err(), "{s:?} should be refused");
        }
        assert_eq!(
            parse_duration("15").unwrap_err(),
            "invalid duration \"15\": missing unit (Go syntax, e.g. \"15s\", \"2m\", \"1h30m\", \"500ms\")"
        );
    }

    #[test]
    fn gateway_rendering() {
        assert_eq!(gateway_duration(Duration::from_secs(300)), "5m");
        assert_eq!(gateway_duration(Duration::from_secs(15)), "15s");
        assert_eq!(gateway_duration(Duration::from_millis(1500)), "1s500ms");
        assert_eq!(gateway_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(gateway_duration(Duration::ZERO), "0s");
        assert_eq!(gateway_duration(Duration::from_secs(3601)), "1h1s");
    }

    #[test]
    fn envoy_rendering() {
        assert_eq!(envoy_duration(Duration::from_secs(300)), "300s");
        assert_eq!(envoy_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(envoy_duration(Duration::ZERO), "0s");
    }
}
