//! Library-level tests of the envoy target: plugin config mapping and bootstrap structure.

mod common;
use common::envoy::*;
use common::*;
use llmkube_gen::{compile_envoy, EnvoyOptions, Format};
use llmkube_gen::{load, plugin_config, Diagnostics, PluginContext, Source};
use router_core::config::PluginConfig;
use serde_json::{json, Value};

fn src(text: String) -> Vec<Source> {
    vec![Source {
        name: "test.yaml".into(),
        text,
    }]
}

fn compile(text: String, o: &EnvoyOptions) -> Value {
    let out = compile_envoy(&src(text), o)
        .unwrap_or_else(|e| panic!("{:#?}", e.iter().map(|p| p.to_string()).collect::<Vec<_>>()));
    serde_json::from_str(&out).unwrap()
}

fn compile_err(text: String, o: &EnvoyOptions) -> Vec<String> {
    compile_envoy(&src(text), o)
        .expect_err("should fail")
        .iter()
        .map(|p| p.to_string())
        .collect()
}

#[test]
fn plugin_config_mapping() {
    let mut r = router();
    r["spec"]["rules"] = json!([
        {"name": "pii", "failClosed": true, "timeout": "10s", "match": {"dataClassification": ["PII"], "headers": {"X-Team": "research"}}, "route": {"backends": ["local-a", "local-b"]}},
        {"name": "w", "match": {"taskComplexity": "complex"}, "route": {"strategy": "weighted", "backends": ["local-b", "cloud"]}},
    ]);
    r["spec"]["backends"][0]["modelInfo"] = json!({});
    r["spec"]["backends"][1]["timeout"] = json!("30s");
    r["spec"]["backends"][2]["weight"] = json!(3);
    set(&mut r, "/spec/proxy/responseHeaderTimeout", json!("90s"));
    set(
        &mut r,
        "/spec/policy/classification/headerKey",
        json!("X-Data-Class"),
    );
    let mut d = Diagnostics::default();
    let inputs = load(&src(full(r)), &mut d);
    assert!(d.errors.is_empty());
    let pc = plugin_config(
        &inputs.routers[0],
        &PluginContext {
            inputs: &inputs,
            model_header: None,
            max_body_bytes: None,
        },
    );
    assert_eq!(pc.router, "llm/demo");
    assert_eq!(pc.classification_header, "x-data-class");
    assert_eq!(pc.default_route.as_deref(), Some("local-a"));
    let names: Vec<&str> = pc.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["pii", "w"]);
    assert_eq!(pc.rules[0].headers[0].name, "x-team");
    assert_eq!(pc.rules[0].data_classification, ["pii"]);
    assert!(pc.rules[0].fail_closed);
    assert_eq!(pc.rules[0].timeout_ms, Some(10_000));
    assert_eq!(pc.rules[1].timeout_ms, None);
    assert_eq!(
        pc.rules[1].strategy,
        router_core::config::Strategy::Weighted
    );
    // Backend timeouts: own, else the cap.
    assert_eq!(pc.backends[0].timeout_ms, Some(90_000));
    assert_eq!(pc.backends[1].timeout_ms, Some(30_000));
    assert_eq!(pc.backends[0].weight, 1);
    assert_eq!(pc.backends[2].weight, 3);
    assert_eq!(
        pc.backends[0].model_info.as_ref().unwrap().context_length,
        Some(8192)
    );
    assert_eq!(
        pc.backends[1].model_info, None,
        "modelInfo unset publishes only the id"
    );
    assert_eq!(pc.backends[2].external_model.as_deref(), Some("gpt-5"));
    assert_eq!(pc.backends[2].tier, router_core::config::Tier::Cloud);
    // The filter's own parser accepts it (round trip through JSON).
    let back: PluginConfig = serde_json::from_str(&serde_json::to_string(&pc).unwrap()).unwrap();
    assert_eq!(back, pc);
}

#[test]
fn bootstrap_layout() {
    let b = compile(
        full(router()),
        &EnvoyOptions {
            max_body_bytes: Some(1000),
            ..opts()
        },
    );
    let l = &b["static_resources"]["listeners"][0];
    assert_eq!(l["address"]["socket_address"]["address"], "127.0.0.1");
    assert_eq!(l["address"]["socket_address"]["port_value"], 10000);
    assert_eq!(b["admin"]["address"]["socket_address"]["port_value"], 9901);
    assert_eq!(l["per_connection_buffer_limit_bytes"], 1000 + 1024 * 1024);
    let h = hcm(&b);
    assert_eq!(h["stream_idle_timeout"], "300s");
    let filters: Vec<&str> = h["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        filters,
        ["envoy.filters.http.wasm", "envoy.filters.http.router"]
    );
    let cfg = &h["http_filters"][0]["typed_config"]["config"];
    assert_eq!(cfg["root_id"], "model-router");
    assert_eq!(cfg["vm_config"]["vm_id"], "llmkube");
    assert_eq!(cfg["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
    assert_eq!(cfg["allow_on_headers_stop_iteration"], true);
    assert_eq!(cfg["fail_open"], false);
    assert_eq!(
        cfg["vm_config"]["code"]["local"]["filename"],
        "/opt/wasm/llmkube_model_router.wasm"
    );
    assert_eq!(
        cfg["configuration"]["@type"],
        "type.googleapis.com/google.protobuf.StringValue"
    );
    assert_eq!(plugin_of(&b).max_body_bytes, 1000);

    let routes = h["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap();
    // r0 → local-a, the default route → local-a, the catch-all.
    assert_eq!(routes.len(), 3);
    assert_eq!(
        h["route_config"]["virtual_hosts"][0]["include_attempt_count_in_response"],
        true
    );
    let r = route(&b, "r0/local-a");
    assert_eq!(
        r["match"]["headers"][0],
        json!({"name": "x-llmkube-route", "string_match": {"exact": "r0/local-a"}})
    );
    assert_eq!(r["route"]["cluster"], "backend-local-a");
    assert_eq!(r["route"]["timeout"], "0s");
    assert_eq!(r["request_headers_to_remove"], json!(["authorization"]));
    let r = route(&b, "~/local-a");
    assert_eq!(r["route"]["cluster"], "backend-local-a");
    assert_eq!(r["route"]["retry_policy"]["num_retries"], 0);
    let last = routes.last().unwrap();
    assert_eq!(last["match"], json!({"prefix": "/"}));
    assert_eq!(last["direct_response"]["status"], 404);
    let body: Value = serde_json::from_str(
        last["direct_response"]["body"]["inline_string"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["param"], Value::Null);
    assert_eq!(
        last["response_headers_to_add"][0]["header"],
        json!({"key": "content-type", "value": "application/json"})
    );

    // Local backends: cluster DNS of the InferenceService, port from spec.endpoint.port (default 8080).
    let a = cluster(&b, "backend-local-a");
    assert_eq!(a["type"], "STRICT_DNS");
    assert_eq!(a["per_connection_buffer_limit_bytes"], 1000 + 1024 * 1024);
    assert_eq!(
        a["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"],
        json!({"address": "isvc-a.llm.svc.cluster.local", "port_value": 8000})
    );
    let bb = cluster(&b, "backend-local-b");
    assert_eq!(
        bb["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"]["port_value"],
        8080
    );
}

#[test]
fn openai_default_url_tls_and_credentials() {
    let b = compile(full(router()), &opts());
    let c = cluster(&b, "backend-cloud");
    assert_eq!(c["type"], "STRICT_DNS");
    assert_eq!(
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"],
        json!({"address": "api.openai.com", "port_value": 443})
    );
    let tls = &c["transport_socket"]["typed_config"];
    assert_eq!(tls["sni"], "api.openai.com");
    assert_eq!(
        tls["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"][0]
            ["matcher"]["exact"],
        "api.openai.com"
    );
    // Unreachable here (no route names it), but it has its cluster, chain and secret anyway.
    assert_eq!(
        b["static_resources"]["secrets"],
        json!([{"name": "cred-cloud", "generic_secret": {"secret": {"inline_string": "Bearer sk-test"}}}])
    );
    let mut r = router();
    r["spec"]["rules"] =
        json!([{"name": "c", "match": {"models": ["gpt-*"]}, "route": {"backends": ["cloud"]}}]);
    let b = compile(full(r), &opts());
    let r = route(&b, "c/cloud");
    assert_eq!(r["route"]["cluster"], "backend-cloud");
    assert_eq!(r["route"]["host_rewrite_literal"], "api.openai.com");
    assert!(r.get("request_headers_to_add").is_none());
    assert_eq!(r["request_headers_to_remove"], json!(["authorization"]));
}

#[test]
fn external_url_forms() {
    let mut r = router();
    r["spec"]["rules"] =
        json!([{"name": "c", "match": {"models": ["gpt-*"]}, "route": {"backends": ["cloud"]}}]);
    r["spec"]["backends"][2]["external"] =
        json!({"provider": "litellm", "url": "http://10.1.2.3:4000/llm/v1", "model": "m"});
    let b = compile(full(r.clone()), &opts());
    let c = cluster(&b, "backend-cloud");
    assert_eq!(c["type"], "STATIC");
    assert!(c.get("transport_socket").is_none());
    let rt = route(&b, "c/cloud");
    assert_eq!(
        rt["route"]["regex_rewrite"],
        json!({"pattern": {"regex": "^/v1/"}, "substitution": "/llm/v1/"})
    );
    assert_eq!(rt["route"]["host_rewrite_literal"], "10.1.2.3:4000");

    r["spec"]["backends"][2]["external"] = json!({"provider": "anthropic", "url": "https://gw.example.com/anthropic", "model": "claude", "credentialsSecretRef": {"name": "anth"}});
    let sec = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "anth", "namespace": "llm"}, "data": {"ANTHROPIC_API_KEY": "c2stYW50"}});
    let b = compile(
        docs(&[
            r.clone(),
            isvc("isvc-a", None),
            isvc("isvc-b", None),
            sec.clone(),
        ]),
        &opts(),
    );
    let rt = route(&b, "c/cloud");
    assert_eq!(
        rt["route"]["regex_rewrite"],
        json!({"pattern": {"regex": "^/"}, "substitution": "/anthropic/"})
    );
    assert!(rt.get("request_headers_to_add").is_none());
    // anthropic: the raw key, injected as x-api-key (anthropic-version is the upstream filter's).
    assert_eq!(
        b["static_resources"]["secrets"][0]["generic_secret"]["secret"]["inline_string"],
        "sk-ant"
    );

    // A path prefix cannot be applied per attempt: refused when the backend shares an order.
    r["spec"]["rules"] = json!([{"name": "c", "route": {"backends": ["local-a", "cloud"]}}]);
    assert_eq!(
        compile_err(
            docs(&[r, isvc("isvc-a", None), isvc("isvc-b", None), sec]),
            &opts()
        ),
        ["ModelRouter/demo: spec.backends[2].external.url: the path \"/anthropic\" can only be applied on a route to cloud alone, but route \"c/local-a,cloud\" fails over across it and other backends (Envoy rewrites paths per route, not per attempt); use a URL without a path, or one ending in /v1"]
    );
}

#[test]
fn resolve_overrides_cluster_dns() {
    let o = EnvoyOptions {
        resolve: [
            ("isvc-a".to_string(), ("127.0.0.1".to_string(), 9001)),
            ("isvc-b".to_string(), ("localhost".to_string(), 9002)),
        ]
        .into(),
        ..opts()
    };
    // The InferenceServices are not needed when --resolve gives their address.
    let b = compile(docs(&[router(), secret()]), &o);
    let a = cluster(&b, "backend-local-a");
    assert_eq!(a["type"], "STATIC");
    assert_eq!(
        a["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"],
        json!({"address": "127.0.0.1", "port_value": 9001})
    );
    assert_eq!(cluster(&b, "backend-local-b")["type"], "STRICT_DNS");
}

#[test]
fn endpoint_resolution_from_endpoint_slices() {
    let mut r = router();
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "isvc-a-abc", "namespace": "llm", "labels": {"kubernetes.io/service-name": "isvc-a"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
            {"addresses": ["10.0.0.3"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.1"]}
        ]
    });
    let other = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "other", "namespace": "llm", "labels": {"kubernetes.io/service-name": "isvc-b"}},
        "addressType": "IPv4", "ports": [{"port": 1}], "endpoints": [{"addresses": ["10.9.9.9"]}]
    });
    let b = compile(
        docs(&[
            r.clone(),
            isvc("isvc-a", None),
            isvc("isvc-b", None),
            secret(),
            slice,
            other,
        ]),
        &opts(),
    );
    let c = cluster(&b, "backend-local-a");
    assert_eq!(c["type"], "STATIC");
    let addrs: Vec<String> = c["load_assignment"]["endpoints"][0]["lb_endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["endpoint"]["address"]["socket_address"]["address"]
                    .as_str()
                    .unwrap(),
                e["endpoint"]["address"]["socket_address"]["port_value"]
            )
        })
        .collect();
    assert_eq!(addrs, ["10.0.0.1:8000", "10.0.0.2:8000"]);

    // --endpoints wins; without either it is an error.
    let o = EnvoyOptions {
        endpoints: [("isvc-a".to_string(), vec![("10.5.5.5".to_string(), 7000)])].into(),
        ..opts()
    };
    let b = compile(full(r.clone()), &o);
    assert_eq!(
        cluster(&b, "backend-local-a")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
            ["endpoint"]["address"]["socket_address"]["address"],
        "10.5.5.5"
    );
    assert_eq!(
        compile_err(full(r), &opts()),
        ["ModelRouter/demo: spec.backends[0].resolution: resolution: endpoint needs EndpointSlices labelled kubernetes.io/service-name: isvc-a in namespace llm, or --endpoints isvc-a=IP:PORT,..."]
    );
}

#[test]
fn stream_idle_timeout_zero_disables() {
    let mut r = router();
    set(&mut r, "/spec/proxy/streamIdleTimeout", json!("0s"));
    assert_eq!(
        hcm(&compile(full(r.clone()), &opts()))["stream_idle_timeout"],
        "0s"
    );
    set(&mut r, "/spec/proxy/streamIdleTimeout", json!("90s"));
    assert_eq!(
        hcm(&compile(full(r), &opts()))["stream_idle_timeout"],
        "90s"
    );
}

#[test]
fn missing_references_are_errors_in_compile() {
    assert_eq!(
        compile_err(docs(&[router(), isvc("isvc-a", None), isvc("isvc-b", None)]), &opts()),
        ["ModelRouter/demo: spec.backends[2].external.credentialsSecretRef.name: Secret llm/openai is not in the input"]
    );
    assert_eq!(
        compile_err(docs(&[router(), isvc("isvc-a", None), secret()]), &opts()),
        ["ModelRouter/demo: spec.backends[1].inferenceServiceRef.name: InferenceService llm/isvc-b is not in the input (add it, or give its address with --resolve/--endpoints)"]
    );
    // An InferenceService in another namespace does not count.
    let mut other_ns = isvc("isvc-b", None);
    other_ns["metadata"]["namespace"] = json!("default");
    assert_eq!(
        compile_err(
            docs(&[router(), isvc("isvc-a", None), other_ns, secret()]),
            &opts()
        )
        .len(),
        1
    );
}

#[test]
fn secret_without_provider_key() {
    let sec = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "openai", "namespace": "llm"}, "stringData": {"OTHER": "x"}});
    assert_eq!(
        compile_err(docs(&[router(), isvc("isvc-a", None), isvc("isvc-b", None), sec]), &opts()),
        ["ModelRouter/demo: spec.backends[2].external.credentialsSecretRef.name: Secret llm/openai has no key OPENAI_API_KEY (the openai credential)"]
    );
}

#[test]
fn unsupported_providers_and_auth_are_refused() {
    let mut r = router();
    r["spec"]["backends"][2]["external"]["provider"] = json!("bedrock");
    assert_eq!(
        compile_err(full(r), &opts()),
        ["ModelRouter/demo: spec.backends[2].external.provider: provider bedrock is not supported by the envoy target yet (it needs request signing); use litellm in front of it"]
    );
    let mut r = router();
    set(
        &mut r,
        "/spec/policy/auth/jwt",
        json!({"issuer": "i", "jwksURI": "https://x/jwks", "provider": "p", "teamClaim": "team"}),
    );
    assert_eq!(compile_err(full(r), &opts()), ["ModelRouter/demo: spec.policy.auth: is not enforced by the envoy target yet; refusing rather than serving unauthenticated"]);
}

#[test]
fn one_router_per_compile() {
    let text = two_routers();
    assert_eq!(
        compile_err(text.clone(), &opts()),
        ["input: the envoy target compiles exactly one ModelRouter; found 2 (llm/demo, llm/second): pick one with --router NAME"]
    );
    let b = compile(
        text.clone(),
        &EnvoyOptions {
            router: Some("second".into()),
            ..opts()
        },
    );
    assert_eq!(plugin_of(&b).router, "llm/second");
    assert_eq!(
        compile_err(
            text,
            &EnvoyOptions {
                router: Some("nope".into()),
                ..opts()
            }
        ),
        ["ModelRouter/nope: --router names a ModelRouter that is not in the input"]
    );
}

#[test]
fn invalid_router_fails_compile() {
    let mut r = router();
    r["spec"]["defaultRoute"] = json!("gpt");
    assert_eq!(
        compile_err(full(r), &opts()),
        ["ModelRouter/demo: spec.defaultRoute: backend \"gpt\" is not declared in spec.backends"]
    );
}

#[test]
fn deterministic_output() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/router.yaml"
    ))
    .unwrap();
    for format in [Format::Yaml, Format::Json] {
        let o = EnvoyOptions { format, ..opts() };
        let a = compile_envoy(&src(text.clone()), &o).unwrap();
        let b = compile_envoy(&src(text.clone()), &o).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn yaml_and_json_outputs_agree() {
    let text = full(router());
    let y = compile_envoy(
        &src(text.clone()),
        &EnvoyOptions {
            format: Format::Yaml,
            ..opts()
        },
    )
    .unwrap();
    let j = compile_envoy(&src(text), &opts()).unwrap();
    let yv: Value = serde_norway::from_str(&y).unwrap();
    let jv: Value = serde_json::from_str(&j).unwrap();
    assert_eq!(yv, jv);
}

#[test]
fn endpoints_flag_does_not_resolve_a_service_backend() {
    let o = EnvoyOptions {
        endpoints: [("isvc-b".to_string(), vec![("10.0.0.1".to_string(), 80)])].into(),
        ..opts()
    };
    assert_eq!(
        compile_err(docs(&[router(), isvc("isvc-a", None), secret()]), &o),
        ["ModelRouter/demo: spec.backends[1].inferenceServiceRef.name: InferenceService llm/isvc-b is not in the input (add it, or give its address with --resolve/--endpoints)"]
    );
}

#[test]
fn custom_resource_identity() {
    use kube::core::Resource;
    assert_eq!(
        llmkube_gen::ModelRouter::api_version(&()),
        "inference.llmkube.dev/v1alpha1"
    );
    assert_eq!(llmkube_gen::ModelRouter::kind(&()), "ModelRouter");
}

#[test]
fn budgets_compile_into_the_plugin_config() {
    let mut r = router();
    r["spec"]["backends"][2]["costPerMillionTokens"] =
        json!({"promptUSD": "1.25", "completionUSD": "10"});
    r["spec"]["policy"] = json!({"budgets": [
        {"name": "all", "scope": "router", "maxTokens": 1000},
        {"name": "r0-usd", "scope": "rule", "ruleName": "r0", "maxUSD": "2.5", "windowSeconds": 60},
        {"name": "orgs", "scope": "team", "headerKey": "X-Org", "maxTokens": 10, "windowSeconds": 1}
    ]});
    let pc = plugin_of(&compile(full(r.clone()), &opts()));
    let b = pc.budgets.expect("budgets in the plugin config");
    assert!(!b.unsafe_charge_after);
    let compiled = b.compile().unwrap();
    assert_eq!(compiled.budgets.len(), 3);
    assert_eq!(
        b.budgets[0].window_s, 3600,
        "windowSeconds absent: one hour"
    );
    assert_eq!(b.budgets[1].rule.as_deref(), Some("r0"));
    assert_eq!(b.budgets[1].max_usd.as_deref(), Some("2.5"));
    assert_eq!(b.budgets[2].header.as_deref(), Some("x-org"));
    // Only the backend with prices is listed; the others are free.
    assert_eq!(b.prices.len(), 1);
    assert_eq!(compiled.price("cloud").prompt, 1_250_000);
    assert_eq!(compiled.price("local-a").completion, 0);

    // The test-only switch appears only through the library option.
    let o = EnvoyOptions {
        unsafe_budgets_charge_after: true,
        ..opts()
    };
    assert!(
        plugin_of(&compile(full(r.clone()), &o))
            .budgets
            .unwrap()
            .unsafe_charge_after
    );

    // What the filter would refuse is refused here, naming the manifest field.
    r["spec"]["backends"][2]["costPerMillionTokens"]["promptUSD"] = json!("0.1234567");
    let errs = compile_err(full(r.clone()), &opts());
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("ModelRouter/demo: spec.backends[2].costPerMillionTokens: "),
        "{errs:?}"
    );
    r["spec"]["backends"][2]["costPerMillionTokens"]["promptUSD"] = json!("1");
    r["spec"]["policy"]["budgets"][1]["maxUSD"] = json!("2000000");
    let errs = compile_err(full(r), &opts());
    assert!(
        errs[0].starts_with("ModelRouter/demo: spec.policy.budgets[1].maxUSD: "),
        "{errs:?}"
    );
}
