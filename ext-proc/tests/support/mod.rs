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

pub fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}
