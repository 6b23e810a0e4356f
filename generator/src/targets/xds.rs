//! Envoy xDS pieces both Envoy-based targets emit: the envoy target writes them into its
//! bootstrap, the envoy-gateway target adds them to Envoy Gateway's xDS by EnvoyPatchPolicy
//! (what its typed resources cannot express). One definition, so both gateways get the same
//! cluster for the same backend.

use std::net::IpAddr;

use router_core::config::DESTINATION_ENDPOINT_HEADER;
use serde_json::{json, Value};

use crate::ir::{Backend, Ir};

/// Shadow copies in flight per target; the rest are dropped (`upstream_rq_active_overflow`).
pub const SHADOW_MAX_REQUESTS: u32 = 4;

/// An Envoy socket address.
pub fn socket(host: &str, port: u16) -> Value {
    json!({"socket_address": {"address": host, "port_value": port}})
}

/// A `typed_config` of protobuf type `type_name`, its fields to be added.
pub fn typed(type_name: &str) -> Value {
    json!({"@type": format!("type.googleapis.com/{type_name}")})
}

#[derive(Clone, Copy, PartialEq)]
enum Discovery {
    Static,
    StrictDns,
}

/// A backend or shadow cluster over one backend's endpoints.
pub fn endpoint_cluster(name: &str, b: &Backend, buffer_limit: u64, ca_file: &str) -> Value {
    let backend = b.name.as_str();
    let host_rewrite = b.host_rewrite();
    let all_ip = b.endpoints.iter().all(|(h, _)| h.parse::<IpAddr>().is_ok());
    let discovery = if all_ip {
        Discovery::Static
    } else {
        Discovery::StrictDns
    };
    let tier = b.tier.as_str();
    let lb_endpoints: Vec<Value> = b
        .endpoints
        .iter()
        .map(|(h, p)| {
            let mut ep = json!({"address": socket(h, *p)});
            if let Some(authority) = &host_rewrite {
                // `auto_host_rewrite` on routes over aggregates sets Host from this, per attempt.
                ep["hostname"] = json!(authority);
            }
            json!({"endpoint": ep, "metadata": {"filter_metadata": {"llmkube": {"backend": backend, "tier": tier}}}})
        })
        .collect();
    let mut c = json!({
        "name": name,
        "type": if discovery == Discovery::Static { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "5s",
        "lb_policy": "ROUND_ROBIN",
        "per_connection_buffer_limit_bytes": buffer_limit,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]},
    });
    if discovery == Discovery::StrictDns {
        c["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    if let Some(host) = b.external().filter(|e| e.url.https).map(|e| &e.url.host) {
        c["transport_socket"] = tls_socket(host, ca_file);
    }
    c
}

/// TLS to `host`, its certificate checked against `ca_file` and the host name (or address).
pub fn tls_socket(host: &str, ca_file: &str) -> Value {
    let san_type = if host.parse::<IpAddr>().is_ok() {
        "IP_ADDRESS"
    } else {
        "DNS"
    };
    let mut tls = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": {"validation_context": {
            "trusted_ca": {"filename": ca_file},
            "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": host}}],
        }},
    });
    if san_type == "DNS" {
        tls["sni"] = json!(host);
    }
    json!({"name": "envoy.transport_sockets.tls", "typed_config": tls})
}

/// `shadow-<b>` under `name`: `b`'s endpoints without quarantine; copies beyond `max_requests`
/// in flight are dropped.
pub fn shadow_cluster_named(
    name: &str,
    b: &Backend,
    max_requests: u32,
    buffer_limit: u64,
    ca_file: &str,
) -> Value {
    let mut c = endpoint_cluster(name, b, buffer_limit, ca_file);
    c["circuit_breakers"] = json!({"thresholds": [{"max_requests": max_requests}]});
    c
}

/// Requests in flight to `llmkube-budgets` at once: every request a gateway admits reserves and
/// settles through it, so Envoy's default of 1024 would refuse reservations under load.
const BUDGETS_CIRCUIT_LIMIT: u32 = 100_000;

/// The cluster `name` of `llmkube-budgets` at `host:port` (`--budgets-service`; the
/// envoy-gateway target adds it under its own name): HTTP/1.1 keep-alive connections; a short
/// connect timeout, since a reservation waits on it (the filter's own call timeout bounds the
/// rest).
pub fn budgets_cluster_config(name: &str, host: &str, port: u16) -> Value {
    let is_ip = host.parse::<IpAddr>().is_ok();
    let mut c = json!({
        "name": name,
        "type": if is_ip { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "circuit_breakers": {"thresholds": [{
            "max_connections": BUDGETS_CIRCUIT_LIMIT,
            "max_pending_requests": BUDGETS_CIRCUIT_LIMIT,
            "max_requests": BUDGETS_CIRCUIT_LIMIT,
        }]},
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": socket(host, port)}},
        ]}]},
    });
    if !is_ip {
        c["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    c
}

/// The `ORIGINAL_DST` cluster `name` of picked backend `i`: the pod is the one named in the
/// request's header. No health check or outlier detection (hosts exist only once named): the
/// filter quarantines failing pods itself and never names one it quarantined.
pub fn original_dst_cluster_named(name: &str, ir: &Ir, i: usize, buffer_limit: u64) -> Value {
    let b = &ir.backends[i];
    json!({
        "name": name,
        "type": "ORIGINAL_DST",
        "connect_timeout": "5s",
        "lb_policy": "CLUSTER_PROVIDED",
        "original_dst_lb_config": {"use_http_header": true, "http_header_name": DESTINATION_ENDPOINT_HEADER},
        "cleanup_interval": "60s",
        "per_connection_buffer_limit_bytes": buffer_limit,
        "metadata": {"filter_metadata": {"llmkube": {"backend": b.name, "tier": b.tier.as_str()}}},
    })
}

/// `jwt_authn`'s 401 in the OpenAI error shape.
pub fn local_reply_config() -> Value {
    json!({"mappers": [{
        "filter": {"status_code_filter": {"comparison": {
            "op": "EQ",
            "value": {"default_value": 401, "runtime_key": "llmkube.auth.unauthorized_status"},
        }}},
        "body_format_override": {
            "json_format": {"error": {
                "message": "missing or invalid bearer token: %LOCAL_REPLY_BODY%",
                "type": "authentication_error",
                "param": null,
                "code": "invalid_token",
            }},
            "content_type": "application/json",
        },
    }]})
}
