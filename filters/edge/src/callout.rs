//! Calls out of a request (HTTP and gRPC to a cluster), their responses, and resuming the paused
//! stream afterwards: without the SDK's panics, and with what the host would refuse checked
//! before the call, so a caller gets a reason instead of a bare BadArgument.

use crate::abi::*;
use crate::codec::encode_pairs;
use crate::host::{buffer, header_pairs};
use crate::types::{check, Buffer, HostError, HostResult, Map, OK};
use std::time::Duration;

/// An HTTP call to `upstream` (a cluster name).
#[derive(Debug, Clone, Copy)]
pub struct HttpCall<'a> {
    pub upstream: &'a str,
    /// Must hold `:method`, `:path` and `:authority` (Envoy refuses the call otherwise).
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
    pub trailers: &'a [(&'a str, &'a str)],
    pub timeout: Duration,
}

/// A unary gRPC call to `upstream` (a cluster name).
#[derive(Debug, Clone, Copy)]
pub struct GrpcCall<'a> {
    pub upstream: &'a str,
    pub service: &'a str,
    pub method: &'a str,
    pub metadata: &'a [(&'a str, &'a str)],
    pub message: &'a [u8],
    pub timeout: Duration,
}

/// Why a call was not made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The call is malformed; nothing was sent.
    Invalid(&'static str),
    Host(HostError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Invalid(why) => write!(f, "invalid callout: {why}"),
            CallError::Host(e) => e.fmt(f),
        }
    }
}

/// The ABI's timeout: whole milliseconds, at least 1 (0 would mean the host's default), at most
/// `u32::MAX`.
pub fn timeout_ms(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_millis())
        .unwrap_or(u32::MAX)
        .max(1)
}

/// What Envoy needs of an HTTP call's headers.
pub fn check_http_call(call: &HttpCall<'_>) -> Result<(), CallError> {
    if call.upstream.is_empty() {
        return Err(CallError::Invalid("no upstream cluster"));
    }
    for pseudo in [":method", ":path", ":authority"] {
        if !call
            .headers
            .iter()
            .any(|(k, v)| *k == pseudo && !v.is_empty())
        {
            return Err(CallError::Invalid(match pseudo {
                ":method" => "no :method header",
                ":path" => "no :path header",
                _ => "no :authority header",
            }));
        }
    }
    Ok(())
}

fn check_grpc_call(call: &GrpcCall<'_>) -> Result<(), CallError> {
    if call.upstream.is_empty() {
        return Err(CallError::Invalid("no upstream cluster"));
    }
    if call.service.is_empty() || call.method.is_empty() {
        return Err(CallError::Invalid("no gRPC service or method"));
    }
    Ok(())
}

/// Starts an HTTP call; its answer arrives in `on_http_call_response` with the returned token.
pub fn dispatch_http_call(call: &HttpCall<'_>) -> Result<u32, CallError> {
    check_http_call(call)?;
    let headers = encode_pairs(call.headers);
    let trailers = encode_pairs(call.trailers);
    let mut token = 0u32;
    let status = unsafe {
        proxy_http_call(
            call.upstream.as_ptr(),
            call.upstream.len(),
            headers.as_ptr(),
            headers.len(),
            call.body.as_ptr(),
            call.body.len(),
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms(call.timeout),
            &mut token,
        )
    };
    check("proxy_http_call", status)
        .map(|_| token)
        .map_err(CallError::Host)
}

/// Starts a unary gRPC call; its answer arrives in `on_grpc_call_response` with the returned id.
pub fn dispatch_grpc_call(call: &GrpcCall<'_>) -> Result<u32, CallError> {
    check_grpc_call(call)?;
    let metadata = encode_pairs(call.metadata);
    let mut id = 0u32;
    let status = unsafe {
        proxy_grpc_call(
            call.upstream.as_ptr(),
            call.upstream.len(),
            call.service.as_ptr(),
            call.service.len(),
            call.method.as_ptr(),
            call.method.len(),
            metadata.as_ptr(),
            metadata.len(),
            call.message.as_ptr(),
            call.message.len(),
            timeout_ms(call.timeout),
            &mut id,
        )
    };
    check("proxy_grpc_call", status)
        .map(|_| id)
        .map_err(CallError::Host)
}

/// The headers of the HTTP call response being delivered (only inside `on_http_call_response`).
pub fn call_response_headers() -> HostResult<Vec<(Vec<u8>, Vec<u8>)>> {
    header_pairs(Map::HttpCallResponseHeaders)
}

/// Up to `max` bytes of the HTTP call response body being delivered; empty when it has none.
pub fn call_response_body(max: usize) -> HostResult<Vec<u8>> {
    buffer(Buffer::HttpCallResponseBody, 0, max).map(Option::unwrap_or_default)
}

/// Up to `max` bytes of the gRPC message being delivered; empty when it has none.
pub fn grpc_response_message(max: usize) -> HostResult<Vec<u8>> {
    buffer(Buffer::GrpcReceiveBuffer, 0, max).map(Option::unwrap_or_default)
}

/// The `:status` of a response's headers; 0 when absent or not a number.
pub fn response_status(pairs: &[(Vec<u8>, Vec<u8>)]) -> u32 {
    pairs
        .iter()
        .find(|(k, _)| k.as_slice() == b":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Which direction of a paused stream to resume.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Request = 0,
    Response = 1,
}

/// Resumes a stream a callback paused (after a callout answered).
pub fn resume(stream: Stream) -> HostResult<()> {
    match unsafe { proxy_continue_stream(stream as u32) } {
        OK => Ok(()),
        status => Err(HostError {
            call: "proxy_continue_stream",
            status,
        }),
    }
}

/// Makes the hostcalls that follow act on the stream of HTTP context `id` (from the root, e.g.
/// its tick resuming or answering a request it holds). An error: that stream is gone.
pub fn set_effective_context(id: u32) -> HostResult<()> {
    match unsafe { proxy_set_effective_context(id) } {
        OK => Ok(()),
        status => Err(HostError {
            call: "proxy_set_effective_context",
            status,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(headers: &'a [(&'a str, &'a str)]) -> HttpCall<'a> {
        HttpCall {
            upstream: "budget",
            headers,
            body: b"",
            trailers: &[],
            timeout: Duration::from_millis(50),
        }
    }

    #[test]
    fn timeouts_are_whole_positive_milliseconds() {
        assert_eq!(timeout_ms(Duration::from_millis(250)), 250);
        assert_eq!(timeout_ms(Duration::ZERO), 1);
        assert_eq!(timeout_ms(Duration::from_micros(1500)), 1);
        assert_eq!(timeout_ms(Duration::from_secs(u64::MAX)), u32::MAX);
    }

    #[test]
    fn http_calls_need_method_path_and_authority() {
        let full = [(":method", "POST"), (":path", "/r"), (":authority", "b")];
        assert_eq!(check_http_call(&call(&full)), Ok(()));
        assert_eq!(
            check_http_call(&call(&full[..2])),
            Err(CallError::Invalid("no :authority header"))
        );
        assert_eq!(
            check_http_call(&call(&[
                (":method", ""),
                (":path", "/"),
                (":authority", "b")
            ])),
            Err(CallError::Invalid("no :method header"))
        );
        let mut c = call(&full);
        c.upstream = "";
        assert!(check_http_call(&c).is_err());
        // Natively the host refuses every call: an error, not a panic.
        assert!(matches!(
            dispatch_http_call(&call(&full)),
            Err(CallError::Host(_))
        ));
        assert!(matches!(
            dispatch_http_call(&call(&full[..1])),
            Err(CallError::Invalid(_))
        ));
    }

    #[test]
    fn grpc_calls_need_service_and_method() {
        let c = GrpcCall {
            upstream: "ext",
            service: "",
            method: "Check",
            metadata: &[],
            message: b"",
            timeout: Duration::from_millis(10),
        };
        assert!(matches!(dispatch_grpc_call(&c), Err(CallError::Invalid(_))));
        let c = GrpcCall {
            service: "s.v1.S",
            ..c
        };
        assert!(matches!(dispatch_grpc_call(&c), Err(CallError::Host(_))));
    }

    #[test]
    fn status_is_read_from_the_pseudo_header() {
        let pairs = |s: &str| vec![(b":status".to_vec(), s.as_bytes().to_vec())];
        assert_eq!(response_status(&pairs("429")), 429);
        assert_eq!(response_status(&pairs("x")), 0);
        assert_eq!(response_status(&[]), 0);
    }
}
