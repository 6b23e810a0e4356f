//! Shadow rules behind agentgateway. agentgateway v1.3.1 mirrors a request without its body
//! (`requestMirror`), so its mirrors cannot shadow an inference request. The filter, which
//! has the body inside `llmkube-ext-proc`, sends the copies itself instead: one HTTP callout
//! per mirror of the request's order, to a cluster of `ext-proc.yaml` per mirrored backend,
//! marked `x-llmkube-shadow: true`, fire and forget, at most [`SHADOW_MAX_REQUESTS`] in flight
//! per backend and filter instance (more are dropped and counted), the answer discarded
//! (router_core::shadow, filters/model-router/src/shadow.rs).
//!
//! Copies go to local backends only (tier `local`, an InferenceService): a copy to an external
//! backend would need its credential and API translation, which only agentgateway's providers
//! hold, and a copy to a cloud tier is never sent by the filter. Those are warned and not sent.

use serde_json::{json, Map, Value};

use super::options::host_port;
use crate::ir::{ms, Ir};
use crate::targets::xds::SHADOW_MAX_REQUESTS;
use crate::{Diagnostics, Problem};
use router_core::config::Tier;

/// The callout cluster of mirrored backend `name` in `ext-proc.yaml`.
pub fn cluster(name: &str) -> String {
    format!("llmkube-shadow-{name}")
}

/// Backends the filter sends copies to: local tier, an InferenceService with an address.
fn sendable(ir: &Ir, b: usize) -> bool {
    let be = &ir.backends[b];
    be.tier == Tier::Local && be.external().is_none() && !be.endpoints.is_empty()
}

/// Mirrors the filter does not send to: warned, per rule.
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    for (i, r) in ir.router.spec.rules.iter().enumerate() {
        let mut unsent: Vec<&str> = ir
            .rule_plans(&r.name)
            .iter()
            .flat_map(|p| p.mirrors.iter().copied())
            .filter(|&b| !sendable(ir, b))
            .map(|b| ir.backends[b].name.as_str())
            .collect();
        unsent.sort_unstable();
        unsent.dedup();
        if !unsent.is_empty() {
            diags.warn(Problem::new(
                &ir.label,
                format!("spec.rules[{i}].route.strategy"),
                format!("shadow copies to {} are not sent by the agentgateway target: agentgateway mirrors requests without their body, so the routing filter sends the copies itself, and only to local backends (a copy to an external or cloud backend would need the provider's credential and API translation, which only agentgateway's own attempts carry); copies to local backends are sent. To shadow to {}, use --target envoy", unsent.join(", "), unsent.join(", ")),
            ));
        }
    }
}

/// The mirrored backends the filter sends to, ascending.
fn targets(ir: &Ir) -> Vec<usize> {
    ir.shadow_targets
        .iter()
        .copied()
        .filter(|&b| sendable(ir, b))
        .collect()
}

/// How long a copy may take: what the router gives any attempt for its answer to start.
fn timeout_ms(ir: &Ir) -> u64 {
    ms(ir.timeouts.response_header_cap).max(1)
}

/// The plugin config's `shadow` section; `None` when no rule mirrors to a local backend.
pub(super) fn plugin_section(ir: &Ir) -> Option<Value> {
    let targets: Vec<Value> = targets(ir)
        .into_iter()
        .map(|b| {
            let be = &ir.backends[b];
            let (host, port) = &be.endpoints[0];
            json!({
                "backend": be.name,
                "cluster": cluster(&be.name),
                "authority": host_port(host, *port),
                "timeout_ms": timeout_ms(ir),
            })
        })
        .collect();
    (!targets.is_empty()).then(|| {
        json!({
            "max_in_flight": SHADOW_MAX_REQUESTS,
            "targets": targets,
        })
    })
}

/// `clusters:` entries of `ext-proc.yaml` for the copies: the backend's address.
pub(super) fn clusters(ir: &Ir) -> Map<String, Value> {
    targets(ir)
        .into_iter()
        .map(|b| {
            let be = &ir.backends[b];
            let (host, port) = &be.endpoints[0];
            (
                cluster(&be.name),
                json!({"address": host_port(host, *port), "timeout_ms": timeout_ms(ir)}),
            )
        })
        .collect()
}
