//! A family of workloads, each drawn from one seed: the figures the picker is judged on are the
//! worst over many draws it was not tuned on, not the mean over a few hand-made shapes.
//!
//! A draw fixes the fleet (2–16 pods, each pod's KV cache 1/8 to 4 times its share of the hot
//! prefix set), the tenants (5–200, each with a system prompt of 1–32 KiB, some with a tools
//! list before it), their popularity (uniform to Zipf 1.2, where one tenant can be hotter than a
//! pod can serve), the traffic (one-shot questions, multi-turn chats with or without a session
//! header, unique prompts, bursts of one new prompt), the load (30–70 % of the fleet's prefill
//! capacity at a half hit rate) and the number of gateway replicas sharing nothing (2–4).
//!
//! [`evaluate`] runs round-robin, the picker (one replica and the draw's replicas) and the
//! prefix oracle ([`Policy::PrefixOracle`]) on the draw and checks the targets on it
//! ([`Targets`]).

use crate::workload::{prose, prose_in, Rng, SimRequest};
use crate::{like_envoy, simulate, Details, Policy, Report, Setup};
use e2e::engine::render_prompt;
use serde_json::{json, Value};

/// Seeds the picker's constants may be tuned on.
pub fn tuning_seeds(k: usize) -> Vec<u64> {
    (0..k as u64).map(|i| 0x7u64 << 40 | i).collect()
}

/// Seeds the reports are made on, never tuned on.
pub fn held_out_seeds(k: usize) -> Vec<u64> {
    (0..k as u64).map(|i| 0x4e1du64 << 32 | i).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One-shot questions under the tenants' system prompts.
    Tenants,
    /// Multi-turn chats under the tenants' system prompts, a document in the first turn.
    Chats,
    /// Questions, chats and unique prompts mixed.
    Mixed,
    /// Nothing shared: the guardrail.
    Unique,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Tenants => "tenants",
            Kind::Chats => "chats",
            Kind::Mixed => "mixed",
            Kind::Unique => "unique",
        }
    }
}

/// One member of the family.
#[derive(Clone, Debug, PartialEq)]
pub struct Draw {
    pub seed: u64,
    pub kind: Kind,
    pub pods: usize,
    /// Each pod's KV cache over its share of the hot prefix set (every tenant's tools and
    /// system prompt as rendered, over the pods).
    pub cache_ratio: f64,
    pub tenants: usize,
    /// System prompt sizes, uniform in this range (KiB).
    pub head_kib: (u64, u64),
    /// Share of tenants with a tools list before their system prompt.
    pub tools_share: f64,
    /// Popularity exponent: 0 uniform, 1.2 a few tenants ask most.
    pub zipf: f64,
    /// Share of chats that send a session header.
    pub session_share: f64,
    /// Some streams are bursts of 8–24 copies of one new prompt.
    pub bursts: bool,
    pub replicas: usize,
    /// Offered prefill and decode over the fleet's capacity, at a half hit rate.
    pub utilization: f64,
    pub requests: usize,
}

impl Draw {
    pub fn new(seed: u64) -> Draw {
        let mut r = Rng::new(seed ^ 0xFA31_17D2_A3B0_0001);
        let kind = match r.range(0, 6) {
            0 => Kind::Unique,
            1 | 2 => Kind::Tenants,
            3 => Kind::Chats,
            _ => Kind::Mixed,
        };
        let pods = r.range(2, 17) as usize;
        let cache_ratio = 2f64.powf(-3.0 + 5.0 * r.unit());
        let tenants = (5.0 * 40f64.powf(r.unit())).round() as usize;
        let lo = r.range(1, 25);
        let hi = r.range(lo + 1, 33);
        let tools_share = [0.0, 0.5, 1.0][r.range(0, 3) as usize];
        let zipf = match r.range(0, 4) {
            0 => 0.0,
            1 => 1.2,
            _ => 1.2 * r.unit(),
        };
        let session_share = [0.0, 0.5, 1.0][r.range(0, 3) as usize];
        let bursts = kind != Kind::Unique && r.range(0, 2) == 1;
        let replicas = r.range(2, 5) as usize;
        let utilization = 0.3 + 0.4 * r.unit();
        Draw {
            seed,
            kind,
            pods,
            cache_ratio,
            tenants,
            head_kib: (lo, hi),
            tools_share,
            zipf,
            session_share,
            bursts,
            replicas,
            utilization,
            requests: if kind == Kind::Unique { 600 } else { 1200 },
        }
    }

    /// A short description for the tables.
    pub fn label(&self) -> String {
        format!(
            "{} {}p c{:.2} t{} {}-{}K tools{:.1} z{:.1} s{:.1}{} r{} u{:.2}",
            self.kind.name(),
            self.pods,
            self.cache_ratio,
            self.tenants,
            self.head_kib.0,
            self.head_kib.1,
            self.tools_share,
            self.zipf,
            self.session_share,
            if self.bursts { " burst" } else { "" },
            self.replicas,
            self.utilization
        )
    }
}

/// A draw made concrete: the requests and the fleet that serves them.
pub struct Instance {
    pub draw: Draw,
    pub setup: Setup,
    pub reqs: Vec<SimRequest>,
    /// Rendered bytes of the hot prefix set.
    pub hot_bytes: usize,
}

fn body(messages: &[Value], tools: Option<&Value>) -> Vec<u8> {
    let mut v = json!({"model": "sim", "messages": messages, "max_tokens": 16});
    if let Some(t) = tools {
        v["tools"] = t.clone();
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

fn rendered_len(b: &[u8]) -> usize {
    let v: Value = serde_json::from_slice(b).unwrap_or_default();
    render_prompt("/v1/chat/completions", &v).len()
}

struct Tenant {
    system: String,
    tools: Option<Value>,
}

/// One request of a stream, before its arrival time is known.
struct Step {
    body: Vec<u8>,
    session: Option<String>,
    answer: Option<Value>,
}

enum Stream {
    One(Step),
    /// A chat's turns, a think time apart.
    Chat(Vec<Step>),
    /// Copies of one prompt, arriving within a few milliseconds.
    Burst(Step, usize),
}

impl Stream {
    fn len(&self) -> usize {
        match self {
            Stream::One(_) => 1,
            Stream::Chat(s) => s.len(),
            Stream::Burst(_, k) => *k,
        }
    }
}

/// Zipf(s) over `n` ranks as a cumulative table.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let w: Vec<f64> = (0..n).map(|k| 1.0 / ((k + 1) as f64).powf(s)).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    w.iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect()
}

fn sample(cdf: &[f64], r: &mut Rng) -> usize {
    let u = r.unit();
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
}

impl Instance {
    pub fn new(draw: &Draw) -> Instance {
        let d = draw.clone();
        let mut r = Rng::new(d.seed ^ 0x005E_ED0F_F00D);
        let tenants: Vec<Tenant> = (0..d.tenants)
            .map(|_| {
                let kib = r.range(d.head_kib.0, d.head_kib.1 + 1) as usize;
                let system = prose(&mut r, kib * 1024);
                let tools = (r.unit() < d.tools_share).then(|| {
                    let n = r.range(2, 9);
                    Value::Array(
                        (0..n)
                            .map(|i| {
                                json!({"type": "function", "function": {
                                "name": format!("tool_{i}"), "description": prose_in(&mut r, 200, 800),
                                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}})
                            })
                            .collect(),
                    )
                });
                Tenant { system, tools }
            })
            .collect();
        let hot_bytes: usize = tenants
            .iter()
            .map(|t| {
                rendered_len(&body(
                    &[json!({"role": "system", "content": t.system})],
                    t.tools.as_ref(),
                ))
            })
            .sum();
        let cdf = zipf_cdf(d.tenants, d.zipf);
        let question = |r: &mut Rng, t: &Tenant| Step {
            body: body(
                &[
                    json!({"role": "system", "content": t.system}),
                    json!({"role": "user", "content": prose_in(r, 100, 600)}),
                ],
                t.tools.as_ref(),
            ),
            session: None,
            answer: None,
        };
        let mut streams: Vec<Stream> = Vec::new();
        let mut total = 0;
        let mut chat_id = 0;
        while total < d.requests {
            let u = r.unit();
            let burst = d.bursts && r.unit() < 0.03;
            let s = if burst {
                let msgs = [json!({"role": "user", "content": prose_in(&mut r, 2048, 8192)})];
                Stream::Burst(
                    Step {
                        body: body(&msgs, None),
                        session: None,
                        answer: None,
                    },
                    r.range(8, 25) as usize,
                )
            } else {
                let (questions, chats) = match d.kind {
                    Kind::Tenants => (1.0, 0.0),
                    Kind::Chats => (0.0, 1.0),
                    Kind::Mixed => (0.6, 0.3),
                    Kind::Unique => (0.0, 0.0),
                };
                if u < questions {
                    let k = sample(&cdf, &mut r);
                    Stream::One(question(&mut r, &tenants[k]))
                } else if u < questions + chats {
                    let t = &tenants[sample(&cdf, &mut r)];
                    chat_id += 1;
                    let session = (r.unit() < d.session_share).then(|| format!("chat-{chat_id}"));
                    let mut msgs = vec![json!({"role": "system", "content": t.system})];
                    let doc = prose_in(&mut r, 2048, 8192);
                    let turns = r.range(3, 9);
                    let mut steps = Vec::new();
                    for k in 0..turns {
                        let q = prose_in(&mut r, 100, 500);
                        let content = if k == 0 { format!("{doc}\n\n{q}") } else { q };
                        msgs.push(json!({"role": "user", "content": content}));
                        let answer =
                            json!({"role": "assistant", "content": prose_in(&mut r, 200, 800)});
                        steps.push(Step {
                            body: body(&msgs, t.tools.as_ref()),
                            session: session.clone(),
                            answer: Some(answer.clone()),
                        });
                        msgs.push(answer);
                    }
                    Stream::Chat(steps)
                } else {
                    let msgs = [json!({"role": "user", "content": prose_in(&mut r, 1024, 4096)})];
                    Stream::One(Step {
                        body: body(&msgs, None),
                        session: None,
                        answer: None,
                    })
                }
            };
            total += s.len();
            streams.push(s);
        }

        // The rate that offers `utilization` of the fleet's slots at a half hit rate.
        let mut setup = like_envoy();
        setup.pods = d.pods;
        setup.replicas = 1;
        setup.addr_salt = d.seed;
        let block = setup.engine.block_bytes.max(256);
        let prefill = setup.engine.prefill_per_block.as_nanos() as f64;
        let decode =
            setup.engine.decode_per_token.as_nanos() as f64 * setup.engine.reply_tokens as f64;
        let mut service = 0.0;
        let mut largest = 0;
        for s in &streams {
            let (step, copies) = match s {
                Stream::One(st) => (vec![st], 1.0),
                Stream::Chat(v) => (v.iter().collect(), 1.0),
                Stream::Burst(st, k) => (vec![st], *k as f64),
            };
            for st in step {
                let len = rendered_len(&st.body);
                largest = largest.max(len);
                service += copies * ((len / block) as f64 * 0.5 * prefill + decode);
            }
        }
        service /= total as f64;
        let slots = (d.pods * setup.engine.concurrency.max(1)) as f64;
        let rate = d.utilization * slots / service * 1e9;
        let stream_gap = 1e9 / rate * total as f64 / streams.len() as f64;
        let pod_share = hot_bytes as f64 / d.pods as f64;
        setup.engine.cache_blocks =
            ((d.cache_ratio * pod_share / block as f64) as usize).max(2 * largest / block + 2);

        let mut reqs = Vec::with_capacity(total);
        let mut t = 0u64;
        for s in streams {
            t += r.exp(stream_gap);
            match s {
                Stream::One(st) => reqs.push(SimRequest {
                    at_ns: t,
                    body: st.body,
                    session: st.session,
                    answer: st.answer,
                }),
                Stream::Chat(steps) => {
                    let mut at = t;
                    for st in steps {
                        reqs.push(SimRequest {
                            at_ns: at,
                            body: st.body,
                            session: st.session,
                            answer: st.answer,
                        });
                        at += r.range(500_000_000, 3_000_000_000);
                    }
                }
                Stream::Burst(st, k) => {
                    let mut at = t;
                    for _ in 0..k {
                        reqs.push(SimRequest {
                            at_ns: at,
                            body: st.body.clone(),
                            session: None,
                            answer: None,
                        });
                        at += r.range(0, 5_000_000);
                    }
                }
            }
        }
        reqs.sort_by_key(|q| q.at_ns);
        reqs.truncate(d.requests);
        Instance {
            draw: d,
            setup,
            reqs,
            hot_bytes,
        }
    }
}

/// The targets, each `None` where it does not apply to the draw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Targets {
    /// Picker's hit rate over the oracle's (>= 0.95); where the oracle hits anything.
    pub hit_vs_oracle: Option<f64>,
    /// Picker's hit rate over round-robin's (>= 2), where the oracle's is at least 2x.
    pub hit_vs_round_robin: Option<f64>,
    /// Max over mean computed prefill per pod (<= 1.3).
    pub imbalance: Option<f64>,
    /// Picker's p99 full-response time over the oracle's (<= 1.2).
    pub p99_vs_oracle: Option<f64>,
    /// On unique prompts, picker's p99 over round-robin's (<= 1.1).
    pub unique_p99_vs_round_robin: Option<f64>,
    /// The draw's replicas' hit rate over one replica's (>= 0.9).
    pub replicas_vs_one: Option<f64>,
}

/// Each target's name, bound, and whether a value must stay at or above it.
pub const TARGETS: [(&str, f64, bool); 6] = [
    ("hit / oracle", 0.95, true),
    ("hit / round-robin (where oracle >= 2x)", 2.0, true),
    ("prefill imbalance", 1.3, false),
    ("p99 full response / oracle", 1.2, false),
    ("unique p99 / round-robin", 1.1, false),
    ("replicas / one", 0.9, true),
];

impl Targets {
    pub fn values(&self) -> [Option<f64>; 6] {
        [
            self.hit_vs_oracle,
            self.hit_vs_round_robin,
            self.imbalance,
            self.p99_vs_oracle,
            self.unique_p99_vs_round_robin,
            self.replicas_vs_one,
        ]
    }
    pub fn met(&self) -> [bool; 6] {
        let mut m = [true; 6];
        for (k, v) in self.values().iter().enumerate() {
            if let Some(v) = v {
                let (_, bound, at_least) = TARGETS[k];
                m[k] = if at_least { *v >= bound } else { *v <= bound };
            }
        }
        m
    }
}

/// What one draw measured.
#[derive(Clone, Debug)]
pub struct Measured {
    pub draw: Draw,
    pub round_robin: Report,
    pub picker: Report,
    pub replicas: Report,
    pub oracle: Report,
    pub targets: Targets,
    /// With [`evaluate_with_references`]: what balancing alone and the balanced oracle reach.
    pub references: Option<References>,
    /// With [`evaluate_knowledge`]: the arms that split the picker's gap to the balanced
    /// oracle into knowledge of the caches and placement.
    pub knowledge: Option<Knowledge>,
    /// With [`evaluate_details`]: the balanced rule with the core's details.
    pub details: Option<DetailArms>,
}

/// The 2×2 of cache knowledge (the picker's tables or the engines' true caches) and placement
/// rule (the picker's or the balanced oracle's), on the same requests, the picker itself being
/// the fourth corner; and the balanced rule on all the picker knows (its tables and its own
/// prefill counters).
#[derive(Clone, Debug)]
pub struct Knowledge {
    /// The picker's rule on the true caches ([`Policy::PickerOnCaches`]).
    pub picker_on_caches: Report,
    /// The balanced oracle's rule on the picker's tables ([`Policy::BalancedOnTables`]).
    pub balanced_on_tables: Report,
    /// The same on the picker's prefill counters too ([`Policy::BalancedOnPickerKnowledge`]).
    pub balanced_on_picker_knowledge: Report,
    /// The balanced oracle's rule on the true caches ([`Policy::BalancedPrefixOracle`]).
    pub balanced_oracle: Report,
}

/// The core's details added one at a time to the balanced rule on the picker's knowledge
/// ([`Policy::BalancedOnPickerKnowledge`]), each judged on the targets as the picker is (one
/// replica, and the draw's replicas for replicas ÷ one): which detail loses what the rule
/// alone keeps.
#[derive(Clone, Debug)]
pub struct DetailArms {
    /// Per arm of [`DETAIL_ARMS`]: its targets, and its one-replica report.
    pub arms: Vec<(Targets, Report)>,
}

/// The arms of [`evaluate_details`]: a name and the details added.
pub const DETAIL_ARMS: [(&str, Details); 7] = [
    (
        "balanced rule on the picker's knowledge",
        Details {
            sessions: false,
            sessions_yield: false,
            home: false,
            rendezvous_ties: false,
        },
    ),
    (
        "+ sessions kept on their pod",
        Details {
            sessions: true,
            sessions_yield: false,
            home: false,
            rendezvous_ties: false,
        },
    ),
    (
        "+ a new prompt at its rendezvous home",
        Details {
            sessions: false,
            sessions_yield: false,
            home: true,
            rendezvous_ties: false,
        },
    ),
    (
        "+ ties by rendezvous",
        Details {
            sessions: false,
            sessions_yield: false,
            home: false,
            rendezvous_ties: true,
        },
    ),
    (
        "+ all three",
        Details {
            sessions: true,
            sessions_yield: false,
            home: true,
            rendezvous_ties: true,
        },
    ),
    (
        "+ sessions that yield over the bound",
        Details {
            sessions: false,
            sessions_yield: true,
            home: false,
            rendezvous_ties: false,
        },
    ),
    (
        "+ home, rendezvous ties, sessions that yield",
        Details {
            sessions: false,
            sessions_yield: true,
            home: true,
            rendezvous_ties: true,
        },
    ),
];

/// The arms that say whether a draw's targets can be met together: a placement that only
/// balances (least-loaded: the core's picker without prefix affinity) and the prefix oracle
/// held to the balance target ([`Policy::BalancedPrefixOracle`]).
#[derive(Clone, Debug)]
pub struct References {
    pub least_loaded: Report,
    pub balanced_oracle: Report,
}

impl Measured {
    /// The four arms' reports of one draw, judged against the targets.
    pub fn judged(draw: &Draw, rr: Report, pk: Report, pr: Report, or: Report) -> Measured {
        let targets = judge(draw.kind, &rr, &pk, &pr, &or);
        Measured {
            draw: draw.clone(),
            round_robin: rr,
            picker: pk,
            replicas: pr,
            oracle: or,
            targets,
            references: None,
            knowledge: None,
            details: None,
        }
    }
}

/// Runs a draw with `setup` changed by `tweak` (the picker's configuration).
pub fn evaluate(draw: &Draw, tweak: &dyn Fn(&mut Setup)) -> Measured {
    evaluate_instance(&Instance::new(draw), tweak)
}

/// Runs a concrete draw (possibly cut short: `pick_envoy` replays the first requests of one).
pub fn evaluate_instance(inst: &Instance, tweak: &dyn Fn(&mut Setup)) -> Measured {
    let draw = &inst.draw;
    let mut s = inst.setup.clone();
    tweak(&mut s);
    let rr = simulate(Policy::RoundRobin, &s, &inst.reqs);
    let pk = simulate(Policy::Picker, &s, &inst.reqs);
    let many = Setup {
        replicas: draw.replicas,
        ..s.clone()
    };
    let pr = simulate(Policy::Picker, &many, &inst.reqs);
    let or = simulate(Policy::PrefixOracle, &s, &inst.reqs);
    Measured::judged(draw, rr, pk, pr, or)
}

/// [`evaluate`], and the reference arms ([`References`]) on the same requests.
pub fn evaluate_with_references(draw: &Draw, tweak: &dyn Fn(&mut Setup)) -> Measured {
    let inst = Instance::new(draw);
    let mut m = evaluate_instance(&inst, tweak);
    let mut s = inst.setup.clone();
    tweak(&mut s);
    m.references = Some(References {
        least_loaded: simulate(Policy::LeastLoaded, &s, &inst.reqs),
        balanced_oracle: simulate(Policy::BalancedPrefixOracle, &s, &inst.reqs),
    });
    m
}

/// [`evaluate`], and the knowledge arms ([`Knowledge`]) on the same requests (one replica).
pub fn evaluate_knowledge(draw: &Draw, tweak: &dyn Fn(&mut Setup)) -> Measured {
    let inst = Instance::new(draw);
    let mut m = evaluate_instance(&inst, tweak);
    let mut s = inst.setup.clone();
    tweak(&mut s);
    m.knowledge = Some(Knowledge {
        picker_on_caches: simulate(Policy::PickerOnCaches, &s, &inst.reqs),
        balanced_on_tables: simulate(Policy::BalancedOnTables, &s, &inst.reqs),
        balanced_on_picker_knowledge: simulate(Policy::BalancedOnPickerKnowledge, &s, &inst.reqs),
        balanced_oracle: simulate(Policy::BalancedPrefixOracle, &s, &inst.reqs),
    });
    m
}

/// [`evaluate`], and the balanced rule on the picker's knowledge with each of the core's
/// details ([`DETAIL_ARMS`]), one replica and the draw's replicas.
pub fn evaluate_details(draw: &Draw, tweak: &dyn Fn(&mut Setup)) -> Measured {
    let inst = Instance::new(draw);
    let mut m = evaluate_instance(&inst, tweak);
    let mut s = inst.setup.clone();
    tweak(&mut s);
    let arms = DETAIL_ARMS
        .iter()
        .map(|&(_, details)| {
            let one = Setup {
                details,
                ..s.clone()
            };
            let many = Setup {
                replicas: draw.replicas,
                ..one.clone()
            };
            let a1 = simulate(Policy::BalancedOnPickerKnowledge, &one, &inst.reqs);
            let ar = simulate(Policy::BalancedOnPickerKnowledge, &many, &inst.reqs);
            (judge(draw.kind, &m.round_robin, &a1, &ar, &m.oracle), a1)
        })
        .collect();
    m.details = Some(DetailArms { arms });
    m
}

/// The targets of a draw of `kind` from what round-robin, the picker (one replica and the
/// draw's replicas) and the prefix oracle measured.
pub fn judge(kind: Kind, rr: &Report, pk: &Report, pr: &Report, or: &Report) -> Targets {
    let unique = kind == Kind::Unique;
    let hits = !unique && or.hit_rate > 0.02;
    Targets {
        hit_vs_oracle: hits.then(|| pk.hit_rate / or.hit_rate),
        hit_vs_round_robin: (hits && or.hit_rate >= 2.0 * rr.hit_rate)
            .then(|| pk.hit_rate / rr.hit_rate.max(1e-9)),
        imbalance: Some(pk.imbalance),
        p99_vs_oracle: (!unique).then(|| pk.e2e_p99_ms / or.e2e_p99_ms.max(1e-9)),
        unique_p99_vs_round_robin: unique.then(|| pk.e2e_p99_ms / rr.e2e_p99_ms.max(1e-9)),
        replicas_vs_one: (pk.hit_rate > 0.02).then(|| pr.hit_rate / pk.hit_rate),
    }
}

/// A Markdown table of the draws and the worst draw of each target.
pub fn table(rows: &[Measured]) -> String {
    let mut out = String::new();
    out.push_str(
        "| seed | draw | hit rr / picker / replicas / oracle | hit÷oracle | hit÷rr | imbalance | p99÷oracle | unique p99÷rr | replicas÷one |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let cell = |v: Option<f64>, ok: bool| match v {
        None => "–".to_string(),
        Some(v) if ok => format!("{v:.3}"),
        Some(v) => format!("**{v:.3}**"),
    };
    for m in rows {
        let v = m.targets.values();
        let ok = m.targets.met();
        out.push_str(&format!(
            "| {:x} | {} | {:.3} / {:.3} / {:.3} / {:.3} | {} | {} | {} | {} | {} | {} |\n",
            m.draw.seed,
            m.draw.label(),
            m.round_robin.hit_rate,
            m.picker.hit_rate,
            m.replicas.hit_rate,
            m.oracle.hit_rate,
            cell(v[0], ok[0]),
            cell(v[1], ok[1]),
            cell(v[2], ok[2]),
            cell(v[3], ok[3]),
            cell(v[4], ok[4]),
            cell(v[5], ok[5]),
        ));
    }
    out.push_str("\nWorst draw per target:\n\n| target | bound | worst | draw | draws met |\n|---|---|---|---|---|\n");
    for (k, (name, bound, at_least)) in TARGETS.iter().enumerate() {
        let applicable: Vec<(&Measured, f64)> = rows
            .iter()
            .filter_map(|m| m.targets.values()[k].map(|v| (m, v)))
            .collect();
        let met = applicable
            .iter()
            .filter(|(m, _)| m.targets.met()[k])
            .count();
        let worst = applicable.iter().min_by(|a, b| {
            let (x, y) = if *at_least { (a.1, b.1) } else { (b.1, a.1) };
            x.total_cmp(&y)
        });
        match worst {
            Some((m, v)) => out.push_str(&format!(
                "| {name} | {} {bound} | {v:.3} | {:x} ({}) | {met} / {} |\n",
                if *at_least { "≥" } else { "≤" },
                m.draw.seed,
                m.draw.label(),
                applicable.len()
            )),
            None => out.push_str(&format!("| {name} | {bound} | – | – | 0 / 0 |\n")),
        }
    }
    out
}

/// Where the picker's hits went against the oracle's, per draw with a hit target: what the
/// best-holding pod held at each pick (the most a pick could reuse), what the chosen pod held,
/// and the bytes lost put down to a stale table, a table that did not know, or a pick that went
/// elsewhere knowingly ([`crate::Misses`]), all as shares of the prompt bytes; and the mean
/// number of pods holding at least 4 KiB of a request that some pod held that much of.
pub fn misses_table(rows: &[Measured]) -> String {
    let mut out = String::from(
        "| seed | draw | hit÷oracle | held best: oracle / picker | chosen held: oracle / picker | lost: stale / unknown / elsewhere | copies: oracle / picker | imbalance: oracle / picker |\n|---|---|---|---|---|---|---|---|\n",
    );
    for m in rows {
        let v = m.targets.hit_vs_oracle.unwrap_or(f64::NAN);
        let (o, p) = (&m.oracle.misses, &m.picker.misses);
        let share = |x: u64, of: u64| x as f64 / of.max(1) as f64;
        out.push_str(&format!(
            "| {:x} | {} | {v:.3} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} / {:.3} / {:.3} | {:.2} / {:.2} | {:.2} / {:.2} |\n",
            m.draw.seed,
            m.draw.label(),
            share(o.held_best, o.prompt),
            share(p.held_best, p.prompt),
            share(o.held_chosen, o.prompt),
            share(p.held_chosen, p.prompt),
            share(p.stale, p.prompt),
            share(p.unknown, p.prompt),
            share(p.load, p.prompt),
            share(o.copies, o.shared_requests),
            share(p.copies, p.shared_requests),
            m.oracle.imbalance,
            m.picker.imbalance,
        ));
    }
    out
}

/// One arm's figures on a draw, against the prefix oracle's.
struct Against {
    hit: f64,
    imbalance: f64,
    p99: f64,
}

/// Whether the targets can be met together, per draw run with [`evaluate_with_references`]:
/// the prefix oracle's own imbalance and p99 (the hit and p99 targets are relative to it), the
/// picker's, what least-loaded reaches (balance alone) and what the oracle held to the balance
/// target reaches, each against the oracle. "Worst for" names the targets whose worst draw
/// (the picker's) this is. A summary over the draws follows.
pub fn references_table(rows: &[Measured]) -> String {
    let short = [
        "hit÷oracle",
        "hit÷rr",
        "imbalance",
        "p99÷oracle",
        "unique p99",
        "replicas",
    ];
    let mut worst: Vec<Option<usize>> = vec![None; TARGETS.len()];
    for (k, (_, _, at_least)) in TARGETS.iter().enumerate() {
        worst[k] = rows
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.targets.values()[k].map(|v| (i, v)))
            .min_by(|a, b| {
                let (x, y) = if *at_least { (a.1, b.1) } else { (b.1, a.1) };
                x.total_cmp(&y)
            })
            .map(|(i, _)| i);
    }
    let mut out = String::from(
        "| seed | draw | oracle: hit / imbalance / p99 ms | picker: hit÷oracle / imbalance / p99÷oracle | least-loaded: hit÷oracle / imbalance / p99÷oracle | balanced oracle: hit÷oracle / imbalance / p99÷oracle | worst for |\n|---|---|---|---|---|---|---|\n",
    );
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    // The draws with a hit target, for the summary.
    let mut hit_draws: Vec<[Against; 3]> = Vec::new();
    for (i, m) in rows.iter().enumerate() {
        let Some(r) = &m.references else {
            continue;
        };
        let (o, p, ll, bo) = (&m.oracle, &m.picker, &r.least_loaded, &r.balanced_oracle);
        let marks: Vec<&str> = (0..TARGETS.len())
            .filter(|&k| worst[k] == Some(i))
            .map(|k| short[k])
            .collect();
        out.push_str(&format!(
            "| {:x} | {} | {:.3} / {:.2} / {:.0} | {:.3} / {:.2} / {:.3} | {:.3} / {:.2} / {:.3} | {:.3} / {:.2} / {:.3} | {} |\n",
            m.draw.seed,
            m.draw.label(),
            o.hit_rate,
            o.imbalance,
            o.e2e_p99_ms,
            ratio(p.hit_rate, o.hit_rate),
            p.imbalance,
            ratio(p.e2e_p99_ms, o.e2e_p99_ms),
            ratio(ll.hit_rate, o.hit_rate),
            ll.imbalance,
            ratio(ll.e2e_p99_ms, o.e2e_p99_ms),
            ratio(bo.hit_rate, o.hit_rate),
            bo.imbalance,
            ratio(bo.e2e_p99_ms, o.e2e_p99_ms),
            marks.join(", ")
        ));
        if m.targets.hit_vs_oracle.is_some() {
            let against = |r: &Report| Against {
                hit: ratio(r.hit_rate, o.hit_rate),
                imbalance: r.imbalance,
                p99: ratio(r.e2e_p99_ms, o.e2e_p99_ms),
            };
            hit_draws.push([against(o), against(ll), against(bo)]);
        }
    }
    let n = hit_draws.len();
    let (hit, bound, p99) = (TARGETS[0].1, TARGETS[2].1, TARGETS[3].1);
    out.push_str(&format!(
        "\nOver the {n} draws with a hit target:\n\n\
         | arm | imbalance ≤ {bound} (worst) | hit÷oracle ≥ {hit} (worst) | both | p99÷oracle ≤ {p99} (worst) |\n|---|---|---|---|---|\n"
    ));
    for (k, arm) in ["prefix oracle", "least-loaded", "balanced prefix oracle"]
        .iter()
        .enumerate()
    {
        let of: Vec<&Against> = hit_draws.iter().map(|d| &d[k]).collect();
        let count = |f: &dyn Fn(&Against) -> bool| of.iter().filter(|a| f(a)).count();
        let worst = |f: &dyn Fn(&Against) -> f64, high: bool| {
            of.iter()
                .map(|a| f(a))
                .fold(f64::NAN, if high { f64::max } else { f64::min })
        };
        out.push_str(&format!(
            "| {arm} | {} / {n} ({:.2}) | {} / {n} ({:.3}) | {} / {n} | {} / {n} ({:.3}) |\n",
            count(&|a| a.imbalance <= bound),
            worst(&|a| a.imbalance, true),
            count(&|a| a.hit >= hit),
            worst(&|a| a.hit, false),
            count(&|a| a.imbalance <= bound && a.hit >= hit),
            count(&|a| a.p99 <= p99),
            worst(&|a| a.p99, true),
        ));
    }
    out
}

/// Where the picker loses what the balanced oracle keeps, per draw run with
/// [`evaluate_knowledge`]: each corner of knowledge (the picker's tables or the true caches)
/// × rule (the picker's placement or the balanced oracle's), as hit ÷ prefix oracle /
/// imbalance / p99 ÷ prefix oracle; then, over the draws with a hit target, how many meet the
/// hit and imbalance targets (and both) in each corner, with the worst value.
pub fn knowledge_table(rows: &[Measured]) -> String {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let arms = [
        "picker (tables, picker's rule)",
        "true caches, picker's rule",
        "tables, balanced rule",
        "tables and the picker's prefill counters, balanced rule",
        "balanced oracle (true caches, balanced rule)",
    ];
    let mut out = String::from(
        "| seed | draw | oracle: hit / imbalance / p99 ms | picker | picker's rule on true caches | balanced rule on tables | balanced rule on tables and the picker's prefill | balanced oracle |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut hit_draws: Vec<[Against; 5]> = Vec::new();
    for m in rows {
        let Some(k) = &m.knowledge else {
            continue;
        };
        let o = &m.oracle;
        let arms_of = [
            &m.picker,
            &k.picker_on_caches,
            &k.balanced_on_tables,
            &k.balanced_on_picker_knowledge,
            &k.balanced_oracle,
        ];
        let cell = |r: &Report| {
            format!(
                "{:.3} / {:.2} / {:.3}",
                ratio(r.hit_rate, o.hit_rate),
                r.imbalance,
                ratio(r.e2e_p99_ms, o.e2e_p99_ms)
            )
        };
        out.push_str(&format!(
            "| {:x} | {} | {:.3} / {:.2} / {:.0} | {} | {} | {} | {} | {} |\n",
            m.draw.seed,
            m.draw.label(),
            o.hit_rate,
            o.imbalance,
            o.e2e_p99_ms,
            cell(arms_of[0]),
            cell(arms_of[1]),
            cell(arms_of[2]),
            cell(arms_of[3]),
            cell(arms_of[4]),
        ));
        if m.targets.hit_vs_oracle.is_some() {
            hit_draws.push(arms_of.map(|r| Against {
                hit: ratio(r.hit_rate, o.hit_rate),
                imbalance: r.imbalance,
                p99: ratio(r.e2e_p99_ms, o.e2e_p99_ms),
            }));
        }
    }
    let n = hit_draws.len();
    let (hit, bound, p99) = (TARGETS[0].1, TARGETS[2].1, TARGETS[3].1);
    out.push_str(&format!(
        "\nOver the {n} draws with a hit target:\n\n\
         | knowledge × rule | hit÷oracle ≥ {hit} (worst) | imbalance ≤ {bound} (worst) | both | p99÷oracle ≤ {p99} (worst) |\n|---|---|---|---|---|\n"
    ));
    for (k, arm) in arms.iter().enumerate() {
        let of: Vec<&Against> = hit_draws.iter().map(|d| &d[k]).collect();
        let count = |f: &dyn Fn(&Against) -> bool| of.iter().filter(|a| f(a)).count();
        let worst = |f: &dyn Fn(&Against) -> f64, high: bool| {
            of.iter()
                .map(|a| f(a))
                .fold(f64::NAN, if high { f64::max } else { f64::min })
        };
        out.push_str(&format!(
            "| {arm} | {} / {n} ({:.3}) | {} / {n} ({:.2}) | {} / {n} | {} / {n} ({:.3}) |\n",
            count(&|a| a.hit >= hit),
            worst(&|a| a.hit, false),
            count(&|a| a.imbalance <= bound),
            worst(&|a| a.imbalance, true),
            count(&|a| a.imbalance <= bound && a.hit >= hit),
            count(&|a| a.p99 <= p99),
            worst(&|a| a.p99, true),
        ));
    }
    out
}

/// The worst value and the draws met of each target, one row per arm: the picker's, then each
/// arm of [`DETAIL_ARMS`] (rows run with [`evaluate_details`]); then every draw's hit ÷ oracle /
/// imbalance / replicas ÷ one per arm.
pub fn details_table(rows: &[Measured]) -> String {
    let mut names = vec!["the picker (the core)"];
    names.extend(DETAIL_ARMS.iter().map(|a| a.0));
    let targets_of = |m: &Measured, k: usize| -> Option<Targets> {
        match k {
            0 => Some(m.targets.clone()),
            _ => m.details.as_ref().map(|d| d.arms[k - 1].0.clone()),
        }
    };
    let mut out = String::from("| arm |");
    for (name, bound, at_least) in TARGETS {
        out.push_str(&format!(
            " {name} {} {bound} |",
            if at_least { "≥" } else { "≤" }
        ));
    }
    out.push_str("\n|---|---|---|---|---|---|---|\n");
    for (k, name) in names.iter().enumerate() {
        out.push_str(&format!("| {name} |"));
        for (t, (_, _, at_least)) in TARGETS.iter().enumerate() {
            let v: Vec<(f64, bool)> = rows
                .iter()
                .filter_map(|m| targets_of(m, k))
                .filter_map(|x| x.values()[t].map(|v| (v, x.met()[t])))
                .collect();
            let worst = v
                .iter()
                .map(|x| x.0)
                .fold(f64::NAN, if *at_least { f64::min } else { f64::max });
            let met = v.iter().filter(|x| x.1).count();
            out.push_str(&format!(" {worst:.3} ({met} / {}) |", v.len()));
        }
        out.push('\n');
    }
    out.push_str(
        "\nEach cell: hit ÷ prefix oracle / prefill imbalance / replicas ÷ one.\n\n| seed | draw |",
    );
    for name in &names {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|---|");
    for _ in &names {
        out.push_str("---|");
    }
    out.push('\n');
    let f = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.3}"));
    for m in rows {
        out.push_str(&format!("| {:x} | {} |", m.draw.seed, m.draw.label()));
        for k in 0..names.len() {
            match targets_of(m, k) {
                Some(t) => out.push_str(&format!(
                    " {} / {} / {} |",
                    f(t.hit_vs_oracle),
                    f(t.imbalance),
                    f(t.replicas_vs_one)
                )),
                None => out.push_str(" |"),
            }
        }
        out.push('\n');
    }
    out
}
