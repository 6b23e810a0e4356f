//! Shared data (get, set with CAS) and shared queues, across the VMs of a [`crate::SharedStore`].

use crate::hostcall::{slot, tally, C, EMPTY, INVALID_MEMORY, NOT_FOUND, OK};
use crate::memory::{copy_out, read, read_str, write_u32, written};
use crate::state::HostState;
use crate::types::{Status, ROOT_CONTEXT_ID};
use wasmtime::Linker;

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
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
                ROOT_CONTEXT_ID,
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
    Ok(())
}
