//! The EnvoyPatchPolicy applied the way Envoy Gateway applies it, then checked by a real Envoy.
//!
//! There is no Envoy Gateway controller here, so this builds the xDS it would generate for the
//! compiled documents, as its translator names and shapes it (proto field names, as its
//! `protojson` marshalling with `UseProtoNames` gives them, `internal/xds/translator/jsonpatch.go`):
//! the Gateway listener with one wasm filter per EnvoyExtensionPolicy, the route configuration
//! with one xDS route per AIGatewayRoute rule (`httproute/<ns>/<route>/rule/<i>/match/0/*`,
//! header match, its rule cluster, the retry policy of its BackendTrafficPolicy with Envoy
//! Gateway's default `retry_on` when the policy names no trigger) plus the final
//! `route-not-found` rule, and a stand-in cluster per rule. Then every patch is applied with
//! Envoy Gateway's semantics (`internal/utils/jsonpatch/patch.go`: a JSONPath selecting nothing
//! is an error; `add` creates missing parents; an empty path and JSONPath add a whole resource),
//! and `envoy --mode validate` loads the result, with the real model-router module and the
//! generated plugin config. What this cannot show: the extension server of Envoy AI Gateway
//! rewriting the same resources.

mod common;
use common::crds::documents;
use common::eg::*;
use common::envoy_run::{envoy_validate, model_router_dir};
use common::*;
use llmkube_gen::targets::envoy::WASM_FILE;
use llmkube_gen::targets::envoy_gateway::{budgets, compile_envoy_gateway, GatewayOptions};
use llmkube_gen::{CompileOptions, Source};
use serde_json::{json, Value};

/// The xDS listener (and route configuration) of the Gateway's `http` listener.
const LISTENER: &str = "envoy-gateway-system/ai-gateway/http";
/// `retryDefaultRetryOn` of Envoy Gateway's `route.go`.
const EG_DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";

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

/// The xDS Envoy Gateway would generate for these documents, before the patches.
struct Xds {
    listener: Value,
    routes: Value,
    clusters: Vec<Value>,
}

fn typed(t: &str) -> Value {
    json!({"@type": format!("type.googleapis.com/{t}")})
}

/// The BackendTrafficPolicy whose targetRefs name this rule.
fn traffic_policy<'a>(docs: &'a [Value], route: &str, rule: &Value) -> &'a Value {
    of_kind(docs, "BackendTrafficPolicy")
        .into_iter()
        .find(|p| {
            p["spec"]["targetRefs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["name"] == route && t["sectionName"] == rule["name"])
        })
        .unwrap_or_else(|| panic!("no BackendTrafficPolicy for {route}/{}", rule["name"]))
}

/// Envoy Gateway's retry policy of a BackendTrafficPolicy `retry` (`route.go`
/// `buildRetryPolicy`, as far as these fields go).
fn retry_policy(retry: &Value) -> Value {
    let on = match retry["retryOn"]["triggers"].as_array() {
        Some(t) => t
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect::<Vec<_>>()
            .join(","),
        None => EG_DEFAULT_RETRY_ON.to_string(),
    };
    let mut p = json!({"retry_on": on, "num_retries": retry["numRetries"]});
    if let Some(t) = retry["perRetry"]["timeout"].as_str() {
        p["per_try_timeout"] = json!(gateway_to_envoy(t));
    }
    if retry["numAttemptsPerPriority"].is_number() {
        let mut pp = typed(
            "envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
        );
        pp["update_frequency"] = retry["numAttemptsPerPriority"].clone();
        p["retry_priority"] =
            json!({"name": "envoy.retry_priorities.previous_priorities", "typed_config": pp});
    }
    p
}

/// A Gateway API duration (`1m30s`) as protojson writes a Duration (`90s`).
fn gateway_to_envoy(d: &str) -> String {
    let re = regex::Regex::new(r"([0-9]+)(h|ms|m|s)").unwrap();
    let ms: u64 = re
        .captures_iter(d)
        .map(|c| {
            let n: u64 = c[1].parse().unwrap();
            n * match &c[2] {
                "h" => 3_600_000,
                "m" => 60_000,
                "s" => 1_000,
                _ => 1,
            }
        })
        .sum();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    }
}

fn generated_xds(docs: &[Value]) -> Xds {
    let module = model_router_dir().join(WASM_FILE);
    let mut filters: Vec<Value> = of_kind(docs, "EnvoyExtensionPolicy")
        .iter()
        .map(|p| {
            let w = &p["spec"]["wasm"][0];
            let ns = p["metadata"]["namespace"].as_str().unwrap();
            let name = p["metadata"]["name"].as_str().unwrap();
            let mut tc = typed("envoy.extensions.filters.http.wasm.v3.Wasm");
            tc["config"] = json!({
                "name": w["name"],
                "root_id": w["rootID"],
                "fail_open": w["failOpen"],
                "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": w["config"].to_string()},
                "vm_config": {"vm_id": format!("envoyextensionpolicy/{ns}/{name}/wasm/0"), "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": module.to_string_lossy()}}},
            });
            json!({"name": format!("envoy.filters.http.wasm/envoyextensionpolicy/{ns}/{name}/wasm/0"), "typed_config": tc})
        })
        .collect();
    filters.push(json!({"name": "envoy.filters.http.router", "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")}));
    let mut routes = Vec::new();
    let mut clusters = Vec::new();
    for r in of_kind(docs, "AIGatewayRoute") {
        let ns = r["metadata"]["namespace"].as_str().unwrap();
        let name = r["metadata"]["name"].as_str().unwrap();
        let rules = r["spec"]["rules"].as_array().unwrap();
        for (i, rule) in rules.iter().enumerate() {
            let cluster = format!("httproute/{ns}/{name}/rule/{i}");
            let h = &rule["matches"][0]["headers"][0];
            let btp = traffic_policy(docs, name, rule);
            routes.push(json!({
                "name": format!("httproute/{ns}/{name}/rule/{i}/match/0/*"),
                "match": {"prefix": "/", "headers": [{"name": h["name"], "string_match": {"exact": h["value"]}}]},
                "route": {"cluster": cluster, "timeout": "0s", "retry_policy": retry_policy(&btp["spec"]["retry"])},
            }));
            clusters.push(json!({
                "name": cluster, "type": "STATIC", "connect_timeout": "10s", "lb_policy": "ROUND_ROBIN",
                "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 1}}}}]}]},
            }));
        }
        routes.push(json!({
            "name": format!("httproute/{ns}/{name}/rule/{}/match/0/*", rules.len()),
            "match": {"prefix": "/"},
            "direct_response": {"status": 404},
        }));
    }
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "http-10080",
        "rds": {"route_config_name": LISTENER, "config_source": {"ads": {}, "resource_api_version": "V3"}},
        "http_filters": filters,
    });
    Xds {
        listener: json!({
            "name": LISTENER,
            "address": {"socket_address": {"address": "0.0.0.0", "port_value": 10080}},
            "default_filter_chain": {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]},
        }),
        routes: json!({
            "name": LISTENER,
            "virtual_hosts": [{"name": format!("{LISTENER}/*"), "domains": ["*"], "routes": routes}],
        }),
        clusters,
    }
}

/// One JSONPath step of the forms the generator writes.
enum Step {
    /// `..key`: the member `key` of the node and of every node below it.
    Descend(String),
    /// `.key` (or the leading `$`, as an empty key).
    Child(String),
    /// `[*]`.
    Each,
    /// `[?(@.name=='x')]`.
    NameIs(String),
    /// `[?(@.name =~ /re/)]`.
    NameMatches(regex::Regex),
}

fn parse_json_path(p: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut rest = p.strip_prefix('$').unwrap_or(p);
    let key_end = |s: &str| s.find(['.', '[']).unwrap_or(s.len());
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("..") {
            let end = key_end(r);
            steps.push(Step::Descend(r[..end].to_string()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = key_end(r);
            steps.push(Step::Child(r[..end].to_string()));
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("[*]") {
            steps.push(Step::Each);
            rest = r;
        } else if let Some(r) = rest.strip_prefix("[?(@.name=='") {
            let end = r.find("')]").unwrap_or_else(|| panic!("{p}"));
            steps.push(Step::NameIs(r[..end].to_string()));
            rest = &r[end + 3..];
        } else if let Some(r) = rest.strip_prefix("[?(@.name =~ /") {
            let end = r.find("/)]").unwrap_or_else(|| panic!("{p}"));
            steps.push(Step::NameMatches(regex::Regex::new(&r[..end]).unwrap()));
            rest = &r[end + 3..];
        } else {
            panic!("unsupported JSONPath {p} at {rest}");
        }
    }
    steps
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Every node below `root` (and `root`), as JSON pointers.
fn all_nodes(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => m
            .iter()
            .for_each(|(k, c)| all_nodes(c, format!("{at}/{}", escape(k)), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, c)| all_nodes(c, format!("{at}/{i}"), out)),
        _ => {}
    }
}

/// The JSON pointers `path` selects in `doc`.
fn select(doc: &Value, path: &str) -> Vec<String> {
    let mut at = vec![String::new()];
    for step in parse_json_path(path) {
        let mut next = Vec::new();
        for p in &at {
            let node = doc.pointer(p).unwrap();
            match &step {
                Step::Child(k) if k.is_empty() => next.push(p.clone()),
                Step::Child(k) => {
                    if node.get(k).is_some() {
                        next.push(format!("{p}/{}", escape(k)));
                    }
                }
                Step::Descend(k) => {
                    let mut below = Vec::new();
                    all_nodes(node, p.clone(), &mut below);
                    next.extend(below.into_iter().filter_map(|b| {
                        doc.pointer(&b)?.get(k)?;
                        Some(format!("{b}/{}", escape(k)))
                    }));
                }
                Step::Each | Step::NameIs(_) | Step::NameMatches(_) => {
                    let Some(items) = node.as_array() else {
                        continue;
                    };
                    for (i, item) in items.iter().enumerate() {
                        let name = item["name"].as_str();
                        let keep = match &step {
                            Step::NameIs(n) => name == Some(n.as_str()),
                            Step::NameMatches(re) => name.is_some_and(|n| re.is_match(n)),
                            _ => true,
                        };
                        if keep {
                            next.push(format!("{p}/{i}"));
                        }
                    }
                }
            }
        }
        at = next;
    }
    at
}

/// One JSON Patch operation at `pointer` (RFC 6902, `add` creating missing parents as Envoy
/// Gateway's `EnsurePathExistsOnAdd` does).
fn apply_op(doc: &mut Value, op: &str, pointer: &str, value: Option<&Value>) -> Result<(), String> {
    let (parent, key) = pointer
        .rsplit_once('/')
        .ok_or_else(|| format!("bad pointer {pointer:?}"))?;
    let key = key.replace("~1", "/").replace("~0", "~");
    if op == "add" && doc.pointer(parent).is_none() {
        apply_op(doc, "add", parent, Some(&json!({})))?;
    }
    let target = doc
        .pointer_mut(parent)
        .ok_or_else(|| format!("no parent {parent:?}"))?;
    match (op, target) {
        ("add", Value::Object(m)) => {
            m.insert(key, value.cloned().unwrap_or(Value::Null));
        }
        ("replace", Value::Object(m)) if m.contains_key(&key) => {
            m.insert(key, value.cloned().unwrap_or(Value::Null));
        }
        ("remove", Value::Object(m)) => {
            m.remove(&key)
                .ok_or_else(|| format!("nothing to remove at {pointer:?}"))?;
        }
        (op, t) => return Err(format!("{op} at {pointer:?} on {t}")),
    }
    Ok(())
}

/// Applies the EnvoyPatchPolicy to the generated xDS; every patch must select something and
/// apply (Envoy Gateway reports the policy not fully programmed otherwise).
fn apply_patches(xds: &mut Xds, patch_policy: &Value) {
    for p in patch_policy["spec"]["jsonPatches"].as_array().unwrap() {
        let op = &p["operation"];
        let kind = p["type"].as_str().unwrap().rsplit('.').next().unwrap();
        let json_path = op["jsonPath"].as_str().unwrap_or("");
        let path = op["path"].as_str().unwrap_or("");
        if op["op"] == "add" && json_path.is_empty() && path.is_empty() {
            assert_eq!(kind, "Cluster", "{p}");
            assert_eq!(op["value"]["name"], p["name"], "{p}");
            xds.clusters.push(op["value"].clone());
            continue;
        }
        let doc = match kind {
            "Listener" => &mut xds.listener,
            "RouteConfiguration" => &mut xds.routes,
            other => panic!("patch of an unexpected resource type {other}: {p}"),
        };
        assert_eq!(p["name"], LISTENER, "{p}");
        let pointers = if json_path.is_empty() {
            vec![path.to_string()]
        } else {
            select(doc, json_path)
                .into_iter()
                .map(|j| format!("{j}{path}"))
                .collect()
        };
        assert!(!pointers.is_empty(), "the JSONPath selects nothing: {p}");
        for ptr in pointers {
            let op_name = op["op"].as_str().unwrap();
            apply_op(doc, op_name, &ptr, op.get("value")).unwrap_or_else(|e| panic!("{e}: {p}"));
        }
    }
}

fn bootstrap(xds: Xds) -> Value {
    let mut listener = xds.listener;
    // Inline the route configuration the listener's RDS names.
    let hcm = &mut listener["default_filter_chain"]["filters"][0]["typed_config"];
    hcm.as_object_mut().unwrap().remove("rds");
    hcm["route_config"] = xds.routes;
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 19000}}},
        "static_resources": {"listeners": [listener], "clusters": xds.clusters},
    })
}

/// Compiles, patches, and has Envoy validate; returns the patched bootstrap.
fn patched_and_validated(name: &str, text: &str, o: &GatewayOptions) -> Value {
    let docs = compile(text, o);
    let mut xds = generated_xds(&docs);
    apply_patches(&mut xds, of_kind(&docs, "EnvoyPatchPolicy")[0]);
    let b = bootstrap(xds);
    let (ok, report) = envoy_validate(
        &format!("eg-{name}.json"),
        &serde_json::to_string(&b).unwrap(),
    );
    assert!(ok, "{name}: {report}");
    b
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

/// The harness itself: a patch whose JSONPath selects nothing, and an xDS field Envoy does not
/// know, are caught.
#[test]
fn harness_catches_unmatched_paths_and_bad_xds() {
    let docs = compile(&example(), &opts());
    let mut policy = of_kind(&docs, "EnvoyPatchPolicy")[0].clone();
    policy["spec"]["jsonPatches"][0]["operation"]["jsonPath"] =
        json!("..http_filters[?(@.name=='no-such-filter')].typed_config.config");
    let caught = std::panic::catch_unwind(|| {
        let mut xds = generated_xds(&docs);
        apply_patches(&mut xds, &policy);
    });
    assert!(caught.is_err());
    let mut xds = generated_xds(&docs);
    apply_patches(&mut xds, of_kind(&docs, "EnvoyPatchPolicy")[0]);
    xds.routes["virtual_hosts"][0]["include_attempt_count_in_responses"] = json!(true);
    let (ok, _) = envoy_validate(
        "eg-broken.json",
        &serde_json::to_string(&bootstrap(xds)).unwrap(),
    );
    assert!(!ok);
}
