//! The proxy-wasm ABI 0.2.1 imports the edge calls, and inert stand-ins for native builds.

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "env")]
extern "C" {
    pub(crate) fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    pub(crate) fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    pub(crate) fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    pub(crate) fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    pub(crate) fn proxy_remove_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
    ) -> u32;
    pub(crate) fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    pub(crate) fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32;
    pub(crate) fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    pub(crate) fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    pub(crate) fn proxy_get_log_level(return_level: *mut u32) -> u32;
    pub(crate) fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    pub(crate) fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    pub(crate) fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    pub(crate) fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    pub(crate) fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    pub(crate) fn proxy_http_call(
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
    ) -> u32;
    pub(crate) fn proxy_grpc_call(
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
    ) -> u32;
    pub(crate) fn proxy_continue_stream(stream_type: u32) -> u32;
}

// Native builds (unit tests of code that links this crate) get inert stand-ins: the real
// behaviour is tested on the compiled module through the wasmtime harness.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod native {
    pub unsafe fn proxy_log(_: u32, _: *const u8, _: usize) -> u32 {
        crate::OK
    }
    pub unsafe fn proxy_get_buffer_bytes(
        _: u32,
        _: usize,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        crate::NOT_FOUND
    }
    pub unsafe fn proxy_get_header_map_pairs(_: u32, _: *mut *mut u8, _: *mut usize) -> u32 {
        crate::NOT_FOUND
    }
    pub unsafe fn proxy_replace_header_map_value(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        crate::OK
    }
    pub unsafe fn proxy_remove_header_map_value(_: u32, _: *const u8, _: usize) -> u32 {
        crate::OK
    }
    pub unsafe fn proxy_set_buffer_bytes(
        _: u32,
        _: usize,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> u32 {
        crate::OK
    }
    pub unsafe fn proxy_get_property(
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
    ) -> u32 {
        crate::NOT_FOUND
    }
    pub unsafe fn proxy_get_log_level(l: *mut u32) -> u32 {
        *l = 0;
        crate::OK
    }
    pub unsafe fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32 {
        *t = 0;
        crate::OK
    }
    pub unsafe fn proxy_define_metric(_: u32, _: *const u8, _: usize, id: *mut u32) -> u32 {
        *id = 0;
        crate::OK
    }
    pub unsafe fn proxy_increment_metric(_: u32, _: i64) -> u32 {
        crate::OK
    }
    pub unsafe fn proxy_get_shared_data(
        _: *const u8,
        _: usize,
        _: *mut *mut u8,
        _: *mut usize,
        _: *mut u32,
    ) -> u32 {
        crate::NOT_FOUND
    }
    pub unsafe fn proxy_set_shared_data(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: u32,
    ) -> u32 {
        crate::OK
    }
    pub unsafe fn proxy_set_tick_period_milliseconds(_: u32) -> u32 {
        crate::OK
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn proxy_http_call(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: u32,
        _: *mut u32,
    ) -> u32 {
        crate::BAD_ARGUMENT
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn proxy_grpc_call(
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: u32,
        _: *mut u32,
    ) -> u32 {
        crate::BAD_ARGUMENT
    }
    pub unsafe fn proxy_continue_stream(_: u32) -> u32 {
        crate::OK
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn proxy_send_local_response(
        _: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: i32,
    ) -> u32 {
        crate::OK
    }
}
#[cfg(not(target_arch = "wasm32"))]
pub(crate) use native::*;
