//! The `env.proxy_*` hostcalls (proxy-wasm ABI 0.2.1), with Envoy's answers.
//!
//! Guest pointers and sizes are `i32` on wasm32. Any guest input problem (bad pointer, bad enum)
//! becomes a status code, never a host panic.

use crate::{
    Dir, HostState, HttpCallRecord, LocalResponse, LogLevel, MetricKind, PendingCall, Status,
};
use std::time::Duration;
use wasmtime::{Caller, Linker};

pub(crate) const FUNCTIONS: &[&str] = &[
    "proxy_log",
    "proxy_get_log_level",
    "proxy_get_current_time_nanoseconds",
    "proxy_set_tick_period_milliseconds",
    "proxy_get_configuration",
    "proxy_get_buffer_bytes",
    "proxy_set_buffer_bytes",
    "proxy_get_header_map_pairs",
    "proxy_set_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_remove_header_map_value",
    "proxy_add_header_map_value",
    "proxy_get_property",
    "proxy_set_property",
    "proxy_get_shared_data",
    "proxy_set_shared_data",
    "proxy_register_shared_queue",
    "proxy_resolve_shared_queue",
    "proxy_dequeue_shared_queue",
    "proxy_enqueue_shared_queue",
    "proxy_continue_stream",
    "proxy_close_stream",
    "proxy_continue_request",
    "proxy_continue_response",
    "proxy_clear_route_cache",
    "proxy_send_local_response",
    "proxy_http_call",
    "proxy_grpc_call",
    "proxy_grpc_stream",
    "proxy_grpc_send",
    "proxy_grpc_cancel",
    "proxy_grpc_close",
    "proxy_get_status",
    "proxy_set_effective_context",
    "proxy_done",
    "proxy_call_foreign_function",
    "proxy_define_metric",
    "proxy_increment_metric",
    "proxy_record_metric",
    "proxy_get_metric",
];

pub(crate) const OK: i32 = Status::Ok as i32;
pub(crate) const NOT_FOUND: i32 = Status::NotFound as i32;
pub(crate) const BAD_ARGUMENT: i32 = Status::BadArgument as i32;
pub(crate) const INVALID_MEMORY: i32 = Status::InvalidMemoryAccess as i32;
pub(crate) const INTERNAL_FAILURE: i32 = Status::InternalFailure as i32;
const EMPTY: i32 = Status::Empty as i32;

pub(crate) type C<'a> = Caller<'a, HostState>;

/// The position of `name` in [`FUNCTIONS`] (a compile-time constant at each hostcall).
pub(crate) const fn slot(name: &str) -> usize {
    let mut i = 0;
    while i < FUNCTIONS.len() {
        let f = FUNCTIONS[i].as_bytes();
        let n = name.as_bytes();
        if f.len() == n.len() {
            let mut j = 0;
            while j < f.len() && f[j] == n[j] {
                j += 1;
            }
            if j == f.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not a proxy-wasm function of this host")
}

/// Counts one guest call of hostcall `slot` ([`crate::Vm::hostcalls`]): what a filter costs its
/// host depends on how many it makes, which the guest's own instruction count does not show.
pub(crate) fn tally(c: &mut C<'_>, slot: usize) {
    // Fuel left when the guest made this call: consecutive marks split a callback into the
    // guest's work between its hostcalls ([`crate::Vm::trace_hostcalls`]).
    let left = match c.data().hostcall_trace {
        Some(_) => c.get_fuel().ok(),
        None => None,
    };
    let st = c.data_mut();
    if let Some(n) = st.hostcalls.get_mut(slot) {
        *n += 1;
    }
    if let (Some(trace), Some(left)) = (st.hostcall_trace.as_mut(), left) {
        if trace.len() < MAX_TRACED_HOSTCALLS {
            trace.push((slot, u64::MAX - left));
        }
    }
}

/// Hostcalls a trace keeps before it stops recording (a trace is for a few requests).
pub(crate) const MAX_TRACED_HOSTCALLS: usize = 1 << 16;

// ---- guest memory helpers -------------------------------------------------------------------

pub(crate) fn read(caller: &mut C<'_>, ptr: i32, len: i32) -> Option<Vec<u8>> {
    let mem = caller.get_export("memory")?.into_memory()?;
    let start = ptr as u32 as usize;
    let end = start.checked_add(len as u32 as usize)?;
    mem.data(&*caller).get(start..end).map(|s| s.to_vec())
}

pub(crate) fn read_str(caller: &mut C<'_>, ptr: i32, len: i32) -> Option<String> {
    read(caller, ptr, len).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(crate) fn write(caller: &mut C<'_>, ptr: i32, bytes: &[u8]) -> bool {
    let Some(mem) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return false;
    };
    let start = ptr as u32 as usize;
    let Some(end) = start.checked_add(bytes.len()) else {
        return false;
    };
    match mem.data_mut(&mut *caller).get_mut(start..end) {
        Some(dst) => {
            dst.copy_from_slice(bytes);
            true
        }
        None => false,
    }
}

pub(crate) fn write_u32(caller: &mut C<'_>, ptr: i32, v: u32) -> bool {
    write(caller, ptr, &v.to_le_bytes())
}

pub(crate) fn write_u64(caller: &mut C<'_>, ptr: i32, v: u64) -> bool {
    write(caller, ptr, &v.to_le_bytes())
}

/// The status of a hostcall whose last step writes its result into guest memory.
fn written(ok: bool) -> i32 {
    if ok {
        OK
    } else {
        INVALID_MEMORY
    }
}

/// Hands bytes to the guest the ABI way: allocate with `proxy_on_memory_allocate`, copy, write
/// pointer and size through the return pointers. Empty data is (null, 0), as Envoy does, which
/// the Rust SDK turns into `None`.
fn copy_out(
    caller: &mut C<'_>,
    bytes: &[u8],
    ptr_ptr: i32,
    size_ptr: i32,
) -> wasmtime::Result<i32> {
    if bytes.is_empty() {
        let ok = write_u32(caller, ptr_ptr, 0) && write_u32(caller, size_ptr, 0);
        return Ok(if ok { OK } else { INVALID_MEMORY });
    }
    let Some(alloc) = caller
        .get_export("proxy_on_memory_allocate")
        .and_then(|e| e.into_func())
    else {
        return Ok(INTERNAL_FAILURE);
    };
    let Ok(alloc) = alloc.typed::<i32, i32>(&*caller) else {
        return Ok(INTERNAL_FAILURE);
    };
    // A trap inside the allocator is a guest trap: propagate it.
    let p = alloc.call(&mut *caller, bytes.len() as i32)?;
    if p == 0 || !write(caller, p, bytes) {
        return Ok(INVALID_MEMORY);
    }
    let ok =
        write_u32(caller, ptr_ptr, p as u32) && write_u32(caller, size_ptr, bytes.len() as u32);
    Ok(if ok { OK } else { INVALID_MEMORY })
}

// ---- header map serialization ---------------------------------------------------------------

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

// ---- map / buffer access by ABI type --------------------------------------------------------

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

/// Makes `record` a pending callout of the current context (bounded per VM), its token written
/// at `ret`; the embedder's transport gets it after the callback.
pub(crate) fn register_call(c: &mut C<'_>, mut record: HttpCallRecord, ret: i32) -> i32 {
    let st = c.data();
    if st.pending_calls.len() >= st.opts.limits.max_pending_calls {
        return INTERNAL_FAILURE;
    }
    // Tokens wrap in a long-lived VM; 0 is never handed out.
    let token = st.next_token.max(1);
    if !write_u32(c, ret, token) {
        return INVALID_MEMORY;
    }
    let st = c.data_mut();
    st.next_token = token.wrapping_add(1);
    record.token = token;
    record.context_id = st.effective;
    let deadline_nanos = st.opts.clock.monotonic_nanos() + record.timeout.as_nanos() as u64;
    st.pending_calls.insert(
        token,
        PendingCall {
            record,
            deadline_nanos,
        },
    );
    st.new_calls.push(token);
    OK
}

fn buffer_get(st: &HostState, buffer_type: i32) -> Result<Vec<u8>, i32> {
    let stream = st.streams.get(&st.effective);
    match buffer_type {
        0 => stream.map(|s| s.req.buffer.clone()).ok_or(NOT_FOUND),
        1 => stream.map(|s| s.resp.buffer.clone()).ok_or(NOT_FOUND),
        // The http call's body, or the gRPC call's response message (GrpcReceiveBuffer).
        4 | 5 => st
            .call_response
            .as_ref()
            .map(|r| r.body.clone())
            .ok_or(NOT_FOUND),
        6 => Ok(st.opts.vm_configuration.clone()),
        7 => Ok(st.opts.plugin_configuration.clone()),
        2 | 3 | 8 => Err(NOT_FOUND),
        _ => Err(BAD_ARGUMENT),
    }
}

// ---- properties -----------------------------------------------------------------------------

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
    let req = |name: &str| crate::find_header(&s.req.headers, name).map(|v| v.as_bytes().to_vec());
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
            crate::find_header(&s.resp.headers, name).map(|v| v.as_bytes().to_vec())
        }
        ["response", "code"] => crate::find_header(&s.resp.headers, ":status")
            .and_then(|v| v.parse::<i64>().ok())
            .map(|c| c.to_le_bytes().to_vec()),
        _ => None,
    }
}

// ---- registration ---------------------------------------------------------------------------

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "env",
        "proxy_log",
        |mut c: C<'_>, level: i32, ptr: i32, len: i32| -> i32 {
            tally(&mut c, const { slot("proxy_log") });
            let Some(level) = LogLevel::from_raw(level) else {
                return BAD_ARGUMENT;
            };
            if !c.data().opts.log_sink.enabled(level) {
                return OK;
            }
            let Some(msg) = read_str(&mut c, ptr, len) else {
                return INVALID_MEMORY;
            };
            c.data().log(level, &msg);
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: C<'_>, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_log_level") });
            let level = c.data().opts.log_level as u32;
            written(write_u32(&mut c, ret, level))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_current_time_nanoseconds") });
            let now = c.data().opts.clock.realtime_nanos();
            written(write_u64(&mut c, ret, now))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, ms: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_tick_period_milliseconds") });
            let st = c.data_mut();
            st.tick_period_ms = ms as u32;
            st.next_tick_nanos = st.opts.clock.monotonic_nanos() + (ms as u32 as u64) * 1_000_000;
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_configuration",
        |mut c: C<'_>, pp: i32, sp: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_configuration") });
            let cfg = c.data().opts.plugin_configuration.clone();
            copy_out(&mut c, &cfg, pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>, ty: i32, start: i32, max: i32, pp: i32, sp: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_buffer_bytes") });
            let buf = match buffer_get(c.data(), ty) {
                Ok(b) => b,
                Err(s) => return Ok(s),
            };
            let start = start as u32 as usize;
            if start > buf.len() {
                return Ok(BAD_ARGUMENT);
            }
            // Envoy clamps an over-long read to what is there.
            let end = start.saturating_add(max as u32 as usize).min(buf.len());
            copy_out(&mut c, &buf[start..end], pp, sp)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C<'_>, ty: i32, start: i32, size: i32, dp: i32, ds: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_buffer_bytes") });
            let Some(data) = read(&mut c, dp, ds) else {
                return INVALID_MEMORY;
            };
            let st = c.data_mut();
            let id = st.effective;
            let limit = st.opts.limits.max_buffered_body;
            let buf = match (ty, st.streams.get_mut(&id)) {
                (0, Some(s)) => &mut s.req.buffer,
                (1, Some(s)) => &mut s.resp.buffer,
                (0 | 1, None) => return NOT_FOUND,
                (_, _) => return BAD_ARGUMENT,
            };
            let (start, size) = (start as u32 as usize, size as u32 as usize);
            let kept = if start == 0 {
                buf.len().saturating_sub(size)
            } else {
                buf.len()
            };
            if kept.saturating_add(data.len()) > limit {
                return BAD_ARGUMENT;
            }
            // Envoy's rules (context.cc Buffer::copyFrom): start 0 drains `size` bytes and
            // prepends (so (0,0) prepends and (0,len) replaces), start >= len appends; anything
            // else is refused.
            if start == 0 {
                let mut v = data;
                v.extend_from_slice(&buf[size.min(buf.len())..]);
                *buf = v;
            } else if start >= buf.len() {
                buf.extend_from_slice(&data);
            } else {
                return BAD_ARGUMENT;
            }
            OK
        },
    )?;
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
                Ok(m) => crate::find_header(&m, &key).map(str::to_owned),
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
            if !props.contains_key(&path) && props.len() >= crate::vm::MAX_GUEST_PROPERTIES {
                return INTERNAL_FAILURE;
            }
            props.insert(path, val);
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: C<'_>, kp: i32, ks: i32, rp: i32, rs: i32, cas_ptr: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_shared_data") });
            let Some(key) = read_str(&mut c, kp, ks) else {
                return Ok(INVALID_MEMORY);
            };
            let st = c.data();
            let Some((value, cas)) = st.opts.shared.guest_get(&st.opts.vm_id, &key) else {
                return Ok(NOT_FOUND);
            };
            if !write_u32(&mut c, cas_ptr, cas) {
                return Ok(INVALID_MEMORY);
            }
            copy_out(&mut c, &value, rp, rs)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: C<'_>, kp: i32, ks: i32, vp: i32, vs: i32, cas: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_shared_data") });
            let (Some(key), Some(val)) = (read_str(&mut c, kp, ks), read(&mut c, vp, vs)) else {
                return INVALID_MEMORY;
            };
            let st = c.data();
            match st.opts.shared.set(&st.opts.vm_id, &key, &val, cas as u32) {
                Ok(()) => OK,
                Err(s) => s as i32,
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: C<'_>, np: i32, ns: i32, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_register_shared_queue") });
            let Some(name) = read_str(&mut c, np, ns) else {
                return INVALID_MEMORY;
            };
            let st = c.data();
            let id = match st.opts.shared.register_queue(
                &st.opts.vm_id,
                &name,
                st.host_key,
                crate::ROOT_CONTEXT_ID,
            ) {
                Ok(id) => id,
                Err(s) => return s as i32,
            };
            written(write_u32(&mut c, ret, id))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, vp: i32, vs: i32, np: i32, ns: i32, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_resolve_shared_queue") });
            let (Some(vm_id), Some(name)) = (read_str(&mut c, vp, vs), read_str(&mut c, np, ns))
            else {
                return INVALID_MEMORY;
            };
            match c.data().opts.shared.resolve_queue(&vm_id, &name) {
                Some(id) => written(write_u32(&mut c, ret, id)),
                None => NOT_FOUND,
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: i32, rp: i32, rs: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_dequeue_shared_queue") });
            match c.data().opts.shared.dequeue(id as u32) {
                Ok(item) => copy_out(&mut c, &item, rp, rs),
                Err(Status::Empty) => Ok(EMPTY),
                Err(s) => Ok(s as i32),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, id: i32, vp: i32, vs: i32| -> i32 {
            tally(&mut c, const { slot("proxy_enqueue_shared_queue") });
            let Some(val) = read(&mut c, vp, vs) else {
                return INVALID_MEMORY;
            };
            match c.data().opts.shared.enqueue(id as u32, &val) {
                Ok(()) => OK,
                Err(s) => s as i32,
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: C<'_>, ty: i32| -> i32 {
            tally(&mut c, const { slot("proxy_continue_stream") });
            continue_stream(c.data_mut(), ty)
        },
    )?;
    // Pre-0.2.0 names some SDKs still import.
    l.func_wrap("env", "proxy_continue_request", |mut c: C<'_>| -> i32 {
        tally(&mut c, const { slot("proxy_continue_request") });
        continue_stream(c.data_mut(), 0)
    })?;
    l.func_wrap("env", "proxy_continue_response", |mut c: C<'_>| -> i32 {
        tally(&mut c, const { slot("proxy_continue_response") });
        continue_stream(c.data_mut(), 1)
    })?;
    l.func_wrap("env", "proxy_clear_route_cache", |mut c: C<'_>| -> i32 {
        tally(&mut c, const { slot("proxy_clear_route_cache") });
        OK
    })?;
    l.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: C<'_>, ty: i32| -> i32 {
            tally(&mut c, const { slot("proxy_close_stream") });
            let st = c.data_mut();
            let id = st.effective;
            match (ty, st.streams.get_mut(&id)) {
                (0..=3, Some(s)) => {
                    s.reset = true;
                    OK
                }
                (0..=3, None) => NOT_FOUND,
                _ => BAD_ARGUMENT,
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>,
         status: i32,
         dp: i32,
         ds: i32,
         bp: i32,
         bs: i32,
         hp: i32,
         hs: i32,
         grpc: i32|
         -> i32 {
            tally(&mut c, const { slot("proxy_send_local_response") });
            let (Some(details), Some(body), Some(hdrs)) = (
                read_str(&mut c, dp, ds),
                read(&mut c, bp, bs),
                read(&mut c, hp, hs),
            ) else {
                return INVALID_MEMORY;
            };
            let Some(headers) = deserialize_map(&hdrs) else {
                return BAD_ARGUMENT;
            };
            let st = c.data_mut();
            let id = st.effective;
            let Some(s) = st.streams.get_mut(&id) else {
                return NOT_FOUND;
            };
            s.local_response = Some(LocalResponse {
                status: status as u32,
                details,
                headers,
                body,
                grpc_status: grpc,
            });
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         us: i32,
         hp: i32,
         hs: i32,
         bp: i32,
         bs: i32,
         tp: i32,
         ts: i32,
         timeout: i32,
         ret: i32|
         -> i32 {
            tally(&mut c, const { slot("proxy_http_call") });
            let (Some(upstream), Some(h), Some(body), Some(t)) = (
                read_str(&mut c, up, us),
                read(&mut c, hp, hs),
                read(&mut c, bp, bs),
                read(&mut c, tp, ts),
            ) else {
                return INVALID_MEMORY;
            };
            let (Some(headers), Some(trailers)) = (deserialize_map(&h), deserialize_map(&t)) else {
                return BAD_ARGUMENT;
            };
            let st = c.data();
            if let Some(known) = &st.opts.known_clusters {
                if !known.contains(&upstream) {
                    return BAD_ARGUMENT;
                }
            }
            // Envoy needs these to build the request.
            if ![":method", ":path", ":authority"]
                .iter()
                .all(|n| crate::find_header(&headers, n).is_some())
            {
                return BAD_ARGUMENT;
            }
            let record = HttpCallRecord {
                token: 0,
                context_id: 0,
                upstream,
                headers,
                body,
                trailers,
                timeout: Duration::from_millis(timeout as u32 as u64),
                grpc: None,
            };
            register_call(&mut c, record, ret)
        },
    )?;
    crate::grpc::add_to_linker(l)?;
    l.func_wrap(
        "env",
        "proxy_grpc_stream",
        |mut c: C<'_>,
         _a: i32,
         _b: i32,
         _d: i32,
         _e: i32,
         _f: i32,
         _g: i32,
         _h: i32,
         _i: i32,
         _r: i32|
         -> i32 {
            tally(&mut c, const { slot("proxy_grpc_stream") });
            INTERNAL_FAILURE
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_send",
        |mut c: C<'_>, _t: i32, _p: i32, _s: i32, _e: i32| -> i32 {
            tally(&mut c, const { slot("proxy_grpc_send") });
            NOT_FOUND
        },
    )?;
    l.func_wrap("env", "proxy_grpc_close", |mut c: C<'_>, _t: i32| -> i32 {
        tally(&mut c, const { slot("proxy_grpc_close") });
        NOT_FOUND
    })?;
    l.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: C<'_>, code: i32, pp: i32, sp: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_status") });
            let ok =
                write_u32(&mut c, code, 0) && write_u32(&mut c, pp, 0) && write_u32(&mut c, sp, 0);
            if ok {
                OK
            } else {
                INVALID_MEMORY
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C<'_>, id: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_effective_context") });
            let st = c.data_mut();
            let id = id as u32;
            if id == crate::ROOT_CONTEXT_ID || st.streams.contains_key(&id) {
                st.effective = id;
                OK
            } else {
                BAD_ARGUMENT
            }
        },
    )?;
    l.func_wrap("env", "proxy_done", |mut c: C<'_>| -> i32 {
        tally(&mut c, const { slot("proxy_done") });
        c.data_mut().done_called = true;
        OK
    })?;
    l.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |mut c: C<'_>,
         np: i32,
         ns: i32,
         _ap: i32,
         _as: i32,
         rp: i32,
         rs: i32|
         -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_call_foreign_function") });
            let Some(name) = read_str(&mut c, np, ns) else {
                return Ok(INVALID_MEMORY);
            };
            let seen = &mut c.data_mut().foreign_calls;
            if seen.len() >= 64 {
                seen.pop_front();
            }
            seen.push_back(name.clone());
            match name.as_str() {
                // Envoy 1.40 registers this one; routing is re-evaluated anyway in this host.
                "clear_route_cache" => copy_out(&mut c, &[], rp, rs),
                _ => Ok(NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, ty: i32, np: i32, ns: i32, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_define_metric") });
            let kind = match ty {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return BAD_ARGUMENT,
            };
            let Some(name) = read_str(&mut c, np, ns) else {
                return INVALID_MEMORY;
            };
            let st = c.data_mut();
            let max = st.opts.limits.max_metrics;
            let metrics = &mut st.metrics;
            let idx = match metrics
                .iter()
                .position(|m| m.name == name && m.kind == kind)
            {
                Some(i) => i,
                None => {
                    if metrics.len() >= max {
                        return INTERNAL_FAILURE;
                    }
                    metrics.push(crate::Metric {
                        name,
                        kind,
                        value: 0,
                        samples: vec![],
                        count: 0,
                        sum: 0,
                        set_seq: 0,
                    });
                    metrics.len() - 1
                }
            };
            written(write_u32(&mut c, ret, idx as u32 + 1))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: C<'_>, id: i32, offset: i64| -> i32 {
            tally(&mut c, const { slot("proxy_increment_metric") });
            let Some(m) = metric_mut(c.data_mut(), id) else {
                return NOT_FOUND;
            };
            match m.kind {
                MetricKind::Counter if offset > 0 => m.value = m.value.saturating_add(offset),
                MetricKind::Gauge => m.value = m.value.saturating_add(offset),
                _ => return BAD_ARGUMENT,
            }
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: C<'_>, id: i32, value: i64| -> i32 {
            tally(&mut c, const { slot("proxy_record_metric") });
            let keep = c.data().opts.limits.histogram_samples;
            let Some(m) = metric_mut(c.data_mut(), id) else {
                return NOT_FOUND;
            };
            match m.kind {
                MetricKind::Counter => m.value = m.value.saturating_add(value),
                MetricKind::Gauge => {
                    m.value = value;
                    m.set_seq = crate::state::next_gauge_set();
                }
                MetricKind::Histogram => m.record(value as u64, keep),
            }
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C<'_>, id: i32, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_metric") });
            let Some(m) = metric_mut(c.data_mut(), id) else {
                return NOT_FOUND;
            };
            if m.kind == MetricKind::Histogram {
                return BAD_ARGUMENT;
            }
            let v = m.value as u64;
            written(write_u64(&mut c, ret, v))
        },
    )?;
    Ok(())
}

fn metric_mut(st: &mut HostState, id: i32) -> Option<&mut crate::Metric> {
    st.metrics.get_mut((id as u32 as usize).checked_sub(1)?)
}

/// Resumption happens after the current callback returns (the SDK's dispatcher is not
/// re-entrant), like Envoy posting `continueDecoding` to the event loop.
fn continue_stream(st: &mut HostState, ty: i32) -> i32 {
    let id = st.effective;
    let Some(s) = st.streams.get_mut(&id) else {
        return NOT_FOUND;
    };
    match ty {
        0 => s.req.resume_requested = true,
        1 => s.resp.resume_requested = true,
        2 | 3 => return BAD_ARGUMENT,
        _ => return BAD_ARGUMENT,
    }
    OK
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
    fn property_paths_tolerate_a_trailing_nul() {
        let want = vec!["xds".to_string(), "cluster_name".to_string()];
        assert_eq!(parse_path(b"xds\0cluster_name"), want);
        assert_eq!(parse_path(b"xds\0cluster_name\0"), want);
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
