//! Loading the filter: EnvoyExtensionPolicy, the EnvoyPatchPolicy for what it cannot express,
//! and the ClientTrafficPolicy for the body limit.

use serde_json::{json, Value};

use super::names::{self, MAX_TARGET_REFS};
use super::objects::{http_route_refs, metadata, object, GatewayRef, GATEWAY_API_GROUP};
use super::options::{GatewayOptions, WasmSource};
use crate::ir::Ir;

const EG_API: &str = "gateway.envoyproxy.io/v1alpha1";
/// The root context the model-router module registers.
pub const ROOT_ID: &str = "model-router";
/// `spec.wasm[].name` (the plugin name Envoy passes to the module).
pub const WASM_NAME: &str = "llmkube-model-router";
const MIB: u64 = 1024 * 1024;

pub(super) fn documents(
    ir: &Ir,
    opts: &GatewayOptions,
    gw: &GatewayRef,
    routes: &[String],
    sha256: &str,
) -> Vec<Value> {
    let mut docs = extension_policies(ir, opts, routes, sha256);
    docs.push(patch_policy(ir, opts, gw, routes));
    docs.push(client_traffic_policy(ir, opts, gw));
    docs
}

/// The plugin config as the JSON value `spec.wasm[].config` holds; Envoy Gateway passes it to the
/// module re-serialised, and the filter reads it as the same `PluginConfig`.
pub fn plugin_config_value(ir: &Ir) -> Value {
    serde_json::to_value(super::pick::plugin_config(ir)).unwrap_or(Value::Null)
}

/// The module on the HTTPRoutes Envoy AI Gateway makes of our AIGatewayRoutes (their final
/// `route-not-found` rule included, so the filter runs on every request before a route key
/// exists). `failOpen: false`: a broken module answers 5xx instead of letting requests through
/// undecided.
fn extension_policies(
    ir: &Ir,
    opts: &GatewayOptions,
    routes: &[String],
    sha256: &str,
) -> Vec<Value> {
    let code = match &opts.wasm {
        WasmSource::Http(url) => json!({"type": "HTTP", "http": {"url": url, "sha256": sha256}}),
        WasmSource::Image(url) => json!({"type": "Image", "image": {"url": url, "sha256": sha256}}),
    };
    // One policy per 16 routes (the targetRefs limit); each loads the same module and config.
    routes
        .chunks(MAX_TARGET_REFS)
        .enumerate()
        .map(|(i, chunk)| {
            let refs = http_route_refs(chunk);
            object(
                EG_API,
                "EnvoyExtensionPolicy",
                metadata(&extension_policy_name(ir, i), &ir.namespace, ir),
                json!({
                    "targetRefs": refs,
                    "wasm": [{
                        "name": WASM_NAME,
                        "rootID": ROOT_ID,
                        "code": code,
                        "config": plugin_config_value(ir),
                        "failOpen": false,
                    }],
                }),
            )
        })
        .collect()
}

fn extension_policy_name(ir: &Ir, i: usize) -> String {
    names::policy_part(ir, i)
}

/// JSON patches on the xDS Envoy Gateway generates, each for a setting the typed policies lack:
/// - `allow_on_headers_stop_iteration: true` on our wasm filter(s): the filter pauses in the
///   request headers to read the body and stamps the route key afterwards; without it Envoy never
///   calls the body callback and the request hangs;
/// - `include_attempt_count_in_response` on the virtual hosts: the filter reads the attempt count
///   of the response (`x-envoy-attempt-count`) for its failover accounting, as in the envoy target;
/// - the shared budget ledger's cluster, when budgets are kept by `llmkube-budgets`
///   ([`super::budgets`]);
/// - no `retry_on` on one-backend routes ([`super::routing::retry_on_patches`]);
/// - the client's `authorization` removed on every route ([`super::routing::authorization_patches`]);
/// - the `ORIGINAL_DST` cluster of each backend whose pods the filter picks, and its rules'
///   routes pointed at it ([`super::pick`]);
/// - shadow clusters and mirror policies ([`super::shadow`]);
/// - the quarantine fields the BackendTrafficPolicy lacks, on every rule cluster
///   ([`super::quarantine`]).
fn patch_policy(ir: &Ir, opts: &GatewayOptions, gw: &GatewayRef, routes: &[String]) -> Value {
    let listener = names::xds_listener(&gw.namespace, &gw.name, &opts.listener);
    let policies = ir.routes.len().div_ceil(super::names::MAX_RULES_PER_ROUTE);
    let policies = policies.div_ceil(MAX_TARGET_REFS).max(1);
    let mut patches: Vec<Value> = (0..policies)
        .map(|i| {
            let filter = names::wasm_filter(&ir.namespace, &extension_policy_name(ir, i), 0);
            json!({
                "type": "type.googleapis.com/envoy.config.listener.v3.Listener",
                "name": listener,
                "operation": {
                    "op": "add",
                    "jsonPath": format!("..http_filters[?(@.name=='{filter}')].typed_config.config"),
                    "path": "/allow_on_headers_stop_iteration",
                    "value": true,
                },
            })
        })
        .collect();
    patches.extend(super::security::local_reply_patch(ir, &listener));
    patches.extend(super::budgets::cluster_patch(ir, opts.budgets.as_ref()));
    patches.extend(super::routing::retry_on_patches(ir, routes, &listener));
    patches.extend(super::routing::authorization_patches(ir, routes, &listener));
    patches.extend(super::pick::patches(ir, routes, &listener));
    patches.extend(super::shadow::patches(ir, routes, &listener));
    patches.extend(super::quarantine::patches(ir, routes));
    patches.push(json!({
        "type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "name": listener,
        "operation": {
            "op": "add",
            "jsonPath": "$.virtual_hosts[*]",
            "path": "/include_attempt_count_in_response",
            "value": true,
        },
    }));
    object(
        EG_API,
        "EnvoyPatchPolicy",
        metadata(&names::policy(ir), &gw.namespace, ir),
        json!({
            "targetRef": {"group": GATEWAY_API_GROUP, "kind": "Gateway", "name": gw.name},
            "type": "JSONPatch",
            "jsonPatches": patches,
        }),
    )
}

/// The listener's per-connection buffer at the filter's body limit plus headroom (as the envoy
/// target's `per_connection_buffer_limit_bytes`): Envoy Gateway's default of 32 KiB would answer
/// 413 to bodies the filter accepts.
fn client_traffic_policy(ir: &Ir, opts: &GatewayOptions, gw: &GatewayRef) -> Value {
    let limit = ir.max_body_bytes.saturating_add(MIB);
    object(
        EG_API,
        "ClientTrafficPolicy",
        metadata(&names::policy(ir), &gw.namespace, ir),
        json!({
            "targetRefs": [{"group": GATEWAY_API_GROUP, "kind": "Gateway", "name": gw.name, "sectionName": opts.listener}],
            "connection": {"bufferLimit": limit},
        }),
    )
}
