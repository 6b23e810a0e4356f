//! Shadow rules: copies of each request to the order's other backends, marked
//! `x-llmkube-shadow: true`, their answers discarded (the envoy target's
//! `request_mirror_policies`).
//!
//! AIGatewayRoute rules take no filters, and Envoy Gateway's mirrors (an HTTPRoute
//! `RequestMirror` filter) would go to the whole rule's cluster, so the router's EnvoyPatchPolicy
//! adds one cluster per mirrored local backend (the envoy target's shadow cluster: its endpoints,
//! at most 4 copies in flight) and the mirror policies on the xDS routes of the shadow route keys
//! (named as in [`super::routing::rule_route_paths`]).
//!
//! Mirrors follow the route key, so a request the filter keeps off the cloud (sensitive data,
//! `failClosed`) gets a key whose order, hence whose mirrors, holds no cloud backend.
//!
//! Copies to an external backend are not sent (warned): what such a copy needs lives only in
//! the clusters Envoy AI Gateway builds for a rule's backends, where its upstream filter injects
//! the BackendSecurityPolicy's credential, translates the API and applies `modelNameOverride`
//! (the envoy target's upstream module does the rewrite and credential on its shadow cluster).
//! A patch-added cluster cannot carry a credential from a Kubernetes Secret (an EnvoyPatchPolicy
//! holds literal xDS only; the generator writes no Secret value), and without the model rewrite
//! the provider would get the client's model. Envoy AI Gateway v1.1.0 (the CRDs in
//! generator/schemas, and its source at that commit: no `mirror` anywhere in `api/` or
//! `internal/controller/`) has no mirrors on an AIGatewayRoute rule. A copy sent through one of
//! its rule clusters would also need the `x-llmkube-shadow` mark, so the filter discards the
//! answer and charges no budget for it.

use router_core::headers::SHADOW_HEADER;
use serde_json::{json, Value};

use super::names;
use super::routing::rule_route_paths;
use crate::ir::Ir;
use crate::targets::xds::{shadow_cluster_named, SHADOW_MAX_REQUESTS};
use crate::{Diagnostics, Problem};

const MIB: u64 = 1024 * 1024;

fn is_local(ir: &Ir, b: usize) -> bool {
    ir.backends[b].external().is_none()
}

/// Shadow rules mirroring to an external backend: those copies are not sent (warned).
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    for (i, r) in ir.router.spec.rules.iter().enumerate() {
        let mut external: Vec<&str> = ir
            .rule_plans(&r.name)
            .iter()
            .flat_map(|p| p.mirrors.iter().copied())
            .filter(|&b| !is_local(ir, b))
            .map(|b| ir.backends[b].name.as_str())
            .collect();
        external.sort_unstable();
        external.dedup();
        if !external.is_empty() {
            diags.warn(Problem::new(
                &ir.label,
                format!("spec.rules[{i}].route.strategy"),
                format!("shadow copies to external backend(s) {} are not sent by the envoy-gateway target: a copy needs the backend's credential, API translation and modelNameOverride, which exist only in Envoy AI Gateway's clusters for a rule's own attempts (AIGatewayRoute v1.1.0 has no mirrors, and an EnvoyPatchPolicy cannot hold a Secret's credential); copies to local backends are sent. To shadow to {}, serve it through an in-cluster OpenAI-compatible proxy holding the key (e.g. LiteLLM) declared as an inferenceServiceRef backend with tier: cloud, or use --target envoy", external.join(", "), external.join(", ")),
            ));
        }
    }
}

/// The shadow clusters of mirrored local backends and the mirror policies of each shadow
/// route key.
pub(super) fn patches(ir: &Ir, route_names: &[String], listener: &str) -> Vec<Value> {
    let buffer_limit = ir.max_body_bytes.saturating_add(MIB);
    let mut out: Vec<Value> = ir
        .shadow_targets
        .iter()
        .filter(|&&b| is_local(ir, b))
        .map(|&b| {
            let name = names::shadow_cluster(ir, &ir.backends[b].name);
            json!({
                "type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": name,
                "operation": {
                    "op": "add",
                    "path": "",
                    "value": shadow_cluster_named(&name, &ir.backends[b], SHADOW_MAX_REQUESTS, buffer_limit, ""),
                },
            })
        })
        .collect();
    for (i, p) in ir.routes.iter().enumerate() {
        let mirrors: Vec<Value> = p
            .mirrors
            .iter()
            .filter(|&&b| is_local(ir, b))
            .map(|&b| {
                json!({
                    "cluster": names::shadow_cluster(ir, &ir.backends[b].name),
                    "request_headers_mutations": [{"append": {
                        "header": {"key": SHADOW_HEADER, "value": "true"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}],
                })
            })
            .collect();
        if mirrors.is_empty() {
            continue;
        }
        out.extend(rule_route_paths(ir, route_names, &[i]).into_iter().map(|path| {
            json!({
                "type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": listener,
                "operation": {"op": "add", "jsonPath": path, "path": "/route/request_mirror_policies", "value": mirrors},
            })
        }));
    }
    out
}
