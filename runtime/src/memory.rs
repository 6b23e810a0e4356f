//! Guest memory as the hostcalls (proxy-wasm and WASI) read and write it. Guest pointers and
//! sizes are `i32` on wasm32; a bad one is a status code, never a host panic.

use crate::hostcall::{C, INTERNAL_FAILURE, INVALID_MEMORY, OK};

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
pub(crate) fn written(ok: bool) -> i32 {
    if ok {
        OK
    } else {
        INVALID_MEMORY
    }
}

/// Hands bytes to the guest the ABI way: allocate with `proxy_on_memory_allocate`, copy, write
/// pointer and size through the return pointers. Empty data is (null, 0), as Envoy does, which
/// the Rust SDK turns into `None`.
pub(crate) fn copy_out(
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
