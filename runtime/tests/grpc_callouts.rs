//! gRPC callouts as Envoy delivers them: the call is pending with its cluster, method, metadata
//! and message; an OK answer reaches `proxy_on_grpc_receive` with the message readable as
//! GrpcReceiveBuffer; a status, a failure or the deadline reach `proxy_on_grpc_close` with its
//! code; a cancelled call gets no callback; an unknown cluster is refused.

use llmkube_wasm_runtime::{Clock, HostError, HttpCallRecord, HttpCallReply, Vm, VmOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Request headers call `s.S/M` on cluster "g" with metadata `k: v` and message "hi" (1 s
/// timeout) and pause. A received message is echoed as a 200 local reply; a close answers
/// 500 + the status code. Request trailers cancel the call.
const GRPC_GUEST: &str = r#"(module
  (import "env" "proxy_grpc_call" (func $grpc (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_grpc_cancel" (func $cancel (param i32) (result i32)))
  (import "env" "proxy_get_buffer_bytes" (func $buf (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_send_local_response" (func $reply (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "g")
  (data (i32.const 8) "s.S")
  (data (i32.const 16) "M")
  (data (i32.const 24) "hi")
  (data (i32.const 32) "\01\00\00\00\01\00\00\00\01\00\00\00k\00v\00")
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (i32.store (i32.const 600)
      (call $grpc (i32.const 0) (i32.const 1) (i32.const 8) (i32.const 3) (i32.const 16) (i32.const 1)
        (i32.const 32) (i32.const 16) (i32.const 24) (i32.const 2) (i32.const 1000) (i32.const 512)))
    i32.const 1)
  (func (export "proxy_on_request_trailers") (param i32 i32) (result i32)
    (drop (call $cancel (i32.load (i32.const 512))))
    i32.const 1)
  (func (export "proxy_on_grpc_receive") (param i32 i32 i32)
    (drop (call $buf (i32.const 5) (i32.const 0) (local.get 2) (i32.const 520) (i32.const 524)))
    (drop (call $reply (i32.const 200) (i32.const 0) (i32.const 0)
      (i32.load (i32.const 520)) (i32.load (i32.const 524)) (i32.const 0) (i32.const 0) (i32.const -1))))
  (func (export "proxy_on_grpc_close") (param i32 i32 i32)
    (drop (call $reply (i32.add (i32.const 500) (local.get 2)) (i32.const 0) (i32.const 0)
      (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const -1)))))"#;

/// A clock the test moves.
#[derive(Default)]
struct Manual(AtomicU64);

impl Clock for Manual {
    fn realtime_nanos(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
    fn monotonic_nanos(&self) -> u64 {
        self.0.load(Ordering::SeqCst) + 1_000_000_000
    }
}

struct Kit {
    vm: Vm,
    calls: Arc<Mutex<Vec<HttpCallRecord>>>,
    clock: Arc<Manual>,
}

fn kit(clusters: &[&str]) -> Kit {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let clock = Arc::new(Manual::default());
    let mut opts = VmOptions {
        known_clusters: Some(clusters.iter().map(|c| c.to_string()).collect()),
        clock: clock.clone(),
        ..Default::default()
    }
    .allow_stop_iteration(true);
    opts.callouts = Some(Arc::new(move |c: &HttpCallRecord| {
        seen.lock().unwrap().push(c.clone());
        None
    }));
    let vm = Vm::new(GRPC_GUEST.as_bytes(), opts).expect("loads");
    Kit { vm, calls, clock }
}

fn grpc_reply(status: u32, body: &str) -> HttpCallReply {
    HttpCallReply {
        body: body.as_bytes().to_vec(),
        ..Default::default()
    }
    .with_header("grpc-status", &status.to_string())
}

#[test]
fn an_ok_answer_is_received_with_its_message_and_the_call_carries_method_and_metadata() {
    let mut k = kit(&["g"]);
    let a = k.vm.new_http_stream().unwrap();
    k.vm.request_headers(a, &[(":path", "/a")], true).unwrap();
    assert_eq!(k.vm.pending_http_calls_of(a), 1);
    let call = k.calls.lock().unwrap()[0].clone();
    assert_eq!(call.upstream, "g");
    let m = call.grpc.as_ref().expect("a gRPC call");
    assert_eq!((m.service.as_str(), m.method.as_str()), ("s.S", "M"));
    assert_eq!(call.headers, vec![("k".to_string(), "v".to_string())]);
    assert_eq!(call.body, b"hi");
    assert_eq!(call.timeout.as_millis(), 1000);
    k.vm.reply_http_call(call.token, grpc_reply(0, "pong"))
        .unwrap();
    let lr =
        k.vm.request_outcome(a)
            .unwrap()
            .local_response
            .expect("answered");
    assert_eq!((lr.status, lr.body.as_slice()), (200, &b"pong"[..]));
    assert_eq!(k.vm.pending_http_calls_of(a), 0);
}

#[test]
fn a_status_a_failure_and_the_deadline_close_the_call_with_their_codes() {
    let mut k = kit(&["g"]);
    let status_of = |k: &mut Kit, id| {
        k.vm.request_outcome(id)
            .unwrap()
            .local_response
            .expect("closed")
            .status
    };
    let a = k.vm.new_http_stream().unwrap();
    k.vm.request_headers(a, &[(":path", "/a")], true).unwrap();
    let t = k.vm.pending_http_calls()[0];
    k.vm.reply_http_call(t, grpc_reply(7, "")).unwrap();
    assert_eq!(
        status_of(&mut k, a),
        507,
        "PERMISSION_DENIED from the server"
    );

    let b = k.vm.new_http_stream().unwrap();
    k.vm.request_headers(b, &[(":path", "/b")], true).unwrap();
    let t = k.vm.pending_http_calls()[0];
    k.vm.fail_http_call(t).unwrap();
    assert_eq!(
        status_of(&mut k, b),
        500 + llmkube_wasm_runtime::UNAVAILABLE
    );

    let c = k.vm.new_http_stream().unwrap();
    k.vm.request_headers(c, &[(":path", "/c")], true).unwrap();
    k.vm.run_due().unwrap();
    assert_eq!(k.vm.pending_http_calls_of(c), 1, "not due yet");
    k.clock.0.fetch_add(1_001_000_000, Ordering::SeqCst);
    k.vm.run_due().unwrap();
    assert_eq!(
        status_of(&mut k, c),
        500 + llmkube_wasm_runtime::DEADLINE_EXCEEDED
    );
}

#[test]
fn a_cancelled_call_gets_no_callback_and_an_unknown_cluster_is_refused() {
    let mut k = kit(&["g"]);
    let a = k.vm.new_http_stream().unwrap();
    k.vm.request_headers(a, &[(":path", "/a")], false).unwrap();
    let t = k.vm.pending_http_calls()[0];
    k.vm.request_trailers(a, &[("x", "1")]).unwrap();
    assert_eq!(k.vm.pending_http_calls_of(a), 0);
    assert_eq!(
        k.vm.reply_http_call(t, grpc_reply(0, "late")),
        Err(HostError::UnknownHttpCall(t))
    );
    assert!(k.vm.request_outcome(a).unwrap().local_response.is_none());

    let mut k = kit(&["other"]);
    let b = k.vm.new_http_stream().unwrap();
    k.vm.request_headers(b, &[(":path", "/b")], true).unwrap();
    assert_eq!(k.vm.pending_http_calls_of(b), 0);
    assert!(k.calls.lock().unwrap().is_empty());
}
