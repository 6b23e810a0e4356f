//! The envoy target's timeouts: retries with per-try timeouts and stream idle timeouts, and
//! routes whose attempts need different response-header timeouts, which send each attempt
//! through the internal listener `attempt-<b>` (via cluster `via-<b>`).

mod common;
use common::envoy::*;
use common::*;
use llmkube_gen::{compile_envoy, Source};
use router_core::router::Router;
use serde_json::{json, Value};
use std::collections::BTreeSet;

#[test]
fn retry_timeouts_and_idle() {
    let b = compile(dataplane_router());
    for r in backend_routes(&b) {
        let key = r["name"].as_str().unwrap();
        let n = key.split(',').count();
        let a = &r["route"];
        assert_eq!(a["timeout"], "0s", "{key}");
        assert_eq!(a["idle_timeout"], "45s", "{key}");
        assert_eq!(r["request_headers_to_remove"], json!(["authorization"]));
        assert!(r.get("request_headers_to_add").is_none());
        let p = &a["retry_policy"];
        assert_eq!(p["num_retries"], n - 1, "{key}");
        if n == 1 {
            // Nothing to fail over to: no retry condition, so Envoy's router keeps no copy of
            // the body for a retry (the per-try timeout below still applies).
            let keys: Vec<&String> = p.as_object().unwrap().keys().collect();
            assert!(
                keys.iter()
                    .all(|k| *k == "num_retries" || *k == "per_try_timeout"),
                "{key}: {p}"
            );
            continue;
        }
        assert_eq!(p["retry_on"], "5xx,reset,connect-failure,refused-stream");
        assert_eq!(
            p["retry_priority"],
            json!({"name": "envoy.retry_priorities.previous_priorities", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
                "update_frequency": 1}})
        );
        assert_eq!(
            p["retry_host_predicate"][0]["name"],
            "envoy.retry_host_predicates.previous_hosts"
        );
        assert!(p["host_selection_retry_max_attempts"].as_u64().unwrap() >= n as u64);
    }
    // Rule timeout wins; else the attempt's backend's own (local-b: 3s); else the cap (120s).
    // One value for every attempt: the route's per_try_timeout; different ones: none on the
    // route, each attempt's in its `attempt-<b>` listener (see per_backend_timeouts_* below).
    let per_try = |k: &str| route(&b, k)["route"]["retry_policy"]["per_try_timeout"].clone();
    assert_eq!(per_try("mixed/cloud,local-a"), "7s");
    assert_eq!(per_try("mixed/local-a"), "7s");
    assert_eq!(per_try("ext/cloud,claude"), "120s");
    assert_eq!(per_try("w3/local-b,local-a,local-c"), Value::Null);
    assert_eq!(per_try("w3/local-a,local-b,local-c"), Value::Null);
    assert_eq!(per_try("~/local-a"), "120s");
    let pc = plugin_of(&b);
    for r in backend_routes(&b) {
        let key = r["name"].as_str().unwrap();
        let t = expected_timeouts(&pc, key);
        let want = if hop(&pc, key) {
            Value::Null
        } else {
            json!(format!("{}s", t[0] / 1000))
        };
        assert_eq!(r["route"]["retry_policy"]["per_try_timeout"], want, "{key}");
    }
    assert_eq!(
        hcm(&b)["route_config"]["virtual_hosts"][0]["include_attempt_count_in_response"],
        true
    );

    let mut r = dataplane_router();
    r["spec"]["proxy"] = json!({"streamIdleTimeout": "0s", "responseHeaderTimeout": "30s"});
    let b = compile(r);
    assert_eq!(
        route(&b, "w3/local-a,local-b,local-c")["route"]["idle_timeout"],
        "0s"
    );
    assert_eq!(hcm(&b)["stream_idle_timeout"], "0s");
    assert_eq!(
        route(&b, "~/local-a")["route"]["retry_policy"]["per_try_timeout"],
        "30s"
    );
    // Defaults: 300s idle.
    let mut r = dataplane_router();
    r["spec"]["proxy"] = json!({});
    let b = compile(r);
    assert_eq!(route(&b, "~/local-a")["route"]["idle_timeout"], "300s");
}

#[test]
fn per_backend_timeouts_reference_example_goes_through_attempt_listeners() {
    let b = compile(reference_example(None));
    let r = route(&b, "pf/local,anthropic");
    let a = &r["route"];
    assert_eq!(a["cluster"], "attempts.local.anthropic");
    assert_eq!(a["timeout"], "0s");
    assert_eq!(a["idle_timeout"], "45s");
    // Host (and the rest of the external handling) per attempt behind the listener.
    assert!(a.get("auto_host_rewrite").is_none());
    assert_eq!(r["request_headers_to_remove"], json!(["authorization"]));
    let p = &a["retry_policy"];
    assert!(
        p.get("per_try_timeout").is_none(),
        "one route-level timeout would apply to every attempt: {p}"
    );
    assert_eq!(p["retry_on"], "5xx,reset,connect-failure,refused-stream");
    assert_eq!(p["num_retries"], 1);
    assert_eq!(
        p["retry_priority"]["name"],
        "envoy.retry_priorities.previous_priorities"
    );

    // The aggregate: over via- clusters, without an upstream chain: each attempt is a request of
    // its own to attempt-<b>, where backend-<b>'s chain runs (so no header edit of one attempt
    // reaches the next).
    let agg = cluster(&b, "attempts.local.anthropic");
    assert_eq!(agg["alt_stat_name"], "attempts_local_anthropic");
    assert_eq!(agg["lb_policy"], "CLUSTER_PROVIDED");
    assert_eq!(
        agg["cluster_type"]["typed_config"]["clusters"],
        json!(["via-local", "via-anthropic"])
    );
    assert!(chain(&agg).is_empty());
    assert_eq!(
        chain(&cluster(&b, "backend-anthropic")),
        [
            "envoy.filters.http.wasm",
            "cred-anthropic",
            "envoy.filters.http.header_mutation",
            "envoy.filters.http.upstream_codec"
        ]
    );

    // via-<b>: one internal endpoint, the backend's endpoint metadata, no quarantine of its own.
    for name in ["local", "anthropic"] {
        let via = cluster(&b, &format!("via-{name}"));
        let real = cluster(&b, &format!("backend-{name}"));
        assert_eq!(via["type"], "STATIC");
        let ep = endpoint0(&via);
        assert_eq!(
            ep["endpoint"]["address"],
            json!({"envoy_internal_address": {"server_listener_name": format!("attempt-{name}")}})
        );
        assert_eq!(ep["metadata"], endpoint0(&real)["metadata"]);
        assert_eq!(
            ep["metadata"]["filter_metadata"]["llmkube"]["backend"],
            name
        );
        assert!(ep["endpoint"].get("hostname").is_none());
        assert_eq!(
            via["transport_socket"]["name"],
            "envoy.transport_sockets.internal_upstream"
        );
        assert_eq!(
            via["transport_socket"]["typed_config"]["transport_socket"]["name"],
            "envoy.transport_sockets.raw_buffer"
        );
        for absent in [
            "outlier_detection",
            "health_checks",
            "typed_extension_protocol_options",
        ] {
            assert!(via.get(absent).is_none(), "via-{name} has {absent}");
        }
        assert!(
            via["circuit_breakers"]["thresholds"][0]["max_requests"]
                .as_u64()
                .unwrap()
                >= 100_000
        );
        assert_eq!(
            via["per_connection_buffer_limit_bytes"],
            real["per_connection_buffer_limit_bytes"]
        );
        // The real cluster keeps the quarantine.
        assert_eq!(real["outlier_detection"]["consecutive_5xx"], 1);
        assert!(real["health_checks"].is_array());
    }

    // attempt-<b>: internal listener, no timeouts of its own but b's per-try timeout.
    let public = listener(&b, "llmkube");
    for (name, per_try) in [("local", "10s"), ("anthropic", "60s")] {
        let l = listener(&b, &format!("attempt-{name}"));
        assert_eq!(l["internal_listener"], json!({}));
        assert!(l.get("address").is_none());
        assert_eq!(
            l["per_connection_buffer_limit_bytes"],
            public["per_connection_buffer_limit_bytes"]
        );
        let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(hcm["stream_idle_timeout"], "0s");
        assert_eq!(hcm["request_timeout"], "0s");
        let filters: Vec<&str> = hcm["http_filters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(filters, ["envoy.filters.http.router"]);
        let vh = &hcm["route_config"]["virtual_hosts"][0];
        assert!(vh.get("include_attempt_count_in_response").is_none());
        let r = attempt_route(&b, name);
        for absent in [
            "request_headers_to_remove",
            "request_headers_to_add",
            "response_headers_to_add",
        ] {
            assert!(r.get(absent).is_none(), "attempt-{name} route has {absent}");
        }
        let a = &r["route"];
        assert_eq!(a["cluster"], format!("backend-{name}"));
        assert_eq!(a["timeout"], "0s");
        assert_eq!(
            a["retry_policy"],
            json!({"num_retries": 0, "per_try_timeout": per_try})
        );
    }
    // The external backend's Host, as on a route to it alone.
    assert_eq!(
        attempt_route(&b, "anthropic")["route"]["host_rewrite_literal"],
        "api.anthropic.com"
    );
    assert!(attempt_route(&b, "local")["route"]
        .get("host_rewrite_literal")
        .is_none());
    assert_eq!(
        b["bootstrap_extensions"],
        json!([{"name": "envoy.bootstrap.internal_listener", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"}}])
    );
}

#[test]
fn rule_timeout_or_equal_backend_timeouts_keep_one_route_level_timeout() {
    let assert_no_hop = |b: &Value| {
        assert_eq!(listeners(b).len(), 1);
        assert!(b.get("bootstrap_extensions").is_none());
        for c in clusters(b) {
            let n = c["name"].as_str().unwrap();
            assert!(!n.starts_with("via-") && !n.starts_with("attempts."), "{n}");
        }
    };
    // rule.timeout wins for every attempt.
    let b = compile(reference_example(Some("30s")));
    assert_no_hop(&b);
    let r = route(&b, "pf/local,anthropic");
    assert_eq!(r["route"]["cluster"], "order.local.anthropic");
    assert_eq!(r["route"]["retry_policy"]["per_try_timeout"], "30s");

    // Same effective timeout on every backend: explicit 5s twice; explicit 120s next to the
    // 120s default.
    for (ta, tb, want) in [
        (Some("5s"), Some("5s"), "5s"),
        (Some("120s"), None, "120s"),
        (None, None, "120s"),
    ] {
        let mut r = reference_example(None);
        for (i, t) in [ta, tb].iter().enumerate() {
            match t {
                Some(t) => r["spec"]["backends"][i]["timeout"] = json!(t),
                None => {
                    r["spec"]["backends"][i]
                        .as_object_mut()
                        .unwrap()
                        .remove("timeout");
                }
            }
        }
        let b = compile(r);
        assert_no_hop(&b);
        let r = route(&b, "pf/local,anthropic");
        assert_eq!(r["route"]["cluster"], "order.local.anthropic");
        assert_eq!(r["route"]["retry_policy"]["per_try_timeout"], want);
    }
}

#[test]
fn attempt_timeouts_are_capped_by_response_header_timeout() {
    // A backend without a timeout gets the cap; one with a tighter timeout keeps it.
    let mut r = reference_example(None);
    r["spec"]["backends"][1]
        .as_object_mut()
        .unwrap()
        .remove("timeout");
    r["spec"]["proxy"] = json!({"responseHeaderTimeout": "30s"});
    let b = compile(r);
    assert_eq!(
        attempt_route(&b, "local")["route"]["retry_policy"]["per_try_timeout"],
        "10s"
    );
    assert_eq!(
        attempt_route(&b, "anthropic")["route"]["retry_policy"]["per_try_timeout"],
        "30s"
    );

    // A backend timeout beyond the cap is refused ("can only tighten").
    let mut r = reference_example(None);
    r["spec"]["proxy"] = json!({"responseHeaderTimeout": "30s"});
    let err = compile_envoy(
        &[Source {
            name: "dp.yaml".into(),
            text: dataplane_docs(r),
        }],
        &opts(),
    )
    .unwrap_err();
    let text: Vec<String> = err.iter().map(|p| p.to_string()).collect();
    assert!(
        text.iter()
            .any(|l| l.contains("spec.backends[1].timeout") && l.contains("tighten")),
        "{text:#?}"
    );

    // And route_plans caps whatever the plugin config carries.
    let b = compile(reference_example(None));
    let mut pc = plugin_of(&b);
    pc.backends[0].timeout_ms = Some(200_000);
    pc.backends[1].timeout_ms = Some(45_000);
    let core = Router::new(pc.clone()).unwrap();
    let plans = llmkube_gen::ir::route_plans(&core, 60_000);
    let p = plans
        .iter()
        .find(|p| p.key == "pf/local,anthropic")
        .unwrap();
    assert_eq!(p.attempt_timeouts_ms, [60_000, 45_000]);
    assert!(p.per_backend_timeouts());
    pc.rules[0].timeout_ms = Some(90_000);
    let core = Router::new(pc).unwrap();
    let plans = llmkube_gen::ir::route_plans(&core, 60_000);
    for p in &plans {
        if p.key.starts_with("pf/") {
            assert!(p.attempt_timeouts_ms.iter().all(|&t| t == 60_000), "{p:?}");
            assert_eq!(p.uniform_timeout_ms(), Some(60_000));
        }
    }
}

/// In the whole data-plane router: exactly the routes whose attempts have different timeouts get
/// the hop, each hop backend has one via cluster and one listener (shared by every route), with
/// that backend's timeout.
#[test]
fn hops_only_where_attempt_timeouts_differ_one_listener_per_backend() {
    let b = compile(dataplane_router());
    let pc = plugin_of(&b);
    let mut hop_backends = BTreeSet::new();
    for r in backend_routes(&b) {
        let key = r["name"].as_str().unwrap();
        let order: Vec<&str> = key.split_once('/').unwrap().1.split(',').collect();
        let c = r["route"]["cluster"].as_str().unwrap();
        assert_eq!(c.starts_with("attempts."), hop(&pc, key), "{key} → {c}");
        if hop(&pc, key) {
            hop_backends.extend(order.iter().map(|s| s.to_string()));
            let members = cluster(&b, c)["cluster_type"]["typed_config"]["clusters"].clone();
            let want: Vec<String> = order.iter().map(|m| format!("via-{m}")).collect();
            assert_eq!(members, json!(want));
        }
    }
    assert!(hop_backends.contains("local-b") && hop_backends.contains("cloud"));
    let names: Vec<String> = listeners(&b)
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect();
    let mut want = vec!["llmkube".to_string()];
    // Listeners in backend declaration order.
    for be in &pc.backends {
        if hop_backends.contains(&be.name) {
            want.push(format!("attempt-{}", be.name));
        }
    }
    assert_eq!(names, want);
    for be in &pc.backends {
        let has = has_cluster(&b, &format!("via-{}", be.name));
        assert_eq!(has, hop_backends.contains(&be.name), "{}", be.name);
        if has {
            let t = be.timeout_ms.unwrap();
            assert_eq!(
                attempt_route(&b, &be.name)["route"]["retry_policy"]["per_try_timeout"],
                format!("{}s", t / 1000)
            );
        }
    }
    assert_eq!(
        attempt_route(&b, "local-b")["route"]["retry_policy"]["per_try_timeout"],
        "3s"
    );
    assert_eq!(
        attempt_route(&b, "local-a")["route"]["retry_policy"]["per_try_timeout"],
        "120s"
    );
}
