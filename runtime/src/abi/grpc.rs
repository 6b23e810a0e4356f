//! gRPC callouts (`proxy_grpc_call`, `proxy_grpc_cancel`): a unary call to a cluster, pending
//! and bounded like an http callout (same token space, the same per-VM limit and deadline), and
//! answered as Envoy answers one: a message with status OK through `proxy_on_grpc_receive`
//! (readable as GrpcReceiveBuffer), anything else (a status from the server, a failed
//! connection, the deadline) through `proxy_on_grpc_close` with the status code. A cancelled
//! call gets no callback. Streams (`proxy_grpc_stream`) are not served.

use super::header_maps::deserialize_map;
use super::http_call::register_call;
use crate::embedder::{GrpcMethod, HttpCallRecord, HttpCallReply};
use crate::hostcall::{
    slot, tally, BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY, NOT_FOUND, OK,
};
use crate::memory::{read, read_str};
use crate::state::HostState;
use crate::types::find_header;
use std::time::Duration;
use wasmtime::Linker;

/// gRPC status codes the host reports itself.
pub const DEADLINE_EXCEEDED: u32 = 4;
pub const UNAVAILABLE: u32 = 14;
const UNKNOWN: u32 = 2;

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    add_streams(l)?;
    l.func_wrap(
        "env",
        "proxy_grpc_call",
        |mut c: C<'_>,
         up: i32,
         us: i32,
         sp: i32,
         ss: i32,
         mp: i32,
         ms: i32,
         hp: i32,
         hs: i32,
         bp: i32,
         bs: i32,
         timeout: i32,
         ret: i32|
         -> i32 {
            let (Some(upstream), Some(service), Some(method), Some(h), Some(body)) = (
                read_str(&mut c, up, us),
                read_str(&mut c, sp, ss),
                read_str(&mut c, mp, ms),
                read(&mut c, hp, hs),
                read(&mut c, bp, bs),
            ) else {
                return INVALID_MEMORY;
            };
            // An empty map is sent as no bytes at all.
            let Some(metadata) = (if h.is_empty() {
                Some(Vec::new())
            } else {
                deserialize_map(&h)
            }) else {
                return BAD_ARGUMENT;
            };
            if service.is_empty() || method.is_empty() {
                return BAD_ARGUMENT;
            }
            if let Some(known) = &c.data().opts.known_clusters {
                if !known.contains(&upstream) {
                    return BAD_ARGUMENT;
                }
            }
            let record = HttpCallRecord {
                token: 0,
                context_id: 0,
                upstream,
                headers: metadata,
                body,
                trailers: Vec::new(),
                timeout: Duration::from_millis(timeout as u32 as u64),
                grpc: Some(GrpcMethod { service, method }),
            };
            register_call(&mut c, record, ret)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_grpc_cancel",
        |mut c: C<'_>, token: i32| -> i32 {
            let st = c.data_mut();
            let token = token as u32;
            if st
                .pending_calls
                .get(&token)
                .is_some_and(|p| p.record.grpc.is_some())
            {
                st.pending_calls.remove(&token);
                OK
            } else {
                NOT_FOUND
            }
        },
    )?;
    Ok(())
}

/// gRPC streams are not served: a stream is refused, sends and closes find nothing.
fn add_streams(l: &mut Linker<HostState>) -> anyhow::Result<()> {
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
    Ok(())
}

/// How a gRPC callout's answer reaches the guest.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// `proxy_on_grpc_receive(context, token, message size)`.
    Receive(usize),
    /// `proxy_on_grpc_close(context, token, status)`.
    Close(u32),
}

pub(crate) fn delivery(reply: Option<&HttpCallReply>) -> Delivery {
    let Some(r) = reply else {
        return Delivery::Close(UNAVAILABLE);
    };
    let status = find_header(&r.headers, "grpc-status")
        .map(|s| s.trim().parse::<u32>().unwrap_or(UNKNOWN))
        .unwrap_or(UNKNOWN);
    if status == 0 {
        Delivery::Receive(r.body.len())
    } else {
        Delivery::Close(status)
    }
}

/// The answer of a call whose deadline passed.
pub(crate) fn timed_out() -> HttpCallReply {
    HttpCallReply::default()
        .with_header("grpc-status", &DEADLINE_EXCEEDED.to_string())
        .with_header("grpc-message", "deadline exceeded")
}
