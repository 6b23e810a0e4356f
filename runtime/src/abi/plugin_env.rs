//! What a plugin asks of its host outside any stream: the log, the log level, the time, the tick
//! period and its configuration.

use crate::hostcall::{slot, tally, BAD_ARGUMENT, C, INVALID_MEMORY, OK};
use crate::memory::{copy_out, read_str, write_u32, write_u64, written};
use crate::state::HostState;
use crate::types::LogLevel;
use wasmtime::Linker;

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "env",
        "proxy_log",
        |mut c: C<'_>, level: i32, ptr: i32, len: i32| -> i32 {
            tally(&mut c, const { slot("proxy_log") });
            let Some(level) = LogLevel::from_raw(level) else {
                return BAD_ARGUMENT;
            };
            if !c.data().opts.log_sink.enabled(level) {
                return OK;
            }
            let Some(msg) = read_str(&mut c, ptr, len) else {
                return INVALID_MEMORY;
            };
            c.data().log(level, &msg);
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_log_level",
        |mut c: C<'_>, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_log_level") });
            let level = c.data().opts.log_level as u32;
            written(write_u32(&mut c, ret, level))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_current_time_nanoseconds") });
            let now = c.data().opts.clock.realtime_nanos();
            written(write_u64(&mut c, ret, now))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, ms: i32| -> i32 {
            tally(&mut c, const { slot("proxy_set_tick_period_milliseconds") });
            let st = c.data_mut();
            st.tick_period_ms = ms as u32;
            st.next_tick_nanos = st.opts.clock.monotonic_nanos() + (ms as u32 as u64) * 1_000_000;
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_configuration",
        |mut c: C<'_>, pp: i32, sp: i32| -> wasmtime::Result<i32> {
            tally(&mut c, const { slot("proxy_get_configuration") });
            let cfg = c.data().opts.plugin_configuration.clone();
            copy_out(&mut c, &cfg, pp, sp)
        },
    )?;
    Ok(())
}
