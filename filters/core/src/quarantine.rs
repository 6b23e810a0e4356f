//! Backends the filter itself keeps out of attempt orders for a while.
//!
//! Envoy's outlier detection quarantines a backend after a 5xx or a refused connection, but a
//! stream cut by the route's idle timeout never reaches it (Envoy counts that as a downstream
//! event). The seed wants exactly that case quarantined ("a wedged replica stops receiving
//! traffic"), so the downstream filter records it here, in the host's shared data (one table for
//! every worker), and leaves the backend out of the orders it stamps until the deadline passes.
//! After the deadline the backend is simply eligible again: the next failure quarantines it anew,
//! which is the half-open probe.
//!
//! Wire format of the shared-data value: one little-endian `u64` deadline (host clock, ns) per
//! backend index; 0 means not quarantined. Short or foreign values decode as "nobody".

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
        self.until.iter().flat_map(|t| t.to_le_bytes()).collect()
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
