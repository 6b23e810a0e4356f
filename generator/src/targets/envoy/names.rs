//! Names of the generated listeners, clusters and secrets (docs/architecture.md, "Failover,
//! weighted picks, shadow, quarantine").

pub use crate::ir::callout_clusters::{backend_cluster, BUDGETS_CLUSTER};

pub fn shadow_cluster(name: &str) -> String {
    format!("shadow-{name}")
}
pub fn aggregate_cluster(order: &[&str]) -> String {
    format!("order.{}", order.join("."))
}
/// The aggregate of a route whose attempts have different timeouts: over `via-<b>` clusters.
pub fn attempts_cluster(order: &[&str]) -> String {
    format!("attempts.{}", order.join("."))
}
/// A cluster whose one endpoint is the internal listener [`attempt_listener`] of a backend.
pub fn via_cluster(name: &str) -> String {
    format!("via-{name}")
}
/// The internal listener that sends one attempt to `backend-<name>` with that backend's timeout.
pub fn attempt_listener(name: &str) -> String {
    format!("attempt-{name}")
}
pub fn secret_name(backend: &str) -> String {
    format!("cred-{backend}")
}
