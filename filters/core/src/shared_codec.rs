//! Values the filters keep in the host's shared data (one store for every worker), as bytes.
//!
//! Each value is framed with its codec's version so that a worker of another configuration
//! generation, or another build, reads a value it does not understand as empty rather than as
//! something else; and bounded, so no table grows past what its codec allows. The edge crate's
//! shared table does the key scheme, compare-and-swap and refresh; a codec here says what the
//! bytes mean (the quarantine today; budget ledgers, a prefix index, sessions next).

/// How one table's value is written.
pub trait Codec {
    type Value;
    /// Written ahead of the payload; a value with another version decodes as empty.
    const VERSION: u8;
    /// The value of a table nobody wrote yet (or one that did not decode).
    fn empty(&self) -> Self::Value;
    /// Largest payload this table may hold.
    fn max_bytes(&self) -> usize;
    fn encode(&self, value: &Self::Value, out: &mut Vec<u8>);
    /// `None` when the payload does not fit this codec.
    fn decode(&self, payload: &[u8]) -> Option<Self::Value>;
}

/// The encoded value would exceed the codec's bound; nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge {
    pub bytes: usize,
    pub max: usize,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes exceed the table's {} byte bound",
            self.bytes, self.max
        )
    }
}

/// The stored bytes of `value`: version, then payload.
pub fn encode<C: Codec>(codec: &C, value: &C::Value) -> Result<Vec<u8>, TooLarge> {
    let mut out = vec![C::VERSION];
    codec.encode(value, &mut out);
    let bytes = out.len() - 1;
    let max = codec.max_bytes();
    if bytes > max {
        return Err(TooLarge { bytes, max });
    }
    Ok(out)
}

/// The value stored as `raw`; whatever is not this codec's (another version, too long, garbage)
/// is empty.
pub fn decode<C: Codec>(codec: &C, raw: &[u8]) -> C::Value {
    match raw.split_first() {
        Some((&v, payload)) if v == C::VERSION && payload.len() <= codec.max_bytes() => {
            codec.decode(payload).unwrap_or_else(|| codec.empty())
        }
        _ => codec.empty(),
    }
}

/// The shared-data key of table `name` of router `router`.
pub fn key(name: &str, router: &str) -> String {
    format!("llmkube.{name}/{router}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of small counters, as a ledger would keep.
    struct Counts {
        max: usize,
    }

    impl Codec for Counts {
        type Value = Vec<u16>;
        const VERSION: u8 = 7;
        fn empty(&self) -> Vec<u16> {
            Vec::new()
        }
        fn max_bytes(&self) -> usize {
            self.max
        }
        fn encode(&self, v: &Vec<u16>, out: &mut Vec<u8>) {
            out.extend(v.iter().flat_map(|c| c.to_le_bytes()));
        }
        fn decode(&self, p: &[u8]) -> Option<Vec<u16>> {
            p.len().is_multiple_of(2).then(|| {
                p.chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect()
            })
        }
    }

    #[test]
    fn values_round_trip_behind_their_version() {
        let c = Counts { max: 8 };
        let raw = encode(&c, &vec![1, 513]).unwrap();
        assert_eq!(raw, [7, 1, 0, 1, 2]);
        assert_eq!(decode(&c, &raw), vec![1, 513]);
    }

    #[test]
    fn foreign_values_decode_as_empty() {
        let c = Counts { max: 8 };
        for raw in [
            &[][..],
            &[6, 1, 0],
            &[7, 1],
            &[7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ] {
            assert_eq!(decode(&c, raw), Vec::<u16>::new(), "{raw:?}");
        }
    }

    #[test]
    fn values_past_the_bound_are_not_written() {
        let c = Counts { max: 4 };
        assert_eq!(
            encode(&c, &vec![1, 2, 3]),
            Err(TooLarge { bytes: 6, max: 4 })
        );
        assert!(encode(&c, &vec![1, 2]).is_ok());
    }

    #[test]
    fn keys_name_table_and_router() {
        assert_eq!(key("quarantine", "ns/r"), "llmkube.quarantine/ns/r");
    }
}
