//! The envoy target's route table (docs/architecture.md, "Failover, weighted picks, shadow,
//! quarantine"): exactly the route keys the filter can stamp, weighted permutations, shadow
//! mirrors, determinism.

mod common;
use common::envoy::*;
use common::*;
use router_core::config::Tier;
use router_core::orders;
use router_core::router::Router;
use serde_json::{json, Value};
use std::collections::BTreeSet;

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
