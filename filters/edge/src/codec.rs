//! The ABI's header-map serialisation, both ways (pure: no hostcalls).

/// Decodes the ABI's map serialisation: u32 count, count × (u32 key len, u32 value len), then
/// each key and value followed by a NUL byte. `None` if the bytes do not add up.
pub fn decode_pairs(raw: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    if raw.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b = raw.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let count = u32_at(0)?;
    let mut sizes_at = 4usize;
    let mut data_at = 4usize.checked_add(count.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(count.min(raw.len() / 8));
    for _ in 0..count {
        let klen = u32_at(sizes_at)?;
        let vlen = u32_at(sizes_at + 4)?;
        sizes_at += 8;
        let key = raw.get(data_at..data_at.checked_add(klen)?)?.to_vec();
        data_at = data_at.checked_add(klen + 1)?;
        let value = raw.get(data_at..data_at.checked_add(vlen)?)?.to_vec();
        data_at = data_at.checked_add(vlen + 1)?;
        out.push((key, value));
    }
    Some(out)
}

/// Encodes pairs in the ABI's map serialisation (for local response headers).
pub fn encode_pairs(pairs: &[(&str, &str)]) -> Vec<u8> {
    let data_len: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data_len);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let pairs = [(":path", "/v1/models"), ("x-a", ""), ("x-b", "v")];
        let enc = encode_pairs(&pairs);
        let dec = decode_pairs(&enc).unwrap();
        let back: Vec<(&str, &str)> = dec
            .iter()
            .map(|(k, v)| {
                (
                    std::str::from_utf8(k).unwrap(),
                    std::str::from_utf8(v).unwrap(),
                )
            })
            .collect();
        assert_eq!(back, pairs);
    }

    #[test]
    fn malformed_maps_are_refused_not_panicked_on() {
        let enc = encode_pairs(&[("key", "value")]);
        for cut in 1..enc.len() - 1 {
            assert!(decode_pairs(&enc[..cut]).is_none(), "cut at {cut}");
        }
        assert!(decode_pairs(&u32::MAX.to_le_bytes()).is_none());
        let mut huge = encode_pairs(&[("k", "v")]);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_pairs(&huge).is_none());
    }
}
