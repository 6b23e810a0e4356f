//! What the filter behaviour tests share: the router config they run under, loading the
//! release modules into the test kit, requests and the assertions on error bodies.
#![allow(dead_code)]

use serde_json::{json, Value};
use wasm_host::{Host, SharedStore, StreamOutcome, VmOptions};

pub fn router_config() -> Value {
    json!({
        "router": "llm/demo",
        "max_body_bytes": 4096,
        "default_route_strategy": "BackendNameMatch",
        "default_route": "qwen-small",
        "backends": [
            {"name": "qwen-small", "display_name": "qwen3-8b", "capabilities": ["tools"]},
            {"name": "llama-big", "capabilities": ["tools", "long-context"], "model_info": {"context_length": 131072}},
            {"name": "gpt", "tier": "cloud", "external_model": "gpt-5", "provider": "openai"},
            {"name": "claude", "tier": "cloud", "external_model": "claude-opus-4-7", "provider": "anthropic"}
        ],
        "rules": [
            {"name": "regulated", "data_classification": ["pii", "phi"], "fail_closed": true, "backends": ["llama-big", "qwen-small"]},
            {"name": "research", "headers": [{"name": "x-team", "value": "research"}], "backends": ["gpt", "llama-big"]},
            {"name": "qwen", "models": ["qwen3-*"], "backends": ["qwen-small"]},
            {"name": "spread", "models": ["spread"], "strategy": "weighted", "backends": ["qwen-small", "llama-big"]}
        ],
        "audit": {"caller_header": "x-llmkube-client"}
    })
}

pub fn wasm(lib: &str) -> std::path::PathBuf {
    let package = match lib {
        "llmkube_model_router" => "llmkube-model-router",
        "llmkube_upstream" => "llmkube-upstream",
        other => panic!("unknown filter {other}"),
    };
    e2e::wasm::build_filter(package, lib)
}

pub fn host_with(lib: &str, config: &Value) -> Host {
    let opts = VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(config).unwrap())
    .allow_stop_iteration(true);
    let host = Host::from_file(wasm(lib), opts).expect("module loads");
    assert!(
        host.configure_ok(),
        "on_configure refused: {:?}",
        host.logs()
    );
    host
}

/// One Envoy worker of the router with `budgets` as its plugin config's `budgets`, its shared
/// data `shared` (two workers on one store are Envoy's `--concurrency 2`).
pub fn budget_worker(shared: &SharedStore, budgets: Value) -> Host {
    let mut c = router_config();
    c["budgets"] = budgets;
    worker(shared, &c, None)
}

/// One Envoy worker of the router under `config` on the shared data `shared`; `seed` gives it
/// randomness of its own (Envoy's workers each draw their own), else the kit's fixed seed.
pub fn worker(shared: &SharedStore, config: &Value, seed: Option<u64>) -> Host {
    let opts = VmOptions {
        root_id: "model-router".into(),
        random_seed: seed,
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(config).unwrap())
    .allow_stop_iteration(true)
    .with_shared(shared);
    let host = Host::from_file(wasm("llmkube_model_router"), opts).expect("module loads");
    assert!(host.configure_ok(), "{:?}", host.logs());
    host
}

pub fn router() -> Host {
    host_with("llmkube_model_router", &router_config())
}

/// A chat-completions POST of `body` with `extra` headers, the body in `chunk`-byte pieces (one
/// piece for 0).
pub fn send_body(
    host: &mut Host,
    extra: &[(&str, &str)],
    body: &str,
    chunk: usize,
) -> StreamOutcome {
    let len = body.len().to_string();
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-length", len.as_str()),
    ];
    headers.extend_from_slice(extra);
    host.run_request(&headers, body.as_bytes(), chunk)
        .expect("no trap")
}

pub fn post(host: &mut Host, extra: &[(&str, &str)], body: &str) -> StreamOutcome {
    let mut headers = vec![(":authority", "gw"), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    send_body(host, &headers, body, 0)
}

pub fn error_of(o: &StreamOutcome) -> (u32, String) {
    let r = o.local_response.as_ref().expect("a local response");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: Value = serde_json::from_slice(&r.body).expect("JSON error body");
    (r.status, v["error"]["code"].as_str().unwrap().to_string())
}

pub fn upstream(metadata_backend: Option<&str>) -> Host {
    let mut opts = VmOptions {
        root_id: "upstream".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&router_config()).unwrap())
    .allow_stop_iteration(true);
    if let Some(b) = metadata_backend {
        opts = opts.with_property(
            &[
                "xds",
                "upstream_host_metadata",
                "filter_metadata",
                "llmkube",
                "backend",
            ],
            b,
        );
    }
    let h = Host::from_file(wasm("llmkube_upstream"), opts).unwrap();
    assert!(h.configure_ok());
    h
}

pub fn attempt(h: &mut Host, extra: &[(&str, &str)], body: &str) -> StreamOutcome {
    send_body(h, extra, body, 5)
}
