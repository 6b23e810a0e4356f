#![allow(dead_code)]
//! A stand-in for the xDS Envoy Gateway generates from the envoy-gateway target's documents, and
//! its way of applying an EnvoyPatchPolicy to it. Shared by the generator's xDS test
//! (`envoy_gateway_xds.rs`, `envoy --mode validate`) and the real-Envoy e2e test
//! (`testharness/fixtures/tests/envoy_gateway_quarantine.rs`, included with `#[path]`), so it
//! depends on `serde_json` and `regex` only.
//!
//! Names and shapes are those of its translator (proto field names, as its `protojson`
//! marshalling with `UseProtoNames` gives them, `internal/xds/translator/jsonpatch.go`): the
//! Gateway listener with one wasm filter per EnvoyExtensionPolicy, the route configuration with
//! one xDS route per AIGatewayRoute rule (`httproute/<ns>/<route>/rule/<i>/match/0/*`, header
//! match, its rule cluster, the retry policy of its BackendTrafficPolicy with Envoy Gateway's
//! default `retry_on` when the policy names no trigger) plus the final `route-not-found` rule,
//! and the rule clusters: the rule's Backends' endpoints, one locality per backend at the
//! priority Envoy AI Gateway sets, outlier detection, health check and panic threshold as
//! `internal/xds/translator/cluster.go` builds them from the BackendTrafficPolicy's
//! `healthCheck` (`buildXdsOutlierDetection`, `buildXdsHealthCheck`); a rule mixing IP-address
//! and host-name backends gets one cluster per backend behind `weighted_clusters`
//! (`NeedsClusterPerSetting`). One simplification: Envoy Gateway delivers IP endpoints by EDS,
//! here they are inline (`STATIC`). Patches are applied with Envoy Gateway's semantics
//! (`internal/utils/jsonpatch/patch.go`: a JSONPath selecting nothing, or a resource name
//! naming nothing, is an error; `add` creates missing parents; an empty path and JSONPath add a
//! whole resource). What this cannot show: Envoy AI Gateway's extension server rewriting the same
//! resources afterwards.

use serde_json::{json, Value};
use std::path::Path;

/// The xDS listener (and route configuration) of the Gateway's `http` listener.
pub const LISTENER: &str = "envoy-gateway-system/ai-gateway/http";
/// `retryDefaultRetryOn` of Envoy Gateway's `route.go`.
pub const EG_DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";

pub struct Xds {
    pub listener: Value,
    pub routes: Value,
    pub clusters: Vec<Value>,
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    of_kind(docs, kind)
        .into_iter()
        .find(|d| d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
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
pub fn gateway_to_envoy(d: &str) -> String {
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

/// The xDS Envoy Gateway would generate for these documents, with the model-router module at
/// `module`.
pub fn generated_xds(docs: &[Value], module: &Path) -> Xds {
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
            let settings: Vec<Setting> = rule["backendRefs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| setting(docs, r))
                .collect();
            let mut action =
                json!({"timeout": "0s", "retry_policy": retry_policy(&btp["spec"]["retry"])});
            if needs_cluster_per_setting(&settings) {
                let mut weighted = Vec::new();
                for (j, s) in settings.iter().enumerate() {
                    let c = format!("{cluster}/backend/{j}");
                    weighted.push(json!({"name": c, "weight": 1}));
                    clusters.push(rule_cluster(&c, std::slice::from_ref(s), &btp["spec"]));
                }
                action["weighted_clusters"] = json!({"clusters": weighted});
            } else {
                action["cluster"] = json!(cluster);
                clusters.push(rule_cluster(&cluster, &settings, &btp["spec"]));
            }
            routes.push(json!({
                "name": format!("httproute/{ns}/{name}/rule/{i}/match/0/*"),
                "match": {"prefix": "/", "headers": [{"name": h["name"], "string_match": {"exact": h["value"]}}]},
                "route": action,
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

/// One backendRef of a rule: its priority and its Backend's endpoints (address, port, is IP).
pub struct Setting {
    priority: u64,
    endpoints: Vec<(String, u64, bool)>,
}

fn setting(docs: &[Value], backend_ref: &Value) -> Setting {
    let aisb = named(
        docs,
        "AIServiceBackend",
        backend_ref["name"].as_str().unwrap(),
    );
    let backend = named(
        docs,
        "Backend",
        aisb["spec"]["backendRef"]["name"].as_str().unwrap(),
    );
    let endpoints = backend["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| match (&e["ip"], &e["fqdn"]) {
            (Value::Object(ip), _) => (
                ip["address"].as_str().unwrap().to_string(),
                ip["port"].as_u64().unwrap(),
                true,
            ),
            (_, Value::Object(f)) => (
                f["hostname"].as_str().unwrap().to_string(),
                f["port"].as_u64().unwrap(),
                false,
            ),
            _ => panic!("endpoint {e}"),
        })
        .collect();
    Setting {
        priority: backend_ref["priority"].as_u64().unwrap_or(0),
        endpoints,
    }
}

/// `RouteDestination.HasMixedEndpoints` (the other reasons for a cluster per backend do not
/// arise from these documents).
fn needs_cluster_per_setting(settings: &[Setting]) -> bool {
    let ip = settings.iter().flat_map(|s| &s.endpoints).any(|e| e.2);
    let fqdn = settings.iter().flat_map(|s| &s.endpoints).any(|e| !e.2);
    ip && fqdn
}

/// A rule cluster over `settings` with the BackendTrafficPolicy `btp`'s health settings.
fn rule_cluster(name: &str, settings: &[Setting], btp: &Value) -> Value {
    let all_ip = settings.iter().flat_map(|s| &s.endpoints).all(|e| e.2);
    let localities: Vec<Value> = settings
        .iter()
        .map(|s| {
            let eps: Vec<Value> = s
                .endpoints
                .iter()
                .map(|(a, p, _)| json!({"endpoint": {"address": {"socket_address": {"address": a, "port_value": p}}}}))
                .collect();
            json!({"priority": s.priority, "lb_endpoints": eps})
        })
        .collect();
    let mut c = json!({
        "name": name,
        "type": if all_ip { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "10s",
        "lb_policy": "ROUND_ROBIN",
        "common_lb_config": {},
        "ignore_health_on_host_removal": true,
        "load_assignment": {"cluster_name": name, "endpoints": localities},
    });
    let hc = &btp["healthCheck"];
    if let Some(p) = hc["panicThreshold"].as_u64().filter(|&p| p != 50) {
        c["common_lb_config"]["healthy_panic_threshold"] = json!({"value": p});
    }
    if let Some(a) = hc.get("active") {
        let mut check = json!({
            "timeout": gateway_to_envoy(a["timeout"].as_str().unwrap()),
            "interval": gateway_to_envoy(a["interval"].as_str().unwrap()),
        });
        for (from, to) in [
            ("unhealthyThreshold", "unhealthy_threshold"),
            ("healthyThreshold", "healthy_threshold"),
        ] {
            if a[from].is_number() {
                check[to] = a[from].clone();
            }
        }
        assert_eq!(a["type"], "TCP", "{a}");
        check["tcp_health_check"] = json!({});
        c["health_checks"] = json!([check]);
    }
    if let Some(p) = hc.get("passive") {
        let mut od = json!({
            "base_ejection_time": gateway_to_envoy(p["baseEjectionTime"].as_str().unwrap()),
            "interval": gateway_to_envoy(p["interval"].as_str().unwrap()),
        });
        if let Some(s) = p["splitExternalLocalOriginErrors"].as_bool() {
            od["split_external_local_origin_errors"] = json!(s);
        }
        if let Some(m) = p["maxEjectionPercent"].as_u64().filter(|&m| m > 0) {
            od["max_ejection_percent"] = json!(m);
        }
        for (from, to) in [
            (
                "consecutiveLocalOriginFailures",
                "consecutive_local_origin_failure",
            ),
            ("consecutive5XxErrors", "consecutive_5xx"),
        ] {
            if p[from].is_number() {
                od[to] = p[from].clone();
            }
        }
        c["outlier_detection"] = od;
    }
    c
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
pub fn select(doc: &Value, path: &str) -> Vec<String> {
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

/// Applies the EnvoyPatchPolicy to the generated xDS, in order; every patch must select something and
/// apply (Envoy Gateway reports the policy not fully programmed otherwise).
pub fn apply_patches(xds: &mut Xds, patch_policy: &Value) {
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
            "Cluster" => xds
                .clusters
                .iter_mut()
                .find(|c| c["name"] == p["name"])
                .unwrap_or_else(|| {
                    panic!("the patch names no cluster Envoy Gateway generates: {p}")
                }),
            other => panic!("patch of an unexpected resource type {other}: {p}"),
        };
        if kind != "Cluster" {
            assert_eq!(p["name"], LISTENER, "{p}");
        }
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

pub fn bootstrap(xds: Xds) -> Value {
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
