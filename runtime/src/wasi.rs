//! The WASI preview1 subset Envoy's V8 host provides, with Envoy's answers: stdout/stderr go to
//! the log, there is no filesystem, clocks are the host's (here: the manual clock).
//!
//! Implemented by hand rather than with wasmtime-wasi so a module that needs more than Envoy
//! offers fails here the way it fails in Envoy.

use crate::memory::{read, write, write_u32, write_u64};
use crate::state::HostState;
use crate::types::LogLevel;
use wasmtime::{Caller, Linker};

pub(crate) const FUNCTIONS: &[&str] = &[
    "args_get",
    "args_sizes_get",
    "environ_get",
    "environ_sizes_get",
    "clock_time_get",
    "random_get",
    "fd_write",
    "fd_read",
    "fd_close",
    "fd_seek",
    "fd_fdstat_get",
    "fd_prestat_get",
    "fd_prestat_dir_name",
    "path_open",
    "poll_oneoff",
    "proc_exit",
    "sched_yield",
];

const ESUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EFAULT: i32 = 21;
const ENOENT: i32 = 44;
const ENOSYS: i32 = 52;
const ENOTSUP: i32 = 58;

type C<'a> = Caller<'a, HostState>;

fn env_strings(st: &HostState) -> Vec<Vec<u8>> {
    st.opts
        .environment
        .iter()
        .map(|(k, v)| format!("{k}={v}\0").into_bytes())
        .collect()
}

fn next_random(st: &mut HostState) -> u64 {
    // xorshift64*: deterministic per VM so failing tests replay identically.
    let mut x = st.rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    st.rng = x;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

pub(crate) fn add_to_linker(l: &mut Linker<HostState>, m: &str) -> anyhow::Result<()> {
    add_args_and_environ(l, m)?;
    add_clock_and_random(l, m)?;
    add_stdio(l, m)?;
    add_filesystem(l, m)?;
    add_process(l, m)
}

/// The command line (always empty) and the environment variables Envoy passes (`vm_config.environment_variables`).
fn add_args_and_environ(l: &mut Linker<HostState>, m: &str) -> anyhow::Result<()> {
    l.func_wrap(m, "args_get", |_c: C<'_>, _argv: i32, _buf: i32| -> i32 {
        ESUCCESS
    })?;
    l.func_wrap(
        m,
        "args_sizes_get",
        |mut c: C<'_>, argc: i32, size: i32| -> i32 {
            if write_u32(&mut c, argc, 0) && write_u32(&mut c, size, 0) {
                ESUCCESS
            } else {
                EFAULT
            }
        },
    )?;
    l.func_wrap(
        m,
        "environ_get",
        |mut c: C<'_>, mut arr: i32, mut buf: i32| -> i32 {
            for s in env_strings(c.data()) {
                if !write_u32(&mut c, arr, buf as u32) || !write(&mut c, buf, &s) {
                    return EFAULT;
                }
                arr += 4;
                buf += s.len() as i32;
            }
            ESUCCESS
        },
    )?;
    l.func_wrap(
        m,
        "environ_sizes_get",
        |mut c: C<'_>, count: i32, size: i32| -> i32 {
            let envs = env_strings(c.data());
            let total: usize = envs.iter().map(Vec::len).sum();
            if write_u32(&mut c, count, envs.len() as u32) && write_u32(&mut c, size, total as u32)
            {
                ESUCCESS
            } else {
                EFAULT
            }
        },
    )?;
    Ok(())
}

/// The host's clocks and a seeded random source (the same bytes on every run of a seed).
fn add_clock_and_random(l: &mut Linker<HostState>, m: &str) -> anyhow::Result<()> {
    l.func_wrap(
        m,
        "clock_time_get",
        |mut c: C<'_>, id: i32, _precision: i64, ret: i32| -> i32 {
            let t = match id {
                0 => c.data().opts.clock.realtime_nanos(),
                1 => c.data().opts.clock.monotonic_nanos(),
                _ => return ENOTSUP,
            };
            if write_u64(&mut c, ret, t) {
                ESUCCESS
            } else {
                EFAULT
            }
        },
    )?;
    l.func_wrap(m, "random_get", |mut c: C<'_>, ptr: i32, len: i32| -> i32 {
        // Written piece by piece: the guest's length must not size a host allocation.
        let (mut at, end) = (ptr as u32 as u64, ptr as u32 as u64 + len as u32 as u64);
        while at < end {
            let r = next_random(c.data_mut()).to_le_bytes();
            let n = (end - at).min(8) as usize;
            if !write(&mut c, at as u32 as i32, &r[..n]) {
                return EFAULT;
            }
            at += n as u64;
        }
        ESUCCESS
    })?;
    Ok(())
}

/// Standard output and error, which Envoy logs; reads and other descriptors are refused.
fn add_stdio(l: &mut Linker<HostState>, m: &str) -> anyhow::Result<()> {
    l.func_wrap(
        m,
        "fd_write",
        |mut c: C<'_>, fd: i32, iovs: i32, n: i32, written: i32| -> i32 {
            // Envoy logs stdout at info and stderr at error, one log line per write call.
            let level = match fd {
                1 => LogLevel::Info,
                2 => LogLevel::Error,
                _ => return EBADF,
            };
            let mut data = Vec::new();
            for i in 0..n.max(0) {
                let Some(iov) = read(&mut c, iovs.wrapping_add(i * 8), 8) else {
                    return EFAULT;
                };
                let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let Some(chunk) = read(&mut c, ptr, len) else {
                    return EFAULT;
                };
                data.extend_from_slice(&chunk);
            }
            let st = c.data();
            st.opts.log_sink.wasi_output(fd as u32, &data);
            if !data.is_empty() {
                let mut line = String::from_utf8_lossy(&data).into_owned();
                if line.ends_with('\n') {
                    line.pop();
                }
                st.log(level, &line);
            }
            if write_u32(&mut c, written, data.len() as u32) {
                ESUCCESS
            } else {
                EFAULT
            }
        },
    )?;
    l.func_wrap(
        m,
        "fd_read",
        |_c: C<'_>, _fd: i32, _iovs: i32, _n: i32, _read: i32| -> i32 { ENOSYS },
    )?;
    // Envoy logs these as errors and reports success.
    l.func_wrap(m, "fd_close", |c: C<'_>, _fd: i32| -> i32 {
        c.data().log(LogLevel::Error, "wasi_unstable fd_close");
        ESUCCESS
    })?;
    l.func_wrap(
        m,
        "fd_seek",
        |c: C<'_>, _fd: i32, _off: i64, _whence: i32, _ret: i32| -> i32 {
            c.data().log(LogLevel::Error, "wasi_unstable fd_seek");
            ESUCCESS
        },
    )?;
    l.func_wrap(
        m,
        "fd_fdstat_get",
        |mut c: C<'_>, fd: i32, ret: i32| -> i32 {
            if fd != 1 && fd != 2 {
                return EBADF;
            }
            let mut stat = [0u8; 24];
            // fs_rights_base = FD_WRITE
            stat[8..16].copy_from_slice(&64u64.to_le_bytes());
            if write(&mut c, ret, &stat) {
                ESUCCESS
            } else {
                EFAULT
            }
        },
    )?;
    Ok(())
}

/// No filesystem: no preopened directory, nothing to open.
fn add_filesystem(l: &mut Linker<HostState>, m: &str) -> anyhow::Result<()> {
    // No preopened directories: BADF ends libc's preopen scan.
    l.func_wrap(
        m,
        "fd_prestat_get",
        |_c: C<'_>, _fd: i32, _ret: i32| -> i32 { EBADF },
    )?;
    l.func_wrap(
        m,
        "fd_prestat_dir_name",
        |_c: C<'_>, _fd: i32, _p: i32, _l: i32| -> i32 { ENOSYS },
    )?;
    l.func_wrap(
        m,
        "path_open",
        |_c: C<'_>,
         _fd: i32,
         _dirflags: i32,
         _p: i32,
         _l: i32,
         _oflags: i32,
         _rb: i64,
         _ri: i64,
         _fdflags: i32,
         _ret: i32|
         -> i32 { ENOENT },
    )?;
    Ok(())
}

/// Polling, exit and yield.
fn add_process(l: &mut Linker<HostState>, m: &str) -> anyhow::Result<()> {
    l.func_wrap(
        m,
        "poll_oneoff",
        |_c: C<'_>, _in: i32, _out: i32, _n: i32, _ret: i32| -> i32 { ENOSYS },
    )?;
    l.func_wrap(
        m,
        "proc_exit",
        |_c: C<'_>, code: i32| -> wasmtime::Result<()> {
            // Envoy treats this as a VM failure; the guest cannot continue after it anyway.
            Err(wasmtime::Error::msg(format!("wasi proc_exit({code})")))
        },
    )?;
    l.func_wrap(m, "sched_yield", |_c: C<'_>| -> i32 { ESUCCESS })?;
    Ok(())
}
