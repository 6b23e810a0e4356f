//! The callout transport: a module's `dispatch_http_call` to a configured cluster becomes one
//! HTTP/1.1 request on its own task, bounded in time (the shorter of the module's timeout and the
//! cluster's) and in size (the answer's head and body), and its answer (or failure) goes back to
//! the instance that made it. Calls in flight are bounded per instance by the runtime
//! (`max_calls_in_flight`: one more fails in the module with InternalFailure).
//!
//! Plain HTTP/1.1 with `connection: close`: the upstreams are in-cluster services (the budgets
//! service, engines' `/metrics`), and a connection per call keeps one slow upstream from holding
//! up another call.

use crate::config::Cluster;
use crate::pool::{Callout, Pool};
use llmkube_wasm_runtime::{HttpCallRecord, HttpCallReply};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Bytes of an answer's status line and headers.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers of one answer.
const MAX_HEADERS: usize = 128;

pub struct Transport {
    clusters: BTreeMap<String, Cluster>,
    max_response_bytes: usize,
    channels: crate::grpc_callout::Channels,
    pub calls: AtomicU64,
    pub errors: AtomicU64,
}

impl Transport {
    pub fn new(clusters: BTreeMap<String, Cluster>, max_response_bytes: usize) -> Self {
        Transport {
            clusters,
            max_response_bytes,
            channels: Default::default(),
            calls: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// Serves the pool's callouts until the pool is gone.
    pub async fn run(self: Arc<Self>, pool: Arc<Pool>, mut rx: mpsc::UnboundedReceiver<Callout>) {
        while let Some(call) = rx.recv().await {
            let (me, pool) = (self.clone(), pool.clone());
            tokio::spawn(async move {
                me.calls.fetch_add(1, Ordering::Relaxed);
                let reply = match me.call(&call.record).await {
                    Ok(r) => Some(r),
                    Err(why) => {
                        me.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "llmkube-ext-proc: callout to {} failed: {why}",
                            call.record.upstream
                        );
                        None
                    }
                };
                // Settling takes the instance's lock: off the async workers.
                let _ = tokio::task::spawn_blocking(move || pool.settle_call(&call, reply)).await;
            });
        }
    }

    async fn call(&self, record: &HttpCallRecord) -> Result<HttpCallReply, String> {
        // The runtime refuses unknown clusters with BadArgument, so this is a config race only.
        let cluster = self
            .clusters
            .get(&record.upstream)
            .ok_or_else(|| format!("no cluster {:?}", record.upstream))?;
        let timeout = effective(cluster.timeout, record.timeout);
        if cluster.grpc != record.grpc.is_some() {
            let kind = |grpc| if grpc { "grpc" } else { "http" };
            return Err(format!(
                "cluster {:?} takes {} calls, not {}",
                record.upstream,
                kind(cluster.grpc),
                kind(record.grpc.is_some())
            ));
        }
        if let Some(method) = &record.grpc {
            return crate::grpc_callout::call(
                &self.channels,
                cluster,
                record,
                method,
                timeout,
                self.max_response_bytes,
            )
            .await;
        }
        tokio::time::timeout(timeout, exchange(cluster, record, self.max_response_bytes))
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }
}

async fn exchange(
    cluster: &Cluster,
    record: &HttpCallRecord,
    max_body: usize,
) -> Result<HttpCallReply, String> {
    let mut conn = TcpStream::connect(&cluster.address)
        .await
        .map_err(|e| format!("connecting to {}: {e}", cluster.address))?;
    let _ = conn.set_nodelay(true);
    conn.write_all(&request_bytes(record))
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let mut buf = Vec::new();
    let cap = MAX_HEAD_BYTES + max_body;
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        if let Some(reply) = parse_response(&buf, max_body, false)? {
            return Ok(reply);
        }
        let n = conn
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading: {e}"))?;
        if n == 0 {
            return parse_response(&buf, max_body, true)?
                .ok_or_else(|| "the connection closed mid-answer".to_string());
        }
        if buf.len() + n > cap {
            return Err(format!("the answer is over {max_body} bytes"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The request as the module described it: pseudo-headers become the request line and `host`.
fn request_bytes(r: &HttpCallRecord) -> Vec<u8> {
    let method = r.header(":method").unwrap_or("GET");
    let path = r.header(":path").unwrap_or("/");
    let authority = r.header(":authority").unwrap_or("");
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: {authority}\r\n");
    for (k, v) in &r.headers {
        let framing = matches!(
            k.as_str(),
            "host" | "content-length" | "transfer-encoding" | "connection"
        );
        // A value with a line break would smuggle a second header or request.
        if k.starts_with(':') || framing || has_line_break(k) || has_line_break(v) {
            continue;
        }
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        r.body.len()
    ));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&r.body);
    bytes
}

fn has_line_break(s: &str) -> bool {
    s.bytes().any(|b| b == b'\r' || b == b'\n')
}

/// The whole answer once `buf` holds it (`closed`: the peer closed, so a body without a length
/// ends here); `None` while more is needed.
fn parse_response(
    buf: &[u8],
    max_body: usize,
    closed: bool,
) -> Result<Option<HttpCallReply>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut headers);
    let head_len = match res.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => {
            return Err("the answer's head is too long".into())
        }
        Ok(httparse::Status::Partial) if closed => {
            return Err("the connection closed before the answer's head".into())
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("not an HTTP answer: {e}")),
    };
    let status = res.code.unwrap_or(0);
    let mut reply = HttpCallReply::new(status, Vec::new());
    let mut length = None;
    let mut chunked = false;
    for h in res.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        let value = String::from_utf8_lossy(h.value).into_owned();
        match name.as_str() {
            "content-length" => {
                length = Some(
                    value
                        .trim()
                        .parse::<usize>()
                        .map_err(|_| "a bad content-length".to_string())?,
                )
            }
            "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
        reply.headers.push((name, value));
    }
    let body = &buf[head_len..];
    let body = if chunked {
        match dechunk(body)? {
            Some(b) => b,
            None if closed => return Err("the connection closed mid-body".into()),
            None => return Ok(None),
        }
    } else if let Some(n) = length {
        if n > max_body {
            return Err(format!("the answer is over {max_body} bytes"));
        }
        if body.len() < n {
            return if closed {
                Err("the connection closed mid-body".into())
            } else {
                Ok(None)
            };
        }
        body[..n].to_vec()
    } else if closed || status == 204 || status == 304 {
        body.to_vec()
    } else {
        return Ok(None);
    };
    if body.len() > max_body {
        return Err(format!("the answer is over {max_body} bytes"));
    }
    reply.body = body;
    Ok(Some(reply))
}

/// A chunked body, once its last chunk arrived.
fn dechunk(mut b: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| "a bad chunk size".to_string())?;
        let data = eol + 2;
        if size == 0 {
            return Ok(Some(out));
        }
        let Some(end) = data.checked_add(size) else {
            return Err("a bad chunk size".into());
        };
        if b.len() < end + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&b[data..end]);
        b = &b[end + 2..];
    }
}

/// A call's timeout: the shorter of its cluster's and the module's (0 from the module: the
/// cluster's).
fn effective(cluster: Duration, module: Duration) -> Duration {
    cluster.min(if module.is_zero() { cluster } else { module })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &str)]) -> HttpCallRecord {
        HttpCallRecord {
            token: 1,
            context_id: 2,
            upstream: "u".into(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: b"{}".to_vec(),
            trailers: vec![],
            timeout: Duration::from_millis(100),
            grpc: None,
        }
    }

    #[test]
    fn the_request_line_comes_from_the_pseudo_headers_and_framing_is_ours() {
        let r = record(&[
            (":method", "POST"),
            (":path", "/v1/reserve"),
            (":authority", "budgets"),
            ("content-length", "999"),
            ("x-team", "a\r\nx-evil: 1"),
            ("x-ok", "1"),
        ]);
        let text = String::from_utf8(request_bytes(&r)).unwrap();
        assert_eq!(
            text,
            "POST /v1/reserve HTTP/1.1\r\nhost: budgets\r\nx-ok: 1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
        );
    }

    #[test]
    fn answers_parse_by_length_by_chunks_and_to_the_close() {
        let by_length = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nokEXTRA";
        let r = parse_response(by_length, 100, false).unwrap().unwrap();
        assert_eq!(r.body, b"ok");
        assert!(r.headers.contains(&(":status".into(), "200".into())));
        assert!(r.headers.contains(&("x-a".into(), "1".into())));
        assert!(parse_response(&by_length[..40], 100, false)
            .unwrap()
            .is_none());

        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n3;x=y\r\ncde\r\n0\r\n\r\n";
        let r = parse_response(chunked, 100, false).unwrap().unwrap();
        assert_eq!(r.body, b"abcde");
        assert!(parse_response(&chunked[..60], 100, false)
            .unwrap()
            .is_none());

        let to_close = b"HTTP/1.0 503 x\r\n\r\nbusy";
        assert!(parse_response(to_close, 100, false).unwrap().is_none());
        assert_eq!(
            parse_response(to_close, 100, true).unwrap().unwrap().body,
            b"busy"
        );
    }

    #[test]
    fn an_answer_over_the_cap_or_malformed_fails_the_call() {
        let big = b"HTTP/1.1 200 OK\r\ncontent-length: 101\r\n\r\n";
        assert!(parse_response(big, 100, false).is_err());
        assert!(parse_response(b"garbage\r\n\r\n", 100, false).is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab", 100, true).is_err()
        );
        assert_eq!(
            effective(Duration::from_secs(1), Duration::from_millis(20)),
            Duration::from_millis(20)
        );
        assert_eq!(
            effective(Duration::from_secs(1), Duration::from_secs(9)),
            Duration::from_secs(1)
        );
    }
}
