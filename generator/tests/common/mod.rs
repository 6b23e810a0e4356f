#![allow(dead_code)]
//! Shared fixtures: a valid router (as JSON, which is valid YAML) that tests mutate.

use serde_json::{json, Value};

pub fn router() -> Value {
    json!({
        "apiVersion": "inference.llmkube.dev/v1alpha1",
        "kind": "ModelRouter",
        "metadata": {"name": "demo", "namespace": "llm"},
        "spec": {
            "backends": [
                {"name": "local-a", "tier": "local", "inferenceServiceRef": {"name": "isvc-a"}, "capabilities": ["tools"]},
                {"name": "local-b", "inferenceServiceRef": {"name": "isvc-b"}},
                {"name": "cloud", "tier": "cloud", "external": {"provider": "openai", "model": "gpt-5", "credentialsSecretRef": {"name": "openai"}}}
            ],
            "defaultRoute": "local-a",
            "rules": [
                {"name": "r0", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["local-a"]}}
            ]
        }
    })
}

pub fn isvc(name: &str, port: Option<u16>) -> Value {
    let mut v = json!({
        "apiVersion": "inference.llmkube.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": {"runtime": "vllm", "vllmConfig": {"maxModelLen": 8192}}
    });
    if let Some(p) = port {
        v["spec"]["endpoint"] = json!({"port": p});
    }
    v
}

pub fn secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "openai", "namespace": "llm"},
           "stringData": {"OPENAI_API_KEY": "sk-test"}})
}

/// Router plus the objects it references, as one multi-document YAML text.
pub fn docs(values: &[Value]) -> String {
    values
        .iter()
        .map(|v| serde_json::to_string(v).unwrap())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

pub fn full(router: Value) -> String {
    docs(&[
        router,
        isvc("isvc-a", Some(8000)),
        isvc("isvc-b", None),
        secret(),
    ])
}

/// Sets `value` at a JSON pointer (creating objects on the way).
pub fn set(v: &mut Value, pointer: &str, value: Value) {
    let mut cur = v;
    for part in pointer.trim_start_matches('/').split('/') {
        cur = if let Ok(i) = part.parse::<usize>() {
            &mut cur[i]
        } else {
            if cur.get(part).is_none() {
                cur[part] = json!({});
            }
            &mut cur[part]
        };
    }
    *cur = value;
}
