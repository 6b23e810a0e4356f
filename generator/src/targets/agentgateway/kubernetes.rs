//! `kubernetes.yaml`: `llmkube-ext-proc` (ConfigMap, Deployment, Service), a PreRouting
//! AgentgatewayPolicy running it on the `spec.agentGatewayRef` Gateway (PreRouting is the phase
//! that runs before route selection; PostRouting, the only phase for HTTPRoute targets, runs
//! after it), HTTPRoutes with one rule per route key, one AgentgatewayBackend per route key (the
//! attempt order as priority groups) and PostRouting AgentgatewayPolicies for the retries and the
//! removal of internal headers. Credentials are Secret references only.
//!
//! No AgentgatewayModel: agentgateway routes an AgentgatewayModel by the request's `model` on its
//! own, past the filter's rules, so publishing one would let a sensitive request reach whatever
//! backend the model names.

use std::collections::BTreeMap;
use std::time::Duration;

use router_core::headers::ROUTE_HEADER;
use serde_json::{json, Value};

use super::attempts::{attempts, Attempt};
use super::ext_proc;
use super::options::{AgentgatewayOptions, EXT_PROC_PORT, IMAGE_WASM_DIR, INTERNAL_HEADERS};
use super::standalone::{processing_options, RETRY_BACKOFF, RETRY_CONDITION};
use crate::duration::gateway_duration;
use crate::ir::{Ir, RoutePlan};
use crate::model::Provider;

const AGW_API: &str = "agentgateway.dev/v1alpha1";
const GW_GROUP: &str = "gateway.networking.k8s.io";
/// Gateway API: at most 16 rules per HTTPRoute and 16 targetRefs per policy.
const MAX_RULES: usize = 16;
const MAX_TARGETS: usize = 16;
const MANAGED_BY: &str = "llmkube-gen";
const CONFIG_FILE: &str = "ext-proc.yaml";
const CONFIG_DIR: &str = "/etc/llmkube";

fn router_name(ir: &Ir) -> String {
    ir.router.metadata.name.clone().unwrap_or_default()
}

pub(super) fn server_name(ir: &Ir) -> String {
    format!("llmkube-ext-proc-{}", router_name(ir))
}

fn route_name(ir: &Ir, chunk: usize) -> String {
    format!("llmkube-{}-{chunk}", router_name(ir))
}

fn backend_name(ir: &Ir, index: usize) -> String {
    format!("llmkube-{}-route-{index}", router_name(ir))
}

fn rule_name(index: usize) -> String {
    format!("route-{index}")
}

fn metadata(name: &str, namespace: &str, ir: &Ir) -> Value {
    json!({
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        "annotations": {"llmkube.dev/model-router": ir.key},
    })
}

fn object(api_version: &str, kind: &str, metadata: Value, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
}

/// The Gateway the router is served by (`spec.agentGatewayRef`; required by the target).
struct Gateway {
    name: String,
    namespace: String,
    section: Option<String>,
    hostnames: Vec<String>,
}

fn gateway(ir: &Ir) -> Gateway {
    let g = ir.router.spec.agent_gateway_ref.as_ref();
    Gateway {
        name: g.map(|g| g.name.clone()).unwrap_or_default(),
        namespace: g
            .and_then(|g| g.namespace.clone())
            .unwrap_or_else(|| ir.namespace.clone()),
        section: g.and_then(|g| g.section_name.clone()),
        hostnames: g.and_then(|g| g.hostnames.clone()).unwrap_or_default(),
    }
}

/// Every document, in apply order.
pub(super) fn documents(ir: &Ir, opts: &AgentgatewayOptions, sha256: &str) -> Vec<Value> {
    let gw = gateway(ir);
    let mut docs = server(ir, opts, sha256);
    docs.extend(ext_proc_policy(ir, &gw));
    if super::picked::any_picked(ir) {
        let name = picker_name(ir);
        let module = format!("{IMAGE_WASM_DIR}/{}", super::super::module::WASM_FILE);
        let config = super::picked::picker_config(ir, &module, sha256, opts);
        docs.extend(server_named(ir, opts, &name, &config));
        docs.extend(super::picked::pools(ir, &name, EXT_PROC_PORT, |n| {
            metadata(n, &ir.namespace, ir)
        }));
    }
    docs.extend(
        ir.routes
            .iter()
            .enumerate()
            .filter(|(_, p)| super::picked::picked_route(ir, p).is_none())
            .map(|(i, p)| backend(ir, i, p)),
    );
    docs.extend(routes(ir, &gw));
    docs.extend(traffic_policies(ir));
    docs
}

/// ConfigMap (the server's config, the module pinned as built into the image), Deployment and
/// Service of `llmkube-ext-proc`.
fn server(ir: &Ir, opts: &AgentgatewayOptions, sha256: &str) -> Vec<Value> {
    let module = format!("{IMAGE_WASM_DIR}/{}", super::super::module::WASM_FILE);
    let config = ext_proc::config(ir, &module, sha256, opts);
    server_named(ir, opts, &server_name(ir), &config)
}

/// The endpoint picker's server (`resolution: endpoint` backends).
fn picker_name(ir: &Ir) -> String {
    format!("llmkube-epp-{}", router_name(ir))
}

/// ConfigMap, Deployment and Service of one `llmkube-ext-proc` named `name`.
fn server_named(ir: &Ir, opts: &AgentgatewayOptions, name: &str, config: &Value) -> Vec<Value> {
    let name = name.to_string();
    let ns = &ir.namespace;
    let config = serde_norway::to_string(config).unwrap_or_default();
    let labels =
        json!({"app.kubernetes.io/name": "llmkube-ext-proc", "app.kubernetes.io/instance": name});
    let mut cm_meta = metadata(&name, ns, ir);
    cm_meta["labels"]["app.kubernetes.io/name"] = json!("llmkube-ext-proc");
    let configmap = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": cm_meta,
        "data": {CONFIG_FILE: config},
    });
    let deployment = object(
        "apps/v1",
        "Deployment",
        metadata(&name, ns, ir),
        json!({
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{
                        "name": "ext-proc",
                        "image": opts.image,
                        "args": ["--listen", format!("0.0.0.0:{EXT_PROC_PORT}"), "--config", format!("{CONFIG_DIR}/{CONFIG_FILE}")],
                        "ports": [{"name": "grpc", "containerPort": EXT_PROC_PORT}],
                        // grpc.health.v1, served from a watchdog that runs a request through
                        // every module instance: readiness takes a stuck or draining pod out of
                        // service, liveness restarts one stuck for 30 s.
                        "readinessProbe": {"grpc": {"port": EXT_PROC_PORT}, "periodSeconds": 5, "failureThreshold": 1},
                        "livenessProbe": {"grpc": {"port": EXT_PROC_PORT}, "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 3},
                        "resources": ext_proc::resources(ir),
                        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": true}],
                    }],
                    "terminationGracePeriodSeconds": ext_proc::TERMINATION_GRACE_SECONDS,
                    "volumes": [{"name": "config", "configMap": {"name": name}}],
                },
            },
        }),
    );
    let service = object(
        "v1",
        "Service",
        metadata(&name, ns, ir),
        json!({
            "selector": labels,
            "ports": [{"name": "grpc", "port": EXT_PROC_PORT, "targetPort": EXT_PROC_PORT, "appProtocol": "kubernetes.io/h2c"}],
        }),
    );
    // agentgateway's deadline on its calls to the server (see `ext_proc::CALL_TIMEOUT`).
    let call_timeout = object(
        AGW_API,
        "AgentgatewayPolicy",
        metadata(&format!("{name}-call-timeout"), ns, ir),
        json!({
            "targetRefs": [{"group": "", "kind": "Service", "name": name}],
            "backend": {"http": {"requestTimeout": ext_proc::CALL_TIMEOUT}},
        }),
    );
    vec![configmap, deployment, service, call_timeout]
}

/// The PreRouting policy on the Gateway (and a ReferenceGrant when the server lives in another
/// namespace than the Gateway).
fn ext_proc_policy(ir: &Ir, gw: &Gateway) -> Vec<Value> {
    let name = server_name(ir);
    let mut target = json!({"group": GW_GROUP, "kind": "Gateway", "name": gw.name});
    if let Some(s) = &gw.section {
        target["sectionName"] = json!(s);
    }
    let mut backend_ref = json!({"name": name, "port": EXT_PROC_PORT});
    if gw.namespace != ir.namespace {
        backend_ref["namespace"] = json!(ir.namespace);
    }
    let mut docs = vec![object(
        AGW_API,
        "AgentgatewayPolicy",
        metadata(&name, &gw.namespace, ir),
        json!({
            "targetRefs": [target],
            "traffic": {
                "phase": "PreRouting",
                "extProc": {
                    "backendRef": backend_ref,
                    "failureMode": "FailClosed",
                    "processingOptions": k8s_processing_options(),
                },
            },
        }),
    )];
    if gw.namespace != ir.namespace {
        docs.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1beta1",
            "kind": "ReferenceGrant",
            "metadata": metadata(&name, &ir.namespace, ir),
            "spec": {
                "from": [{"group": "agentgateway.dev", "kind": "AgentgatewayPolicy", "namespace": gw.namespace}],
                "to": [{"group": "", "kind": "Service", "name": name}],
            },
        }));
    }
    docs
}

/// The standalone processing options in the CRD's spelling (`Send`, `Buffered`, ...).
fn k8s_processing_options() -> Value {
    let mut out = serde_json::Map::new();
    if let Value::Object(m) = processing_options() {
        for (k, v) in m {
            let s = v.as_str().unwrap_or_default();
            let mut c = s.chars();
            let cap = c
                .next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default();
            out.insert(k, json!(cap));
        }
    }
    Value::Object(out)
}

/// One route key's attempt order: one priority group per attempt.
fn backend(ir: &Ir, index: usize, p: &RoutePlan) -> Value {
    let groups: Vec<Value> = attempts(ir, p)
        .iter()
        .map(|a| json!({"providers": [provider(ir, a)]}))
        .collect();
    object(
        AGW_API,
        "AgentgatewayBackend",
        metadata(&backend_name(ir, index), &ir.namespace, ir),
        json!({"ai": {"groups": groups}}),
    )
}

fn provider(ir: &Ir, a: &Attempt) -> Value {
    let b = a.backend;
    let mut policies = json!({
        "http": {"requestTimeout": gateway_duration(Duration::from_millis(a.timeout_ms))},
        "health": {"eviction": {
            "duration": gateway_duration(ir.timeouts.quarantine.max(Duration::from_secs(1))),
            "consecutiveFailures": 1,
        }},
    });
    let mut v = json!({"name": b.name});
    match b.external() {
        Some(e) => {
            let kind = match e.provider {
                Provider::Anthropic => "anthropic",
                _ => "openai",
            };
            v[kind] = json!({"model": e.model});
            v["host"] = json!(e.url.host);
            v["port"] = json!(e.url.port);
            if e.url.https {
                policies["tls"] = json!({});
            }
            if let Some(c) = &e.credential {
                policies["auth"] =
                    json!({"secretRef": {"name": c.secret.name, "key": c.secret.key}});
            }
        }
        None => {
            let (host, port) = b.endpoints.first().cloned().unwrap_or_default();
            v["openai"] = served_model(ir, a);
            v["host"] = json!(host);
            v["port"] = json!(port);
        }
    }
    if b.rewrites_path() {
        v["pathPrefix"] = json!(b.path_prefix());
    }
    v["policies"] = policies;
    v
}

/// A local backend's provider settings: its served model name, when known, is the model.
fn served_model(ir: &Ir, a: &Attempt) -> Value {
    match ir.served_model(a.backend) {
        Some(m) => json!({"model": m}),
        None => json!({}),
    }
}

/// HTTPRoutes with one rule per route key, 16 rules each.
fn routes(ir: &Ir, gw: &Gateway) -> Vec<Value> {
    let rules: Vec<Value> = ir
        .routes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({
                "name": rule_name(i),
                "matches": [{"headers": [{"name": ROUTE_HEADER, "type": "Exact", "value": p.key}]}],
                "backendRefs": [match super::picked::picked_route(ir, p) {
                    Some(b) => super::picked::pool_ref(ir, b),
                    None => json!({"group": "agentgateway.dev", "kind": "AgentgatewayBackend", "name": backend_name(ir, i)}),
                }],
            })
        })
        .collect();
    let mut parent =
        json!({"group": GW_GROUP, "kind": "Gateway", "name": gw.name, "namespace": gw.namespace});
    if let Some(s) = &gw.section {
        parent["sectionName"] = json!(s);
    }
    rules
        .chunks(MAX_RULES)
        .enumerate()
        .map(|(i, chunk)| {
            let mut spec = json!({"parentRefs": [parent], "rules": chunk});
            if !gw.hostnames.is_empty() {
                spec["hostnames"] = json!(gw.hostnames);
            }
            object(
                "gateway.networking.k8s.io/v1",
                "HTTPRoute",
                metadata(&route_name(ir, i), &ir.namespace, ir),
                spec,
            )
        })
        .collect()
}

/// PostRouting policies on the rules: the internal headers removed, and retries across the
/// order (rules with the same number of attempts share one policy, 16 targets each).
fn traffic_policies(ir: &Ir) -> Vec<Value> {
    let mut groups: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    for (i, p) in ir.routes.iter().enumerate() {
        groups.entry(p.order.len()).or_default().push(json!({
            "group": GW_GROUP,
            "kind": "HTTPRoute",
            "name": route_name(ir, i / MAX_RULES),
            "sectionName": rule_name(i),
        }));
    }
    let mut docs = Vec::new();
    for (order_len, targets) in groups {
        for chunk in targets.chunks(MAX_TARGETS) {
            let mut traffic = json!({
                "phase": "PostRouting",
                "headerModifiers": {"request": {"remove": INTERNAL_HEADERS}},
            });
            if order_len > 1 {
                traffic["retry"] = json!({
                    "attempts": order_len - 1,
                    "codes": [500, 502, 503, 504],
                    "condition": RETRY_CONDITION,
                    "backoff": RETRY_BACKOFF,
                });
            }
            let name = format!("llmkube-{}-traffic-{}", router_name(ir), docs.len());
            docs.push(object(
                AGW_API,
                "AgentgatewayPolicy",
                metadata(&name, &ir.namespace, ir),
                json!({"targetRefs": chunk, "traffic": traffic}),
            ));
        }
    }
    docs
}
