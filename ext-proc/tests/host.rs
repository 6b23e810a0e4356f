//! The server as a full proxy-wasm host, over real gRPC, with the harness's probe filter (every
//! host feature reachable from its plugin config): callouts to a configured cluster served by a
//! small HTTP server, failed and unknown-cluster callouts, ticks on every instance, and the
//! Prometheus endpoint.

mod support;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response, ProcessingRequest, ProcessingResponse,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{config_dir, free_addr, headers_msg, sha256_hex};

/// The probe filter, built (release, wasm32-wasip1) if it is not up to date.
fn probe_wasm() -> PathBuf {
    support::filter_wasm("probe-filter", "probe_filter.wasm")
}

struct Server {
    process: support::Process,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Server {
    /// `extra`: YAML lines appended to the config (clusters, instances, ...).
    fn start(plugin_config: &str, extra: &str) -> Server {
        let wasm = probe_wasm();
        let sha = sha256_hex(&wasm);
        let (addr, metrics) = (free_addr(), free_addr());
        let dir = config_dir("host", addr);
        let cfg = dir.join("c.yaml");
        std::fs::write(
            &cfg,
            format!(
                "module: {{path: {}, sha256: {sha}}}\nroot_id: probe\nplugin_config: '{plugin_config}'\n{extra}\n",
                wasm.display()
            ),
        )
        .unwrap();
        Server {
            process: support::Process::start(&cfg, addr, metrics),
            addr,
            metrics,
        }
    }

    fn wait_log(&self, needle: &str, times: usize) {
        self.process.wait_log(needle, times)
    }

    fn scrape(&self) -> String {
        let mut c = TcpStream::connect(self.metrics).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        text
    }

    /// One stream: request headers (end of stream), the server's answer.
    async fn headers(&self, path: &str) -> ProcessingResponse {
        self.open(path).await.0
    }

    /// [`Server::headers`] with the stream kept open while the sender is held.
    async fn open(
        &self,
        path: &str,
    ) -> (
        ProcessingResponse,
        tokio::sync::mpsc::Sender<ProcessingRequest>,
    ) {
        let mut client = ExternalProcessorClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap();
        let msg = headers_msg(path);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(msg).await.unwrap();
        let mut answers = client
            .process(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        (answers.message().await.unwrap().unwrap(), tx)
    }
}

/// The header the filter set in its request-headers answer.
fn set_header(r: &ProcessingResponse, name: &str) -> Option<String> {
    let Some(processing_response::Response::RequestHeaders(h)) = &r.response else {
        panic!("not a request-headers answer: {r:?}")
    };
    h.response
        .as_ref()?
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}

/// Answers each request with `200 seen <x-orig-path>`, but only once `batch` requests are in:
/// a host that blocked its instance during a callout would never send the second one.
fn lookup_server(batch: usize) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || loop {
        let mut held = Vec::new();
        while held.len() < batch {
            let Ok((mut c, _)) = l.accept() else { return };
            let mut buf = Vec::new();
            let mut b = [0u8; 4096];
            // Head plus the probe's 11-byte body.
            while !String::from_utf8_lossy(&buf).contains("lookup-body") {
                let n = c.read(&mut b).unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&b[..n]);
            }
            let text = String::from_utf8_lossy(&buf).into_owned();
            let path = text
                .lines()
                .find_map(|l| l.strip_prefix("x-orig-path: "))
                .unwrap_or("?")
                .to_string();
            record.lock().unwrap().push(text);
            held.push((c, path));
        }
        for (mut c, path) in held {
            let body = format!("seen {path}");
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, seen)
}

#[test]
fn a_callout_reaches_its_cluster_without_blocking_the_instance_and_its_answer_resumes_the_stream() {
    let (lookup, seen) = lookup_server(2);
    let s = Server::start(
        r#"{"http_call": "lookup"}"#,
        &format!("instances: 1\nclusters: {{lookup: {{address: '{lookup}', timeout_ms: 5000}}}}"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, b) = rt.block_on(async { tokio::join!(s.headers("/a"), s.headers("/b")) });
    for (r, path) in [(&a, "/a"), (&b, "/b")] {
        assert_eq!(
            set_header(r, "x-call-status").as_deref(),
            Some("200"),
            "{r:?}"
        );
        assert_eq!(
            set_header(r, "x-call-body"),
            Some(format!("seen {path}")),
            "{r:?}"
        );
    }
    let reqs = seen.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2);
    assert!(
        reqs.iter()
            .all(|r| r.starts_with("POST /lookup HTTP/1.1\r\nhost: lookup\r\n")),
        "{reqs:?}"
    );
    let m = s.scrape();
    assert!(m.contains("\nllmkube_ext_proc_callouts_total 2\n"), "{m}");
    assert!(
        m.contains("\nllmkube_ext_proc_callout_errors_total 0\n"),
        "{m}"
    );
}

#[test]
fn a_failed_callout_reaches_the_module_empty_and_an_unknown_cluster_fails_closed() {
    // Nothing listens there.
    let dead = free_addr();
    let s = Server::start(
        r#"{"http_call": "lookup"}"#,
        &format!("clusters: {{lookup: {{address: '{dead}', timeout_ms: 500}}}}"),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(s.headers("/a"));
    // Envoy reports a failed call as a response with no headers: the probe copies no status.
    assert_eq!(
        set_header(&r, "x-call-status").as_deref(),
        Some(""),
        "{r:?}"
    );
    let m = s.scrape();
    assert!(
        m.contains("\nllmkube_ext_proc_callout_errors_total 1\n"),
        "{m}"
    );

    let unknown = Server::start(r#"{"http_call": "nowhere"}"#, "");
    let r = rt.block_on(unknown.headers("/a"));
    let Some(processing_response::Response::ImmediateResponse(ir)) = &r.response else {
        panic!("{r:?}")
    };
    assert_eq!(ir.status.as_ref().map(|s| s.code), Some(503));
    unknown.wait_log("dispatch failed BadArgument", 1);
}

#[test]
fn ticks_run_on_every_instance_and_module_metrics_are_summed_on_the_metrics_port() {
    let s = Server::start(
        r#"{"tick_ms": 20, "metric": "probe.requests"}"#,
        "instances: 2",
    );
    // Each instance's root context counts its own ticks: two instances, two first ticks.
    s.wait_log("tick=1 ", 2);
    s.wait_log("tick=3 ", 2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Held open together, two streams are on different instances (the least busy one).
        let (_, held_a) = s.open("/1").await;
        let (_, held_b) = s.open("/2").await;
        drop((held_a, held_b));
        s.headers("/3").await;
    });
    let m = s.scrape();
    assert!(
        m.contains("# TYPE probe_requests counter\nprobe_requests 3\n"),
        "{m}"
    );
    assert!(m.contains("# TYPE probe_requests_hist summary\n"), "{m}");
    assert!(
        m.contains("\nllmkube_ext_proc_instance_traps_total 0\n"),
        "{m}"
    );
    // The streams' slots are released once their ends reach the server.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s
        .scrape()
        .contains("\nllmkube_ext_proc_streams_in_flight 0\n")
    {
        assert!(Instant::now() < deadline, "{}", s.scrape());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Only /metrics is served.
    let mut c = TcpStream::connect(s.metrics).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
}
