//! Routing on the filter's decision: one AIGatewayRoute rule per route key, matching
//! `x-llmkube-route` exactly, with the order's backends by priority (attempt order); retries,
//! per-attempt timeouts and the quarantine as BackendTrafficPolicies on those rules.

use std::collections::BTreeMap;
use std::time::Duration;

use router_core::headers::ROUTE_HEADER;
use serde_json::{json, Value};

use super::names::{self, MAX_RULES_PER_ROUTE, MAX_TARGET_REFS};
use super::objects::{metadata, object, GatewayRef};
use crate::duration::gateway_duration;
use crate::ir::{Ir, RoutePlan};
use crate::targets::quarantine as q;
use crate::{Diagnostics, Problem};

const AIG_API: &str = "aigateway.envoyproxy.io/v1beta1";
const EG_API: &str = "gateway.envoyproxy.io/v1alpha1";
/// The client's credential header, never forwarded (the envoy target's routes remove it too).
const CLIENT_AUTHORIZATION: &str = "authorization";
/// Same triggers as the envoy target's `retry_on`.
const RETRY_TRIGGERS: [&str; 4] = ["5xx", "reset", "connect-failure", "refused-stream"];

/// What this target cannot express the way the envoy target does, as a warning: an order whose
/// attempts need different response-header timeouts gets the largest of them for every attempt.
/// Envoy Gateway sets one per-try timeout per route rule (BackendTrafficPolicy
/// `retry.perRetry.timeout`); the envoy target sends such attempts through one internal listener
/// per backend, which Envoy Gateway's bootstrap does not enable (no
/// `envoy.bootstrap.internal_listener`) and whose hops would bypass the clusters Envoy AI Gateway
/// builds (credentials, API translation, model override). The warning names each attempt's
/// timeout and the field it comes from, and the two ways to make them one.
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    for (i, r) in ir.router.spec.rules.iter().enumerate() {
        let plans = ir.rule_plans(&r.name);
        let Some(p) = plans.iter().find(|p| p.per_backend_timeouts()) else {
            continue;
        };
        let attempts: Vec<String> = p
            .order
            .iter()
            .zip(&p.attempt_timeouts_ms)
            .map(|(&b, &ms)| {
                let source = match ir.router.spec.backends[b].timeout {
                    Some(_) => format!("spec.backends[{b}].timeout"),
                    None => "spec.proxy.responseHeaderTimeout".to_string(),
                };
                let t = gateway_duration(Duration::from_millis(ms));
                format!("{} {t} ({source})", ir.backends[b].name)
            })
            .collect();
        let largest = gateway_duration(Duration::from_millis(per_try_ms(p)));
        diags.warn(Problem::new(
            &ir.label,
            format!("spec.rules[{i}].timeout"),
            format!("is unset and route {:?} tries backends with different response-header timeouts: {}; Envoy Gateway applies one per-try timeout per rule (BackendTrafficPolicy retry.perRetry.timeout), so every attempt gets {largest}: set spec.rules[{i}].timeout to the timeout every attempt of this rule should have, or give these backends the same timeout", p.key, attempts.join(", ")),
        ));
    }
}

/// The per-try timeout of a route: its uniform one, else the largest of its attempts (never
/// cutting an attempt before its own timeout).
fn per_try_ms(p: &RoutePlan) -> u64 {
    p.uniform_timeout_ms()
        .unwrap_or_else(|| p.attempt_timeouts_ms.iter().copied().max().unwrap_or(0))
}

/// The AIGatewayRoutes: route plans in table order, at most 15 rules each.
pub(super) fn routes(ir: &Ir, gw: &GatewayRef) -> Vec<Value> {
    let rules: Vec<Value> = ir
        .routes
        .iter()
        .enumerate()
        .map(|(i, p)| rule(ir, i, p))
        .collect();
    rules
        .chunks(MAX_RULES_PER_ROUTE)
        .enumerate()
        .map(|(i, chunk)| {
            object(
                AIG_API,
                "AIGatewayRoute",
                metadata(&names::route(ir, i), &ir.namespace, ir),
                json!({
                    "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gw.name, "namespace": gw.namespace}],
                    "rules": chunk,
                }),
            )
        })
        .collect()
}

/// One route key: its backends by priority in attempt order (Envoy Gateway moves to the next
/// priority on each retry); an external backend gets its provider's model name. The request
/// timeout is off (`0s`) as in the envoy target, so long streams are bounded by the idle timeout
/// only; Envoy AI Gateway's default of 60s would cut them.
fn rule(ir: &Ir, index: usize, p: &RoutePlan) -> Value {
    let refs: Vec<Value> = p
        .order
        .iter()
        .enumerate()
        .map(|(priority, &b)| {
            let backend = &ir.backends[b];
            let mut r = json!({"name": names::backend(ir, &backend.name), "priority": priority});
            if let Some(m) = backend.external().map(|e| e.model.as_str()) {
                r["modelNameOverride"] = json!(m);
            } else if let Some(m) = ir.served_model(backend) {
                r["modelNameOverride"] = json!(m);
            }
            r
        })
        .collect();
    json!({
        "name": names::rule(index, p.rule.as_deref()),
        "matches": [{"headers": [{"name": ROUTE_HEADER, "type": "Exact", "value": p.key}]}],
        "backendRefs": refs,
        "timeouts": {"request": "0s"},
    })
}

/// BackendTrafficPolicies on the rules (`sectionName` = rule name): rules with the same settings
/// share one, up to 16 targets each.
pub(super) fn traffic_policies(ir: &Ir, route_names: &[String]) -> Vec<Value> {
    let mut groups: BTreeMap<String, (Value, Vec<Value>)> = BTreeMap::new();
    for (i, p) in ir.routes.iter().enumerate() {
        let spec = traffic_spec(ir, p);
        let target = json!({
            "group": "gateway.networking.k8s.io",
            "kind": "HTTPRoute",
            "name": route_names[i / MAX_RULES_PER_ROUTE],
            "sectionName": names::rule(i, p.rule.as_deref()),
        });
        groups
            .entry(spec.to_string())
            .or_insert_with(|| (spec, Vec::new()))
            .1
            .push(target);
    }
    let mut docs = Vec::new();
    for (spec, targets) in groups.into_values() {
        for chunk in targets.chunks(MAX_TARGET_REFS) {
            let mut spec = spec.clone();
            spec["targetRefs"] = json!(chunk);
            let name = names::traffic_policy(ir, docs.len());
            docs.push(object(
                EG_API,
                "BackendTrafficPolicy",
                metadata(&name, &ir.namespace, ir),
                spec,
            ));
        }
    }
    docs
}

/// Retries across the order, the attempt timeout, the stream idle timeout, and the quarantine
/// as far as the typed policy expresses it ([`crate::targets::quarantine`]: one 5xx ejects a
/// backend for `proxy.quarantineDuration`, a refused connection fails the TCP health check, no
/// panic mode); the rest is patched onto the rule clusters ([`super::quarantine`]).
fn traffic_spec(ir: &Ir, p: &RoutePlan) -> Value {
    let quarantine = gateway_duration(ir.timeouts.quarantine);
    let per_try = json!({"timeout": gateway_duration(Duration::from_millis(per_try_ms(p)))});
    let retry = if is_single(p) {
        // The per-try timeout lives in the retry policy; its retry conditions are removed by
        // the patch of [`retry_on_patches`].
        json!({"numRetries": 0, "perRetry": per_try})
    } else {
        json!({
            "numRetries": p.order.len() - 1,
            "numAttemptsPerPriority": 1,
            "retryOn": {"triggers": RETRY_TRIGGERS},
            "perRetry": per_try,
        })
    };
    json!({
        "retry": retry,
        "timeout": {"http": {"streamIdleTimeout": gateway_duration(ir.timeouts.stream_idle)}},
        "healthCheck": {
            "passive": {
                "consecutive5XxErrors": q::CONSECUTIVE_5XX,
                "interval": q::DETECTION_INTERVAL,
                "baseEjectionTime": quarantine,
                "maxEjectionPercent": q::MAX_EJECTION_PERCENT,
                "splitExternalLocalOriginErrors": true,
            },
            "active": {
                "type": "TCP",
                "tcp": {},
                "timeout": q::CHECK_TIMEOUT,
                "interval": q::CHECK_INTERVAL,
                "unhealthyThreshold": q::CHECK_THRESHOLD,
                "healthyThreshold": q::CHECK_THRESHOLD,
            },
            "panicThreshold": q::PANIC_THRESHOLD,
        },
    })
}

/// A route to one backend: nothing to retry.
fn is_single(p: &RoutePlan) -> bool {
    p.order.len() == 1
}

/// Removes `retry_on` from the xDS routes of one-backend rules. Envoy reads `per_try_timeout`
/// (the response-header timeout) only from a route's retry policy, and Envoy Gateway writes
/// `retry_on: connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes`
/// into every retry policy whose BackendTrafficPolicy names no trigger (envoyproxy/gateway
/// `internal/xds/translator/route.go`, `buildRetryPolicy`, `retryDefaultRetryOn`). With any
/// retry condition Envoy's router keeps a copy of every request body it forwards, for a retry
/// that `num_retries: 0` never makes (docs/benchmarks.md, "Retries on one-backend routes");
/// the envoy target emits no `retry_on` there for the same reason.
pub(super) fn retry_on_patches(ir: &Ir, route_names: &[String], listener: &str) -> Vec<Value> {
    let singles: Vec<usize> = (0..ir.routes.len())
        .filter(|&i| is_single(&ir.routes[i]))
        .collect();
    rule_route_paths(ir, route_names, &singles)
        .into_iter()
        .map(|path| {
            json!({
                "type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": listener,
                "operation": {"op": "remove", "jsonPath": path, "path": "/route/retry_policy/retry_on"},
            })
        })
        .collect()
}

/// Removes the client's `authorization` from the requests of every route key, as the envoy
/// target's routes do (`request_headers_to_remove`): a client's bearer token or JWT never
/// reaches a backend. Route-level, so it also holds for the patch-added clusters (picked pods,
/// shadow copies) that Envoy AI Gateway's upstream filter does not run on; a backend's own
/// credential is set after it, by that upstream filter (BackendSecurityPolicy).
pub(super) fn authorization_patches(ir: &Ir, route_names: &[String], listener: &str) -> Vec<Value> {
    let all: Vec<usize> = (0..ir.routes.len()).collect();
    rule_route_paths(ir, route_names, &all)
        .into_iter()
        .map(|path| {
            json!({
                "type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
                "name": listener,
                "operation": {"op": "add", "jsonPath": path, "path": "/request_headers_to_remove", "value": [CLIENT_AUTHORIZATION]},
            })
        })
        .collect()
}

/// JSONPaths selecting, within the listener's RouteConfiguration, the xDS routes of the route
/// plans `plans` (indexes into `ir.routes`): one per HTTPRoute holding some of them.
///
/// Envoy Gateway names the xDS route of match `j` of rule `i` of HTTPRoute `ns/name`
/// `httproute/<ns>/<name>/rule/<i>/match/<j>/<hostname, dots as underscores>`
/// (`internal/gatewayapi/helpers.go` `irRouteName`, `route.go`), and Envoy AI Gateway keeps
/// the AIGatewayRoute's rules in order in its HTTPRoute. The regular expression has no `/` (it
/// would end the JSONPath regex literal): `.` stands for each separator, and the names' dots
/// are escaped.
pub(super) fn rule_route_paths(ir: &Ir, route_names: &[String], plans: &[usize]) -> Vec<String> {
    let mut by_route: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for &i in plans {
        by_route
            .entry(i / MAX_RULES_PER_ROUTE)
            .or_default()
            .push((i % MAX_RULES_PER_ROUTE).to_string());
    }
    by_route
        .into_iter()
        .filter_map(|(route, rules)| {
            let name = route_names.get(route)?;
            let re = format!(
                "^httproute.{}.{}.rule.({}).match.[0-9]+.",
                ir.namespace.replace('.', "\\."),
                name.replace('.', "\\."),
                rules.join("|")
            );
            Some(format!("$.virtual_hosts[*].routes[?(@.name =~ /{re}/)]"))
        })
        .collect()
}
