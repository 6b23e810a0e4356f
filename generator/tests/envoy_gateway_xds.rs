//! The EnvoyPatchPolicy applied the way Envoy Gateway applies it, to a stand-in of the xDS it
//! would generate for the compiled documents (`common/eg_xds.rs`), then checked by a real Envoy
//! (`envoy --mode validate`, with the real model-router module and the generated plugin config).

mod common;
use common::crds::documents;
use common::eg::*;
use common::eg_xds::*;
use common::envoy_run::{envoy_validate, model_router_dir};
use common::*;
use llmkube_gen::targets::envoy::WASM_FILE;
use llmkube_gen::targets::envoy_gateway::{budgets, compile_envoy_gateway, GatewayOptions};
use llmkube_gen::{CompileOptions, Source};
use serde_json::{json, Value};

fn compile(text: &str, o: &GatewayOptions) -> Vec<Value> {
    let out = compile_envoy_gateway(
        &[Source {
            name: "eg.yaml".into(),
            text: text.to_string(),
        }],
        o,
    )
    .unwrap_or_else(|e| panic!("{:#?}", e.iter().map(|p| p.to_string()).collect::<Vec<_>>()));
    documents(&out)
}

/// Compiles, patches, and has Envoy validate; returns the patched bootstrap.
fn patched_and_validated(name: &str, text: &str, o: &GatewayOptions) -> Value {
    let docs = compile(text, o);
    let mut xds = generated_xds(&docs, &module());
    apply_patches(&mut xds, of_kind(&docs, "EnvoyPatchPolicy")[0]);
    let b = bootstrap(xds);
    let (ok, report) = envoy_validate(
        &format!("eg-{name}.json"),
        &serde_json::to_string(&b).unwrap(),
    );
    assert!(ok, "{name}: {report}");
    b
}

fn module() -> std::path::PathBuf {
    model_router_dir().join(WASM_FILE)
}

fn routes_of(b: &Value) -> Vec<Value> {
    b["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]["typed_config"]
        ["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap()
        .clone()
}

/// The walkthrough's router and the whole data plane (several AIGatewayRoutes, shadow rules):
/// every patch selects what it means to and Envoy accepts the result; the patched routes carry
/// what the envoy target's routes carry.
#[test]
fn patches_apply_to_envoy_gateways_xds_and_envoy_accepts_the_result() {
    let b = patched_and_validated("example", &example(), &opts());
    let hcm = &b["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]
        ["typed_config"];
    assert_eq!(
        hcm["http_filters"][0]["typed_config"]["config"]["allow_on_headers_stop_iteration"],
        true
    );
    assert_eq!(
        hcm["route_config"]["virtual_hosts"][0]["include_attempt_count_in_response"],
        true
    );
    let dp = patched_and_validated(
        "dataplane",
        &dataplane_docs(with_gateway(dataplane_router())),
        &opts(),
    );
    for b in [&b, &dp] {
        for r in routes_of(b) {
            let Some(action) = r.get("route") else {
                continue; // route-not-found
            };
            assert_eq!(
                r["request_headers_to_remove"],
                json!(["authorization"]),
                "{r}"
            );
            let retry = &action["retry_policy"];
            if retry["num_retries"] == 0 {
                assert!(retry.get("retry_on").is_none(), "{r}");
                assert!(retry["per_try_timeout"].is_string(), "{r}");
            } else {
                assert_eq!(
                    retry["retry_on"],
                    "5xx,reset,connect-failure,refused-stream"
                );
            }
        }
    }
    let mirrored = routes_of(&dp)
        .iter()
        .filter(|r| r["route"].get("request_mirror_policies").is_some())
        .count();
    assert!(mirrored > 0);
}

/// Picked pods, the shared ledger's cluster and the JWT error shape: the patch-added clusters
/// and the listener's local reply config load in Envoy.
#[test]
fn patch_added_clusters_and_auth_load_in_envoy() {
    let mut r = with_gateway(router());
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    r["spec"]["backends"][0]["balancing"] = json!({"mode": "LoadAware"});
    r["spec"]["policy"] = json!({
        "auth": {"jwt": {"issuer": "https://idp.example.com/realms/llm", "jwksURI": "https://idp.example.com/certs", "provider": "kc", "teamClaim": "grp"}},
        "budgets": [{"name": "monthly", "scope": "router", "maxTokens": 1000, "windowSeconds": 3600}],
    });
    let o = GatewayOptions {
        common: CompileOptions {
            endpoints: two_pods("isvc-a"),
            ..Default::default()
        },
        budgets: budgets::from_flags(Some("llmkube-budgets.llm:8080"), None, None).unwrap(),
        ..opts()
    };
    let b = patched_and_validated("picked", &full(r), &o);
    let clusters: Vec<&str> = b["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        clusters.contains(&"llmkube-pick/llm/demo/local-a"),
        "{clusters:?}"
    );
    assert!(
        clusters.contains(&"llmkube-budgets/llm/demo"),
        "{clusters:?}"
    );
    let hcm = &b["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]
        ["typed_config"];
    assert!(hcm["local_reply_config"].is_object());
    assert!(routes_of(&b)
        .iter()
        .any(|r| r["route"]["cluster"] == "llmkube-pick/llm/demo/local-a"));
}

/// The harness itself: a patch whose JSONPath selects nothing, one naming a cluster that does
/// not exist, and an xDS field Envoy does not know, are caught.
#[test]
fn harness_catches_unmatched_paths_and_bad_xds() {
    let docs = compile(&example(), &opts());
    let mut policy = of_kind(&docs, "EnvoyPatchPolicy")[0].clone();
    policy["spec"]["jsonPatches"][0]["operation"]["jsonPath"] =
        json!("..http_filters[?(@.name=='no-such-filter')].typed_config.config");
    let caught = std::panic::catch_unwind(|| {
        let mut xds = generated_xds(&docs, &module());
        apply_patches(&mut xds, &policy);
    });
    assert!(caught.is_err());
    // A cluster patch naming a cluster Envoy Gateway does not generate.
    let mut policy = of_kind(&docs, "EnvoyPatchPolicy")[0].clone();
    let renamed = policy["spec"]["jsonPatches"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["name"].as_str().unwrap().starts_with("httproute/"))
        .map(|p| p["name"] = json!("httproute/llm/no-such-route/rule/0"));
    assert!(renamed.is_some());
    let caught = std::panic::catch_unwind(|| {
        let mut xds = generated_xds(&docs, &module());
        apply_patches(&mut xds, &policy);
    });
    assert!(caught.is_err());
    let mut xds = generated_xds(&docs, &module());
    apply_patches(&mut xds, of_kind(&docs, "EnvoyPatchPolicy")[0]);
    xds.routes["virtual_hosts"][0]["include_attempt_count_in_responses"] = json!(true);
    let (ok, _) = envoy_validate(
        "eg-broken.json",
        &serde_json::to_string(&bootstrap(xds)).unwrap(),
    );
    assert!(!ok);
}

/// The clusters of the patched xDS whose names are Envoy Gateway's rule clusters.
fn rule_clusters(b: &Value) -> Vec<Value> {
    b["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("httproute/"))
        .cloned()
        .collect()
}

/// The quarantine of every rule cluster, once patched, is the envoy target's: the same
/// `outlier_detection` (no uneject on a passing health check, maximum ejection time, no
/// statistical or local-origin ejection), health check (unhealthy and no-traffic intervals) and
/// panic threshold as that target's backend clusters, for the same router.
#[test]
fn patched_rule_clusters_quarantine_as_the_envoy_target_does() {
    let envoy = common::envoy::compile(dataplane_router());
    let reference = common::envoy::cluster(&envoy, "backend-local-a");
    assert_eq!(
        reference["outlier_detection"]["successful_active_health_check_uneject_host"],
        false
    );
    let b = patched_and_validated(
        "quarantine",
        &dataplane_docs(with_gateway(dataplane_router())),
        &opts(),
    );
    let clusters = rule_clusters(&b);
    assert!(clusters.len() > 5, "{clusters:#?}");
    for c in &clusters {
        let name = &c["name"];
        assert_eq!(
            c["outlier_detection"], reference["outlier_detection"],
            "{name}"
        );
        assert_eq!(c["health_checks"], reference["health_checks"], "{name}");
        assert_eq!(
            c["common_lb_config"]["healthy_panic_threshold"],
            reference["common_lb_config"]["healthy_panic_threshold"],
            "{name}"
        );
    }
}

/// A rule whose backends mix IP-address and host-name endpoints: Envoy Gateway gives each
/// backend its own cluster, the patches address those (`.../rule/<i>/backend/<j>`), and the
/// compile warns on the rule's backends.
#[test]
fn mixed_address_rules_patch_each_backends_cluster_and_warn() {
    let mut r = with_gateway(router());
    r["spec"]["rules"][0]["route"]["backends"] = json!(["local-a", "cloud"]);
    let mut o = opts();
    o.common
        .resolve
        .insert("isvc-a".into(), ("10.0.0.7".into(), 8000));
    let mut diags = llmkube_gen::Diagnostics::default();
    llmkube_gen::targets::envoy_gateway::compile_envoy_gateway_diag(
        &[Source {
            name: "eg.yaml".into(),
            text: full(r.clone()),
        }],
        &o,
        &mut diags,
    )
    .expect("compiles");
    let w: Vec<String> = diags.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        w.iter().any(|w| w.starts_with(
            "ModelRouter/demo: spec.rules[0].route.backends: the attempt order local-a → cloud"
        ) && w.contains("by IP address (local-a) and by host name (cloud)")
            && w.contains("does not fail over")),
        "{w:#?}"
    );
    let b = patched_and_validated("mixed", &full(r), &o);
    let names: Vec<String> = rule_clusters(&b)
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    let per_backend: Vec<&String> = names.iter().filter(|n| n.contains("/backend/")).collect();
    assert_eq!(per_backend.len(), 2, "{names:?}");
    for c in rule_clusters(&b) {
        assert_eq!(
            c["outlier_detection"]["successful_active_health_check_uneject_host"], false,
            "{}",
            c["name"]
        );
        assert_eq!(c["health_checks"][0]["unhealthy_interval"], "15s");
    }
}
