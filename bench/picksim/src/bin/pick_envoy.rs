//! The picking benchmark through a real Envoy (`--concurrency 2`) and vLLM-like engine pods on
//! loopback: `cargo run --release -p picksim --bin pick_envoy` (about two minutes).
//!
//! For the shared-prompt and multi-turn workloads of the simulation (`picksim::workload`), each
//! policy gets four fresh pods behind one backend of one gateway: round-robin (Envoy's own, over
//! a STATIC cluster), least-loaded (the filter, LoadAware without prefix affinity) and the
//! filter's prefix picker (LoadAware with prefix and session affinity). Requests are replayed
//! open-loop at their arrival times; time to response is measured at the client. Then the
//! filter's cost on a 64 KiB prompt: the same requests to fast plain mocks, picked vs
//! round-robin, on one keep-alive connection.
use e2e::engine::EngineConfig;
use e2e::gateway::Gateway;
use e2e::http;
use e2e::MockUpstream;
use picksim::workload::{generate, Shape, SimRequest};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SEED: u64 = 20_261_201;
const REQUESTS: usize = 300;
const POLICIES: [(&str, &str); 3] = [
    ("round-robin", "rr"),
    ("least-loaded", "ll"),
    ("picker", "pk"),
];

fn manifests(names: &[&str]) -> String {
    let mut out = String::new();
    let mut backends = String::new();
    let mut rules = String::new();
    for n in names {
        out += &format!(
            "apiVersion: inference.llmkube.dev/v1alpha1\nkind: InferenceService\n\
             metadata: {{name: svc-{n}, namespace: llm}}\n\
             spec: {{modelRef: m, runtime: vllm, replicas: 4, endpoint: {{port: 8000, type: ClusterIP}}}}\n---\n"
        );
        let balancing = match *n {
            "rr" | "rrplain" => "",
            "ll" => "\n      balancing: {mode: LoadAware}",
            _ => "\n      balancing: {mode: LoadAware, prefixAffinity: {}, sessionAffinity: {headers: [x-session-id]}}",
        };
        backends += &format!(
            "    - name: {n}\n      tier: local\n      inferenceServiceRef: {{name: svc-{n}}}\n      resolution: endpoint{balancing}\n"
        );
        rules +=
            &format!("    - {{name: {n}, match: {{models: [{n}]}}, route: {{backends: [{n}]}}}}\n");
    }
    out + &format!(
        "apiVersion: inference.llmkube.dev/v1alpha1\nkind: ModelRouter\nmetadata: {{name: bench, namespace: llm}}\n\
         spec:\n  backends:\n{backends}  rules:\n{rules}"
    )
}

fn engine_pods(prefix: &str) -> Vec<MockUpstream> {
    (0..4)
        .map(|i| {
            MockUpstream::start_engine(
                &format!("{prefix}{i}"),
                EngineConfig {
                    cache_blocks: 384,
                    block_bytes: 256,
                    concurrency: 4,
                    prefill_per_block: Duration::from_millis(2),
                    decode_per_token: Duration::from_millis(1),
                    reply_tokens: 16,
                },
            )
        })
        .collect()
}

fn addrs(p: &[MockUpstream]) -> Vec<SocketAddr> {
    p.iter().map(MockUpstream::addr).collect()
}

fn with_model(body: &[u8], model: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    v["model"] = Value::String(model.into());
    serde_json::to_vec(&v).unwrap_or_default()
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Replays `reqs` open-loop against `model`; (latencies in ms sorted, errors).
fn replay(gw: &Gateway, model: &str, reqs: &[SimRequest]) -> (Vec<f64>, usize) {
    let url = format!("{}/v1/chat/completions", gw.url());
    let start = Instant::now();
    let results: Vec<Option<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = reqs
            .iter()
            .map(|r| {
                let url = url.clone();
                s.spawn(move || {
                    let at = Duration::from_nanos(r.at_ns);
                    if let Some(wait) = at.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    let mut req = http::post(&url)
                        .body(with_model(&r.body, model))
                        .header("content-type", "application/json")
                        .timeout(Duration::from_secs(60));
                    if let Some(sid) = &r.session {
                        req = req.header("x-session-id", sid);
                    }
                    let t = Instant::now();
                    let resp = req.try_send().ok()?;
                    (resp.status == 200).then(|| t.elapsed().as_secs_f64() * 1e3)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    let errors = results.iter().filter(|r| r.is_none()).count();
    let mut lat: Vec<f64> = results.into_iter().flatten().collect();
    lat.sort_by(f64::total_cmp);
    (lat, errors)
}

fn workloads() {
    for shape in [Shape::SharedPrompt, Shape::MultiTurn] {
        let reqs = generate(shape, REQUESTS, 25.0, SEED);
        let names: Vec<&str> = POLICIES.iter().map(|p| p.1).collect();
        let pods: Vec<Vec<MockUpstream>> = names.iter().map(|n| engine_pods(n)).collect();
        let mut b = Gateway::builder(&manifests(&names)).concurrency(2);
        for (n, p) in names.iter().zip(&pods) {
            b = b.endpoints(&format!("svc-{n}"), &addrs(p));
        }
        let gw = b.start();
        println!(
            "{} ({} requests, 4 pods per policy, Envoy --concurrency 2)",
            shape.name(),
            reqs.len()
        );
        for ((label, model), p) in POLICIES.iter().zip(&pods) {
            let (lat, errors) = replay(&gw, model, &reqs);
            let stats: Vec<_> = p
                .iter()
                .map(|m| m.engine_stats().unwrap_or_default())
                .collect();
            let cached: u64 = stats.iter().map(|s| s.cached_blocks).sum();
            let computed: Vec<u64> = stats.iter().map(|s| s.computed_blocks).collect();
            let total: u64 = computed.iter().sum();
            let mean = total as f64 / computed.len() as f64;
            let max = *computed.iter().max().unwrap_or(&0) as f64;
            let mean_lat = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
            println!(
                "  {label:<13} hit {:>5.1}%  response mean {:>7.1} ms  p99 {:>7.1} ms  imbalance {:>4.2}  errors {errors}",
                cached as f64 * 100.0 / (cached + total).max(1) as f64,
                mean_lat,
                if lat.is_empty() { 0.0 } else { pct(&lat, 0.99) },
                if mean > 0.0 { max / mean } else { 0.0 },
            );
        }
    }
}

/// p50 of `n` sequential requests on one keep-alive connection.
fn p50(gw: &Gateway, model: &str, prompt: &str, n: usize) -> f64 {
    let body =
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": prompt}]});
    let req = http::post(&format!("{}/v1/chat/completions", gw.url())).json(&body);
    let mut c = http::Conn::open(&gw.url()).expect("connect");
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = c.send(&req).expect("response");
        assert_eq!(r.status, 200, "{}", r.text());
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    pct(&lat, 0.5)
}

fn filter_cost() {
    let plain = |p: &str| -> Vec<MockUpstream> {
        (0..4)
            .map(|i| MockUpstream::start(&format!("{p}{i}")))
            .collect()
    };
    let (pk, rr) = (plain("pkplain"), plain("rrplain"));
    let gw = Gateway::builder(&manifests(&["pkplain", "rrplain"]))
        .endpoints("svc-pkplain", &addrs(&pk))
        .endpoints("svc-rrplain", &addrs(&rr))
        .concurrency(2)
        .start();
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(64 * 1024 / 45);
    for round in 0..3 {
        let (a, b) = (
            p50(&gw, "rrplain", &prompt, 200),
            p50(&gw, "pkplain", &prompt, 200),
        );
        println!(
            "64 KiB prompt, round {round}: p50 round-robin {a:.0} µs, picked {b:.0} µs, difference {:.0} µs",
            b - a
        );
    }
}

fn main() {
    workloads();
    filter_cost();
}
