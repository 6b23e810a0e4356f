//! The per-attempt upstream filter: model rewrite and length for external backends, the span
//! handed down by the router, retries after a rewrite, and the sensitive-attempt guard.

use wasm_host::Host;

mod support;
use support::*;

#[test]
fn upstream_rewrites_model_and_fixes_length_for_external_backends() {
    let mut h = upstream(Some("claude"));
    let body = r#"{"messages":[{"role":"user","content":"x"}],"model":"qwen3-8b","stream":false}"#;
    let o = attempt(
        &mut h,
        &[("authorization", "Bearer leftover"), ("x-api-key", "old")],
        body,
    );
    let expected =
        r#"{"messages":[{"role":"user","content":"x"}],"model":"claude-opus-4-7","stream":false}"#;
    assert_eq!(o.body_str(), expected);
    assert_eq!(
        o.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(o.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(o.header("x-llmkube-attempt-backend"), Some("claude"));
    assert_eq!(o.header("authorization"), None);
    assert_eq!(o.header("x-api-key"), None);

    // The router's internal routing headers never reach a provider.
    let routing = [
        ("x-llmkube-rule", "research"),
        ("x-llmkube-backend", "gpt"),
        ("x-llmkube-route", "research/gpt,llama-big"),
    ];
    let mut h = upstream(Some("claude"));
    let o = attempt(&mut h, &routing, body);
    for (name, _) in routing {
        assert_eq!(o.header(name), None, "{name} reached the provider");
    }

    // A local backend: untouched body and headers, credentials still cleared.
    let mut h = upstream(Some("qwen-small"));
    let o = attempt(&mut h, &routing, body);
    assert_eq!(o.header("x-llmkube-route"), Some("research/gpt,llama-big"));
    let o = attempt(&mut h, &[("authorization", "Bearer leftover")], body);
    assert_eq!(o.body_str(), body);
    assert_eq!(o.header("authorization"), None);
    assert_eq!(o.header("x-llmkube-attempt-backend"), Some("qwen-small"));
}

/// The downstream filter says where `model` is when an attempt may go to an external backend;
/// the per-attempt filter then rewrites from that span alone, reading and replacing only the
/// bytes up to it (proof: a tail it never parses). A span that no longer points at the routed
/// model is not trusted: the body is scanned as before.
#[test]
fn upstream_rewrites_from_the_downstream_span_without_rescanning() {
    let body = r#"{"model":"qwen3-8b","messages":[{"role":"user","content":"x"}]}"#;
    let span = |s: &str, len: usize| format!("{s}/{len}");
    let mut r = router();
    let o = post(&mut r, &[("x-team", "research")], body);
    assert_eq!(
        o.header("x-llmkube-model-span"),
        Some(span("9-19", body.len()).as_str())
    );
    // Only orders with an external backend carry it; clients cannot send it.
    let o = post(&mut r, &[("x-llmkube-model-span", "1-5/9")], body);
    assert_eq!(o.header("x-llmkube-route"), Some("qwen/qwen-small"));
    assert_eq!(o.header("x-llmkube-model-span"), None);

    let tail_never_parsed = format!("{}<not json", &body[..body.len() - 1]);
    let mut h = upstream(Some("gpt"));
    let located = span("9-19", tail_never_parsed.len());
    let o = attempt(
        &mut h,
        &[
            ("x-llmkube-model-span", &located),
            ("x-ai-eg-model", "qwen3-8b"),
        ],
        &tail_never_parsed,
    );
    let expected = tail_never_parsed.replace("qwen3-8b", "gpt-5");
    assert_eq!(o.body_str(), expected);
    assert_eq!(
        o.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    let rescans = |h: &Host| {
        h.metric("llmkube.upstream.model_rewrite_rescans")
            .map(|m| m.value)
    };
    assert_eq!(rescans(&h), Some(0));
    // Without the span the same body cannot be rewritten (it is scanned, and invalid).
    let mut h = upstream(Some("gpt"));
    let o = attempt(&mut h, &[], &tail_never_parsed);
    assert_eq!(error_of(&o).0, 500);

    // Stale spans fall back to scanning a valid body: wrong place, wrong model, out of range.
    let n = body.len();
    for stale in [
        (span("30-36", n), "qwen3-8b"),
        (span("9-19", n), "other"),
        (span("9-19", n + 1), "qwen3-8b"),
    ] {
        let mut h = upstream(Some("gpt"));
        let o = attempt(
            &mut h,
            &[
                ("x-llmkube-model-span", &stale.0),
                ("x-ai-eg-model", stale.1),
            ],
            body,
        );
        assert_eq!(o.body_str(), body.replace("qwen3-8b", "gpt-5"), "{stale:?}");
        assert_eq!(rescans(&h), Some(1), "{stale:?}");
    }
}

/// Envoy keeps header edits across retries but sends the original body again: after an external
/// attempt rewrote `model` (and `content-length`), a fallback to a local backend must get the
/// original length back, or it would read a truncated or overlong body.
#[test]
fn upstream_restores_content_length_after_an_earlier_rewrite() {
    let body = r#"{"model":"qwen3-8b","messages":[]}"#;
    let located = format!("9-19/{}", body.len());
    let mut h = upstream(Some("llama-big"));
    let id = h.new_http_stream().unwrap();
    h.request_headers(
        id,
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-length", "31"),
            ("x-llmkube-model-span", &located),
            ("x-ai-eg-model", "qwen3-8b"),
        ],
        false,
    )
    .unwrap();
    h.request_body(id, body.as_bytes(), true).unwrap();
    let o = h.request_outcome(id).unwrap();
    assert_eq!(o.body_str(), body);
    assert_eq!(
        o.header("content-length"),
        Some(body.len().to_string().as_str())
    );
}

#[test]
fn upstream_refuses_sensitive_attempts_to_cloud_or_unknown_endpoints() {
    for backend in [Some("gpt"), None] {
        let mut h = upstream(backend);
        let o = attempt(
            &mut h,
            &[("x-llmkube-sensitive", "true")],
            r#"{"model":"m"}"#,
        );
        assert_eq!(error_of(&o), (503, "fail_closed".into()), "{backend:?}");
        assert!(o.forwarded_headers.is_none() && o.forwarded_body.is_empty());
    }
    let h = upstream(Some("gpt"));
    drop(h);
    let mut h = upstream(Some("llama-big"));
    let o = attempt(
        &mut h,
        &[("x-llmkube-sensitive", "true")],
        r#"{"model":"m"}"#,
    );
    assert!(o.local_response.is_none());
}
