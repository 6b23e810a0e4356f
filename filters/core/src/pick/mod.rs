//! Picking the pod of a `resolution: endpoint` backend inside the gateway: prefix (KV-cache)
//! affinity traded against load, sessions, quarantine. See docs/endpoint-picking.md.
//!
//! Everything here is plain state and arithmetic on caller-supplied time (host clock, ns), so the
//! same code runs in the filter, in native tests and in the simulation (`bench/picksim`). Pods
//! are indices into the configured list: a pick can only ever name a configured pod.
//!
//! The cost of sending a request to pod `p` is the prefill work the request would wait for
//! there: the uncached prompt bytes already in flight on `p`, a fixed cost per request running
//! or queued (their decode share), plus this request's own uncached bytes (its prompt minus the
//! longest prefix `p` was sent). The cheapest pod wins, except that every pod within
//! `spread_bytes` of the cheapest and holding at least its prefix is a candidate, and the
//! candidates are ranked by rendezvous hashing on the first block nobody is known to hold. So a prefix no pod holds goes to the
//! same pod from every gateway replica (bounded by load), and a prefix held somewhere goes
//! there unless that pod is loaded by more than the prefix saves.

pub mod blocks;
pub mod codec;
pub mod events;
pub mod load;
mod lone;
pub mod session;
mod start;
mod subset;
pub mod table;
pub mod usage;
mod weighted;
pub mod wire;

pub use blocks::{hash_prompt, prompt_parts, Prompt};
pub use load::{parse_vllm_metrics, EngineMetrics, PodLoad, Ticket};
pub use session::{session_key, Sessions};
pub use table::BlockTable;

use crate::quarantine::Quarantine;
use blocks::{fnv64, mix};
use lone::Move;

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

fn nonzero_or(v: u64, otherwise: u64) -> u64 {
    if v == 0 {
        otherwise
    } else {
        v
    }
}

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
    pub quarantine_ns: u64,
    /// In-flight counts older than this stop counting (a lost release cannot leak for ever).
    pub lease_ns: u64,
    /// Work one more request in flight or queued costs a pod, in prompt bytes (its decode share).
    pub request_cost_bytes: u64,
    /// Load differences below this are treated as equal, so replicas with slightly different
    /// views still rank the same pod first.
    pub spread_bytes: u64,
    /// A prompt no pod holds is placed by consistent hashing among the pods loaded at most this
    /// percentage of the mean load (plus one request).
    pub unseen_load_percent: u64,
    /// Bounded load on prefill work: a pod that was recently sent more than this percentage of
    /// the mean recent uncached prompt bytes (plus this prompt) takes no new prefix, so misses
    /// spread instead of piling onto the pods that own the most prefixes. 0 turns it off.
    pub balance_percent: u64,
    /// A pod recently sent more than this percentage of the mean prefill work (plus this
    /// prompt) also sheds known prefixes to the next-best pod (the prefix is then replicated
    /// there, on the pod every replica ranks next). 0: a known prefix stays while the load
    /// allows. Looser than `balance_percent`: a copy costs a whole prefill and cache room.
    pub known_balance_percent: u64,
    /// Correct the recent prefill work by what the engine reports it computed
    /// (`usage.prompt_tokens` minus `cached_tokens`) when a request ends, instead of keeping
    /// the pick's prediction: a pod whose cache thrashes then shows the prefill it really did,
    /// and a prefix another replica had already put there stops counting as this one's.
    pub recent_from_usage: bool,
    /// Half-life of the recent prefill work.
    pub recent_half_life_ns: u64,
    /// `balance_percent` and `unseen_load_percent` while other gateways (replicas sharing
    /// nothing with this one) send to the same pods, as the engines' counters show (see
    /// [`Picker::others_send`]). A prompt new to this replica is then likely held by its
    /// rendezvous home already (another replica put it there when it was first seen), and a
    /// tight bound would place this replica's copy elsewhere, so the bounds are looser. 0 (for
    /// each of the three `shared_*`): the lone-gateway setting.
    pub shared_balance_percent: u64,
    pub shared_unseen_load_percent: u64,
    /// `known_balance_percent` (when that is on) while other gateways send to the same pods:
    /// a replica that sheds a prefix it holds copies it where the other replicas, which did not
    /// shed it, will not look, so among replicas it sheds only well past the bound.
    pub shared_known_balance_percent: u64,
    /// A lone gateway (the engines' counters show no other: [`Company::Alone`]) places a
    /// conversation it starts (a prompt no pod holds a block of, a new or moving session) on
    /// the pod with the least work to come (recent prefill plus `start_cost_bytes` per
    /// conversation recently started there) among those within the load bound, instead of by
    /// rendezvous among those under `balance_percent`: the turns to come are the work that
    /// piles up where chats were placed, and a lone gateway has no replica to agree with.
    /// Needs `balance_percent` on; while others send, or with no counters, rendezvous as before.
    pub lone_least_work: bool,
    /// Half-life of the conversations started per pod (what a lone gateway places new ones by):
    /// about a chat's life, so an ended chat stops counting and a live one still does.
    pub start_half_life_ns: u64,
    /// Prefill bytes still to come that a lone gateway counts for each conversation recently
    /// started on a pod (`lone_least_work`). 0: recent prefill alone.
    pub start_cost_bytes: u64,
    /// Half-life of the long memory of prefill work per pod (`PodLoad::total`) that a lone
    /// gateway adds to the work to come when it places or moves a conversation: chats grow on
    /// the pod where they started, so what a pod has computed for its chats so far says where
    /// their later turns (and the next chat's) will pile up. 0: recent prefill only.
    pub lone_total_half_life_ns: u64,
    /// A lone gateway moves a conversation (a session, or a prompt whose prefix a pod holds)
    /// off its pod when that pod's work to come exceeds this percentage of the mean and the
    /// lightest pod would stay lighter even after re-prefilling what the move leaves behind
    /// (see `lone.rs`). 0: conversations stay (sessions move only when their pod queues).
    pub lone_move_percent: u64,
    /// At most this many bytes of re-prefill per move (what the old pod holds of the request
    /// beyond what the new one holds). 0: no bound.
    pub lone_move_max_bytes: u64,
    /// A move goes to the pod where it adds the least work after the re-prefill (so a pod that
    /// already holds part of the prefix, an agent's tool set, is preferred), and the re-prefill
    /// charged is what that pod lacks. Off: the pod with the least work to come, charged all
    /// that the old pod held.
    pub lone_move_reuse: bool,
    /// This gateway reads itself alone only once the engines' counters said so at two
    /// consecutive scrapes of one pod (see [`Picker::company`]). In the first seconds a
    /// replica's own picks not yet in the engines' counters can make one scrape read a share
    /// above the line, and a replica that reads "alone" places a new prompt by its own least
    /// work instead of by rendezvous, where the other replicas would not look. On by default
    /// since 2026-12-06 (with `engine_count_when_waiting` it raised the simulated 3-replica
    /// ratio when replicas scrape far apart; docs/endpoint-picking.md, "Why Envoy reads lower
    /// than the simulation"). Off: alone from the first scrape that says so.
    pub confirm_alone: bool,
    /// The engine's request count (`running + waiting`) enters a pod's load only while the
    /// engine reports requests waiting (queueing, which other replicas' traffic may cause);
    /// otherwise this gateway's own count. Off: the larger of the two whenever fresh.
    pub engine_count_when_waiting: bool,
    /// While others send, a request without a session that has whole blocks of tools or a
    /// top-level system prompt and an own block after them, and of which this gateway knows no
    /// more than that head (a conversation starting on a known tool set, or one whose earlier
    /// steps other replicas sent), goes to one of this percentage of the pods (rounded up): the
    /// first pods by rendezvous on its first block, among which it is ranked by rendezvous on
    /// its first own block and the engines' computed prompt (see `start.rs`). So a loop's
    /// steps sent by different replicas land together and loops spread. 0: such a request goes
    /// where its prefix is, and every loop of one tool set piles on that tool set's pod.
    pub shared_start_percent: u64,
    /// Among replicas, a prompt no pod holds a block of (in this gateway's tables) goes by
    /// rendezvous weighted `((mean + prior) / (own + prior)) ^ (this / 100)` by each pod's
    /// engine-computed recent prompt (`shared_weight_prior_bytes`), within the load bound, in place of the prefill-work bound read from this
    /// gateway's own sends (see `weighted.rs`). 0: off.
    pub shared_unseen_weight_percent: u64,
    /// Bytes of prefill every pod is taken to have done on top of what its engine reports, so
    /// the first few prompts' noise does not swing the weights (and move the homes of the
    /// prefixes placed so far).
    pub shared_weight_prior_bytes: u64,
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
            lease_ns: load::DEFAULT_LEASE_NS,
            request_cost_bytes: 1024,
            spread_bytes: 4096,
            unseen_load_percent: 110,
            balance_percent: 110,
            known_balance_percent: 130,
            recent_from_usage: true,
            recent_half_life_ns: 10_000_000_000,
            shared_balance_percent: 130,
            shared_unseen_load_percent: 110,
            shared_known_balance_percent: 200,
            lone_least_work: true,
            start_half_life_ns: 30_000_000_000,
            start_cost_bytes: 4096,
            lone_total_half_life_ns: 300_000_000_000,
            lone_move_percent: 120,
            lone_move_max_bytes: 18_432,
            lone_move_reuse: true,
            confirm_alone: true,
            engine_count_when_waiting: true,
            shared_start_percent: 50,
            shared_unseen_weight_percent: 150,
            shared_weight_prior_bytes: 65_536,
            metrics_max_age_ns: 5_000_000_000,
            seed: 0,
        }
    }
}

/// Whether other gateways (replicas sharing nothing with this one) send to the same pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Company {
    /// No basis to tell: no fresh counters from the engines, too little work yet, or the
    /// prefill work is predicted (`recent_from_usage` off).
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
    /// time), and whether a pod's later scrape read it alone again (`confirm_alone`). Updated
    /// only on scrapes, which every worker applies alike.
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
        now / (self.cfg.lease_ns / (load::BUCKETS as u64 - 1)).max(1)
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
            Some(m) if self.cfg.engine_count_when_waiting && m.waiting <= 0.0 => own,
            Some(m) => own.max((m.running + m.waiting).min(1e9) as u64),
        };
        l.work(e)
            .saturating_add(requests.saturating_mul(self.cfg.request_cost_bytes))
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
        let prompt_bytes = req.prompt.bytes as u64;
        if self.cfg.mode == Mode::RoundRobin {
            for _ in 0..n {
                let i = (self.cursor % n as u64) as usize;
                self.cursor = self.cursor.wrapping_add(1);
                if self.eligible(i, now, req.avoid) {
                    return Choice::Pod(self.charge(i, prompt_bytes, 0, req.prompt, false, now));
                }
            }
            return Choice::NoEligiblePod;
        }
        let block = self.block_bytes().unwrap_or(0) as u64;
        let blocks: &[u64] = if block > 0 { &req.prompt.blocks } else { &[] };
        let matched: Vec<usize> = (0..n)
            .map(|i| self.tables[i].matched_prefix(blocks))
            .collect();
        // The bytes of this prompt each pod holds.
        let cached: Vec<u64> = matched
            .iter()
            .map(|&m| (m as u64 * block).min(prompt_bytes))
            .collect();
        let cost = |p: &Picker, i: usize| {
            p.load_bytes(i, now)
                .saturating_add(prompt_bytes - cached[i])
        };

        let company = self.company(now);
        let lone = self.cfg.lone_least_work
            && self.cfg.balance_percent > 0
            && block > 0
            && company == Company::Alone;

        // A live session stays on its pod unless that pod is queuing and clearly busier (or,
        // for a lone gateway, was sent clearly more prefill work than the mean).
        let idle = self.cfg.session.as_ref().map(|s| s.idle_ns);
        let key = req.session.filter(|_| idle.is_some());
        let mut leaving = None;
        // Where a lone gateway's move goes, when it names the pod (see `lone.rs`).
        let mut moved_to = None;
        if let (Some(k), Some(idle)) = (key, idle) {
            if let Some(b) = self.sessions.get(k, now, idle).map(usize::from) {
                if b < n && self.eligible(b, now, req.avoid) {
                    let least = (0..n)
                        .filter(|&i| i != b && self.eligible(i, now, req.avoid))
                        .map(|i| self.load_bytes(i, now))
                        .min();
                    let busier = least.is_some_and(|m| {
                        self.load_bytes(b, now)
                            > m.saturating_mul(2)
                                .saturating_add(self.cfg.request_cost_bytes)
                    });
                    let verdict = match lone {
                        true => self.lone_move(b, &cached, req.avoid, now),
                        false => Move::Stay,
                    };
                    if let Move::To(t) = verdict {
                        moved_to = Some(t);
                    }
                    if verdict != Move::Stay {
                        leaving = Some(b);
                    } else if !(busier && self.queuing(b, now)) {
                        return Choice::Pod(self.charge_at(b, &matched, req, k, false, now));
                    }
                }
            }
        }

        let shared = company == Company::Others;
        let (balance, unseen_percent) = match shared {
            true => (
                nonzero_or(self.cfg.shared_balance_percent, self.cfg.balance_percent),
                nonzero_or(
                    self.cfg.shared_unseen_load_percent,
                    self.cfg.unseen_load_percent,
                ),
            ),
            false => (self.cfg.balance_percent, self.cfg.unseen_load_percent),
        };
        let over = self.over_balance(balance, prompt_bytes, now, req.avoid);
        let shed = match shared {
            true if self.cfg.known_balance_percent > 0 => nonzero_or(
                self.cfg.shared_known_balance_percent,
                self.cfg.known_balance_percent,
            ),
            _ => self.cfg.known_balance_percent,
        };
        let over_known = if shed > 0 && block > 0 {
            self.over_balance(shed, prompt_bytes, now, req.avoid)
        } else {
            vec![false; n]
        };
        let mut costs: Vec<u64> = (0..n)
            .map(|i| {
                if !self.eligible(i, now, req.avoid) || over_known[i] {
                    u64::MAX
                } else {
                    cost(self, i)
                }
            })
            .collect();
        if costs.iter().all(|&c| c == u64::MAX) {
            // Every eligible pod over the bound (cannot happen: the least sent is under it).
            for (i, c) in costs.iter_mut().enumerate() {
                if self.eligible(i, now, req.avoid) {
                    *c = cost(self, i);
                }
            }
        }
        let best = costs.iter().copied().min().unwrap_or(u64::MAX);
        let spread = if block > 0 { self.cfg.spread_bytes } else { 0 };
        let known = matched.iter().copied().max().unwrap_or(0);
        let best_match = (0..n)
            .filter(|&i| costs[i] == best)
            .map(|i| matched[i])
            .max()
            .unwrap_or(0);
        // Rank the near-cheapest by rendezvous on the first block the cheapest pod does not
        // hold: a prefix spilled off its loaded pod then spills to the same pod from every
        // replica. With no whole block, a rotating counter (nothing to be consistent about). A
        // session ranks by its own key, so every replica starts it on the same pod.
        let rank_key = match (key, blocks.get(best_match).or(blocks.last())) {
            (Some(k), _) => k,
            (None, Some(&h)) => h,
            (None, None) => {
                self.cursor = self.cursor.wrapping_add(1);
                mix(self.cursor)
            }
        };
        // A prompt no pod holds a block of: consistent hashing with bounded load, every pod
        // not loaded past `unseen_load_percent` of the mean a candidate. The bound is loose on
        // purpose: replicas see different loads, and only a loose bound lets them agree.
        let unseen = block > 0 && known == 0 && !blocks.is_empty();
        let bound = unseen.then(|| self.load_bound(&costs, None, unseen_percent, now));
        let fits = |i: usize, b: u64| self.load_bytes(i, now) <= b;
        // The candidate with the highest rendezvous weight.
        let rank = |candidate: &dyn Fn(usize, u64) -> bool| {
            let mut chosen: Option<(u64, usize)> = None;
            for (i, &c) in costs.iter().enumerate() {
                if c == u64::MAX || !candidate(i, c) {
                    continue;
                }
                let w = mix(rank_key ^ self.pods[i].id);
                if chosen.is_none_or(|(top, _)| w > top) {
                    chosen = Some((w, i));
                }
            }
            chosen.map(|(_, i)| i)
        };
        // Among replicas, a prompt new here: rendezvous weighted by the engines' prefill in
        // place of this gateway's own prefill bound (see `weighted.rs`).
        let weighted_rank = |w: &[f64], b: u64| {
            (0..n)
                .filter(|&i| costs[i] != u64::MAX && fits(i, b))
                .max_by(|&x, &y| {
                    let s = |i: usize| weighted::score(rank_key, self.pods[i].id, w[i]);
                    s(x).total_cmp(&s(y))
                })
        };
        // A lone gateway moves a conversation whose prefix a pod holds off that pod when it
        // has far more work to come than the others (see `lone.rs`).
        if lone && leaving.is_none() && known > 0 {
            let home = (0..n)
                .filter(|&i| matched[i] == known && costs[i] != u64::MAX)
                .min_by_key(|&i| costs[i]);
            if let Some(h) = home {
                match self.lone_move(h, &cached, req.avoid, now) {
                    Move::Stay => {}
                    Move::To(t) => (leaving, moved_to) = (Some(h), Some(t)),
                    Move::Away => leaving = Some(h),
                }
            }
        }
        // A lone gateway starting a conversation (or moving a session off a pod with too
        // much prefill work): the least work to come within the load bound.
        let lone_pick = match lone && (known == 0 || leaving.is_some()) {
            true if moved_to.is_some() => moved_to,
            true => self.least_work(&costs, leaving, unseen_percent, rank_key, now),
            false => None,
        };
        // Among replicas, a conversation starting on a known tool set: by its own first block
        // among the tool set's first pods, alike at every replica (see `start.rs`).
        let start_pick = match shared && key.is_none() && leaving.is_none() {
            true => self.start_on_known_prefix(req, &matched, &costs, now),
            false => None,
        };
        let chosen = match bound {
            _ if lone_pick.is_some() => lone_pick,
            _ if start_pick.is_some() => start_pick,
            // Within the load bound and the prefill-work bound; if the two leave no pod in
            // common, the load bound alone.
            Some(b) => match self.placement_weights(shared, &costs, now) {
                Some(w) => weighted_rank(&w, b),
                None => rank(&|i, _| fits(i, b) && !over[i]).or_else(|| rank(&|i, _| fits(i, b))),
            },
            // Near-cheapest pods holding at least the cheapest pod's prefix: a pod holding less
            // is never picked over it for the sake of consistency.
            None => rank(&|i, c| c <= best.saturating_add(spread) && matched[i] >= best_match),
        };
        let Some(i) = chosen else {
            return Choice::NoEligiblePod;
        };
        match key {
            // A new session, or one that moves, starts its conversation here.
            Some(k) => Choice::Pod(self.charge_at(i, &matched, req, k, true, now)),
            None => {
                let work = prompt_bytes - cached[i];
                let start = (known == 0 || leaving.is_some()) && block > 0;
                Choice::Pod(self.charge(i, work, matched[i], req.prompt, start, now))
            }
        }
    }

    /// The eligible pod (not `leaving`, not already excluded in `costs`) with the least work to
    /// come among those loaded at most `percent` of the mean load plus one request: its recent
    /// prefill plus `start_cost_bytes` for each conversation recently started there (a chat
    /// grows turn by turn where it was placed; its first turn alone says little of that).
    /// Ties by rendezvous on `rank_key`.
    fn least_work(
        &self,
        costs: &[u64],
        leaving: Option<usize>,
        percent: u64,
        rank_key: u64,
        now: u64,
    ) -> Option<usize> {
        let live = |i: &usize| costs[*i] != u64::MAX && Some(*i) != leaving;
        let bound = self.load_bound(costs, leaving, percent, now);
        (0..self.pods.len())
            .filter(live)
            .filter(|&i| self.load_bytes(i, now) <= bound)
            .min_by(|&a, &b| {
                let k = |i: usize| self.work_to_come(i, now);
                k(a).total_cmp(&k(b)).then_with(|| {
                    // Higher rendezvous weight first.
                    mix(rank_key ^ self.pods[b].id).cmp(&mix(rank_key ^ self.pods[a].id))
                })
            })
    }

    /// `percent` of the mean load of the pods still in `costs` (but `leaving`), plus one
    /// request: the bounded load of consistent hashing, and of a lone gateway's placement.
    fn load_bound(&self, costs: &[u64], leaving: Option<usize>, percent: u64, now: u64) -> u64 {
        let live: Vec<u64> = (0..self.pods.len())
            .filter(|&i| costs[i] != u64::MAX && Some(i) != leaving)
            .map(|i| self.load_bytes(i, now))
            .collect();
        let mean = live.iter().sum::<u64>() / live.len().max(1) as u64;
        (mean as u128 * percent as u128 / 100) as u64 + self.cfg.request_cost_bytes
    }

    fn charge_at(
        &mut self,
        i: usize,
        matched: &[usize],
        req: &Request<'_>,
        key: u64,
        start: bool,
        now: u64,
    ) -> Ticket {
        let block = self.block_bytes().unwrap_or(0) as u64;
        self.sessions.bind(key, i as u16, now);
        let bytes = req.prompt.bytes as u64;
        let cached = (matched[i] as u64 * block).min(bytes);
        self.charge(i, bytes - cached, matched[i], req.prompt, start, now)
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
    /// "Alone" needs the reading to have held over two consecutive scrapes of a pod
    /// (`confirm_alone`); until then the verdict is `Unknown`, which places as before the
    /// evidence (by rendezvous), so a replica misled by one scrape agrees with the others.
    pub fn company(&self, now: u64) -> Company {
        match self.reading(now) {
            Company::Alone if self.cfg.confirm_alone && !self.alone_confirmed => Company::Unknown,
            c => c,
        }
    }

    /// What the counters say at `now`, with no regard to earlier scrapes.
    pub(crate) fn reading(&self, now: u64) -> Company {
        if !self.cfg.recent_from_usage {
            // Predicted work undercounts wherever the cache thrashes: no basis to compare.
            return Company::Unknown;
        }
        let h = self.cfg.recent_half_life_ns;
        let max_age = self.cfg.metrics_max_age_ns;
        let (mut own, mut engines) = (0.0, 0.0);
        for l in &self.loads {
            if let (Some(c), Some(_)) = (l.scrape.computed, l.fresh_metrics(now, max_age)) {
                own += l.recent.at(now, h);
                engines += c.at(now, h);
            }
        }
        // A minimum of engine work so that a few requests' rounding decide nothing.
        if engines < MIN_ALONE_EVIDENCE_BYTES {
            return Company::Unknown;
        }
        // `engines` is the engines' tokens at BYTES_PER_TOKEN each; `own` this gateway's bytes.
        let own_tokens = own / self.bytes_per_token();
        let engine_tokens = engines / load::BYTES_PER_TOKEN;
        if own_tokens >= OWN_SHARE_ALONE * engine_tokens {
            Company::Alone
        } else if engines >= MIN_SHARED_EVIDENCE_BYTES {
            Company::Others
        } else {
            Company::Unknown
        }
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
        start: bool,
        now: u64,
    ) -> Ticket {
        let epoch = self.epoch(now);
        self.loads[i].acquire(epoch, work);
        self.loads[i].sent(now, work, self.cfg.recent_half_life_ns);
        self.loads[i].sent_total(now, work, self.cfg.lone_total_half_life_ns);
        if start {
            self.loads[i].started(now, self.cfg.start_half_life_ns);
        }
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
            start,
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
                    if self.cfg.recent_from_usage && p > 0 {
                        // The bytes the engine computed, in the prompt's bytes per token.
                        let computed = (p.saturating_sub(c) as u128 * t.prompt_bytes as u128
                            / p as u128) as f64;
                        let h = self.cfg.recent_half_life_ns;
                        l.recent.adjust(now, computed - t.work as f64, h);
                        let ht = self.cfg.lone_total_half_life_ns;
                        if ht > 0 {
                            l.total.adjust(now, computed - t.work as f64, ht);
                        }
                    }
                    if let Some(block) = self.block_bytes() {
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
