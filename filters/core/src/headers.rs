//! Header names the filters stamp, clear or refuse, and the HTTP header-name syntax.
//!
//! Decision headers carry routing decisions. They are stamped only by the filters; whatever a
//! client sent under these names is removed before anything reads them
//! (`PluginConfig::stamped_headers`).

pub const RULE_HEADER: &str = "x-llmkube-rule";
pub const BACKEND_HEADER: &str = "x-llmkube-backend";
pub const DESTINATION_ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";
pub const SHADOW_HEADER: &str = "x-llmkube-shadow";
/// The attempt order (`orders::route_key`); the route table matches it exactly.
pub const ROUTE_HEADER: &str = "x-llmkube-route";
/// `true` on requests of a sensitive class, for the per-attempt guard in the upstream filter.
pub const SENSITIVE_HEADER: &str = "x-llmkube-sensitive";
/// Set by the upstream filter on each attempt to the backend it goes to, so per-backend
/// upstream filters (credential injection) can select on it.
pub const ATTEMPT_BACKEND_HEADER: &str = "x-llmkube-attempt-backend";
/// Where the body's `model` value sits (`rewrite::format_span`), stamped when an attempt may go to
/// an external backend, so the per-attempt filter rewrites it without scanning the body again.
pub const MODEL_SPAN_HEADER: &str = "x-llmkube-model-span";

/// Every decision header except the configurable model header.
pub const DECISION_HEADERS: &[&str] = &[
    RULE_HEADER,
    BACKEND_HEADER,
    DESTINATION_ENDPOINT_HEADER,
    SHADOW_HEADER,
    ROUTE_HEADER,
    SENSITIVE_HEADER,
    ATTEMPT_BACKEND_HEADER,
    MODEL_SPAN_HEADER,
];

/// Header names that carry credentials (lower-cased). Nothing may log them (an audit caller
/// header cannot name one) and every provider's credential header is among them.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// Whether `name` is an HTTP header name: an RFC 7230 `token`, one or more `tchar`.
pub fn is_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_tchar)
}

/// RFC 7230 `tchar`: `!#$%&'*+-.^_`|~`, digits and letters.
pub fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_follow_rfc_7230() {
        for ok in ["x-llmkube-rule", "X_Custom.1", "a", "!#$%&'*+-.^_`|~"] {
            assert!(is_token(ok), "{ok:?}");
        }
        for bad in [
            "",
            "has space",
            "colon:",
            "quote\"",
            "paren(",
            "tab\t",
            "é",
            "a/b",
            "[x]",
        ] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn decision_and_credential_names_are_lower_case_tokens() {
        for n in DECISION_HEADERS.iter().chain(CREDENTIAL_HEADERS) {
            assert!(is_token(n), "{n}");
            assert_eq!(n.to_ascii_lowercase(), *n);
        }
    }
}
