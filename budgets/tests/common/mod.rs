//! Fixtures: a real `redis-server` on a free loopback port in a temp dir, the service (in-process
//! or the built binary), and a minimal HTTP/1.1 client.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The e2e fixtures' `redis-server` (one implementation for both suites).
pub use e2e::budgets::Redis;

/// A Redis for one test, or `None` outside CI when redis-server is not installed.
pub fn redis() -> Option<Redis> {
    Redis::start_if_installed(&[])
}

/// A Redis Cluster of three masters (slots spread by `redis-cli --cluster create`).
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Option<Cluster> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(Redis::start_if_installed(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "2000",
            ])?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            loop {
                let info = Command::new("redis-cli")
                    .args(["-p", &n.port.to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli runs");
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster did not reach state ok");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Some(Cluster { nodes })
    }

    /// How many keys each node holds.
    pub fn keys_per_node(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|n| {
                let out = Command::new("redis-cli")
                    .args(["-p", &n.port.to_string(), "dbsize"])
                    .output()
                    .expect("redis-cli runs");
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// Tests share two cores with many processes: a generous per-call timeout keeps a slow
/// scheduler from looking like Redis being down (the down test kills Redis, which fails fast).
pub fn test_options(hold: bool, cluster: bool) -> llmkube_budgets::store::StoreOptions {
    llmkube_budgets::store::StoreOptions {
        hold,
        cluster,
        timeout: Duration::from_secs(5),
    }
}

/// The service in this process, on its own runtime thread.
pub struct InProcess {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    pub fn start(redis_url: &str, hold: bool) -> InProcess {
        InProcess::start_with(redis_url, hold, false)
    }

    pub fn start_with(redis_url: &str, hold: bool, cluster: bool) -> InProcess {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let url = redis_url.to_string();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let store =
                    llmkube_budgets::store::RedisStore::new(&url, &test_options(hold, cluster))
                        .expect("store");
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                ready_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("ready");
                let svc = Arc::new(llmkube_budgets::server::Service { store });
                llmkube_budgets::serve(listener, svc, async {
                    let _ = stop_rx.await;
                })
                .await;
            });
        });
        let addr = ready_rx.recv().expect("service started");
        InProcess {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The built binary, started with `args`; waits for its ready line.
pub struct Binary {
    pub child: Child,
    pub ready_line: String,
}

impl Binary {
    pub fn start(args: &[&str]) -> Binary {
        let mut child = Command::new(env!("CARGO_BIN_EXE_llmkube-budgets"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("llmkube-budgets starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout);
        let mut ready_line = String::new();
        lines.read_line(&mut ready_line).expect("a ready line");
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while lines.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        Binary { child, ready_line }
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // The pid of the child this fixture started, nothing else.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        self.child.wait().expect("exit status")
    }
}

impl Drop for Binary {
    /// A test that failed before `terminate` must not leave the service running.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits until the service answers `/healthz` with 200 (Redis reachable), up to 10 s.
pub fn wait_healthy(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if TcpStream::connect(addr).is_ok() && http(addr, "GET", "/healthz", None).0 == 200 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "service at {addr} never became healthy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP/1.1 request (Connection: close); returns status and parsed JSON body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, serde_json::Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = TcpStream::connect(addr).expect("connect to the service");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: budgets\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).to_string();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let (head, payload) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{head}"
    );
    let v = serde_json::from_str(payload).unwrap_or_else(|e| panic!("{e}: {payload:?}"));
    (status, v)
}
