//! The thin edge between the filters and the proxy-wasm host.
//!
//! The Rust SDK's `hostcalls` panic on any status they did not expect (for example a header
//! write that Envoy refuses with BadArgument after headers continued). In Envoy a panic traps the
//! VM and, fail-closed, every later request on that worker gets 503. So the filters call the
//! ABI through these wrappers instead: every status comes back as a `Result`, host-provided
//! buffers are bounds-checked, and nothing here can panic.
//!
//! The SDK still provides the exported entry points (`proxy_on_*`, `proxy_on_memory_allocate`);
//! buffers the host hands back were allocated through that export, i.e. by this module's
//! allocator, so taking ownership with `Vec::from_raw_parts` is sound.
//!
//! Here: headers, bodies, properties, local replies, metrics, logs, clock and ticks; `callout`
//! (HTTP and gRPC calls out of a request, their responses, resuming the paused stream);
//! `table` (one shared-data value kept by every worker); `broadcast` (messages to every worker
//! through shared queues); `abi` (the imports themselves).

// A filter must not panic (in Envoy a trap fails every later request on the worker, closed).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::ptr::null_mut;

/// proxy-wasm ABI status codes (only the ones the filters act on are named).
pub const OK: u32 = 0;
pub const NOT_FOUND: u32 = 1;
pub const BAD_ARGUMENT: u32 = 2;
pub const CAS_MISMATCH: u32 = 8;

/// A hostcall returned a status other than the ones the caller can handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: u32,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} returned status {}", self.call, self.status)
    }
}

pub type HostResult<T> = Result<T, HostError>;

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Map {
    RequestHeaders = 0,
    RequestTrailers = 1,
    ResponseHeaders = 2,
    ResponseTrailers = 3,
    HttpCallResponseHeaders = 6,
    HttpCallResponseTrailers = 7,
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    RequestBody = 0,
    ResponseBody = 1,
    HttpCallResponseBody = 4,
    GrpcReceiveBuffer = 5,
    PluginConfiguration = 7,
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

mod abi;
pub mod broadcast;
mod callout;
mod pairs;
pub mod shared_table;
pub mod wake;

use abi::*;
pub use callout::*;
pub use pairs::{header_map, HeaderMap};

fn check(call: &'static str, status: u32) -> HostResult<()> {
    if status == OK {
        Ok(())
    } else {
        Err(HostError { call, status })
    }
}

/// Takes ownership of a host-returned buffer (allocated through `proxy_on_memory_allocate`).
///
/// # Safety
/// `data`/`size` must come from a successful hostcall that returned an allocation.
unsafe fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        Vec::from_raw_parts(data, size, size)
    }
}

/// Whether the host would keep a log line at `level`: lets a caller skip building one.
pub fn log_enabled(level: Level) -> bool {
    let mut current = 0u32;
    match unsafe { proxy_get_log_level(&mut current) } {
        OK => level as u32 >= current,
        _ => true,
    }
}

pub fn log(level: Level, message: &str) {
    // A failed log has nowhere to be reported; ignoring it is the only non-panicking choice.
    let _ = unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) };
}

/// Bytes `[start, start+max)` of a buffer; `None` when the host has no such buffer.
pub fn buffer(kind: Buffer, start: usize, max: usize) -> HostResult<Option<Vec<u8>>> {
    let mut data = null_mut();
    let mut size = 0usize;
    let status = unsafe { proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size) };
    match status {
        OK => Ok(Some(unsafe { take(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(HostError {
            call: "proxy_get_buffer_bytes",
            status: s,
        }),
    }
}

/// The plugin configuration bytes (`configuration` of the filter's config in Envoy).
pub fn plugin_configuration() -> Result<Vec<u8>, String> {
    match buffer(Buffer::PluginConfiguration, 0, usize::MAX) {
        Ok(Some(raw)) => Ok(raw),
        Ok(None) => Err("no plugin configuration".to_string()),
        Err(e) => Err(format!("reading the plugin configuration: {e}")),
    }
}

/// The router the plugin configuration describes.
pub fn configured_router() -> Result<router_core::router::Router, String> {
    plugin_configuration().and_then(|raw| router_core::router::Router::from_json(&raw))
}

/// Every header of a map, in order, repeats included, as raw bytes.
pub fn header_pairs(map: Map) -> HostResult<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut data = null_mut();
    let mut size = 0usize;
    let status = unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    check("proxy_get_header_map_pairs", status)?;
    let raw = unsafe { take(data, size) };
    decode_pairs(&raw).ok_or(HostError {
        call: "proxy_get_header_map_pairs",
        status: 3, // SerializationFailure: the host sent a map we cannot decode
    })
}

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

/// Sets `name` to exactly one value, replacing whatever was there.
pub fn set_header(map: Map, name: &str, value: &str) -> HostResult<()> {
    let status = unsafe {
        proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    };
    check("proxy_replace_header_map_value", status)
}

/// Removes every value of `name`.
pub fn remove_header(map: Map, name: &str) -> HostResult<()> {
    let status = unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) };
    check("proxy_remove_header_map_value", status)
}

/// Answers the request locally; nothing is forwarded upstream.
pub fn respond(
    status: u32,
    headers: &[(&str, &str)],
    body: &[u8],
    details: &str,
) -> HostResult<()> {
    let encoded = encode_pairs(headers);
    let rc = unsafe {
        proxy_send_local_response(
            status,
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            encoded.as_ptr(),
            encoded.len(),
            -1,
        )
    };
    check("proxy_send_local_response", rc)
}

/// Answers locally with a JSON body. A failure is logged under `filter`, not returned: the
/// stream is paused either way and nothing more can be done for it.
pub fn respond_json(filter: &str, status: u32, body: &[u8], details: &str) {
    if let Err(e) = respond(
        status,
        &[("content-type", "application/json")],
        body,
        details,
    ) {
        log(
            Level::Error,
            &format!("{filter}: local response failed: {e}"),
        );
    }
}

/// Removes each of `names` that `pairs` (the map as last read) holds, compared ignoring ASCII
/// case, and drops it from `pairs` too: a header that is not there costs no hostcall.
pub fn remove_present<'a>(
    map: Map,
    pairs: &mut Vec<(Vec<u8>, Vec<u8>)>,
    names: impl IntoIterator<Item = &'a str>,
) -> HostResult<()> {
    for name in names {
        let here = |k: &Vec<u8>| k.eq_ignore_ascii_case(name.as_bytes());
        if pairs.iter().any(|(k, _)| here(k)) {
            remove_header(map, name)?;
            pairs.retain(|(k, _)| !here(k));
        }
    }
    Ok(())
}

/// Replaces the first `old_len` bytes of a buffer (pass its whole current size to replace it all,
/// e.g. a request body with its model rewritten). Envoy drains exactly `old_len` bytes, so it
/// must not exceed what is buffered.
pub fn replace_buffer(kind: Buffer, old_len: usize, data: &[u8]) -> HostResult<()> {
    let status =
        unsafe { proxy_set_buffer_bytes(kind as u32, 0, old_len, data.as_ptr(), data.len()) };
    check("proxy_set_buffer_bytes", status)
}

/// A host property by path (`["xds", "upstream_host_metadata", ...]`); `None` when absent.
pub fn property(path: &[&str]) -> HostResult<Option<Vec<u8>>> {
    let mut encoded = Vec::with_capacity(path.iter().map(|p| p.len() + 1).sum());
    for p in path {
        encoded.extend_from_slice(p.as_bytes());
        encoded.push(0);
    }
    let mut data = null_mut();
    let mut size = 0usize;
    let status =
        unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
    match status {
        OK => Ok(Some(unsafe { take(data, size) })),
        NOT_FOUND => Ok(None),
        s => Err(HostError {
            call: "proxy_get_property",
            status: s,
        }),
    }
}

/// Nanoseconds since the epoch by the host's clock (0 if the host cannot say).
pub fn now_nanos() -> u64 {
    let mut t = 0u64;
    match unsafe { proxy_get_current_time_nanoseconds(&mut t) } {
        OK => t,
        _ => 0,
    }
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// Defines (or finds) a metric; Envoy exports it as `wasmcustom.<name>`.
pub fn define_metric(kind: MetricKind, name: &str) -> HostResult<u32> {
    let mut id = 0u32;
    let status = unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) };
    check("proxy_define_metric", status).map(|_| id)
}

pub fn increment_metric(id: u32, by: i64) {
    // A lost increment is not worth failing a request over.
    let _ = unsafe { proxy_increment_metric(id, by) };
}

/// Sets a gauge, or records a value into a histogram.
pub fn record_metric(id: u32, value: u64) {
    // A lost gauge update is not worth failing a request over; the next one corrects it.
    let _ = unsafe { proxy_record_metric(id, value) };
}

/// A value of the host's shared data (one store for every worker's VM of this vm_id) and its
/// compare-and-swap token; `None` when the key was never set.
pub fn shared_data(key: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match status {
        OK => Ok(Some((unsafe { take(data, size) }, cas))),
        NOT_FOUND => Ok(None),
        s => Err(HostError {
            call: "proxy_get_shared_data",
            status: s,
        }),
    }
}

/// Writes shared data if nobody wrote it since `cas` was read (0: unconditionally). A lost race
/// comes back as an error with status `CAS_MISMATCH`.
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> HostResult<()> {
    let status =
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) };
    check("proxy_set_shared_data", status)
}

/// Asks for `on_tick` on this VM's root context every `ms` milliseconds.
pub fn set_tick_period(ms: u32) -> HostResult<()> {
    check("proxy_set_tick_period_milliseconds", unsafe {
        proxy_set_tick_period_milliseconds(ms)
    })
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
