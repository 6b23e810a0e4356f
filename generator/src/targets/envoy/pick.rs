//! Backends whose pods the filter picks (`resolution: endpoint` with `balancing.mode:
//! LoadAware`): their `backend-<b>` cluster is `ORIGINAL_DST`, sending each request to the
//! `ip:port` the filter names in `x-gateway-destination-endpoint`, and the filter's plugin
//! config carries the pods and the balancing settings. RoundRobin (or no balancing) keeps the
//! STATIC round-robin cluster over the pods.
//!
//! Such a backend is reached only through its own cluster or its `via-<b>` hop (an aggregate's
//! load balancer would skip an `ORIGINAL_DST` member that has no hosts yet), and each attempt
//! order holds at most one of them: the header names one pod per request.

use serde_json::Value;

use super::names::backend_cluster;
use crate::ir::picks::is_picked;
use crate::ir::Ir;
use crate::targets::xds::original_dst_cluster_named;
use crate::{Diagnostics, Problem};

/// `backend-<b>` of a picked backend: the pod is the one named in the request's header. No
/// health check or outlier detection (hosts exist only once named): the filter quarantines
/// failing pods itself and never names one it quarantined.
pub(super) fn original_dst_cluster(ir: &Ir, i: usize, buffer_limit: u64) -> Value {
    original_dst_cluster_named(&backend_cluster(&ir.backends[i].name), ir, i, buffer_limit)
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
