//! `policy.auth.jwt` on Envoy Gateway: a SecurityPolicy with one JWT provider on the router's
//! HTTPRoutes (every rule of them, the final `route-not-found` included, so no request of the
//! router is served unauthenticated). Envoy Gateway puts `jwt_authn` before the wasm filters;
//! the verified `teamClaim` is copied into the team header (`claimToHeaders`, which replaces a
//! value the client sent: see the envoy target's tests), and the allowlists are the filter's,
//! from the same plugin config the EnvoyExtensionPolicy loads.
//!
//! `jwt_authn`'s 401 is plain text; the listener's `local_reply_config` (an EnvoyPatchPolicy
//! patch, like the envoy target's) gives it our JSON error shape.

use serde_json::{json, Value};

use super::names::{self, MAX_TARGET_REFS};
use super::objects::{http_route_refs, metadata, object};
use crate::auth::JwtPolicy;
use crate::ir::Ir;
use crate::{Diagnostics, Problem};

const EG_API: &str = "gateway.envoyproxy.io/v1alpha1";
/// Envoy Gateway's length limit on `issuer` and `remoteJWKS.uri`.
const MAX_FIELD: usize = 253;

/// One SecurityPolicy per 16 HTTPRoutes (the targetRefs limit), each with the same provider.
pub(super) fn documents(ir: &Ir, routes: &[String]) -> Vec<Value> {
    let Some(p) = crate::auth::jwt(&ir.router.spec) else {
        return Vec::new();
    };
    let provider = provider(&p);
    routes
        .chunks(MAX_TARGET_REFS)
        .enumerate()
        .map(|(i, chunk)| {
            object(
                EG_API,
                "SecurityPolicy",
                metadata(&names::policy_part(ir, i), &ir.namespace, ir),
                json!({"targetRefs": http_route_refs(chunk), "jwt": {"providers": [provider.clone()]}}),
            )
        })
        .collect()
}

fn provider(p: &JwtPolicy) -> Value {
    let jwt = p.jwt;
    json!({
        "name": jwt.provider,
        "issuer": jwt.issuer,
        "remoteJWKS": {"uri": jwt.jwks_uri},
        "claimToHeaders": [{"header": p.team_header, "claim": jwt.team_claim}],
    })
}

/// What Envoy Gateway's SecurityPolicy cannot take: a JWKS over plain HTTP (it fetches `uri`
/// over HTTPS with the system trust bundle) and values over its length limits.
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    let Some(p) = crate::auth::jwt(&ir.router.spec) else {
        return;
    };
    if p.jwks.as_ref().is_some_and(|u| !u.https) {
        diags.error(Problem::new(
            &ir.label,
            "spec.policy.auth.jwt.jwksURI",
            "the envoy-gateway target fetches the JWKS over HTTPS only (SecurityPolicy remoteJWKS.uri); use an https:// URL",
        ));
    }
    for (field, v) in [
        ("issuer", &p.jwt.issuer),
        ("jwksURI", &p.jwt.jwks_uri),
        ("provider", &p.jwt.provider),
    ] {
        if v.len() > MAX_FIELD {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.policy.auth.jwt.{field}"),
                format!(
                    "is {} characters; Envoy Gateway takes at most {MAX_FIELD}",
                    v.len()
                ),
            ));
        }
    }
}

/// The EnvoyPatchPolicy patch giving `jwt_authn`'s 401 our error shape, on the listener's
/// http_connection_manager.
pub(super) fn local_reply_patch(ir: &Ir, listener: &str) -> Option<Value> {
    crate::auth::jwt(&ir.router.spec)?;
    Some(json!({
        "type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": listener,
        "operation": {
            "op": "add",
            "jsonPath": "..filters[?(@.name=='envoy.filters.network.http_connection_manager')].typed_config",
            "path": "/local_reply_config",
            "value": crate::targets::xds::local_reply_config(),
        },
    }))
}
