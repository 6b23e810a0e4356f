//! The hostcall wrappers: headers, bodies, properties, local replies, metrics, logs, clock,
//! shared data and ticks. Every status comes back as a `Result`; nothing here panics.

use crate::abi::*;
use crate::codec::{decode_pairs, encode_pairs};
use crate::types::*;
use std::ptr::null_mut;

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
