//! `spec.backends[]`: identity, reference or external, weights, timeouts, balancing.

use std::collections::BTreeMap;
use std::time::Duration;

use super::reporter::Ctx;
use super::syntax::*;
use crate::model::*;

pub(super) fn validate_backends(
    cx: &mut Ctx,
    spec: &ModelRouterSpec,
    cap: Duration,
    data_plane: DataPlane,
) {
    if spec.backends.is_empty() {
        cx.err("spec.backends", "at least one backend must be declared");
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, b) in spec.backends.iter().enumerate() {
        let p = format!("spec.backends[{i}]");
        validate_identity(cx, &p, i, b, &mut seen, &mut ids);
        validate_source(cx, &p, b);
        validate_routing_fields(cx, &p, b, cap);
        validate_model_fields(cx, &p, b);
        validate_endpoint_picker(cx, &p, b);
        if let Some(bal) = &b.balancing {
            validate_balancing(cx, &p, b, bal, data_plane);
        }
    }
}

/// The name (a DNS label, unique) and the model id it publishes (unique among backends).
fn validate_identity<'a>(
    cx: &mut Ctx,
    p: &str,
    i: usize,
    b: &'a RouterBackend,
    seen: &mut BTreeMap<&'a str, usize>,
    ids: &mut BTreeMap<&'a str, usize>,
) {
    if !is_name(&b.name) {
        cx.err(
            format!("{p}.name"),
            format!("{:?} must match ^[a-z0-9][a-z0-9-]{{0,62}}$", b.name),
        );
    }
    let dup_name = if let Some(j) = seen.insert(&b.name, i) {
        cx.err(
            format!("{p}.name"),
            format!(
                "duplicate backend name {:?} (also spec.backends[{j}])",
                b.name
            ),
        );
        true
    } else {
        false
    };
    if let Some(d) = &b.display_name {
        if d.trim().is_empty() {
            cx.err(format!("{p}.displayName"), "must not be empty when set");
        }
    }
    if let Some(j) = ids.insert(b.model_id(), i) {
        if !dup_name {
            cx.err(
                p.to_string(),
                format!("model id {:?} (displayName, else name) is also published by spec.backends[{j}]", b.model_id()),
            );
        }
    }
}

/// Where the backend is: exactly one of an InferenceService or an external provider.
fn validate_source(cx: &mut Ctx, p: &str, b: &RouterBackend) {
    match (&b.inference_service_ref, &b.external) {
        (Some(_), Some(_)) => cx.err(
            p.to_string(),
            "inferenceServiceRef and external are mutually exclusive; set exactly one",
        ),
        (None, None) => cx.err(
            p.to_string(),
            "exactly one of inferenceServiceRef or external must be set",
        ),
        _ => {}
    }
    if let Some(r) = &b.inference_service_ref {
        if !is_dns_subdomain(&r.name) {
            cx.err(
                format!("{p}.inferenceServiceRef.name"),
                format!("{:?} is not a valid InferenceService name", r.name),
            );
        }
    }
    if let Some(e) = &b.external {
        if e.model.trim().is_empty() {
            cx.err(format!("{p}.external.model"), "must not be empty");
        }
        match &e.url {
            None if e.provider == Provider::Litellm => cx.err(
                format!("{p}.external.url"),
                "is required for provider litellm (the LiteLLM proxy's base URL)",
            ),
            None => {}
            Some(u) => {
                if let Err(why) = crate::url::parse_url(u) {
                    cx.err(format!("{p}.external.url"), why);
                }
            }
        }
        if let Some(s) = &e.credentials_secret_ref {
            if !is_dns_subdomain(&s.name) {
                cx.err(
                    format!("{p}.external.credentialsSecretRef.name"),
                    format!("{:?} is not a valid Secret name", s.name),
                );
            }
        }
        if b.resolution.is_some() {
            cx.warn(
                format!("{p}.resolution"),
                "external backends ignore resolution",
            );
        }
    }
}

/// What routing reads of a backend: weight, timeout, prices, capabilities and health check.
fn validate_routing_fields(cx: &mut Ctx, p: &str, b: &RouterBackend, cap: Duration) {
    if let Some(w) = b.weight {
        cx.range(&format!("{p}.weight"), w, 0, i32::MAX as i64);
    }
    if let Some(t) = &b.timeout {
        check_timeout(cx, &format!("{p}.timeout"), t, cap);
    }
    if let Some(c) = &b.cost_per_million_tokens {
        for (f, v) in [
            ("completionUSD", &c.completion_usd),
            ("promptUSD", &c.prompt_usd),
        ] {
            if let Some(v) = v {
                if !is_decimal(v) {
                    cx.err(
                        format!("{p}.costPerMillionTokens.{f}"),
                        format!("{v:?} must match ^[0-9]+(\\.[0-9]+)?$"),
                    );
                }
            }
        }
    }
    for (j, c) in b.capabilities.iter().enumerate() {
        if c.trim().is_empty() {
            cx.err(format!("{p}.capabilities[{j}]"), "must not be empty");
        }
    }
    if let Some(h) = &b.health_check {
        if let Some(v) = h.interval_seconds {
            cx.range(
                &format!("{p}.healthCheck.intervalSeconds"),
                v,
                1,
                i32::MAX as i64,
            );
        }
        if let Some(v) = h.timeout_seconds {
            cx.range(
                &format!("{p}.healthCheck.timeoutSeconds"),
                v,
                1,
                i32::MAX as i64,
            );
        }
        if let Some(path) = &h.path {
            if !path.starts_with('/') {
                cx.err(
                    format!("{p}.healthCheck.path"),
                    format!("{path:?} must start with '/'"),
                );
            }
        }
    }
}

/// What `/v1/models` publishes of a backend.
fn validate_model_fields(cx: &mut Ctx, p: &str, b: &RouterBackend) {
    if let Some(m) = &b.model_info {
        if let Some(c) = m.context_length {
            cx.range(&format!("{p}.modelInfo.contextLength"), c, 1, i64::MAX);
        }
        for (f, list) in [
            ("inputModalities", &m.input_modalities),
            ("outputModalities", &m.output_modalities),
        ] {
            if let Some(list) = list {
                if list.len() > 5 {
                    cx.err(
                        format!("{p}.modelInfo.{f}"),
                        format!("at most 5 items, got {}", list.len()),
                    );
                }
                for (j, v) in list.iter().enumerate() {
                    if v.trim().is_empty() {
                        cx.err(format!("{p}.modelInfo.{f}[{j}]"), "must not be empty");
                    }
                }
            }
        }
    }
}

pub(super) fn validate_balancing(
    cx: &mut Ctx,
    p: &str,
    b: &RouterBackend,
    bal: &Balancing,
    data_plane: DataPlane,
) {
    let p = format!("{p}.balancing");
    if b.external.is_some() || b.resolution() != Resolution::Endpoint {
        cx.err(p.clone(), "balancing requires resolution: endpoint");
    }
    if data_plane != DataPlane::Proxy {
        cx.warn(p.clone(), "balancing applies to dataPlane: Proxy only; ignored by the Gateway and AgentGateway data planes");
    }
    let load_aware = bal.mode == Some(BalancingMode::LoadAware);
    if let Some(pa) = &bal.prefix_affinity {
        if !load_aware {
            cx.warn(
                format!("{p}.prefixAffinity"),
                "requires mode: LoadAware; ignored with RoundRobin (PrefixAffinityIgnored)",
            );
        }
        if let Some(v) = pa.block_bytes {
            cx.range(&format!("{p}.prefixAffinity.blockBytes"), v, 256, 16384);
        }
        if let Some(v) = pa.max_blocks_per_endpoint {
            cx.range(
                &format!("{p}.prefixAffinity.maxBlocksPerEndpoint"),
                v,
                1024,
                262144,
            );
        }
    }
    if let Some(sa) = &bal.session_affinity {
        let sp = format!("{p}.sessionAffinity");
        if !load_aware {
            cx.warn(
                sp.clone(),
                "requires mode: LoadAware; ignored with RoundRobin (SessionAffinityIgnored)",
            );
        }
        if sa.headers.is_empty() || sa.headers.len() > 8 {
            cx.err(
                format!("{sp}.headers"),
                format!("must list 1 to 8 header names, got {}", sa.headers.len()),
            );
        }
        for (i, h) in sa.headers.iter().enumerate() {
            cx.header(&format!("{sp}.headers[{i}]"), h);
        }
        if let Some(t) = &sa.idle_timeout {
            if let Some(d) = cx.duration(&format!("{sp}.idleTimeout"), t) {
                if d < Duration::from_secs(60) || d > Duration::from_secs(24 * 3600) {
                    cx.err(
                        format!("{sp}.idleTimeout"),
                        format!("must be between 1m and 24h, got {t:?}"),
                    );
                }
            }
        }
        if let Some(m) = sa.max_load_percent {
            if cx.range(&format!("{sp}.maxLoadPercent"), m, 101, 1000) {
                cx.warn(
                    format!("{sp}.maxLoadPercent"),
                    "is deprecated and has no effect",
                );
            }
        }
    }
}

pub(super) fn check_timeout(cx: &mut Ctx, path: &str, s: &str, cap: Duration) -> Option<Duration> {
    let d = cx.duration(path, s)?;
    if d.is_zero() {
        cx.err(path, "must be greater than 0");
        return None;
    }
    if d > cap {
        cx.err(
            path,
            format!(
                "{s:?} exceeds spec.proxy.responseHeaderTimeout ({}); a per-rule or per-backend timeout can only tighten the cap",
                crate::duration::envoy_duration(cap)
            ),
        );
    }
    Some(d)
}

/// An external endpoint picker's service.
fn validate_endpoint_picker(cx: &mut Ctx, p: &str, b: &RouterBackend) {
    if let Some(ep) = &b.endpoint_picker {
        if let Some(s) = &ep.service {
            if s.name.is_empty() {
                cx.err(
                    format!("{p}.endpointPicker.service.name"),
                    "must not be empty",
                );
            }
            cx.range(
                &format!("{p}.endpointPicker.service.port"),
                s.port,
                1,
                65535,
            );
        }
    }
}
