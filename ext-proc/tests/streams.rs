//! The server binary over real gRPC: admission and its refusals (an immediate 503 with
//! `Retry-After`, never a gRPC error), the deadlines of an incomplete request (408), a stalled
//! upload giving its slot to a new stream, the health service and its watchdog, and the drain
//! deadline on SIGTERM.

mod support;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, processing_response, HttpHeaders, ImmediateResponse, ProcessingRequest,
    ProcessingResponse,
};
use sha2::{Digest, Sha256};
use std::time::Duration;
use support::{config_dir, free_addr, headers_msg, Process};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Continues every phase unchanged.
const PASSTHROUGH: &str = r#"(module (memory (export "memory") 1)
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024))"#;

/// Traps on every request's headers: no request can be served.
const TRAPS: &str = r#"(module (memory (export "memory") 1)
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable))"#;

/// Generous bound on any one answer: the tests wait for answers, not for time.
const ANSWER: Duration = Duration::from_secs(30);

struct Server {
    process: Process,
    url: String,
}

fn start(module: &str, extra: &str) -> Server {
    let addr = free_addr();
    let dir = config_dir("streams", addr);
    std::fs::write(dir.join("m.wat"), module).unwrap();
    let sha: String = Sha256::digest(module)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let cfg = dir.join("c.yaml");
    std::fs::write(
        &cfg,
        format!("module: {{path: m.wat, sha256: {sha}}}\nroot_id: probe\nplugin_config: {{}}\ninstances: 1\n{extra}"),
    )
    .unwrap();
    Server {
        process: Process::start(&cfg, addr, free_addr()),
        url: format!("http://{addr}"),
    }
}

/// Request headers of a request whose body is still to come.
fn upload_headers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: ":path".into(),
                    value: String::new(),
                    raw_value: b"/v1/chat/completions".to_vec(),
                }],
            }),
            end_of_stream: false,
            ..Default::default()
        })),
        ..Default::default()
    }
}

struct Stream {
    tx: mpsc::Sender<ProcessingRequest>,
    answers: Streaming<ProcessingResponse>,
}

async fn open(url: &str, first: ProcessingRequest) -> Stream {
    let mut client = ExternalProcessorClient::connect(url.to_string())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let answers = client
        .process(ReceiverStream::new(rx))
        .await
        .expect("the server accepts every stream, and answers a refusal in it")
        .into_inner();
    Stream { tx, answers }
}

async fn next(s: &mut Stream) -> ProcessingResponse {
    tokio::time::timeout(ANSWER, s.answers.message())
        .await
        .expect("an answer")
        .unwrap()
        .expect("a message")
}

fn immediate(r: &ProcessingResponse) -> Option<&ImmediateResponse> {
    match &r.response {
        Some(processing_response::Response::ImmediateResponse(ir)) => Some(ir),
        _ => None,
    }
}

fn status_and_code(ir: &ImmediateResponse) -> (i32, String) {
    let body: serde_json::Value = serde_json::from_slice(&ir.body).unwrap();
    (
        ir.status.as_ref().unwrap().code,
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn header<'a>(ir: &'a ImmediateResponse, name: &str) -> Option<&'a [u8]> {
    ir.headers.as_ref()?.set_headers.iter().find_map(|h| {
        let h = h.header.as_ref()?;
        (h.key == name).then_some(h.raw_value.as_slice())
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

#[test]
fn a_stream_beyond_the_limit_is_answered_503_with_retry_after_and_the_one_in_flight_goes_on() {
    let server = start(PASSTHROUGH, "max_streams: 1\n");
    runtime().block_on(async {
        // A complete request (no body) holds the only slot while its response is awaited.
        let mut first = open(&server.url, headers_msg("/a")).await;
        let a = next(&mut first).await;
        assert!(matches!(
            a.response,
            Some(processing_response::Response::RequestHeaders(_))
        ));
        let mut second = open(&server.url, headers_msg("/b")).await;
        let refused = next(&mut second).await;
        let ir = immediate(&refused).expect("an immediate response");
        assert_eq!(status_and_code(ir), (503, "overloaded".to_string()));
        assert_eq!(header(ir, "retry-after"), Some(&b"1"[..]));
        assert!(
            second.answers.message().await.unwrap().is_none(),
            "then it ends"
        );
        drop(first.tx);
        assert!(first.answers.message().await.unwrap().is_none());
    });
}

#[test]
fn a_request_whose_body_stops_arriving_is_answered_408_at_its_idle_deadline() {
    let server = start(PASSTHROUGH, "stream_idle_timeout_ms: 200\n");
    runtime().block_on(async {
        let mut s = open(&server.url, upload_headers()).await;
        let headers_answer = next(&mut s).await;
        assert!(immediate(&headers_answer).is_none(), "{headers_answer:?}");
        // No body follows: the deadline answers.
        let expired = next(&mut s).await;
        let ir = immediate(&expired).expect("an immediate response");
        assert_eq!(status_and_code(ir), (408, "request_timeout".to_string()));
        assert_eq!(ir.details, "llmkube_ext_proc_idle_timeout");
    });
}

#[test]
fn a_stalled_upload_gives_its_slot_to_a_new_stream_when_the_uploading_share_is_full() {
    let server = start(
        PASSTHROUGH,
        "max_streams: 4\nmax_uploading_streams: 1\nstream_idle_timeout_ms: 600000\n",
    );
    runtime().block_on(async {
        let mut stalled = open(&server.url, upload_headers()).await;
        next(&mut stalled).await;
        // Until the stalled upload has waited long enough to be evicted, newcomers are refused;
        // then one takes its place.
        let mut refusals = 0;
        let admitted = loop {
            let mut s = open(&server.url, upload_headers()).await;
            let a = next(&mut s).await;
            match immediate(&a) {
                None => break s,
                Some(ir) => {
                    assert_eq!(status_and_code(ir).0, 503);
                    refusals += 1;
                    assert!(refusals < 10_000, "never admitted");
                }
            }
        };
        let evicted = next(&mut stalled).await;
        let ir = immediate(&evicted).expect("the stalled upload is answered");
        assert_eq!(status_and_code(ir), (408, "request_timeout".to_string()));
        assert_eq!(ir.details, "llmkube_ext_proc_evicted");
        drop(admitted);
    });
}

async fn health_status(url: &str) -> i32 {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = tonic::transport::Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = HealthClient::new(channel);
    c.check(HealthCheckRequest {
        service: String::new(),
    })
    .await
    .unwrap()
    .into_inner()
    .status
}

/// `grpc.health.v1` SERVING / NOT_SERVING.
const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

async fn wait_health(url: &str, want: i32) {
    let deadline = tokio::time::Instant::now() + ANSWER;
    while health_status(url).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "health never {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn health_is_serving_while_a_request_runs_through_the_module_and_not_when_none_can() {
    let good = start(PASSTHROUGH, "");
    let bad = start(TRAPS, "");
    runtime().block_on(async {
        wait_health(&good.url, SERVING).await;
        wait_health(&bad.url, NOT_SERVING).await;
    });
    assert!(
        bad.process.log().contains("not serving"),
        "{}",
        bad.process.log()
    );
}

#[test]
fn sigterm_drains_until_its_deadline_then_answers_the_incomplete_request_503_and_exits() {
    let mut server = start(
        PASSTHROUGH,
        "drain_timeout_ms: 300\nstream_idle_timeout_ms: 600000\n",
    );
    runtime().block_on(async {
        let mut s = open(&server.url, upload_headers()).await;
        next(&mut s).await;
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(server.process.pid(), libc::SIGTERM);
        }
        let cut = next(&mut s).await;
        let ir = immediate(&cut).expect("the incomplete request is answered");
        assert_eq!(status_and_code(ir), (503, "shutting_down".to_string()));
        assert_eq!(header(ir, "retry-after"), Some(&b"1"[..]));
    });
    assert_eq!(server.process.wait_exit(), Some(0));
    assert!(server.process.log().contains("drain deadline"));
}
