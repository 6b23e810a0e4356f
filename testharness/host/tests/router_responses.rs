//! The model-router filter's response phase: upstream failures become the documented errors,
//! stream cuts quarantine a backend on every worker, the tier check on sensitive requests, and
//! when endpoint metadata is read.

use serde_json::Value;
use wasm_host::{Host, LogLevel, StreamOutcome, VmOptions};

mod support;
use support::*;

fn respond(
    h: &mut Host,
    req: &StreamOutcome,
    status: &str,
    metadata: &[(&str, &str)],
) -> StreamOutcome {
    for (k, v) in metadata {
        h.set_property(
            &[
                "xds",
                "upstream_host_metadata",
                "filter_metadata",
                "llmkube",
                k,
            ],
            v.as_bytes(),
        );
    }
    h.run_response(
        req.stream,
        &[
            (":status", status),
            ("content-type", "application/json"),
            ("x-envoy-attempt-count", "2"),
        ],
        b"{}",
        0,
    )
    .unwrap()
}

#[test]
fn failed_upstreams_become_502_or_fail_closed_503() {
    let mut h = router();
    let req = post(&mut h, &[], r#"{"model":"qwen3-8b"}"#);
    let res = respond(
        &mut h,
        &req,
        "503",
        &[("backend", "qwen-small"), ("tier", "local")],
    );
    assert_eq!(error_of(&res), (502, "all_backends_failed".into()));

    let req = post(
        &mut h,
        &[("x-llmkube-classification", "pii")],
        r#"{"model":"qwen3-8b"}"#,
    );
    // Envoy's own "no healthy upstream": no endpoint metadata.
    let mut h2 = router();
    let req2 = post(
        &mut h2,
        &[("x-llmkube-classification", "pii")],
        r#"{"model":"qwen3-8b"}"#,
    );
    let res = h2
        .run_response(
            req2.stream,
            &[(":status", "503")],
            b"no healthy upstream",
            0,
        )
        .unwrap();
    assert_eq!(error_of(&res), (503, "fail_closed".into()));
    // A 4xx passes through; the attempt count header does not.
    let res = respond(
        &mut h,
        &req,
        "429",
        &[("backend", "llama-big"), ("tier", "local")],
    );
    assert!(res.local_response.is_none());
    assert_eq!(res.header("x-envoy-attempt-count"), None);
}

/// Two workers (two VMs) sharing one shared-data store, as Envoy's workers share a vm_id.
fn two_workers() -> (Host, Host) {
    let shared = wasm_host::SharedStore::new();
    let mk = || {
        let opts = VmOptions {
            root_id: "model-router".into(),
            ..Default::default()
        }
        .with_plugin_config(serde_json::to_vec(&router_config()).unwrap())
        .allow_stop_iteration(true)
        .with_shared(&shared);
        let h = Host::from_file(wasm("llmkube_model_router"), opts).expect("module loads");
        assert!(h.configure_ok(), "{:?}", h.logs());
        h
    };
    (mk(), mk())
}

/// Starts a streamed answer from `backend` and ends the stream the way Envoy ends it, with the
/// given response code details, without the response ever reaching end of stream.
fn cut_stream(h: &mut Host, req: &StreamOutcome, backend: &str, details: &str) {
    let md = [
        "xds",
        "upstream_host_metadata",
        "filter_metadata",
        "llmkube",
    ];
    h.set_property(&[md[0], md[1], md[2], md[3], "backend"], backend.as_bytes());
    h.set_property(&[md[0], md[1], md[2], md[3], "tier"], b"local".as_slice());
    h.set_property(&["response", "code_details"], details.as_bytes());
    h.response_headers(
        req.stream,
        &[(":status", "200"), ("content-type", "text/event-stream")],
        false,
    )
    .unwrap();
    h.response_body(req.stream, b"data: {}\n\n", false).unwrap();
    h.log_and_done(req.stream).unwrap();
}

const PII: &[(&str, &str)] = &[("x-llmkube-classification", "pii")];

/// A stream cut by the idle timeout quarantines the backend that went silent: this worker leaves
/// it out of the attempt order at once, the other worker after its next tick, both until
/// quarantine_ms (default 15 s) has passed. A client hanging up, or a complete stream, does not.
#[test]
fn stream_idle_cut_quarantines_the_silent_backend_on_every_worker() {
    let (mut w1, mut w2) = two_workers();
    assert_eq!(
        w1.tick_period(),
        Some(std::time::Duration::from_millis(100))
    );
    let full = "regulated/llama-big,qwen-small";
    let route = |h: &mut Host| {
        post(h, PII, r#"{"model":"m"}"#)
            .header("x-llmkube-route")
            .map(str::to_string)
    };

    // A client cancel mid-stream is not the backend's fault.
    let req = post(&mut w1, PII, r#"{"model":"m"}"#);
    cut_stream(&mut w1, &req, "llama-big", "downstream_remote_disconnect");
    assert_eq!(route(&mut w1).as_deref(), Some(full));

    let req = post(&mut w1, PII, r#"{"model":"m"}"#);
    cut_stream(&mut w1, &req, "llama-big", "stream_idle_timeout");
    assert_eq!(
        w1.metric("llmkube.quarantines.backend.llama-big")
            .map(|m| m.value),
        Some(1)
    );
    assert!(w1.logged("backend llama-big quarantined for 15000 ms"));
    assert_eq!(route(&mut w1).as_deref(), Some("regulated/qwen-small"));
    // The backend header and audit follow the shortened order.
    let o = post(&mut w1, PII, r#"{"model":"m"}"#);
    assert_eq!(o.header("x-llmkube-backend"), Some("qwen-small"));

    // The other worker: its copy is refreshed on the tick.
    assert_eq!(route(&mut w2).as_deref(), Some(full));
    w2.tick().unwrap();
    assert_eq!(route(&mut w2).as_deref(), Some("regulated/qwen-small"));

    // Every backend of a one-backend rule quarantined: answered without an upstream.
    let req = post(&mut w2, &[], r#"{"model":"qwen3-8b"}"#);
    cut_stream(&mut w2, &req, "qwen-small", "stream_idle_timeout");
    assert_eq!(
        error_of(&post(&mut w2, &[], r#"{"model":"qwen3-8b"}"#)),
        (502, "all_backends_failed".into())
    );
    let o = post(&mut w2, PII, r#"{"model":"m"}"#);
    assert_eq!(error_of(&o), (503, "fail_closed".into()));

    // Expiry: back in the order on both workers after 15 s.
    for w in [&mut w1, &mut w2] {
        w.advance_clock(std::time::Duration::from_millis(14_900))
            .unwrap();
        assert_ne!(route(w).as_deref(), Some(full));
        w.advance_clock(std::time::Duration::from_millis(200))
            .unwrap();
        assert_eq!(route(w).as_deref(), Some(full));
    }

    // A stream that reached its end is not quarantined whatever the details say.
    let req = post(&mut w1, PII, r#"{"model":"m"}"#);
    let md = [
        "xds",
        "upstream_host_metadata",
        "filter_metadata",
        "llmkube",
    ];
    w1.set_property(
        &[md[0], md[1], md[2], md[3], "backend"],
        b"llama-big".as_slice(),
    );
    w1.set_property(
        &["response", "code_details"],
        b"stream_idle_timeout".as_slice(),
    );
    w1.run_response(req.stream, &[(":status", "200")], b"{}", 0)
        .unwrap();
    w1.log_and_done(req.stream).unwrap();
    assert_eq!(route(&mut w1).as_deref(), Some(full));
}

#[test]
fn a_sensitive_request_answered_by_cloud_is_reported_loudly() {
    let mut h = router();
    let req = post(
        &mut h,
        &[("x-llmkube-classification", "phi")],
        r#"{"model":"qwen3-8b"}"#,
    );
    respond(
        &mut h,
        &req,
        "200",
        &[("backend", "gpt"), ("tier", "cloud")],
    );
    assert!(h
        .logs()
        .iter()
        .any(|(l, m)| *l == LogLevel::Critical && m.contains("SENSITIVE DATA VIOLATION")));
    let m = h
        .metric("llmkube.sensitive_violations")
        .expect("violation counter");
    assert_eq!(m.value, 1);
    h.log_and_done(req.stream).unwrap();
    let audit = h.logs_matching("llmkube-audit ");
    let v: Value = serde_json::from_str(
        audit
            .last()
            .unwrap()
            .split_once("llmkube-audit ")
            .unwrap()
            .1,
    )
    .unwrap();
    assert_eq!(v["violation"], true);
    assert_eq!(v["backend"], "gpt");
}

/// The endpoint's metadata is read on the response path only when it can say something the
/// decision does not: the order has a backend Envoy may have failed over to, or the request is
/// sensitive (the tier check is the alarm for a route table that sent it somewhere it must not
/// go). Each read is a property evaluation in Envoy, the dearest hostcall the filter makes.
#[test]
fn endpoint_metadata_is_read_only_when_it_can_differ_from_the_decision() {
    let endpoint_reads = |h: &Host| {
        h.property_reads()
            .iter()
            .filter(|p| p.iter().any(|s| s == "upstream_host_metadata"))
            .count()
    };
    let mut h = router();
    /// Request headers, model, endpoint metadata of the answer, endpoint reads expected.
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        &'a str,
        &'a [(&'a str, &'a str)],
        usize,
    );
    let cases: [Case; 3] = [
        // Rule `qwen`: one backend, not sensitive — nothing to ask.
        (
            &[],
            "qwen3-8b",
            &[("backend", "qwen-small"), ("tier", "local")],
            0,
        ),
        // Rule `research`: gpt then llama-big — ask which one answered.
        (
            &[("x-team", "research")],
            "m",
            &[("backend", "llama-big"), ("tier", "local")],
            2,
        ),
        // Sensitive: always asked, whatever the order.
        (PII, "m", &[("backend", "llama-big"), ("tier", "local")], 2),
    ];
    for (headers, model, served, reads) in cases {
        let before = endpoint_reads(&h);
        let req = post(&mut h, headers, &format!(r#"{{"model":"{model}"}}"#));
        assert!(req.local_response.is_none(), "{model} {headers:?}");
        let res = respond(&mut h, &req, "200", served);
        assert!(res.local_response.is_none());
        h.log_and_done(req.stream).unwrap();
        assert_eq!(endpoint_reads(&h) - before, reads, "{model} {headers:?}");
        let line = h.logs_matching("\"backend\"").pop().unwrap_or_default();
        assert!(
            line.contains(&format!("\"backend\":\"{}\"", served[0].1)),
            "{line}"
        );
    }
}
