//! Request streams with the shapes the issue names, generated from a seed.

use serde_json::{json, Value};

/// splitmix64: small, fixed, the same on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Exponential gap with mean `mean_ns`.
    pub fn exp(&mut self, mean_ns: f64) -> u64 {
        (-(1.0 - self.unit()).ln() * mean_ns) as u64
    }
}

/// Prose of about `bytes` bytes, different for each `tag`.
pub fn prose(rng: &mut Rng, bytes: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "model", "request", "answer", "context", "policy", "tenant", "cluster", "token",
        "latency", "budget", "prefix", "cache", "engine", "router", "gateway", "pod", "value",
        "report", "account", "customer", "invoice", "shipment", "order", "question", "detail",
    ];
    let mut s = String::with_capacity(bytes + 16);
    while s.len() < bytes {
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
        s.push(if rng.range(0, 11) == 0 { '.' } else { ' ' });
    }
    s
}

/// Prose of a length uniform in [lo, hi).
pub fn prose_in(rng: &mut Rng, lo: u64, hi: u64) -> String {
    let n = rng.range(lo, hi) as usize;
    prose(rng, n)
}

#[derive(Clone, Debug)]
pub struct SimRequest {
    pub at_ns: u64,
    pub body: Vec<u8>,
    pub session: Option<String>,
    /// The assistant message the conversation's next turn sends back: what the model answered.
    /// The engine caches it after the prompt, as vLLM caches the blocks its decode filled
    /// (`e2e::engine::ANSWER_HEADER`, `Setup::cache_answers`). None for one-shot requests.
    pub answer: Option<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Tenants, each with a long shared system prompt, asking short questions.
    SharedPrompt,
    /// Chats growing turn by turn, half with a session header.
    MultiTurn,
    /// Agent loops with large tool definitions, each step appending a call and its result.
    Agent,
    /// Nothing shared: the guardrail.
    Unique,
}

impl Shape {
    pub const ALL: [Shape; 4] = [
        Shape::SharedPrompt,
        Shape::MultiTurn,
        Shape::Agent,
        Shape::Unique,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Shape::SharedPrompt => "shared-prompt",
            Shape::MultiTurn => "multi-turn",
            Shape::Agent => "agent",
            Shape::Unique => "unique",
        }
    }
}

fn body(messages: &[Value], tools: Option<&Value>) -> Vec<u8> {
    let mut v = json!({"model": "sim", "messages": messages, "max_tokens": 64});
    if let Some(t) = tools {
        v["tools"] = t.clone();
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// `n` requests of `shape` at `rate` requests per second (Poisson), sorted by arrival.
pub fn generate(shape: Shape, n: usize, rate: f64, seed: u64) -> Vec<SimRequest> {
    let mut rng = Rng::new(seed ^ (shape as u64 * 0x1000_0001));
    let gap = 1e9 / rate;
    let mut out = Vec::with_capacity(n);
    match shape {
        Shape::SharedPrompt => {
            let tenants: Vec<String> = (0..48)
                .map(|_| {
                    let size = rng.range(6000, 10000) as usize;
                    prose(&mut rng, size)
                })
                .collect();
            let mut t = 0;
            for _ in 0..n {
                t += rng.exp(gap);
                // Skewed popularity: a few tenants ask most.
                let k = (rng.unit().powf(1.5) * tenants.len() as f64) as usize;
                let q = prose_in(&mut rng, 100, 500);
                let msgs = [
                    json!({"role": "system", "content": tenants[k]}),
                    json!({"role": "user", "content": q}),
                ];
                out.push(SimRequest {
                    at_ns: t,
                    body: body(&msgs, None),
                    session: None,
                    answer: None,
                });
            }
        }
        Shape::MultiTurn => {
            let system = prose(&mut rng, 600);
            let mut start = 0u64;
            while out.len() < n {
                // A new chat every few gaps; its turns follow a few seconds apart.
                start += rng.exp(gap * 6.0);
                let id = out.len();
                let turns = rng.range(4, 11);
                let session = (rng.range(0, 2) == 0).then(|| format!("chat-{id}"));
                let mut msgs = vec![json!({"role": "system", "content": system})];
                let mut t = start;
                for _ in 0..turns {
                    msgs.push(json!({"role": "user", "content": prose_in(&mut rng, 200, 700)}));
                    let answer =
                        json!({"role": "assistant", "content": prose_in(&mut rng, 300, 900)});
                    out.push(SimRequest {
                        at_ns: t,
                        body: body(&msgs, None),
                        session: session.clone(),
                        answer: Some(answer.clone()),
                    });
                    msgs.push(answer);
                    t += rng.range(2_000_000_000, 6_000_000_000);
                }
            }
        }
        Shape::Agent => {
            let toolsets: Vec<Value> = (0..6)
                .map(|_| {
                    let tools: Vec<Value> = (0..12)
                        .map(|i| {
                            json!({"type": "function", "function": {
                        "name": format!("tool_{i}"), "description": prose(&mut rng, 1200),
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}})
                        })
                        .collect();
                    Value::Array(tools)
                })
                .collect();
            let mut start = 0u64;
            while out.len() < n {
                start += rng.exp(gap * 8.0);
                let tools = &toolsets[(rng.next_u64() % toolsets.len() as u64) as usize];
                let steps = rng.range(5, 16);
                let mut msgs = vec![json!({"role": "user", "content": prose(&mut rng, 400)})];
                let mut t = start;
                for s in 0..steps {
                    let answer = json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{s}"),
                        "type": "function", "function": {"name": "tool_1", "arguments": "{\"q\":\"x\"}"}}]});
                    out.push(SimRequest {
                        at_ns: t,
                        body: body(&msgs, Some(tools)),
                        session: None,
                        answer: Some(answer.clone()),
                    });
                    msgs.push(answer);
                    msgs.push(json!({"role": "tool", "tool_call_id": format!("c{s}"), "content": prose_in(&mut rng, 500, 2000)}));
                    t += rng.range(800_000_000, 2_500_000_000);
                }
            }
        }
        Shape::Unique => {
            let mut t = 0;
            for _ in 0..n {
                t += rng.exp(gap);
                let msgs = [json!({"role": "user", "content": prose_in(&mut rng, 1000, 4000)})];
                out.push(SimRequest {
                    at_ns: t,
                    body: body(&msgs, None),
                    session: None,
                    answer: None,
                });
            }
        }
    }
    out.truncate(n);
    out.sort_by_key(|r| r.at_ns);
    out
}
