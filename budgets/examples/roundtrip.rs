//! A short loopback benchmark (not a test): reserve + settle round trips against the service
//! with a real Redis, over one keep-alive HTTP/1.1 connection as a gateway's cluster would hold.
//!
//!   cargo run --release -p llmkube-budgets --example roundtrip -- redis://127.0.0.1:6379 [N]
//!
//! Prints p50/p99/max of the reserve+settle pair and of each call, in microseconds.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use llmkube_budgets::{serve, server::Service, store::RedisStore};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5000);
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = server_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let store = server_rt
        .block_on(async { RedisStore::new(&url, &Default::default()) })
        .expect("store");
    server_rt.spawn(serve(
        listener,
        Arc::new(Service { store }),
        std::future::pending(),
    ));

    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    client_rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).ok();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let router = format!("bench/{}", std::process::id());
        let ledgers = json!([
            {"budget": "router", "window_s": 3600, "max_tokens": 1_000_000_000_000u64},
            {"budget": "team", "team": "alpha", "window_s": 3600, "max_usd": "1000000"}
        ]);
        let mut post = async |path: &str, body: Value| -> Value {
            let req = Request::post(path)
                .header("host", "budgets")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("request");
            let resp = send.send_request(req).await.expect("send");
            let b = resp.into_body().collect().await.expect("body").to_bytes();
            serde_json::from_slice(&b).expect("json")
        };
        let (mut pair, mut res, mut set) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n + 200 {
            let t0 = Instant::now();
            let r = post(
                "/v1/reserve",
                json!({"router": router, "ledgers": ledgers, "amount": {"tokens": 5000, "usd": "0.01"}}),
            )
            .await;
            let t1 = Instant::now();
            assert_eq!(r["admitted"], true, "{r}");
            post(
                "/v1/settle",
                json!({"router": router, "ledgers": ledgers, "reservation": r["reservation"],
                    "amount": {"tokens": 1234, "usd": "0.00123"}}),
            )
            .await;
            let t2 = Instant::now();
            if i >= 200 {
                pair.push(t2 - t0);
                res.push(t1 - t0);
                set.push(t2 - t1);
            }
        }
        for (name, mut v) in [("reserve+settle", pair), ("reserve", res), ("settle", set)] {
            v.sort();
            let q = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{name:>15}: n={} p50 {:.0} µs  p99 {:.0} µs  max {:.0} µs  (2 ledgers)",
                v.len(),
                us(q(0.50)),
                us(q(0.99)),
                us(*v.last().expect("samples"))
            );
        }
    });
}
