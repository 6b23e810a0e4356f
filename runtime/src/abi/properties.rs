//! Properties (`proxy_get_property`, `proxy_set_property`): configured ones, those a guest set
//! (bounded), and the request/response attributes Envoy derives from the stream.

use crate::hostcall::{slot, tally, C, INTERNAL_FAILURE, INVALID_MEMORY, NOT_FOUND, OK};
use crate::memory::{copy_out, read};
use crate::options::MAX_GUEST_PROPERTIES;
use crate::state::HostState;
use crate::types::find_header;
use wasmtime::Linker;

/// NUL-separated segments. Envoy's parser stops at the end of the buffer, so a trailing NUL
/// (as hand-written encoders emit; the SDK strips it) names the same path.
pub(crate) fn parse_path(raw: &[u8]) -> Vec<String> {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    raw.split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn property(st: &HostState, path: &[String]) -> Option<Vec<u8>> {
    if let Some((_, v)) = st
        .streams
        .get(&st.effective)
        .and_then(|s| s.properties.iter().find(|(p, _)| p.as_slice() == path))
    {
        return Some(v.clone());
    }
    if let Some(v) = st.opts.properties.get(path) {
        return Some(v.clone());
    }
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["plugin_root_id"] | ["plugin_name"] => return Some(st.opts.root_id.clone().into_bytes()),
        ["plugin_vm_id"] => return Some(st.opts.vm_id.clone().into_bytes()),
        _ => {}
    }
    // Derive request/response attributes from the current stream, as Envoy does.
    let s = st.streams.get(&st.effective)?;
    let req = |name: &str| find_header(&s.req.headers, name).map(|v| v.as_bytes().to_vec());
    match p.as_slice() {
        ["request", "path"] => req(":path"),
        ["request", "url_path"] => req(":path").map(|v| {
            let end = v.iter().position(|b| *b == b'?').unwrap_or(v.len());
            v[..end].to_vec()
        }),
        ["request", "method"] => req(":method"),
        ["request", "host"] => req(":authority"),
        ["request", "scheme"] => req(":scheme"),
        ["request", "id"] => req("x-request-id"),
        ["request", "headers", name] => req(name),
        ["response", "headers", name] => {
            find_header(&s.resp.headers, name).map(|v| v.as_bytes().to_vec())
        }
        ["response", "code"] => find_header(&s.resp.headers, ":status")
            .and_then(|v| v.parse::<i64>().ok())
            .map(|c| c.to_le_bytes().to_vec()),
        _ => None,
    }
}

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, pp: i32, ps: i32, rp: i32, rs: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_property") });
            let Some(raw) = read(&mut c, pp, ps) else {
                return Ok(INVALID_MEMORY);
            };
            let path = parse_path(&raw);
            c.data().opts.log_sink.property_read(&path);
            match property(c.data(), &path) {
                Some(v) => copy_out(&mut c, &v, rp, rs),
                None => Ok(NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: C<'_>, pp: i32, ps: i32, vp: i32, vs: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_property") });
            let (Some(raw), Some(val)) = (read(&mut c, pp, ps), read(&mut c, vp, vs)) else {
                return INVALID_MEMORY;
            };
            let path = parse_path(&raw);
            let props = &mut c.data_mut().opts.properties;
            if !props.contains_key(&path) && props.len() >= MAX_GUEST_PROPERTIES {
                return INTERNAL_FAILURE;
            }
            props.insert(path, val);
            OK
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn property_paths_tolerate_a_trailing_nul() {
        let want = vec!["xds".to_string(), "cluster_name".to_string()];
        assert_eq!(parse_path(b"xds\0cluster_name"), want);
        assert_eq!(parse_path(b"xds\0cluster_name\0"), want);
    }
}
