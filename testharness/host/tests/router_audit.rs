//! The model-router filter's audit line: one per request, what it carries under each audit
//! policy, and none built when the host would drop it.

use serde_json::{json, Value};
use wasm_host::{Host, LogLevel, VmOptions};

mod support;
use support::*;

#[test]
fn every_request_leaves_one_audit_line() {
    let mut h = router();
    let req = post(
        &mut h,
        &[
            ("x-request-id", "rid-1"),
            ("x-llmkube-client", "svc-a\u{1}"),
            ("authorization", "Bearer sk-client-secret"),
            ("x-llmkube-task-complexity", "simple"),
        ],
        r#"{"model":"qwen3-8b","stream":true}"#,
    );
    h.run_response(
        req.stream,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        b"data: {}\n\n",
        0,
    )
    .unwrap();
    h.log_and_done(req.stream).unwrap();
    let bad = post(&mut h, &[], "{");
    h.log_and_done(bad.stream).unwrap();
    let lines = h.logs_matching("llmkube-audit ");
    assert_eq!(lines.len(), 2, "{lines:?}");
    let parse = |l: &str| -> Value {
        serde_json::from_str(l.split_once("llmkube-audit ").unwrap().1).unwrap()
    };
    let ok = parse(&lines[0]);
    assert_eq!(ok["request_id"], "rid-1");
    assert_eq!(ok["router"], "llm/demo");
    assert_eq!(ok["model"], "qwen3-8b");
    assert_eq!(ok["rule"], "qwen");
    assert_eq!(ok["backend"], "qwen-small");
    assert_eq!(ok["tier"], "local");
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["outcome"], "ok_stream");
    assert_eq!(ok["task_complexity"], "simple");
    assert_eq!(ok["caller"], "svc-a?");
    assert!(ok.get("request_body").is_none());
    assert_eq!(parse(&lines[1])["outcome"], "invalid_request");
    assert!(
        !h.logs().iter().any(|(_, m)| m.contains("sk-client-secret")),
        "credential in logs"
    );
}

#[test]
fn audit_client_address_and_body_follow_the_audit_policy() {
    let mut cfg = router_config();
    cfg["audit"] = json!({
        "log_client_address": true,
        "trusted_proxy_cidrs": ["10.0.0.0/8"],
        "include_request_body": true
    });
    let opts = VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&cfg).unwrap())
    .allow_stop_iteration(true)
    .with_property(&["source", "address"], "10.1.2.3:41000");
    let mut h = Host::from_file(wasm("llmkube_model_router"), opts).unwrap();
    let body = r#"{"model":"qwen3-8b","messages":[]}"#;
    let req = post(
        &mut h,
        &[("x-forwarded-for", "203.0.113.9, 10.9.9.9")],
        body,
    );
    h.log_and_done(req.stream).unwrap();
    let line = h.logs_matching("llmkube-audit ").pop().unwrap();
    let v: Value = serde_json::from_str(line.split_once("llmkube-audit ").unwrap().1).unwrap();
    // The peer is a trusted proxy: the rightmost untrusted X-Forwarded-For hop is the client.
    assert_eq!(v["client"], "203.0.113.9");
    assert_eq!(v["request_body"], body);

    // Defaults: neither the client address nor the body is logged.
    let mut h = router();
    let req = post(&mut h, &[("x-forwarded-for", "203.0.113.9")], body);
    h.log_and_done(req.stream).unwrap();
    let line = h.logs_matching("llmkube-audit ").pop().unwrap();
    let v: Value = serde_json::from_str(line.split_once("llmkube-audit ").unwrap().1).unwrap();
    assert!(
        v.get("client").is_none() && v.get("request_body").is_none(),
        "{v}"
    );
}

#[test]
fn no_audit_line_is_built_when_the_host_would_drop_it() {
    let opts = VmOptions {
        root_id: "model-router".into(),
        log_level: LogLevel::Warn,
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&router_config()).unwrap())
    .allow_stop_iteration(true);
    let mut h = Host::from_file(wasm("llmkube_model_router"), opts).unwrap();
    let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    assert_eq!(req.header("x-llmkube-rule"), Some("qwen"));
    h.log_and_done(req.stream).unwrap();
    assert!(h.logs_matching("llmkube-audit ").is_empty());
    // Counters do not depend on the log level.
    assert!(
        h.metrics()
            .iter()
            .any(|m| m.name.starts_with("llmkube.requests.") && m.value == 1),
        "{:?}",
        h.metrics()
    );
}
