//! Shadow copies the filter sends itself (the plugin config's `shadow`, written by
//! `--target agentgateway`, whose mirrors drop the body): one callout per local mirror of the
//! request's order, with the body (the mirror's served model in it) and `x-llmkube-shadow:
//! true`, made by the root context so it outlives the request; at most `max_in_flight` per
//! target across the gateway's workers, more dropped and counted; never to a cloud backend, for a sensitive request least of
//! all. Without the section (the Envoy targets, whose routes mirror) the filter sends nothing.

use serde_json::{json, Value};
use wasm_host::{Host, HttpCallReply, SharedStore};

mod support;
use support::*;

const MAX_IN_FLIGHT: usize = 4;

/// The demo router with two shadow rules: `mirror` (local, cloud, local) and a sensitive one
/// whose order would hold the cloud backend, and copies configured for both local backends.
fn config(shadow: bool) -> Value {
    let mut cfg = router_config();
    cfg["backends"][1]["served_model"] = json!("meta-llama/Llama-3-70B");
    let rules = cfg["rules"].as_array_mut().unwrap();
    rules.insert(
        0,
        json!({"name": "pii-mirror", "data_classification": ["pii"], "strategy": "shadow",
               "backends": ["qwen-small", "gpt", "llama-big"]}),
    );
    rules.push(
        json!({"name": "mirror", "models": ["mirror"], "strategy": "shadow",
                      "backends": ["qwen-small", "gpt", "llama-big"]}),
    );
    if shadow {
        let target = |b: &str| {
            json!({"backend": b, "cluster": format!("shadow-{b}"),
                   "authority": format!("{b}.llm:8000"), "timeout_ms": 30000})
        };
        cfg["shadow"] = json!({"max_in_flight": MAX_IN_FLIGHT,
                               "targets": [target("qwen-small"), target("llama-big")]});
    }
    cfg
}

fn audit_of(h: &Host) -> Value {
    let line = h
        .logs_matching("llmkube-audit ")
        .pop()
        .expect("an audit line");
    serde_json::from_str(line.split_once("llmkube-audit ").unwrap().1).unwrap()
}

/// Sends one request, answers it 200 and ends it; returns its audit record.
fn serve(h: &mut Host, extra: &[(&str, &str)], body: &str) -> Value {
    let req = post(h, extra, body);
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    h.run_response(
        req.stream,
        &[(":status", "200"), ("content-type", "application/json")],
        b"{}",
        0,
    )
    .unwrap();
    h.log_and_done(req.stream).unwrap();
    audit_of(h)
}

fn stat(h: &Host, backend: &str, what: &str) -> i64 {
    h.metric(&format!("llmkube.shadow.backend.{backend}.{what}"))
        .map_or(0, |m| m.value)
}

fn header<'a>(call: &'a wasm_host::HttpCallRecord, name: &str) -> Option<&'a str> {
    call.header(name)
}

const BODY: &str = r#"{"model":"mirror","messages":[{"role":"user","content":"mirror me"}]}"#;

#[test]
fn a_copy_goes_to_the_local_mirror_with_the_body_and_the_mark_and_outlives_the_request() {
    let mut h = host_with("llmkube_model_router", &config(true));
    let audit = serve(
        &mut h,
        &[
            ("x-request-id", "req-1"),
            ("authorization", "Bearer client-key"),
        ],
        BODY,
    );
    assert_eq!(audit["backend"], "qwen-small");
    assert_eq!(audit["shadow_sent"], json!(["llama-big"]), "{audit}");
    let calls = h.http_calls();
    assert_eq!(
        calls.len(),
        1,
        "one copy, to the local mirror only: {calls:?}"
    );
    let copy = &calls[0];
    assert_eq!(copy.upstream, "shadow-llama-big");
    assert_eq!(header(copy, ":method"), Some("POST"));
    assert_eq!(header(copy, ":path"), Some("/v1/chat/completions"));
    assert_eq!(header(copy, ":authority"), Some("llama-big.llm:8000"));
    assert_eq!(header(copy, "content-type"), Some("application/json"));
    assert_eq!(header(copy, "x-request-id"), Some("req-1"));
    assert_eq!(header(copy, "x-llmkube-shadow"), Some("true"));
    assert_eq!(
        header(copy, "authorization"),
        None,
        "a copy carries no client credential"
    );
    // The body as the mirror serves it: its served model name, every other byte as sent.
    assert_eq!(
        String::from_utf8(copy.body.clone()).unwrap(),
        BODY.replace("\"mirror\"", "\"meta-llama/Llama-3-70B\"")
    );
    // The root made it: the request has ended, the copy is still pending, and its answer
    // (discarded) frees the slot.
    assert_eq!(h.pending_http_calls(), vec![copy.token]);
    assert_ne!(copy.context_id, 0);
    assert_eq!(stat(&h, "llama-big", "sent"), 1);
    h.reply_http_call(copy.token, HttpCallReply::new(200, b"{}".to_vec()))
        .unwrap();
    assert!(h.pending_http_calls().is_empty());
    assert_eq!(stat(&h, "llama-big", "failed"), 0);
    assert!(h.dead_reason().is_none());

    // A request of a rule that is not a shadow rule: no copy.
    serve(&mut h, &[], r#"{"model":"qwen3-8b","messages":[]}"#);
    assert_eq!(h.http_calls().len(), 1);
}

#[test]
fn copies_beyond_the_bound_in_flight_are_dropped_and_counted() {
    let mut h = host_with("llmkube_model_router", &config(true));
    for i in 0..MAX_IN_FLIGHT + 2 {
        let audit = serve(&mut h, &[], BODY);
        assert_eq!(audit["outcome"], "ok", "the client is served all the same");
        if i < MAX_IN_FLIGHT {
            assert_eq!(audit["shadow_sent"], json!(["llama-big"]), "{audit}");
        } else {
            assert!(audit.get("shadow_sent").is_none(), "{audit}");
            assert_eq!(audit["shadow_dropped"], json!(["llama-big"]), "{audit}");
        }
    }
    assert_eq!(h.pending_http_calls().len(), MAX_IN_FLIGHT);
    assert_eq!(stat(&h, "llama-big", "sent"), MAX_IN_FLIGHT as i64);
    assert_eq!(stat(&h, "llama-big", "dropped"), 2);
    // A copy that fails (no answer) frees its slot too, and is counted.
    let first = h.pending_http_calls()[0];
    h.fail_http_call(first).unwrap();
    assert_eq!(stat(&h, "llama-big", "failed"), 1);
    let audit = serve(&mut h, &[], BODY);
    assert_eq!(audit["shadow_sent"], json!(["llama-big"]), "{audit}");
    assert_eq!(h.pending_http_calls().len(), MAX_IN_FLIGHT);
    assert_eq!(h.http_calls().len(), MAX_IN_FLIGHT + 1);
}

#[test]
fn a_sensitive_request_is_copied_to_local_backends_only() {
    let mut h = host_with("llmkube_model_router", &config(true));
    let audit = serve(&mut h, &[("x-llmkube-classification", "pii")], BODY);
    assert_eq!(audit["rule"], "pii-mirror");
    assert_eq!(audit["tier"], "local");
    assert_eq!(audit["shadow_sent"], json!(["llama-big"]), "{audit}");
    let calls = h.http_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].upstream, "shadow-llama-big");
    assert!(calls.iter().all(|c| !c.upstream.contains("gpt")));

    // A plugin config naming the cloud backend as a copy target is refused outright.
    let mut cfg = config(true);
    cfg["shadow"]["targets"][0]["backend"] = json!("gpt");
    let opts = wasm_host::VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&cfg).unwrap());
    let refused = Host::from_file(wasm("llmkube_model_router"), opts).unwrap();
    assert!(!refused.configure_ok());
    assert!(refused.logged("shadow copies go to local backends only"));
}

#[test]
fn without_the_section_the_filter_sends_no_copy() {
    let mut h = host_with("llmkube_model_router", &config(false));
    let audit = serve(&mut h, &[], BODY);
    assert_eq!(audit["backend"], "qwen-small");
    assert!(h.http_calls().is_empty());
    assert!(audit.get("shadow_sent").is_none());
}

#[test]
fn the_bound_holds_across_workers_sharing_the_gateway() {
    let shared = SharedStore::new();
    let cfg = config(true);
    let mut one = worker(&shared, &cfg, Some(1));
    let mut two = worker(&shared, &cfg, Some(2));
    for _ in 0..MAX_IN_FLIGHT - 1 {
        serve(&mut one, &[], BODY);
    }
    assert_eq!(
        serve(&mut two, &[], BODY)["shadow_sent"],
        json!(["llama-big"])
    );
    let audit = serve(&mut two, &[], BODY);
    assert_eq!(audit["shadow_dropped"], json!(["llama-big"]), "{audit}");
    assert_eq!(
        one.pending_http_calls().len() + two.pending_http_calls().len(),
        MAX_IN_FLIGHT
    );
    // One worker's answer frees a slot for the other.
    let token = one.pending_http_calls()[0];
    one.reply_http_call(token, HttpCallReply::new(204, Vec::new()))
        .unwrap();
    assert_eq!(
        serve(&mut two, &[], BODY)["shadow_sent"],
        json!(["llama-big"])
    );
}
