//! The client-facing answers of budgets (interface: 429 `budget_exceeded`, 429
//! `budget_request_over_cap` with `x-should-retry: false`, 503 `budget_store_unavailable`), as
//! `ApiError`s with the `Retry-After` that goes with them.

use crate::errors::{ApiError, API_ERROR};

pub const RATE_LIMIT: &str = "rate_limit_error";

/// The code of a refusal no waiting can turn into an admission.
pub const OVER_CAP: &str = "budget_request_over_cap";

/// A refusal and the `Retry-After` header value that goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub error: ApiError,
    /// Whole seconds, at least 1.
    pub retry_after_s: u64,
    /// The request alone is over a cap: no retry can succeed. Answered with
    /// `x-should-retry: false` (which the OpenAI and Anthropic SDKs obey) and no `Retry-After`.
    pub never: bool,
}

/// 429: `budgets` (names, with `/team` for team ledgers) have no room for this request.
/// `never`: the request alone is over a cap, so it has a code of its own and the message says
/// what to lower.
pub fn exceeded(budgets: &[String], retry_after_s: u64, never: bool) -> Refused {
    let retry_after_s = retry_after_s.max(1);
    let names = budgets.join(", ");
    let plural = if budgets.len() > 1 { "s" } else { "" };
    if never {
        let message = format!(
            "the most this request may use (its prompt plus max_tokens, or the backend's context \
             length when max_tokens is not set) is over the cap of budget{plural} {names}, so it \
             can never be admitted; set or lower max_tokens (or shorten the prompt) to fit"
        );
        let mut r = refused(message, retry_after_s);
        r.error.code = OVER_CAP;
        r.never = true;
        return r;
    }
    refused(
        format!("budget{plural} {names} exhausted; retry after {retry_after_s} s"),
        retry_after_s,
    )
}

fn refused(message: String, retry_after_s: u64) -> Refused {
    Refused {
        error: ApiError {
            status: 429,
            kind: RATE_LIMIT,
            code: "budget_exceeded",
            param: None,
            message,
        },
        retry_after_s: retry_after_s.max(1),
        never: false,
    }
}

/// 429 for a new team when every team slot of the budget is still in use: the request is
/// admitted once a slot's team has gone quiet (`retry_after_s`).
pub fn teams_full(budget: &str, max_teams: usize, retry_after_s: u64) -> Refused {
    refused(
        format!(
            "budget {budget} already tracks its limit of {max_teams} active teams; \
             a new team is admitted when one has been idle for the whole window"
        ),
        retry_after_s,
    )
}

/// 503: the shared budget store cannot be reached and budgets fail closed. `why` is the
/// store's own error (an address or a timeout, never request content).
pub fn store_unavailable(why: &str) -> ApiError {
    ApiError {
        status: 503,
        kind: API_ERROR,
        code: "budget_store_unavailable",
        param: None,
        message: format!("the budget store cannot be reached ({why}); budgets fail closed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(e: &ApiError) -> serde_json::Value {
        serde_json::from_slice(&e.body()).unwrap()
    }

    #[test]
    fn refusals_name_the_budgets_and_carry_retry_after() {
        let r = exceeded(&["daily".into(), "teams/alpha".into()], 0, false);
        assert_eq!(r.retry_after_s, 1);
        let v = body(&r.error);
        assert_eq!(r.error.status, 429);
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(v["error"]["code"], "budget_exceeded");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("daily, teams/alpha") && m.contains("retry after 1 s"),
            "{m}"
        );
        let never = exceeded(&["small".into()], 60, true);
        assert!(never.error.message.contains("lower max_tokens"));
        assert!(never.never);
        assert_eq!(body(&never.error)["error"]["code"], OVER_CAP);
        assert!(!r.never);
        let full = teams_full("teams", 1024, 30);
        assert!(full.error.message.contains("1024 active teams"));
        assert_eq!(full.retry_after_s, 30);
        let down = store_unavailable("connect 10.0.0.5:8080: refused");
        assert_eq!((down.status, down.code), (503, "budget_store_unavailable"));
        assert_eq!(body(&down)["error"]["type"], "api_error");
    }
}
