//! The no-backend listener (`no_backend_listen`): plain HTTP/1.1 where every request is answered
//! 503 with an OpenAI-shaped body and never forwarded anywhere.
//!
//! Why: agentgateway v1.3.1 answers a request whose backends all failed with a plain-text 503 of
//! its own (`upstream call failed: …`), and its ext_proc response phase skips replies it makes
//! itself, so the filter cannot give that answer its own shape. The generated agentgateway
//! config lists this listener as the last, never-evicted priority group of every route: a
//! request gets there only after every backend of its order failed or while all are evicted,
//! and its 503 is an upstream response, which the gateway-level ext_proc response phase hands to
//! the filter — which answers it as on Envoy (`fail_closed` for a sensitive request,
//! `all_backends_failed` otherwise). It is a dead end by construction: nothing here connects
//! anywhere, so no request, sensitive or not, can leave through it.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes of a request head read before answering.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a request may take to arrive (head and body) before the connection is dropped.
const READ_DEADLINE: Duration = Duration::from_secs(10);

/// The answer's body (what a client sees if no filter reshapes it).
pub fn answer_body() -> String {
    serde_json::json!({"error": {
        "message": "no backend of this request's route is available",
        "type": "api_error",
        "param": null,
        "code": "no_backend_available",
    }})
    .to_string()
}

/// Binds the listener (an error names the config key).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("no_backend_listen {addr}: {e}"))
}

/// Answers every connection's request until the process ends, one task per connection. A body
/// is read (up to `max_body` bytes) before the answer, so the gateway's write of it completes.
pub async fn serve(listener: TcpListener, max_body: usize) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let _ = conn.set_nodelay(true);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(READ_DEADLINE, answer(conn, max_body)).await;
        });
    }
}

async fn answer(mut conn: TcpStream, max_body: usize) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(());
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let framing = framing(&buf[..head_end]);
    let mut body = buf.split_off(head_end);
    let limit = max_body.saturating_add(MAX_HEAD_BYTES);
    loop {
        let complete = match framing {
            Framing::Length(n) => body.len() >= n,
            Framing::Chunked => body.ends_with(b"0\r\n\r\n"),
        };
        if complete || body.len() > limit {
            break;
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body = answer_body();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
}

/// How the request's body ends: by its `content-length` (none: no body) or chunked.
fn framing(head: &[u8]) -> Framing {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    if req.parse(head).is_err() {
        return Framing::Length(0);
    }
    let value = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::trim)
    };
    if value("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        return Framing::Chunked;
    }
    Framing::Length(
        value("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_ends_by_its_length_or_its_last_chunk() {
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\nhost: x\r\nContent-Length: 12\r\n\r\n"),
            Framing::Length(12)
        );
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(framing(b"GET / HTTP/1.1\r\n\r\n"), Framing::Length(0));
    }

    #[tokio::test]
    async fn every_request_is_answered_503_openai_shaped_after_its_body() {
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(serve(l, 1024));
        let mut c = TcpStream::connect(addr).await.unwrap();
        let body = br#"{"model":"m","messages":[]}"#;
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        c.write_all(req.as_bytes()).await.unwrap();
        c.write_all(body).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
        let json = text.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["error"]["code"], "no_backend_available");
        assert_eq!(v["error"]["type"], "api_error");
    }
}
