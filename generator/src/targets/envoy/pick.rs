//! Backends whose pods the filter picks (`resolution: endpoint` with `balancing.mode:
//! LoadAware`): their `backend-<b>` cluster is `ORIGINAL_DST`, sending each request to the
//! `ip:port` the filter names in `x-gateway-destination-endpoint`, and the filter's plugin
//! config carries the pods and the balancing settings. RoundRobin (or no balancing) keeps the
//! STATIC round-robin cluster over the pods.
//!
//! Such a backend is reached only through its own cluster or its `via-<b>` hop (an aggregate's
//! load balancer would skip an `ORIGINAL_DST` member that has no hosts yet), and each attempt
//! order holds at most one of them: the header names one pod per request.

use router_core::config::DESTINATION_ENDPOINT_HEADER;
use router_core::pick::wire::{PickConfig, PrefixWire, SessionWire, DEFAULT_SCRAPE_MS};
use serde_json::{json, Value};

use super::names::backend_cluster;
use crate::duration::parse_duration;
use crate::ir::{BackendKind, Ir};
use crate::model::{BalancingMode, Resolution};
use crate::{Diagnostics, Problem};

/// Whether the filter picks backend `i`'s pods.
pub(crate) fn is_picked(ir: &Ir, i: usize) -> bool {
    let endpoint = matches!(
        ir.backends[i].kind,
        BackendKind::Service {
            resolution: Resolution::Endpoint,
            ..
        }
    );
    let load_aware = ir.router.spec.backends[i]
        .balancing
        .as_ref()
        .is_some_and(|b| b.mode == Some(BalancingMode::LoadAware));
    endpoint && load_aware
}

/// The plugin config with each picked backend's pods and balancing.
pub(crate) fn plugin_json(ir: &Ir) -> String {
    let plugin = plugin_with_picks(ir, &|b| backend_cluster(b));
    serde_json::to_string(&plugin).unwrap_or_else(|_| ir.plugin_json.clone())
}

/// The plugin config with each picked backend's pods and balancing; a vLLM backend's metrics
/// are scraped through `cluster(backend name)`, its `ORIGINAL_DST` cluster.
pub(crate) fn plugin_with_picks(
    ir: &Ir,
    cluster: &dyn Fn(&str) -> String,
) -> router_core::config::PluginConfig {
    let mut plugin = ir.plugin.clone();
    for (i, b) in ir.backends.iter().enumerate() {
        if !is_picked(ir, i) {
            continue;
        }
        let Some(bal) = ir.router.spec.backends[i].balancing.as_ref() else {
            continue;
        };
        let vllm = b.vllm;
        plugin.backends[i].pick = Some(PickConfig {
            endpoints: b
                .endpoints
                .iter()
                .map(|(h, p)| format!("{h}:{p}"))
                .collect(),
            mode: router_core::pick::Mode::LoadAware,
            prefix_affinity: bal.prefix_affinity.as_ref().map(|p| PrefixWire {
                block_bytes: p.block_bytes.and_then(|v| u64::try_from(v).ok()),
                max_blocks_per_endpoint: p
                    .max_blocks_per_endpoint
                    .and_then(|v| u64::try_from(v).ok()),
            }),
            session_affinity: bal.session_affinity.as_ref().map(|s| SessionWire {
                headers: s.headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
                idle_ms: s
                    .idle_timeout
                    .as_deref()
                    .and_then(|t| parse_duration(t).ok())
                    .map(|d| d.as_millis().min(u64::MAX as u128) as u64),
            }),
            scrape_cluster: vllm.then(|| cluster(&b.name)),
            scrape_ms: vllm.then_some(DEFAULT_SCRAPE_MS),
            // No CRD field: the defaults (tests and experiments set it in the plugin config).
            bounds: None,
        });
    }
    plugin
}

/// `backend-<b>` of a picked backend: the pod is the one named in the request's header. No
/// health check or outlier detection (hosts exist only once named): the filter quarantines
/// failing pods itself and never names one it quarantined.
pub(super) fn original_dst_cluster(ir: &Ir, i: usize, buffer_limit: u64) -> Value {
    original_dst_cluster_named(&backend_cluster(&ir.backends[i].name), ir, i, buffer_limit)
}

/// [`original_dst_cluster`] under another name (the envoy-gateway target adds it by patch).
pub(crate) fn original_dst_cluster_named(
    name: &str,
    ir: &Ir,
    i: usize,
    buffer_limit: u64,
) -> Value {
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

/// An order with two picked backends would send the second one's attempt to the first one's
/// pod (the header is one per request): refused.
pub(super) fn check_orders(ir: &Ir, diags: &mut Diagnostics) {
    for p in &ir.routes {
        let picked: Vec<&str> = p
            .order
            .iter()
            .filter(|&&b| is_picked(ir, b))
            .map(|&b| ir.backends[b].name.as_str())
            .collect();
        if picked.len() < 2 {
            continue;
        }
        let rule = p.rule.as_deref().unwrap_or("");
        let index = ir.router.spec.rules.iter().position(|r| r.name == rule);
        diags.error(Problem::new(
            &ir.label,
            index.map_or("spec.rules".to_string(), |i| format!("spec.rules[{i}].backends")),
            format!("backends {} both have their pods picked by the gateway (resolution: endpoint, balancing.mode: LoadAware); one attempt order can hold only one such backend in the envoy target (the pod header is one per request)", picked.join(" and ")),
        ));
    }
}

/// Whether a route over `order` carries a pod header its clusters read.
pub(super) fn reaches_picked(ir: &Ir, order: &[usize]) -> bool {
    order.iter().any(|&b| is_picked(ir, b))
}

/// Whether any backend's pods are picked.
pub(super) fn any_picked(ir: &Ir) -> bool {
    (0..ir.backends.len()).any(|i| is_picked(ir, i))
}
