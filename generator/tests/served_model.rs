//! Served model names of local backends: read from the InferenceService, carried in the plugin
//! config, rewritten per attempt like an external backend's model on every target; where unknown,
//! `validate` names the rules that can send a local engine a model name it may not serve.

mod common;
use common::envoy::{cluster, compile_text, plugin_of};
use common::*;
use llmkube_gen::{validate_sources, Source};
use serde_json::{json, Value};

fn served_isvc(name: &str, served: &str) -> Value {
    let mut v = isvc(name, None);
    v["spec"]["extraArgs"] = json!(["--served-model-name", served, "alias"]);
    v
}

fn with_served(router: Value) -> String {
    docs(&[
        router,
        served_isvc("isvc-a", "Qwen/Qwen3-8B"),
        isvc("isvc-b", None),
        secret(),
    ])
}

fn lint(text: String) -> Vec<String> {
    let d = validate_sources(&[Source {
        name: "t.yaml".into(),
        text,
    }]);
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    d.warnings
        .iter()
        .map(|p| p.to_string())
        .filter(|w| w.contains("served"))
        .collect()
}

#[test]
fn validate_names_rules_that_can_send_foreign_model_names_to_a_local_backend() {
    let mut r = router();
    r["spec"]["rules"] = json!([
        {"name": "glob", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["local-a", "local-b"]}},
        {"name": "exact", "match": {"models": ["local-b"]}, "route": {"backends": ["local-b"]}},
        {"name": "any", "match": {"headers": {"x-team": "a"}}, "route": {"backends": ["cloud", "local-b"]}}
    ]);
    r["spec"]["defaultRoute"] = json!("local-b");
    let advice = "and InferenceService/isvc-b does not say which model name its engine serves (an engine answers 404 for a name it does not serve); set --served-model-name in its extraArgs, or spec.gateway.modelName, and the gateway rewrites \"model\" to it for backend \"local-b\"";
    assert_eq!(
        lint(with_served(r.clone())),
        vec![
            format!("ModelRouter/demo: spec.rules[0].route.backends[1]: can send model names other than \"local-b\" to local backend \"local-b\": match.models [\"qwen3-*\"], {advice}"),
            format!("ModelRouter/demo: spec.rules[2].route.backends[1]: can send model names other than \"local-b\" to local backend \"local-b\": any model (no match.models), {advice}"),
            format!("ModelRouter/demo: spec.defaultRoute: sends every model no rule or backend name matched to local backend \"local-b\", not only \"local-b\", {advice}"),
        ]
    );
    // Once the engine's name is known, nothing to say.
    let text = docs(&[
        r,
        served_isvc("isvc-a", "Qwen/Qwen3-8B"),
        {
            let mut b = isvc("isvc-b", None);
            b["spec"]["gateway"] =
                json!({"enabled": true, "gatewayRef": {"name": "gw"}, "modelName": "b-model"});
            b
        },
        secret(),
    ]);
    assert_eq!(lint(text), Vec::<String>::new());
}

#[test]
fn the_envoy_target_rewrites_a_local_backends_model_per_attempt() {
    let mut r = router();
    r["spec"]["rules"] = json!([
        {"name": "r0", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["local-a", "local-b"]}}
    ]);
    let b: Value = serde_json::from_str(&compile_text(with_served(r))).unwrap();
    let pc = plugin_of(&b);
    assert_eq!(
        pc.backends[0].served_model.as_deref(),
        Some("Qwen/Qwen3-8B")
    );
    assert_eq!(pc.backends[1].served_model, None);
    let chain = |name: &str| {
        cluster(&b, name)
            .pointer("/typed_extension_protocol_options/envoy.extensions.upstreams.http.v3.HttpProtocolOptions/http_filters")
            .cloned()
    };
    let upstream = chain("backend-local-a").expect("local-a's attempts rewrite model");
    assert_eq!(upstream[0]["typed_config"]["config"]["root_id"], "upstream");
    assert!(chain("backend-local-b").is_none(), "nothing to rewrite");
    assert!(chain("order.local-a.local-b").is_some());
}
