//! The bad-input corpus through the compiled model-router module, driven by the wasmtime
//! host as Envoy drives it. Every input gets the documented status and OpenAI-shaped JSON error
//! (README.md, "Behaviour") and is never forwarded; none kills the VM; afterwards the same VM routes.
//!
//! The same corpus runs through a real Envoy in testharness/fixtures/tests/hostile_envoy.rs.

use serde_json::{json, Value};
use wasm_host::{Host, StreamOutcome, VmOptions};

use inputs::LIMIT;

fn config(max_body_bytes: u64) -> Value {
    json!({
        "router": "llm/hostile",
        "max_body_bytes": max_body_bytes,
        "default_route_strategy": "BackendNameMatch",
        "default_route": "local",
        "backends": [
            {"name": "local", "display_name": "qwen3-8b"},
            {"name": "cloud", "tier": "cloud", "external_model": "gpt-5", "provider": "openai"}
        ],
        "rules": [
            {"name": "pii", "data_classification": ["pii"], "fail_closed": true, "backends": ["local"]},
            {"name": "gpt", "models": ["gpt-*"], "backends": ["cloud"]}
        ]
    })
}

fn host(max_body_bytes: u64) -> Host {
    let wasm = e2e::wasm::build_filter("llmkube-model-router", "llmkube_model_router");
    let opts = VmOptions {
        root_id: "model-router".into(),
        ..Default::default()
    }
    .with_plugin_config(serde_json::to_vec(&config(max_body_bytes)).unwrap())
    .allow_stop_iteration(true);
    let h = Host::from_file(wasm, opts).expect("module loads");
    assert!(h.configure_ok(), "on_configure refused: {:?}", h.logs());
    h
}

#[path = "../../fixtures/tests/support/hostile_inputs.rs"]
mod inputs;
use inputs::{at_limit, corpus, Expect, Expect::*};

fn headers(len: Option<usize>) -> Vec<(String, String)> {
    let mut h = vec![
        (":method".to_string(), "POST".to_string()),
        (":path".to_string(), "/v1/chat/completions".to_string()),
        (":authority".to_string(), "gw".to_string()),
        ("content-type".to_string(), "application/json".to_string()),
    ];
    if let Some(n) = len {
        h.push(("content-length".to_string(), n.to_string()));
    }
    h
}

fn check(name: &str, o: &StreamOutcome, e: Expect) {
    match e {
        Route(backend) => {
            assert!(
                o.local_response.is_none(),
                "{name}: answered locally {:?}",
                o.local_response.as_ref().map(|r| (r.status, r.body_str()))
            );
            assert!(o.complete, "{name}: not forwarded whole");
            assert_eq!(o.header("x-llmkube-backend"), Some(backend), "{name}");
        }
        Error(status, code) => {
            let r = o
                .local_response
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: no local response (forwarded?)"));
            assert_eq!(r.status, status, "{name}: {}", r.body_str());
            assert_eq!(r.header("content-type"), Some("application/json"), "{name}");
            let v: Value = serde_json::from_slice(&r.body)
                .unwrap_or_else(|_| panic!("{name}: error body not JSON: {}", r.body_str()));
            assert_eq!(v["error"]["code"], code, "{name}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{name}: {v}"
            );
            assert!(v["error"]["type"].is_string(), "{name}: {v}");
            assert!(
                v["error"].get("param").is_some(),
                "{name}: no param field: {v}"
            );
            assert!(
                o.forwarded_headers.is_none() && o.forwarded_body.is_empty(),
                "{name}: forwarded"
            );
        }
    }
}

fn run(h: &mut Host, body: &[u8], with_len: bool, chunk: usize) -> StreamOutcome {
    let hs = headers(with_len.then_some(body.len()));
    let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let o = h.run_request(&hs, body, chunk).expect("no trap");
    assert!(!h.is_dead(), "VM died: {:?}", h.dead_reason());
    o
}

fn still_routes(h: &mut Host) {
    let o = run(h, br#"{"model":"gpt-5"}"#, true, 0);
    check("after the corpus, gpt-5", &o, Route("cloud"));
    let o = run(h, br#"{"model":"qwen3-8b"}"#, true, 0);
    check("after the corpus, qwen3-8b", &o, Route("local"));
}

#[test]
fn hostile_corpus_whole_bodies_get_documented_errors() {
    let mut h = host(LIMIT);
    let corpus = corpus();
    for (name, body, e) in &corpus {
        // With content-length, in one piece.
        check(name, &run(&mut h, body, true, 0), *e);
        // Without content-length (chunked), in 7-byte pieces.
        check(name, &run(&mut h, body, false, 7), *e);
    }
    still_routes(&mut h);
    eprintln!("hostile corpus: {} inputs x 2 framings", corpus.len());
}

#[test]
fn hostile_empty_body_with_content_length_zero() {
    let mut h = host(LIMIT);
    for path in ["/v1/chat/completions", "/v1/completions"] {
        let hs = [
            (":method", "POST"),
            (":path", path),
            (":authority", "gw"),
            ("content-length", "0"),
        ];
        let o = h.run_request(&hs, b"", 0).expect("no trap");
        check(path, &o, Error(400, "invalid_json"));
        // Headers and an empty end-of-stream data frame (what a chunked `0\r\n\r\n` gives).
        let id = h.new_http_stream().unwrap();
        h.request_headers(id, &hs[..3], false).unwrap();
        h.request_body(id, b"", true).unwrap();
        check(
            path,
            &h.request_outcome(id).unwrap(),
            Error(400, "invalid_json"),
        );
    }
    still_routes(&mut h);
}

#[test]
fn hostile_deep_nesting_100k_levels_does_not_overflow_the_stack() {
    // A limit big enough that the whole document reaches the parser (up to 600 KB here).
    let mut h = host(1 << 20);
    let depth = 100_000;
    let open_only = format!(r#"{{"model":"qwen3-8b","a":{}"#, "[".repeat(depth));
    let balanced = format!(
        r#"{{"model":"qwen3-8b","a":{}{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let objects = format!(
        r#"{{"model":"qwen3-8b","a":{}1{}}}"#,
        r#"{"b":"#.repeat(depth),
        "}".repeat(depth)
    );
    let model_after = format!(
        r#"{{"a":{}{},"model":"gpt-5"}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    for (name, body) in [
        ("100k open arrays", &open_only),
        ("100k balanced arrays", &balanced),
        ("100k nested objects", &objects),
        ("100k arrays before model", &model_after),
    ] {
        for chunk in [0, 4096, 1] {
            if chunk == 1 && body.len() > 250_000 {
                continue;
            }
            let o = run(&mut h, body.as_bytes(), true, chunk);
            let r = o.local_response.as_ref();
            eprintln!(
                "{name} (chunk {chunk}): {:?}",
                r.map(|r| (r.status, r.body_str()))
                    .unwrap_or((0, "forwarded".into()))
            );
            // Legal JSON, but the filter caps nesting at 512 levels: a documented 400
            // invalid_json naming the limit, from a bounded (non-recursive) scan.
            check(name, &o, Error(400, "invalid_json"));
            let msg = o.local_response.as_ref().unwrap().body_str();
            assert!(msg.contains("512 levels"), "{name}: {msg}");
        }
    }
    still_routes(&mut h);
}

#[test]
fn hostile_split_at_every_byte_gives_the_same_answer() {
    let mut h = host(LIMIT);
    let good = br#"{"messages":[{"role":"system","content":"You are \"helpful\" \u00e9\n"},{"role":"user","content":"split me at every byte \\ please, caf\u00e9 \ud83d\ude00 and \u4e2d\u6587"}],"temperature":0.25,"max_tokens":1e3,"stream":true,"mo\u0064el":"gpt-5","tools":[]}"#;
    assert!(good.len() >= 250, "{}", good.len());
    let dup = br#"{"messages":[{"role":"user","content":"split me at every byte; a duplicate model key hides in an escape later on, past the point where a naive scanner would stop reading because it already saw the model"}],"model":"qwen3-8b","stream":false,"mo\u0064el":"gpt-5"}"#;
    let bad_utf8 = b"{\"messages\":[{\"role\":\"user\",\"content\":\"split me at every byte; this one carries an invalid UTF-8 byte sequence in the middle of a long string value \xc3\x28 and then goes on\"}],\"model\":\"qwen3-8b\"}";
    let truncated = &good[..good.len() - 1];
    let mut splits = 0;
    for (name, body, e) in [
        ("valid", &good[..], Route("cloud")),
        ("escaped duplicate", &dup[..], Error(400, "duplicate_key")),
        ("invalid utf-8", &bad_utf8[..], Error(400, "invalid_json")),
        ("truncated", truncated, Error(400, "invalid_json")),
    ] {
        for with_len in [true, false] {
            for at in 0..=body.len() {
                let hs = headers(with_len.then_some(body.len()));
                let hs: Vec<(&str, &str)> =
                    hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let id = h.new_http_stream().unwrap();
                h.request_headers(id, &hs, false).unwrap();
                h.request_body(id, &body[..at], false).unwrap();
                h.request_body(id, &body[at..], true).unwrap();
                let o = h.request_outcome(id).unwrap();
                check(&format!("{name} split at {at}"), &o, e);
                if let Route(_) = e {
                    // A stream is asked for usage (router_usage.rs): that edit, nothing else.
                    let mut asked = br#"{"stream_options":{"include_usage":true},"#.to_vec();
                    asked.extend_from_slice(&body[1..]);
                    assert_eq!(
                        o.forwarded_body, asked,
                        "{name} split at {at}: body changed"
                    );
                }
                h.log_and_done(id).unwrap();
                splits += 1;
            }
        }
        // And one byte at a time.
        check(name, &run(&mut h, body, true, 1), e);
    }
    assert!(!h.is_dead());
    still_routes(&mut h);
    eprintln!("split positions tried: {splits}");
}

#[test]
fn hostile_limit_boundaries_with_and_without_content_length() {
    for limit in [64u64, 300, 4096] {
        let mut h = host(limit);
        let at = at_limit(limit as usize);
        let mut over = at.clone();
        over.insert(over.len() - 2, b'x');
        for chunk in [0, 1, 10, 63] {
            for with_len in [true, false] {
                let name = format!("limit {limit} chunk {chunk} len {with_len}");
                check(&name, &run(&mut h, &at, with_len, chunk), Route("local"));
                let o = run(&mut h, &over, with_len, chunk);
                check(&name, &o, Error(413, "request_too_large"));
                let msg = o.local_response.unwrap().body_str();
                assert!(msg.contains(&format!("{limit} bytes")), "{name}: {msg}");
            }
        }
        // A content-length that lies (declares the limit, sends one more byte) is caught as the
        // body arrives.
        let hs = headers(Some(limit as usize));
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let o = h.run_request(&hs, &over, 5).unwrap();
        check("lying content-length", &o, Error(413, "request_too_large"));
        // A huge declared length is refused before any body.
        let hs = headers(Some(usize::MAX));
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let id = h.new_http_stream().unwrap();
        h.request_headers(id, &hs, false).unwrap();
        check(
            "huge content-length",
            &h.request_outcome(id).unwrap(),
            Error(413, "request_too_large"),
        );
        still_routes(&mut h);
    }
}
