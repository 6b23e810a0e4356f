//! `llmkube-ext-proc --listen HOST:PORT --config FILE`: an Envoy ext_proc v3 (gRPC) server that
//! runs the project's filter module on the wasm runtime, for gateways without a wasm runtime
//! and for any ext_proc client.

mod admission;
mod callout;
mod config;
mod epp;
mod grpc_callout;
mod health;
mod metrics;
mod no_backend;
mod phases;
mod pool;
mod replies;
mod service;

use llmkube_wasm_runtime::{SharedStore, StderrLogs, SystemClock, VmOptions, WasmModule};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

const USAGE: &str =
    "usage: llmkube-ext-proc --listen HOST:PORT --config FILE [--metrics HOST:PORT]";

struct Args {
    listen: SocketAddr,
    config: PathBuf,
    metrics: Option<SocketAddr>,
}

fn parse_args() -> Result<Args, String> {
    let mut listen = None;
    let mut config = None;
    let mut metrics = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--listen" => {
                let v = value()?;
                listen = Some(
                    v.parse::<SocketAddr>()
                        .map_err(|e| format!("--listen {v}: not HOST:PORT ({e})"))?,
                );
            }
            "--config" => config = Some(PathBuf::from(value()?)),
            "--metrics" => {
                let v = value()?;
                metrics = Some(
                    v.parse::<SocketAddr>()
                        .map_err(|e| format!("--metrics {v}: not HOST:PORT ({e})"))?,
                );
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(Args {
        listen: listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?,
        config: config.ok_or_else(|| format!("--config is required\n{USAGE}"))?,
        metrics,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("llmkube-ext-proc: {e}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llmkube-ext-proc: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let cfg = config::load(&args.config)?;
    let module = WasmModule::compile(&cfg.wasm)?;
    let limits = llmkube_wasm_runtime::Limits {
        // Room for the filter's own limit to answer 413 itself, and not a byte more per stream.
        max_buffered_body: cfg.max_body_bytes.saturating_add(64 * 1024),
        max_streams: cfg.max_streams,
        max_pending_calls: cfg.max_calls_in_flight,
        ..Default::default()
    };
    let opts = VmOptions {
        vm_id: cfg.vm_id.clone(),
        root_id: cfg.root_id.clone(),
        plugin_configuration: cfg.plugin_config.clone(),
        allow_on_headers_stop_iteration: true,
        // A call to a cluster the config does not name gets BadArgument, as Envoy answers.
        known_clusters: Some(cfg.clusters.keys().cloned().collect()),
        log_level: cfg.log_level,
        log_sink: Arc::new(StderrLogs {
            min: cfg.log_level,
            tag: cfg.root_id.clone(),
        }),
        clock: Arc::new(SystemClock),
        shared: SharedStore::new(),
        limits,
        ..Default::default()
    };
    let (calls, to_transport) = tokio::sync::mpsc::unbounded_channel();
    let pool = Arc::new(pool::Pool::new(module, opts, cfg.instances, Some(calls))?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let metrics = args.metrics.or(cfg.metrics);
    runtime.block_on(service::serve(
        args.listen,
        pool,
        to_transport,
        metrics,
        &cfg,
    ))
}
