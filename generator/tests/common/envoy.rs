//! Reading generated Envoy bootstraps in tests: compile a fixture, then find listeners, routes,
//! clusters, upstream chains and the embedded plugin config by name.

use llmkube_gen::Source;
use llmkube_gen::{compile_envoy, EnvoyOptions, Format};
use router_core::config::PluginConfig;
use serde_json::{json, Value};

use super::dataplane_docs;

pub fn opts() -> EnvoyOptions {
    EnvoyOptions {
        wasm_dir: "/opt/wasm".into(),
        format: Format::Json,
        ..Default::default()
    }
}

pub fn compile_text(text: String) -> String {
    compile_envoy(
        &[Source {
            name: "dp.yaml".into(),
            text,
        }],
        &opts(),
    )
    .unwrap_or_else(|e| panic!("{:#?}", e.iter().map(|p| p.to_string()).collect::<Vec<_>>()))
}

pub fn compile(router: Value) -> Value {
    serde_json::from_str(&compile_text(dataplane_docs(router))).unwrap()
}

pub fn hcm(b: &Value) -> &Value {
    &b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

pub fn routes(b: &Value) -> Vec<Value> {
    hcm(b)["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap()
        .clone()
}

/// Routes to backends (everything but the final catch-all).
pub fn backend_routes(b: &Value) -> Vec<Value> {
    let mut r = routes(b);
    let last = r.pop().unwrap();
    assert_eq!(last["name"], "no-backend");
    assert_eq!(last["match"], json!({"prefix": "/"}));
    assert_eq!(last["direct_response"]["status"], 404);
    r
}

pub fn route(b: &Value, key: &str) -> Value {
    routes(b)
        .into_iter()
        .find(|r| r["name"] == key)
        .unwrap_or_else(|| panic!("no route {key}"))
}

pub fn clusters(b: &Value) -> Vec<Value> {
    b["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .clone()
}

pub fn cluster(b: &Value, name: &str) -> Value {
    clusters(b)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

pub fn has_cluster(b: &Value, name: &str) -> bool {
    clusters(b).iter().any(|c| c["name"] == name)
}

/// The plugin config the model-router filter (the listener's wasm filter) is given.
pub fn plugin_of(b: &Value) -> PluginConfig {
    let filters = hcm(b)["http_filters"].as_array().unwrap();
    let wasm = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.wasm")
        .expect("the listener loads the model-router filter");
    let s = wasm["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap();
    serde_json::from_str(s).unwrap()
}

pub fn keys(b: &Value) -> Vec<String> {
    backend_routes(b)
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

pub fn rule_keys(b: &Value, rule: &str) -> Vec<String> {
    keys(b)
        .into_iter()
        .filter(|k| k.starts_with(&format!("{rule}/")))
        .collect()
}

/// Upstream HTTP filter names of a cluster (empty: no upstream chain).
pub fn chain(c: &Value) -> Vec<String> {
    c["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        ["http_filters"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn mirrors(r: &Value) -> Vec<String> {
    r["route"]["request_mirror_policies"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| m["cluster"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn listeners(b: &Value) -> Vec<Value> {
    b["static_resources"]["listeners"]
        .as_array()
        .unwrap()
        .clone()
}

pub fn listener(b: &Value, name: &str) -> Value {
    listeners(b)
        .into_iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

/// The route of internal listener `attempt-<backend>`.
pub fn attempt_route(b: &Value, backend: &str) -> Value {
    let l = listener(b, &format!("attempt-{backend}"));
    let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap();
    assert_eq!(routes.len(), 1);
    routes[0].clone()
}

pub fn endpoint0(c: &Value) -> Value {
    c["load_assignment"]["endpoints"][0]["lb_endpoints"][0].clone()
}

/// The effective response-header timeout of each attempt of route `key`, from the plugin config
/// (rule timeout, else the attempt's backend's, which the plugin config resolves to the cap).
pub fn expected_timeouts(pc: &PluginConfig, key: &str) -> Vec<u64> {
    let (rule, order) = key.split_once('/').unwrap();
    let rule_t = pc
        .rules
        .iter()
        .find(|r| r.name == rule)
        .and_then(|r| r.timeout_ms);
    order
        .split(',')
        .map(|b| {
            let be = pc.backends.iter().find(|x| x.name == b).unwrap();
            rule_t.or(be.timeout_ms).unwrap()
        })
        .collect()
}

/// Whether route `key` has attempts with different timeouts (then it goes through the hop).
pub fn hop(pc: &PluginConfig, key: &str) -> bool {
    let t = expected_timeouts(pc, key);
    t.iter().any(|&x| x != t[0])
}
