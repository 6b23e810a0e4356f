//! What a rule check reads from the request headers and why a rule does not match: written by
//! [`crate::router::Router::check_rule`], read by the decision and by `crate::explain`.

/// The request headers' routing signals, read once per decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signals {
    /// Classifications sent (list items and repeats), lower-cased.
    pub classes: Vec<String>,
    /// One of `classes` is sensitive: only local backends may serve.
    pub sensitive: bool,
    /// The first task-complexity value, trimmed and lower-cased.
    pub complexity: Option<String>,
}

/// The first condition of a rule that a request fails, checked in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// None of the rule's backends advertises every required capability: it never matches.
    NoCapableBackend,
    /// The model matches none of `match.models`.
    Model,
    /// `match.taskComplexity` differs from the request's.
    TaskComplexity,
    /// None of the request's classifications is in `match.dataClassification`.
    Classification,
    /// The request lacks `match.headers[i]` with exactly that value.
    Header(usize),
}
