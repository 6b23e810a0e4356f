//! One test per validation rule, checking the exact problem line.

mod common;
use common::*;
use llmkube_gen::{validate_sources, Source};
use serde_json::{json, Value};

/// Errors and warnings, without the lint of served model names (tests/served_model.rs checks it:
/// the fixtures' InferenceServices name none, so most routers here would carry it).
fn check(text: String) -> (Vec<String>, Vec<String>) {
    let d = validate_sources(&[Source {
        name: "test.yaml".into(),
        text,
    }]);
    (
        d.errors.iter().map(|p| p.to_string()).collect(),
        d.warnings
            .iter()
            .map(|p| p.to_string())
            .filter(|w| !w.contains("does not say which model name its engine serves"))
            .collect(),
    )
}

/// Errors of the router (with its referenced objects present).
fn errors(r: Value) -> Vec<String> {
    check(full(r)).0
}

fn warnings(r: Value) -> Vec<String> {
    let (e, w) = check(full(r));
    assert!(e.is_empty(), "unexpected errors: {e:?}");
    w
}

fn with(pointer: &str, value: Value) -> Value {
    let mut r = router();
    set(&mut r, pointer, value);
    r
}

fn one(r: Value, expected: &str) {
    assert_eq!(errors(r), vec![expected.to_string()]);
}

#[test]
fn base_router_is_valid() {
    let (e, w) = check(full(router()));
    assert!(e.is_empty() && w.is_empty(), "{e:?} {w:?}");
}

#[test]
fn example_router_is_valid() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/router.yaml"
    ))
    .unwrap();
    let (e, w) = check(text);
    assert!(e.is_empty() && w.is_empty(), "{e:?} {w:?}");
}

#[test]
fn unknown_field_is_refused_with_its_path() {
    one(with("/spec/backends/1/wieght", json!(3)), "ModelRouter/demo: spec.backends[1].wieght: unknown field, expected one of `balancing`, `capabilities`, `costPerMillionTokens`, `displayName`, `endpointPicker`, `external`, `healthCheck`, `inferenceServiceRef`, `modelInfo`, `name`, `resolution`, `tier`, `timeout`, `weight`");
    let e = errors(with("/spec/rules/0/match/modle", json!(["x"])));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("ModelRouter/demo: spec.rules[0].match.modle: unknown field"),
        "{e:?}"
    );
    one(with("/spec/proxy/affinity/nodeAfinity", json!({})), "ModelRouter/demo: spec.proxy.affinity.nodeAfinity: unknown field, expected one of `nodeAffinity`, `podAffinity`, `podAntiAffinity`");
    one(
        with("/extra", json!(1)),
        "ModelRouter/demo: extra: unknown field",
    );
}

#[test]
fn missing_required_field() {
    let mut r = router();
    r["spec"]["rules"][0]
        .as_object_mut()
        .unwrap()
        .remove("route");
    one(r, "ModelRouter/demo: spec.rules[0].route: is required");
}

#[test]
fn bad_enum_value() {
    let e = errors(with("/spec/rules/0/route/strategy", json!("random")));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with(
            "ModelRouter/demo: spec.rules[0].route.strategy: unknown variant `random`"
        ),
        "{e:?}"
    );
}

#[test]
fn exactly_one_of_ref_or_external() {
    let mut r = router();
    r["spec"]["backends"][1]["external"] = json!({"provider": "openai", "model": "x"});
    one(r, "ModelRouter/demo: spec.backends[1]: inferenceServiceRef and external are mutually exclusive; set exactly one");
    let mut r = router();
    r["spec"]["backends"][1]
        .as_object_mut()
        .unwrap()
        .remove("inferenceServiceRef");
    one(r, "ModelRouter/demo: spec.backends[1]: exactly one of inferenceServiceRef or external must be set");
}

#[test]
fn backend_name_pattern() {
    let mut r = with("/spec/backends/1/name", json!("Local_B"));
    r["spec"]["defaultRoute"] = json!("local-a");
    one(
        r,
        "ModelRouter/demo: spec.backends[1].name: \"Local_B\" must match ^[a-z0-9][a-z0-9-]{0,62}$",
    );
}

#[test]
fn rule_name_pattern() {
    one(
        with("/spec/rules/0/name", json!("-bad")),
        "ModelRouter/demo: spec.rules[0].name: \"-bad\" must match ^[a-z0-9][a-z0-9-]{0,62}$",
    );
}

#[test]
fn duplicate_backend_names() {
    let mut r = router();
    r["spec"]["backends"][1]["name"] = json!("local-a");
    one(r, "ModelRouter/demo: spec.backends[1].name: duplicate backend name \"local-a\" (also spec.backends[0])");
}

#[test]
fn duplicate_published_model_ids() {
    one(with("/spec/backends/2/displayName", json!("local-b")), "ModelRouter/demo: spec.backends[2]: model id \"local-b\" (displayName, else name) is also published by spec.backends[1]");
}

#[test]
fn duplicate_rule_names() {
    let mut r = router();
    let rule = r["spec"]["rules"][0].clone();
    r["spec"]["rules"].as_array_mut().unwrap().push(rule);
    let e = errors(r);
    assert_eq!(
        e,
        vec![
            "ModelRouter/demo: spec.rules[1].name: duplicate rule name \"r0\" (also spec.rules[0])"
        ]
    );
}

#[test]
fn default_route_must_exist() {
    one(
        with("/spec/defaultRoute", json!("nope")),
        "ModelRouter/demo: spec.defaultRoute: backend \"nope\" is not declared in spec.backends",
    );
}

#[test]
fn rule_backend_must_exist() {
    one(with("/spec/rules/0/route/backends", json!(["local-a", "gpt"])), "ModelRouter/demo: spec.rules[0].route.backends[1]: backend \"gpt\" is not declared in spec.backends");
}

#[test]
fn rule_backend_listed_twice() {
    one(
        with(
            "/spec/rules/0/route/backends",
            json!(["local-a", "local-a"]),
        ),
        "ModelRouter/demo: spec.rules[0].route.backends[1]: backend \"local-a\" is listed twice",
    );
}

#[test]
fn sensitive_rule_must_fail_closed() {
    let r = with(
        "/spec/rules/0/match",
        json!({"dataClassification": ["PII"]}),
    );
    one(r, "ModelRouter/demo: spec.rules[0].failClosed: rule matches sensitive classification \"pii\" and must set failClosed: true");
}

#[test]
fn sensitive_rule_only_local_backends() {
    let mut r = with(
        "/spec/rules/0/match",
        json!({"dataClassification": ["phi"]}),
    );
    r["spec"]["rules"][0]["failClosed"] = json!(true);
    r["spec"]["rules"][0]["route"]["backends"] = json!(["local-a", "cloud"]);
    one(r, "ModelRouter/demo: spec.rules[0].route.backends[1]: rule matches sensitive classification \"phi\" and may only route to tier: local backends; \"cloud\" is cloud");
}

#[test]
fn external_backend_defaults_to_cloud_tier() {
    let mut r = with(
        "/spec/rules/0/match",
        json!({"dataClassification": ["pii"]}),
    );
    r["spec"]["rules"][0]["failClosed"] = json!(true);
    r["spec"]["rules"][0]["route"]["backends"] = json!(["cloud"]);
    r["spec"]["backends"][2]
        .as_object_mut()
        .unwrap()
        .remove("tier");
    one(r, "ModelRouter/demo: spec.rules[0].route.backends[0]: rule matches sensitive classification \"pii\" and may only route to tier: local backends; \"cloud\" is cloud (external backends default to tier: cloud)");
}

#[test]
fn custom_sensitive_classifications() {
    let mut r = with(
        "/spec/rules/0/match",
        json!({"dataClassification": ["pii"]}),
    );
    set(
        &mut r,
        "/spec/policy/classification/sensitiveClassifications",
        json!(["Secret"]),
    );
    assert!(errors(r.clone()).is_empty());
    r["spec"]["rules"][0]["match"]["dataClassification"] = json!(["secret"]);
    one(r, "ModelRouter/demo: spec.rules[0].failClosed: rule matches sensitive classification \"secret\" and must set failClosed: true");
}

#[test]
fn fail_closed_rule_only_local_backends() {
    let mut r = with("/spec/rules/0/failClosed", json!(true));
    r["spec"]["rules"][0]["route"]["backends"] = json!(["cloud"]);
    one(r, "ModelRouter/demo: spec.rules[0].route.backends[0]: fail-closed rules can only route to tier: local backends; \"cloud\" is cloud");
}

#[test]
fn classifier_modes_not_implemented() {
    one(with("/spec/policy/classification/mode", json!("detector")), "ModelRouter/demo: spec.policy.classification.mode: ClassifierNotImplemented: mode \"detector\" is reserved for a future content classifier; only header-only is implemented");
    one(with("/spec/policy/classification/mode", json!("hybrid")), "ModelRouter/demo: spec.policy.classification.mode: ClassifierNotImplemented: mode \"hybrid\" is reserved for a future content classifier; only header-only is implemented");
}

#[test]
fn litellm_requires_url() {
    one(with("/spec/backends/2/external/provider", json!("litellm")), "ModelRouter/demo: spec.backends[2].external.url: is required for provider litellm (the LiteLLM proxy's base URL)");
}

#[test]
fn external_url_must_be_http() {
    one(with("/spec/backends/2/external/url", json!("ftp://x")), "ModelRouter/demo: spec.backends[2].external.url: \"ftp://x\" must be an http:// or https:// URL");
}

fn endpoint_backend(r: &mut Value) {
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
}

#[test]
fn session_idle_timeout_range() {
    let mut r = router();
    endpoint_backend(&mut r);
    r["spec"]["backends"][0]["balancing"] = json!({"mode": "LoadAware", "sessionAffinity": {"headers": ["x-session-id"], "idleTimeout": "30s"}});
    one(r.clone(), "ModelRouter/demo: spec.backends[0].balancing.sessionAffinity.idleTimeout: must be between 1m and 24h, got \"30s\"");
    r["spec"]["backends"][0]["balancing"]["sessionAffinity"]["idleTimeout"] = json!("25h");
    one(r.clone(), "ModelRouter/demo: spec.backends[0].balancing.sessionAffinity.idleTimeout: must be between 1m and 24h, got \"25h\"");
    r["spec"]["backends"][0]["balancing"]["sessionAffinity"]["idleTimeout"] = json!("24h");
    assert!(errors(r).is_empty());
}

#[test]
fn max_load_percent_accepted_but_ignored() {
    let mut r = router();
    endpoint_backend(&mut r);
    r["spec"]["backends"][0]["balancing"] = json!({"mode": "LoadAware", "sessionAffinity": {"headers": ["x-session-id"], "maxLoadPercent": 150}});
    assert_eq!(warnings(r.clone()), vec!["ModelRouter/demo: spec.backends[0].balancing.sessionAffinity.maxLoadPercent: is deprecated and has no effect"]);
    r["spec"]["backends"][0]["balancing"]["sessionAffinity"]["maxLoadPercent"] = json!(100);
    one(r, "ModelRouter/demo: spec.backends[0].balancing.sessionAffinity.maxLoadPercent: must be between 101 and 1000, got 100");
}

#[test]
fn affinity_without_load_aware_warns() {
    let mut r = router();
    endpoint_backend(&mut r);
    r["spec"]["backends"][0]["balancing"] =
        json!({"prefixAffinity": {}, "sessionAffinity": {"headers": ["x-session-id"]}});
    assert_eq!(
        warnings(r),
        vec![
            "ModelRouter/demo: spec.backends[0].balancing.prefixAffinity: requires mode: LoadAware; ignored with RoundRobin (PrefixAffinityIgnored)",
            "ModelRouter/demo: spec.backends[0].balancing.sessionAffinity: requires mode: LoadAware; ignored with RoundRobin (SessionAffinityIgnored)",
        ]
    );
}

#[test]
fn balancing_requires_endpoint_resolution() {
    one(
        with("/spec/backends/0/balancing", json!({"mode": "LoadAware"})),
        "ModelRouter/demo: spec.backends[0].balancing: balancing requires resolution: endpoint",
    );
}

#[test]
fn prefix_affinity_limits() {
    let mut r = router();
    endpoint_backend(&mut r);
    r["spec"]["backends"][0]["balancing"] = json!({"mode": "LoadAware", "prefixAffinity": {"blockBytes": 128, "maxBlocksPerEndpoint": 300000}});
    assert_eq!(
        errors(r),
        vec![
            "ModelRouter/demo: spec.backends[0].balancing.prefixAffinity.blockBytes: must be between 256 and 16384, got 128",
            "ModelRouter/demo: spec.backends[0].balancing.prefixAffinity.maxBlocksPerEndpoint: must be between 1024 and 262144, got 300000",
        ]
    );
}

#[test]
fn weights() {
    one(
        with("/spec/backends/0/weight", json!(-1)),
        "ModelRouter/demo: spec.backends[0].weight: must be between 0 and 2147483647, got -1",
    );
    let mut r = with(
        "/spec/rules/0/route",
        json!({"strategy": "weighted", "backends": ["local-a", "local-b"]}),
    );
    r["spec"]["backends"][0]["weight"] = json!(0);
    r["spec"]["backends"][1]["weight"] = json!(0);
    one(r.clone(), "ModelRouter/demo: spec.rules[0].route.strategy: a weighted rule needs at least one backend with a positive weight");
    r["spec"]["backends"][1]
        .as_object_mut()
        .unwrap()
        .remove("weight"); // default 1
    assert!(errors(r).is_empty());
}

#[test]
fn shadow_needs_two_backends() {
    one(with("/spec/rules/0/route/strategy", json!("shadow")), "ModelRouter/demo: spec.rules[0].route.backends: the shadow strategy needs at least two backends");
}

#[test]
fn budgets_need_a_cap() {
    one(with("/spec/policy/budgets", json!([{"name": "b", "scope": "router"}])), "ModelRouter/demo: spec.policy.budgets[0]: either maxTokens or maxUSD (or both) must be set");
}

#[test]
fn rule_budget_needs_existing_rule() {
    one(
        with(
            "/spec/policy/budgets",
            json!([{"name": "b", "scope": "rule", "maxTokens": 10}]),
        ),
        "ModelRouter/demo: spec.policy.budgets[0].ruleName: is required when scope is rule",
    );
    one(with("/spec/policy/budgets", json!([{"name": "b", "scope": "rule", "ruleName": "zz", "maxTokens": 10}])), "ModelRouter/demo: spec.policy.budgets[0].ruleName: rule \"zz\" is not declared in spec.rules");
    assert!(errors(with(
        "/spec/policy/budgets",
        json!([{"name": "b", "scope": "rule", "ruleName": "r0", "maxUSD": "10.5"}])
    ))
    .is_empty());
}

#[test]
fn budget_names_unique() {
    one(
        with("/spec/policy/budgets", json!([{"name": "b", "scope": "router", "maxTokens": 1}, {"name": "b", "scope": "team", "maxTokens": 2}])),
        "ModelRouter/demo: spec.policy.budgets[1].name: duplicate budget name \"b\" (also spec.policy.budgets[0])",
    );
}

#[test]
fn max_usd_and_cost_patterns() {
    one(
        with(
            "/spec/policy/budgets",
            json!([{"name": "b", "scope": "router", "maxUSD": "$10"}]),
        ),
        "ModelRouter/demo: spec.policy.budgets[0].maxUSD: \"$10\" must match ^[0-9]+(\\.[0-9]+)?$",
    );
    one(with("/spec/backends/2/costPerMillionTokens", json!({"promptUSD": "1.", "completionUSD": "2"})), "ModelRouter/demo: spec.backends[2].costPerMillionTokens.promptUSD: \"1.\" must match ^[0-9]+(\\.[0-9]+)?$");
}

#[test]
fn header_names_are_tokens() {
    one(with("/spec/rules/0/match/headers", json!({"x team": "a"})), "ModelRouter/demo: spec.rules[0].match.headers.x team: \"x team\" is not a valid HTTP header name (RFC 7230 token)");
    one(with("/spec/policy/classification/headerKey", json!("x:class")), "ModelRouter/demo: spec.policy.classification.headerKey: \"x:class\" is not a valid HTTP header name (RFC 7230 token)");
    one(with("/spec/policy/budgets", json!([{"name": "b", "scope": "team", "maxTokens": 1, "headerKey": "x(team)"}])), "ModelRouter/demo: spec.policy.budgets[0].headerKey: \"x(team)\" is not a valid HTTP header name (RFC 7230 token)");
    let mut r = router();
    endpoint_backend(&mut r);
    r["spec"]["backends"][0]["balancing"] =
        json!({"mode": "LoadAware", "sessionAffinity": {"headers": ["ok", ""]}});
    one(r, "ModelRouter/demo: spec.backends[0].balancing.sessionAffinity.headers[1]: \"\" is not a valid HTTP header name (RFC 7230 token)");
    one(with("/spec/policy/auditLog/callerHeader", json!("x/caller")), "ModelRouter/demo: spec.policy.auditLog.callerHeader: \"x/caller\" is not a valid HTTP header name (RFC 7230 token)");
}

/// Every header-name field uses the one token syntax of the core (RFC 7230 `tchar`, which
/// includes the backtick), and every credential header of the core's list is refused as caller.
#[test]
fn header_names_follow_the_core_token_syntax() {
    for h in ["x-`caller", "X_Caller.1"] {
        assert!(router_core::headers::is_token(h));
        assert!(
            errors(with("/spec/policy/auditLog/callerHeader", json!(h))).is_empty(),
            "{h}"
        );
        assert!(
            errors(with("/spec/policy/classification/headerKey", json!(h))).is_empty(),
            "{h}"
        );
    }
    for h in router_core::headers::CREDENTIAL_HEADERS {
        one(with("/spec/policy/auditLog/callerHeader", json!(h)), &format!("ModelRouter/demo: spec.policy.auditLog.callerHeader: {h:?} carries a credential and cannot be logged as caller"));
    }
}

#[test]
fn header_names_case_insensitive_duplicates() {
    one(with("/spec/rules/0/match/headers", json!({"X-Team": "a", "x-team": "b"})), "ModelRouter/demo: spec.rules[0].match.headers.x-team: duplicates header \"X-Team\" (names are case-insensitive)");
}

#[test]
fn caller_header_not_credential() {
    for h in [
        "Authorization",
        "proxy-authorization",
        "COOKIE",
        "X-Api-Key",
        "api-key",
        "x-goog-api-key",
    ] {
        one(with("/spec/policy/auditLog/callerHeader", json!(h)), &format!("ModelRouter/demo: spec.policy.auditLog.callerHeader: {h:?} carries a credential and cannot be logged as caller"));
    }
}

#[test]
fn trusted_proxies() {
    one(
        with(
            "/spec/policy/auditLog",
            json!({"trustedProxyCIDRs": ["10.0.0.0/8"]}),
        ),
        "ModelRouter/demo: spec.policy.auditLog.trustedProxyCIDRs: requires logClientAddress: true",
    );
    one(
        with("/spec/policy/auditLog", json!({"logClientAddress": true, "trustedProxyCIDRs": ["10.0.0.0/8", "fd00::1", "10.0.0.0/33"]})),
        "ModelRouter/demo: spec.policy.auditLog.trustedProxyCIDRs[2]: \"10.0.0.0/33\" is not a CIDR or an IP address",
    );
}

#[test]
fn timeouts_parse() {
    one(with("/spec/rules/0/timeout", json!("10")), "ModelRouter/demo: spec.rules[0].timeout: invalid duration \"10\": missing unit (Go syntax, e.g. \"15s\", \"2m\", \"1h30m\", \"500ms\")");
    one(with("/spec/proxy/streamIdleTimeout", json!("5 m")), "ModelRouter/demo: spec.proxy.streamIdleTimeout: invalid duration \"5 m\": unknown unit \" m\" (Go syntax, e.g. \"15s\", \"2m\", \"1h30m\", \"500ms\")");
    assert!(errors(with("/spec/proxy/streamIdleTimeout", json!("0s"))).is_empty());
}

#[test]
fn rule_timeout_cannot_extend_cap() {
    one(with("/spec/rules/0/timeout", json!("3m")), "ModelRouter/demo: spec.rules[0].timeout: \"3m\" exceeds spec.proxy.responseHeaderTimeout (120s); a per-rule or per-backend timeout can only tighten the cap");
    let mut r = with("/spec/rules/0/timeout", json!("3m"));
    set(&mut r, "/spec/proxy/responseHeaderTimeout", json!("5m"));
    assert!(errors(r).is_empty());
    one(with("/spec/backends/0/timeout", json!("121s")), "ModelRouter/demo: spec.backends[0].timeout: \"121s\" exceeds spec.proxy.responseHeaderTimeout (120s); a per-rule or per-backend timeout can only tighten the cap");
}

#[test]
fn required_capabilities_must_be_satisfiable() {
    one(
        with("/spec/rules/0/match/requiredCapabilities", json!(["tools", "vision"])),
        "ModelRouter/demo: spec.rules[0].match.requiredCapabilities: no backend of the route advertises all of [\"tools\", \"vision\"]; the rule could never match",
    );
    assert!(errors(with(
        "/spec/rules/0/match/requiredCapabilities",
        json!(["tools"])
    ))
    .is_empty());
}

#[test]
fn missing_references_warn_in_validate() {
    let (e, w) = check(serde_json::to_string(&router()).unwrap());
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(
        w,
        vec![
            "ModelRouter/demo: spec.backends[0].inferenceServiceRef.name: InferenceService llm/isvc-a is not in the input (add it, or give its address with --resolve/--endpoints)",
            "ModelRouter/demo: spec.backends[1].inferenceServiceRef.name: InferenceService llm/isvc-b is not in the input (add it, or give its address with --resolve/--endpoints)",
            "ModelRouter/demo: spec.backends[2].external.credentialsSecretRef.name: Secret llm/openai is not in the input",
        ]
    );
}

#[test]
fn proxy_limits() {
    one(
        with("/spec/proxy/replicas", json!(11)),
        "ModelRouter/demo: spec.proxy.replicas: must be between 1 and 10, got 11",
    );
    one(
        with("/spec/proxy/drainTimeout", json!("2h")),
        "ModelRouter/demo: spec.proxy.drainTimeout: must be between 1s and 1h, got \"2h\"",
    );
    one(with("/spec/proxy/serviceName", json!("1abc")), "ModelRouter/demo: spec.proxy.serviceName: \"1abc\" must match ^[a-z]([-a-z0-9]*[a-z0-9])?$ and be at most 63 characters");
}

#[test]
fn unreachable_rule_after_catch_all_warns() {
    let mut r = router();
    r["spec"]["rules"] = json!([{"name": "all", "route": {"backends": ["local-a"]}}, {"name": "later", "match": {"models": ["x"]}, "route": {"backends": ["local-b"]}}]);
    assert_eq!(warnings(r), vec!["ModelRouter/demo: spec.rules[1]: unreachable: spec.rules[0] has no match conditions and matches every request first"]);
}

#[test]
fn yaml_syntax_error_is_reported() {
    let (e, _) = check("apiVersion: [".into());
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("test.yaml: documents[0]: invalid YAML:"),
        "{e:?}"
    );
}

#[test]
fn auth_allowlists_need_jwt() {
    one(with("/spec/policy/auth", json!({"allowlists": [{"team": "a"}]})), "ModelRouter/demo: spec.policy.auth.allowlists: authorization requires authentication: set spec.policy.auth.jwt");
}

#[test]
fn wrong_api_version_and_ignored_kinds() {
    let mut r = router();
    r["apiVersion"] = json!("inference.llmkube.dev/v1beta1");
    let (e, _) = check(full(r));
    assert_eq!(e, vec!["ModelRouter/demo: apiVersion: unsupported version \"inference.llmkube.dev/v1beta1\" (expected \"inference.llmkube.dev/v1alpha1\")"]);
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "llm"}});
    let (e, w) = check(docs(&[
        router(),
        isvc("isvc-a", None),
        isvc("isvc-b", None),
        secret(),
        ns,
    ]));
    assert!(e.is_empty());
    assert_eq!(
        w,
        vec!["Namespace/llm: v1 Namespace is not used by the generator; ignored"]
    );
}

#[test]
fn no_router_in_input() {
    let (e, _) = check(docs(&[isvc("isvc-a", None)]));
    assert_eq!(
        e,
        vec!["input: no ModelRouter (inference.llmkube.dev/v1alpha1) found"]
    );
}

#[test]
fn duplicate_router_in_input() {
    let (e, _) = check(docs(&[
        router(),
        router(),
        isvc("isvc-a", None),
        isvc("isvc-b", None),
        secret(),
    ]));
    assert_eq!(
        e,
        vec!["ModelRouter/demo: metadata.name: llm/demo is defined twice in the input"]
    );
}

#[test]
fn data_plane_references() {
    one(
        with("/spec/dataPlane", json!("Gateway")),
        "ModelRouter/demo: spec.gatewayRef: is required when dataPlane is Gateway",
    );
    one(
        with("/spec/dataPlane", json!("AgentGateway")),
        "ModelRouter/demo: spec.agentGatewayRef: is required when dataPlane is AgentGateway",
    );
    one(
        with("/spec/agentGatewayRef", json!({"name": "gw", "endpointPicker": "epp"})),
        "ModelRouter/demo: spec.agentGatewayRef.endpointPickerPort: endpointPicker and endpointPickerPort must be set together",
    );
}

#[test]
fn endpoint_section() {
    one(
        with("/spec/endpoint", json!({"port": 80, "nodePort": 30080})),
        "ModelRouter/demo: spec.endpoint.nodePort: requires endpoint.type NodePort",
    );
    one(
        with(
            "/spec/endpoint/apiKeySecretRef",
            json!({"name": "s", "key": "k"}),
        ),
        "ModelRouter/demo: spec.endpoint.apiKeySecretRef: is not supported on ModelRouter",
    );
}

#[test]
fn model_info_limits() {
    one(with("/spec/backends/0/modelInfo", json!({"contextLength": 0})), "ModelRouter/demo: spec.backends[0].modelInfo.contextLength: must be between 1 and 9223372036854775807, got 0");
    one(
        with(
            "/spec/backends/0/modelInfo",
            json!({"inputModalities": ["text", "image", "audio", "video", "file", "x"]}),
        ),
        "ModelRouter/demo: spec.backends[0].modelInfo.inputModalities: at most 5 items, got 6",
    );
}

#[test]
fn glob_syntax() {
    one(
        with("/spec/rules/0/match/models", json!(["qwen3-[ab"])),
        "ModelRouter/demo: spec.rules[0].match.models[0]: pattern \"qwen3-[ab\" has an unclosed '['",
    );
}

/// `validate` parses model globs with the filter's own compiler: a pattern the filter would
/// refuse at config load (an inverted range) fails validation, not only compile.
#[test]
fn glob_refused_by_the_filter_is_refused_by_validate() {
    let r = with("/spec/rules/0/match/models", json!(["qwen3-[z-a]"]));
    let errs = errors(r.clone());
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("ModelRouter/demo: spec.rules[0].match.models[0]: ")
            && errs[0].contains("[z-a]"),
        "{errs:?}"
    );
    let core = router_core::glob::Glob::new("qwen3-[z-a]").unwrap_err();
    assert!(errs[0].ends_with(&core.to_string()), "{errs:?} vs {core}");
    // A well-formed class still passes.
    assert!(errors(with("/spec/rules/0/match/models", json!(["qwen3-[a-z]*"]))).is_empty());
}

#[test]
fn passthrough_blobs_are_checked_lightly() {
    one(
        with("/spec/proxy/tolerations", json!({"key": "x"})),
        "ModelRouter/demo: spec.proxy.tolerations: must be a list (core/v1 Toleration)",
    );
    one(with("/spec/proxy/nodeSelector", json!({"disk": 1})), "ModelRouter/demo: spec.proxy.nodeSelector.disk: invalid type: integer `1`, expected a string");
    assert!(errors(with(
        "/spec/proxy/resources",
        json!({"limits": {"cpu": "500m", "memory": "256Mi"}})
    ))
    .is_empty());
}

#[test]
fn auth_team_header_and_jwks_uri() {
    let jwt = |header: &str, jwks: &str| {
        with(
            "/spec/policy/auth/jwt",
            json!({"issuer": "https://idp/", "jwksURI": jwks, "provider": "kc", "teamClaim": "team", "headerKey": header}),
        )
    };
    assert!(errors(jwt("X-Team", "https://idp/certs")).is_empty());
    for h in ["Authorization", "x-llmkube-backend", "x-ai-eg-model"] {
        one(
            jwt(h, "https://idp/certs"),
            &format!("ModelRouter/demo: spec.policy.auth.jwt.headerKey: {h:?} is a credential or decision header; the verified team needs a header of its own"),
        );
    }
    one(jwt("x-team", "ftp://idp/certs"), "ModelRouter/demo: spec.policy.auth.jwt.jwksURI: \"ftp://idp/certs\" must be an http:// or https:// URL");
}
