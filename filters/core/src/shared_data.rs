//! The host's shared key-value store (proxy-wasm shared data) as every user of it sees it, and
//! the one read → change → compare-and-swap loop they all write through: budget ledgers, their
//! gauges and leases, the filter's shared tables and the broadcast member list.

/// Attempts per update before giving up: each failed CAS means another writer's update went
/// through, so this only ends a pathological storm.
pub const MAX_CAS_ATTEMPTS: usize = 64;

/// The host failed a read (anything but "absent").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadFailed;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetError {
    CasMismatch,
    /// Any other host failure.
    Host,
}

/// The host's shared data, as the proxy-wasm ABI offers it (or a stand-in in tests).
pub trait SharedData {
    /// The value and its CAS token; `Ok(None)` when the key is absent.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, ReadFailed>;
    /// Writes `value` if the key's token is still `cas` (`None`: unconditionally).
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), SetError>;
}

/// What one attempt of [`compare_and_swap`] decided from the value it read.
pub enum Swap<T, V> {
    /// Nothing to write: the answer.
    Keep(T),
    /// Write `V` if nobody wrote since the read, then answer `T`.
    Write(V, T),
}

/// Why [`compare_and_swap`] gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasError<E> {
    /// The step refused the value it read.
    Step(E),
    /// The host failed the read or the write.
    Host,
    /// [`MAX_CAS_ATTEMPTS`] writes were lost to other writers.
    Contended,
}

/// The one read → change → compare-and-swap loop over shared data: `step` decides from the
/// value under `key` (`None`: absent), its write lands only if nobody wrote since the read, and
/// a lost race runs `step` again on the newer value (so `step` must depend only on the value it
/// is given). An absent key is written with the token `absent` (`None`: unconditionally; Envoy
/// accepts any token for a key that does not exist). A failed read ends it: a value that could
/// not be read is never taken for an absent one and overwritten.
pub fn compare_and_swap<S: SharedData + ?Sized, T, V: AsRef<[u8]>, E>(
    data: &S,
    key: &str,
    absent: Option<u32>,
    mut step: impl FnMut(Option<Vec<u8>>) -> Result<Swap<T, V>, E>,
) -> Result<T, CasError<E>> {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let (value, cas) = match data.get(key).map_err(|_| CasError::Host)? {
            Some((v, cas)) => (Some(v), Some(cas)),
            None => (None, absent),
        };
        match step(value).map_err(CasError::Step)? {
            Swap::Keep(out) => return Ok(out),
            Swap::Write(v, out) => match data.set(key, v.as_ref(), cas) {
                Ok(()) => return Ok(out),
                Err(SetError::CasMismatch) => continue,
                Err(SetError::Host) => return Err(CasError::Host),
            },
        }
    }
    Err(CasError::Contended)
}
