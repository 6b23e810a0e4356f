//! `agentgateway.yaml`: one bind on the `--listen` port, one listener whose gateway-level
//! `extProc` (failClosed, request body buffered) runs the filter before route selection, one
//! route per route key (`x-llmkube-route` exact) and a catch-all 404.
//!
//! Credentials: like the envoy target's bootstrap (a file for local runs), a Secret that is part
//! of the input is written inline as the provider's `backendAuth` key; without it the key is read
//! from `/var/run/secrets/llmkube/<namespace>/<secret>/<key>`. This file is therefore written
//! with mode 0600; kubernetes.yaml never holds a value.

use std::time::Duration;

use router_core::headers::ROUTE_HEADER;
use serde_json::{json, Value};

use super::attempts::{attempts, no_route_body, Attempt};
use super::options::{host_port, AgentgatewayOptions, INTERNAL_HEADERS};
use crate::duration::gateway_duration;
use crate::ir::{Credential, Ir, RoutePlan};
use crate::model::Provider;

/// Same triggers as the envoy target's `retry_on` 5xx (a connection failure is retried by
/// agentgateway itself: `ProxyError::is_retryable`).
pub(super) const RETRY_CONDITION: &str = "response.code >= 500";
/// The wait before a retry. agentgateway evicts a failed provider from a background task
/// (`ActiveHandle::finish_request` sends the eviction to the endpoint set's worker), so a retry
/// sent at once can find the failed provider still active and try it again. Envoy's default
/// retry back-off base interval is the same 25 ms.
pub(super) const RETRY_BACKOFF: &str = "25ms";

pub(super) fn config(ir: &Ir, opts: &AgentgatewayOptions) -> Value {
    let (host, port) = &opts.ext_proc;
    let mut routes: Vec<Value> = ir
        .routes
        .iter()
        .enumerate()
        .map(|(i, p)| route(ir, i, p, opts))
        .collect();
    routes.push(json!({
        "name": "no-route",
        "matches": [{"path": {"pathPrefix": "/"}}],
        "policies": {"directResponse": {"status": 404, "body": no_route_body()}},
    }));
    let mut cfg = json!({
        "binds": [{
            "port": opts.listen.port(),
            "listeners": [{
                "name": ir.router.metadata.name.clone().unwrap_or_default(),
                "protocol": "HTTP",
                "policies": {"extProc": {
                    "host": host_port(host, *port),
                    "failureMode": "failClosed",
                    "processingOptions": processing_options(),
                    "policies": {"http": {"requestTimeout": super::ext_proc::CALL_TIMEOUT}},
                }},
                "routes": routes,
            }],
        }],
    });
    let services = super::picked::standalone_services(ir);
    if !services.is_empty() {
        cfg["services"] = json!(services);
    }
    cfg
}

/// The filter reads the whole request (model, messages) and the response status; it needs the
/// response body only to settle budgets (streamed full duplex), and no trailers.
pub(super) fn processing_options() -> Value {
    json!({
        "requestHeaderMode": "send",
        "requestBodyMode": "buffered",
        "requestTrailerMode": "skip",
        "responseHeaderMode": "send",
        "responseBodyMode": super::budgets::response_body_mode(),
        "responseTrailerMode": "skip",
    })
}

fn route(ir: &Ir, index: usize, p: &RoutePlan, opts: &AgentgatewayOptions) -> Value {
    let mut policies = json!({
        "requestHeaderModifier": {"remove": INTERNAL_HEADERS},
    });
    let (backend, tries) = match super::picked::picked_route(ir, p) {
        Some(b) => (
            super::picked::standalone_backend(ir, b, opts),
            p.order.len(),
        ),
        None => {
            let mut groups: Vec<Value> = attempts(ir, p)
                .iter()
                .map(|a| json!({"providers": [provider(ir, a)]}))
                .collect();
            groups.push(json!({"providers": [no_backend_provider(opts)]}));
            (json!({"ai": {"groups": groups}}), groups.len())
        }
    };
    if tries > 1 {
        policies["retry"] = json!({
            "attempts": tries - 1,
            "codes": [],
            "condition": RETRY_CONDITION,
            "backoff": RETRY_BACKOFF,
        });
    }
    json!({
        "name": format!("route-{index}"),
        "matches": [{"headers": [{"name": ROUTE_HEADER, "value": {"exact": p.key}}]}],
        "policies": policies,
        "backends": [backend],
    })
}

/// The last priority group: the local server's no-backend listener (ext-proc/src/no_backend.rs),
/// never evicted, so agentgateway goes there — and nowhere else — once every backend of the
/// order failed or is evicted. Its 503 is an upstream answer, which the gateway-level ext_proc
/// response phase gives the filter to shape (`fail_closed` / `all_backends_failed`);
/// agentgateway's own reply to a failed connection could not be shaped. It forwards nothing.
fn no_backend_provider(opts: &AgentgatewayOptions) -> Value {
    let (host, port) = opts.no_backend_addr();
    json!({
        "name": super::options::NO_BACKEND_PROVIDER,
        "provider": {"openAI": {}},
        "hostOverride": host_port(&host, port),
    })
}

fn provider(ir: &Ir, a: &Attempt) -> Value {
    let b = a.backend;
    let mut policies = json!({
        "http": {"requestTimeout": gateway_duration(Duration::from_millis(a.timeout_ms))},
        "health": {"eviction": {
            "duration": gateway_duration(ir.timeouts.quarantine),
            "consecutiveFailures": 1,
        }},
    });
    let (provider, host) = match b.external() {
        Some(e) => {
            if e.url.https {
                policies["backendTLS"] = json!({});
            }
            if let Some(c) = &e.credential {
                policies["backendAuth"] = json!({"key": {"value": key_source(c)}});
            }
            let p = match e.provider {
                Provider::Anthropic => json!({"anthropic": {"model": e.model}}),
                _ => json!({"openAI": {"model": e.model}}),
            };
            (p, host_port(&e.url.host, e.url.port))
        }
        None => (
            match ir.served_model(b) {
                Some(m) => json!({"openAI": {"model": m}}),
                None => json!({"openAI": {}}),
            },
            b.endpoints
                .first()
                .map(|(h, port)| host_port(h, *port))
                .unwrap_or_default(),
        ),
    };
    let mut v = json!({
        "name": b.name,
        "provider": provider,
        "hostOverride": host,
        "policies": policies,
    });
    if b.rewrites_path() {
        v["pathPrefix"] = json!(b.path_prefix());
    }
    v
}

/// The provider key: inline when the Secret was in the input (without the `Bearer ` prefix the
/// IR's header value carries), else the file a local run mounts it at.
fn key_source(c: &Credential) -> Value {
    match &c.value {
        Some(v) => json!(v.strip_prefix("Bearer ").unwrap_or(v)),
        None => json!({"file": format!(
            "/var/run/secrets/llmkube/{}/{}/{}",
            c.secret.namespace, c.secret.name, c.secret.key
        )}),
    }
}
