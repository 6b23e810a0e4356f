//! A header map read in place: the host's serialisation kept as one buffer and indexed, so a
//! request's headers cost one allocation for the bytes and one for the index instead of two per
//! header (the routing filter reads every request's and response's map).

use crate::abi::proxy_get_header_map_pairs;
use crate::host::remove_header;
use crate::types::{check, take, HostError, HostResult, Map};
use std::ptr::null_mut;

/// Where one header's name and value sit in [`HeaderMap::raw`].
#[derive(Clone, Copy)]
struct Entry {
    name: (usize, usize),
    value: (usize, usize),
}

/// The headers of a map as the host handed them over, in order, repeats included.
pub struct HeaderMap {
    raw: Vec<u8>,
    entries: Vec<Entry>,
}

impl HeaderMap {
    /// Indexes the ABI's map serialisation: u32 count, count × (u32 name len, u32 value len),
    /// then each name and value followed by a NUL byte. `None` if the bytes do not add up.
    pub fn decode(raw: Vec<u8>) -> Option<HeaderMap> {
        if raw.is_empty() {
            return Some(HeaderMap {
                raw,
                entries: Vec::new(),
            });
        }
        let u32_at = |at: usize| -> Option<usize> {
            let b = raw.get(at..at.checked_add(4)?)?;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        let count = u32_at(0)?;
        let mut sizes_at = 4usize;
        let mut data_at = 4usize.checked_add(count.checked_mul(8)?)?;
        let mut entries = Vec::with_capacity(count.min(raw.len() / 8));
        for _ in 0..count {
            let nlen = u32_at(sizes_at)?;
            let vlen = u32_at(sizes_at + 4)?;
            sizes_at += 8;
            let name = (data_at, data_at.checked_add(nlen)?);
            data_at = name.1.checked_add(1)?;
            let value = (data_at, data_at.checked_add(vlen)?);
            data_at = value.1.checked_add(1)?;
            if value.1 > raw.len() {
                return None;
            }
            entries.push(Entry { name, value });
        }
        Some(HeaderMap { raw, entries })
    }

    /// Every (name, value), in the order the host sent them.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.entries.iter().map(|e| {
            (
                self.raw.get(e.name.0..e.name.1).unwrap_or_default(),
                self.raw.get(e.value.0..e.value.1).unwrap_or_default(),
            )
        })
    }

    /// The value of the `i`th header (in [`HeaderMap::iter`]'s order); empty past the end.
    pub fn value(&self, i: usize) -> &[u8] {
        self.entries
            .get(i)
            .and_then(|e| self.raw.get(e.value.0..e.value.1))
            .unwrap_or_default()
    }

    /// Whether some header is named `name`, compared ignoring ASCII case.
    pub fn contains(&self, name: &str) -> bool {
        self.iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
    }

    /// Removes each of `names` that the map holds (compared ignoring ASCII case) from the host's
    /// map and from this copy: a header that is not there costs no hostcall.
    pub fn remove_present<'a>(
        &mut self,
        map: Map,
        names: impl IntoIterator<Item = &'a str>,
    ) -> HostResult<()> {
        // Names of lengths no header has are absent without a look at the headers (a request
        // usually sends none of the names, and few headers share a length with one).
        let lengths = self
            .entries
            .iter()
            .fold(0u64, |m, e| m | length_bit(e.name.1 - e.name.0));
        for name in names {
            if lengths & length_bit(name.len()) != 0 && self.contains(name) {
                remove_header(map, name)?;
                let raw = &self.raw;
                self.entries.retain(|e| {
                    !raw.get(e.name.0..e.name.1)
                        .unwrap_or_default()
                        .eq_ignore_ascii_case(name.as_bytes())
                });
            }
        }
        Ok(())
    }
}

/// One bit per name length below 63; every longer length shares the last bit.
fn length_bit(len: usize) -> u64 {
    1 << len.min(63)
}

/// A header map of the current stream, indexed in place ([`HeaderMap`]).
pub fn header_map(map: Map) -> HostResult<HeaderMap> {
    let mut data = null_mut();
    let mut size = 0usize;
    let status = unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    check("proxy_get_header_map_pairs", status)?;
    let raw = unsafe { take(data, size) };
    HeaderMap::decode(raw).ok_or(HostError {
        call: "proxy_get_header_map_pairs",
        status: 3, // SerializationFailure: the host sent a map we cannot decode
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_pairs, encode_pairs};

    #[test]
    fn reads_what_the_copying_decoder_reads() {
        let pairs = [
            (":method", "POST"),
            ("x-a", ""),
            ("", "v"),
            ("X-Team", "red"),
            ("x-team", "blue"),
        ];
        let raw = encode_pairs(&pairs);
        let map = HeaderMap::decode(raw.clone()).unwrap();
        let copied = decode_pairs(&raw).unwrap();
        let read: Vec<(Vec<u8>, Vec<u8>)> =
            map.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        assert_eq!(read, copied);
        assert!(map.contains("x-team") && map.contains("X-A") && !map.contains("x-b"));
        assert_eq!(HeaderMap::decode(Vec::new()).unwrap().iter().count(), 0);
    }

    #[test]
    fn refuses_what_does_not_add_up() {
        let raw = encode_pairs(&[("name", "value")]);
        // As the copying decoder: a map cut short of its last value is refused.
        for cut in 1..raw.len() {
            assert_eq!(
                HeaderMap::decode(raw[..cut].to_vec()).is_none(),
                decode_pairs(&raw[..cut]).is_none(),
                "cut at {cut}"
            );
        }
        assert!(HeaderMap::decode(raw[..raw.len() - 2].to_vec()).is_none());
        let mut lying = raw.clone();
        lying[0] = 200;
        assert!(HeaderMap::decode(lying).is_none());
        let mut huge = raw;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(HeaderMap::decode(huge).is_none());
    }
}
