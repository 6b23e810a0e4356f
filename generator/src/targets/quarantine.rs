//! The quarantine as Envoy cluster settings, one definition for every Envoy-based target: one
//! 5xx ejects a backend for `proxy.quarantineDuration` (`base = max ejection time`, so a
//! repeated failure does not lengthen it), statistical ejection is off (a many-endpoint backend
//! is never ejected for being slow), and a TCP health check catches refused connections, without
//! a passing check ever ending the quarantine early.
//!
//! The envoy target writes [`outlier_detection`] and [`health_check`] whole on each backend
//! cluster. Envoy Gateway's BackendTrafficPolicy expresses only some of these fields
//! (`healthCheck.passive` / `.active`, built by the envoy-gateway target from the constants
//! here); the others, [`untyped_outlier_detection`] and [`untyped_health_check`], are what its
//! EnvoyPatchPolicy adds to the clusters Envoy Gateway generates.

use serde_json::{json, Map, Value};

/// Consecutive 5xx answers that eject a backend.
pub const CONSECUTIVE_5XX: u32 = 1;
/// Outlier detection's sweep (an ejection ends at the first sweep after its time has passed).
pub const DETECTION_INTERVAL: &str = "1s";
/// Every endpoint of a backend may be ejected.
pub const MAX_EJECTION_PERCENT: u32 = 100;
/// The TCP health check's timeout and interval.
pub const CHECK_TIMEOUT: &str = "1s";
pub const CHECK_INTERVAL: &str = "1s";
/// One failed check marks a backend down, one passing check marks it up.
pub const CHECK_THRESHOLD: u32 = 1;
/// No panic mode: an order whose backends are all quarantined answers 503 instead of sending to
/// a quarantined one.
pub const PANIC_THRESHOLD: u32 = 0;

/// The `outlier_detection` fields Envoy Gateway writes from `healthCheck.passive`
/// (envoyproxy/gateway `internal/xds/translator/cluster.go`, `buildXdsOutlierDetection`).
const TYPED_OUTLIER_DETECTION: [&str; 5] = [
    "consecutive_5xx",
    "interval",
    "base_ejection_time",
    "max_ejection_percent",
    "split_external_local_origin_errors",
];
/// The health check fields Envoy Gateway writes from `healthCheck.active` (`buildXdsHealthCheck`).
const TYPED_HEALTH_CHECK: [&str; 5] = [
    "timeout",
    "interval",
    "unhealthy_threshold",
    "healthy_threshold",
    "tcp_health_check",
];

/// A cluster's `outlier_detection` for a quarantine of `quarantine` (an xDS duration, `15s`).
pub fn outlier_detection(quarantine: &str) -> Value {
    json!({
        "consecutive_5xx": CONSECUTIVE_5XX,
        "enforcing_consecutive_5xx": 100,
        "interval": DETECTION_INTERVAL,
        "base_ejection_time": quarantine,
        "max_ejection_time": quarantine,
        "max_ejection_percent": MAX_EJECTION_PERCENT,
        "split_external_local_origin_errors": true,
        "enforcing_consecutive_local_origin_failure": 0,
        "enforcing_success_rate": 0,
        "enforcing_local_origin_success_rate": 0,
        // Envoy's default lets the next passing TCP health check (1 s) lift the ejection, which
        // would end the quarantine long before `quarantineDuration`.
        "successful_active_health_check_uneject_host": false,
    })
}

/// A cluster's (only) health check for a quarantine of `quarantine`.
pub fn health_check(quarantine: &str) -> Value {
    json!({
        "timeout": CHECK_TIMEOUT,
        "interval": CHECK_INTERVAL,
        // Envoy's default (60 s) would leave a backend that saw no traffic unchecked that long.
        "no_traffic_interval": "1s",
        // Checks of a backend marked down (and Envoy's unhealthy edge interval, which defaults
        // to this): a refused connection is a network error, which quarantines for
        // `quarantineDuration` like a 5xx instead of ending at the next 1 s check; a backend
        // that stays down is probed once per quarantine (the seed's half-open probe).
        "unhealthy_interval": quarantine,
        "unhealthy_threshold": CHECK_THRESHOLD,
        "healthy_threshold": CHECK_THRESHOLD,
        "tcp_health_check": {},
    })
}

/// The `healthy_panic_threshold` of a quarantined cluster's `common_lb_config`.
pub fn healthy_panic_threshold() -> Value {
    json!({"value": PANIC_THRESHOLD})
}

/// A quarantined cluster's `common_lb_config.update_merge_window`. Envoy merges health-only
/// host updates (an ejection, a failed check) for up to 1 s by default before the workers'
/// load balancers see them; with none, a quarantine holds on every worker from the moment
/// Envoy counts it, so the request after the failing one is not sent to the backend.
pub const UPDATE_MERGE_WINDOW: &str = "0s";

/// A quarantined cluster's `common_lb_config`: no panic mode, no merged health updates.
pub fn common_lb_config() -> Value {
    json!({
        "healthy_panic_threshold": healthy_panic_threshold(),
        "update_merge_window": UPDATE_MERGE_WINDOW,
    })
}

fn without(v: Value, typed: &[&str]) -> Map<String, Value> {
    let Value::Object(mut m) = v else {
        return Map::new();
    };
    m.retain(|k, _| !typed.contains(&k.as_str()));
    m
}

/// The [`outlier_detection`] fields a BackendTrafficPolicy cannot set.
pub fn untyped_outlier_detection(quarantine: &str) -> Map<String, Value> {
    without(outlier_detection(quarantine), &TYPED_OUTLIER_DETECTION)
}

/// The [`health_check`] fields a BackendTrafficPolicy cannot set.
pub fn untyped_health_check(quarantine: &str) -> Map<String, Value> {
    without(health_check(quarantine), &TYPED_HEALTH_CHECK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Envoy Gateway cannot express is exactly what makes a quarantine outlast passing
    /// health checks and repeated failures.
    #[test]
    fn the_untyped_fields_are_those_envoy_gateway_lacks() {
        let od: Vec<String> = untyped_outlier_detection("7s").keys().cloned().collect();
        assert_eq!(
            od,
            [
                "enforcing_consecutive_5xx",
                "enforcing_consecutive_local_origin_failure",
                "enforcing_local_origin_success_rate",
                "enforcing_success_rate",
                "max_ejection_time",
                "successful_active_health_check_uneject_host",
            ]
        );
        let hc = untyped_health_check("7s");
        assert_eq!(hc.len(), 2);
        assert_eq!(hc["unhealthy_interval"], "7s");
        assert_eq!(hc["no_traffic_interval"], "1s");
        for f in TYPED_OUTLIER_DETECTION {
            assert!(outlier_detection("7s").get(f).is_some(), "{f}");
        }
        for f in TYPED_HEALTH_CHECK {
            assert!(health_check("7s").get(f).is_some(), "{f}");
        }
    }
}
