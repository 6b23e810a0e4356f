//! `llmkube-budgets`: the shared budget ledger for every gateway replica, state in Redis.
//!
//! The ledger semantics are the gateway core's (`router_core::budget`); Redis keeps them with one
//! atomic Lua script per ledger operation and its server `TIME` as the one clock. See README.md
//! for the wire format and docs/budgets.md for the semantics.

pub mod args;
pub mod conn;
pub mod server;
pub mod status;
pub mod store;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// How long in-flight requests may take to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

/// The command line: `--listen HOST:PORT --redis redis://HOST:PORT[/DB]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flags {
    pub listen: String,
    pub redis: String,
    /// Test-only (`--unsafe-check-only`): admission checks without holding, as charge-after
    /// gateways do; concurrent requests then overshoot. Never for production.
    pub check_only: bool,
    /// `--cluster`: `--redis` names one node of a Redis Cluster.
    pub cluster: bool,
    /// `--redis-timeout-ms`: per Redis call (default 1000).
    pub timeout_ms: u64,
    /// `--threads`: runtime threads (default 1: one thread runs the connections and the Redis
    /// client, so an answer wakes no other thread; run more processes, or raise this, for
    /// more than one core's worth of requests).
    pub threads: usize,
}

pub const USAGE: &str = "usage: llmkube-budgets --listen HOST:PORT --redis redis://HOST:PORT[/DB] [--cluster] [--redis-timeout-ms MS] [--threads N]
       llmkube-budgets status --service HOST:PORT --router NAMESPACE/NAME [--json] [--timeout-ms MS]";

impl Flags {
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Flags, String> {
        let mut listen = None;
        let mut redis = None;
        let mut check_only = false;
        let mut cluster = false;
        let mut timeout_ms = store::DEFAULT_TIMEOUT_MS;
        let mut threads = 1;
        args::each_flag(args, USAGE, |flag, value| {
            match flag {
                "--listen" => listen = Some(value()?),
                "--redis" => redis = Some(value()?),
                "--unsafe-check-only" => check_only = true,
                "--cluster" => cluster = true,
                "--redis-timeout-ms" => timeout_ms = args::millis(flag, &value()?, 10, 60_000)?,
                "--threads" => {
                    let v = value()?;
                    threads = match v.parse::<usize>() {
                        Ok(t @ 1..=256) => t,
                        _ => return Err(format!("--threads {v:?}: must be 1 to 256")),
                    }
                }
                _ => return Ok(false),
            }
            Ok(true)
        })?;
        let listen = listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?;
        let redis = redis.ok_or_else(|| format!("--redis is required\n{USAGE}"))?;
        if listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "--listen {listen:?}: not HOST:PORT with an IP address"
            ));
        }
        if !(redis.starts_with("redis://") || redis.starts_with("rediss://")) {
            return Err(format!(
                "--redis {:?}: must be redis://HOST:PORT[/DB]",
                redacted(&redis)
            ));
        }
        Ok(Flags {
            listen,
            redis,
            check_only,
            cluster,
            timeout_ms,
            threads,
        })
    }
}

/// `url` without its password (`redis://user:***@host:port/db`), for logs.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

/// Serves `service` on `listener` until `shutdown` resolves, then lets in-flight requests finish
/// (up to [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    service: Arc<server::Service>,
    shutdown: impl Future<Output = ()>,
) {
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let svc = service.clone();
                conns.spawn(async move {
                    let handler = service_fn(move |req| svc.clone().handle(req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), handler)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, async { while conns.join_next().await.is_some() {} }).await;
}
