//! Endpoint picking (`resolution: endpoint` with `balancing.mode: LoadAware`): the filter names
//! the pod in `x-gateway-destination-endpoint`, and an `ORIGINAL_DST` cluster on that header
//! sends the request there, as in the envoy target (docs/endpoint-picking.md).
//!
//! Why an EnvoyPatchPolicy-added cluster and not an InferencePool: Envoy AI Gateway turns an
//! InferencePool backendRef into an `ext_proc` filter calling the pool's endpoint picker over
//! gRPC with `failure_mode_allow: false` (envoyproxy/ai-gateway
//! `internal/extensionserver/inferencepool.go`, `buildHTTPFilterForInferencePool`), which would
//! need an endpoint-picker service running beside our filter, and would set the same header
//! itself (two pickers, one header); its rule cannot hold other backends either. Here the
//! filter is the picker, so the Gateway only needs the `ORIGINAL_DST` cluster: the router's
//! EnvoyPatchPolicy adds it whole (`op: add`, empty `path`) and points the xDS routes of the
//! rules whose attempt order is that one backend at it (`replace /route/cluster`; Envoy Gateway
//! writes a single-backend rule's action as `cluster: httproute/<ns>/<route>/rule/<i>`,
//! `internal/xds/translator/route.go` `buildXdsRouteAction`).
//!
//! A client's header never picks the pod: the filter removes `x-gateway-destination-endpoint`
//! from every request and sets it only for its own pick (Envoy Gateway and Envoy AI Gateway do
//! not strip it; with their endpoint-picker wiring the picker's `ext_proc` overwrites it).
//!
//! An order mixing a picked backend with others is refused: Envoy Gateway gives a rule one
//! cluster, and the envoy target's way across (an aggregate over `via-<b>` clusters into one
//! internal listener per backend; a plain aggregate would skip an `ORIGINAL_DST` member that has
//! no hosts yet) is not expressible here: Envoy Gateway's bootstrap
//! (`internal/xds/bootstrap/bootstrap.yaml.tpl`) does not load `envoy.bootstrap.internal_listener`,
//! which internal listeners need (only an EnvoyProxy `spec.bootstrap` override on the user's
//! Gateway could add it), and a hop's route would go to a patch-added cluster, bypassing the
//! clusters Envoy AI Gateway builds for the order's other backends (their credentials, API
//! translation and `modelNameOverride` run in its upstream filter there).

use router_core::config::PluginConfig;
use serde_json::{json, Value};

use super::names;
use super::routing::rule_route_paths;
use crate::ir::picks::{is_picked, plugin_with_picks};
use crate::ir::Ir;
use crate::targets::xds::original_dst_cluster_named;
use crate::{Diagnostics, Problem};

const MIB: u64 = 1024 * 1024;

/// The plugin config the EnvoyExtensionPolicy loads: pods and balancing of picked backends,
/// their metrics scraped through their `ORIGINAL_DST` cluster.
pub(super) fn plugin_config(ir: &Ir) -> PluginConfig {
    plugin_with_picks(ir, &|b| names::pick_cluster(ir, b))
}

/// Orders holding a picked backend among others are refused (see the module comment), naming
/// the backend, the order, and what the user can change.
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    for p in &ir.routes {
        let picked = p.order.iter().find(|&&b| is_picked(ir, b));
        let Some(&b) = picked.filter(|_| p.order.len() > 1) else {
            continue;
        };
        let rule = p.rule.as_deref().unwrap_or("");
        let index = ir.router.spec.rules.iter().position(|r| r.name == rule);
        let field = index.map_or("spec.defaultRoute".to_string(), |i| {
            format!("spec.rules[{i}].route.backends")
        });
        let name = &ir.backends[b].name;
        let order: Vec<&str> = p
            .order
            .iter()
            .map(|&o| ir.backends[o].name.as_str())
            .collect();
        diags.error(Problem::new(
            &ir.label,
            &field,
            format!("backend {name} has its pods picked by the gateway (spec.backends[{b}]: resolution: endpoint, balancing.mode: LoadAware) and shares the attempt order {} (route {:?}) with other backends; on Envoy Gateway a rule sends to one cluster, and failing over from the picked pod's ORIGINAL_DST cluster to another backend needs the envoy target's per-attempt internal listeners, which Envoy Gateway's bootstrap does not enable: make {name} the only backend of {field}, or set spec.backends[{b}].balancing.mode: RoundRobin (its pods then balanced by Envoy Gateway, with failover), or use --target envoy", order.join(" → "), p.key),
        ));
    }
}

/// Per picked backend: the patch adding its `ORIGINAL_DST` cluster, and those pointing the
/// xDS routes of its one-backend rules at it.
pub(super) fn patches(ir: &Ir, route_names: &[String], listener: &str) -> Vec<Value> {
    let buffer_limit = ir.max_body_bytes.saturating_add(MIB);
    let mut out = Vec::new();
    for (i, b) in ir.backends.iter().enumerate() {
        if !is_picked(ir, i) {
            continue;
        }
        let cluster = names::pick_cluster(ir, &b.name);
        out.push(json!({
            "type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": cluster,
            "operation": {
                "op": "add",
                "path": "",
                "value": original_dst_cluster_named(&cluster, ir, i, buffer_limit),
            },
        }));
        let plans: Vec<usize> = (0..ir.routes.len())
            .filter(|&r| ir.routes[r].order == [i])
            .collect();
        out.extend(rule_route_paths(ir, route_names, &plans).into_iter().map(|path| {
            json!({
                "type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": listener,
                "operation": {"op": "replace", "jsonPath": path, "path": "/route/cluster", "value": cluster},
            })
        }));
    }
    out
}
