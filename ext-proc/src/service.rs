//! The gRPC side: one task per ext_proc stream (admitted by `admission`, its request bounded by
//! deadlines), timers, the callout transport, the health service and its watchdog, the metrics
//! endpoint, and a stop on SIGTERM that drains until a deadline.

use crate::admission::{Admission, Ticket};
use crate::callout::Transport;
use crate::config::{Config, Deadlines};
use crate::metrics;
use crate::phases::Exchange;
use crate::pool::Callout;
use crate::pool::Pool;
use crate::replies::Reply;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// The longest the timer task sleeps: it wakes at the earliest tick or callout deadline of any
/// instance, and at least this often (a tick period set meanwhile is picked up by then).
const TICK_AT_MOST_EVERY: Duration = Duration::from_millis(50);
/// A refused stream's first message is awaited this long before the refusal is sent anyway.
const REFUSAL_WAITS_AT_MOST: Duration = Duration::from_secs(1);
/// After the drain deadline, the streams still open get this long to send their last answers.
const CUT_GRACE: Duration = Duration::from_secs(1);
/// Headers the routing filter may add to a request (its decision headers, the model header and
/// the endpoint picked): a request is refused 431 unless these still fit the gateway's limit.
const FILTER_HEADER_ROOM: usize = 10;

struct Processor {
    pool: Arc<Pool>,
    admission: Arc<Admission>,
    deadlines: Deadlines,
    /// Turns true at the drain deadline: every stream still open is answered and ended.
    cut: watch::Receiver<bool>,
    max_body_bytes: usize,
    max_request_headers: usize,
    /// Endpoint-picker mode.
    picker: Option<Arc<crate::epp::Settings>>,
}

type Out = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = Out;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Out>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(4);
        match self.admission.admit() {
            Err(_) => {
                tokio::spawn(refuse(inbound, tx, Reply::Overloaded));
            }
            Ok(ticket) => {
                let stream = StreamTask {
                    pool: self.pool.clone(),
                    picker: self.picker.clone(),
                    max_body_bytes: self.max_body_bytes,
                    max_request_headers: self.max_request_headers,
                    deadlines: self.deadlines,
                    admission: self.admission.clone(),
                };
                tokio::spawn(stream.run(ticket, inbound, tx, self.cut.clone()));
            }
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Answers a stream the server has no room for with `reply` (after its first message, so the
/// gateway is waiting for exactly this answer), then ends it.
async fn refuse(
    mut inbound: Streaming<ProcessingRequest>,
    tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
    reply: Reply,
) {
    let _ = tokio::time::timeout(REFUSAL_WAITS_AT_MOST, inbound.next()).await;
    let _ = tx.send(Ok(reply.response())).await;
}

/// The filter's side of one stream, in either mode.
enum Handler<'p> {
    Exchange(Exchange<'p>),
    Picker(Box<crate::epp::Picker<'p>>),
}

impl Handler<'_> {
    async fn answers(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        match self {
            Handler::Exchange(x) => x.answers(msg).await,
            Handler::Picker(p) => p.handle(msg).await,
        }
    }

    fn answered(&self) -> bool {
        match self {
            Handler::Exchange(x) => x.answered(),
            Handler::Picker(p) => p.answered(),
        }
    }

    fn finish(self) {
        match self {
            Handler::Exchange(x) => x.finish(),
            Handler::Picker(p) => p.finish(),
        }
    }
}

struct StreamTask {
    pool: Arc<Pool>,
    picker: Option<Arc<crate::epp::Settings>>,
    max_body_bytes: usize,
    max_request_headers: usize,
    deadlines: Deadlines,
    admission: Arc<Admission>,
}

/// What a stream's wait for its next message ended with.
enum Next {
    Message(Box<Option<Result<ProcessingRequest, Status>>>),
    /// The server answers and ends the stream.
    Refuse(Reply),
    /// The drain deadline passed after the request was complete: the stream just ends.
    Cut,
}

impl StreamTask {
    /// Serves one stream until the gateway ends it, a deadline passes, it is evicted, or the
    /// drain deadline cuts it; then ends the filter's stream (access log, holds released).
    async fn run(
        self,
        ticket: Ticket,
        mut inbound: Streaming<ProcessingRequest>,
        tx: mpsc::Sender<Result<ProcessingResponse, Status>>,
        cut: watch::Receiver<bool>,
    ) {
        let cut = cut_off(cut);
        tokio::pin!(cut);
        let mut handler = match &self.picker {
            Some(settings) => Handler::Picker(Box::new(crate::epp::Picker::new(
                Exchange::new(&self.pool),
                settings,
                self.max_body_bytes,
            ))),
            None => Handler::Exchange(Exchange::new(&self.pool)),
        };
        let request_by = Instant::now() + self.deadlines.request;
        let mut request_bytes = RequestBytes::new(self.max_body_bytes);
        let mut request_ended = false;
        loop {
            let uploading = !request_ended && !handler.answered();
            let next = if uploading {
                let idle_by = Instant::now() + self.deadlines.idle;
                let (at, expiry) = if idle_by < request_by {
                    (idle_by, Reply::IdleTimeout)
                } else {
                    (request_by, Reply::RequestTimeout)
                };
                tokio::select! {
                    m = inbound.next() => Next::Message(Box::new(m)),
                    _ = tokio::time::sleep_until(at.into()) => Next::Refuse(expiry),
                    _ = ticket.evicted() => Next::Refuse(Reply::Evicted),
                    _ = &mut cut => Next::Refuse(Reply::ShuttingDown),
                }
            } else {
                tokio::select! {
                    m = inbound.next() => Next::Message(Box::new(m)),
                    _ = &mut cut => Next::Cut,
                }
            };
            let msg = match next {
                Next::Message(m) => match *m {
                    Some(Ok(msg)) => msg,
                    _ => break,
                },
                Next::Cut => break,
                Next::Refuse(reply) => {
                    self.count(reply);
                    let _ = tx.send(Ok(reply.response())).await;
                    break;
                }
            };
            if uploading {
                ticket.progressed();
                request_ended = ends_request(&msg);
                if let Some(n) = self.too_many_headers(&msg) {
                    eprintln!(
                        "llmkube-ext-proc: refused 431 too_many_headers: the request has {n} headers; with the {FILTER_HEADER_ROOM} the filter may add they would pass max_request_headers ({})",
                        self.max_request_headers
                    );
                    self.admission
                        .counters
                        .too_many_headers
                        .fetch_add(1, Ordering::Relaxed);
                    let _ = tx.send(Ok(Reply::TooManyHeaders.response())).await;
                    break;
                }
                if !ticket.charge_up_to(request_bytes.after(&msg)) {
                    let _ = tx.send(Ok(Reply::OverMemory.response())).await;
                    break;
                }
            }
            let mut gone = false;
            for answer in handler.answers(msg).await {
                gone = gone || tx.send(Ok(answer)).await.is_err();
            }
            if gone {
                break;
            }
            if uploading && (request_ended || handler.answered()) {
                ticket.request_complete();
            }
        }
        handler.finish();
    }

    /// The request's header count when the filter's headers would take it past the gateway's
    /// limit (Envoy refuses a header mutation past `max_request_headers_count`, 100 by default,
    /// and answers 500): refused before the filter runs, as a gateway's codec refuses a request
    /// over its own limit.
    fn too_many_headers(&self, msg: &ProcessingRequest) -> Option<usize> {
        use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Rq;
        let Some(Rq::RequestHeaders(h)) = &msg.request else {
            return None;
        };
        let n = h.headers.as_ref().map_or(0, |m| m.headers.len());
        (n + FILTER_HEADER_ROOM > self.max_request_headers).then_some(n)
    }

    fn count(&self, reply: Reply) {
        let c = &self.admission.counters;
        let counter = match reply {
            Reply::IdleTimeout => &c.idle_timeouts,
            Reply::RequestTimeout => &c.request_timeouts,
            // Counted where they happen (admission, drain).
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The gateway sent the last of the request (headers or body with `end_of_stream`, trailers),
/// or is already on the response.
fn ends_request(msg: &ProcessingRequest) -> bool {
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Rq;
    match &msg.request {
        Some(Rq::RequestHeaders(h)) => h.end_of_stream,
        Some(Rq::RequestBody(b)) => b.end_of_stream,
        Some(Rq::RequestTrailers(_))
        | Some(Rq::ResponseHeaders(_))
        | Some(Rq::ResponseBody(_))
        | Some(Rq::ResponseTrailers(_)) => true,
        None => false,
    }
}

async fn cut_off(mut cut: watch::Receiver<bool>) {
    let gone = cut.wait_for(|c| *c).await.is_err();
    if gone {
        // The server is gone without a cut: never fire.
        std::future::pending::<()>().await
    }
}

/// The request bytes a stream holds: what its `content-length` announces (so a body the budget
/// cannot hold is refused before it is uploaded), or what arrived, whichever is more; never
/// more than the filter's limit and a byte (the filter refuses the rest itself).
struct RequestBytes {
    announced: usize,
    received: usize,
    cap: usize,
}

impl RequestBytes {
    fn new(max_body_bytes: usize) -> Self {
        RequestBytes {
            announced: 0,
            received: 0,
            cap: max_body_bytes.saturating_add(1),
        }
    }

    fn after(&mut self, msg: &ProcessingRequest) -> usize {
        use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Rq;
        match &msg.request {
            Some(Rq::RequestHeaders(h)) => {
                let length = h.headers.as_ref().and_then(|m| {
                    m.headers
                        .iter()
                        .find(|h| h.key.eq_ignore_ascii_case("content-length"))
                        .and_then(|h| {
                            let v = if h.raw_value.is_empty() {
                                h.value.as_bytes()
                            } else {
                                &h.raw_value
                            };
                            std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok()
                        })
                });
                self.announced = length.unwrap_or(0);
            }
            Some(Rq::RequestBody(b)) => self.received = self.received.saturating_add(b.body.len()),
            _ => {}
        }
        self.announced.max(self.received).min(self.cap)
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
    let admission = Admission::new(
        cfg.max_streams,
        cfg.max_uploading_streams,
        cfg.memory_budget_bytes,
    );
    let transport = Arc::new(Transport::new(
        cfg.clusters.clone(),
        cfg.max_callout_response_bytes,
    ));
    let (stopping_tx, stopping) = watch::channel(false);
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Arc::new(crate::health::Health::new(reporter));
    // NOT_SERVING until the watchdog's first request went through.
    health.set(false).await;
    let mut background = vec![
        tokio::spawn(transport.clone().run(pool.clone(), calls)),
        tokio::spawn(timers(pool.clone())),
        tokio::spawn(health.clone().watchdog(pool.clone())),
        tokio::spawn(return_freed_memory(admission.clone())),
    ];
    let mut metrics_line = String::new();
    if let Some(l) = metrics_listener {
        metrics_line = format!(", metrics on http://{}/metrics", l.local_addr()?);
        let sources = Arc::new(metrics::Sources {
            pool: pool.clone(),
            transport,
            admission: admission.clone(),
            health: health.clone(),
        });
        background.push(tokio::spawn(metrics::serve(l, sources)));
    }
    if let Some(addr) = cfg.no_backend_listen {
        let l = crate::no_backend::bind(addr).await?;
        metrics_line += &format!(", no-backend answers on {}", l.local_addr()?);
        background.push(tokio::spawn(crate::no_backend::serve(
            l,
            cfg.max_body_bytes,
        )));
    }
    let (cut_tx, cut) = watch::channel(false);
    // A gRPC message carries at most the whole body the filter accepts, plus framing.
    let max_message = cfg.max_body_bytes.saturating_add(1 << 20);
    let service = ExternalProcessorServer::new(Processor {
        pool: pool.clone(),
        admission: admission.clone(),
        deadlines: cfg.deadlines,
        cut,
        max_body_bytes: cfg.max_body_bytes,
        max_request_headers: cfg.max_request_headers,
        picker: cfg.endpoint_picker.clone().map(Arc::new),
    })
    .max_decoding_message_size(max_message)
    .max_encoding_message_size(max_message);
    // The handler is installed before "ready" is printed: a SIGTERM that arrives right after
    // readiness must drain, not kill the process with the default disposition.
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    eprintln!(
        "llmkube-ext-proc: ready on {bound}: {} ({} instances of root_id {}, up to {} streams ({} uploading), memory budget {} bytes, {} callout clusters){}{metrics_line}",
        cfg.module_path.display(),
        pool.instances(),
        cfg.root_id,
        cfg.max_streams,
        cfg.max_uploading_streams,
        cfg.memory_budget_bytes,
        cfg.clusters.len(),
        if cfg.endpoint_picker.is_some() { ", endpoint picker" } else { "" },
    );
    let stop = stop_on_signal(term, stopping_tx.clone(), health.clone());
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(service)
        // Without TCP_NODELAY a small answer waits out the client's delayed ACK (~40 ms).
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop,
        );
    let drained = run_until_drained(tokio::spawn(server), stopping, cut_tx, cfg, &admission).await;
    for task in background {
        task.abort();
    }
    drained?;
    eprintln!("llmkube-ext-proc: stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C (never without a signal handler): reports NOT_SERVING and
/// tells the server to stop taking streams.
async fn stop_on_signal(
    term: Option<tokio::signal::unix::Signal>,
    stopping: watch::Sender<bool>,
    health: Arc<crate::health::Health>,
) {
    let Some(mut term) = term else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("llmkube-ext-proc: stopping: finishing the streams in flight");
    health.stopping().await;
    let _ = stopping.send(true);
}

/// Runs the server until it ends; once stopping, it gets the drain deadline for its streams in
/// flight, then the incomplete ones are answered 503 (`cut`) and it gets a last grace period.
async fn run_until_drained(
    mut server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    mut stopping: watch::Receiver<bool>,
    cut: watch::Sender<bool>,
    cfg: &Config,
    admission: &Admission,
) -> anyhow::Result<()> {
    tokio::select! {
        r = &mut server => r??,
        _ = stopping.wait_for(|s| *s) => {
            match tokio::time::timeout(cfg.drain_timeout, &mut server).await {
                Ok(r) => r??,
                Err(_) => {
                    eprintln!(
                        "llmkube-ext-proc: drain deadline ({} ms) passed with {} streams open: answering the incomplete ones 503 and ending all",
                        cfg.drain_timeout.as_millis(),
                        admission.in_flight(),
                    );
                    let _ = cut.send(true);
                    let _ = tokio::time::timeout(CUT_GRACE, &mut server).await;
                }
            }
        }
    }
    Ok(())
}

/// After a burst of large requests, returns the freed buffers to the system.
async fn return_freed_memory(admission: Arc<Admission>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if admission.trim_due() {
            let _ = tokio::task::spawn_blocking(crate::admission::return_freed_memory).await;
        }
    }
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
