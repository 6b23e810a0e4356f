//! The property tests' generator: xorshift64, deterministic from its seed, so a failing case
//! is the same on every run.

/// The next value of xorshift64 from `seed` (which must not be 0), on every call.
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}
