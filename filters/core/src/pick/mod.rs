//! Picking the pod of a `resolution: endpoint` backend inside the gateway: prefix (KV-cache)
//! affinity traded against load, sessions, quarantine. See docs/endpoint-picking.md.
//!
//! Everything here is plain state and arithmetic on caller-supplied time (host clock, ns), so the
//! same code runs in the filter, in native tests and in the simulation (`bench/picksim`). Pods
//! are indices into the configured list: a pick can only ever name a configured pod.
//!
//! A pick reads each pod's table of the prompt blocks recently sent there (bounded by the KV
//! cache its engine reports, so it forgets what the engine evicted) and places the request by
//! `place.rs`: the pod holding the longest prefix within the load bound, or, for a prompt no pod
//! is known to hold, its home by rendezvous hashing on its first block. A live session stays on
//! its pod while that pod is not queuing and clearly busier than the others.

pub mod blocks;
pub mod codec;
pub mod events;
pub mod load;
mod place;
pub mod sent_blocks;
pub mod session;
mod subset;
pub mod usage_watch;
pub mod wire;

pub use blocks::{hash_prompt, prompt_parts, Prompt};
pub use load::{parse_vllm_metrics, EngineMetrics, PodLoad, Ticket};
pub use sent_blocks::BlockTable;
pub use session::{session_key, Sessions};

use crate::quarantine::Quarantine;
use blocks::fnv64;

/// The table bound never shrinks below this many blocks, so predictions (and with them the
/// confirmations that grow it back) keep happening.
const MIN_LIMIT: usize = 64;

/// Below this share of what the engines computed, this gateway is not their only client. A lone
/// gateway's usage-corrected share is about 1 (its bytes per token against the engine's
/// rendered 4); two replicas' are about 0.5 each.
const OWN_SHARE_ALONE: f64 = 0.7;

/// Engine-computed prompt bytes (decaying) needed before a share below the line is trusted
/// (others send: the bounds loosen).
const MIN_SHARED_EVIDENCE_BYTES: f64 = 32.0 * 1024.0;

/// The same before a share at or above the line is (alone: conversations are placed by the
/// least work). Lower, because a lone gateway places most chats of a burst in its first
/// seconds; a replica among others reads below the line from its first requests on (its share
/// is about 1/replicas), so reading "alone" early costs them little. At 32 KiB a lone gateway
/// at 25 req/s of ~1.2 KB first turns knew it only after ~6 s, when 60 % of the chats of
/// `pick_envoy`'s multi-turn burst were placed.
const MIN_ALONE_EVIDENCE_BYTES: f64 = 8.0 * 1024.0;

/// The smallest share of the engines' cache a table is bounded to (see `bound_table`): one
/// gateway among many still keeps the prefixes it sends most.
const MIN_SHARE: f64 = 0.1;

/// Work one more request in flight or queued costs a pod, in prompt bytes (its decode share).
const REQUEST_COST_BYTES: u64 = 1024;

/// Most pods per backend: pod indices are `u16` in tickets, tables and sessions.
pub const MAX_PODS: usize = 1024;

pub use crate::config::pick::Mode;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixAffinity {
    pub block_bytes: usize,
    pub max_blocks_per_endpoint: usize,
}

impl Default for PrefixAffinity {
    fn default() -> Self {
        PrefixAffinity {
            block_bytes: 1024,
            max_blocks_per_endpoint: 16_384,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionAffinity {
    /// Header names in priority order.
    pub headers: Vec<String>,
    pub idle_ns: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub mode: Mode,
    /// Ignored with RoundRobin (the generator warns PrefixAffinityIgnored).
    pub prefix: Option<PrefixAffinity>,
    /// Ignored with RoundRobin (the generator warns SessionAffinityIgnored).
    pub session: Option<SessionAffinity>,
    /// `proxy.quarantineDuration`.
    pub quarantine_ns: u64,
    /// In-flight counts older than this stop counting (a lost release cannot leak for ever).
    pub in_flight_expiry_ns: u64,
    /// A pod recently sent more than this percentage of the mean prefill work (plus this
    /// prompt) sheds known prefixes to the next pod holding most (see `place.rs`). 0: a known
    /// prefix stays while the load bound allows.
    pub known_balance_percent: u64,
    /// Half-life of the recent prefill work per pod.
    pub recent_half_life_ns: u64,
    /// Engine gauges older than this are ignored.
    pub metrics_max_age_ns: u64,
    /// Seeds the block chain (one per backend).
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::LoadAware,
            prefix: Some(PrefixAffinity::default()),
            session: None,
            quarantine_ns: 15_000_000_000,
            in_flight_expiry_ns: load::DEFAULT_IN_FLIGHT_EXPIRY_NS,
            known_balance_percent: 150,
            recent_half_life_ns: 10_000_000_000,
            metrics_max_age_ns: 5_000_000_000,
            seed: 0,
        }
    }
}

/// Whether other gateways (replicas sharing nothing with this one) send to the same pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Company {
    /// No basis to tell: no fresh counters from the engines, or too little work yet.
    Unknown,
    /// The engines computed about what this gateway sent them.
    Alone,
    /// The engines computed clearly more than this gateway sent: others send too.
    Others,
}

/// What the picker needs to know about one request.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub prompt: &'a Prompt,
    /// [`session_key`] of the request's headers, if it has one.
    pub session: Option<u64>,
    /// A pod not to use (the one a retry failed on).
    pub avoid: Option<usize>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Choice {
    Pod(Ticket),
    /// Every configured pod is quarantined (or avoided): the caller falls back per the routing
    /// rules, never to an address of its own.
    NoEligiblePod,
}

/// What a live session says about the pod of its next request.
enum Stay {
    /// No live session on an eligible pod.
    None,
    /// It stays on this pod.
    On(usize),
    /// It leaves this (queuing, clearly busier) pod: placed anew elsewhere.
    Leaving(usize),
}

/// How a request ended, for [`Picker::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A response came back. The engine's `usage.prompt_tokens` and
    /// `usage.prompt_tokens_details.cached_tokens`, when it reports them, correct the table.
    Done {
        prompt_tokens: Option<u64>,
        cached_tokens: Option<u64>,
    },
    /// A 5xx or a connection failure: two in a row quarantine the pod.
    Failed,
    /// The stream went silent past streamIdleTimeout: quarantined at once.
    StreamIdle,
    /// The client went away: says nothing about the pod.
    Aborted,
}

#[derive(Clone, Debug)]
struct Pod {
    addr: String,
    id: u64,
}

/// One backend's picking state.
#[derive(Clone, Debug)]
pub struct Picker {
    cfg: Config,
    pods: Vec<Pod>,
    pub(crate) tables: Vec<BlockTable>,
    pub(crate) loads: Vec<PodLoad>,
    pub(crate) sessions: Sessions,
    pub(crate) quarantine: Quarantine,
    fails: Vec<u8>,
    cursor: u64,
    /// The pods the pick in progress may use (empty: all); see `subset.rs`.
    only: Vec<bool>,
    /// Prompt bytes and the engine's prompt tokens of every request that ended with `usage`:
    /// this gateway's bytes per token, to compare its prefill (bytes) with the engines'
    /// counters (tokens) in one unit ([`Picker::company`]). Sums, so every worker's copy
    /// agrees whatever order the releases arrive in.
    usage_bytes: u64,
    usage_tokens: u64,
    /// When the scrapes began to read this gateway alone without a break (the reading's
    /// time), and whether a pod's later scrape read it alone again. Updated only on scrapes,
    /// which every worker applies alike.
    alone_since: Option<u64>,
    alone_confirmed: bool,
}

impl Picker {
    /// A picker over the configured pods (`ip:port`), at most [`MAX_PODS`] of them.
    pub fn new(cfg: Config, pods: &[String]) -> Self {
        let pods: Vec<Pod> = pods
            .iter()
            .take(MAX_PODS)
            .map(|a| Pod {
                addr: a.clone(),
                id: fnv64(a.as_bytes()),
            })
            .collect();
        let n = pods.len();
        let cap = cfg
            .prefix
            .as_ref()
            .filter(|_| cfg.mode == Mode::LoadAware)
            .map_or(1, |p| p.max_blocks_per_endpoint);
        Picker {
            tables: (0..n).map(|_| BlockTable::new(cap)).collect(),
            loads: vec![PodLoad::default(); n],
            sessions: Sessions::new(session::MAX_SESSIONS),
            quarantine: Quarantine::new(n),
            fails: vec![0; n],
            cursor: 0,
            only: Vec::new(),
            usage_bytes: 0,
            usage_tokens: 0,
            alone_since: None,
            alone_confirmed: false,
            pods,
            cfg,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
    pub fn pods(&self) -> usize {
        self.pods.len()
    }
    /// The configured address of pod `i`.
    pub fn address(&self, i: usize) -> Option<&str> {
        self.pods.get(i).map(|p| p.addr.as_str())
    }
    pub fn table(&self, i: usize) -> Option<&BlockTable> {
        self.tables.get(i)
    }
    pub fn load(&self, i: usize) -> Option<&PodLoad> {
        self.loads.get(i)
    }

    /// Block size in force, when prefix affinity is.
    pub fn block_bytes(&self) -> Option<usize> {
        self.prefix().map(|p| {
            p.block_bytes
                .clamp(blocks::MIN_BLOCK_BYTES, blocks::MAX_BLOCK_BYTES)
        })
    }

    fn prefix(&self) -> Option<&PrefixAffinity> {
        self.cfg
            .prefix
            .as_ref()
            .filter(|_| self.cfg.mode == Mode::LoadAware)
    }

    fn epoch(&self, now: u64) -> u64 {
        now / (self.cfg.in_flight_expiry_ns / (load::BUCKETS as u64 - 1)).max(1)
    }

    /// Records the engine's gauges for pod `i`.
    pub fn set_metrics(&mut self, i: usize, m: EngineMetrics) {
        let e = self.epoch(m.at_ns);
        let h = self.cfg.recent_half_life_ns;
        let Some(l) = self.loads.get_mut(i) else {
            return;
        };
        let before = l.metrics.map(|p| p.at_ns);
        let own = l.requests(e);
        if !l.scraped(m, own, h) {
            return;
        }
        self.bound_table(i, m.cache_tokens, m.at_ns);
        // Two consecutive scrapes: the pod's previous reading was made since the run of
        // "alone" readings began, and this one says alone again.
        match self.reading(m.at_ns) {
            Company::Alone => match self.alone_since {
                None => (self.alone_since, self.alone_confirmed) = (Some(m.at_ns), false),
                Some(since) => {
                    self.alone_confirmed |= before.is_some_and(|b| b >= since);
                }
            },
            _ => (self.alone_since, self.alone_confirmed) = (None, false),
        }
    }

    /// Bounds pod `i`'s table by the KV cache its engine reports (`cache_tokens`, in this
    /// gateway's prompt bytes per token), so that the table forgets, least recently sent first,
    /// what the engine can no longer hold, instead of crediting the pod with evicted prefixes.
    fn bound_table(&mut self, i: usize, cache_tokens: Option<f64>, at: u64) {
        let (Some(block), Some(tokens)) = (self.block_bytes(), cache_tokens) else {
            return;
        };
        // Where other gateways send too, the engine's LRU also holds their prompts: this
        // gateway's blocks age there as fast as everyone's sends, so the table holds this
        // gateway's share of the cache.
        let share = self.own_share(at).unwrap_or(1.0).clamp(MIN_SHARE, 1.0);
        let blocks = tokens * self.bytes_per_token() * share / block as f64;
        if let Some(t) = self.tables.get_mut(i) {
            t.set_limit(blocks.clamp(1.0, t.capacity() as f64) as usize);
        }
    }

    /// Pod `i`'s load in prompt bytes: uncached bytes in flight plus a request cost for each
    /// request running or queued there. With fresh gauges the count is the engine's (it also
    /// sees other replicas' requests) while it reports requests waiting, the larger of the
    /// engine's and this gateway's.
    pub fn load_bytes(&self, i: usize, now: u64) -> u64 {
        let Some(l) = self.loads.get(i) else {
            return u64::MAX;
        };
        let e = self.epoch(now);
        let own = l.requests(e) as u64;
        let requests = match l.fresh_metrics(now, self.cfg.metrics_max_age_ns) {
            None => own,
            // A snapshot of who was running at this gateway's own scrape moment, up to a
            // second old, says nothing another replica would read alike (docs, "Why Envoy
            // reads lower than the simulation").
            Some(m) if m.waiting <= 0.0 => own,
            Some(m) => own.max((m.running + m.waiting).min(1e9) as u64),
        };
        l.work(e)
            .saturating_add(requests.saturating_mul(REQUEST_COST_BYTES))
    }

    fn queuing(&self, i: usize, now: u64) -> bool {
        let l = &self.loads[i];
        match l.fresh_metrics(now, self.cfg.metrics_max_age_ns) {
            Some(m) => m.waiting >= 1.0,
            None => l.requests(self.epoch(now)) >= 2,
        }
    }

    fn eligible(&self, i: usize, now: u64, avoid: Option<usize>) -> bool {
        Some(i) != avoid
            && (self.only.is_empty() || self.only.get(i) == Some(&true))
            && !self.quarantine.is_quarantined(i, now)
    }

    /// Picks a pod for `req` and charges it; the ticket must go back to [`Picker::release`].
    pub fn pick(&mut self, req: &Request<'_>, now: u64) -> Choice {
        let n = self.pods.len();
        if !(0..n).any(|i| self.eligible(i, now, req.avoid)) {
            return Choice::NoEligiblePod;
        }
        if self.cfg.mode == Mode::RoundRobin {
            return self.round_robin(req, now);
        }
        let blocks: &[u64] = match self.block_bytes() {
            Some(_) => &req.prompt.blocks,
            None => &[],
        };
        let matched: Vec<usize> = (0..n)
            .map(|i| self.tables[i].matched_prefix(blocks))
            .collect();
        self.pick_matched(req, &matched, now)
    }

    /// [`Picker::pick`] with the caller's count of each pod's cached prefix blocks of the
    /// prompt (`matched[p]`, in this picker's blocks) instead of the tables': for a caller that
    /// knows the engines' caches exactly (the simulation's knowledge reference, or a precise
    /// feed of the engines' KV events). Missing entries count as nothing cached.
    pub fn pick_knowing(&mut self, req: &Request<'_>, matched: &[usize], now: u64) -> Choice {
        let n = self.pods.len();
        if !(0..n).any(|i| self.eligible(i, now, req.avoid)) {
            return Choice::NoEligiblePod;
        }
        if self.cfg.mode == Mode::RoundRobin {
            return self.round_robin(req, now);
        }
        let matched: Vec<usize> = match self.block_bytes() {
            Some(_) => (0..n)
                .map(|i| {
                    matched
                        .get(i)
                        .copied()
                        .unwrap_or(0)
                        .min(req.prompt.blocks.len())
                })
                .collect(),
            None => vec![0; n],
        };
        self.pick_matched(req, &matched, now)
    }

    fn pick_matched(&mut self, req: &Request<'_>, matched: &[usize], now: u64) -> Choice {
        let blocks: &[u64] = match self.block_bytes() {
            Some(_) => &req.prompt.blocks,
            None => &[],
        };
        let key = req.session.filter(|_| self.cfg.session.is_some());
        let leaving = match key.map(|k| self.session_verdict(k, req.avoid, now)) {
            Some(Stay::On(b)) => return Choice::Pod(self.charge_session(b, matched, req, now)),
            Some(Stay::Leaving(b)) => Some(b),
            Some(Stay::None) | None => None,
        };
        // The home of a prompt no pod holds: its first block (the tools or system prompt every
        // request of one application starts with, so a new session starts where its
        // application's prefix most likely is); a session without a whole block by its key.
        let home_key = blocks.first().copied().or(key);
        let prompt_bytes = req.prompt.bytes as u64;
        let Some(i) = self.place(matched, leaving, req.avoid, home_key, prompt_bytes, now) else {
            return Choice::NoEligiblePod;
        };
        // A new session, or one that moves, starts its conversation here.
        Choice::Pod(self.charge_session(i, matched, req, now))
    }

    /// The next eligible pod after the cursor.
    fn round_robin(&mut self, req: &Request<'_>, now: u64) -> Choice {
        let n = self.pods.len();
        for _ in 0..n {
            let i = (self.cursor % n as u64) as usize;
            self.cursor = self.cursor.wrapping_add(1);
            if self.eligible(i, now, req.avoid) {
                let bytes = req.prompt.bytes as u64;
                return Choice::Pod(self.charge(i, bytes, 0, req.prompt, now));
            }
        }
        Choice::NoEligiblePod
    }

    /// The eligible pod the live session `key` is bound to, if any (read by the simulation's
    /// placement arms).
    pub fn session_pod(&self, key: u64, avoid: Option<usize>, now: u64) -> Option<usize> {
        let idle = self.cfg.session.as_ref()?.idle_ns;
        let b = usize::from(self.sessions.get(key, now, idle)?);
        (b < self.pods.len() && self.eligible(b, now, avoid)).then_some(b)
    }

    /// Pod `i`'s rendezvous rank for the home key `key` (the same on every replica: it hashes
    /// the pod's address).
    pub fn rendezvous(&self, key: u64, i: usize) -> u64 {
        self.pods.get(i).map_or(0, |p| blocks::mix(key ^ p.id))
    }

    /// Whether the live session `key` stays on its pod: it does unless that pod is queuing
    /// and clearly busier than the least loaded other pod (more than twice its load plus one
    /// request), so a conversation keeps its cache unless its pod has become a bottleneck.
    fn session_verdict(&self, key: u64, avoid: Option<usize>, now: u64) -> Stay {
        let Some(idle) = self.cfg.session.as_ref().map(|s| s.idle_ns) else {
            return Stay::None;
        };
        let n = self.pods.len();
        let Some(b) = self.sessions.get(key, now, idle).map(usize::from) else {
            return Stay::None;
        };
        if b >= n || !self.eligible(b, now, avoid) {
            return Stay::None;
        }
        let least = (0..n)
            .filter(|&i| i != b && self.eligible(i, now, avoid))
            .map(|i| self.load_bytes(i, now))
            .min();
        let busier = least.is_some_and(|m| {
            self.load_bytes(b, now) > m.saturating_mul(2).saturating_add(REQUEST_COST_BYTES)
        });
        if busier && self.queuing(b, now) {
            Stay::Leaving(b)
        } else {
            Stay::On(b)
        }
    }

    /// Charges pod `i` (see [`Picker::charge_matched`]) and binds the request's session, if it
    /// has one, to it: the binding's idle time starts again.
    fn charge_session(
        &mut self,
        i: usize,
        matched: &[usize],
        req: &Request<'_>,
        now: u64,
    ) -> Ticket {
        if let Some(k) = req.session.filter(|_| self.cfg.session.is_some()) {
            self.sessions.bind(k, i as u16, now);
        }
        self.charge_matched(i, matched, req, now)
    }

    /// Charges pod `i` with the prompt's bytes beyond the prefix its table holds.
    fn charge_matched(
        &mut self,
        i: usize,
        matched: &[usize],
        req: &Request<'_>,
        now: u64,
    ) -> Ticket {
        let block = self.block_bytes().unwrap_or(0) as u64;
        let bytes = req.prompt.bytes as u64;
        let held = matched.get(i).copied().unwrap_or(0);
        let cached = (held as u64 * block).min(bytes);
        self.charge(i, bytes - cached, held, req.prompt, now)
    }

    /// Whether other gateways send to these pods too (see [`Picker::company`]).
    pub fn others_send(&self, now: u64) -> bool {
        self.company(now) == Company::Others
    }

    /// Who else sends to these pods, as the engines' counters tell: the engines report
    /// computing clearly more prompt than this gateway's own recent prefill (usage-corrected,
    /// so for a lone gateway the two agree), summed over the pods whose counters are fresh.
    /// Both sides are compared in tokens: the engines count tokens, and this gateway's prefill
    /// (prompt bytes) is divided by its own prompts' bytes per token as the engines reported
    /// them, not by a fixed 4 (a lone gateway at 3 bytes per token would read a share of 0.75,
    /// at 2.5 one of 0.63: "others"). Both sides come from picks, releases and scrapes, so
    /// every worker's copy agrees.
    ///
    /// "Alone" needs the reading to have held over two consecutive scrapes of a pod; until
    /// then the verdict is `Unknown`. It sizes the tables (a gateway among others keeps its
    /// share of each engine's cache) and is reported (`pick.alone`); placement does not read it.
    pub fn company(&self, now: u64) -> Company {
        match self.reading(now) {
            Company::Alone if !self.alone_confirmed => Company::Unknown,
            c => c,
        }
    }

    /// What the counters say at `now`, with no regard to earlier scrapes.
    pub(crate) fn reading(&self, now: u64) -> Company {
        match self.own_share(now) {
            None => Company::Unknown,
            Some(s) if s >= OWN_SHARE_ALONE => Company::Alone,
            Some(_) if self.engine_bytes(now) >= MIN_SHARED_EVIDENCE_BYTES => Company::Others,
            Some(_) => Company::Unknown,
        }
    }

    /// The engines' recent computed prompt (decaying, at [`load::BYTES_PER_TOKEN`]) and this
    /// gateway's own recent prefill sent to them, over the pods whose counters are fresh.
    fn recent_prefill(&self, now: u64) -> (f64, f64) {
        let h = self.cfg.recent_half_life_ns;
        let max_age = self.cfg.metrics_max_age_ns;
        let (mut own, mut engines) = (0.0, 0.0);
        for l in &self.loads {
            if let (Some(c), Some(_)) = (l.scrape.computed, l.fresh_metrics(now, max_age)) {
                own += l.recent.at(now, h);
                engines += c.at(now, h);
            }
        }
        (own, engines)
    }

    fn engine_bytes(&self, now: u64) -> f64 {
        self.recent_prefill(now).1
    }

    /// This gateway's share of the prompt the engines computed recently, in tokens on both
    /// sides (this gateway's bytes over its own prompts' bytes per token as the engines
    /// reported them, not a fixed 4: at 3 bytes per token a lone gateway would read 0.75).
    /// `None` without fresh counters, with too little engine work to tell (a few requests'
    /// rounding decide nothing), or with predicted prefill (`recent_from_usage` off).
    pub(crate) fn own_share(&self, now: u64) -> Option<f64> {
        let (own, engines) = self.recent_prefill(now);
        if engines < MIN_ALONE_EVIDENCE_BYTES {
            return None;
        }
        let own_tokens = own / self.bytes_per_token();
        let engine_tokens = engines / load::BYTES_PER_TOKEN;
        Some(own_tokens / engine_tokens)
    }

    /// This gateway's prompt bytes per engine token, from the `usage` its requests reported
    /// ([`load::BYTES_PER_TOKEN`] until some did).
    pub fn bytes_per_token(&self) -> f64 {
        // A few requests' worth before the measured ratio replaces the assumed one.
        if self.usage_tokens < 1024 {
            return load::BYTES_PER_TOKEN;
        }
        self.usage_bytes as f64 / self.usage_tokens as f64
    }

    /// Which eligible pods were recently sent more prefill than `percent` of the mean (plus
    /// `prompt_bytes`, so an idle backend bounds nobody).
    fn over_balance(
        &self,
        percent: u64,
        prompt_bytes: u64,
        now: u64,
        avoid: Option<usize>,
    ) -> Vec<bool> {
        let n = self.pods.len();
        let h = self.cfg.recent_half_life_ns;
        if percent == 0 {
            return vec![false; n];
        }
        // This gateway's own recent sends, usage-corrected.
        let recent: Vec<Option<f64>> = (0..n)
            .map(|i| {
                self.eligible(i, now, avoid)
                    .then(|| self.loads[i].recent.at(now, h))
            })
            .collect();
        let live = recent.iter().flatten().count().max(1) as f64;
        let mean = recent.iter().flatten().sum::<f64>() / live;
        let bound = mean * percent as f64 / 100.0 + prompt_bytes as f64;
        recent
            .iter()
            .map(|r| r.is_some_and(|r| r > bound))
            .collect()
    }

    fn charge(
        &mut self,
        i: usize,
        work: u64,
        predicted: usize,
        prompt: &Prompt,
        now: u64,
    ) -> Ticket {
        let epoch = self.epoch(now);
        self.loads[i].acquire(epoch, work);
        self.loads[i].sent(now, work, self.cfg.recent_half_life_ns);
        if self.prefix().is_some() {
            // Recorded now, not when the response ends: a burst of one new prompt then finds
            // it on the first pod instead of missing everywhere.
            self.tables[i].record(&prompt.blocks);
        }
        Ticket {
            pod: i as u16,
            epoch,
            work,
            prompt_bytes: prompt.bytes,
            predicted,
        }
    }

    /// Ends a request: releases its load, counts failures towards quarantine, and checks the
    /// table's prediction against what the engine reports cached.
    pub fn release(&mut self, t: Ticket, outcome: Outcome, now: u64) {
        let i = t.pod as usize;
        let (Some(l), Some(fails)) = (self.loads.get_mut(i), self.fails.get_mut(i)) else {
            return;
        };
        l.release(t.epoch, t.work);
        match outcome {
            Outcome::Done {
                prompt_tokens,
                cached_tokens,
            } => {
                *fails = 0;
                if let (Some(p), Some(c)) = (prompt_tokens, cached_tokens) {
                    if p > 0 {
                        self.usage_bytes = self.usage_bytes.saturating_add(t.prompt_bytes as u64);
                        self.usage_tokens = self.usage_tokens.saturating_add(p);
                    }
                    if p > 0 {
                        // The recent prefill work is what the engine computed (in the prompt's
                        // bytes per token), not the pick's prediction: a pod whose cache
                        // thrashes shows the prefill it really did.
                        let computed = (p.saturating_sub(c) as u128 * t.prompt_bytes as u128
                            / p as u128) as f64;
                        let h = self.cfg.recent_half_life_ns;
                        l.recent.adjust(now, computed - t.work as f64, h);
                    }
                    let reported = self.loads[i]
                        .metrics
                        .is_some_and(|m| m.cache_tokens.is_some());
                    if let (Some(block), false) = (self.block_bytes(), reported) {
                        self.correct(i, &t, p, c, block);
                    }
                }
            }
            Outcome::Failed => {
                *fails = fails.saturating_add(1);
                if *fails >= 2 {
                    self.quarantine_pod(i, now);
                }
            }
            Outcome::StreamIdle => self.quarantine_pod(i, now),
            Outcome::Aborted => {}
        }
    }

    fn quarantine_pod(&mut self, i: usize, now: u64) {
        self.quarantine
            .mark(i, now.saturating_add(self.cfg.quarantine_ns));
        self.fails[i] = 0;
        // A pod that failed may come back restarted, with an empty cache.
        self.tables[i].clear();
    }

    /// The engine caches fewer blocks than the table remembers when its KV cache is smaller
    /// than `maxBlocksPerEndpoint` covers. A prediction the engine contradicts shrinks the
    /// table's bound by a quarter; a confirmed one grows it back by the blocks confirmed.
    fn correct(
        &mut self,
        i: usize,
        t: &Ticket,
        prompt_tokens: u64,
        cached_tokens: u64,
        block: usize,
    ) {
        if t.predicted == 0 || prompt_tokens == 0 {
            return;
        }
        let cached_bytes = (cached_tokens.min(prompt_tokens) as u128 * t.prompt_bytes as u128
            / prompt_tokens as u128) as usize;
        let cached_blocks = cached_bytes / block;
        let table = &mut self.tables[i];
        // One block of slack: tokens and bytes do not line up exactly.
        if cached_blocks + 1 < t.predicted {
            let limit = table.limit();
            table.set_limit((limit - limit / 4).max(MIN_LIMIT));
        } else {
            let limit = table.limit();
            table.set_limit(limit.saturating_add(t.predicted));
        }
    }

    /// Forgets sessions idle past the configured timeout (call now and then, e.g. on a timer).
    pub fn expire_sessions(&mut self, now: u64) {
        if let Some(s) = &self.cfg.session {
            self.sessions.expire(now, s.idle_ns);
        }
    }

    pub fn is_quarantined(&self, i: usize, now: u64) -> bool {
        self.quarantine.is_quarantined(i, now)
    }
}

#[cfg(test)]
mod tests;
