//! `policy.auth.jwt` in the standalone bootstrap: Envoy's own `jwt_authn` verifies the token
//! before the model-router filter runs.
//!
//! Chain: `header_mutation` removes whatever the client sent as the team header, then
//! `jwt_authn` (one provider, required on every path) checks signature, issuer and expiry
//! against the JWKS and copies the verified `teamClaim` into that header. The token itself is
//! removed (`forward: false`) and routes drop `authorization` too, so it never reaches a
//! backend. A refusal is `jwt_authn`'s own local reply (401); `local_reply_config` gives it our
//! JSON error shape, leaving its status and `www-authenticate` as they are. Nothing but
//! `jwt_authn` answers 401 locally (the filter never does, and an upstream's 401 is no local
//! reply), so the mapper matches on the status alone.
//!
//! Keys come from `jwksURI` through the `jwks-<provider>` cluster (TLS for https, fetched
//! before the listener opens and then cached), or from `--jwks-file` for local runs.

use std::path::Path;

use serde_json::{json, Value};

use crate::auth::JwtPolicy;
use crate::targets::xds::{socket, tls_socket, typed};

/// How long fetched keys are kept before they are fetched again.
pub const JWKS_CACHE: &str = "300s";
pub const JWKS_FETCH_TIMEOUT: &str = "5s";

pub fn jwks_cluster_name(provider: &str) -> String {
    format!("jwks-{provider}")
}

/// The filters that run before the model-router filter.
pub(super) fn filters(p: &JwtPolicy, jwks_file: Option<&Path>) -> Vec<Value> {
    let mut strip = typed("envoy.extensions.filters.http.header_mutation.v3.HeaderMutation");
    strip["mutations"] = json!({"request_mutations": [{"remove": p.team_header}]});
    let jwt = p.jwt;
    let mut provider = json!({
        "issuer": jwt.issuer,
        "forward": false,
        "claim_to_headers": [{"header_name": p.team_header, "claim_name": jwt.team_claim}],
    });
    match jwks_file {
        Some(f) => provider["local_jwks"] = json!({"filename": f.to_string_lossy()}),
        None => {
            provider["remote_jwks"] = json!({
                "http_uri": {
                    "uri": jwt.jwks_uri,
                    "cluster": jwks_cluster_name(&jwt.provider),
                    "timeout": JWKS_FETCH_TIMEOUT,
                },
                "cache_duration": JWKS_CACHE,
                // Fetched before the listener accepts requests, so the first ones are not
                // refused for want of keys.
                "async_fetch": {"fast_listener": false},
                "retry_policy": {"num_retries": 3},
            })
        }
    }
    let mut authn = typed("envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication");
    authn["providers"] = json!({ jwt.provider.clone(): provider });
    authn["rules"] =
        json!([{"match": {"prefix": "/"}, "requires": {"provider_name": jwt.provider}}]);
    vec![
        json!({"name": "llmkube-team-header-strip", "typed_config": strip}),
        json!({"name": "envoy.filters.http.jwt_authn", "typed_config": authn}),
    ]
}

/// The cluster the remote JWKS is fetched through (none with `--jwks-file`).
pub(super) fn jwks_cluster(p: &JwtPolicy, ca_file: &str) -> Option<Value> {
    let url = p.jwks.as_ref()?;
    let name = jwks_cluster_name(&p.jwt.provider);
    let mut c = json!({
        "name": name,
        "type": if url.host_is_ip() { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "5s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": socket(&url.host, url.port)}}
        ]}]},
    });
    if !url.host_is_ip() {
        c["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    if url.https {
        c["transport_socket"] = tls_socket(&url.host, ca_file);
    }
    Some(c)
}
