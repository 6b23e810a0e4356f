//! The gRPC side: one task per ext_proc stream, a bound on streams in flight, timers, and a
//! graceful stop on SIGTERM.

use crate::config::Config;
use crate::phases::Exchange;
use crate::pool::Pool;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// How long a new stream waits for a free slot before it is refused (back-pressure, not a queue
/// without end).
const ADMISSION_WAIT: Duration = Duration::from_secs(2);
/// How often due ticks run on the instances.
const TICK_EVERY: Duration = Duration::from_millis(50);

struct Processor {
    pool: Arc<Pool>,
    streams: Arc<Semaphore>,
}

type Out = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = Out;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Out>, Status> {
        let permit = match tokio::time::timeout(
            ADMISSION_WAIT,
            self.streams.clone().acquire_owned(),
        )
        .await
        {
            Ok(Ok(p)) => p,
            _ => return Err(Status::resource_exhausted("too many streams in flight")),
        };
        let mut inbound = request.into_inner();
        let pool = self.pool.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let _permit = permit;
            let mut exchange = Exchange::new(&pool);
            while let Some(msg) = inbound.next().await {
                let Ok(msg) = msg else { break };
                if let Some(answer) = exchange.handle(msg) {
                    if tx.send(Ok(answer)).await.is_err() {
                        break;
                    }
                }
            }
            exchange.finish();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub async fn serve(listen: SocketAddr, pool: Arc<Pool>, cfg: &Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?;
    let bound = listener.local_addr()?;
    let ticker = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TICK_EVERY);
            loop {
                every.tick().await;
                pool.run_due();
            }
        })
    };
    // A gRPC message carries at most the whole body the filter accepts, plus framing.
    let max_message = cfg.max_body_bytes.saturating_add(1 << 20);
    let service = ExternalProcessorServer::new(Processor {
        pool: pool.clone(),
        streams: Arc::new(Semaphore::new(cfg.max_streams)),
    })
    .max_decoding_message_size(max_message)
    .max_encoding_message_size(max_message);
    eprintln!(
        "llmkube-ext-proc: ready on {bound}: {} ({} instances of root_id {}, up to {} streams)",
        cfg.module_path.display(),
        pool.instances(),
        cfg.root_id,
        cfg.max_streams
    );
    let stop = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        eprintln!("llmkube-ext-proc: stopping: finishing the streams in flight");
    };
    tonic::transport::Server::builder()
        .add_service(service)
        // Without TCP_NODELAY a small answer waits out the client's delayed ACK (~40 ms).
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop,
        )
        .await?;
    ticker.abort();
    eprintln!("llmkube-ext-proc: stopped");
    Ok(())
}
