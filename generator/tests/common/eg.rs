//! Fixtures of the envoy-gateway target's tests: options with a fixed module pin, the
//! walkthrough's router, the Gateway reference, documents of one kind.

use llmkube_gen::targets::envoy_gateway::{GatewayOptions, WasmSource};
use serde_json::{json, Value};

pub const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
pub const URL: &str = "https://wasm.example.internal/llmkube_model_router.wasm";

pub fn opts() -> GatewayOptions {
    GatewayOptions {
        wasm_sha256: Some(SHA.into()),
        ..GatewayOptions::new(WasmSource::Http(URL.into()))
    }
}

pub fn with_gateway(mut r: Value) -> Value {
    r["spec"]["gatewayRef"] = json!({"name": "ai-gateway", "namespace": "envoy-gateway-system"});
    r
}

pub fn example() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/envoy-gateway/router.yaml"
    ))
    .unwrap()
}

// Not every test crate including `common` uses it.
#[allow(unused_imports)]
pub use super::eg_xds::of_kind;
