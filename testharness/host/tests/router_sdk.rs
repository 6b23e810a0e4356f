//! What SDK clients read off the model-router filter's answers: `GET /v1/models/{id}`, the
//! request id on every response (the one the audit line records), Anthropic-shaped errors on the
//! Messages path and `Retry-After` while the backends a request could use are quarantined.

use serde_json::Value;
use std::time::Duration;
use wasm_host::{Host, StreamOutcome};

mod support;
use support::*;

fn get(h: &mut Host, path: &str, extra: &[(&str, &str)]) -> StreamOutcome {
    let mut headers = vec![(":method", "GET"), (":path", path), (":authority", "gw")];
    headers.extend_from_slice(extra);
    h.run_request(&headers, b"", 0).expect("no trap")
}

fn messages(h: &mut Host, extra: &[(&str, &str)], body: &str) -> StreamOutcome {
    let len = body.len().to_string();
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/v1/messages"),
        ("content-length", len.as_str()),
    ];
    headers.extend_from_slice(extra);
    h.run_request(&headers, body.as_bytes(), 0)
        .expect("no trap")
}

fn audit_ids(h: &Host) -> Vec<String> {
    h.logs_matching("llmkube-audit ")
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l.split_once("llmkube-audit ").unwrap().1).unwrap();
            v["request_id"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

fn local(o: &StreamOutcome) -> &wasm_host::LocalResponse {
    o.local_response.as_ref().expect("a local response")
}

#[test]
fn a_listed_model_is_retrievable_and_an_unlisted_one_is_404() {
    let mut h = router();
    let o = get(&mut h, "/v1/models/qwen3-8b", &[("x-request-id", "rid-m")]);
    let r = local(&o);
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["object"].as_str()),
        (Some("qwen3-8b"), Some("model"))
    );
    assert_eq!(r.header("x-request-id"), Some("rid-m"));
    let o = get(&mut h, "/v1/models/llama-big?x=1", &[]);
    let v: Value = serde_json::from_slice(&local(&o).body).unwrap();
    assert_eq!(v["context_length"], 131072);
    // The name behind a displayName is not an id of the list.
    let o = get(
        &mut h,
        "/v1/models/qwen-small",
        &[("x-request-id", "rid-404")],
    );
    assert_eq!(error_of(&o), (404, "model_not_found".into()));
    assert_eq!(local(&o).header("x-request-id"), Some("rid-404"));
    h.log_and_done(o.stream).unwrap();
    assert_eq!(audit_ids(&h), ["rid-404"]);
}

#[test]
fn every_answer_carries_the_request_id_the_audit_line_records() {
    let mut h = router();
    // Envoy's own id: on a forwarded response, and on the filter's own errors.
    let req = post(
        &mut h,
        &[("x-request-id", "envoy-rid-1")],
        r#"{"model":"qwen3-8b"}"#,
    );
    let res = h
        .run_response(
            req.stream,
            &[(":status", "200"), ("x-request-id", "vllm-own")],
            b"{}",
            0,
        )
        .unwrap();
    assert_eq!(res.header("x-request-id"), Some("envoy-rid-1"));
    h.log_and_done(req.stream).unwrap();
    let bad = post(&mut h, &[("x-request-id", "envoy-rid-2")], "{");
    assert_eq!(local(&bad).header("x-request-id"), Some("envoy-rid-2"));
    h.log_and_done(bad.stream).unwrap();
    // None from the gateway: the filter makes one, sends it upstream and answers with it.
    let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    let made = req
        .header("x-request-id")
        .expect("sent upstream")
        .to_string();
    assert_eq!(made.len(), 36);
    let res = h
        .run_response(req.stream, &[(":status", "200")], b"{}", 0)
        .unwrap();
    assert_eq!(res.header("x-request-id"), Some(made.as_str()));
    h.log_and_done(req.stream).unwrap();
    let other = post(&mut h, &[], "{");
    let other_id = local(&other).header("x-request-id").unwrap().to_string();
    assert_ne!(other_id, made);
    h.log_and_done(other.stream).unwrap();
    assert_eq!(
        audit_ids(&h),
        [
            "envoy-rid-1",
            "envoy-rid-2",
            made.as_str(),
            other_id.as_str()
        ]
    );
    // Not ours to route, still numbered.
    let passed = get(&mut h, "/healthz", &[("x-request-id", "rid-p")]);
    let res = h
        .run_response(passed.stream, &[(":status", "404")], b"", 0)
        .unwrap();
    assert_eq!(res.header("x-request-id"), Some("rid-p"));
}

#[test]
fn the_messages_path_answers_in_anthropic_shape() {
    let mut h = router();
    let o = messages(&mut h, &[("x-request-id", "rid-a")], r#"{"max_tokens":1}"#);
    let r = local(&o);
    assert_eq!(r.status, 400);
    assert_eq!(r.header("request-id"), Some("rid-a"));
    assert_eq!(r.header("x-request-id"), Some("rid-a"));
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["details"]["error_code"], "missing_model");
    assert_eq!(v["request_id"], "rid-a");
    // A failed upstream on the Messages path: Anthropic's api_error, same 502.
    let req = messages(&mut h, &[], r#"{"model":"qwen3-8b","max_tokens":1}"#);
    let res = h
        .run_response(req.stream, &[(":status", "500")], b"", 0)
        .unwrap();
    let v: Value = serde_json::from_slice(&local(&res).body).unwrap();
    assert_eq!(local(&res).status, 502);
    assert_eq!(
        (
            v["error"]["type"].as_str(),
            v["error"]["details"]["error_code"].as_str()
        ),
        (Some("api_error"), Some("all_backends_failed"))
    );
    // The other paths keep OpenAI's shape.
    assert_eq!(
        error_of(&post(&mut h, &[], r#"{"max_tokens":1}"#)),
        (400, "missing_model".into())
    );
}

fn fail_upstream(h: &mut Host, req: &StreamOutcome, status: &str, details: &str) -> StreamOutcome {
    h.set_property(&["response", "code_details"], details.as_bytes());
    h.run_response(req.stream, &[(":status", status)], b"", 0)
        .unwrap()
}

#[test]
fn a_failure_that_leaves_the_route_ejected_says_when_to_come_back() {
    let mut h = router();
    let retry = |o: &StreamOutcome| local(o).header("retry-after").map(str::to_string);
    // qwen-small's own 500: Envoy ejects it for 15 s, released on its next 1 s tick.
    let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    let res = fail_upstream(&mut h, &req, "500", "via_upstream");
    assert_eq!(error_of(&res), (502, "all_backends_failed".into()));
    assert_eq!(retry(&res).as_deref(), Some("16"));
    h.log_and_done(req.stream).unwrap();
    // Envoy then finds it ejected: counted from the failure this worker saw.
    h.advance_clock(Duration::from_secs(5)).unwrap();
    let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    let res = fail_upstream(&mut h, &req, "503", "no_healthy_upstream");
    assert_eq!(retry(&res).as_deref(), Some("11"));
    h.log_and_done(req.stream).unwrap();
    // A sensitive request whose local backends are all ejected: 503 fail_closed, the earlier
    // of the two (llama-big never seen failing: the whole duration from now).
    let req = post(
        &mut h,
        &[("x-llmkube-classification", "pii")],
        r#"{"model":"m"}"#,
    );
    let res = fail_upstream(&mut h, &req, "503", "no_healthy_upstream");
    assert_eq!(error_of(&res), (503, "fail_closed".into()));
    assert_eq!(retry(&res).as_deref(), Some("11"));
    h.log_and_done(req.stream).unwrap();
    // A timeout ejects nothing, nor does a reset; nothing to wait for.
    for (status, details) in [
        ("504", "upstream_per_try_timeout"),
        (
            "503",
            "upstream_reset_before_response_started{remote_reset}",
        ),
    ] {
        let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
        let res = fail_upstream(&mut h, &req, status, details);
        assert_eq!(error_of(&res), (502, "all_backends_failed".into()));
        assert_eq!(retry(&res), None, "{details}");
        h.log_and_done(req.stream).unwrap();
    }
}

#[test]
fn a_refusal_for_the_filters_own_quarantine_says_when_it_ends() {
    let mut h = router();
    let md = [
        "xds",
        "upstream_host_metadata",
        "filter_metadata",
        "llmkube",
    ];
    // qwen-small's stream goes silent past the idle timeout: the filter quarantines it 15 s.
    let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    h.set_property(
        &[md[0], md[1], md[2], md[3], "backend"],
        b"qwen-small".as_slice(),
    );
    h.set_property(
        &["response", "code_details"],
        b"stream_idle_timeout".as_slice(),
    );
    h.response_headers(
        req.stream,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        false,
    )
    .unwrap();
    h.response_body(req.stream, b"data: {}\n\n", false).unwrap();
    h.log_and_done(req.stream).unwrap();
    h.advance_clock(Duration::from_millis(2_500)).unwrap();
    let o = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    assert_eq!(error_of(&o), (502, "all_backends_failed".into()));
    assert_eq!(local(&o).header("retry-after"), Some("13"));
    // Nothing quarantined stands behind a refusal for bad input.
    let o = post(&mut h, &[], "{");
    assert_eq!(local(&o).header("retry-after"), None);
}
