//! The thin edge between the filters and the proxy-wasm host.
//!
//! The Rust SDK's `hostcalls` panic on any status they did not expect (for example a header
//! write that Envoy refuses with BadArgument after headers continued). In Envoy a panic traps the
//! VM and, fail-closed, every later request on that worker gets 503. So the filters call the
//! ABI through these wrappers instead: every status comes back as a `Result`, host-provided
//! buffers are bounds-checked, and nothing here can panic.
//!
//! The SDK still provides the exported entry points (`proxy_on_*`, `proxy_on_memory_allocate`);
//! buffers the host hands back were allocated through that export, i.e. by this module's
//! allocator, so taking ownership with `Vec::from_raw_parts` is sound.
//!
//! This root only names what the crate offers. The modules: `types` (status codes, maps, buffers,
//! levels), `host` (headers, bodies, properties, local replies, metrics, logs, clock, shared
//! data and ticks), `codec` (the header-map serialisation), `pairs` (a header map read in place),
//! `callout` (HTTP and gRPC calls out of a request, their responses, resuming the paused stream),
//! `shared_table` (one shared-data value kept by every worker), `broadcast` (messages to every
//! worker through shared queues) and `abi` (the imports themselves). No module imports this root.

// A filter must not panic (in Envoy a trap fails every later request on the worker, closed).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod abi;
pub mod broadcast;
mod callout;
mod codec;
mod host;
mod pairs;
pub mod shared_table;
mod types;
pub mod wake;

pub use callout::*;
pub use codec::{decode_pairs, encode_pairs};
pub use host::*;
pub use pairs::{header_map, HeaderMap};
pub use types::{
    Buffer, HostError, HostResult, Level, Map, BAD_ARGUMENT, CAS_MISMATCH, NOT_FOUND, OK,
};
