//! Metrics a guest defines and updates (counters, gauges, histograms), bounded per VM.

use crate::hostcall::{
    slot, tally, BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY, NOT_FOUND, OK,
};
use crate::memory::{read_str, write_u32, write_u64, written};
use crate::state::HostState;
use crate::state::{Metric, MetricKind};
use wasmtime::Linker;

fn metric_mut(st: &mut HostState, id: i32) -> Option<&mut Metric> {
    st.metrics.get_mut((id as u32 as usize).checked_sub(1)?)
}

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, ty: i32, np: i32, ns: i32, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_define_metric") });
            let kind = match ty {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return BAD_ARGUMENT,
            };
            let Some(name) = read_str(&mut c, np, ns) else {
                return INVALID_MEMORY;
            };
            let st = c.data_mut();
            let max = st.opts.limits.max_metrics;
            let metrics = &mut st.metrics;
            let idx = match metrics
                .iter()
                .position(|m| m.name == name && m.kind == kind)
            {
                Some(i) => i,
                None => {
                    if metrics.len() >= max {
                        return INTERNAL_FAILURE;
                    }
                    metrics.push(Metric {
                        name,
                        kind,
                        value: 0,
                        samples: vec![],
                        count: 0,
                        sum: 0,
                        set_seq: 0,
                    });
                    metrics.len() - 1
                }
            };
            written(write_u32(&mut c, ret, idx as u32 + 1))
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: C<'_>, id: i32, offset: i64| -> i32 {
            tally(&mut c, const { slot("proxy_increment_metric") });
            let Some(m) = metric_mut(c.data_mut(), id) else {
                return NOT_FOUND;
            };
            match m.kind {
                MetricKind::Counter if offset > 0 => m.value = m.value.saturating_add(offset),
                MetricKind::Gauge => m.value = m.value.saturating_add(offset),
                _ => return BAD_ARGUMENT,
            }
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: C<'_>, id: i32, value: i64| -> i32 {
            tally(&mut c, const { slot("proxy_record_metric") });
            let keep = c.data().opts.limits.histogram_samples;
            let Some(m) = metric_mut(c.data_mut(), id) else {
                return NOT_FOUND;
            };
            match m.kind {
                MetricKind::Counter => m.value = m.value.saturating_add(value),
                MetricKind::Gauge => {
                    m.value = value;
                    m.set_seq = crate::state::next_gauge_set();
                }
                MetricKind::Histogram => m.record(value as u64, keep),
            }
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C<'_>, id: i32, ret: i32| -> i32 {
            tally(&mut c, const { slot("proxy_get_metric") });
            let Some(m) = metric_mut(c.data_mut(), id) else {
                return NOT_FOUND;
            };
            if m.kind == MetricKind::Histogram {
                return BAD_ARGUMENT;
            }
            let v = m.value as u64;
            written(write_u64(&mut c, ret, v))
        },
    )?;
    Ok(())
}
