//! Plugin configuration parsing and router compilation never panic, and a compiled router
//! decides on any model without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use router_core::config::PluginConfig;
use router_core::router::{RequestHeaders, Router};

fuzz_target!(|data: &[u8]| {
    let Ok(config) = serde_json::from_slice::<PluginConfig>(data) else { return };
    let Ok(router) = Router::new(config) else { return };
    let mut h = RequestHeaders::new();
    h.push("x-llmkube-classification".into(), "pii".into());
    for model in ["", "a", "qwen3-8b", "gpt-5", "*"] {
        let _ = router.decide(model, &h, &mut || 7);
    }
    let _ = router.models_body();
});
