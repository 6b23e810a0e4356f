//! The ABI's vocabulary: status codes, the maps and buffers a hostcall names, log levels, and
//! the two helpers every wrapper uses (a status into a `Result`, a host buffer into a `Vec`).

/// proxy-wasm ABI status codes (only the ones the filters act on are named).
pub const OK: u32 = 0;
pub const NOT_FOUND: u32 = 1;
pub const BAD_ARGUMENT: u32 = 2;
pub const CAS_MISMATCH: u32 = 8;
pub const INTERNAL_FAILURE: u32 = 10;

/// A hostcall returned a status other than the ones the caller can handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: u32,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} returned status {}", self.call, self.status)
    }
}

pub type HostResult<T> = Result<T, HostError>;

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Map {
    RequestHeaders = 0,
    RequestTrailers = 1,
    ResponseHeaders = 2,
    ResponseTrailers = 3,
    HttpCallResponseHeaders = 6,
    HttpCallResponseTrailers = 7,
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    RequestBody = 0,
    ResponseBody = 1,
    HttpCallResponseBody = 4,
    GrpcReceiveBuffer = 5,
    PluginConfiguration = 7,
}

#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

pub(crate) fn check(call: &'static str, status: u32) -> HostResult<()> {
    if status == OK {
        Ok(())
    } else {
        Err(HostError { call, status })
    }
}

/// Takes ownership of a host-returned buffer (allocated through `proxy_on_memory_allocate`).
///
/// # Safety
/// `data`/`size` must come from a successful hostcall that returned an allocation.
pub(crate) unsafe fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        Vec::new()
    } else {
        Vec::from_raw_parts(data, size, size)
    }
}
