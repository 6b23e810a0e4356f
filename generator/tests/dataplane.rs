//! The issue-3 data plane of the envoy target (docs/architecture.md, "Failover, weighted picks,
//! shadow, quarantine"): route keys, aggregates, retries and timeouts, quarantine, shadow mirrors,
//! the upstream chain and credentials.

mod common;
use common::*;
use llmkube_gen::Source;
use llmkube_gen::{compile_envoy, EnvoyOptions, Format};
use router_core::config::{PluginConfig, Tier};
use router_core::orders;
use router_core::router::Router;
use serde_json::{json, Value};
use std::collections::BTreeSet;

fn opts() -> EnvoyOptions {
    EnvoyOptions {
        wasm_dir: "/opt/wasm".into(),
        format: Format::Json,
        ..Default::default()
    }
}

fn compile_text(text: String) -> String {
    compile_envoy(
        &[Source {
            name: "dp.yaml".into(),
            text,
        }],
        &opts(),
    )
    .unwrap_or_else(|e| panic!("{:#?}", e.iter().map(|p| p.to_string()).collect::<Vec<_>>()))
}

fn compile(router: Value) -> Value {
    serde_json::from_str(&compile_text(dataplane_docs(router))).unwrap()
}

fn hcm(b: &Value) -> &Value {
    &b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

fn routes(b: &Value) -> Vec<Value> {
    hcm(b)["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap()
        .clone()
}

/// Routes to backends (everything but the final catch-all).
fn backend_routes(b: &Value) -> Vec<Value> {
    let mut r = routes(b);
    let last = r.pop().unwrap();
    assert_eq!(last["name"], "no-backend");
    assert_eq!(last["match"], json!({"prefix": "/"}));
    assert_eq!(last["direct_response"]["status"], 404);
    r
}

fn route(b: &Value, key: &str) -> Value {
    routes(b)
        .into_iter()
        .find(|r| r["name"] == key)
        .unwrap_or_else(|| panic!("no route {key}"))
}

fn clusters(b: &Value) -> Vec<Value> {
    b["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .clone()
}

fn cluster(b: &Value, name: &str) -> Value {
    clusters(b)
        .into_iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

fn has_cluster(b: &Value, name: &str) -> bool {
    clusters(b).iter().any(|c| c["name"] == name)
}

fn plugin_of(b: &Value) -> PluginConfig {
    let s = hcm(b)["http_filters"][0]["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap();
    serde_json::from_str(s).unwrap()
}

fn keys(b: &Value) -> Vec<String> {
    backend_routes(b)
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

fn rule_keys(b: &Value, rule: &str) -> Vec<String> {
    keys(b)
        .into_iter()
        .filter(|k| k.starts_with(&format!("{rule}/")))
        .collect()
}

/// Upstream HTTP filter names of a cluster (empty: no upstream chain).
fn chain(c: &Value) -> Vec<String> {
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

fn mirrors(r: &Value) -> Vec<String> {
    r["route"]["request_mirror_policies"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| m["cluster"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn route_set_is_exactly_the_filter_route_keys() {
    let b = compile(dataplane_router());
    // What the filter can stamp, from the filter's own engine on the generated plugin config.
    let core = Router::new(plugin_of(&b)).unwrap();
    let mut expected = Vec::new();
    for i in 0..core.rules_len() {
        for order in core.rule_orders(i) {
            let names: Vec<&str> = order
                .iter()
                .map(|&x| core.backend(x).name.as_str())
                .collect();
            expected.push(orders::route_key(&core.rule(i).name, &names));
        }
    }
    for t in core.unruled_targets() {
        expected.push(orders::route_key(
            orders::UNRULED,
            &[core.backend(t).name.as_str()],
        ));
    }
    assert_eq!(keys(&b), expected);
    // Each route matches its own key exactly on x-llmkube-route, and nothing else.
    for r in backend_routes(&b) {
        assert_eq!(
            r["match"],
            json!({"prefix": "/", "headers": [{"name": "x-llmkube-route", "string_match": {"exact": r["name"]}}]})
        );
    }
    let unique: BTreeSet<String> = keys(&b).into_iter().collect();
    assert_eq!(unique.len(), keys(&b).len());

    // The shapes, spelled out. Every order the filter can pick, and each of them with any
    // quarantined members left out (orders::MAX_SKIPPABLE): every non-empty subsequence.
    assert_eq!(
        rule_keys(&b, "pii"),
        ["pii/local-a", "pii/local-a,local-b", "pii/local-b"]
    );
    let w3 = rule_keys(&b, "w3");
    assert_eq!(
        w3.len(),
        3 + 6 + 6,
        "arrangements of non-empty subsets: {w3:?}"
    );
    assert!(w3.contains(&"w3/local-c,local-b,local-a".to_string()));
    assert!(w3.contains(&"w3/local-c,local-a".to_string()));
    // First pick by weight, the rest in declared order: 5 picked orders of 5, and their
    // subsequences.
    let w5 = rule_keys(&b, "w5");
    assert_eq!(w5.len(), 80);
    for k in [
        "w5/local-a,local-b,local-c,local-d,local-e",
        "w5/local-e,local-a,local-b,local-c,local-d",
        "w5/local-e,local-d",
        "w5/local-c",
    ] {
        assert!(w5.contains(&k.to_string()), "{k}");
    }
    assert!(!w5.contains(&"w5/local-b,local-c,local-a".to_string()));
    assert_eq!(
        rule_keys(&b, "sh"),
        [
            "sh/local-a",
            "sh/local-a,local-b",
            "sh/local-a,local-b,cloud",
            "sh/local-a,cloud",
            "sh/local-b",
            "sh/local-b,cloud",
            "sh/cloud"
        ]
    );
    // Mixed tiers, not fail-closed: the local-only variant for sensitive requests exists.
    assert_eq!(
        rule_keys(&b, "mixed"),
        ["mixed/local-a", "mixed/cloud", "mixed/cloud,local-a"]
    );
    // Only cloud backends: no sensitive variant.
    assert_eq!(
        rule_keys(&b, "ext"),
        ["ext/cloud", "ext/cloud,claude", "ext/claude"]
    );
    assert_eq!(rule_keys(&b, "~"), ["~/local-a"]);

    // BackendNameMatch: every backend is an unruled target.
    let mut r = dataplane_router();
    r["spec"]["defaultRouteStrategy"] = json!("BackendNameMatch");
    let b = compile(r);
    assert_eq!(
        rule_keys(&b, "~"),
        [
            "~/local-a",
            "~/local-b",
            "~/local-c",
            "~/local-d",
            "~/local-e",
            "~/cloud",
            "~/claude"
        ]
    );
}

#[test]
fn weight_zero_is_drained_from_the_route_table() {
    let mut r = dataplane_router();
    r["spec"]["backends"][2]["weight"] = json!(0);
    let b = compile(r);
    assert_eq!(
        rule_keys(&b, "w3"),
        [
            "w3/local-a",
            "w3/local-a,local-b",
            "w3/local-b",
            "w3/local-b,local-a"
        ]
    );
    assert_eq!(
        rule_keys(&b, "w5").len(),
        4 + 12 + 24 + 24,
        "4 positive weights: every arrangement of a non-empty subset"
    );
    assert!(rule_keys(&b, "w5").iter().all(|k| !k.contains("local-c")));
}

/// The effective response-header timeout of each attempt of route `key`, from the plugin config
/// (rule timeout, else the attempt's backend's, which the plugin config resolves to the cap).
fn expected_timeouts(pc: &PluginConfig, key: &str) -> Vec<u64> {
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
fn hop(pc: &PluginConfig, key: &str) -> bool {
    let t = expected_timeouts(pc, key);
    t.iter().any(|&x| x != t[0])
}

#[test]
fn clusters_single_backend_or_deduplicated_aggregate() {
    let b = compile(dataplane_router());
    let pc = plugin_of(&b);
    let names: Vec<String> = clusters(&b)
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "duplicate cluster: {names:?}");
    let mut used = BTreeSet::new();
    for r in backend_routes(&b) {
        let key = r["name"].as_str().unwrap();
        let order: Vec<&str> = key.split_once('/').unwrap().1.split(',').collect();
        let c = r["route"]["cluster"].as_str().unwrap();
        if order.len() == 1 {
            assert_eq!(c, format!("backend-{}", order[0]));
        } else {
            // Attempts with different timeouts: an `attempts.` aggregate over `via-` clusters.
            let (prefix, member) = if hop(&pc, key) {
                ("attempts", "via")
            } else {
                ("order", "backend")
            };
            assert_eq!(c, format!("{prefix}.{}", order.join(".")), "{key}");
            let agg = cluster(&b, c);
            assert_eq!(agg["lb_policy"], "CLUSTER_PROVIDED");
            assert_eq!(
                agg["alt_stat_name"],
                format!("{prefix}_{}", order.join("_"))
            );
            assert_eq!(agg["cluster_type"]["name"], "envoy.clusters.aggregate");
            let members: Vec<String> = order.iter().map(|m| format!("{member}-{m}")).collect();
            assert_eq!(
                agg["cluster_type"]["typed_config"]["clusters"],
                json!(members)
            );
            used.insert(c.to_string());
        }
    }
    // pii and sh (sensitive variant) share local-a,local-b; w3 and w5 do not collide.
    assert_eq!(
        route(&b, "pii/local-a,local-b")["route"]["cluster"],
        route(&b, "sh/local-a,local-b")["route"]["cluster"]
    );
    let aggs: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("order.") || n.starts_with("attempts."))
        .collect();
    assert_eq!(aggs.len(), used.len(), "no unused aggregate");
    // One per distinct multi-backend order, whatever rules share it.
    let orders: BTreeSet<String> = keys(&b)
        .iter()
        .map(|k| k.split_once('/').unwrap().1.to_string())
        .filter(|o| o.contains(','))
        .collect();
    assert_eq!(aggs.len(), orders.len());
    assert_eq!(aggs.len(), 83);
    // local-b (3s) next to 120s backends: attempts; mixed has a rule timeout; ext's two backends
    // both have the 120s cap.
    for (name, present) in [
        ("attempts.local-a.local-b", true),
        ("attempts.local-b.local-a.local-c", true),
        ("order.local-a.local-c", true),
        ("order.cloud.local-a", true),
        ("order.cloud.claude", true),
        ("order.local-a.local-b", false),
    ] {
        assert_eq!(has_cluster(&b, name), present, "{name}");
    }
}

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
        assert_eq!(p["retry_on"], "5xx,reset,connect-failure,refused-stream");
        assert_eq!(p["num_retries"], n - 1, "{key}");
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
fn quarantine_health_and_panic_on_backend_clusters() {
    let b = compile(dataplane_router());
    let core = Router::new(plugin_of(&b)).unwrap();
    for (i, name) in [
        "local-a", "local-b", "local-c", "local-d", "local-e", "cloud", "claude",
    ]
    .iter()
    .enumerate()
    {
        let c = cluster(&b, &format!("backend-{name}"));
        assert_eq!(
            c["outlier_detection"],
            json!({
                "consecutive_5xx": 1, "enforcing_consecutive_5xx": 100, "interval": "1s",
                "base_ejection_time": "20s", "max_ejection_time": "20s", "max_ejection_percent": 100,
                "split_external_local_origin_errors": true, "enforcing_consecutive_local_origin_failure": 0,
                "enforcing_success_rate": 0, "enforcing_local_origin_success_rate": 0,
            }),
            "{name}"
        );
        let hc = &c["health_checks"][0];
        assert_eq!(hc["interval"], "1s");
        assert_eq!(hc["unhealthy_threshold"], 1);
        assert_eq!(hc["healthy_threshold"], 1);
        assert_eq!(hc["tcp_health_check"], json!({}));
        assert_eq!(
            c["common_lb_config"],
            json!({"healthy_panic_threshold": {"value": 0}})
        );
        let tier = if core.backend(i).tier == Tier::Local {
            "local"
        } else {
            "cloud"
        };
        for ep in c["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_array()
            .unwrap()
        {
            assert_eq!(
                ep["metadata"],
                json!({"filter_metadata": {"llmkube": {"backend": name, "tier": tier}}})
            );
        }
    }
    // Default quarantine 15s.
    let mut r = dataplane_router();
    r["spec"]["proxy"] = json!({});
    let b = compile(r);
    assert_eq!(
        cluster(&b, "backend-local-a")["outlier_detection"]["base_ejection_time"],
        "15s"
    );
    assert_eq!(
        cluster(&b, "backend-local-a")["outlier_detection"]["max_ejection_time"],
        "15s"
    );
}

#[test]
fn mirrors_only_on_shadow_routes_and_never_to_cloud_on_local_orders() {
    let b = compile(dataplane_router());
    let core = Router::new(plugin_of(&b)).unwrap();
    let tier_of = |name: &str| {
        (0..7)
            .map(|i| core.backend(i))
            .find(|x| x.name == name)
            .unwrap()
            .tier
    };
    for r in backend_routes(&b) {
        let key = r["name"].as_str().unwrap();
        let (rule, order) = key.split_once('/').unwrap();
        let order: Vec<&str> = order.split(',').collect();
        let m = mirrors(&r);
        if rule != "sh" {
            assert!(m.is_empty(), "{key} mirrors {m:?}");
            continue;
        }
        let want: Vec<String> = order[1..].iter().map(|x| format!("shadow-{x}")).collect();
        assert_eq!(m, want, "{key}");
        if order.iter().all(|x| tier_of(x) == Tier::Local) {
            for target in &m {
                assert_eq!(
                    tier_of(target.strip_prefix("shadow-").unwrap()),
                    Tier::Local
                );
            }
        }
        for p in r["route"]["request_mirror_policies"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(
                p["request_headers_mutations"],
                json!([{"append": {"header": {"key": "x-llmkube-shadow", "value": "true"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}])
            );
        }
    }
    assert_eq!(
        mirrors(&route(&b, "sh/local-a,local-b")),
        ["shadow-local-b"]
    );
    assert_eq!(
        mirrors(&route(&b, "sh/local-a,local-b,cloud")),
        ["shadow-local-b", "shadow-cloud"]
    );
    // Shadow clusters only for shadow targets: no outlier detection, 4 in flight.
    for c in clusters(&b) {
        let n = c["name"].as_str().unwrap();
        if let Some(t) = n.strip_prefix("shadow-") {
            assert!(["local-b", "cloud"].contains(&t), "{n}");
            assert!(c.get("outlier_detection").is_none());
            assert!(c.get("health_checks").is_none());
            assert_eq!(c["circuit_breakers"]["thresholds"][0]["max_requests"], 4);
        }
    }
    assert!(has_cluster(&b, "shadow-cloud") && has_cluster(&b, "shadow-local-b"));
    // The shadow cluster has the same endpoints as the backend cluster.
    assert_eq!(
        cluster(&b, "shadow-cloud")["load_assignment"]["endpoints"],
        cluster(&b, "backend-cloud")["load_assignment"]["endpoints"]
    );
}

#[test]
fn upstream_chain_only_where_an_external_backend_can_be_reached() {
    let b = compile(dataplane_router());
    let full_chain = |creds: &[&str]| {
        let mut v = vec!["envoy.filters.http.wasm".to_string()];
        v.extend(creds.iter().map(|c| format!("cred-{c}")));
        v.push("envoy.filters.http.header_mutation".into());
        v.push("envoy.filters.http.upstream_codec".into());
        v
    };
    for c in clusters(&b) {
        let n = c["name"].as_str().unwrap();
        let ch = chain(&c);
        // Members: a backend/shadow cluster's own backend, an aggregate's order.
        let members: Vec<&str> = match n.split_once('.') {
            Some(("order" | "attempts", order)) => order.split('.').collect(),
            _ => vec![n.split_once('-').unwrap().1],
        };
        let externals: Vec<&str> = ["cloud", "claude"]
            .into_iter()
            .filter(|e| members.contains(e))
            .collect();
        if n.starts_with("via-") || n.starts_with("attempts.") || externals.is_empty() {
            // Attempts through listeners: backend-<b>'s own chain runs behind them.
            assert!(ch.is_empty(), "{n} has an upstream chain");
        } else {
            assert_eq!(ch, full_chain(&externals), "{n}");
        }
    }
    for n in [
        "backend-cloud",
        "shadow-cloud",
        "order.cloud.local-a",
        "order.cloud.claude",
    ] {
        assert!(!chain(&cluster(&b, n)).is_empty(), "{n}");
    }
    assert!(chain(&cluster(&b, "attempts.local-a.local-b.cloud")).is_empty());
    let agg = cluster(&b, "order.cloud.claude");
    let opts = &agg["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert_eq!(
        opts["explicit_http_config"],
        json!({"http_protocol_options": {}})
    );
    let f = &opts["http_filters"];
    let w = &f[0]["typed_config"]["config"];
    assert_eq!(w["root_id"], "upstream");
    assert_eq!(w["vm_config"]["vm_id"], "llmkube-upstream");
    assert_eq!(w["allow_on_headers_stop_iteration"], true);
    assert_eq!(w["fail_open"], false);
    assert_eq!(
        w["vm_config"]["code"]["local"]["filename"],
        "/opt/wasm/llmkube_upstream.wasm"
    );
    let pc: PluginConfig =
        serde_json::from_str(w["configuration"]["value"].as_str().unwrap()).unwrap();
    assert_eq!(pc, plugin_of(&b));
    for (i, (backend, header)) in [("cloud", "authorization"), ("claude", "x-api-key")]
        .iter()
        .enumerate()
    {
        let m = &f[1 + i]["typed_config"];
        assert_eq!(
            m["@type"],
            "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher"
        );
        let inj = &m["extension_config"];
        assert_eq!(inj["name"], "envoy.filters.http.credential_injector");
        let cred = &inj["typed_config"]["credential"]["typed_config"];
        assert_eq!(
            cred["credential"],
            json!({"name": format!("cred-{backend}")})
        );
        assert_eq!(cred["header"], *header);
        let pred = &m["xds_matcher"]["matcher_list"]["matchers"][0];
        let single = &pred["predicate"]["not_matcher"]["single_predicate"];
        assert_eq!(
            single["input"]["typed_config"]["header_name"],
            "x-llmkube-attempt-backend"
        );
        assert_eq!(single["value_match"], json!({"exact": backend}));
        assert_eq!(
            pred["on_match"]["action"]["typed_config"]["@type"],
            "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"
        );
    }
    assert_eq!(
        f[3]["typed_config"]["mutations"],
        json!({"request_mutations": [{"remove": "x-llmkube-attempt-backend"}]})
    );
    // Host per attempt: external endpoints carry the authority, aggregates with one rewrite to it.
    assert_eq!(
        cluster(&b, "backend-claude")["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
            ["endpoint"]["hostname"],
        "api.anthropic.com"
    );
    assert_eq!(
        route(&b, "ext/cloud,claude")["route"]["auto_host_rewrite"],
        true
    );
    assert!(route(&b, "w3/local-a,local-b,local-c")["route"]
        .get("auto_host_rewrite")
        .is_none());
    assert!(b["node"]["id"].is_string() && b["node"]["cluster"].is_string());
}

#[test]
fn credentials_only_in_static_secrets() {
    let text = compile_text(dataplane_docs(dataplane_router()));
    let b: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        b["static_resources"]["secrets"],
        json!([
            {"name": "cred-cloud", "generic_secret": {"secret": {"inline_string": format!("Bearer {OPENAI_KEY}")}}},
            {"name": "cred-claude", "generic_secret": {"secret": {"inline_string": ANTHROPIC_KEY}}},
        ])
    );
    for key in [OPENAI_KEY, ANTHROPIC_KEY] {
        assert_eq!(text.matches(key).count(), 1, "{key} appears elsewhere");
        let mut rest = b.clone();
        rest["static_resources"]
            .as_object_mut()
            .unwrap()
            .remove("secrets");
        assert!(!rest.to_string().contains(key));
        // Not even a fragment of the key (e.g. without "Bearer ").
        assert!(!rest.to_string().contains(&key[3..]));
    }
    // YAML output too.
    let y = compile_envoy(
        &[Source {
            name: "dp.yaml".into(),
            text: dataplane_docs(dataplane_router()),
        }],
        &EnvoyOptions {
            format: Format::Yaml,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(y.matches(OPENAI_KEY).count(), 1);
    assert_eq!(y.matches(ANTHROPIC_KEY).count(), 1);
}

#[test]
fn deterministic() {
    let a = compile_text(dataplane_docs(dataplane_router()));
    for _ in 0..3 {
        assert_eq!(a, compile_text(dataplane_docs(dataplane_router())));
    }
    // Table order: rules in declaration order, then unruled targets; the catch-all last.
    let b: Value = serde_json::from_str(&a).unwrap();
    let rules: Vec<String> = keys(&b)
        .iter()
        .map(|k| k.split_once('/').unwrap().0.to_string())
        .fold(Vec::new(), |mut v, r| {
            if v.last() != Some(&r) {
                v.push(r);
            }
            v
        });
    assert_eq!(rules, ["pii", "w3", "w5", "sh", "mixed", "ext", "~"]);
}

#[test]
fn capability_filtered_rules() {
    let mut r = dataplane_router();
    r["spec"]["backends"][0]["capabilities"] = json!(["vision"]);
    r["spec"]["rules"] = json!([
        {"name": "see", "match": {"requiredCapabilities": ["vision"]}, "route": {"backends": ["local-b", "local-a"]}},
    ]);
    let b = compile(r);
    assert_eq!(keys(&b), ["see/local-a", "~/local-a"]);
}

// ---------------------------------------------------------------------------------------------
// Per-attempt timeouts: a route whose attempts need different response-header timeouts sends
// each attempt through the internal listener `attempt-<b>` (via cluster `via-<b>`).

fn listeners(b: &Value) -> Vec<Value> {
    b["static_resources"]["listeners"]
        .as_array()
        .unwrap()
        .clone()
}

fn listener(b: &Value, name: &str) -> Value {
    listeners(b)
        .into_iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("no listener {name}"))
}

/// The route of internal listener `attempt-<backend>`.
fn attempt_route(b: &Value, backend: &str) -> Value {
    let l = listener(b, &format!("attempt-{backend}"));
    let hcm = &l["filter_chains"][0]["filters"][0]["typed_config"];
    let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap();
    assert_eq!(routes.len(), 1);
    routes[0].clone()
}

fn endpoint0(c: &Value) -> Value {
    c["load_assignment"]["endpoints"][0]["lb_endpoints"][0].clone()
}

/// The seed's example: primary-fallback [local (timeout 10s), anthropic (timeout 60s)] without a
/// rule timeout.
fn seed_example(rule_timeout: Option<&str>) -> Value {
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

#[test]
fn per_backend_timeouts_seed_example_goes_through_attempt_listeners() {
    let b = compile(seed_example(None));
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
    let b = compile(seed_example(Some("30s")));
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
        let mut r = seed_example(None);
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
    let mut r = seed_example(None);
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
    let mut r = seed_example(None);
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
    let b = compile(seed_example(None));
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
