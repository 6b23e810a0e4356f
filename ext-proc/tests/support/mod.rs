//! What the server tests share: the request-headers message a stream opens with, building a
//! filter module, free ports. (Each test file uses a part of it.)
#![allow(dead_code)]

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, HttpHeaders, ProcessingRequest,
};

/// Request headers with `:path` only, ending the request.
pub fn headers_msg(path: &str) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: ":path".into(),
                    value: String::new(),
                    raw_value: path.as_bytes().to_vec(),
                }],
            }),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// Filter module `package` (release, wasm32-wasip1), built if it is not up to date: the path of
/// its `file`.
pub fn filter_wasm(package: &str, file: &str) -> std::path::PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip1",
            "-p",
            package,
        ])
        .env("CARGO_TARGET_DIR", target_dir())
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target_dir().join("wasm32-wasip1/release").join(file)
}

/// The sha256 of the file at `path`, in hex: what a config pins a module with.
pub fn sha256_hex(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh directory for one server's config, named after the test file and its port.
pub fn config_dir(name: &str, addr: std::net::SocketAddr) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ext-proc-{name}-{}-{}",
        std::process::id(),
        addr.port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A running `llmkube-ext-proc` on `addr` (metrics on `metrics`) with config file `cfg`, its
/// stderr collected; killed on drop (its log printed when the test failed).
pub struct Process {
    child: std::process::Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Process {
    /// Starts the server and waits for its ready line.
    pub fn start(
        cfg: &std::path::Path,
        addr: std::net::SocketAddr,
        metrics: std::net::SocketAddr,
    ) -> Process {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_llmkube-ext-proc"))
            .args([
                "--listen",
                &addr.to_string(),
                "--metrics",
                &metrics.to_string(),
                "--config",
            ])
            .arg(cfg)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let p = Process { child, log };
        p.wait_log("ready on", 1);
        p
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits (up to a minute) for the process to exit; its exit code.
    pub fn wait_exit(&mut self) -> Option<i32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Waits (up to a minute) until `needle` is in the log `times` times.
    pub fn wait_log(&self, needle: &str, times: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.log().matches(needle).count() < times {
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} x{times}:\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
