//! The proxy-wasm values the host, its hostcalls and its embedders share: status codes, log
//! levels, callback answers, stream ids and host errors.

use std::fmt;

/// Root context id Envoy gives the (only) plugin root context of a VM.
pub const ROOT_CONTEXT_ID: u32 = 1;

/// proxy-wasm status codes as the ABI defines them.
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    InvalidMemoryAccess = 6,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace = 0,
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

impl LogLevel {
    pub(crate) fn from_raw(raw: i32) -> Option<LogLevel> {
        Some(match raw {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

/// What a filter callback answered, or that the host did not deliver the callback at all.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// StopIteration (headers) / StopIterationAndBuffer (body).
    Pause,
    /// Any other raw value the guest returned.
    Other(u32),
    /// The callback was not delivered: stream ended by a local reply / close, or the filter stopped
    /// all iteration (Envoy holds the data until the filter resumes).
    NotDelivered,
}

impl Action {
    pub(crate) fn from_raw(raw: i32) -> Action {
        match raw {
            0 => Action::Continue,
            1 => Action::Pause,
            other => Action::Other(other as u32),
        }
    }
}

/// Why a call into the VM failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// The guest trapped (a Rust panic under `panic=abort` is `unreachable`). The VM is now dead.
    Trap {
        function: String,
        message: String,
    },
    /// An earlier trap killed this VM; Envoy (fail-closed) would answer 503 to this request.
    VmDead {
        reason: String,
    },
    UnknownStream(StreamId),
    UnknownHttpCall(u32),
    /// A bound in [`crate::Limits`] was reached (open streams); nothing was delivered to the guest.
    LimitReached(&'static str),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Trap { function, message } => {
                write!(f, "wasm trap in {function}: {message}")
            }
            HostError::VmDead { reason } => write!(f, "wasm VM is dead: {reason}"),
            HostError::UnknownStream(id) => write!(f, "unknown stream {}", id.0),
            HostError::UnknownHttpCall(t) => write!(f, "no pending http call with token {t}"),
            HostError::LimitReached(what) => write!(f, "limit reached: {what}"),
        }
    }
}

impl std::error::Error for HostError {}

/// A context id of an HTTP stream.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

pub(crate) fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    // Names are stored lower-cased; only the probe needs lowering, and only when it has capitals.
    let lowered;
    let name = if name.bytes().any(|b| b.is_ascii_uppercase()) {
        lowered = name.to_ascii_lowercase();
        lowered.as_str()
    } else {
        name
    };
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}
