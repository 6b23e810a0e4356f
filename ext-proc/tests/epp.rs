//! Endpoint-picker mode over real gRPC, the client speaking as agentgateway's `inferenceRouting`
//! does (crates/agentgateway/src/http/ext_proc.rs at v1.3.1): request and response bodies
//! FULL_DUPLEX_STREAMED, the body streamed in chunks before any answer, the destination read from
//! the headers answer. The model-router module picks among two pods.

mod support;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, HttpBody, HttpHeaders,
    ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value, ListValue, Struct, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use support::{config_dir, free_addr, sha256_hex};
use tokio::sync::mpsc;
use tonic::Streaming;

const PODS: [&str; 2] = ["10.0.0.1:8000", "10.0.0.2:8000"];
const GAUGE: &str = "llmkube_pick_in_flight_backend_pods";

/// The model-router filter, built (release, wasm32-wasip1) if it is not up to date.
fn router_wasm() -> PathBuf {
    support::filter_wasm("llmkube-model-router", "llmkube_model_router.wasm")
}

fn plugin_config() -> serde_json::Value {
    serde_json::json!({
        "router": "llm/epp",
        "backends": [
            {"name": "pods", "tier": "local", "timeout_ms": 60000, "weight": 1,
             "pick": {"endpoints": PODS, "mode": "LoadAware",
                      "prefix_affinity": {"block_bytes": 256},
                      "session_affinity": {"headers": ["x-session-id"]}}},
            {"name": "plain", "tier": "local", "timeout_ms": 60000, "weight": 1}
        ],
        "default_route": "pods",
        "default_route_strategy": "Static",
        "inference_paths": ["/v1/chat/completions"],
        "max_body_bytes": 65536,
        "quarantine_ms": 15000,
        "rules": [{"name": "plain", "backends": ["plain"], "models": ["plain"],
                   "fail_closed": false, "strategy": "primary-fallback"}]
    })
}

struct Server {
    process: support::Process,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Server {
    fn start() -> Server {
        let wasm = router_wasm();
        let sha = sha256_hex(&wasm);
        let (addr, metrics) = (free_addr(), free_addr());
        let dir = config_dir("epp", addr);
        let cfg = dir.join("c.json");
        let config = serde_json::json!({
            "module": {"path": wasm, "sha256": sha},
            "root_id": "model-router",
            "vm_id": "llmkube",
            "plugin_config": plugin_config(),
            "instances": 2,
            "endpoint_picker": {}
        });
        std::fs::write(&cfg, config.to_string()).unwrap();
        let s = Server {
            process: support::Process::start(&cfg, addr, metrics),
            addr,
            metrics,
        };
        assert!(s.log().contains("endpoint picker"), "{}", s.log());
        s
    }

    fn log(&self) -> String {
        self.process.log()
    }

    fn in_flight(&self) -> f64 {
        let mut c = TcpStream::connect(self.metrics).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{GAUGE} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    async fn wait_in_flight(&self, want: f64) {
        // Generous: a loaded CI machine can take seconds to see the streams' ends.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.in_flight();
            if v == want {
                return;
            }
            assert!(Instant::now() < deadline, "in flight {v}, want {want}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Opens a stream: the sender of the proxy's messages and the server's answers.
    async fn open(
        &self,
    ) -> (
        mpsc::Sender<ProcessingRequest>,
        Streaming<ProcessingResponse>,
    ) {
        let mut client = ExternalProcessorClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(8);
        let answers = client
            .process(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        (tx, answers)
    }
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.into(),
        value: String::new(),
        raw_value: value.as_bytes().to_vec(),
    }
}

fn request_headers(extra: &[(&str, &str)], subset: Option<&[&str]>) -> ProcessingRequest {
    let mut headers = vec![
        header(":method", "POST"),
        header(":path", "/v1/chat/completions"),
        header(":authority", "gateway"),
        header("content-type", "application/json"),
    ];
    headers.extend(extra.iter().map(|(k, v)| header(k, v)));
    let metadata_context = subset.map(|s| {
        let mut ns = Struct::default();
        ns.fields.insert(
            "x-gateway-destination-endpoint-subset".into(),
            Value {
                kind: Some(value::Kind::ListValue(ListValue {
                    values: s
                        .iter()
                        .map(|p| Value {
                            kind: Some(value::Kind::StringValue(p.to_string())),
                        })
                        .collect(),
                })),
            },
        );
        let mut m = Metadata::default();
        m.filter_metadata.insert("envoy.lb.subset_hint".into(), ns);
        m
    });
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers }),
            end_of_stream: false,
            ..Default::default()
        })),
        metadata_context,
        ..Default::default()
    }
}

fn body(
    kind: fn(HttpBody) -> processing_request::Request,
    bytes: &[u8],
    eos: bool,
) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(kind(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn chat(model: &str, system: &str) -> Vec<u8> {
    serde_json::json!({"model": model, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "hi"}]})
    .to_string()
    .into_bytes()
}

/// Sends the request as agentgateway does: headers, then the body in three chunks, without
/// waiting for an answer in between.
async fn send_request(
    tx: &mpsc::Sender<ProcessingRequest>,
    headers: ProcessingRequest,
    whole: &[u8],
) {
    tx.send(headers).await.unwrap();
    let third = whole.len() / 3;
    for (i, chunk) in whole.chunks(third.max(1)).enumerate() {
        let last = (i + 1) * third.max(1) >= whole.len();
        tx.send(body(processing_request::Request::RequestBody, chunk, last))
            .await
            .unwrap();
        if last {
            break;
        }
    }
}

/// The pod the headers answer names, checked against the dynamic metadata.
fn destination(r: &ProcessingResponse) -> String {
    let Some(processing_response::Response::RequestHeaders(h)) = &r.response else {
        panic!("not a request-headers answer: {r:?}")
    };
    let set = &h
        .response
        .as_ref()
        .unwrap()
        .header_mutation
        .as_ref()
        .unwrap()
        .set_headers;
    let named: Vec<String> = set
        .iter()
        .filter_map(|o| o.header.as_ref())
        .filter(|h| h.key == "x-gateway-destination-endpoint")
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
        .collect();
    assert_eq!(named.len(), 1, "{set:?}");
    let md = r.dynamic_metadata.as_ref().expect("dynamic metadata");
    let Some(value::Kind::StructValue(lb)) = &md.fields["envoy.lb"].kind else {
        panic!("{md:?}")
    };
    let Some(value::Kind::StringValue(s)) = &lb.fields["x-gateway-destination-endpoint"].kind
    else {
        panic!("{lb:?}")
    };
    assert_eq!(s, &named[0], "header and metadata name the same pod");
    named[0].clone()
}

fn streamed(r: &ProcessingResponse) -> (Vec<u8>, bool) {
    use processing_response::Response as Rs;
    let (Some(Rs::RequestBody(b)) | Some(Rs::ResponseBody(b))) = &r.response else {
        panic!("not a body answer: {r:?}")
    };
    match &b
        .response
        .as_ref()
        .unwrap()
        .body_mutation
        .as_ref()
        .unwrap()
        .mutation
    {
        Some(body_mutation::Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not a streamed body: {other:?}"),
    }
}

fn immediate_status(r: &ProcessingResponse) -> (i32, String) {
    let Some(processing_response::Response::ImmediateResponse(i)) = &r.response else {
        panic!("not an immediate response: {r:?}")
    };
    (
        i.status.as_ref().unwrap().code,
        String::from_utf8_lossy(&i.body).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_answers_as_the_endpoint_picker_protocol_says() {
    let server = Server::start();
    let system = "You are the support assistant of ACME. ".repeat(40);
    let whole = chat("m", &system);

    // A whole exchange: the pod in header and metadata after the last chunk, the body streamed
    // back whole, the response passed through, the pod held until the stream ends. A client's
    // own destination header is not what comes back.
    let (tx, mut answers) = server.open().await;
    let spoof = [("x-gateway-destination-endpoint", "169.254.169.254:80")];
    send_request(&tx, request_headers(&spoof, None), &whole).await;
    let first = answers.message().await.unwrap().unwrap();
    let pod = destination(&first);
    assert!(PODS.contains(&pod.as_str()), "{pod}");
    assert_eq!(
        streamed(&answers.message().await.unwrap().unwrap()),
        (whole.clone(), true)
    );
    server.wait_in_flight(1.0).await;
    tx.send(ProcessingRequest {
        request: Some(processing_request::Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":status", "200"),
                    header("content-type", "application/json"),
                ],
            }),
            end_of_stream: false,
            ..Default::default()
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = answers.message().await.unwrap().unwrap();
    assert!(
        matches!(
            r.response,
            Some(processing_response::Response::ResponseHeaders(_))
        ),
        "{r:?}"
    );
    let reply = br#"{"choices":[{"message":{"role":"assistant","content":"ok"}}]}"#;
    tx.send(body(processing_request::Request::ResponseBody, reply, true))
        .await
        .unwrap();
    assert_eq!(
        streamed(&answers.message().await.unwrap().unwrap()),
        (reply.to_vec(), true)
    );
    drop(tx);
    assert!(answers.message().await.unwrap_or(None).is_none());
    server.wait_in_flight(0.0).await;

    // The same prompt again: the same pod (its prefix is there).
    let (tx, mut answers) = server.open().await;
    send_request(&tx, request_headers(&[], None), &whole).await;
    assert_eq!(destination(&answers.message().await.unwrap().unwrap()), pod);
    // Aborted before any response: the hold is released.
    server.wait_in_flight(1.0).await;
    drop(tx);
    drop(answers);
    server.wait_in_flight(0.0).await;

    // A subset without that pod: the other one, though the prefix is warm on the first.
    let other = *PODS.iter().find(|p| **p != pod).unwrap();
    let (tx, mut answers) = server.open().await;
    send_request(&tx, request_headers(&[], Some(&[other])), &whole).await;
    assert_eq!(
        destination(&answers.message().await.unwrap().unwrap()),
        other
    );
    drop(tx);
    drop(answers);

    // An empty subset allows nothing; a route without a picked backend gets no pod: 503s.
    let (tx, mut answers) = server.open().await;
    send_request(&tx, request_headers(&[], Some(&[])), &whole).await;
    let (status, text) = immediate_status(&answers.message().await.unwrap().unwrap());
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("no_eligible_pod"), "{text}");
    drop(tx);
    let (tx, mut answers) = server.open().await;
    send_request(&tx, request_headers(&[], None), &chat("plain", "x")).await;
    let (status, text) = immediate_status(&answers.message().await.unwrap().unwrap());
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("no_eligible_pod"), "{text}");
    drop(tx);
    server.wait_in_flight(0.0).await;

    // A request the filter refuses (not JSON) gets the filter's own answer.
    let (tx, mut answers) = server.open().await;
    send_request(&tx, request_headers(&[], None), b"not json at all").await;
    let (status, text) = immediate_status(&answers.message().await.unwrap().unwrap());
    assert_eq!(status, 400, "{text}");
    drop(tx);
}

/// The server's module instances share one picture (the filter's shared queues): a session
/// placed on one instance stays on its pod when its next request runs on the other instance.
/// Each session is first forced onto a pod by a subset, so a second instance that knew nothing
/// would place it by its own hash instead: with four sessions on alternating pods, at least one
/// of them would move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_of_the_picker_sees_where_a_session_went() {
    let server = Server::start();
    // An instance learns the others' queues on its root tick (every 100 ms); picks before the
    // first tick stay on their instance, as on Envoy's workers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let prompt = |i: usize| chat("m", &format!("session prompt {i} ").repeat(20));
    for i in 0..4 {
        let session = format!("chat-{i}");
        let forced = PODS[i % 2];
        let sid = [("x-session-id", session.as_str())];
        // Nothing else open: the stream runs on the first instance.
        let (tx, mut answers) = server.open().await;
        send_request(&tx, request_headers(&sid, Some(&[forced])), &prompt(i)).await;
        assert_eq!(
            destination(&answers.message().await.unwrap().unwrap()),
            forced
        );
        drop(tx);
        drop(answers);
        server.wait_in_flight(0.0).await;
        // A request held open on the first instance sends the next stream to the second.
        let (hold, mut held) = server.open().await;
        send_request(&hold, request_headers(&[], None), &chat("m", "hold")).await;
        destination(&held.message().await.unwrap().unwrap());
        let (tx, mut answers) = server.open().await;
        send_request(&tx, request_headers(&sid, None), &prompt(i + 10)).await;
        assert_eq!(
            destination(&answers.message().await.unwrap().unwrap()),
            forced,
            "session {session} moved when its request ran on the other instance"
        );
        drop((tx, answers, hold, held));
        server.wait_in_flight(0.0).await;
    }
}
