//! The clusters the filter's plugin config names for its callouts, by the names every target
//! gives them: a picked backend's engines are scraped through the backend's cluster, budgets
//! reach `llmkube-budgets` through its own.

/// The cluster of backend `name`'s endpoints.
pub fn backend_cluster(name: &str) -> String {
    format!("backend-{name}")
}

/// The cluster of the shared budget ledger `llmkube-budgets` (`--budgets-service`).
pub const BUDGETS_CLUSTER: &str = "llmkube-budgets";
