//! Routing decisions for the LLMKube gateway filters, as plain Rust.
//!
//! Nothing here touches the proxy-wasm ABI: the wasm layer moves bytes and headers in and out,
//! these modules decide. That keeps the same decision whichever host runs it (Envoy's V8, the
//! wasmtime test harness, the ext_proc server) and lets every rule be unit-tested natively.

pub mod audit;
pub mod config;
pub mod errors;
mod fast;
pub mod glob;
pub mod models;
pub mod orders;
pub mod pick;
pub mod quarantine;
pub mod rewrite;
pub mod router;
pub mod scan;
