//! Body and configuration buffers by ABI buffer type (`proxy_get_buffer_bytes`,
//! `proxy_set_buffer_bytes`), with Envoy's rules for where a write lands.

use crate::hostcall::{slot, tally, BAD_ARGUMENT, C, INVALID_MEMORY, NOT_FOUND, OK};
use crate::memory::{copy_out, read};
use crate::state::HostState;
use wasmtime::Linker;

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

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
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
    Ok(())
}
