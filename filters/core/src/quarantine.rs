//! Backends the filter itself keeps out of attempt orders for a while.
//!
//! Envoy's outlier detection quarantines a backend after a 5xx or a refused connection, but a
//! stream cut by the route's idle timeout never reaches it (Envoy counts that as a downstream
//! event). The ModelRouter spec wants exactly that case quarantined ("a wedged replica stops
//! receiving traffic"), so the downstream filter records it here, in the host's shared data (one
//! table for every worker), and leaves the backend out of the orders it stamps until the deadline passes.
//! After the deadline the backend is simply eligible again: the next failure quarantines it anew,
//! which is the half-open probe.
//!
//! Wire format of the shared-data value (`QuarantineCodec`, behind the table version): one
//! little-endian `u64` deadline (host clock, ns) per backend index; 0 means not quarantined.
//! Short or foreign values decode as "nobody".

use crate::shared_codec::Codec;

/// The shared-data table name (`table::key`).
pub const TABLE: &str = "quarantine";
/// Envoy's response code details when the route/HCM idle timeout ends a stream.
pub const STREAM_IDLE_DETAILS: &[u8] = b"stream_idle_timeout";

/// The backend to quarantine when a response ends: one whose response started (`served`, status
/// below 500) and never finished because the stream idle timeout cut it (`code_details`).
/// Client cancels and complete streams quarantine nobody.
pub fn went_silent(
    served: Option<usize>,
    complete: bool,
    code_details: Option<&[u8]>,
) -> Option<usize> {
    served.filter(|_| !complete && code_details == Some(STREAM_IDLE_DETAILS))
}

/// The quarantine table of a router with `backends` backends.
#[derive(Debug, Clone, Copy)]
pub struct QuarantineCodec {
    pub backends: usize,
}

impl Codec for QuarantineCodec {
    type Value = Quarantine;
    const VERSION: u8 = 1;
    fn empty(&self) -> Quarantine {
        Quarantine::new(self.backends)
    }
    fn max_bytes(&self) -> usize {
        self.backends.saturating_mul(8)
    }
    fn encode(&self, value: &Quarantine, out: &mut Vec<u8>) {
        out.extend(value.until.iter().flat_map(|t| t.to_le_bytes()));
    }
    fn decode(&self, payload: &[u8]) -> Option<Quarantine> {
        Some(Quarantine::decode(payload, self.backends))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Quarantine {
    until: Vec<u64>,
}

impl Quarantine {
    pub fn new(backends: usize) -> Self {
        Quarantine {
            until: vec![0; backends],
        }
    }

    /// Reads a stored table for a router with `backends` backends; whatever does not fit that
    /// shape (another config generation, garbage) counts as empty rather than as an error.
    pub fn decode(raw: &[u8], backends: usize) -> Self {
        if raw.len() != backends * 8 {
            return Quarantine::new(backends);
        }
        Quarantine {
            until: raw
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.until.len() * 8);
        QuarantineCodec {
            backends: self.until.len(),
        }
        .encode(self, &mut out);
        out
    }

    /// Quarantines `backend` until `deadline` (a later deadline already set wins). Returns
    /// whether the table changed.
    pub fn mark(&mut self, backend: usize, deadline: u64) -> bool {
        match self.until.get_mut(backend) {
            Some(t) if *t < deadline => {
                *t = deadline;
                true
            }
            _ => false,
        }
    }

    pub fn is_quarantined(&self, backend: usize, now: u64) -> bool {
        self.until.get(backend).is_some_and(|&t| t > now)
    }

    /// Whether anyone is quarantined at `now` (the common answer is no: skip the order work).
    pub fn any(&self, now: u64) -> bool {
        self.until.iter().any(|&t| t > now)
    }

    /// The deadlines after `now`, ascending, each once: the moments the table next changes.
    pub fn deadlines_after(&self, now: u64) -> Vec<u64> {
        let mut d: Vec<u64> = self.until.iter().copied().filter(|&t| t > now).collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

/// Whole seconds from `now` to `deadline` (host clock, ns), rounded up and at least 1: what a
/// `Retry-After` header says.
pub fn seconds_until(deadline: u64, now: u64) -> u64 {
    deadline.saturating_sub(now).div_ceil(1_000_000_000).max(1)
}

/// How long Envoy keeps a backend ejected, as this worker knows it. Envoy's outlier detection
/// ejects a backend after one 5xx for `quarantineDuration`, released on its next 1 s interval
/// tick; the filter cannot read Envoy's ejection table, so it remembers when it saw each backend
/// fail. A backend it never saw fail (another worker did, or the health check) counts as ejected
/// just now: the answer is then an upper bound.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ejections {
    /// Per backend index: when this worker last saw it fail (host clock, ns); 0 = never.
    failed_at: Vec<u64>,
}

/// Envoy's outlier detection `interval` in the generated clusters: an ejection ends on the first
/// tick after `base_ejection_time`.
pub const EJECTION_RELEASE_TICK_NS: u64 = 1_000_000_000;

impl Ejections {
    pub fn new(backends: usize) -> Self {
        Ejections {
            failed_at: vec![0; backends],
        }
    }

    /// `backend` answered a 5xx at `now`: Envoy ejected it.
    pub fn record(&mut self, backend: usize, now: u64) {
        if let Some(t) = self.failed_at.get_mut(backend) {
            *t = now;
        }
    }

    /// Seconds until the first backend of `order` is back from its ejection (each ejected for
    /// `duration_ns`), when a request over `order` failed with every one of them ejected.
    pub fn retry_after(&self, order: &[usize], now: u64, duration_ns: u64) -> Option<u64> {
        order
            .iter()
            .map(|&b| {
                let seen = self.failed_at.get(b).copied().unwrap_or(0);
                let since = if seen == 0 || seen > now { now } else { seen };
                since
                    .saturating_add(duration_ns)
                    .saturating_add(EJECTION_RELEASE_TICK_NS)
            })
            .min()
            .map(|back| seconds_until(back, now))
    }
}

/// Whether a final 5xx answer leaves the backends of its order ejected by Envoy's outlier
/// detection: a backend's own 5xx (`via_upstream`, consecutive_5xx 1) or Envoy finding none of
/// them healthy (`no_healthy_upstream`). Timeouts and resets are local-origin failures the
/// generated clusters do not eject on, and an unknown cause claims nothing.
pub fn left_ejected(status: u32, code_details: Option<&[u8]>) -> bool {
    status >= 500
        && status != 504
        && matches!(
            code_details,
            Some(b"via_upstream") | Some(b"no_healthy_upstream")
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_ignores_foreign_shapes() {
        let mut q = Quarantine::new(3);
        assert!(q.mark(1, 500));
        assert!(
            !q.mark(1, 400),
            "an earlier deadline does not shorten a quarantine"
        );
        assert!(!q.mark(7, 900), "unknown backend index");
        let raw = q.encode();
        assert_eq!(raw.len(), 24);
        assert_eq!(Quarantine::decode(&raw, 3), q);
        assert_eq!(Quarantine::decode(&raw, 4), Quarantine::new(4));
        assert_eq!(Quarantine::decode(b"garbage", 3), Quarantine::new(3));
        assert_eq!(Quarantine::decode(&[], 0), Quarantine::new(0));
    }

    #[test]
    fn the_table_value_is_versioned_and_sized_by_the_router() {
        let codec = QuarantineCodec { backends: 2 };
        let mut q = Quarantine::new(2);
        q.mark(1, 77);
        let raw = crate::shared_codec::encode(&codec, &q).unwrap();
        assert_eq!(raw.len(), 1 + 16);
        assert_eq!(crate::shared_codec::decode(&codec, &raw), q);
        // The unversioned layout, or another router's size, reads as nobody.
        assert_eq!(
            crate::shared_codec::decode(&codec, &q.encode()),
            Quarantine::new(2)
        );
        let three = QuarantineCodec { backends: 3 };
        assert_eq!(
            crate::shared_codec::decode(&three, &raw),
            Quarantine::new(3)
        );
    }

    #[test]
    fn only_a_started_stream_cut_idle_quarantines() {
        let idle = Some(STREAM_IDLE_DETAILS);
        assert_eq!(went_silent(Some(2), false, idle), Some(2));
        assert_eq!(went_silent(Some(2), true, idle), None, "it finished");
        assert_eq!(went_silent(None, false, idle), None, "no backend answered");
        assert_eq!(
            went_silent(Some(2), false, Some(b"downstream_remote_disconnect")),
            None
        );
        assert_eq!(went_silent(Some(2), false, None), None);
    }

    #[test]
    fn ejections_count_from_the_failure_seen_else_from_now() {
        const S: u64 = 1_000_000_000;
        let mut e = Ejections::new(3);
        e.record(1, 10 * S);
        e.record(9, 10 * S);
        // Backend 1 failed at 10 s, ejected for 15 s, released on the next 1 s tick: 26 s.
        assert_eq!(e.retry_after(&[1], 12 * S, 15 * S), Some(14));
        // Never seen failing: an upper bound, the whole duration from now.
        assert_eq!(e.retry_after(&[0], 12 * S, 15 * S), Some(16));
        assert_eq!(e.retry_after(&[0, 1], 12 * S, 15 * S), Some(14));
        assert_eq!(e.retry_after(&[1], 40 * S, 15 * S), Some(1));
        assert_eq!(e.retry_after(&[], 40 * S, 15 * S), None);
        assert_eq!(seconds_until(S + 1, 0), 2);
        assert_eq!(seconds_until(0, 5), 1);
    }

    #[test]
    fn only_a_backends_own_5xx_or_no_healthy_upstream_ejects() {
        assert!(left_ejected(500, Some(b"via_upstream")));
        assert!(left_ejected(503, Some(b"no_healthy_upstream")));
        assert!(!left_ejected(504, Some(b"via_upstream")));
        assert!(!left_ejected(504, Some(b"upstream_per_try_timeout")));
        assert!(!left_ejected(
            503,
            Some(b"upstream_reset_before_response_started{remote_reset}")
        ));
        assert!(!left_ejected(503, None));
        assert!(!left_ejected(429, Some(b"via_upstream")));
    }

    #[test]
    fn deadlines_expire() {
        let mut q = Quarantine::new(2);
        q.mark(0, 1_000);
        assert!(q.is_quarantined(0, 999));
        assert!(!q.is_quarantined(0, 1_000));
        assert!(!q.is_quarantined(1, 0));
        assert!(q.any(999));
        assert!(!q.any(1_000));
        q.mark(1, 500);
        assert_eq!(q.deadlines_after(400), [500, 1_000]);
        assert_eq!(q.deadlines_after(500), [1_000]);
    }
}
