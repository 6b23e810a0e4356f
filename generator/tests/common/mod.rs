#![allow(dead_code)]
//! Shared fixtures: a valid router (as JSON, which is valid YAML) that tests mutate.

pub mod crds;
pub mod eg;
pub mod eg_xds;
pub mod envoy;
pub mod envoy_run;
pub mod golden;

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

/// Two valid routers (`llm/demo`, `llm/second`) and their references in one input.
pub fn two_routers() -> String {
    let mut r2 = router();
    r2["metadata"]["name"] = json!("second");
    docs(&[
        router(),
        r2,
        isvc("isvc-a", None),
        isvc("isvc-b", None),
        secret(),
    ])
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

pub const OPENAI_KEY: &str = "sk-openai-SECRET-1234";
pub const ANTHROPIC_KEY: &str = "sk-ant-SECRET-5678";

/// The data plane in one router: weighted rules over 3 and 5 local backends, a shadow rule
/// with a cloud target, a mixed-tier non-fail-closed rule, an aggregate holding an openai and an
/// anthropic backend, a fail-closed rule; plus the objects it references.
pub fn dataplane_router() -> Value {
    let mut backends = vec![
        json!({"name": "local-a", "tier": "local", "inferenceServiceRef": {"name": "isvc-a"}}),
        json!({"name": "local-b", "inferenceServiceRef": {"name": "isvc-b"}, "timeout": "3s", "weight": 3}),
    ];
    for x in ["c", "d", "e"] {
        backends.push(json!({"name": format!("local-{x}"), "inferenceServiceRef": {"name": format!("isvc-{x}")}}));
    }
    backends.push(json!({"name": "cloud", "tier": "cloud", "external": {"provider": "openai", "model": "gpt-5", "credentialsSecretRef": {"name": "openai"}}}));
    backends.push(json!({"name": "claude", "external": {"provider": "anthropic", "model": "claude-opus-4", "credentialsSecretRef": {"name": "anth"}}}));
    json!({
        "apiVersion": "inference.llmkube.dev/v1alpha1",
        "kind": "ModelRouter",
        "metadata": {"name": "dp", "namespace": "llm"},
        "spec": {
            "backends": backends,
            "defaultRoute": "local-a",
            "rules": [
                {"name": "pii", "failClosed": true, "match": {"dataClassification": ["pii"]}, "route": {"backends": ["local-a", "local-b"]}},
                {"name": "w3", "match": {"models": ["w3-*"]}, "route": {"strategy": "weighted", "backends": ["local-a", "local-b", "local-c"]}},
                {"name": "w5", "match": {"models": ["w5-*"]}, "route": {"strategy": "weighted", "backends": ["local-a", "local-b", "local-c", "local-d", "local-e"]}},
                {"name": "sh", "match": {"models": ["sh-*"]}, "route": {"strategy": "shadow", "backends": ["local-a", "local-b", "cloud"]}},
                {"name": "mixed", "timeout": "7s", "match": {"models": ["mixed-*"]}, "route": {"backends": ["cloud", "local-a"]}},
                {"name": "ext", "match": {"models": ["ext-*"]}, "route": {"backends": ["cloud", "claude"]}}
            ],
            "proxy": {"streamIdleTimeout": "45s", "quarantineDuration": "20s"}
        }
    })
}

pub fn dataplane_docs(router: Value) -> String {
    let mut v = vec![router];
    for x in ["a", "b", "c", "d", "e"] {
        v.push(isvc(&format!("isvc-{x}"), Some(8000)));
    }
    v.push(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "openai", "namespace": "llm"},
                  "stringData": {"OPENAI_API_KEY": OPENAI_KEY}}));
    v.push(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "anth", "namespace": "llm"},
                  "stringData": {"ANTHROPIC_API_KEY": ANTHROPIC_KEY}}));
    docs(&v)
}

/// The field reference's timeout example: primary-fallback [local (timeout 10s), anthropic
/// (timeout 60s)], with or without a rule timeout.
pub fn reference_example(rule_timeout: Option<&str>) -> Value {
    let mut rule = json!({"name": "pf", "match": {"models": ["*"]}, "route": {"backends": ["local", "anthropic"]}});
    if let Some(t) = rule_timeout {
        rule["timeout"] = json!(t);
    }
    json!({
        "apiVersion": "inference.llmkube.dev/v1alpha1",
        "kind": "ModelRouter",
        "metadata": {"name": "seed", "namespace": "llm"},
        "spec": {
            "backends": [
                {"name": "local", "tier": "local", "inferenceServiceRef": {"name": "isvc-a"}, "timeout": "10s"},
                {"name": "anthropic", "timeout": "60s", "external": {"provider": "anthropic", "model": "claude-opus-4", "credentialsSecretRef": {"name": "anth"}}}
            ],
            "rules": [rule],
            "proxy": {"streamIdleTimeout": "45s"}
        }
    })
}

/// EndpointSlice addresses for `isvc`: two pods on port 8000, as `--endpoints` gives them.
pub fn two_pods(isvc: &str) -> std::collections::BTreeMap<String, Vec<(String, u16)>> {
    [(
        isvc.to_string(),
        vec![
            ("10.0.0.1".to_string(), 8000),
            ("10.0.0.2".to_string(), 8000),
        ],
    )]
    .into()
}
