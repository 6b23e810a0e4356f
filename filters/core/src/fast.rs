//! The two byte loops the scanner spends its time in, 16 bytes at a time where the target has
//! wasm SIMD (Envoy's V8 and wasmtime both do) and 8 at a time (SWAR on u64) elsewhere.
//!
//! Nearly all of a chat request is string content, so finding the next byte that ends or
//! interrupts a string is the scanner's hot path.

/// Index of the first byte at or after `from` that is `"`, `\` or a control byte (< 0x20),
/// or `b.len()` if there is none.
#[inline]
pub fn find_string_special(b: &[u8], from: usize) -> usize {
    imp::find_string_special(b, from)
}

/// True if every byte is ASCII (so the body is valid UTF-8 without further checks).
#[inline]
pub fn all_ascii(b: &[u8]) -> bool {
    imp::all_ascii(b)
}

#[inline(always)]
fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod imp {
    use super::is_special;
    use core::arch::wasm32::*;

    #[inline]
    pub fn find_string_special(b: &[u8], from: usize) -> usize {
        let mut i = from;
        let quote = u8x16_splat(b'"');
        let bslash = u8x16_splat(b'\\');
        let space = u8x16_splat(0x20);
        while i + 16 <= b.len() {
            // SAFETY: i + 16 <= len, and v128_load has no alignment requirement.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            let hits = v128_or(
                v128_or(u8x16_eq(v, quote), u8x16_eq(v, bslash)),
                u8x16_lt(v, space),
            );
            let mask = u8x16_bitmask(hits);
            if mask != 0 {
                return i + mask.trailing_zeros() as usize;
            }
            i += 16;
        }
        while i < b.len() && !is_special(b[i]) {
            i += 1;
        }
        i
    }

    #[inline]
    pub fn all_ascii(b: &[u8]) -> bool {
        let mut i = 0;
        let mut acc = u8x16_splat(0);
        while i + 16 <= b.len() {
            // SAFETY: as above.
            let v = unsafe { v128_load(b.as_ptr().add(i) as *const v128) };
            acc = v128_or(acc, v);
            i += 16;
        }
        u8x16_bitmask(acc) == 0 && b[i..].iter().all(|&c| c < 0x80)
    }
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
mod imp {
    use super::is_special;

    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;

    #[inline(always)]
    fn load(b: &[u8], i: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        u64::from_le_bytes(w)
    }

    /// High bit set in each byte of `v` that is '"', '\\' or < 0x20. Bits above the lowest hit
    /// may be false positives (borrows); only the lowest is used.
    #[inline(always)]
    fn special_mask(v: u64) -> u64 {
        let quote = v ^ (LO * b'"' as u64);
        let bslash = v ^ (LO * b'\\' as u64);
        let has_quote = quote.wrapping_sub(LO) & !quote;
        let has_bslash = bslash.wrapping_sub(LO) & !bslash;
        let ctrl = v.wrapping_sub(LO * 0x20) & !v;
        (has_quote | has_bslash | ctrl) & HI
    }

    #[inline]
    pub fn find_string_special(b: &[u8], from: usize) -> usize {
        let mut i = from;
        while i + 8 <= b.len() {
            let m = special_mask(load(b, i));
            if m != 0 {
                return i + (m.trailing_zeros() / 8) as usize;
            }
            i += 8;
        }
        while i < b.len() && !is_special(b[i]) {
            i += 1;
        }
        i
    }

    #[inline]
    pub fn all_ascii(b: &[u8]) -> bool {
        let mut i = 0;
        let mut acc = 0u64;
        while i + 8 <= b.len() {
            acc |= load(b, i);
            i += 8;
        }
        acc & HI == 0 && b[i..].iter().all(|&c| c < 0x80)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(b: &[u8], from: usize) -> usize {
        (from..b.len())
            .find(|&i| is_special(b[i]))
            .unwrap_or(b.len())
    }

    #[test]
    fn finds_the_first_special_byte_at_every_offset() {
        // Every special and a selection of ordinary bytes (non-ASCII included) at each position
        // of a 40-byte window, so both the wide loop and the tail are exercised.
        let probes: Vec<u8> = (0u8..=0x21)
            .chain([b'\\', b'a', 0x7f, 0x80, 0xC3, 0xFF])
            .collect();
        for &p in &probes {
            for pos in 0..40 {
                let mut b = vec![b'x'; 40];
                b[pos] = p;
                for from in [0, 1, 7, 9, 17] {
                    assert_eq!(
                        find_string_special(&b, from),
                        naive(&b, from),
                        "byte {p:#x} at {pos} from {from}"
                    );
                }
            }
        }
        // Non-ASCII bytes never count as special, even right before a hit.
        let b = "ééééééééé\"".as_bytes();
        assert_eq!(find_string_special(b, 0), b.len() - 1);
    }

    #[test]
    fn ascii_detection() {
        for pos in 0..40 {
            let mut b = vec![b'x'; 40];
            assert!(all_ascii(&b));
            b[pos] = 0x80;
            assert!(!all_ascii(&b), "{pos}");
        }
        assert!(all_ascii(b""));
    }
}
