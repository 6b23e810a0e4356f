//! The gRPC side: one task per ext_proc stream, a bound on streams in flight, timers, the
//! callout transport, the metrics endpoint, and a graceful stop on SIGTERM.

use crate::callout::Transport;
use crate::config::Config;
use crate::metrics;
use crate::phases::Exchange;
use crate::pool::Callout;
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
/// The longest the timer task sleeps: it wakes at the earliest tick or callout deadline of any
/// instance, and at least this often (a tick period set meanwhile is picked up by then).
const TICK_AT_MOST_EVERY: Duration = Duration::from_millis(50);

struct Processor {
    pool: Arc<Pool>,
    streams: Arc<Semaphore>,
    /// Endpoint-picker mode, with the filter's body limit.
    picker: Option<(Arc<crate::epp::Settings>, usize)>,
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
        if let Some((settings, max_body)) = self.picker.clone() {
            tokio::spawn(async move {
                let _permit = permit;
                crate::epp::run(&pool, &settings, max_body, inbound, tx).await;
            });
            return Ok(Response::new(Box::pin(ReceiverStream::new(rx))));
        }
        tokio::spawn(async move {
            let _permit = permit;
            let mut exchange = Exchange::new(&pool);
            while let Some(msg) = inbound.next().await {
                let Ok(msg) = msg else { break };
                let mut gone = false;
                for answer in exchange.answers(msg).await {
                    gone = gone || tx.send(Ok(answer)).await.is_err();
                }
                if gone {
                    break;
                }
            }
            exchange.finish();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

pub async fn serve(
    listen: SocketAddr,
    pool: Arc<Pool>,
    calls: mpsc::UnboundedReceiver<Callout>,
    metrics_at: Option<SocketAddr>,
    cfg: &Config,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?;
    let bound = listener.local_addr()?;
    let metrics_listener = match metrics_at {
        Some(addr) => Some(metrics::bind(addr).await?),
        None => None,
    };
    let streams = Arc::new(Semaphore::new(cfg.max_streams));
    let transport = Arc::new(Transport::new(
        cfg.clusters.clone(),
        cfg.max_callout_response_bytes,
    ));
    let mut background = vec![
        tokio::spawn(transport.clone().run(pool.clone(), calls)),
        tokio::spawn(timers(pool.clone())),
    ];
    let mut metrics_line = String::new();
    if let Some(l) = metrics_listener {
        metrics_line = format!(", metrics on http://{}/metrics", l.local_addr()?);
        let sources = Arc::new(metrics::Sources {
            pool: pool.clone(),
            transport,
            streams: streams.clone(),
            max_streams: cfg.max_streams,
        });
        background.push(tokio::spawn(metrics::serve(l, sources)));
    }
    // A gRPC message carries at most the whole body the filter accepts, plus framing.
    let max_message = cfg.max_body_bytes.saturating_add(1 << 20);
    let service = ExternalProcessorServer::new(Processor {
        pool: pool.clone(),
        streams,
        picker: cfg
            .endpoint_picker
            .clone()
            .map(|s| (Arc::new(s), cfg.max_body_bytes)),
    })
    .max_decoding_message_size(max_message)
    .max_encoding_message_size(max_message);
    eprintln!(
        "llmkube-ext-proc: ready on {bound}: {} ({} instances of root_id {}, up to {} streams, {} callout clusters){}{metrics_line}",
        cfg.module_path.display(),
        pool.instances(),
        cfg.root_id,
        cfg.max_streams,
        cfg.clusters.len(),
        if cfg.endpoint_picker.is_some() { ", endpoint picker" } else { "" },
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
    for task in background {
        task.abort();
    }
    eprintln!("llmkube-ext-proc: stopped");
    Ok(())
}

/// Fires due ticks (`proxy_on_tick` on every instance's root context) and callout timeouts.
async fn timers(pool: Arc<Pool>) {
    loop {
        let p = pool.clone();
        let next = tokio::task::spawn_blocking(move || {
            p.run_due();
            p.next_due_nanos()
        })
        .await
        .ok()
        .flatten();
        let now = llmkube_wasm_runtime::Clock::monotonic_nanos(&llmkube_wasm_runtime::SystemClock);
        let wait = next.map_or(TICK_AT_MOST_EVERY, |due| {
            Duration::from_nanos(due.saturating_sub(now))
        });
        tokio::time::sleep(wait.clamp(Duration::from_millis(1), TICK_AT_MOST_EVERY)).await;
    }
}
