//! Cluster entries: backend and shadow clusters over a backend's endpoints, aggregates over an
//! attempt order, and the `via-<b>` clusters into the attempt listeners.

use router_core::config as rc;
use serde_json::{json, Value};

use super::names::*;
use crate::ir::Backend;
use crate::targets::quarantine;
use crate::targets::xds::{endpoint_cluster, shadow_cluster_named, typed};

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
/// one 5xx ejects for `quarantine`, a TCP health check for refused connections), no panic
/// mode and health updates reaching the workers unmerged.
pub(super) fn backend_cluster_config(
    b: &Backend,
    quarantine: &str,
    buffer_limit: u64,
    ca_file: &str,
) -> Value {
    let mut c = endpoint_cluster(&backend_cluster(&b.name), b, buffer_limit, ca_file);
    c["outlier_detection"] = quarantine::outlier_detection(quarantine);
    c["health_checks"] = json!([quarantine::health_check(quarantine)]);
    c["common_lb_config"] = quarantine::common_lb_config();
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
