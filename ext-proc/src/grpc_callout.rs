//! gRPC callouts (`dispatch_grpc_call`) to a `clusters:` entry of `kind: grpc`: one unary call
//! on the cluster's HTTP/2 channel (one per cluster, shared by all calls), the request message
//! and the answer as raw bytes (the module serializes its own protobuf), bounded in time (the
//! shorter of the module's and the cluster's timeout; not sent as `grpc-timeout`, which would
//! make tonic end the call itself as CANCELLED instead of DEADLINE_EXCEEDED) and in size
//! (`max_callout_response_bytes`). The answer goes back as the runtime expects it: the message
//! with `grpc-status: 0`, or the status code and message (a deadline passed is
//! DEADLINE_EXCEEDED, a connection that cannot be made UNAVAILABLE, as tonic reports it).
//! A call the module cancels, or whose stream ended, is dropped by the runtime when it settles;
//! its time on the wire is bounded by the timeout.

use crate::config::Cluster;
use llmkube_wasm_runtime::{GrpcMethod, HttpCallRecord, HttpCallReply, DEADLINE_EXCEEDED};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

/// One lazily connected channel per cluster: HTTP/2 multiplexes the calls.
#[derive(Default)]
pub struct Channels(Mutex<BTreeMap<String, Channel>>);

impl Channels {
    fn get(&self, name: &str, cluster: &Cluster) -> Result<Channel, String> {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get(name) {
            return Ok(c.clone());
        }
        let c = Endpoint::from_shared(format!("http://{}", cluster.address))
            .map_err(|e| format!("cluster {name}: address {:?}: {e}", cluster.address))?
            .connect_timeout(cluster.timeout)
            .tcp_nodelay(true)
            .connect_lazy();
        m.insert(name.to_string(), c.clone());
        Ok(c)
    }
}

/// The call's answer; `Err` only when it could not be sent at all (bad method or metadata).
pub async fn call(
    channels: &Channels,
    cluster: &Cluster,
    record: &HttpCallRecord,
    method: &GrpcMethod,
    timeout: Duration,
    max_response_bytes: usize,
) -> Result<HttpCallReply, String> {
    let channel = channels.get(&record.upstream, cluster)?;
    let path = format!("/{}/{}", method.service, method.method);
    let path = PathAndQuery::try_from(path.as_str()).map_err(|e| format!("method {path}: {e}"))?;
    let mut req = tonic::Request::new(record.body.clone());
    for (k, v) in record.headers.iter().filter(|(k, _)| !k.starts_with(':')) {
        let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(k.as_bytes()),
            MetadataValue::try_from(v.as_str()),
        ) else {
            return Err(format!("initial metadata {k:?} is not ASCII metadata"));
        };
        req.metadata_mut().append(key, value);
    }
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(max_response_bytes);
    let answer = tokio::time::timeout(timeout, async {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        grpc.unary::<Vec<u8>, Vec<u8>, Raw>(req, path, Raw).await
    })
    .await;
    Ok(match answer {
        Err(_) => status(DEADLINE_EXCEEDED, &format!("no answer within {timeout:?}")),
        Ok(Ok(r)) => HttpCallReply {
            body: r.into_inner(),
            ..Default::default()
        }
        .with_header("grpc-status", "0"),
        Ok(Err(s)) => status(s.code() as u32, s.message()),
    })
}

fn status(code: u32, message: &str) -> HttpCallReply {
    HttpCallReply::default()
        .with_header("grpc-status", &code.to_string())
        .with_header("grpc-message", message)
}

/// Messages as the module serialized them.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use bytes::Buf;
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmkube_wasm_runtime::UNAVAILABLE;

    fn record() -> HttpCallRecord {
        HttpCallRecord {
            token: 1,
            context_id: 2,
            upstream: "g".into(),
            headers: vec![("x-team".into(), "a".into())],
            body: b"\x0a\x02hi".to_vec(),
            trailers: vec![],
            timeout: Duration::from_millis(300),
            grpc: Some(GrpcMethod {
                service: "llmkube.Budgets".into(),
                method: "Reserve".into(),
            }),
        }
    }

    fn code(r: &HttpCallReply) -> Option<&str> {
        r.headers
            .iter()
            .find(|(k, _)| k == "grpc-status")
            .map(|(_, v)| v.as_str())
    }

    #[tokio::test]
    async fn a_cluster_nobody_listens_on_is_unavailable_and_a_silent_one_times_out() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        let cluster = Cluster {
            address: addr.to_string(),
            timeout: Duration::from_secs(1),
            grpc: true,
        };
        let r = record();
        let m = r.grpc.clone().unwrap();
        let channels = Channels::default();
        let reply = call(&channels, &cluster, &r, &m, r.timeout, 1024)
            .await
            .unwrap();
        assert_eq!(
            code(&reply),
            Some(UNAVAILABLE.to_string().as_str()),
            "{reply:?}"
        );

        // Accepts the connection and never answers: the call's own deadline ends it.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cluster = Cluster {
            address: silent.local_addr().unwrap().to_string(),
            ..cluster
        };
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let channels = Channels::default();
        let reply = call(
            &channels,
            &cluster,
            &r,
            &m,
            Duration::from_millis(200),
            1024,
        )
        .await
        .unwrap();
        assert_eq!(
            code(&reply),
            Some(DEADLINE_EXCEEDED.to_string().as_str()),
            "{reply:?}"
        );
        hold.abort();
    }

    /// A real gRPC server (tonic's) with one raw unary method, `llmkube.Budgets/Reserve`: it
    /// answers the request message followed by the `x-team` metadata, or PERMISSION_DENIED for
    /// team "nobody".
    #[derive(Clone)]
    struct Budgets;

    impl tonic::server::NamedService for Budgets {
        const NAME: &'static str = "llmkube.Budgets";
    }

    struct Reserve;

    impl tonic::server::UnaryService<Vec<u8>> for Reserve {
        type Response = Vec<u8>;
        type Future = std::future::Ready<Result<tonic::Response<Vec<u8>>, Status>>;
        fn call(&mut self, r: tonic::Request<Vec<u8>>) -> Self::Future {
            let team = r
                .metadata()
                .get("x-team")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            if team == "nobody" {
                return std::future::ready(Err(Status::permission_denied("no such team")));
            }
            let mut out = r.into_inner();
            out.extend_from_slice(team.as_bytes());
            std::future::ready(Ok(tonic::Response::new(out)))
        }
    }

    type HttpRequest = tonic::codegen::http::Request<tonic::body::Body>;
    type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

    impl tonic::codegen::Service<HttpRequest> for Budgets {
        type Response = HttpResponse;
        type Error = std::convert::Infallible;
        type Future = tonic::codegen::BoxFuture<HttpResponse, std::convert::Infallible>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, req: HttpRequest) -> Self::Future {
            Box::pin(async move {
                if req.uri().path() != "/llmkube.Budgets/Reserve" {
                    return Ok(Status::unimplemented("no such method").into_http());
                }
                Ok(tonic::server::Grpc::new(Raw).unary(Reserve, req).await)
            })
        }
    }

    #[tokio::test]
    async fn a_unary_call_carries_message_and_metadata_and_returns_answer_or_status() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cluster = Cluster {
            address: listener.local_addr().unwrap().to_string(),
            timeout: Duration::from_secs(2),
            grpc: true,
        };
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(Budgets)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let channels = Channels::default();
        let r = record();
        let m = r.grpc.clone().unwrap();
        let reply = call(&channels, &cluster, &r, &m, Duration::from_secs(2), 1024)
            .await
            .unwrap();
        assert_eq!(code(&reply), Some("0"), "{reply:?}");
        assert_eq!(reply.body, b"\x0a\x02hia");
        let mut denied = record();
        denied.headers = vec![("x-team".into(), "nobody".into())];
        let reply = call(
            &channels,
            &cluster,
            &denied,
            &m,
            Duration::from_secs(2),
            1024,
        )
        .await
        .unwrap();
        assert_eq!(code(&reply), Some("7"), "{reply:?}");
        // An answer over the bound fails the call instead of being read.
        let reply = call(&channels, &cluster, &r, &m, Duration::from_secs(2), 3)
            .await
            .unwrap();
        assert_ne!(code(&reply), Some("0"), "{reply:?}");
        let unknown = GrpcMethod {
            service: "llmkube.Budgets".into(),
            method: "Nope".into(),
        };
        let reply = call(
            &channels,
            &cluster,
            &r,
            &unknown,
            Duration::from_secs(2),
            1024,
        )
        .await
        .unwrap();
        assert_eq!(code(&reply), Some("12"), "UNIMPLEMENTED: {reply:?}");
        server.abort();
    }

    #[tokio::test]
    async fn metadata_that_is_not_ascii_metadata_is_refused_before_sending() {
        let cluster = Cluster {
            address: "127.0.0.1:9".into(),
            timeout: Duration::from_secs(1),
            grpc: true,
        };
        let mut r = record();
        r.headers = vec![("bad key".into(), "v".into())];
        let m = r.grpc.clone().unwrap();
        let err = call(&Channels::default(), &cluster, &r, &m, r.timeout, 1024)
            .await
            .unwrap_err();
        assert!(err.contains("bad key"), "{err}");
    }
}
