//! Lexical checks shared by the validators (names, tokens, numbers, addresses).

use std::net::IpAddr;

/// `^[a-z0-9][a-z0-9-]{0,62}$`
pub fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// `^[0-9]+(\.[0-9]+)?$`
pub fn is_decimal(s: &str) -> bool {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    !int.is_empty()
        && int.bytes().all(|c| c.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()))
}

/// RFC 1123 label: `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, at most 63.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A CIDR (`10.0.0.0/8`, `fd00::/8`) or a single address.
pub fn is_cidr_or_addr(s: &str) -> bool {
    match s.split_once('/') {
        None => s.parse::<IpAddr>().is_ok(),
        Some((ip, len)) => match (ip.parse::<IpAddr>(), len.parse::<u8>()) {
            (Ok(IpAddr::V4(_)), Ok(l)) => l <= 32 && !len.starts_with('+'),
            (Ok(IpAddr::V6(_)), Ok(l)) => l <= 128 && !len.starts_with('+'),
            _ => false,
        },
    }
}

/// A `match.models` pattern, parsed by the filter's own glob compiler so that `validate` accepts
/// exactly the patterns the filter loads.
pub fn check_glob(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("empty pattern".into());
    }
    router_core::glob::Glob::new(s)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
