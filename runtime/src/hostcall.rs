//! What every `env.proxy_*` hostcall shares: the function table, the per-call tally and the
//! status codes as the ABI returns them.

use crate::state::HostState;
use crate::types::Status;
use wasmtime::Caller;

pub(crate) const FUNCTIONS: &[&str] = &[
    "proxy_log",
    "proxy_get_log_level",
    "proxy_get_current_time_nanoseconds",
    "proxy_set_tick_period_milliseconds",
    "proxy_get_configuration",
    "proxy_get_buffer_bytes",
    "proxy_set_buffer_bytes",
    "proxy_get_header_map_pairs",
    "proxy_set_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_remove_header_map_value",
    "proxy_add_header_map_value",
    "proxy_get_property",
    "proxy_set_property",
    "proxy_get_shared_data",
    "proxy_set_shared_data",
    "proxy_register_shared_queue",
    "proxy_resolve_shared_queue",
    "proxy_dequeue_shared_queue",
    "proxy_enqueue_shared_queue",
    "proxy_continue_stream",
    "proxy_close_stream",
    "proxy_continue_request",
    "proxy_continue_response",
    "proxy_clear_route_cache",
    "proxy_send_local_response",
    "proxy_http_call",
    "proxy_grpc_call",
    "proxy_grpc_stream",
    "proxy_grpc_send",
    "proxy_grpc_cancel",
    "proxy_grpc_close",
    "proxy_get_status",
    "proxy_set_effective_context",
    "proxy_done",
    "proxy_call_foreign_function",
    "proxy_define_metric",
    "proxy_increment_metric",
    "proxy_record_metric",
    "proxy_get_metric",
];

pub(crate) const OK: i32 = Status::Ok as i32;
pub(crate) const NOT_FOUND: i32 = Status::NotFound as i32;
pub(crate) const BAD_ARGUMENT: i32 = Status::BadArgument as i32;
pub(crate) const INVALID_MEMORY: i32 = Status::InvalidMemoryAccess as i32;
pub(crate) const INTERNAL_FAILURE: i32 = Status::InternalFailure as i32;
pub(crate) const EMPTY: i32 = Status::Empty as i32;

pub(crate) type C<'a> = Caller<'a, HostState>;

/// The position of `name` in [`FUNCTIONS`] (a compile-time constant at each hostcall).
pub(crate) const fn slot(name: &str) -> usize {
    let mut i = 0;
    while i < FUNCTIONS.len() {
        let f = FUNCTIONS[i].as_bytes();
        let n = name.as_bytes();
        if f.len() == n.len() {
            let mut j = 0;
            while j < f.len() && f[j] == n[j] {
                j += 1;
            }
            if j == f.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not a proxy-wasm function of this host")
}

/// Counts one guest call of hostcall `slot` ([`crate::Vm::hostcalls`]): what a filter costs its
/// host depends on how many it makes, which the guest's own instruction count does not show.
pub(crate) fn tally(c: &mut C<'_>, slot: usize) {
    // Fuel left when the guest made this call: consecutive marks split a callback into the
    // guest's work between its hostcalls ([`crate::Vm::trace_hostcalls`]).
    let left = match c.data().hostcall_trace {
        Some(_) => c.get_fuel().ok(),
        None => None,
    };
    let st = c.data_mut();
    if let Some(n) = st.hostcalls.get_mut(slot) {
        *n += 1;
    }
    if let (Some(trace), Some(left)) = (st.hostcall_trace.as_mut(), left) {
        if trace.len() < MAX_TRACED_HOSTCALLS {
            trace.push((slot, u64::MAX - left));
        }
    }
}

/// Hostcalls a trace keeps before it stops recording (a trace is for a few requests).
pub(crate) const MAX_TRACED_HOSTCALLS: usize = 1 << 16;
