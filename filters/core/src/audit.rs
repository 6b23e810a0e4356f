//! The audit record: one JSON line per request, always on (`spec.policy.auditLog`).
//!
//! Built from what the filter saw; never from credential headers (the generator refuses a
//! credential `callerHeader`, and nothing else here reads request headers beyond the decision
//! inputs).

use serde::Serialize;
use std::net::IpAddr;

/// Prefix of every audit line in the gateway's log, so collectors can pick them out.
pub const AUDIT_PREFIX: &str = "llmkube-audit ";

/// The audit line's first allocation (a typical line fits; a longer one grows as it must).
const LINE_CAPACITY: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    OkStream,
    NoRoute,
    FailClosed,
    FailClosedRuntime,
    AllBackendsFailed,
    BudgetExceeded,
    /// `policy.auth.allowlists` refused the team or the model.
    NotAllowed,
    InvalidRequest,
    /// The upstream answered with an error we passed through (a 4xx).
    UpstreamError,
    /// The client went away before a response.
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OkStream => "ok_stream",
            Outcome::NoRoute => "no_route",
            Outcome::FailClosed => "fail_closed",
            Outcome::FailClosedRuntime => "fail_closed_runtime",
            Outcome::AllBackendsFailed => "all_backends_failed",
            Outcome::BudgetExceeded => "budget_exceeded",
            Outcome::NotAllowed => "not_allowed",
            Outcome::InvalidRequest => "invalid_request",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditRecord {
    pub request_id: Option<String>,
    pub router: String,
    pub model: Option<String>,
    pub classification: Option<String>,
    pub task_complexity: Option<String>,
    pub rule: Option<String>,
    pub backend: Option<String>,
    pub tier: Option<&'static str>,
    pub status: u32,
    pub outcome: Option<Outcome>,
    pub latency_ms: f64,
    pub attempts: u32,
    /// A sensitive request was answered by a cloud backend (should be impossible; reported loudly).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub violation: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_body: Option<String>,
    /// Budgets the request was charged to or refused by: `name`, or `name/team` for team budgets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<String>,
    /// The tokens of a served response: what it reported, a missing side estimated (then
    /// `usage_estimated`); what budgets charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<AuditTokens>,
    /// USD charged at the serving backend's prices, an exact decimal string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd: Option<String>,
    /// Some of the charge is an estimate: the response carried no (or partial) usage.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub usage_estimated: bool,
    /// The budgets were not enforced: the shared ledger was unavailable and the budgets fail
    /// open (`--budgets-fail-open`), so the request went on without a reservation.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub budgets_unenforced: bool,
    /// The body was over the gateway's replay limit: the request got one attempt although its
    /// order has other backends (`replay::failover_skipped`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub failover_skipped: bool,
    /// Backends a shadow copy of this request went to (`shadow`), when the filter sends them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadow_sent: Vec<String>,
    /// Backends whose copy was dropped: that many copies to it were already in flight.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shadow_dropped: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AuditTokens {
    pub prompt: u64,
    pub completion: u64,
    /// Prompt tokens the engine served from its prompt cache, when the response said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached: Option<u64>,
}

impl AuditRecord {
    pub fn line(&self) -> String {
        // One buffer, sized for a routed and budgeted request's line (about 300 bytes), and
        // the record written into it after the prefix: no second buffer to copy over, and no
        // doubling from serde_json's 128 bytes on the way.
        let mut out = Vec::with_capacity(LINE_CAPACITY);
        out.extend_from_slice(AUDIT_PREFIX.as_bytes());
        if serde_json::to_writer(&mut out, self).is_err() {
            out.truncate(AUDIT_PREFIX.len());
        }
        // serde_json writes UTF-8 (it is what `to_string` assumes too); never fails here.
        String::from_utf8(out).unwrap_or_default()
    }
}

/// A request id for a request that arrived without `x-request-id` (a gateway that sets none), as
/// a UUID v4 from two random words, the form Envoy's own ids have.
pub fn new_request_id(a: u64, b: u64) -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        (b >> 48 & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// `callerHeader`'s value as the ModelRouter spec says: cut to 128 bytes, anything outside printable ASCII
/// replaced by '?'.
pub fn caller_label(raw: &[u8]) -> String {
    let raw = &raw[..raw.len().min(128)];
    // The usual case (a request id, a client name): printable ASCII, taken as it is.
    if raw.iter().all(|b| (0x20..0x7f).contains(b)) {
        return String::from_utf8(raw.to_vec()).unwrap_or_default();
    }
    raw.iter()
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '?'
            }
        })
        .collect()
}

/// A parsed `trustedProxyCIDRs` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.trim().parse::<u8>().ok().filter(|&n| n <= max)?,
            None => max,
        };
        Some(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0);
                u32::from(n) & mask == u32::from(i) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix as u32).unwrap_or(0);
                u128::from(n) & mask == u128::from(i) & mask
            }
            _ => false,
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Parses `ip`, `ip:port` or `[v6]:port` (Envoy's `source.address`).
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    None
}

/// The client address to log: the TCP peer, unless the peer is a trusted proxy; then the first
/// X-Forwarded-For entry, read from the right, that is not a trusted proxy.
pub fn client_address(peer: &str, xff: &[&str], trusted: &[Cidr]) -> String {
    let Some(peer_ip) = parse_ip(peer) else {
        return peer.to_string();
    };
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer_ip) {
        return peer_ip.to_string();
    }
    let hops: Vec<&str> = xff
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    for hop in hops.iter().rev() {
        match parse_ip(hop) {
            Some(ip) if is_trusted(ip) => continue,
            Some(ip) => return ip.to_string(),
            // Garbage in the chain: stop believing it here.
            None => break,
        }
    }
    peer_ip.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_is_cut_and_sanitised() {
        assert_eq!(caller_label(b"team-a\x01\xff"), "team-a??");
        assert_eq!(caller_label(&[b'x'; 300]).len(), 128);
    }

    #[test]
    fn client_address_believes_only_trusted_proxies() {
        let trusted = [
            Cidr::parse("10.0.0.0/8").unwrap(),
            Cidr::parse("192.0.2.7").unwrap(),
        ];
        // Untrusted peer: XFF ignored.
        assert_eq!(
            client_address("203.0.113.5:4000", &["1.2.3.4"], &trusted),
            "203.0.113.5"
        );
        // Trusted peer: rightmost untrusted hop.
        assert_eq!(
            client_address(
                "10.1.2.3:5000",
                &["1.2.3.4, 198.51.100.9, 192.0.2.7"],
                &trusted
            ),
            "198.51.100.9"
        );
        // All hops trusted: the peer.
        assert_eq!(
            client_address("10.1.2.3:5000", &["10.9.9.9"], &trusted),
            "10.1.2.3"
        );
        // No trust configured: always the peer.
        assert_eq!(
            client_address("10.1.2.3:5000", &["1.2.3.4"], &[]),
            "10.1.2.3"
        );
        // IPv6 peer and mapped v4.
        let v6 = [
            Cidr::parse("::ffff:10.0.0.0/104").unwrap(),
            Cidr::parse("fd00::/8").unwrap(),
        ];
        assert_eq!(
            client_address("[fd00::1]:80", &["2001:db8::5"], &v6),
            "2001:db8::5"
        );
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("nonsense").is_none());
    }

    #[test]
    fn audit_line_is_one_json_object() {
        let r = AuditRecord {
            router: "llm/demo".into(),
            model: Some("m".into()),
            status: 200,
            outcome: Some(Outcome::OkStream),
            ..Default::default()
        };
        let line = r.line();
        let json = line.strip_prefix(AUDIT_PREFIX).unwrap();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["outcome"], "ok_stream");
        assert_eq!(v["router"], "llm/demo");
        assert!(v.get("violation").is_none());
        assert!(!line.contains('\n'));
    }

    #[test]
    fn generated_request_ids_look_like_envoys() {
        let id = new_request_id(u64::MAX, 0);
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "{id}");
        assert_ne!(new_request_id(1, 2), new_request_id(1, 3));
        assert_eq!(caller_label(id.as_bytes()), id);
    }
}
