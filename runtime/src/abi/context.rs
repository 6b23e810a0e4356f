//! The effective context, the end of a plugin's shutdown, the status of the last call and
//! foreign functions.

use crate::hostcall::{slot, tally, BAD_ARGUMENT, C, INVALID_MEMORY, NOT_FOUND, OK};
use crate::memory::{copy_out, read_str, write_u32};
use crate::state::HostState;
use crate::types::ROOT_CONTEXT_ID;
use wasmtime::Linker;

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
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
            if id == ROOT_CONTEXT_ID || st.streams.contains_key(&id) {
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
    Ok(())
}
