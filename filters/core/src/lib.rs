//! Routing decisions for the LLMKube gateway filters, as plain Rust.
//!
//! Nothing here touches the proxy-wasm ABI: the wasm layer moves bytes and headers in and out,
//! these modules decide. That keeps the same decision whichever host runs it (Envoy's V8, the
//! wasmtime test harness, the ext_proc server) and lets every rule be unit-tested natively.

// A filter must not panic (in Envoy a trap fails every later request on the worker, closed).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod allow;
pub mod attempt;
pub mod audit;
pub mod body;
pub mod budget;
pub mod config;
pub mod errors;
pub mod explain;
// Public for the speed examples only (`examples/scan_speed.rs` times its passes alone).
#[doc(hidden)]
pub mod fast;
pub mod glob;
pub mod headers;
pub mod models;
pub mod orders;
pub mod pick;
pub mod plan;
pub mod provider;
pub mod quarantine;
pub mod replay;
pub mod response;
pub mod rewrite;
pub mod router;
pub mod scan;
pub mod shadow;
pub mod shared_codec;
pub mod shared_data;
#[cfg(test)]
mod test_rng;
pub mod verdict;
