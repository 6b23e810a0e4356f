//! The response usage reader: reading a body (JSON or server-sent events, with or without
//! stripping the usage-only chunk) in pieces gives the same answer and the same forwarded bytes
//! as reading it whole, the same as the reader before it (the `usage-oracle` feature: a branch
//! per byte and a `serde_json::Value` per `usage` object), a JSON object's usage read from its
//! end is the walk's, and never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use router_core::budget::usage::split_invariance;
use router_core::budget::usage_oracle::matches_oracle;
use router_core::budget::usage_tail::agrees_with_walk;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = split_invariance(data) {
        panic!("{e}");
    }
    if let Err(e) = matches_oracle(data) {
        panic!("{e}");
    }
    if let Err(e) = agrees_with_walk(data) {
        panic!("{e}");
    }
});
