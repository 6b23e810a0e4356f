//! The Prometheus endpoint (`--metrics HOST:PORT` or `metrics:` in the config): the module's own
//! metrics (`proxy_define_metric`) and the server's.
//!
//! In Envoy every worker's VM that defines a metric name gets the one process-wide stat, so a
//! counter is the sum of every worker's increments; here each instance keeps its own and the
//! endpoint sums them, which is the same number. A gauge moved only by increments (in-flight
//! counts) is summed too, which is exact; a gauge the filters set (budget ledgers' usage, set
//! from the shared ledger after each settle) is the value most recently set by any instance, as
//! Envoy's one stat would hold it, plus the increment-only instances' sum. Histograms become summaries
//! (`_sum`, `_count`). Names are the module's with every character Prometheus does not allow
//! turned into `_` (`llmkube.sensitive_violations` → `llmkube_sensitive_violations`).

use crate::admission::Admission;
use crate::callout::Transport;
use crate::health::Health;
use crate::pool::Pool;
use llmkube_wasm_runtime::{Metric, MetricKind};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes of a scrape request we read before answering.
const MAX_REQUEST_BYTES: usize = 8 * 1024;

/// What the endpoint reads the server's own numbers from.
pub struct Sources {
    pub pool: Arc<Pool>,
    pub transport: Arc<Transport>,
    pub admission: Arc<Admission>,
    pub health: Arc<Health>,
}

impl Sources {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let a = &self.admission;
        let c = &a.counters;
        let n = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
        let own: [(&str, &str, &str, u64); 16] = [
            (
                "llmkube_ext_proc_streams_in_flight",
                "gauge",
                "ext_proc streams being served",
                a.in_flight() as u64,
            ),
            (
                "llmkube_ext_proc_streams_uploading",
                "gauge",
                "streams whose request is not complete yet",
                a.uploading() as u64,
            ),
            (
                "llmkube_ext_proc_max_streams",
                "gauge",
                "stream slots (max_streams)",
                a.max_streams() as u64,
            ),
            (
                "llmkube_ext_proc_buffered_request_bytes",
                "gauge",
                "request bytes charged to the memory budget",
                a.buffered_bytes() as u64,
            ),
            (
                "llmkube_ext_proc_memory_budget_bytes",
                "gauge",
                "the memory budget for request bytes",
                a.memory_budget() as u64,
            ),
            (
                "llmkube_ext_proc_refused_streams_total",
                "counter",
                "streams answered 503 because every slot was taken",
                n(&c.refused_streams),
            ),
            (
                "llmkube_ext_proc_refused_memory_total",
                "counter",
                "streams answered 503 because the memory budget could not hold their request",
                n(&c.refused_memory),
            ),
            (
                "llmkube_ext_proc_evicted_total",
                "counter",
                "stalled uploads answered 408 to make room for a new stream",
                n(&c.evicted),
            ),
            (
                "llmkube_ext_proc_idle_timeouts_total",
                "counter",
                "requests answered 408 because their next part did not arrive in time",
                n(&c.idle_timeouts),
            ),
            (
                "llmkube_ext_proc_request_timeouts_total",
                "counter",
                "requests answered 408 because the whole request did not arrive in time",
                n(&c.request_timeouts),
            ),
            (
                "llmkube_ext_proc_too_many_headers_total",
                "counter",
                "requests answered 431: too many headers for the gateway to take the routing headers",
                n(&c.too_many_headers),
            ),
            (
                "llmkube_ext_proc_serving",
                "gauge",
                "1 while the watchdog's request succeeds and the server is not stopping",
                u64::from(self.health.serving()),
            ),
            (
                "llmkube_ext_proc_watchdog_failures_total",
                "counter",
                "watchdog requests that failed or overran their deadline",
                n(&self.health.failures),
            ),
            (
                "llmkube_ext_proc_instance_traps_total",
                "counter",
                "module traps (each replaced its instance)",
                self.pool.traps(),
            ),
            (
                "llmkube_ext_proc_callouts_total",
                "counter",
                "callouts sent to a cluster",
                self.transport.calls.load(Ordering::Relaxed),
            ),
            (
                "llmkube_ext_proc_callout_errors_total",
                "counter",
                "callouts that failed (connect, timeout, malformed or oversized answer)",
                self.transport.errors.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in own {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out.push_str(&render_module(&self.pool.metrics()));
        out
    }
}

/// The module's metrics of every instance, summed by name.
pub fn render_module(metrics: &[Metric]) -> String {
    #[derive(Default)]
    struct Sum {
        value: i64,
        count: u64,
        sum: u64,
    }
    let mut by: BTreeMap<(String, &'static str), Sum> = BTreeMap::new();
    // Per gauge name, the most recent set: (its order, its value).
    let mut last_set: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for m in metrics {
        if m.kind == MetricKind::Gauge && m.set_seq > 0 {
            let e = last_set.entry(prometheus_name(&m.name)).or_default();
            if m.set_seq > e.0 {
                *e = (m.set_seq, m.value);
            }
            by.entry((prometheus_name(&m.name), "gauge")).or_default();
            continue;
        }
        let kind = match m.kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "summary",
        };
        let s = by.entry((prometheus_name(&m.name), kind)).or_default();
        s.value = s.value.saturating_add(m.value);
        s.count = s.count.saturating_add(m.count);
        s.sum = s.sum.saturating_add(m.sum);
    }
    for (name, (_, value)) in last_set {
        if let Some(s) = by.get_mut(&(name, "gauge")) {
            s.value = s.value.saturating_add(value);
        }
    }
    let mut out = String::new();
    for ((name, kind), s) in by {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        if kind == "summary" {
            let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", s.sum, s.count);
        } else {
            let _ = writeln!(out, "{name} {}", s.value);
        }
    }
    out
}

fn prometheus_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// Serves `GET /metrics` (any other path: 404) until the process ends, one task per scrape.
pub async fn serve(listener: tokio::net::TcpListener, sources: Arc<Sources>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let sources = sources.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < MAX_REQUEST_BYTES {
                match conn.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let line = String::from_utf8_lossy(&buf);
            let target = line.split_whitespace().nth(1).unwrap_or("");
            let path = target.split('?').next().unwrap_or("");
            let (status, body) = if line.starts_with("GET ") && path == "/metrics" {
                // Reading the instances takes their locks: off the async workers.
                let body = tokio::task::spawn_blocking(move || sources.render())
                    .await
                    .unwrap_or_default();
                ("200 OK", body)
            } else {
                (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_string(),
                )
            };
            let head = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

/// Binds the endpoint's address (an error names the flag).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(name: &str, kind: MetricKind, value: i64, count: u64, sum: u64) -> Metric {
        Metric {
            name: name.into(),
            kind,
            value,
            samples: vec![],
            count,
            sum,
            set_seq: 0,
        }
    }

    #[test]
    fn a_gauge_the_filter_sets_is_the_latest_set_not_the_sum() {
        let set = |value, seq| Metric {
            set_seq: seq,
            ..metric(
                "llmkube.budget.all.tokens_used",
                MetricKind::Gauge,
                value,
                0,
                0,
            )
        };
        // Instance 0 set 30 first, instance 1 set 60 after it: the ledger holds 60.
        let text = render_module(&[set(30, 7), set(60, 9)]);
        assert_eq!(
            text,
            "# TYPE llmkube_budget_all_tokens_used gauge
llmkube_budget_all_tokens_used 60
"
        );
        let text = render_module(&[set(60, 9), set(30, 7)]);
        assert!(
            text.ends_with(
                "llmkube_budget_all_tokens_used 60
"
            ),
            "{text}"
        );
    }

    #[test]
    fn instances_are_summed_by_name_and_names_are_made_prometheus_safe() {
        let text = render_module(&[
            metric("llmkube.requests.rule.a", MetricKind::Counter, 2, 0, 0),
            metric("llmkube.requests.rule.a", MetricKind::Counter, 3, 0, 0),
            metric("in-flight", MetricKind::Gauge, -1, 0, 0),
            metric("in-flight", MetricKind::Gauge, 4, 0, 0),
            metric("body.bytes", MetricKind::Histogram, 0, 2, 30),
            metric("body.bytes", MetricKind::Histogram, 0, 1, 5),
            metric("9lives", MetricKind::Counter, 1, 0, 0),
        ]);
        assert_eq!(
            text,
            "# TYPE _9lives counter\n_9lives 1\n\
             # TYPE body_bytes summary\nbody_bytes_sum 35\nbody_bytes_count 3\n\
             # TYPE in_flight gauge\nin_flight 3\n\
             # TYPE llmkube_requests_rule_a counter\nllmkube_requests_rule_a 5\n"
        );
    }
}
