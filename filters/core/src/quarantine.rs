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

use crate::table::Codec;

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
        let raw = crate::table::encode(&codec, &q).unwrap();
        assert_eq!(raw.len(), 1 + 16);
        assert_eq!(crate::table::decode(&codec, &raw), q);
        // The unversioned layout, or another router's size, reads as nobody.
        assert_eq!(
            crate::table::decode(&codec, &q.encode()),
            Quarantine::new(2)
        );
        let three = QuarantineCodec { backends: 3 };
        assert_eq!(crate::table::decode(&three, &raw), Quarantine::new(3));
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
    fn deadlines_expire() {
        let mut q = Quarantine::new(2);
        q.mark(0, 1_000);
        assert!(q.is_quarantined(0, 999));
        assert!(!q.is_quarantined(0, 1_000));
        assert!(!q.is_quarantined(1, 0));
        assert!(q.any(999));
        assert!(!q.any(1_000));
    }
}
