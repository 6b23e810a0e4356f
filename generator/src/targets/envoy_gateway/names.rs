//! Names of the generated objects, and the xDS names Envoy Gateway gives what they turn into
//! (read from its translator, envoyproxy/gateway at the commit the CRDs in generator/schemas come
//! from, with the default xDS name scheme, `XDSNameSchemeV2` off):
//! - an HTTP listener is named `<gateway namespace>/<gateway name>/<listener name>`
//!   (`internal/gatewayapi/helpers.go` `irListenerName`; `internal/xds/translator/listener.go`
//!   `xdsListenerName`), and its route configuration has the same name (`routeConfigName`);
//! - the `i`-th `spec.wasm[]` entry of EnvoyExtensionPolicy `<ns>/<name>` becomes the HTTP filter
//!   `envoy.filters.http.wasm/envoyextensionpolicy/<ns>/<name>/wasm/<i>`
//!   (`irConfigNameForWasm`, `wasm.go` `wasmFilterName`), added to the listener's HCM disabled
//!   and enabled per route;
//! - Envoy AI Gateway turns an AIGatewayRoute into an HTTPRoute of the same name and namespace
//!   (`internal/controller/ai_gateway_route.go`), its rules in order plus a final
//!   `route-not-found` rule matching every path.
//! - match `j` of rule `i` of HTTPRoute `<ns>/<name>` becomes the xDS route
//!   `httproute/<ns>/<name>/rule/<i>/match/<j>/<hostname with dots as underscores>`
//!   (`internal/gatewayapi/helpers.go` `irRouteName`, `route.go`), routed to the cluster
//!   `httproute/<ns>/<name>/rule/<i>` (`irRouteDestinationName`);
//! - an EnvoyPatchPolicy JSON patch with `op: add` and an empty `path` adds a whole xDS resource
//!   (`internal/xds/translator/jsonpatch.go`); the clusters added that way are named here
//!   `llmkube-<purpose>/<router ns>/<router>[/<backend>]`, which no Envoy Gateway name starts with.

use crate::ir::Ir;

pub const MANAGED_BY: &str = "llmkube-gen";
/// Envoy AI Gateway's limit of rules per AIGatewayRoute (CRD `maxItems`).
pub const MAX_RULES_PER_ROUTE: usize = 15;
/// Envoy Gateway's limit of targetRefs per policy (CRD `maxItems`).
pub const MAX_TARGET_REFS: usize = 16;

fn router_name(ir: &Ir) -> &str {
    ir.router.metadata.name.as_deref().unwrap_or("")
}

/// The EnvoyExtensionPolicy, EnvoyPatchPolicy and ClientTrafficPolicy of the router.
pub fn policy(ir: &Ir) -> String {
    format!("llmkube-{}", router_name(ir))
}

/// The `i`-th of the router's policies of one kind when their targets span several (16 routes
/// each): the first is [`policy`].
pub fn policy_part(ir: &Ir, i: usize) -> String {
    match i {
        0 => policy(ir),
        _ => format!("{}-{i}", policy(ir)),
    }
}

/// The `i`-th AIGatewayRoute (and the HTTPRoute Envoy AI Gateway makes of it).
pub fn route(ir: &Ir, i: usize) -> String {
    format!("llmkube-{}-{i}", router_name(ir))
}

/// The `i`-th BackendTrafficPolicy (rules with the same retry and timeout settings share one).
pub fn traffic_policy(ir: &Ir, i: usize) -> String {
    format!("llmkube-{}-traffic-{i}", router_name(ir))
}

/// The AIServiceBackend, Backend and BackendSecurityPolicy of a backend.
pub fn backend(ir: &Ir, backend: &str) -> String {
    format!("llmkube-{}-{backend}", router_name(ir))
}

/// The name of the AIGatewayRoute rule of route plan `index`: route keys (`rule/b1,b2`, `~/b`)
/// are not valid rule names, so rules are numbered; the key is in the rule's header match.
pub fn rule(index: usize, rule: Option<&str>) -> String {
    format!("r{index}-{}", rule.unwrap_or("default"))
}

/// The xDS listener (and route configuration) of the Gateway listener `section`.
pub fn xds_listener(gateway_namespace: &str, gateway: &str, section: &str) -> String {
    format!("{gateway_namespace}/{gateway}/{section}")
}

/// The cluster Envoy Gateway makes of rule `rule` of HTTPRoute `namespace/route`.
pub fn rule_cluster(namespace: &str, route: &str, rule: usize) -> String {
    format!("httproute/{namespace}/{route}/rule/{rule}")
}

/// The cluster of the `backend`-th backendRef of that rule when each backend gets its own.
pub fn rule_backend_cluster(namespace: &str, route: &str, rule: usize, backend: usize) -> String {
    format!("{}/backend/{backend}", rule_cluster(namespace, route, rule))
}

/// The HTTP filter Envoy Gateway makes of `spec.wasm[index]` of EnvoyExtensionPolicy `ns/name`.
pub fn wasm_filter(namespace: &str, policy: &str, index: usize) -> String {
    format!("envoy.filters.http.wasm/envoyextensionpolicy/{namespace}/{policy}/wasm/{index}")
}

/// The Envoy cluster of the router's shared budget ledger, added by its EnvoyPatchPolicy (Envoy
/// Gateway's own cluster names contain `/` too, but never start with `llmkube-`).
pub fn budgets_cluster(ir: &Ir) -> String {
    format!("llmkube-budgets/{}/{}", ir.namespace, router_name(ir))
}

/// The Deployment and Service of `llmkube-budgets` the generator emits for the router.
pub fn budgets_service(ir: &Ir) -> String {
    format!("llmkube-{}-budgets", router_name(ir))
}

/// The `ORIGINAL_DST` cluster of a backend whose pods the filter picks, added by the router's
/// EnvoyPatchPolicy.
pub fn pick_cluster(ir: &Ir, backend: &str) -> String {
    format!(
        "llmkube-pick/{}/{}/{backend}",
        ir.namespace,
        router_name(ir)
    )
}

/// The cluster shadow copies to a local backend go to, added by the router's EnvoyPatchPolicy.
pub fn shadow_cluster(ir: &Ir, backend: &str) -> String {
    format!(
        "llmkube-shadow/{}/{}/{backend}",
        ir.namespace,
        router_name(ir)
    )
}
