//! The quarantine on Envoy Gateway: what its BackendTrafficPolicy cannot express, patched onto
//! the clusters it generates for the AIGatewayRoute rules.
//!
//! The policy's `healthCheck` gives each rule cluster outlier detection and a TCP health check
//! ([`super::routing`]), but has no field for `successful_active_health_check_uneject_host`
//! (Envoy's default, `true`, lets the next passing 1 s check end a 5xx ejection), the health
//! check's `unhealthy_interval` (a backend whose connection was refused would be back at the
//! next 1 s check), `no_traffic_interval`, a maximum ejection time, or the switches that keep
//! statistical and local-origin ejection off. The router's EnvoyPatchPolicy adds each of those
//! ([`crate::targets::quarantine`], the values the envoy target writes) to every rule cluster,
//! so a quarantine lasts `proxy.quarantineDuration` however often the health check passes.
//!
//! Envoy Gateway applies EnvoyPatchPolicies before Envoy AI Gateway's extension server sees the
//! clusters (`internal/xds/translator/translator.go`: `processJSONPatches`, then
//! `processExtensionPostTranslationHook`), and that server edits them in place (endpoint
//! metadata and priorities, upstream filters: `internal/extensionserver/post_translate_modify.go`
//! `maybeModifyCluster`), leaving outlier detection and health checks as patched.
//!
//! Cluster names are in [`super::names`]: one cluster per rule, or one per backend of a rule
//! whose backends mix IP-address and host-name endpoints. Such a rule is warned about: Envoy
//! Gateway then splits its requests between the backends by weight instead of trying them in
//! order. A backend whose own endpoints mix the two is refused (Envoy Gateway rejects that
//! Backend). Rules of a backend whose pods the filter picks send to the `ORIGINAL_DST` cluster
//! of [`super::pick`] (no outlier detection: the filter quarantines pods itself), so their rule
//! clusters are left alone.

use std::net::IpAddr;

use serde_json::{json, Value};

use super::names::{self, MAX_RULES_PER_ROUTE};
use crate::duration::envoy_duration;
use crate::ir::picks::is_picked;
use crate::ir::{Ir, RoutePlan};
use crate::targets::quarantine as q;
use crate::{Diagnostics, Problem};

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// How Envoy Gateway classifies a Backend's endpoints (`internal/gatewayapi/route.go`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Addresses {
    Ip,
    HostName,
    Mixed,
}

fn addresses(ir: &Ir, b: usize) -> Addresses {
    let ip = |h: &String| h.parse::<IpAddr>().is_ok();
    let eps = &ir.backends[b].endpoints;
    if eps.iter().all(|(h, _)| ip(h)) {
        Addresses::Ip
    } else if eps.iter().any(|(h, _)| ip(h)) {
        Addresses::Mixed
    } else {
        Addresses::HostName
    }
}

/// Whether Envoy Gateway gives each backend of this rule its own cluster
/// (`RouteDestination.HasMixedEndpoints`: a host-name backend beside another kind).
fn cluster_per_backend(ir: &Ir, p: &RoutePlan) -> bool {
    let kinds: Vec<Addresses> = p.order.iter().map(|&b| addresses(ir, b)).collect();
    kinds.contains(&Addresses::Mixed)
        || (kinds.contains(&Addresses::HostName) && kinds.contains(&Addresses::Ip))
}

/// The field a route plan comes from.
fn plan_field(ir: &Ir, p: &RoutePlan) -> String {
    let index = p
        .rule
        .as_deref()
        .and_then(|r| ir.router.spec.rules.iter().position(|x| x.name == r));
    match index {
        Some(i) => format!("spec.rules[{i}].route.backends"),
        None => "spec.defaultRoute".to_string(),
    }
}

/// A backend whose endpoints mix IP addresses and host names is refused; an order mixing
/// IP-address and host-name backends is warned about, once per rule.
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    for b in 0..ir.backends.len() {
        if addresses(ir, b) == Addresses::Mixed {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.backends[{b}]"),
                format!("the endpoints of backend {} mix IP addresses and host names; Envoy Gateway refuses such a Backend (\"mixed FQDN and IP or Unix address type for the same backendRef is not supported\"): resolve them all to addresses (--resolve / --endpoints) or none", ir.backends[b].name),
            ));
        }
    }
    let mut warned: Vec<String> = Vec::new();
    for p in &ir.routes {
        if !cluster_per_backend(ir, p)
            || p.order
                .iter()
                .any(|&b| addresses(ir, b) == Addresses::Mixed)
        {
            continue;
        }
        let field = plan_field(ir, p);
        if warned.contains(&field) {
            continue;
        }
        warned.push(field.clone());
        let describe = |kind: Addresses| -> String {
            p.order
                .iter()
                .filter(|&&b| addresses(ir, b) == kind)
                .map(|&b| ir.backends[b].name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let order: Vec<&str> = p
            .order
            .iter()
            .map(|&b| ir.backends[b].name.as_str())
            .collect();
        diags.warn(Problem::new(
            &ir.label,
            &field,
            format!("the attempt order {} (route {:?}) mixes backends reached by IP address ({}) and by host name ({}); Envoy Gateway then gives each backend its own cluster (httproute/<ns>/<route>/rule/<i>/backend/<j>, which the quarantine patches address) and sends each request to one of them by weight, with retries in that cluster only, so this order does not fail over from one backend to the next: reach all of them by host name (drop --resolve / --endpoints for the local ones) or all by IP address", order.join(" → "), p.key, describe(Addresses::Ip), describe(Addresses::HostName)),
        ));
    }
}

/// The clusters Envoy Gateway generates for route plan `i` (rule `i % 15` of AIGatewayRoute
/// `i / 15`), none for a picked backend's rules.
fn rule_clusters(ir: &Ir, route_names: &[String], i: usize) -> Vec<String> {
    let p = &ir.routes[i];
    let Some(route) = route_names.get(i / MAX_RULES_PER_ROUTE) else {
        return Vec::new();
    };
    if p.order.iter().any(|&b| is_picked(ir, b)) {
        return Vec::new();
    }
    let rule = i % MAX_RULES_PER_ROUTE;
    if cluster_per_backend(ir, p) {
        (0..p.order.len())
            .map(|j| names::rule_backend_cluster(&ir.namespace, route, rule, j))
            .collect()
    } else {
        vec![names::rule_cluster(&ir.namespace, route, rule)]
    }
}

/// `add` patches of every quarantine field the BackendTrafficPolicy lacks (with
/// [`q::UPDATE_MERGE_WINDOW`]), on every rule
/// cluster (one operation per field: the fields Envoy Gateway writes itself, e.g. health-check
/// logging from the EnvoyProxy, stay).
pub(super) fn patches(ir: &Ir, route_names: &[String]) -> Vec<Value> {
    let quarantine = envoy_duration(ir.timeouts.quarantine);
    let od = q::untyped_outlier_detection(&quarantine);
    let hc = q::untyped_health_check(&quarantine);
    // The BackendTrafficPolicy's panic threshold makes Envoy Gateway write `common_lb_config`.
    let merge_window = Value::from(q::UPDATE_MERGE_WINDOW);
    let fields: Vec<(String, &Value)> = od
        .iter()
        .map(|(k, v)| (format!("/outlier_detection/{k}"), v))
        .chain(hc.iter().map(|(k, v)| (format!("/health_checks/0/{k}"), v)))
        .chain(std::iter::once((
            "/common_lb_config/update_merge_window".to_string(),
            &merge_window,
        )))
        .collect();
    (0..ir.routes.len())
        .flat_map(|i| rule_clusters(ir, route_names, i))
        .flat_map(|cluster| {
            fields.iter().map(move |(path, value)| {
                json!({
                    "type": CLUSTER,
                    "name": cluster,
                    "operation": {"op": "add", "path": path, "value": value},
                })
            })
        })
        .collect()
}
