//! Backends whose pods the gateway picks (`resolution: endpoint`, `balancing.mode: LoadAware`):
//! an ORIGINAL_DST cluster reading `x-gateway-destination-endpoint`, the pods and balancing in
//! the plugin config, hops for failover orders, and RoundRobin left as it was.

mod common;
use common::envoy::{attempt_route, cluster, plugin_of, route};
use common::*;
use llmkube_gen::{compile_envoy, compile_envoy_diag, Diagnostics, EnvoyOptions, Format, Source};
use serde_json::{json, Value};

fn opts() -> EnvoyOptions {
    EnvoyOptions {
        wasm_dir: "/opt/wasm".into(),
        format: Format::Json,
        endpoints: common::two_pods("isvc-a"),
        ..Default::default()
    }
}

fn picked_router(balancing: Value) -> Value {
    let mut r = router();
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    r["spec"]["backends"][0]["balancing"] = balancing;
    r["spec"]["rules"] = json!([
        {"name": "r0", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["local-a"]}},
        {"name": "r1", "match": {"models": ["big"]}, "route": {"backends": ["local-a", "cloud"]}},
        {"name": "r2", "match": {"models": ["other"]}, "route": {"backends": ["local-b"]}}
    ]);
    r
}

fn sources(r: Value) -> Vec<Source> {
    vec![Source {
        name: "pick.yaml".into(),
        text: full(r),
    }]
}

fn compile(r: Value) -> Value {
    let out = compile_envoy(&sources(r), &opts())
        .unwrap_or_else(|e| panic!("{:#?}", e.iter().map(|p| p.to_string()).collect::<Vec<_>>()));
    serde_json::from_str(&out).unwrap()
}

const LOAD_AWARE: &str = r#"{"mode": "LoadAware", "prefixAffinity": {"blockBytes": 512},
    "sessionAffinity": {"headers": ["X-Session-Id"], "idleTimeout": "10m"}}"#;

#[test]
fn a_load_aware_endpoint_backend_becomes_an_original_dst_cluster_picked_by_the_filter() {
    let b = compile(picked_router(serde_json::from_str(LOAD_AWARE).unwrap()));
    let c = cluster(&b, "backend-local-a");
    assert_eq!(c["type"], "ORIGINAL_DST");
    assert_eq!(c["lb_policy"], "CLUSTER_PROVIDED");
    assert_eq!(
        c["original_dst_lb_config"],
        json!({"use_http_header": true, "http_header_name": "x-gateway-destination-endpoint"})
    );
    assert!(c.get("load_assignment").is_none() && c.get("health_checks").is_none());

    let pc = plugin_of(&b);
    let pick = pc.backends[0].pick.as_ref().expect("pick config");
    assert_eq!(pick.endpoints, ["10.0.0.1:8000", "10.0.0.2:8000"]);
    assert_eq!(
        pick.prefix_affinity.as_ref().unwrap().block_bytes,
        Some(512)
    );
    let s = pick.session_affinity.as_ref().unwrap();
    assert_eq!(
        (s.headers.as_slice(), s.idle_ms),
        (&["x-session-id".to_string()][..], Some(600_000))
    );
    // isvc-a runs vLLM: its pods' /metrics are scraped through the same cluster.
    assert_eq!(pick.scrape_cluster.as_deref(), Some("backend-local-a"));
    assert!(pc.backends[1].pick.is_none() && pc.backends[2].pick.is_none());

    // The failover order goes through the hops (an aggregate would skip an ORIGINAL_DST member
    // without hosts); the cloud attempt never hears of the pod.
    let r1 = route(&b, "r1/local-a,cloud");
    assert_eq!(r1["route"]["cluster"], "attempts.local-a.cloud");
    let keeps = |r: &Value| {
        !r["request_headers_to_remove"]
            .as_array()
            .is_some_and(|a| a.contains(&json!("x-gateway-destination-endpoint")))
    };
    assert!(keeps(&r1) && keeps(&attempt_route(&b, "local-a")));
    assert!(!keeps(&attempt_route(&b, "cloud")));
    assert!(keeps(&route(&b, "r0/local-a")));
    assert_eq!(
        route(&b, "r0/local-a")["route"]["cluster"],
        "backend-local-a"
    );
}

#[test]
fn round_robin_keeps_the_static_cluster_and_warns_about_ignored_affinities() {
    let bal = json!({"mode": "RoundRobin", "prefixAffinity": {}, "sessionAffinity": {"headers": ["x-s"]}});
    let mut diags = Diagnostics::default();
    let out = compile_envoy_diag(&sources(picked_router(bal)), &opts(), &mut diags).unwrap();
    let b: Value = serde_json::from_str(&out).unwrap();
    let c = cluster(&b, "backend-local-a");
    assert_eq!(c["type"], "STATIC");
    assert_eq!(c["lb_policy"], "ROUND_ROBIN");
    assert!(plugin_of(&b).backends[0].pick.is_none());
    let warnings: Vec<String> = diags.warnings.iter().map(|p| p.to_string()).collect();
    for name in ["PrefixAffinityIgnored", "SessionAffinityIgnored"] {
        assert!(
            warnings.iter().any(|w| w.contains(name)),
            "{name} in {warnings:?}"
        );
    }
    // The failover order over the static cluster stays an aggregate.
    assert_eq!(
        route(&b, "r1/local-a,cloud")["route"]["cluster"],
        "order.local-a.cloud"
    );
}

#[test]
fn two_picked_backends_in_one_order_are_refused() {
    let mut r = picked_router(json!({"mode": "LoadAware"}));
    r["spec"]["backends"][1]["resolution"] = json!("endpoint");
    r["spec"]["backends"][1]["balancing"] = json!({"mode": "LoadAware"});
    r["spec"]["rules"][2]["route"]["backends"] = json!(["local-a", "local-b"]);
    let o = EnvoyOptions {
        endpoints: [
            ("isvc-a".to_string(), vec![("10.0.0.1".to_string(), 8000)]),
            ("isvc-b".to_string(), vec![("10.0.0.9".to_string(), 8000)]),
        ]
        .into(),
        ..opts()
    };
    let errs: Vec<String> = compile_envoy(&sources(r), &o)
        .unwrap_err()
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("ModelRouter/demo: spec.rules[2].backends: backends local-a and local-b both have their pods picked"),
        "{errs:?}"
    );
}
