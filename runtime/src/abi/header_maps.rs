//! Header and trailer maps by ABI map type, their wire serialization, and Envoy 1.40's refusal
//! of writes once a direction's headers went on.

use crate::hostcall::{slot, tally, BAD_ARGUMENT, C, INVALID_MEMORY, NOT_FOUND, OK};
use crate::memory::{copy_out, read, read_str};
use crate::state::Dir;
use crate::state::HostState;
use crate::types::find_header;
use wasmtime::Linker;

pub(crate) fn serialize_map(map: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(map.len() as u32).to_le_bytes());
    for (k, v) in map {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in map {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Parses the guest's serialized map; `None` on any inconsistency (Envoy: SerializationFailure
/// / BadArgument, never a crash).
pub(crate) fn deserialize_map(bytes: &[u8]) -> Option<Vec<(String, String)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let n = u32_at(0)?;
    let mut pos = 4usize.checked_add(n.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(n.min(1024));
    for i in 0..n {
        let kl = u32_at(4 + i * 8)?;
        let vl = u32_at(8 + i * 8)?;
        let k = bytes.get(pos..pos.checked_add(kl)?)?;
        pos = pos.checked_add(kl + 1)?;
        let v = bytes.get(pos..pos.checked_add(vl)?)?;
        pos = pos.checked_add(vl + 1)?;
        out.push((
            String::from_utf8_lossy(k).to_ascii_lowercase(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    }
    Some(out)
}

enum MapRef {
    Stream(u32, Dir, bool), // id, direction, trailers?
    CallHeaders,
    CallTrailers,
}

fn map_ref(st: &HostState, map_type: i32) -> Result<MapRef, i32> {
    let id = st.effective;
    let stream = || {
        if st.streams.contains_key(&id) {
            Ok(())
        } else {
            Err(NOT_FOUND)
        }
    };
    match map_type {
        0 => stream().map(|_| MapRef::Stream(id, Dir::Request, false)),
        1 => stream().map(|_| MapRef::Stream(id, Dir::Request, true)),
        2 => stream().map(|_| MapRef::Stream(id, Dir::Response, false)),
        3 => stream().map(|_| MapRef::Stream(id, Dir::Response, true)),
        6 if st.call_response.is_some() => Ok(MapRef::CallHeaders),
        7 if st.call_response.is_some() => Ok(MapRef::CallTrailers),
        6 | 7 => Err(NOT_FOUND),
        4 | 5 => Err(NOT_FOUND),
        _ => Err(BAD_ARGUMENT),
    }
}

fn map_get(st: &HostState, map_type: i32) -> Result<Vec<(String, String)>, i32> {
    Ok(match map_ref(st, map_type)? {
        MapRef::Stream(id, dir, trailers) => {
            let s = &st.streams[&id];
            let d = if dir == Dir::Request { &s.req } else { &s.resp };
            if !d.headers_seen && !trailers {
                return Err(NOT_FOUND);
            }
            if trailers {
                d.trailers.clone()
            } else {
                d.headers.clone()
            }
        }
        MapRef::CallHeaders => st
            .call_response
            .as_ref()
            .map(|r| r.headers.clone())
            .unwrap_or_default(),
        MapRef::CallTrailers => st
            .call_response
            .as_ref()
            .map(|r| r.trailers.clone())
            .unwrap_or_default(),
    })
}

/// The shared front of the hostcalls that set or add a header: both strings read from guest
/// memory, the name lowercased (maps hold lowercase names), then `f` edits the map.
fn edit_header(
    c: &mut C<'_>,
    map_type: i32,
    (kp, ks): (i32, i32),
    (vp, vs): (i32, i32),
    f: impl FnOnce(&mut Vec<(String, String)>, String, String),
) -> i32 {
    let (Some(key), Some(val)) = (read_str(c, kp, ks), read_str(c, vp, vs)) else {
        return INVALID_MEMORY;
    };
    let key = key.to_ascii_lowercase();
    map_modify(c.data_mut(), map_type, |m| f(m, key, val))
}

/// Applies `f` to a writable map. Envoy 1.40 refuses (BadArgument) header writes once that
/// direction's headers continued: the map already went to the next hop.
fn map_modify(
    st: &mut HostState,
    map_type: i32,
    f: impl FnOnce(&mut Vec<(String, String)>),
) -> i32 {
    match map_ref(st, map_type) {
        Err(s) => s,
        Ok(MapRef::CallHeaders | MapRef::CallTrailers) => BAD_ARGUMENT,
        Ok(MapRef::Stream(id, dir, trailers)) => {
            let Some(s) = st.streams.get_mut(&id) else {
                return NOT_FOUND;
            };
            let d = if dir == Dir::Request {
                &mut s.req
            } else {
                &mut s.resp
            };
            if trailers {
                f(&mut d.trailers);
                return OK;
            }
            if !d.headers_seen {
                return NOT_FOUND;
            }
            if d.headers_continued {
                return BAD_ARGUMENT;
            }
            f(&mut d.headers);
            OK
        }
    }
}

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, ty: i32, pp: i32, sp: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_header_map_pairs") });
            match map_get(c.data(), ty) {
                Ok(m) => copy_out(&mut c, &serialize_map(&m), pp, sp),
                Err(s) => Ok(s),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, ty: i32, dp: i32, ds: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_header_map_pairs") });
            let Some(bytes) = read(&mut c, dp, ds) else {
                return INVALID_MEMORY;
            };
            let Some(map) = deserialize_map(&bytes) else {
                return BAD_ARGUMENT;
            };
            map_modify(c.data_mut(), ty, |m| *m = map)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, ks: i32, pp: i32, sp: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_header_map_value") });
            let Some(key) = read_str(&mut c, kp, ks) else {
                return Ok(INVALID_MEMORY);
            };
            let value = match map_get(c.data(), ty) {
                Ok(m) => find_header(&m, &key).map(str::to_owned),
                Err(s) => return Ok(s),
            };
            match value {
                Some(v) => copy_out(&mut c, v.as_bytes(), pp, sp),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, ks: i32, vp: i32, vs: i32| -> i32 {
            tally(&mut c, const { slot("proxy_replace_header_map_value") });
            edit_header(&mut c, ty, (kp, ks), (vp, vs), |m, key, val| {
                match m.iter().position(|(k, _)| *k == key) {
                    Some(first) => {
                        m[first].1 = val;
                        let mut i = 0;
                        m.retain(|(k, _)| {
                            i += 1;
                            i - 1 == first || *k != key
                        });
                    }
                    None => m.push((key, val)),
                }
            })
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, ks: i32| -> i32 {
            tally(&mut c, const { slot("proxy_remove_header_map_value") });
            let Some(key) = read_str(&mut c, kp, ks) else {
                return INVALID_MEMORY;
            };
            let key = key.to_ascii_lowercase();
            map_modify(c.data_mut(), ty, |m| m.retain(|(k, _)| *k != key))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C<'_>, ty: i32, kp: i32, ks: i32, vp: i32, vs: i32| -> i32 {
            tally(&mut c, const { slot("proxy_add_header_map_value") });
            edit_header(&mut c, ty, (kp, ks), (vp, vs), |m, key, val| {
                m.push((key, val))
            })
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_round_trip_lowercases_names() {
        let m = vec![
            (":path".to_string(), "/x".to_string()),
            ("X-A".to_string(), "".to_string()),
        ];
        let back = deserialize_map(&serialize_map(&m)).unwrap();
        assert_eq!(
            back,
            vec![(":path".into(), "/x".into()), ("x-a".into(), "".into())]
        );
        assert_eq!(deserialize_map(&[]).unwrap(), vec![]);
    }

    #[test]
    fn malformed_maps_are_rejected_not_panicking() {
        let good = serialize_map(&[("k".to_string(), "v".to_string())]);
        for cut in 0..good.len() {
            let _ = deserialize_map(&good[..cut]);
        }
        assert!(deserialize_map(&[0xff, 0xff, 0xff, 0xff]).is_none());
        assert!(deserialize_map(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]).is_none());
    }
}
