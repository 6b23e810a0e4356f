//! The bootstrap: the listener with the model-router filter and one route per route key, the
//! attempt listeners, the clusters and the credential store.

use std::collections::BTreeMap;
use std::path::Path;

use router_core::headers::{DESTINATION_ENDPOINT_HEADER, ROUTE_HEADER, SHADOW_HEADER};
use serde_json::{json, Value};

use super::clusters::*;
use super::filters::{dur_ms, upstream_chain, wasm_filter};
use super::jwt;
use super::names::*;
use super::options::{upstream_wasm_path, wasm_path, EnvoyOptions, RETRY_ON};
use super::pick;
use crate::duration::envoy_duration;
use crate::ir::picks::{is_picked, plugin_json};
use crate::ir::{Backend, Ir, RoutePlan};
use crate::targets::xds::{
    budgets_cluster_config, local_reply_config, socket, typed, SHADOW_MAX_REQUESTS,
};

const MIB: u64 = 1024 * 1024;

/// The route table's clusters: aggregates in first-seen order (deterministic), and the backends
/// some route reaches through `via-<b>` → `attempt-<b>` with their attempt timeout.
#[derive(Default)]
struct Table {
    routes: Vec<Value>,
    aggregates: Vec<(String, Vec<usize>)>,
    hops: BTreeMap<usize, u64>,
}

impl Table {
    fn build(ir: &Ir) -> Table {
        let mut t = Table::default();
        let stream_idle = envoy_duration(ir.timeouts.stream_idle);
        for p in &ir.routes {
            let cluster = t.cluster_for(ir, p);
            let route = route(ir, p, cluster, &stream_idle);
            t.routes.push(route);
        }
        t.routes.push(no_backend_route());
        t
    }

    /// The cluster a route sends to (registering the aggregate or the hops it needs).
    fn cluster_for(&mut self, ir: &Ir, p: &RoutePlan) -> String {
        let names: Vec<&str> = p
            .order
            .iter()
            .map(|&b| ir.backends[b].name.as_str())
            .collect();
        if p.order.len() == 1 {
            return backend_cluster(names[0]);
        }
        let agg = match p.uniform_timeout_ms() {
            Some(_) if !pick::reaches_picked(ir, &p.order) => aggregate_cluster(&names),
            Some(_) => {
                // Through the hops (an order with a picked backend): the outer per-try timeout
                // bounds each attempt, so the hop only caps it at responseHeaderTimeout, unless
                // a route with per-backend timeouts needs that backend's own.
                let cap = crate::ir::ms(ir.timeouts.response_header_cap);
                for &b in &p.order {
                    self.hops.entry(b).or_insert(cap);
                }
                attempts_cluster(&names)
            }
            None => {
                let cap = crate::ir::ms(ir.timeouts.response_header_cap);
                for (&b, &t) in p.order.iter().zip(&p.attempt_timeouts_ms) {
                    let prev = self.hops.insert(b, t);
                    debug_assert!(
                        prev.is_none_or(|x| x == t || x == cap),
                        "one timeout per backend"
                    );
                }
                attempts_cluster(&names)
            }
        };
        if !self.aggregates.iter().any(|(n, _)| *n == agg) {
            self.aggregates.push((agg.clone(), p.order.clone()));
        }
        agg
    }
}

/// The route of one route key: exact match on `x-llmkube-route`, failover by retries in attempt
/// order, mirrors for shadow rules.
fn route(ir: &Ir, p: &RoutePlan, cluster: String, stream_idle: &str) -> Value {
    let external = p.order.iter().any(|&b| ir.backends[b].external().is_some());
    let per_try = p.uniform_timeout_ms();
    let mut retry = failover_retry(p.order.len());
    // Without it (attempts with different timeouts), each attempt's own timeout is applied
    // by the internal listener `attempt-<b>` it goes through.
    if let Some(ms) = per_try {
        retry["per_try_timeout"] = json!(dur_ms(ms));
    }
    let mut action = json!({
        "cluster": cluster,
        "timeout": "0s",
        "idle_timeout": stream_idle,
        "retry_policy": retry,
    });
    if p.order.len() == 1 {
        direct_rewrites(&mut action, &ir.backends[p.order[0]]);
    } else if external && per_try.is_some() {
        // Host per attempt from the endpoint's `hostname` (set on external endpoints).
        action["auto_host_rewrite"] = json!(true);
    }
    if !p.mirrors.is_empty() {
        action["request_mirror_policies"] = p
            .mirrors
            .iter()
            .map(|&b| {
                json!({
                    "cluster": shadow_cluster(&ir.backends[b].name),
                    "request_headers_mutations": [{"append": {
                        "header": {"key": SHADOW_HEADER, "value": "true"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}],
                })
            })
            .collect();
    }
    json!({
        "name": p.key,
        "match": {"prefix": "/", "headers": [{"name": ROUTE_HEADER, "string_match": {"exact": p.key}}]},
        "route": action,
        "request_headers_to_remove": ["authorization"],
    })
}

/// The retry policy of a route over `attempts` backends. A one-backend route never retries, and
/// gets no `retry_on`: with any retry condition Envoy's router keeps a copy of the whole request
/// body for a retry that cannot happen (a memcpy of the body and the body held until the request
/// ends). Its `per_try_timeout` (set by the caller) applies all the same.
fn failover_retry(attempts: usize) -> Value {
    if attempts < 2 {
        return json!({"num_retries": 0});
    }
    let mut retry = json!({
        "retry_on": RETRY_ON,
        "num_retries": attempts - 1,
        "retry_priority": {"name": "envoy.retry_priorities.previous_priorities",
            "typed_config": typed("envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig")},
        "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": typed("envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate")}],
        "host_selection_retry_max_attempts": attempts.max(3),
    });
    retry["retry_priority"]["typed_config"]["update_frequency"] = json!(1);
    retry
}

/// The catch-all: a request the filter did not decide never reaches a backend.
fn no_backend_route() -> Value {
    let body = json!({"error": {
        "message": "no route: the request was not assigned to a backend of this router",
        "type": "invalid_request_error", "param": null, "code": "model_not_found"}})
    .to_string();
    json!({
        "name": "no-backend",
        "match": {"prefix": "/"},
        "direct_response": {"status": 404, "body": {"inline_string": body}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    })
}

/// The upstream chain of a cluster over `members`, when one of them is external or has its
/// `model` rewritten (a local backend whose served model name is known).
fn chain_for(ir: &Ir, members: &[usize], wasm: &Path) -> Option<Value> {
    let externals: Vec<&Backend> = members
        .iter()
        .filter(|&&b| ir.core.backend(b).rewrite_model().is_some())
        .map(|&b| &ir.backends[b])
        .collect();
    (!externals.is_empty()).then(|| upstream_chain(&externals, wasm, &ir.plugin_json))
}

fn with_chain(mut c: Value, chain: Option<Value>) -> Value {
    if let Some(chain) = chain {
        c["typed_extension_protocol_options"] = chain;
    }
    c
}

pub(super) fn bootstrap(ir: &Ir, opts: &EnvoyOptions) -> Value {
    let buffer_limit = ir.max_body_bytes.saturating_add(MIB);
    let table = Table::build(ir);
    let upstream_wasm = upstream_wasm_path(opts);
    let quarantine = envoy_duration(ir.timeouts.quarantine);

    let mut clusters = Vec::new();
    let mut secrets = Vec::new();
    for (i, b) in ir.backends.iter().enumerate() {
        let c = if is_picked(ir, i) {
            pick::original_dst_cluster(ir, i, buffer_limit)
        } else {
            backend_cluster_config(b, &quarantine, buffer_limit, &opts.ca_file)
        };
        clusters.push(with_chain(c, chain_for(ir, &[i], &upstream_wasm)));
        let value = b
            .external()
            .and_then(|e| e.credential.as_ref()?.value.as_ref());
        if let Some(cred) = value {
            secrets.push(json!({"name": secret_name(&b.name), "generic_secret": {"secret": {"inline_string": cred}}}));
        }
    }
    for &i in &ir.shadow_targets {
        let b = &ir.backends[i];
        let c = shadow_cluster_config(b, SHADOW_MAX_REQUESTS, buffer_limit, &opts.ca_file);
        clusters.push(with_chain(c, chain_for(ir, &[i], &upstream_wasm)));
    }
    for (name, members) in &table.aggregates {
        let through_listeners = name.starts_with("attempts.");
        let member = if through_listeners {
            via_cluster
        } else {
            backend_cluster
        };
        let names = members
            .iter()
            .map(|&b| member(&ir.backends[b].name))
            .collect();
        let c = aggregate_cluster_config(name, names);
        // Over via- clusters the chain runs behind each attempt listener instead.
        let chain = (!through_listeners)
            .then(|| chain_for(ir, members, &upstream_wasm))
            .flatten();
        clusters.push(with_chain(c, chain));
    }
    let mut attempt_listeners = Vec::new();
    for (&i, &timeout_ms) in &table.hops {
        let b = &ir.backends[i];
        clusters.push(via_cluster_config(&b.name, b.tier, buffer_limit));
        // An attempt after a picked backend's carries that backend's pod header.
        let strip = !is_picked(ir, i) && pick::any_picked(ir);
        attempt_listeners.push(attempt_listener_config(b, timeout_ms, buffer_limit, strip));
    }

    if let Some((host, port)) = &opts.budgets_service {
        clusters.push(budgets_cluster_config(BUDGETS_CLUSTER, host, *port));
    }

    let wasm = wasm_path(opts);
    let jwt = crate::auth::jwt(&ir.router.spec);
    if let Some(c) = jwt.as_ref().filter(|_| opts.jwks_file.is_none()) {
        clusters.extend(jwt::jwks_cluster(c, &opts.ca_file));
    }
    let mut hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "llmkube",
        "codec_type": "AUTO",
        "normalize_path": true,
        "merge_slashes": true,
        "stream_idle_timeout": envoy_duration(ir.timeouts.stream_idle),
        "route_config": {"name": "llmkube", "virtual_hosts": [{
            "name": "llmkube",
            "domains": ["*"],
            "include_attempt_count_in_response": true,
            "routes": table.routes,
        }]},
        "http_filters": [
            wasm_filter("llmkube-model-router", "model-router", "llmkube", &wasm, &plugin_json(ir)),
            {"name": "envoy.filters.http.router", "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")},
        ],
    });
    if let Some(p) = &jwt {
        let auth = jwt::filters(p, opts.jwks_file.as_deref());
        if let Some(chain) = hcm["http_filters"].as_array_mut() {
            chain.splice(0..0, auth);
        }
        hcm["local_reply_config"] = local_reply_config();
    }
    let mut listeners = vec![json!({
        "name": "llmkube",
        "address": socket(&opts.listen.ip().to_string(), opts.listen.port()),
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    })];
    let hop_routes = !attempt_listeners.is_empty();
    listeners.extend(attempt_listeners);
    let mut resources = json!({
        "listeners": listeners,
        "clusters": clusters,
    });
    if !secrets.is_empty() {
        resources["secrets"] = Value::Array(secrets);
    }
    let mut bootstrap = json!({
        "node": {"id": format!("llmkube-{}", ir.key.replace('/', ".")), "cluster": "llmkube"},
        "admin": {"address": socket(&opts.admin.ip().to_string(), opts.admin.port())},
        "static_resources": resources,
        "stats_config": {"stats_tags": usage_stats_tags()},
    });
    if hop_routes {
        bootstrap["bootstrap_extensions"] = json!([{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": typed("envoy.extensions.bootstrap.internal_listener.v3.InternalListener"),
        }]);
    }
    bootstrap
}

/// The labels the filter writes into its token-usage stat names (`label=.=value;.;`), each
/// extracted as a tag, so Prometheus reads `gen_ai_client_token_usage{gen_ai_token_type=…}`.
fn usage_stats_tags() -> Value {
    router_core::budget::usage::USAGE_STAT_TAGS
        .iter()
        .map(|tag| json!({"tag_name": tag, "regex": format!(r"({tag}=\.=(.*?);\.;)")}))
        .collect()
}

/// The Host and path handling of a route that sends to this backend alone (an external backend's
/// URL authority and path prefix).
fn direct_rewrites(action: &mut Value, b: &Backend) {
    if let Some(h) = b.host_rewrite() {
        action["host_rewrite_literal"] = json!(h);
    }
    let prefix = b.path_prefix();
    if !prefix.is_empty() {
        // Requests are `/v1/...`; a base URL that already ends in /v1 replaces it, any other
        // prefix is put in front.
        let (pattern, substitution) = match prefix.strip_suffix("/v1") {
            Some(_) => ("^/v1/".to_string(), format!("{prefix}/")),
            None => ("^/".to_string(), format!("{prefix}/")),
        };
        action["regex_rewrite"] =
            json!({"pattern": {"regex": pattern}, "substitution": substitution});
    }
}

/// `attempt-<b>`: an internal listener that sends every request to `backend-<b>` with b's own
/// response-header timeout (`per_try_timeout`, no retry). A timeout is its 504, a quarantined
/// backend its immediate 503: both reach the outer route as a 5xx and move the request to the
/// next backend. No idle or request timeout here (the outer route's `idle_timeout` guards
/// streams) and no header edits beyond the direct route's Host/path handling; for an external
/// backend, `backend-<b>`'s upstream chain does the per-attempt guard, model rewrite and
/// credential.
fn attempt_listener_config(
    b: &Backend,
    timeout_ms: u64,
    buffer_limit: u64,
    strip_pod_header: bool,
) -> Value {
    let backend = b.name.as_str();
    let name = attempt_listener(backend);
    let mut action = json!({
        "cluster": backend_cluster(backend),
        "timeout": "0s",
        "retry_policy": {"num_retries": 0, "per_try_timeout": dur_ms(timeout_ms)},
    });
    direct_rewrites(&mut action, b);
    let mut route = json!({"match": {"prefix": "/"}, "route": action});
    if strip_pod_header {
        // Another backend's pod, named for an earlier attempt: none of this one's business.
        route["request_headers_to_remove"] = json!([DESTINATION_ENDPOINT_HEADER]);
    }
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name.replace('-', "_"),
        "codec_type": "AUTO",
        "stream_idle_timeout": "0s",
        "request_timeout": "0s",
        // The outer listener accepted the headers at its default limit (60 KiB) and added a few.
        "max_request_headers_kb": 96,
        "route_config": {"name": name, "virtual_hosts": [{
            "name": name,
            "domains": ["*"],
            "routes": [route],
        }]},
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")},
        ],
    });
    json!({
        "name": name,
        "internal_listener": {},
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    })
}
