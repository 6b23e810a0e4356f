//! Callouts an embedder answers later, as llmkube-ext-proc does over the network: a stream's
//! pending calls are counted per stream, and a failed call reaches the guest as Envoy reports one
//! (`on_http_call_response` with nothing in it), after which the paused stream resumes.

use llmkube_wasm_runtime::{HostError, HttpCallReply, Vm, VmOptions};

/// Request headers call cluster "c" and pause; any call response resumes the request.
const CALLING_GUEST: &str = r#"(module
  (import "env" "proxy_http_call" (func $call (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_continue_stream" (func $continue (param i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "c")
  (data (i32.const 16) "\03\00\00\00\07\00\00\00\03\00\00\00\05\00\00\00\01\00\00\00\0a\00\00\00\01\00\00\00\3a\6d\65\74\68\6f\64\00\47\45\54\00\3a\70\61\74\68\00\2f\00\3a\61\75\74\68\6f\72\69\74\79\00\63\00")
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
    (drop (call $call (i32.const 0) (i32.const 1) (i32.const 16) (i32.const 61)
      (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 1000) (i32.const 512)))
    i32.const 1)
  (func (export "proxy_on_http_call_response") (param i32 i32 i32 i32 i32)
    (drop (call $continue (i32.const 0)))))"#;

fn vm() -> Vm {
    let opts = VmOptions {
        known_clusters: Some(vec!["c".into()]),
        ..Default::default()
    }
    .allow_stop_iteration(true);
    Vm::new(CALLING_GUEST.as_bytes(), opts).expect("loads")
}

#[test]
fn a_failed_callout_is_delivered_empty_and_the_stream_resumes() {
    let mut vm = vm();
    let a = vm.new_http_stream().unwrap();
    let b = vm.new_http_stream().unwrap();
    vm.request_headers(a, &[(":path", "/a")], true).unwrap();
    assert_eq!(vm.pending_http_calls_of(a), 1);
    assert_eq!(vm.pending_http_calls_of(b), 0);
    assert!(vm.request_outcome(a).unwrap().forwarded_headers.is_none());
    let token = vm.pending_http_calls()[0];
    vm.fail_http_call(token).unwrap();
    assert_eq!(vm.pending_http_calls_of(a), 0);
    let out = vm.request_outcome(a).unwrap();
    assert!(out.complete, "{out:?}");
    // A token is settled once: a late transport answer for it is refused.
    assert_eq!(
        vm.reply_http_call(token, HttpCallReply::new(200, "late")),
        Err(HostError::UnknownHttpCall(token))
    );
}

#[test]
fn a_reply_carries_its_headers_to_the_guest() {
    let mut vm = vm();
    let a = vm.new_http_stream().unwrap();
    vm.request_headers(a, &[(":path", "/a")], true).unwrap();
    let token = vm.pending_http_calls()[0];
    vm.reply_http_call(token, HttpCallReply::new(200, "ok").with_header("x-a", "1"))
        .unwrap();
    assert!(vm.request_outcome(a).unwrap().complete);
}
