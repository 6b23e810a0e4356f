//! What every document of this target is made of: the object envelope, its metadata, the
//! Gateway the router is served by and references to the generated routes.

use serde_json::{json, Value};

use super::names;
use crate::ir::Ir;

pub(super) const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";

/// The Gateway the router is served by.
pub struct GatewayRef {
    pub name: String,
    pub namespace: String,
}

pub(super) fn gateway(ir: &Ir) -> GatewayRef {
    let g = ir.router.spec.gateway_ref.as_ref();
    GatewayRef {
        name: g.map(|g| g.name.clone()).unwrap_or_default(),
        namespace: g
            .and_then(|g| g.namespace.clone())
            .unwrap_or_else(|| ir.namespace.clone()),
    }
}

/// `metadata` of a generated object.
pub(super) fn metadata(name: &str, namespace: &str, ir: &Ir) -> Value {
    json!({
        "name": name,
        "namespace": namespace,
        "labels": {"app.kubernetes.io/managed-by": names::MANAGED_BY},
        "annotations": {"llmkube.dev/model-router": ir.key},
    })
}

pub(super) fn object(api_version: &str, kind: &str, metadata: Value, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
}

/// `targetRefs` naming these HTTPRoutes (at most [`names::MAX_TARGET_REFS`] per policy).
pub(super) fn http_route_refs(routes: &[String]) -> Vec<Value> {
    routes
        .iter()
        .map(|r| json!({"group": GATEWAY_API_GROUP, "kind": "HTTPRoute", "name": r}))
        .collect()
}
