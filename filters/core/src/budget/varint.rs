//! LEB128 unsigned varints: the byte form of ledgers and team tables (small numbers, which
//! nearly every bucket holds, take one byte).

pub(crate) fn put(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The varint at `*i`, advancing `*i` past it; `None` if `b` ends first or it runs over 10 bytes.
pub(crate) fn get(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let c = *b.get(*i)?;
        *i += 1;
        v |= u64::from(c & 0x7f) << shift;
        if c & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_at_every_length() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX] {
            let mut b = Vec::new();
            super::put(&mut b, v);
            let mut i = 0;
            assert_eq!(super::get(&b, &mut i), Some(v));
            assert_eq!(i, b.len());
            assert!(b.len() <= 10);
        }
        assert_eq!(super::get(&[0x80; 11], &mut 0), None);
    }
}
