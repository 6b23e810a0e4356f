//! The server binary over real gRPC: a stream gets its answers, and streams beyond `max_streams`
//! wait, then are refused (RESOURCE_EXHAUSTED), while the one in flight is unaffected.

mod support;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use support::headers_msg;

/// Continues every phase unchanged.
const PASSTHROUGH: &str = r#"(module (memory (export "memory") 1)
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024))"#;

#[test]
fn streams_beyond_the_limit_are_refused_and_the_one_in_flight_is_answered() {
    let dir = std::env::temp_dir().join(format!("ext-proc-streams-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("m.wat"), PASSTHROUGH).unwrap();
    let sha: String = Sha256::digest(PASSTHROUGH)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(
        dir.join("c.yaml"),
        format!("module: {{path: m.wat, sha256: {sha}}}\nroot_id: probe\nplugin_config: {{}}\ninstances: 1\nmax_streams: 1\n"),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmkube-ext-proc"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--config"])
        .arg(dir.join("c.yaml"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    assert!(ready.contains("ready on"), "{ready}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = format!("http://127.0.0.1:{port}");
        let mut first = ExternalProcessorClient::connect(url.clone()).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(headers_msg("/a")).await.unwrap();
        let mut answers = first
            .process(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let a = answers.message().await.unwrap().unwrap();
        assert!(matches!(
            a.response,
            Some(processing_response::Response::RequestHeaders(_))
        ));
        // The first stream is still open: a second one waits for its slot, then is refused.
        let mut second = ExternalProcessorClient::connect(url).await.unwrap();
        let (tx2, rx2) = tokio::sync::mpsc::channel(4);
        tx2.send(headers_msg("/b")).await.unwrap();
        let started = std::time::Instant::now();
        let refused = second
            .process(tokio_stream::wrappers::ReceiverStream::new(rx2))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "refused without waiting"
        );
        drop(tx);
        assert!(
            answers.message().await.unwrap().is_none(),
            "stream ends cleanly"
        );
    });
    // SAFETY: signalling our own child by its pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
