//! Proves each host behaviour against the probe filter (testharness/probe-filter).
//!
//! The probe is (re)built once per test process with cargo, so `cargo test -p wasm-host` alone
//! works and never runs against a stale module. A build failure fails every test.

use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;
use wasm_host::*;

fn probe_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var("PROBE_FILTER_WASM") {
        Ok(p) => PathBuf::from(p),
        // Panics (fails the test) if the module cannot be built: never skip.
        Err(_) => e2e::wasm::build_filter("probe-filter", "probe_filter"),
    })
    .clone()
}

fn opts(cfg: serde_json::Value) -> VmOptions {
    VmOptions {
        vm_id: "probe-vm".into(),
        root_id: "probe".into(),
        ..Default::default()
    }
    .with_plugin_config(cfg.to_string())
}

fn host(cfg: serde_json::Value) -> Host {
    host_with(opts(cfg))
}

fn host_with(o: VmOptions) -> Host {
    let h = Host::from_file(probe_path(), o).expect("probe loads");
    assert!(h.configure_ok(), "probe refused its config: {:?}", h.logs());
    h
}

fn post(path: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":path", path),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ]
}

fn body_sizes(h: &Host) -> Vec<String> {
    h.logs_matching("body_size=")
        .into_iter()
        .filter(|l| l.starts_with("body_size="))
        .collect()
}

const CHAT: &str =
    r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hello there, general"}]}"#;

#[test]
fn imports_are_only_what_envoy_provides() {
    let wasm = std::fs::read(probe_path()).unwrap();
    let imports = module_imports(&wasm).unwrap();
    assert!(imports.contains(&("env".into(), "proxy_log".into())));
    assert!(imports.contains(&("env".into(), "proxy_replace_header_map_value".into())));
    for (m, n) in &imports {
        let ok = (m == "env" && PROXY_WASM_FUNCTIONS.contains(&n.as_str()))
            || (m == "wasi_snapshot_preview1" && ENVOY_WASI_FUNCTIONS.contains(&n.as_str()));
        assert!(ok, "unexpected import {m}.{n}");
    }
    assert!(unsupported_imports(&wasm).unwrap().is_empty());
}

#[test]
fn unknown_imports_fail_instantiation_naming_them() {
    let wat = r#"(module
        (import "env" "proxy_log" (func (param i32 i32 i32) (result i32)))
        (import "env" "proxy_frobnicate" (func))
        (import "wasi_snapshot_preview1" "fd_filestat_get" (func (param i32 i32) (result i32)))
        (memory (export "memory") 1))"#;
    let wasm = wat_to_wasm(wat);
    let err = Host::new(&wasm, VmOptions::default())
        .err()
        .expect("must refuse");
    let msg = format!("{err:#}");
    assert!(msg.contains("env.proxy_frobnicate"), "{msg}");
    assert!(
        msg.contains("wasi_snapshot_preview1.fd_filestat_get"),
        "{msg}"
    );
    assert!(!msg.contains("env.proxy_log"), "{msg}");
    assert_eq!(
        unsupported_imports(&wasm).unwrap(),
        vec![
            ("env".to_string(), "proxy_frobnicate".to_string()),
            (
                "wasi_snapshot_preview1".to_string(),
                "fd_filestat_get".to_string()
            )
        ]
    );
}

fn wat_to_wasm(wat: &str) -> Vec<u8> {
    // wasmtime accepts text too; Host::new compiles it the same way.
    wat.as_bytes().to_vec()
}

#[test]
fn trap1_pause_in_headers_without_flag_hangs_and_body_never_arrives() {
    let mut h = host(json!({"pause_headers": true, "route_from_body": true}));
    let out = h
        .run_request(&post("/v1/chat/completions"), CHAT.as_bytes(), 10)
        .unwrap();
    assert!(body_sizes(&h).is_empty(), "body delivered: {:?}", h.logs());
    assert!(out.paused_forever);
    assert!(out.withheld);
    assert!(!out.complete);
    assert_eq!(out.forwarded_headers, None);
    assert_eq!(out.actions[0], Action::Pause);
    assert!(out.actions[1..].iter().all(|a| *a == Action::NotDelivered));
}

#[test]
fn pause_with_flag_buffers_cumulatively_and_routes_from_body() {
    let mut h = host_with(
        opts(json!({"pause_headers": true, "buffer_body": true, "route_from_body": true}))
            .allow_stop_iteration(true),
    );
    let mut headers = post("/v1/chat/completions");
    // Client-supplied decision headers, mixed case and repeated: must not survive.
    headers.push(("X-Model", "evil"));
    headers.push(("x-model", "evil2"));
    let body = CHAT.as_bytes();
    let out = h.run_request(&headers, body, 16).unwrap();
    let n = body.len();
    let mut expected: Vec<String> = (1..)
        .map(|i| i * 16)
        .take_while(|s| *s < n)
        .map(|s| format!("body_size={s} eos=false"))
        .collect();
    expected.push(format!("body_size={n} eos=true"));
    assert_eq!(body_sizes(&h), expected);
    assert!(h.logged(&format!("whole_body_len={n}")));
    assert!(h.logged("route_status=0"));
    assert!(out.complete && !out.paused_forever);
    let fwd = out.forwarded_headers.as_ref().unwrap();
    assert_eq!(
        fwd.iter().filter(|(k, _)| k == "x-model").count(),
        1,
        "{fwd:?}"
    );
    assert_eq!(out.header("x-model"), Some("llama-3-8b"));
    assert_eq!(out.forwarded_body, body);
}

#[test]
fn body_size_is_per_chunk_when_the_filter_does_not_buffer() {
    let mut h = host_with(opts(json!({"pause_headers": true})).allow_stop_iteration(true));
    let out = h.run_request(&post("/x"), &[b'a'; 40], 16).unwrap();
    assert_eq!(
        body_sizes(&h),
        vec![
            "body_size=16 eos=false",
            "body_size=16 eos=false",
            "body_size=8 eos=true"
        ]
    );
    assert_eq!(out.forwarded_body.len(), 40);
    assert!(out.complete);
}

#[test]
fn body_rewrite_reaches_upstream() {
    let mut h = host_with(
        opts(json!({"pause_headers": true, "buffer_body": true, "route_from_body": true, "rewrite_body": true}))
            .allow_stop_iteration(true),
    );
    let out = h.run_request(&post("/x"), CHAT.as_bytes(), 7).unwrap();
    assert_eq!(out.body_str(), r#"{"rewritten":true}"#);
}

#[test]
fn trap2_header_write_after_headers_continued_is_bad_argument() {
    let mut h = host(json!({"late_write": true}));
    let out = h.run_request(&post("/x"), b"{}", 0).unwrap();
    assert!(h.logged("late_write_status=2"), "{:?}", h.logs());
    assert_eq!(out.header("x-late"), None);

    // Same write while headers are still stopped (flag on) succeeds.
    let mut h = host_with(
        opts(json!({"late_write": true, "pause_headers": true})).allow_stop_iteration(true),
    );
    let out = h.run_request(&post("/x"), b"{}", 0).unwrap();
    assert!(h.logged("late_write_status=0"), "{:?}", h.logs());
    assert_eq!(out.header("x-late"), Some("1"));
}

#[test]
fn response_header_write_after_response_headers_continued_is_bad_argument() {
    let mut h = host(json!({"response_header": true}));
    let req = h.run_request(&post("/x"), b"", 0).unwrap();
    let resp = h
        .run_response(req.stream, &[(":status", "200")], b"hello", 0)
        .unwrap();
    assert_eq!(resp.header("x-probe"), Some("1"));
    assert!(h.logged("late_resp_write_status=2"), "{:?}", h.logs());
    assert_eq!(resp.forwarded_body, b"hello");
    assert!(resp.complete);
}

#[test]
fn local_response_ends_the_stream() {
    let mut h = host(json!({"local_response": {"status": 429, "body": "slow down"}}));
    let out = h.run_request(&post("/x"), b"{\"a\":1}", 2).unwrap();
    let lr = out.local_response.clone().expect("local response");
    assert_eq!(lr.status, 429);
    assert_eq!(lr.body_str(), "slow down");
    assert_eq!(lr.header("x-probe-local"), Some("1"));
    assert_eq!(lr.grpc_status, -1);
    assert_eq!(out.forwarded_headers, None);
    assert!(!out.complete && !out.paused_forever);
    assert!(body_sizes(&h).is_empty());
    assert!(out.actions[1..].iter().all(|a| *a == Action::NotDelivered));
    // The response phase is not delivered either.
    assert_eq!(
        h.response_headers(out.stream, &[(":status", "200")], true)
            .unwrap(),
        Action::NotDelivered
    );
    h.log_and_done(out.stream).unwrap();
    assert!(h.logged(&format!("on_log id={}", out.stream.0)));
}

#[test]
fn local_response_from_body_phase() {
    let mut h = host_with(
        opts(json!({"pause_headers": true, "local_response": {"status": 413, "body": "too big", "phase": "body"}}))
            .allow_stop_iteration(true),
    );
    let out = h.run_request(&post("/x"), &[b'x'; 30], 10).unwrap();
    assert_eq!(out.local_response.unwrap().status, 413);
    assert_eq!(
        body_sizes(&h).len(),
        1,
        "later chunks must not be delivered"
    );
    assert_eq!(out.forwarded_headers, None);
}

#[test]
fn cas_counter_increments_per_request() {
    let mut h = host(json!({"cas_key": "counter"}));
    for i in 1..=5 {
        let out = h.run_request(&post("/x"), b"", 0).unwrap();
        assert_eq!(out.header("x-count"), Some(i.to_string().as_str()));
    }
    assert_eq!(h.shared_data_get("counter").unwrap().0, b"5");
}

#[test]
fn shared_data_cas_rules_match_envoy() {
    let h = host(json!({}));
    // A missing key is created whatever the CAS says.
    assert_eq!(h.shared_data_set("k", b"a", 12345), Ok(()));
    let (v, cas1) = h.shared_data_get("k").unwrap();
    assert_eq!(v, b"a");
    assert_ne!(cas1, 0);
    assert_eq!(
        h.shared_data_set("k", b"b", cas1 + 1000),
        Err(Status::CasMismatch)
    );
    assert_eq!(h.shared_data_set("k", b"b", cas1), Ok(()));
    let (v, cas2) = h.shared_data_get("k").unwrap();
    assert_eq!(v, b"b");
    assert_ne!(cas2, cas1, "every write changes the cas");
    assert_eq!(h.shared_data_set("k", b"c", cas1), Err(Status::CasMismatch));
    assert_eq!(
        h.shared_data_set("k", b"d", 0),
        Ok(()),
        "cas 0 always writes"
    );
    assert_eq!(h.shared_data_get("k").unwrap().0, b"d");
    // Scoped by vm_id.
    assert_eq!(h.shared().get("other-vm", "k"), None);
}

/// Worker A reads the counter, worker B runs a whole request, then A writes: the interleaving
/// that loses updates without CAS. `precreate` creates the key first, as a filter must.
fn interleaved_two_workers(cfg: serde_json::Value, precreate: bool) -> Vec<u8> {
    let shared = SharedStore::new();
    if precreate {
        shared.set("probe-vm", "n", b"0", 0).unwrap();
    }
    let mut a = host_with(opts(cfg.clone()).with_shared(&shared));
    let mut b = host_with(opts(cfg).with_shared(&shared));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let worker_b = std::thread::spawn(move || {
        go_rx.recv().unwrap();
        b.run_request(&post("/b"), b"", 0).unwrap();
        done_tx.send(()).unwrap();
        b
    });
    let fired = Arc::new(AtomicBool::new(false));
    let f = fired.clone();
    let go_tx = std::sync::Mutex::new(go_tx);
    let done_rx = std::sync::Mutex::new(done_rx);
    shared.set_get_hook(Some(Arc::new(move |_key: &str| {
        if !f.swap(true, Ordering::SeqCst) {
            go_tx.lock().unwrap().send(()).unwrap();
            done_rx.lock().unwrap().recv().unwrap();
        }
    })));
    a.run_request(&post("/a"), b"", 0).unwrap();
    let _b = worker_b.join().unwrap();
    assert!(fired.load(Ordering::SeqCst));
    shared.get("probe-vm", "n").unwrap().0
}

#[test]
fn two_vms_cas_prevents_lost_update() {
    assert_eq!(interleaved_two_workers(json!({"cas_key": "n"}), true), b"2");
}

#[test]
fn cas_on_a_missing_key_does_not_protect_the_first_write() {
    // Envoy: a set on a key that does not exist yet succeeds whatever the CAS, so two workers
    // creating the key concurrently lose one update even with a CAS loop.
    assert_eq!(
        interleaved_two_workers(json!({"cas_key": "n"}), false),
        b"1"
    );
}

#[test]
fn two_vms_without_cas_lose_an_update() {
    // The control: proves the interleaving above really races.
    assert_eq!(
        interleaved_two_workers(json!({"naive_key": "n"}), true),
        b"1"
    );
}

#[test]
fn two_vms_concurrent_cas_is_exact() {
    let shared = SharedStore::new();
    shared.set("probe-vm", "hits", b"0", 0).unwrap();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let o = opts(json!({"cas_key": "hits"})).with_shared(&shared);
            std::thread::spawn(move || {
                let mut h = host_with(o);
                for _ in 0..150 {
                    let out = h.run_request(&post("/x"), b"", 0).unwrap();
                    h.log_and_done(out.stream).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shared.get("probe-vm", "hits").unwrap().0, b"300");
}

#[test]
fn shared_queue_delivers_on_queue_ready_to_registrant() {
    let mut h = host(json!({"queue": "events"}));
    assert!(h.logged("queue_registered=1"));
    h.run_request(&post("/first"), b"", 0).unwrap();
    h.run_request(&post("/second"), b"", 0).unwrap();
    assert_eq!(
        h.logs_matching("dequeued="),
        vec!["dequeued=/first", "dequeued=/second"]
    );
    assert_eq!(h.shared().queue_len("probe-vm", "events"), Some(0));
    // Another worker enqueues: delivered when this worker's loop runs.
    h.shared()
        .enqueue_named("probe-vm", "events", b"from-elsewhere")
        .unwrap();
    assert!(!h.logged("dequeued=from-elsewhere"));
    h.deliver_queues().unwrap();
    assert!(h.logged("dequeued=from-elsewhere"));
    assert_eq!(
        h.shared().enqueue_named("probe-vm", "nope", b""),
        Err(Status::NotFound)
    );
}

#[test]
fn ticks_follow_the_manual_clock() {
    let mut h = host(json!({"tick_ms": 100}));
    assert_eq!(h.tick_period(), Some(Duration::from_millis(100)));
    let start = h.now_nanos();
    h.advance_clock(Duration::from_millis(350)).unwrap();
    let ticks = h.logs_matching("tick=");
    assert_eq!(ticks.len(), 3, "{ticks:?}");
    for (i, t) in ticks.iter().enumerate() {
        let at = start + (i as u64 + 1) * 100_000_000;
        assert_eq!(t, &format!("tick={} now={at}", i + 1));
    }
    assert_eq!(h.shared_data_get("ticks").unwrap().0, b"3");
    assert_eq!(h.now_nanos(), start + 350_000_000);
    h.advance_clock(Duration::from_millis(49)).unwrap();
    assert_eq!(h.logs_matching("tick=").len(), 3);
    h.advance_clock(Duration::from_millis(1)).unwrap();
    assert_eq!(h.logs_matching("tick=").len(), 4);
}

#[test]
fn current_time_is_the_manual_clock() {
    let mut h = host(json!({"time": true}));
    let start = h.now_nanos();
    h.advance_clock(Duration::from_secs(5)).unwrap();
    let out = h.run_request(&post("/x"), b"", 0).unwrap();
    let expected = (start + 5_000_000_000).to_string();
    assert_eq!(out.header("x-now"), Some(expected.as_str()));
}

#[test]
fn metrics_are_visible_by_name() {
    let mut h = host_with(opts(json!({"metric": "probe_requests"})).allow_stop_iteration(true));
    for size in [3usize, 10, 7] {
        h.run_request(&post("/x"), &vec![b'a'; size], 0).unwrap();
    }
    let c = h.metric("probe_requests").unwrap();
    assert_eq!((c.kind, c.value), (MetricKind::Counter, 3));
    let g = h.metric("probe_requests_gauge").unwrap();
    assert_eq!((g.kind, g.value), (MetricKind::Gauge, 3));
    let hist = h.metric("probe_requests_hist").unwrap();
    assert_eq!(hist.kind, MetricKind::Histogram);
    assert_eq!(hist.samples, vec![3, 10, 7]);
}

#[test]
fn http_call_round_trip_with_explicit_reply() {
    let mut h = host(json!({"http_call": "auth-cluster"}));
    let out = h.run_request(&post("/v1/models"), b"", 0).unwrap();
    assert!(out.paused_forever, "waits for the callout");
    assert_eq!(out.forwarded_headers, None);
    let call = h.http_calls()[0].clone();
    assert_eq!(call.upstream, "auth-cluster");
    assert_eq!(call.header("x-orig-path"), Some("/v1/models"));
    assert_eq!(call.header(":path"), Some("/lookup"));
    assert_eq!(call.body, b"lookup-body");
    assert_eq!(call.timeout, Duration::from_millis(1500));
    assert_eq!(h.pending_http_calls(), vec![call.token]);

    h.reply_http_call(
        call.token,
        HttpCallReply::new(201, "granted").with_trailer("grpc-status", "0"),
    )
    .unwrap();
    assert!(h.logged(&format!(
        "call_response token={} status=201 body=granted trailer=0",
        call.token
    )));
    let out = h.request_outcome(out.stream).unwrap();
    assert!(out.complete && !out.paused_forever);
    assert_eq!(out.header("x-call-status"), Some("201"));
    assert_eq!(out.header("x-call-body"), Some("granted"));
    assert!(h.pending_http_calls().is_empty());
    assert_eq!(
        h.reply_http_call(call.token, HttpCallReply::new(200, "")),
        Err(HostError::UnknownHttpCall(call.token))
    );
}

#[test]
fn http_call_scripted_responder_and_timeout() {
    let o = opts(json!({"http_call": "svc"})).with_responder(|call| {
        (call.header("x-orig-path") == Some("/fast")).then(|| HttpCallReply::new(200, "quick"))
    });
    let mut h = host_with(o);
    let fast = h.run_request(&post("/fast"), b"", 0).unwrap();
    assert!(fast.complete);
    assert_eq!(fast.header("x-call-body"), Some("quick"));

    let slow = h.run_request(&post("/slow"), b"", 0).unwrap();
    assert!(slow.paused_forever);
    h.advance_clock(Duration::from_millis(1499)).unwrap();
    assert!(h.request_outcome(slow.stream).unwrap().paused_forever);
    h.advance_clock(Duration::from_millis(1)).unwrap();
    let slow = h.request_outcome(slow.stream).unwrap();
    assert!(slow.complete, "timeout delivers an empty response");
    assert_eq!(slow.header("x-call-status"), Some(""));
}

#[test]
fn properties_from_options_and_derived_from_request() {
    let o = opts(json!({"property": ["xds", "cluster_name"]}))
        .with_property(&["xds", "cluster_name"], "backend-llama");
    let mut h = host_with(o);
    let out = h.run_request(&post("/x"), b"", 0).unwrap();
    assert_eq!(out.header("x-prop"), Some("backend-llama"));

    let mut h = host(json!({"property": ["request", "path"]}));
    let out = h.run_request(&post("/v1/chat?x=1"), b"", 0).unwrap();
    assert_eq!(out.header("x-prop"), Some("/v1/chat?x=1"));

    let mut h = host(json!({"property": ["upstream", "address"]}));
    let out = h.run_request(&post("/x"), b"", 0).unwrap();
    assert_eq!(out.header("x-prop"), Some("<none>"));
    h.set_property(&["upstream", "address"], "10.0.0.7:8000");
    let out = h.run_request(&post("/x"), b"", 0).unwrap();
    assert_eq!(out.header("x-prop"), Some("10.0.0.7:8000"));
}

#[test]
fn trap_kills_the_vm() {
    let mut h = host(json!({"panic_on": "headers"}));
    let id = h.new_http_stream().unwrap();
    let err = h.request_headers(id, &post("/x"), true).unwrap_err();
    assert!(
        matches!(&err, HostError::Trap { function, .. } if function == "proxy_on_request_headers"),
        "{err:?}"
    );
    assert!(h.is_dead());
    assert!(
        h.logs()
            .iter()
            .any(|(l, m)| *l == LogLevel::Critical && m.contains("probe asked to panic")),
        "{:?}",
        h.logs()
    );
    assert!(matches!(
        h.run_request(&post("/y"), b"", 0),
        Err(HostError::VmDead { .. })
    ));
    assert!(matches!(h.tick(), Err(HostError::VmDead { .. })));
}

#[test]
fn trap_in_configure_fails_loading() {
    let err = Host::from_file(probe_path(), opts(json!({"panic_on": "configure"})))
        .err()
        .expect("configure trap must fail the load");
    assert!(format!("{err:#}").contains("proxy_on_configure"), "{err:#}");
}

#[test]
fn bad_config_is_reported_by_configure_ok() {
    let h = Host::from_file(
        probe_path(),
        opts(json!({})).with_plugin_config("{not json"),
    )
    .unwrap();
    assert!(!h.configure_ok());
    assert!(h.logged("bad config"));
}

#[test]
fn wasi_stdout_and_stderr_become_logs() {
    let h = host(json!({"stdout": true}));
    assert!(h
        .logs()
        .contains(&(LogLevel::Info, "hello from stdout".to_string())));
    assert!(h
        .logs()
        .contains(&(LogLevel::Error, "hello from stderr".to_string())));
    assert_eq!(h.stdout(), b"hello from stdout\n");
    assert_eq!(h.stderr(), b"hello from stderr\n");
}

#[test]
fn stream_lifecycle_and_unknown_streams() {
    let mut h = host(json!({}));
    let out = h.run_request(&post("/x"), b"", 0).unwrap();
    assert!(out.complete);
    assert_eq!(out.actions, vec![Action::Continue]);
    h.log_and_done(out.stream).unwrap();
    assert!(h.logged(&format!("on_log id={}", out.stream.0)));
    assert_eq!(
        h.request_outcome(out.stream),
        Err(HostError::UnknownStream(out.stream))
    );
    assert!(h.logged("vm_start size=0"));
}

#[test]
fn close_stream_resets_and_stops_callbacks() {
    let mut h = host(json!({"reset": true}));
    let out = h.run_request(&post("/x"), b"abc", 1).unwrap();
    assert!(out.reset);
    assert!(!out.complete && !out.paused_forever);
    assert_eq!(out.forwarded_headers, None);
    assert!(body_sizes(&h).is_empty());
    assert_eq!(out.actions.len(), 4);
    assert!(out.actions[1..].iter().all(|a| *a == Action::NotDelivered));
}

#[test]
fn wasm_text_modules_load_and_missing_callbacks_default_to_continue() {
    // A module with no callbacks at all: Envoy treats missing exports as Continue.
    let wat = r#"(module
        (memory (export "memory") 1)
        (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024))"#;
    let mut h = Host::new(wat.as_bytes(), VmOptions::default()).unwrap();
    assert!(h.configure_ok());
    let out = h.run_request(&post("/x"), b"body", 0).unwrap();
    assert!(out.complete);
    assert_eq!(out.forwarded_body, b"body");
}

#[test]
fn stream_properties_are_seen_by_that_stream_only_and_win_over_the_vm_ones() {
    let o = opts(json!({"property": ["source", "address"]}))
        .with_property(&["source", "address"], "10.0.0.1:1");
    let mut h = host_with(o);
    let a = h.new_http_stream().unwrap();
    h.set_stream_property(a, &["source", "address"], "203.0.113.9:4000")
        .unwrap();
    h.request_headers(a, &post("/x"), true).unwrap();
    assert_eq!(
        h.request_outcome(a).unwrap().header("x-prop"),
        Some("203.0.113.9:4000")
    );
    let out = h.run_request(&post("/y"), b"", 0).unwrap();
    assert_eq!(out.header("x-prop"), Some("10.0.0.1:1"));
}
