//! The envoy target's clusters: one per backend or deduplicated aggregate, the quarantine, the
//! upstream chain where an external backend can be reached, credentials only in the secret store.

mod common;
use common::envoy::*;
use common::*;
use llmkube_gen::{compile_envoy, EnvoyOptions, Format, Source};
use router_core::config::{PluginConfig, Tier};
use router_core::router::Router;
use serde_json::{json, Value};
use std::collections::BTreeSet;

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
                // A passing health check must not end the quarantine early.
                "successful_active_health_check_uneject_host": false,
            }),
            "{name}"
        );
        let hc = &c["health_checks"][0];
        assert_eq!(hc["interval"], "1s");
        // A backend the check marks down sits out its quarantine before the next check.
        assert_eq!(hc["unhealthy_interval"], "20s");
        assert_eq!(hc["unhealthy_threshold"], 1);
        assert_eq!(hc["healthy_threshold"], 1);
        assert_eq!(hc["tcp_health_check"], json!({}));
        // No panic mode; an ejection reaches every worker at once (no merged health updates).
        assert_eq!(
            c["common_lb_config"],
            json!({"healthy_panic_threshold": {"value": 0}, "update_merge_window": "0s"})
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
