//! The model-router and upstream filters' behaviour, on the compiled release modules, driven by
//! the wasmtime host exactly as Envoy drives them.

use serde_json::{json, Value};
use wasm_host::{Host, LogLevel, StreamOutcome, VmOptions, ENVOY_WASI_FUNCTIONS};

fn router_config() -> Value {
    json!({
        "router": "llm/demo",
        "max_body_bytes": 4096,
        "default_route_strategy": "BackendNameMatch",
        "default_route": "qwen-small",
        "backends": [
            {"name": "qwen-small", "display_name": "qwen3-8b", "capabilities": ["tools"]},
            {"name": "llama-big", "capabilities": ["tools", "long-context"], "model_info": {"context_length": 131072}},
            {"name": "gpt", "tier": "cloud", "external_model": "gpt-5", "provider": "openai"},
            {"name": "claude", "tier": "cloud", "external_model": "claude-opus-4-7", "provider": "anthropic"}
        ],
        "rules": [
            {"name": "regulated", "data_classification": ["pii", "phi"], "fail_closed": true, "backends": ["llama-big", "qwen-small"]},
            {"name": "research", "headers": [{"name": "x-team", "value": "research"}], "backends": ["gpt", "llama-big"]},
            {"name": "qwen", "models": ["qwen3-*"], "backends": ["qwen-small"]},
            {"name": "spread", "models": ["spread"], "strategy": "weighted", "backends": ["qwen-small", "llama-big"]}
        ],
        "audit": {"caller_header": "x-llmkube-client"}
    })
}

fn wasm(lib: &str) -> std::path::PathBuf {
    let package = match lib {
        "llmkube_model_router" => "llmkube-model-router",
        "llmkube_upstream" => "llmkube-upstream",
        other => panic!("unknown filter {other}"),
    };
    e2e::wasm::build_filter(package, lib)
}

fn host_with(lib: &str, config: &Value) -> Host {
    let opts = VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(config).unwrap())
    .allow_stop_iteration(true);
    let host = Host::from_file(wasm(lib), opts).expect("module loads");
    assert!(
        host.configure_ok(),
        "on_configure refused: {:?}",
        host.logs()
    );
    host
}

fn router() -> Host {
    host_with("llmkube_model_router", &router_config())
}

/// A chat-completions POST of `body` with `extra` headers, the body in `chunk`-byte pieces (one
/// piece for 0).
fn send_body(host: &mut Host, extra: &[(&str, &str)], body: &str, chunk: usize) -> StreamOutcome {
    let len = body.len().to_string();
    let mut headers = vec![
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-length", len.as_str()),
    ];
    headers.extend_from_slice(extra);
    host.run_request(&headers, body.as_bytes(), chunk)
        .expect("no trap")
}

fn post(host: &mut Host, extra: &[(&str, &str)], body: &str) -> StreamOutcome {
    let mut headers = vec![(":authority", "gw"), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    send_body(host, &headers, body, 0)
}

fn error_of(o: &StreamOutcome) -> (u32, String) {
    let r = o.local_response.as_ref().expect("a local response");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v: Value = serde_json::from_slice(&r.body).expect("JSON error body");
    (r.status, v["error"]["code"].as_str().unwrap().to_string())
}

#[test]
fn modules_import_only_what_envoy_provides() {
    for lib in ["llmkube_model_router", "llmkube_upstream"] {
        let bytes = std::fs::read(wasm(lib)).unwrap();
        for (module, name) in wasm_host::module_imports(&bytes).unwrap() {
            let ok = (module == "env" && name.starts_with("proxy_"))
                || (module == "wasi_snapshot_preview1"
                    && ENVOY_WASI_FUNCTIONS.contains(&name.as_str()));
            assert!(
                ok,
                "{lib} imports {module}.{name}, which Envoy does not provide"
            );
        }
        assert!(bytes.len() <= 600 * 1024, "{lib} is {} bytes", bytes.len());
    }
}

#[test]
fn routes_by_body_model_and_stamps_the_decision() {
    let mut h = router();
    let o = post(
        &mut h,
        &[],
        r#"{"messages":[{"role":"user","content":"hi"}],"model":"qwen3-8b"}"#,
    );
    assert!(o.local_response.is_none(), "{:?}", o.local_response);
    assert!(o.complete);
    assert_eq!(o.header("x-ai-eg-model"), Some("qwen3-8b"));
    assert_eq!(o.header("x-llmkube-rule"), Some("qwen"));
    assert_eq!(o.header("x-llmkube-backend"), Some("qwen-small"));
    assert_eq!(o.header("x-llmkube-route"), Some("qwen/qwen-small"));
    assert_eq!(o.header("x-llmkube-sensitive"), None);
    // The body goes on untouched.
    assert_eq!(
        o.body_str(),
        r#"{"messages":[{"role":"user","content":"hi"}],"model":"qwen3-8b"}"#
    );

    let o = post(&mut h, &[("x-team", "research")], r#"{"model":"anything"}"#);
    assert_eq!(o.header("x-llmkube-route"), Some("research/gpt,llama-big"));
    // BackendNameMatch, then the default route: no rule header.
    let o = post(&mut h, &[], r#"{"model":"llama-big"}"#);
    assert_eq!(o.header("x-llmkube-route"), Some("~/llama-big"));
    assert_eq!(o.header("x-llmkube-rule"), None);
    let o = post(&mut h, &[], r#"{"model":"unknown-model"}"#);
    assert_eq!(o.header("x-llmkube-backend"), Some("qwen-small"));
}

#[test]
fn client_decision_headers_are_removed_on_every_request() {
    let mut h = router();
    let spoof: Vec<(&str, &str)> = [
        "x-llmkube-backend",
        "X-LLMKUBE-RULE",
        "x-ai-eg-model",
        "x-gateway-destination-endpoint",
        "x-llmkube-shadow",
        "x-llmkube-route",
        "x-llmkube-sensitive",
        "x-llmkube-attempt-backend",
    ]
    .iter()
    .flat_map(|n| [(*n, "spoofed"), (*n, "again")])
    .collect();
    // An inference request: the filter's own values win.
    let o = post(&mut h, &spoof, r#"{"model":"qwen3-8b"}"#);
    assert_eq!(o.header("x-llmkube-backend"), Some("qwen-small"));
    let fwd = o.forwarded_headers.as_ref().unwrap();
    assert!(
        !fwd.iter().any(|(_, v)| v == "spoofed" || v == "again"),
        "{fwd:?}"
    );
    // Any other request: the headers are simply gone, so no route can use them.
    let mut headers = vec![
        (":method", "GET"),
        (":path", "/healthz"),
        (":authority", "gw"),
    ];
    headers.extend_from_slice(&spoof);
    let o = h.run_request(&headers, b"", 0).unwrap();
    let fwd = o.forwarded_headers.as_ref().unwrap();
    assert!(
        !fwd.iter().any(|(k, _)| k.starts_with("x-llmkube")
            || k == "x-ai-eg-model"
            || k == "x-gateway-destination-endpoint"),
        "{fwd:?}"
    );
}

#[test]
fn the_same_decision_whatever_the_chunking() {
    let body = r#"{"messages":[{"role":"user","content":"a fairly long prompt \"with escapes\" é"}],"stream":true,"model":"qwen3-8b"}"#;
    for chunk in [1, 2, 3, 7, 16, 64, body.len()] {
        let mut h = router();
        let len = body.len().to_string();
        let o = h
            .run_request(
                &[
                    (":method", "POST"),
                    (":path", "/v1/chat/completions"),
                    ("content-length", &len),
                ],
                body.as_bytes(),
                chunk,
            )
            .unwrap();
        assert_eq!(o.header("x-llmkube-rule"), Some("qwen"), "chunk {chunk}");
        assert_eq!(o.body_str(), body, "chunk {chunk}");
    }
}

#[test]
fn bad_bodies_get_documented_errors_and_are_not_forwarded() {
    let mut h = router();
    for (body, status, code) in [
        ("{", 400, "invalid_json"),
        ("not json", 400, "invalid_json"),
        (r#"{"model":"a","model":"b"}"#, 400, "duplicate_key"),
        (r#"{"model":"a","m":{"x":1,"x":2}}"#, 400, "duplicate_key"),
        (r#"{"messages":[]}"#, 400, "missing_model"),
        (r#"{"model":7}"#, 400, "missing_model"),
        (
            "{\"model\":\"a\\r\\nx-llmkube-backend: gpt\"}",
            400,
            "invalid_model",
        ),
    ] {
        let o = post(&mut h, &[], body);
        assert_eq!(error_of(&o), (status, code.to_string()), "{body}");
        assert!(
            o.forwarded_headers.is_none() && o.forwarded_body.is_empty(),
            "{body} was forwarded"
        );
    }
    assert!(!h.is_dead());
}

#[test]
fn body_limits_answer_413_naming_the_limit() {
    let mut h = router();
    let big = format!(r#"{{"model":"qwen3-8b","pad":"{}"}}"#, "x".repeat(5000));
    // Declared too large.
    let o = post(&mut h, &[], &big);
    let (status, code) = error_of(&o);
    assert_eq!((status, code.as_str()), (413, "request_too_large"));
    assert!(o
        .local_response
        .as_ref()
        .unwrap()
        .body_str()
        .contains("4096 bytes"));
    // Chunked, no content-length: caught as the body grows.
    let o = h
        .run_request(
            &[(":method", "POST"), (":path", "/v1/chat/completions")],
            big.as_bytes(),
            1000,
        )
        .unwrap();
    assert_eq!(error_of(&o).0, 413);
    assert!(o.forwarded_headers.is_none());
    // Exactly at the limit is fine.
    let pad = 4096 - r#"{"model":"qwen3-8b","pad":""}"#.len();
    let exact = format!(r#"{{"model":"qwen3-8b","pad":"{}"}}"#, "x".repeat(pad));
    assert_eq!(exact.len(), 4096);
    let o = post(&mut h, &[], &exact);
    assert!(o.local_response.is_none());
    // Empty body on an inference path.
    let o = h
        .run_request(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                ("content-length", "0"),
            ],
            b"",
            0,
        )
        .unwrap();
    assert_eq!(error_of(&o), (400, "invalid_json".into()));
}

#[test]
fn models_list_is_answered_from_config() {
    let mut h = router();
    let o = h
        .run_request(&[(":method", "GET"), (":path", "/v1/models?x=1")], b"", 0)
        .unwrap();
    let r = o.local_response.expect("answered locally");
    assert_eq!(r.status, 200);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["qwen3-8b", "llama-big", "gpt", "claude"]);
    assert_eq!(v["data"][1]["context_length"], 131072);
    assert_eq!(v["data"][1]["input_modalities"], json!(["text"]));
}

#[test]
fn unknown_models_and_sensitive_leaks_are_refused() {
    let mut cfg = router_config();
    cfg["default_route"] = Value::Null;
    cfg["default_route_strategy"] = json!("Static");
    let mut h = host_with("llmkube_model_router", &cfg);
    assert_eq!(
        error_of(&post(&mut h, &[], r#"{"model":"nope"}"#)),
        (404, "model_not_found".into())
    );

    let mut cfg = router_config();
    cfg["default_route"] = json!("gpt");
    cfg["sensitive_classifications"] = json!(["secret"]);
    let mut h = host_with("llmkube_model_router", &cfg);
    let o = post(
        &mut h,
        &[("x-llmkube-classification", "SECRET")],
        r#"{"model":"unknown"}"#,
    );
    assert_eq!(error_of(&o), (503, "fail_closed".into()));
    assert!(o.forwarded_headers.is_none());
    // A sensitive request on a mixed rule goes to its local backend only, and is marked.
    let o = post(
        &mut h,
        &[
            ("x-team", "research"),
            ("x-llmkube-classification", "secret"),
        ],
        r#"{"model":"m"}"#,
    );
    assert_eq!(o.header("x-llmkube-route"), Some("research/llama-big"));
    assert_eq!(o.header("x-llmkube-sensitive"), Some("true"));
}

#[test]
fn weighted_rules_spread_by_weight() {
    let mut cfg = router_config();
    cfg["backends"][0]["weight"] = json!(3);
    cfg["backends"][1]["weight"] = json!(1);
    let mut h = host_with("llmkube_model_router", &cfg);
    let mut first_small = 0;
    let n = 2000;
    for _ in 0..n {
        let o = post(&mut h, &[], r#"{"model":"spread"}"#);
        match o.header("x-llmkube-route") {
            Some("spread/qwen-small,llama-big") => first_small += 1,
            Some("spread/llama-big,qwen-small") => {}
            other => panic!("unexpected route {other:?}"),
        }
    }
    // Expected 0.75; 2000 draws: standard error ~0.01.
    let share = first_small as f64 / n as f64;
    assert!((share - 0.75).abs() < 0.05, "share {share}");
}

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
fn hostile_bodies_never_kill_the_vm() {
    let mut h = router();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let alphabet = b"{}[]\":,\\u0123456789abcdefmodel truenull-+.eE \xff\xc3\x80\x00";
    for _ in 0..500 {
        let len = (next() % 200) as usize;
        let body: Vec<u8> = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        let o = h
            .run_request(
                &[(":method", "POST"), (":path", "/v1/completions")],
                &body,
                (next() % 17 + 1) as usize,
            )
            .expect("no trap");
        if let Some(r) = &o.local_response {
            assert!([400, 404, 413, 503].contains(&r.status), "{}", r.status);
        }
    }
    let deep = format!("{{\"model\":\"m\",\"a\":{}}}", "[".repeat(100_000));
    let o = post(&mut h, &[], &deep[..4000]);
    assert_eq!(error_of(&o).0, 400);
    assert!(!h.is_dead());
    // And it still routes.
    assert_eq!(
        post(&mut h, &[], r#"{"model":"qwen3-8b"}"#).header("x-llmkube-rule"),
        Some("qwen")
    );
}

fn upstream(metadata_backend: Option<&str>) -> Host {
    let mut opts = VmOptions {
        root_id: "upstream".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&router_config()).unwrap())
    .allow_stop_iteration(true);
    if let Some(b) = metadata_backend {
        opts = opts.with_property(
            &[
                "xds",
                "upstream_host_metadata",
                "filter_metadata",
                "llmkube",
                "backend",
            ],
            b,
        );
    }
    let h = Host::from_file(wasm("llmkube_upstream"), opts).unwrap();
    assert!(h.configure_ok());
    h
}

fn attempt(h: &mut Host, extra: &[(&str, &str)], body: &str) -> StreamOutcome {
    send_body(h, extra, body, 5)
}

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
    let cases: [(&[(&str, &str)], &str, &[(&str, &str)], usize); 3] = [
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

/// Big bodies arrive in pieces and are scanned as they come (only the bytes a scan may read
/// again are kept between pieces): the decision, and the model span the per-attempt filter
/// rewrites from, are what the whole body gives, and a body broken early is refused as soon as
/// the broken piece is in, before the rest of it has arrived.
#[test]
fn big_bodies_are_scanned_as_their_pieces_arrive() {
    let mut cfg = router_config();
    cfg["max_body_bytes"] = json!(1 << 20);
    let prompt = "word \\\"quoted\\\" é \\n \\u00e9 ".repeat(8000);
    let last =
        format!(r#"{{"messages":[{{"role":"user","content":"{prompt}"}}],"model":"qwen3-8b"}}"#);
    let first = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
    let send = |body: &str, extra: &[(&str, &str)], chunk: usize| {
        send_body(
            &mut host_with("llmkube_model_router", &cfg),
            extra,
            body,
            chunk,
        )
    };
    let research = [("x-team", "research")];
    let whole_span = send(&first, &research, 0)
        .header("x-llmkube-model-span")
        .map(str::to_string);
    assert_eq!(
        whole_span.as_deref(),
        Some(format!("9-12/{}", first.len()).as_str())
    );
    for chunk in [997, 16 * 1024 + 3, 65536] {
        let o = send(&last, &[], chunk);
        assert_eq!(o.header("x-llmkube-rule"), Some("qwen"), "chunk {chunk}");
        assert_eq!(o.forwarded_body, last.as_bytes(), "chunk {chunk}");
        let o = send(&first, &research, chunk);
        assert_eq!(
            o.header("x-llmkube-rule"),
            Some("research"),
            "chunk {chunk}"
        );
        assert_eq!(
            o.header("x-llmkube-model-span").map(str::to_string),
            whole_span,
            "chunk {chunk}"
        );
    }

    // Broken 40 KiB in, 300 KiB long: refused while the rest is still to come.
    let broken = format!(
        r#"{{"model":"qwen3-8b","a":"{}","b":tru,"messages":"{}"}}"#,
        "x".repeat(40_000),
        "y".repeat(300_000)
    );
    let mut h = host_with("llmkube_model_router", &cfg);
    let id = h.new_http_stream().unwrap();
    let len = broken.len().to_string();
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("content-length", len.as_str()),
    ];
    h.request_headers(id, &headers, false).unwrap();
    let mut sent = 0;
    for piece in broken.as_bytes().chunks(8192) {
        sent += piece.len();
        h.request_body(id, piece, sent == broken.len()).unwrap();
        if h.request_outcome(id).unwrap().local_response.is_some() {
            break;
        }
    }
    let o = h.request_outcome(id).unwrap();
    assert_eq!(error_of(&o).0, 400, "{:?}", o.local_response);
    assert!(sent < 80_000, "refused only after {sent} bytes");
    assert!(o.forwarded_headers.is_none());
}
