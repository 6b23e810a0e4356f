//! Why each rule matched a request or not, for `llmkube-gen explain` and the playground.
//!
//! The verdicts come from the same [`Router::check_rule`] the decision calls, so a trace cannot
//! disagree with where the gateway sends the request; the decision itself is still
//! [`crate::plan::plan_request`]'s, this only says why.

use crate::router::{RequestHeaders, Router};
pub use crate::verdict::{Miss, Signals};

/// The headers' signals and every rule's verdict, in rule order (later rules are checked too,
/// though the decision stops at the first one that serves).
pub fn trace_rules(
    router: &Router,
    model: &str,
    headers: &RequestHeaders,
) -> (Signals, Vec<Result<(), Miss>>) {
    let signals = router.signals(headers);
    let verdicts = (0..router.rules_len())
        .map(|i| {
            router.check_rule(
                router.rule(i),
                model,
                headers,
                &signals.classes,
                signals.complexity.as_deref(),
            )
        })
        .collect();
    (signals, verdicts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        Router::from_json(
            serde_json::json!({
                "router": "ns/r",
                "backends": [{"name": "a", "capabilities": ["tools"]}, {"name": "b"}],
                "rules": [
                    {"name": "caps", "required_capabilities": ["vision"], "backends": ["a"]},
                    {"name": "glob", "models": ["q-*"], "backends": ["a"]},
                    {"name": "hard", "task_complexity": "complex", "backends": ["b"]},
                    {"name": "pii", "data_classification": ["pii"], "backends": ["a"]},
                    {"name": "team", "headers": [{"name": "X-A", "value": "1"}, {"name": "x-b", "value": "2"}], "backends": ["b"]}
                ]
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    fn hdrs(pairs: &[(&str, &str)]) -> RequestHeaders {
        let mut h = RequestHeaders::new();
        for (n, v) in pairs {
            h.push(n.to_string(), v.to_string());
        }
        h
    }

    #[test]
    fn each_rule_names_the_condition_it_failed() {
        let r = router();
        let (signals, v) = trace_rules(&r, "m", &hdrs(&[("x-a", "1")]));
        assert!(!signals.sensitive && signals.classes.is_empty());
        assert_eq!(
            v,
            [
                Err(Miss::NoCapableBackend),
                Err(Miss::Model),
                Err(Miss::TaskComplexity),
                Err(Miss::Classification),
                Err(Miss::Header(1)),
            ]
        );
    }

    #[test]
    fn verdicts_agree_with_the_decision() {
        let r = router();
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("q-1", &[]),
            ("m", &[("x-llmkube-task-complexity", " Complex ")]),
            ("m", &[("x-llmkube-classification", "public, PII")]),
            ("m", &[("x-a", "1"), ("x-b", "2")]),
        ];
        for (model, h) in cases {
            let h = hdrs(h);
            let (_, v) = trace_rules(&r, model, &h);
            let first = v.iter().position(Result::is_ok);
            let d = r.decide(model, &h, &mut || 0).unwrap();
            assert_eq!(d.rule, first, "{model}");
        }
        let (signals, _) = trace_rules(&r, "m", &hdrs(&[("x-llmkube-classification", "PII")]));
        assert!(signals.sensitive);
        assert_eq!(signals.classes, ["pii"]);
    }
}
