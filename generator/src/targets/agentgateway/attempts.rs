//! What both renderings (standalone and Kubernetes) need of a route key: its attempts, and
//! the answer for a request the filter did not route.

use crate::ir::{Ir, RoutePlan};

/// One attempt of a route key, as both renderings need it.
pub(crate) struct Attempt<'a> {
    pub backend: &'a crate::ir::Backend,
    pub timeout_ms: u64,
}

pub(crate) fn attempts<'a>(ir: &'a Ir, p: &RoutePlan) -> Vec<Attempt<'a>> {
    p.order
        .iter()
        .zip(&p.attempt_timeouts_ms)
        .map(|(&b, &timeout_ms)| Attempt {
            backend: &ir.backends[b],
            timeout_ms,
        })
        .collect()
}

/// The OpenAI-shaped body of the catch-all answer (a request the filter did not route).
pub(crate) fn no_route_body() -> String {
    serde_json::json!({"error": {
        "message": "no route: the request was not routed by the model-router filter",
        "type": "invalid_request_error",
        "param": null,
        "code": "no_route",
    }})
    .to_string()
}
