//! The standard gRPC health service (`grpc.health.v1.Health`), driven by a watchdog that proves
//! the request path works: every [`WATCHDOG_EVERY`] it runs a trivial request through every
//! module instance ([`Pool::probe`]) on the blocking pool. The server is `SERVING` while the last
//! probe finished in time and succeeded, `NOT_SERVING` otherwise and from SIGTERM on.
//!
//! A process that is stopped or whose async workers are stuck does not answer the health call
//! at all, which a probe counts as a failure too; an instance stuck in a callback holds its lock,
//! so the watchdog's request does not finish and the status turns `NOT_SERVING`.
//!
//! The status is set for the whole server (service name `""`, what a Kubernetes `grpc` probe
//! asks by default) and for `envoy.service.ext_proc.v3.ExternalProcessor`.

use crate::pool::Pool;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// How often the watchdog runs its request.
pub const WATCHDOG_EVERY: Duration = Duration::from_secs(2);
/// How long one probe of every instance may take before the server is `NOT_SERVING`.
pub const WATCHDOG_DEADLINE: Duration = Duration::from_secs(5);

const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

pub struct Health {
    reporter: HealthReporter,
    serving: AtomicBool,
    stopping: AtomicBool,
    pub failures: AtomicU64,
}

impl Health {
    /// The status holder of the service `tonic_health::server::health_reporter` made.
    pub fn new(reporter: HealthReporter) -> Health {
        Health {
            reporter,
            serving: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            failures: AtomicU64::new(0),
        }
    }

    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Publishes the status (never SERVING once stopping).
    pub async fn set(&self, serving: bool) {
        let serving = serving && !self.stopping.load(Ordering::Relaxed);
        self.serving.store(serving, Ordering::Relaxed);
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in ["", EXT_PROC_SERVICE] {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// SIGTERM: `NOT_SERVING` from now on, so readiness takes the pod out while it drains.
    pub async fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.set(false).await;
    }

    /// Runs until the server stops. A probe that overran its deadline is awaited (not
    /// duplicated) before the next one starts; meanwhile the status stays `NOT_SERVING`.
    pub async fn watchdog(self: Arc<Self>, pool: Arc<Pool>) {
        let mut probe: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        let mut last_error = String::new();
        loop {
            let p = pool.clone();
            let mut handle =
                probe.unwrap_or_else(|| tokio::task::spawn_blocking(move || p.probe()));
            let outcome = match tokio::time::timeout(WATCHDOG_DEADLINE, &mut handle).await {
                Ok(Ok(r)) => {
                    probe = None;
                    r
                }
                Ok(Err(e)) => {
                    probe = None;
                    Err(format!("the watchdog's probe failed: {e}"))
                }
                Err(_) => {
                    probe = Some(handle);
                    Err(format!(
                        "the watchdog's request did not finish within {} ms",
                        WATCHDOG_DEADLINE.as_millis()
                    ))
                }
            };
            match &outcome {
                Ok(()) => last_error.clear(),
                Err(e) => {
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    if *e != last_error {
                        eprintln!("llmkube-ext-proc: not serving: {e}");
                        last_error = e.clone();
                    }
                }
            }
            self.set(outcome.is_ok()).await;
            tokio::time::sleep(WATCHDOG_EVERY).await;
        }
    }
}
