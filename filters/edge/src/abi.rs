//! The proxy-wasm ABI 0.2.1 imports the edge calls. Native builds (unit tests of code that links
//! this crate) get inert stand-ins instead, written next to each import: the real behaviour is
//! tested on the compiled module through the wasmtime harness.

#[cfg(not(target_arch = "wasm32"))]
use crate::types::{BAD_ARGUMENT, NOT_FOUND, OK};

/// Declares each import once: for wasm32 as an `env` import, natively as the stand-in body.
macro_rules! hostcalls {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> u32 $native:block)*) => {
        #[cfg(target_arch = "wasm32")]
        #[link(wasm_import_module = "env")]
        extern "C" {
            $(pub(crate) fn $name($($arg: $ty),*) -> u32;)*
        }

        $(
            #[cfg(not(target_arch = "wasm32"))]
            #[allow(unused_variables, clippy::too_many_arguments)]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> u32 $native
        )*
    };
}

hostcalls! {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32 {
        OK
    }
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32 {
        NOT_FOUND
    }
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32 {
        NOT_FOUND
    }
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32 {
        OK
    }
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32 {
        OK
    }
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32 {
        OK
    }
    fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32 {
        OK
    }
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32 {
        NOT_FOUND
    }
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32 {
        *return_time = 0;
        OK
    }
    fn proxy_get_log_level(return_level: *mut u32) -> u32 {
        *return_level = 0;
        OK
    }
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32 {
        *return_id = 0;
        OK
    }
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32 {
        OK
    }
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32 {
        OK
    }
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32 {
        NOT_FOUND
    }
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32 {
        OK
    }
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32 {
        OK
    }
    fn proxy_http_call(
        upstream_data: *const u8,
        upstream_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        body_data: *const u8,
        body_size: usize,
        trailers_data: *const u8,
        trailers_size: usize,
        timeout_ms: u32,
        return_token: *mut u32,
    ) -> u32 {
        BAD_ARGUMENT
    }
    fn proxy_grpc_call(
        upstream_data: *const u8,
        upstream_size: usize,
        service_name_data: *const u8,
        service_name_size: usize,
        method_name_data: *const u8,
        method_name_size: usize,
        initial_metadata_data: *const u8,
        initial_metadata_size: usize,
        message_data: *const u8,
        message_size: usize,
        timeout_ms: u32,
        return_callout_id: *mut u32,
    ) -> u32 {
        BAD_ARGUMENT
    }
    fn proxy_continue_stream(stream_type: u32) -> u32 {
        OK
    }
    fn proxy_set_effective_context(context_id: u32) -> u32 {
        BAD_ARGUMENT
    }
    fn proxy_register_shared_queue(name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32 {
        *return_id = 0;
        BAD_ARGUMENT
    }
    fn proxy_resolve_shared_queue(
        vm_id_data: *const u8,
        vm_id_size: usize,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32 {
        NOT_FOUND
    }
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32 {
        NOT_FOUND
    }
    fn proxy_dequeue_shared_queue(
        queue_id: u32,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32 {
        NOT_FOUND
    }
}
