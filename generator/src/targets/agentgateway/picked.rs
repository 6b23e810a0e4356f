//! `resolution: endpoint` backends on agentgateway: the pod is picked by a second
//! `llmkube-ext-proc`, in endpoint-picker mode, called through agentgateway's own
//! `inferenceRouting` backend policy (docs/agentgateway.md has the source references).
//!
//! agentgateway v1.3.1 takes `x-gateway-destination-endpoint` only from an `inferenceRouting`
//! endpoint picker, and only on a `service` route backend (`build_simple_backend_call`: the
//! override reaches `build_service_call` alone). So a route key whose attempt order is one
//! picked backend gets a `service` backend with that policy instead of an AI backend:
//!
//! - standalone: a top-level `services` entry per picked backend (the logical Service, no
//!   endpoints) and `destinationMode: passthrough`; the picker names only the pods the plugin
//!   config lists, so passthrough never trusts an address from outside that set;
//! - kubernetes: an `InferencePool` (pods of the InferenceService by its
//!   `inference.llmkube.dev/service` label) whose `endpointPickerRef` is the picker's Service,
//!   `FailClose`; agentgateway's controller lowers it to the same policy, validated against the
//!   pool's endpoints.
//!
//! The picker runs the very module and plugin config of the gateway-level server: it takes the
//! same decision and picks with the same rules (prefix, load, sessions, quarantine).
//!
//! Refused: a picked backend with anything else in the same attempt order (failover across a
//! picked backend): the policy belongs to one service backend, while agentgateway's failover
//! across backends is the AI backend's priority groups, which hold providers, not a service
//! with an endpoint picker. And a picked backend whose URL path the router rewrites: only the AI
//! backend's provider rewrites paths.

use serde_json::{json, Value};

use super::ext_proc;
use super::options::{host_port, AgentgatewayOptions};
use crate::ir::{Backend, BackendKind, Ir, RoutePlan};
use crate::model::Resolution;
use crate::{Diagnostics, Problem};

/// The pod label LLMKube's controller puts on an InferenceService's pods.
pub const POD_LABEL: &str = "inference.llmkube.dev/service";

/// A `resolution: endpoint` backend (picked with `balancing.mode: LoadAware`; anything else is
/// refused, see [`refusals`]).
pub fn is_picked(b: &Backend) -> bool {
    matches!(
        b.kind,
        BackendKind::Service {
            resolution: Resolution::Endpoint,
            ..
        }
    )
}

/// The picked backend a route key goes to, when its order is that backend alone.
pub(super) fn picked_route<'a>(ir: &'a Ir, p: &RoutePlan) -> Option<&'a Backend> {
    match p.order.as_slice() {
        [b] => ir.backends.get(*b).filter(|b| is_picked(b)),
        _ => None,
    }
}

pub(super) fn any_picked(ir: &Ir) -> bool {
    picked_backends(ir).next().is_some()
}

fn picked_backends(ir: &Ir) -> impl Iterator<Item = &Backend> {
    ir.backends.iter().filter(|b| is_picked(b))
}

/// Where the picker listens: the `--ext-proc` host, the next port.
pub(super) fn picker_addr(opts: &AgentgatewayOptions) -> (String, u16) {
    let (host, port) = &opts.ext_proc;
    (host.clone(), port.saturating_add(1))
}

fn service_of(b: &Backend) -> (&str, u16) {
    match &b.kind {
        BackendKind::Service { service, port, .. } => (service.as_str(), *port),
        BackendKind::External(_) => ("", 0),
    }
}

/// What the picked backends need and agentgateway cannot give.
pub(super) fn refusals(ir: &Ir, diags: &mut Diagnostics) {
    for (i, b) in ir.backends.iter().enumerate() {
        if !is_picked(b) {
            continue;
        }
        if !crate::ir::picks::is_picked(ir, i) {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.backends[{i}].balancing.mode"),
                format!("{:?} has resolution: endpoint without balancing.mode LoadAware: agentgateway v1.3.1 spreads a service's pods only by its own discovery, which a standalone config does not have; set balancing.mode: LoadAware (the endpoint picker then picks the pod) or use resolution: service", b.name),
            ));
        }
        if b.rewrites_path() {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.backends[{i}]"),
                format!("{:?} has its pods picked (resolution: endpoint) and a path rewrite: agentgateway v1.3.1 rewrites paths only for AI backends, and picks pods only for service backends", b.name),
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in &ir.routes {
        if p.order.len() < 2 {
            continue;
        }
        for &b in &p.order {
            let Some(backend) = ir.backends.get(b).filter(|x| is_picked(x)) else {
                continue;
            };
            if !seen.insert(b) {
                continue;
            }
            let field = match &p.rule {
                Some(r) => format!(
                    "spec.rules[{}].route.backends",
                    ir.router
                        .spec
                        .rules
                        .iter()
                        .position(|x| &x.name == r)
                        .unwrap_or(0)
                ),
                None => "spec.defaultRoute".to_string(),
            };
            diags.error(Problem::new(
                &ir.label,
                field,
                format!("failover across {:?}, whose pods are picked (resolution: endpoint), is not served by the agentgateway target: agentgateway v1.3.1 picks pods only through an inferenceRouting policy on one service backend, and fails over only between the providers of an AI backend; route to {:?} alone, or use resolution: service", backend.name, backend.name),
            ));
        }
    }
}

/// Top-level `services` of the standalone config: the logical Service of each picked backend
/// (agentgateway requires one for a `service` backend; passthrough needs no endpoints).
pub(super) fn standalone_services(ir: &Ir) -> Vec<Value> {
    picked_backends(ir)
        .map(|b| {
            let (svc, port) = service_of(b);
            json!({
                "name": svc,
                "namespace": ir.namespace,
                "hostname": hostname(ir, svc),
                "vips": [],
                "ports": {port.to_string(): port},
            })
        })
        .collect()
}

fn hostname(ir: &Ir, svc: &str) -> String {
    format!("{svc}.{}.svc.cluster.local", ir.namespace)
}

/// The standalone route backend: the service, its pod picked by the picker.
pub(super) fn standalone_backend(ir: &Ir, b: &Backend, opts: &AgentgatewayOptions) -> Value {
    let (svc, port) = service_of(b);
    let (host, picker_port) = picker_addr(opts);
    json!({
        "service": {"name": format!("{}/{}", ir.namespace, hostname(ir, svc)), "port": port},
        "policies": {"inferenceRouting": {
            "endpointPicker": {"host": host_port(&host, picker_port)},
            "destinationMode": "passthrough",
        }},
    })
}

/// `endpoint-picker.yaml`: the gateway-level server's config in endpoint-picker mode, its plugin
/// config carrying each picked backend's pods and balancing (as the envoy target embeds it).
/// The gateway-level server gets no pods: it only routes, so a request is picked once.
///
/// Engine gauges are not scraped here: the scrape goes through the backend's cluster with the pod
/// named in the destination header (Envoy's ORIGINAL_DST), and a callout of `llmkube-ext-proc`
/// goes to one fixed address; the picker weighs its own in-flight counts instead.
///
/// Budgets are the gateway-level server's alone: a picker that also held and settled them would
/// charge every picked request twice.
pub(super) fn picker_config(
    ir: &Ir,
    module_path: &str,
    sha256: &str,
    opts: &AgentgatewayOptions,
) -> Value {
    let mut cfg = ext_proc::config(ir, module_path, sha256, opts);
    let mut plugin: Value =
        serde_json::from_str(&crate::ir::picks::plugin_json(ir)).unwrap_or(Value::Null);
    if let Some(backends) = plugin["backends"].as_array_mut() {
        for b in backends {
            if let Some(pick) = b.get_mut("pick").and_then(Value::as_object_mut) {
                pick.remove("scrape_cluster");
                pick.remove("scrape_ms");
            }
        }
    }
    if let Some(p) = plugin.as_object_mut() {
        p.remove("budgets");
    }
    if !plugin.is_null() {
        cfg["plugin_config"] = plugin;
    }
    cfg["endpoint_picker"] = json!({});
    cfg
}

/// The InferencePool's name for backend `b`.
pub(super) fn pool_name(ir: &Ir, b: &Backend) -> String {
    format!(
        "llmkube-{}-{}",
        ir.router.metadata.name.clone().unwrap_or_default(),
        b.name
    )
}

/// One InferencePool per picked backend, its endpoint picker the picker Service `picker`.
pub(super) fn pools(
    ir: &Ir,
    picker: &str,
    picker_port: u16,
    metadata: impl Fn(&str) -> Value,
) -> Vec<Value> {
    picked_backends(ir)
        .map(|b| {
            let (svc, port) = service_of(b);
            json!({
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": metadata(&pool_name(ir, b)),
                "spec": {
                    "selector": {"matchLabels": {POD_LABEL: svc}},
                    "targetPorts": [{"number": port}],
                    "endpointPickerRef": {
                        "name": picker,
                        "port": {"number": picker_port},
                        "failureMode": "FailClose",
                    },
                },
            })
        })
        .collect()
}

/// The HTTPRoute backendRef of a picked route key.
pub(super) fn pool_ref(ir: &Ir, b: &Backend) -> Value {
    json!({"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool_name(ir, b)})
}
