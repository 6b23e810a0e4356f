//! The picking benchmark through real Envoys (`--concurrency 2`) and vLLM-like engine pods on
//! loopback: `cargo run --release -p picksim --bin pick_envoy [-- --pods N] [--only WORKLOAD]
//! [--rounds N] [--replicas-before] [--before-bounds JSON] [--no-filter-cost]` (default 8 pods;
//! about seven minutes
//! for 4), or on draws of the workload family:
//! `pick_envoy --draws K [--skip S] [--requests N] [--slow F]` (held-out seeds S..S+K, the
//! first N requests of each, 400 by default, on a clock F times slower; see [`family`]). `--rounds`
//! repeats each workload with fresh pods, each round starting one arm later, so arms that run
//! at different moments of a noisy machine can be compared round by round.
//!
//! For the shared-prompt, multi-turn, agent-loop and unique workloads of the simulation
//! (`picksim::workload`), each arm gets its own fresh pods:
//! - round-robin: Envoy's own, over a STATIC cluster;
//! - least-loaded: the filter, LoadAware without prefix affinity;
//! - picker: the filter, LoadAware with prefix and session affinity;
//! - oracle: the client picks the pod from the pods' true cache contents (read from the
//!   engines) and its own exact count of what it has in flight on each, and sends the request
//!   through the same gateway to a one-pod backend for that pod;
//! - picker, 3 replicas: three independent gateways (three Envoy processes sharing nothing)
//!   with the same config and pods, the requests dealt to them in turn;
//! - with `--replicas-before`, "3 repl., before": the same with known prefixes never shed
//!   (`{"known_balance_percent":0}`), on pods of its own; with `--before-bounds JSON`, with
//!   those plugin `pick.bounds` instead, so a change and its previous behaviour run in the
//!   same minutes.
//!
//! Requests are replayed open-loop at their arrival times; time to response is measured at the
//! client. Then the filter's cost on a 64 KiB prompt: the same requests to fast plain mocks,
//! picked vs round-robin, on one keep-alive connection.
use e2e::engine::{render_prompt, EngineConfig, ANSWER_HEADER};
use e2e::gateway::Gateway;
use e2e::http;
use e2e::MockUpstream;
use picksim::family::{evaluate_instance, held_out_seeds, table, Draw, Instance, Measured};
use picksim::workload::{generate, Shape, SimRequest};
use picksim::Report;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const SEED: u64 = 20_261_201;
const REQUESTS: usize = 300;
const RATE: f64 = 25.0;
const REPLICAS: usize = 3;
const ENGINE: EngineConfig = EngineConfig {
    cache_blocks: 384,
    block_bytes: 256,
    concurrency: 4,
    prefill_per_block: Duration::from_millis(2),
    decode_per_token: Duration::from_millis(1),
    reply_tokens: 16,
};

/// Whether the engines cache the answers the requests name (`picksim::Setup::cache_answers`).
fn cache_answers() -> bool {
    std::env::var_os("PICK_NO_ANSWER_CACHE").is_none()
}

/// How a backend balances its pods.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    RoundRobin,
    LeastLoaded,
    Picker,
}

fn manifests(backends: &[(String, Kind, usize)]) -> String {
    let mut out = String::new();
    let mut list = String::new();
    let mut rules = String::new();
    for (n, kind, replicas) in backends {
        out += &format!(
            "apiVersion: inference.llmkube.dev/v1alpha1\nkind: InferenceService\n\
             metadata: {{name: svc-{n}, namespace: llm}}\n\
             spec: {{modelRef: m, runtime: vllm, replicas: {replicas}, endpoint: {{port: 8000, type: ClusterIP}}}}\n---\n"
        );
        let balancing = match kind {
            Kind::RoundRobin => "",
            Kind::LeastLoaded => "\n      balancing: {mode: LoadAware}",
            Kind::Picker => "\n      balancing: {mode: LoadAware, prefixAffinity: {}, sessionAffinity: {headers: [x-session-id]}}",
        };
        list += &format!(
            "    - name: {n}\n      tier: local\n      inferenceServiceRef: {{name: svc-{n}}}\n      resolution: endpoint{balancing}\n"
        );
        rules +=
            &format!("    - {{name: {n}, match: {{models: [{n}]}}, route: {{backends: [{n}]}}}}\n");
    }
    out + &format!(
        "apiVersion: inference.llmkube.dev/v1alpha1\nkind: ModelRouter\nmetadata: {{name: bench, namespace: llm}}\n\
         spec:\n  backends:\n{list}  rules:\n{rules}"
    )
}

fn engine_pods(prefix: &str, n: usize) -> Vec<MockUpstream> {
    pods_of(prefix, n, &ENGINE)
}

fn pods_of(prefix: &str, n: usize, engine: &EngineConfig) -> Vec<MockUpstream> {
    (0..n)
        .map(|i| MockUpstream::start_engine(&format!("{prefix}{i}"), engine.clone()))
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

/// Where request `i` goes: the gateway, the model, and (for the oracle) the pod it holds.
type Route<'a> = dyn Fn(usize, &SimRequest) -> (String, String, Option<Hold>) + Sync + 'a;

/// An oracle request's pod and predicted work (ns), until it ends.
type Hold = (usize, u64);

/// Replays `reqs` open-loop; `done` hears of each request's end. (Latencies in ms sorted,
/// errors.)
fn replay(
    reqs: &[SimRequest],
    route: &Route<'_>,
    done: &(dyn Fn(Option<Hold>) + Sync),
) -> (Vec<f64>, usize) {
    let start = Instant::now();
    let results: Vec<Option<f64>> = std::thread::scope(|s| {
        let handles: Vec<_> = reqs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                s.spawn(move || {
                    let at = Duration::from_nanos(r.at_ns);
                    if let Some(wait) = at.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                    let (url, model, held) = route(i, r);
                    let mut req = http::post(&format!("{url}/v1/chat/completions"))
                        .body(with_model(&r.body, &model))
                        .header("content-type", "application/json")
                        .timeout(Duration::from_secs(60));
                    if let Some(sid) = &r.session {
                        req = req.header("x-session-id", sid);
                    }
                    if let Some(answer) = r.answer.as_ref().filter(|_| cache_answers()) {
                        req = req.header(ANSWER_HEADER, &answer.to_string());
                    }
                    let t = Instant::now();
                    let resp = req.try_send().ok();
                    let lat = t.elapsed().as_secs_f64() * 1e3;
                    done(held);
                    (resp?.status == 200).then_some(lat)
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

/// What the engines saw: hit rate (cached / all prompt blocks) and imbalance (max / mean
/// computed blocks per pod).
fn engine_view(pods: &[MockUpstream]) -> (f64, f64) {
    let stats: Vec<_> = pods
        .iter()
        .map(|m| m.engine_stats().unwrap_or_default())
        .collect();
    let cached: u64 = stats.iter().map(|s| s.cached_blocks).sum();
    let computed: Vec<u64> = stats.iter().map(|s| s.computed_blocks).collect();
    let total: u64 = computed.iter().sum();
    let mean = total as f64 / computed.len().max(1) as f64;
    let max = *computed.iter().max().unwrap_or(&0) as f64;
    (
        cached as f64 / (cached + total).max(1) as f64,
        if mean > 0.0 { max / mean } else { 0.0 },
    )
}

#[derive(Clone, Copy, Default)]
struct Row {
    hit: f64,
    mean: f64,
    p99: f64,
    imbalance: f64,
}

fn report(label: &str, pods: &[MockUpstream], lat: &[f64], errors: usize) -> Row {
    let (hit, imbalance) = engine_view(pods);
    let row = Row {
        hit,
        mean: lat.iter().sum::<f64>() / lat.len().max(1) as f64,
        p99: if lat.is_empty() { 0.0 } else { pct(lat, 0.99) },
        imbalance,
    };
    println!(
        "  {label:<20} hit {:>5.1}%  response mean {:>7.1} ms  p99 {:>7.1} ms  imbalance {:>4.2}  errors {errors}",
        row.hit * 100.0,
        row.mean,
        row.p99,
        row.imbalance,
    );
    row
}

/// The oracle's view of its pods: the engines' true caches, and its own in-flight count and
/// predicted work per pod (every request to these pods is its own).
struct Oracle<'a> {
    pods: &'a [MockUpstream],
    /// Per pod: requests in flight, their predicted prefill + decode (ns), and the prompt
    /// blocks it predicted the pod computes for them, over the whole run.
    flight: Mutex<Vec<Flight>>,
}

/// The oracle's tally of one pod.
#[derive(Clone, Copy, Default)]
struct Flight {
    requests: usize,
    work_ns: u64,
    computed_blocks: u64,
}

impl Oracle<'_> {
    /// The pod with the earliest predicted first token: a free slot now, or the in-flight
    /// work spread over the slots, then this prompt's uncached blocks. Ties go to the pod with
    /// the fewest in flight, then the least prefill computed so far, as in the simulation's
    /// oracle (by pod order instead, an idle moment sent every new conversation to the first
    /// pod: multi-turn piled on one pod, imbalance 4.00 of 4 and a hit under round-robin's).
    fn choose(&self, body: &[u8]) -> Hold {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let rendered = render_prompt("/v1/chat/completions", &v).into_bytes();
        let block = ENGINE.block_bytes as u64;
        let blocks = (rendered.len() as u64).div_ceil(block);
        let prefill = ENGINE.prefill_per_block.as_nanos() as u64;
        let decode = ENGINE.decode_per_token.as_nanos() as u64 * ENGINE.reply_tokens as u64;
        let mut flight = self.flight.lock().unwrap_or_else(|e| e.into_inner());
        let mut best = (u64::MAX, usize::MAX, u64::MAX, usize::MAX, 0u64, 0u64);
        for (p, pod) in self.pods.iter().enumerate() {
            let hit = pod.engine_cached_prefix(&rendered).unwrap_or(0).min(blocks);
            let f = flight[p];
            let wait = if f.requests < ENGINE.concurrency {
                0
            } else {
                f.work_ns / ENGINE.concurrency as u64
            };
            let key = (
                wait + (blocks - hit) * prefill,
                f.requests,
                f.computed_blocks,
                p,
                (blocks - hit) * prefill + decode,
                blocks - hit,
            );
            if key < best {
                best = key;
            }
        }
        let (p, work, computed) = (best.3, best.4, best.5);
        flight[p].requests += 1;
        flight[p].work_ns += work;
        flight[p].computed_blocks += computed;
        (p, work)
    }

    /// The family's reference ([`picksim::Policy::PrefixOracle`]): the pod whose engine holds
    /// the longest prefix of the prompt among the pods with at most
    /// [`picksim::PREFIX_ORACLE_SLACK`] more requests in flight (its own exact count) than the
    /// least loaded; ties to the less loaded, then the first.
    fn choose_prefix(&self, body: &[u8]) -> Hold {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let rendered = render_prompt("/v1/chat/completions", &v).into_bytes();
        let mut flight = self.flight.lock().unwrap_or_else(|e| e.into_inner());
        let least = flight.iter().map(|f| f.requests).min().unwrap_or(0);
        let best = (0..self.pods.len())
            .filter(|&p| flight[p].requests <= least + picksim::PREFIX_ORACLE_SLACK)
            .max_by_key(|&p| {
                let held = self.pods[p].engine_cached_prefix(&rendered).unwrap_or(0);
                (
                    held,
                    std::cmp::Reverse(flight[p].requests),
                    std::cmp::Reverse(p),
                )
            })
            .unwrap_or(0);
        flight[best].requests += 1;
        (best, 0)
    }

    fn done(&self, (p, work): Hold) {
        let mut flight = self.flight.lock().unwrap_or_else(|e| e.into_inner());
        flight[p].requests = flight[p].requests.saturating_sub(1);
        flight[p].work_ns = flight[p].work_ns.saturating_sub(work);
    }
}

/// The five arms, in the order a round runs them before rotation.
const ARMS: [&str; 5] = [
    "round-robin",
    "least-loaded",
    "picker",
    "oracle",
    "picker, 3 replicas",
];

/// With `--replicas-before` or `--before-bounds`: three more replicas with other plugin bounds
/// (by default known prefixes never shed, `known_balance_percent` 0), side by side.
const ARM_BEFORE: &str = "3 repl., before";

/// The machine's load average, for the record (benchmarks here share the machine).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn workloads(n: usize, only: Option<&str>, rounds: usize, before: Option<Value>) {
    let arms: Vec<&str> = ARMS
        .iter()
        .copied()
        .chain(before.is_some().then_some(ARM_BEFORE))
        .collect();
    for shape in [
        Shape::SharedPrompt,
        Shape::MultiTurn,
        Shape::Agent,
        Shape::Unique,
    ] {
        if only.is_some_and(|o| o != shape.name()) {
            continue;
        }
        let reqs = generate(shape, REQUESTS, RATE, SEED);
        let one = picksim::ceiling(&ENGINE, &reqs, cache_answers());
        let ceiling =
            one.cached_blocks as f64 / (one.cached_blocks + one.computed_blocks).max(1) as f64;
        for round in 0..rounds {
            println!(
                "{} ({} requests at {RATE} req/s, {n} pods per arm, Envoy --concurrency 2){}, load average {}",
                shape.name(),
                reqs.len(),
                if rounds > 1 { format!(", round {round}") } else { String::new() },
                loadavg(),
            );
            // Each round starts one arm later, so no arm always runs first or last.
            let order: Vec<&str> = (0..arms.len())
                .map(|k| arms[(k + round) % arms.len()])
                .collect();
            if let Some(b) = &before {
                println!("  {ARM_BEFORE:<20} pick.bounds {b}");
            }
            let rows = round_of(n, &reqs, &order, before.as_ref());
            println!(
                "  {:<20} hit {:>5.1}%  (one engine that never evicts: no placement's hit is higher)",
                "ceiling",
                ceiling * 100.0
            );
            targets(shape, &rows, ceiling);
        }
    }
}

/// One round: fresh pods for every arm, the arms run one after another in `order`.
fn round_of<'a>(
    n: usize,
    reqs: &[SimRequest],
    order: &[&'a str],
    before_bounds: Option<&Value>,
) -> std::collections::HashMap<&'a str, Row> {
    let arms = [
        ("round-robin", "rr", Kind::RoundRobin),
        ("least-loaded", "ll", Kind::LeastLoaded),
        ("picker", "pk", Kind::Picker),
    ];
    let pods: Vec<Vec<MockUpstream>> = arms.iter().map(|a| engine_pods(a.1, n)).collect();
    let oracle_pods = engine_pods("or", n);
    let mut backends: Vec<(String, Kind, usize)> =
        arms.iter().map(|a| (a.1.to_string(), a.2, n)).collect();
    backends.extend((0..n).map(|p| (format!("or{p}"), Kind::RoundRobin, 1)));
    let mut b = Gateway::builder(&manifests(&backends)).concurrency(2);
    for (a, p) in arms.iter().zip(&pods) {
        b = b.endpoints(&format!("svc-{}", a.1), &addrs(p));
    }
    for (p, m) in oracle_pods.iter().enumerate() {
        b = b.endpoints(&format!("svc-or{p}"), &[m.addr()]);
    }
    let gw = b.start();
    let url = gw.url();
    // Independent replicas: nothing shared but their pods.
    let cfg = manifests(&[("pk".to_string(), Kind::Picker, n)]);
    let replicas = |prefix: &str, bounds: Option<Value>| {
        let pods = engine_pods(prefix, n);
        let gws: Vec<Gateway> = (0..REPLICAS)
            .map(|_| {
                let mut b = Gateway::builder(&cfg)
                    .endpoints("svc-pk", &addrs(&pods))
                    .concurrency(2);
                if let Some(bounds) = &bounds {
                    b = b.pick_bounds(bounds.clone());
                }
                b.start()
            })
            .collect();
        (pods, gws)
    };
    let current = replicas("pr", None);
    let before = before_bounds
        .filter(|_| order.contains(&ARM_BEFORE))
        .map(|b| replicas("po", Some(b.clone())));

    let mut rows = std::collections::HashMap::new();
    for &arm in order {
        let row = if let Some(((label, model, _), p)) =
            arms.iter().zip(&pods).find(|(a, _)| a.0 == arm)
        {
            let route = |_: usize, _: &SimRequest| (url.clone(), model.to_string(), None);
            let (lat, errors) = replay(reqs, &route, &|_| {});
            let row = report(label, p, &lat, errors);
            if *model == "pk" {
                // Picks made while the filter read itself alone (new conversations placed by
                // the work to come; see docs/endpoint-picking.md).
                let alone = gw.envoy.stat("wasmcustom.llmkube.pick.alone.backend.pk");
                println!("  {:<20} picks while alone: {}", "", alone.unwrap_or(0));
            }
            row
        } else if arm == "oracle" {
            let oracle = Oracle {
                pods: &oracle_pods,
                flight: Mutex::new(vec![Flight::default(); n]),
            };
            let route = |_: usize, r: &SimRequest| {
                let hold = oracle.choose(&r.body);
                (url.clone(), format!("or{}", hold.0), Some(hold))
            };
            let (lat, errors) = replay(reqs, &route, &|h| {
                if let Some(h) = h {
                    oracle.done(h);
                }
            });
            report("oracle", &oracle_pods, &lat, errors)
        } else {
            let (rep_pods, gws) = match (arm, &before) {
                (ARM_BEFORE, Some(b)) => b,
                _ => &current,
            };
            let urls: Vec<String> = gws.iter().map(Gateway::url).collect();
            let route =
                |i: usize, _: &SimRequest| (urls[i % urls.len()].clone(), "pk".into(), None);
            let (lat, errors) = replay(reqs, &route, &|_| {});
            let row = report(arm, rep_pods, &lat, errors);
            // Picks the replicas made while each read itself alone (0 when they notice each
            // other; lone placement and moves apply only then).
            let alone: Vec<u64> = gws
                .iter()
                .map(|g| {
                    g.envoy
                        .stat("wasmcustom.llmkube.pick.alone.backend.pk")
                        .unwrap_or(0)
                })
                .collect();
            println!("  {:<20} picks while alone: {alone:?}", "");
            row
        };
        rows.insert(arm, row);
    }
    rows
}

fn targets(shape: Shape, rows: &std::collections::HashMap<&str, Row>, ceiling: f64) {
    let (pk, rr, ll, or, r3) = (
        rows["picker"],
        rows["round-robin"],
        rows["least-loaded"],
        rows["oracle"],
        rows["picker, 3 replicas"],
    );
    let check = |ok: bool| if ok { "met" } else { "MISSED" };
    if shape == Shape::Unique {
        println!(
            "  targets: response mean within 5% of least-loaded [{}] ({:.2}), p99 [{}] ({:.2})",
            check(pk.mean <= 1.05 * ll.mean),
            pk.mean / ll.mean.max(1e-9),
            check(pk.p99 <= 1.05 * ll.p99),
            pk.p99 / ll.p99.max(1e-9),
        );
        return;
    }
    println!(
        "  targets: hit >= 95% oracle [{}] ({:.2}), >= 2x round-robin [{}] ({:.2}x), p99 <= 1.2x oracle [{}] ({:.2}), imbalance <= 1.3 [{}] ({:.2}), {REPLICAS} replicas >= 90% of 1 [{}] ({:.2})",
        check(pk.hit >= 0.95 * or.hit),
        pk.hit / or.hit.max(1e-9),
        // The issue asks 2x round-robin on the shared-prompt and multi-turn workloads only.
        match shape {
            Shape::Agent => "not a target for agent loops",
            _ => check(pk.hit >= 2.0 * rr.hit),
        },
        pk.hit / rr.hit.max(1e-9),
        check(pk.p99 <= 1.2 * or.p99),
        pk.p99 / or.p99.max(1e-9),
        check(pk.imbalance <= 1.3),
        pk.imbalance,
        check(r3.hit >= 0.9 * pk.hit),
        r3.hit / pk.hit.max(1e-9),
    );
    // The oracle is greedy (the earliest first token for each request alone): where every
    // conversation shares a head it piles them on the pod holding it and its cache churns, so
    // the ceiling says how far from the best any placement could do the picker really is.
    println!(
        "  of the ceiling: picker {:.2}, oracle {:.2}, {REPLICAS} replicas {:.2}",
        pk.hit / ceiling.max(1e-9),
        or.hit / ceiling.max(1e-9),
        r3.hit / ceiling.max(1e-9),
    );
}

/// What an arm measured, in the simulation's terms (hit rate and imbalance from the engines,
/// p99 of the time to the full response at the client).
fn as_report(pods: &[MockUpstream], lat: &[f64], errors: usize, label: &str) -> Report {
    let row = report(label, pods, lat, errors);
    Report {
        requests: lat.len() + errors,
        hit_rate: row.hit,
        e2e_p99_ms: row.p99,
        imbalance: row.imbalance,
        unplaced: errors,
        ..Report::default()
    }
}

/// Draws of the workload family (`picksim::family`) through real Envoys: for each seed, the
/// first `requests` requests of the draw, on the draw's pods (each arm its own, with the
/// draw's KV cache per pod), replayed open-loop at their arrival times through round-robin
/// (Envoy's own), the picker (one gateway), the draw's replicas (independent gateways sharing
/// nothing, requests dealt in turn) and the prefix oracle, the four arms at once; then the same
/// cut draw in the simulation. Prints each draw and the worst draw per target, through Envoy and simulated.
fn family(seeds: &[u64], requests: usize, slow: u32) {
    let (mut envoy, mut sim) = (Vec::new(), Vec::new());
    for &seed in seeds {
        let draw = Draw::new(seed);
        let mut inst = Instance::new(&draw);
        inst.reqs.truncate(requests);
        // The same draw on a slower clock: arrivals and the engines' prefill and decode
        // stretched alike keep every pod's utilisation and cache, and give a shared machine's
        // Envoys time to spare.
        for r in &mut inst.reqs {
            r.at_ns *= u64::from(slow);
        }
        let e = &mut inst.setup.engine;
        e.prefill_per_block *= slow;
        e.decode_per_token *= slow;
        let span = inst.reqs.last().map_or(0.0, |r| r.at_ns as f64 / 1e9);
        let engine = inst.setup.engine.clone();
        let n = draw.pods;
        println!(
            "draw {seed:x}: {} ({} requests over {span:.1} s, {} KV blocks of {} B per pod), load average {}",
            draw.label(),
            inst.reqs.len(),
            engine.cache_blocks,
            engine.block_bytes,
            loadavg()
        );
        let (rr_pods, pk_pods, or_pods, rep_pods) = (
            pods_of("rr", n, &engine),
            pods_of("pk", n, &engine),
            pods_of("or", n, &engine),
            pods_of("pr", n, &engine),
        );
        // One gateway per arm (the replicas' arm has its own several), so no arm queues
        // behind another's requests in a shared Envoy.
        let one = |model: &str, kind: Kind, pods: &[MockUpstream]| {
            Gateway::builder(&manifests(&[(model.to_string(), kind, n)]))
                .endpoints(&format!("svc-{model}"), &addrs(pods))
                .concurrency(2)
                .start()
        };
        let (rr_gw, pk_gw) = (
            one("rr", Kind::RoundRobin, &rr_pods),
            one("pk", Kind::Picker, &pk_pods),
        );
        let backends: Vec<_> = (0..n)
            .map(|p| (format!("or{p}"), Kind::RoundRobin, 1))
            .collect();
        let mut b = Gateway::builder(&manifests(&backends)).concurrency(2);
        for (p, m) in or_pods.iter().enumerate() {
            b = b.endpoints(&format!("svc-or{p}"), &[m.addr()]);
        }
        let or_gw = b.start();
        let gws: Vec<Gateway> = (0..draw.replicas)
            .map(|_| one("pk", Kind::Picker, &rep_pods))
            .collect();
        let urls: Vec<String> = gws.iter().map(Gateway::url).collect();
        let url = or_gw.url();

        let to = |gw: &Gateway, model: &'static str| {
            let url = gw.url();
            move |_: usize, _: &SimRequest| (url.clone(), model.to_string(), None)
        };
        let (to_rr, to_pk) = (to(&rr_gw, "rr"), to(&pk_gw, "pk"));
        let to_replicas =
            |i: usize, _: &SimRequest| (urls[i % urls.len()].clone(), "pk".into(), None);
        let oracle = Oracle {
            pods: &or_pods,
            flight: Mutex::new(vec![Flight::default(); n]),
        };
        let to_oracle = |_: usize, r: &SimRequest| {
            let hold = oracle.choose_prefix(&r.body);
            (url.clone(), format!("or{}", hold.0), Some(hold))
        };
        let oracle_done = |h: Option<Hold>| {
            if let Some(h) = h {
                oracle.done(h);
            }
        };
        // The four arms replay at the same moments, each on its own pods, so a loaded machine
        // slows them alike.
        let reqs = &inst.reqs;
        let [rr, pk, pr, or] = std::thread::scope(|s| {
            let arms = [
                s.spawn(|| replay(reqs, &to_rr, &|_| {})),
                s.spawn(|| replay(reqs, &to_pk, &|_| {})),
                s.spawn(|| replay(reqs, &to_replicas, &|_| {})),
                s.spawn(|| replay(reqs, &to_oracle, &oracle_done)),
            ];
            arms.map(|a| a.join().unwrap_or_default())
        });
        let rr = as_report(&rr_pods, &rr.0, rr.1, "round-robin");
        let pk = as_report(&pk_pods, &pk.0, pk.1, "picker");
        let label = format!("picker, {} replicas", draw.replicas);
        let pr = as_report(&rep_pods, &pr.0, pr.1, &label);
        let or = as_report(&or_pods, &or.0, or.1, "prefix oracle");
        let m = evaluate_instance(&inst, &|_| {});
        println!(
            "  simulated: hit rr / picker / replicas / oracle {:.3} / {:.3} / {:.3} / {:.3}, imbalance {:.2}, p99 picker / oracle {:.0} / {:.0} ms",
            m.round_robin.hit_rate,
            m.picker.hit_rate,
            m.replicas.hit_rate,
            m.oracle.hit_rate,
            m.picker.imbalance,
            m.picker.e2e_p99_ms,
            m.oracle.e2e_p99_ms,
        );
        envoy.push(Measured::judged(&draw, rr, pk, pr, or));
        sim.push(m);
    }
    println!("\n## Through Envoy\n\n{}", table(&envoy));
    println!("\n## The same cut draws, simulated\n\n{}", table(&sim));
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
    let gw = Gateway::builder(&manifests(&[
        ("pkplain".into(), Kind::Picker, 4),
        ("rrplain".into(), Kind::RoundRobin, 4),
    ]))
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
    let args: Vec<String> = std::env::args().collect();
    let num = |flag: &str| -> Option<usize> {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1)?.parse().ok())
    };
    let pods = args
        .iter()
        .position(|a| a == "--pods")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(8);
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(1);
    let bounds = args
        .iter()
        .position(|a| a == "--before-bounds")
        .and_then(|i| args.get(i + 1))
        .map(|j| serde_json::from_str(j).expect("--before-bounds: JSON"));
    let before = match bounds {
        Some(b) => Some(b),
        None if args.iter().any(|a| a == "--replicas-before") => {
            Some(serde_json::json!({"known_balance_percent": 0}))
        }
        None => None,
    };
    if let Some(k) = num("--draws") {
        let skip = num("--skip").unwrap_or(0);
        let seeds = held_out_seeds(skip + k).split_off(skip);
        let slow = num("--slow").unwrap_or(1).clamp(1, 100) as u32;
        family(&seeds, num("--requests").unwrap_or(400), slow);
        return;
    }
    workloads(pods, only, rounds, before);
    if !args.iter().any(|a| a == "--no-filter-cost") {
        filter_cost();
    }
}
