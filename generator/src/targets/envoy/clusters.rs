//! Cluster entries: backend and shadow clusters over a backend's endpoints, aggregates over an
//! attempt order, and the `via-<b>` clusters into the attempt listeners.

use std::net::IpAddr;

use router_core::config as rc;
use serde_json::{json, Value};

use super::filters::{socket, typed};
use super::names::*;
use crate::ir::Backend;
use crate::targets::quarantine;

#[derive(Clone, Copy, PartialEq)]
enum Discovery {
    Static,
    StrictDns,
}

/// A backend or shadow cluster over one backend's endpoints.
pub(super) fn endpoint_cluster(name: &str, b: &Backend, buffer_limit: u64, ca_file: &str) -> Value {
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
pub(super) fn tls_socket(host: &str, ca_file: &str) -> Value {
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

/// Limits of the `via-<b>` clusters: they only carry attempts to an in-process listener, so
/// the real limits are those of `backend-<b>` behind it.
const VIA_CIRCUIT_LIMIT: u32 = 1_000_000;

/// `via-<b>`: one endpoint, the internal listener `attempt-<b>`, carrying the same endpoint
/// metadata as `backend-<b>`'s endpoints, so the downstream filter sees which backend served. No
/// outlier detection and no health check: the quarantine lives on `backend-<b>`, behind the
/// listener. No upstream filter chain either (nor on the `attempts.*` aggregate): `backend-<b>`'s
/// own chain runs behind the listener, once per attempt, on a request of its own, so header edits
/// of one attempt (an external backend's `content-length`, credentials) never reach the next.
pub(super) fn via_cluster_config(backend: &str, tier: rc::Tier, buffer_limit: u64) -> Value {
    let name = via_cluster(backend);
    let tier = tier.as_str();
    let ep = json!({"address": {"envoy_internal_address": {"server_listener_name": attempt_listener(backend)}}});
    let raw = json!({"name": "envoy.transport_sockets.raw_buffer",
        "typed_config": typed("envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer")});
    let mut internal =
        typed("envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport");
    internal["transport_socket"] = raw;
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "lb_policy": "ROUND_ROBIN",
        "per_connection_buffer_limit_bytes": buffer_limit,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
            "endpoint": ep,
            "metadata": {"filter_metadata": {"llmkube": {"backend": backend, "tier": tier}}},
        }]}]},
        "transport_socket": {"name": "envoy.transport_sockets.internal_upstream", "typed_config": internal},
        "circuit_breakers": {"thresholds": [{
            "max_connections": VIA_CIRCUIT_LIMIT,
            "max_pending_requests": VIA_CIRCUIT_LIMIT,
            "max_requests": VIA_CIRCUIT_LIMIT,
            "max_retries": VIA_CIRCUIT_LIMIT,
        }]},
    })
}

/// `backend-<b>`: the backend's endpoints with the quarantine ([`crate::targets::quarantine`]:
/// one 5xx ejects for `quarantine`, a TCP health check for refused connections) and no panic
/// mode.
pub(super) fn backend_cluster_config(
    b: &Backend,
    quarantine: &str,
    buffer_limit: u64,
    ca_file: &str,
) -> Value {
    let mut c = endpoint_cluster(&backend_cluster(&b.name), b, buffer_limit, ca_file);
    c["outlier_detection"] = quarantine::outlier_detection(quarantine);
    c["health_checks"] = json!([quarantine::health_check(quarantine)]);
    c["common_lb_config"] =
        json!({"healthy_panic_threshold": quarantine::healthy_panic_threshold()});
    c
}

/// `shadow-<b>`: the same endpoints without quarantine; copies beyond `max_requests` in flight
/// are dropped.
pub(super) fn shadow_cluster_config(
    b: &Backend,
    max_requests: u32,
    buffer_limit: u64,
    ca_file: &str,
) -> Value {
    shadow_cluster_named(
        &shadow_cluster(&b.name),
        b,
        max_requests,
        buffer_limit,
        ca_file,
    )
}

/// [`shadow_cluster_config`] under another name (the envoy-gateway target adds it by patch).
pub(crate) fn shadow_cluster_named(
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

/// An aggregate over `members` (cluster names, in attempt order).
pub(super) fn aggregate_cluster_config(name: &str, members: Vec<String>) -> Value {
    let mut agg = typed("envoy.extensions.clusters.aggregate.v3.ClusterConfig");
    agg["clusters"] = json!(members);
    json!({
        "name": name,
        // Dots in a cluster name split Envoy's stat tag extraction (`envoy_cluster_name`
        // would be "order"); backend names are DNS labels, so '_' is unambiguous here.
        "alt_stat_name": name.replace('.', "_"),
        "connect_timeout": "5s",
        "lb_policy": "CLUSTER_PROVIDED",
        "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": agg},
    })
}

/// Requests in flight to `llmkube-budgets` at once: every request a gateway admits reserves and
/// settles through it, so Envoy's default of 1024 would refuse reservations under load.
const BUDGETS_CIRCUIT_LIMIT: u32 = 100_000;

/// The cluster `name` of `llmkube-budgets` at `host:port` (`--budgets-service`; the
/// envoy-gateway target adds it under its own name): HTTP/1.1 keep-alive connections; a short
/// connect timeout, since a reservation waits on it (the filter's own call timeout bounds the
/// rest).
pub(crate) fn budgets_cluster_config(name: &str, host: &str, port: u16) -> Value {
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
