//! What a filter does to its stream: resume it, reset it, or answer it locally.

use super::header_maps::deserialize_map;
use crate::hostcall::{slot, tally, BAD_ARGUMENT, C, INVALID_MEMORY, NOT_FOUND, OK};
use crate::memory::{read, read_str};
use crate::state::HostState;
use crate::state::LocalResponse;
use wasmtime::Linker;

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

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
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
    Ok(())
}
