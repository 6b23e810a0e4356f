//! `spec.proxy`: durations, replicas, names and the pod-spec passthrough blobs.

use std::time::Duration;

use super::reporter::Ctx;
use super::syntax::*;
use crate::model::*;

pub(super) fn validate_proxy(cx: &mut Ctx, spec: &ModelRouterSpec) -> Duration {
    let Some(p) = &spec.proxy else {
        return DEFAULT_RESPONSE_HEADER_TIMEOUT;
    };
    let cap = validate_durations(cx, p);
    validate_deployment(cx, p);
    validate_pod_spec_blobs(cx, p);
    cap
}

/// The proxy's durations; returns the response-header timeout every other timeout is capped by.
fn validate_durations(cx: &mut Ctx, p: &ProxySpec) -> Duration {
    let mut cap = DEFAULT_RESPONSE_HEADER_TIMEOUT;
    if let Some(s) = &p.response_header_timeout {
        if let Some(d) = cx.duration("spec.proxy.responseHeaderTimeout", s) {
            if d.is_zero() {
                cx.err("spec.proxy.responseHeaderTimeout", "must be greater than 0");
            } else {
                cap = d;
            }
        }
    }
    if let Some(s) = &p.stream_idle_timeout {
        cx.duration("spec.proxy.streamIdleTimeout", s);
    }
    if let Some(s) = &p.quarantine_duration {
        if let Some(d) = cx.duration("spec.proxy.quarantineDuration", s) {
            if d.is_zero() {
                cx.err("spec.proxy.quarantineDuration", "must be greater than 0");
            }
        }
    }
    if let Some(s) = &p.drain_timeout {
        if let Some(d) = cx.duration("spec.proxy.drainTimeout", s) {
            if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
                cx.err(
                    "spec.proxy.drainTimeout",
                    format!("must be between 1s and 1h, got {s:?}"),
                );
            }
        }
    }
    cap
}

/// The proxy's Deployment and Service: replicas, names, image and pull secrets.
fn validate_deployment(cx: &mut Ctx, p: &ProxySpec) {
    if let Some(r) = p.replicas {
        cx.range("spec.proxy.replicas", r, 1, 10);
    }
    if let Some(r) = p.revision_history_limit {
        cx.range("spec.proxy.revisionHistoryLimit", r, 0, i32::MAX as i64);
    }
    if let Some(n) = &p.service_name {
        if !is_dns_label(n) || !n.as_bytes()[0].is_ascii_lowercase() {
            cx.err(
                "spec.proxy.serviceName",
                format!(
                    "{n:?} must match ^[a-z]([-a-z0-9]*[a-z0-9])?$ and be at most 63 characters"
                ),
            );
        }
    }
    if let Some(n) = &p.runtime_class_name {
        if !is_dns_subdomain(n) {
            cx.err(
                "spec.proxy.runtimeClassName",
                format!("{n:?} is not a valid RuntimeClass name"),
            );
        }
    }
    if let Some(i) = &p.image {
        if i.trim().is_empty() || i.contains(char::is_whitespace) {
            cx.err(
                "spec.proxy.image",
                format!("{i:?} is not a valid image reference"),
            );
        }
    }
    for (i, s) in p.image_pull_secrets.iter().flatten().enumerate() {
        if s.name.is_empty() {
            cx.err(
                format!("spec.proxy.imagePullSecrets[{i}].name"),
                "must not be empty",
            );
        }
    }
}

/// Light checks of the pod-spec passthrough blobs (affinity, resources, tolerations, topology
/// spread constraints): their shape, not their Kubernetes semantics.
fn validate_pod_spec_blobs(cx: &mut Ctx, p: &ProxySpec) {
    if let Some(v) = &p.affinity {
        if !v.is_object() {
            cx.err(
                "spec.proxy.affinity",
                "must be an object (core/v1 Affinity)",
            );
        } else {
            for k in v.as_object().unwrap().keys() {
                if !matches!(
                    k.as_str(),
                    "nodeAffinity" | "podAffinity" | "podAntiAffinity"
                ) {
                    cx.err(format!("spec.proxy.affinity.{k}"), "unknown field, expected one of `nodeAffinity`, `podAffinity`, `podAntiAffinity`");
                }
            }
        }
    }
    if let Some(v) = &p.resources {
        match v.as_object() {
            None => cx.err(
                "spec.proxy.resources",
                "must be an object (core/v1 ResourceRequirements)",
            ),
            Some(m) => {
                for (k, val) in m {
                    match k.as_str() {
                        "limits" | "requests" => {
                            if !val
                                .as_object()
                                .is_some_and(|o| o.values().all(|q| q.is_string() || q.is_number()))
                            {
                                cx.err(
                                    format!("spec.proxy.resources.{k}"),
                                    "must map resource names to quantities",
                                );
                            }
                        }
                        "claims" => {
                            if !val.as_array().is_some_and(|a| {
                                a.iter()
                                    .all(|c| c.get("name").is_some_and(|n| n.is_string()))
                            }) {
                                cx.err(
                                    "spec.proxy.resources.claims",
                                    "must be a list of objects with a name",
                                );
                            }
                        }
                        _ => cx.err(
                            format!("spec.proxy.resources.{k}"),
                            "unknown field, expected one of `claims`, `limits`, `requests`",
                        ),
                    }
                }
            }
        }
    }
    if let Some(v) = &p.tolerations {
        match v.as_array() {
            None => cx.err(
                "spec.proxy.tolerations",
                "must be a list (core/v1 Toleration)",
            ),
            Some(a) => {
                for (i, t) in a.iter().enumerate() {
                    if !t.is_object() {
                        cx.err(format!("spec.proxy.tolerations[{i}]"), "must be an object");
                    }
                }
            }
        }
    }
    if let Some(v) = &p.topology_spread_constraints {
        match v.as_array() {
            None => cx.err(
                "spec.proxy.topologySpreadConstraints",
                "must be a list (core/v1 TopologySpreadConstraint)",
            ),
            Some(a) => {
                for (i, t) in a.iter().enumerate() {
                    for req in ["maxSkew", "topologyKey", "whenUnsatisfiable"] {
                        if t.get(req).is_none() {
                            cx.err(
                                format!("spec.proxy.topologySpreadConstraints[{i}].{req}"),
                                "is required",
                            );
                        }
                    }
                }
            }
        }
    }
}
