//! Work in flight per pod, and the engine's own gauges.
//!
//! In-flight work is counted by tickets: picking a pod returns a [`Ticket`] that is not `Clone`
//! and is consumed by release, so one request releases once. A filter keeps the ticket in its
//! stream context and releases it in its last callback (which the host calls on completion,
//! reset and client abort alike). If a release is still lost (a worker restarts with the
//! counters in shared data), the count expires anyway: every acquisition lands in a time bucket,
//! and buckets older than the in-flight expiry stop counting. So a leak is bounded by the expiry, not
//! permanent.

// Buckets in the expiry ring.
pub const BUCKETS: usize = 8;

/// Default in-flight expiry: longer than any sane request (the default stream idle guard is 5 minutes).
pub const DEFAULT_IN_FLIGHT_EXPIRY_NS: u64 = 15 * 60 * 1_000_000_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub epoch: u64,
    pub requests: u32,
    /// Uncached prompt bytes still to prefill (as predicted when the pod was picked).
    pub work: u64,
}

/// What the engine says about itself (vLLM's gauges), and when it was read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineMetrics {
    pub waiting: f64,
    pub running: f64,
    /// KV-cache usage, 0..1.
    pub kv_usage: f64,
    /// Prompt tokens the engine computed since it started (vLLM's prefix-cache queries minus
    /// hits, both counters), when it reports both.
    pub computed_tokens: Option<f64>,
    /// The engine's KV-cache capacity in tokens (`vllm:cache_config_info`'s `num_gpu_blocks`
    /// times `block_size`), when it reports it.
    pub cache_tokens: Option<f64>,
    pub at_ns: u64,
}

/// Rendered prompt bytes per token, to compare the engine's token counters with prompt bytes.
pub const BYTES_PER_TOKEN: f64 = 4.0;

/// One pod's load.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodLoad {
    pub buckets: [Bucket; BUCKETS],
    pub metrics: Option<EngineMetrics>,
    /// Uncached prompt bytes sent here recently, decaying by half every half-life: the prefill
    /// share this pod has been given, which in-flight counts forget as soon as requests end.
    pub recent: Recent,
    /// This gateway's view since the engine's gauges were last read.
    pub scrape: SinceScrape,
}

/// What every gateway replica sees alike (the engine's own counts, scraped), and this
/// gateway's in-flight count at that moment (to move the engine's count by what it did since). Other replicas' traffic shows only in the engine's counts, so a pick that
/// weighs these agrees across replicas that share nothing but the pods.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SinceScrape {
    /// Requests in flight from here when the gauges were applied.
    pub requests_then: u32,
    /// Prompt bytes the engine computed (from every replica), decaying like `recent`; known
    /// once two scrapes reported the counters.
    pub computed: Option<Recent>,
}

/// An exponentially decaying sum.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Recent {
    pub value: f64,
    pub at_ns: u64,
}

impl Recent {
    /// The sum at `now` (an earlier `now`, e.g. another worker's event, is taken as `at_ns`).
    pub fn at(&self, now: u64, half_life_ns: u64) -> f64 {
        let dt = now.saturating_sub(self.at_ns) as f64;
        self.value * (-(dt / half_life_ns.max(1) as f64) * std::f64::consts::LN_2).exp()
    }

    /// Moves the sum by `delta` bytes (either way; it never goes below 0).
    pub fn adjust(&mut self, now: u64, delta: f64, half_life_ns: u64) {
        let now = now.max(self.at_ns);
        self.value = (self.at(now, half_life_ns) + delta).max(0.0);
        self.at_ns = now;
    }

    pub fn add(&mut self, now: u64, bytes: u64, half_life_ns: u64) {
        let now = now.max(self.at_ns);
        self.value = self.at(now, half_life_ns) + bytes as f64;
        self.at_ns = now;
    }
}

/// Proof that a request holds load on a pod. Release it exactly once
/// ([`crate::pick::Picker::release`]); it carries what the release needs to check the
/// prefix table's prediction.
#[must_use = "a ticket must be released when the request ends"]
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    pub(crate) pod: u16,
    pub(crate) epoch: u64,
    pub(crate) work: u64,
    /// The prompt's size, for the `cached_tokens` correction.
    pub(crate) prompt_bytes: usize,
    /// Blocks the table predicted cached on this pod.
    pub(crate) predicted: usize,
}

impl Ticket {
    pub fn pod(&self) -> usize {
        self.pod as usize
    }
    /// Prompt bytes the pick expected the pod to prefill.
    pub fn predicted_uncached_bytes(&self) -> u64 {
        self.work
    }
}

impl PodLoad {
    fn live(&self, now_epoch: u64) -> impl Iterator<Item = &Bucket> {
        self.buckets
            .iter()
            .filter(move |b| b.epoch <= now_epoch && now_epoch - b.epoch < BUCKETS as u64)
    }

    /// Requests in flight on this pod that this state knows of.
    pub fn requests(&self, now_epoch: u64) -> u32 {
        self.live(now_epoch)
            .fold(0u32, |a, b| a.saturating_add(b.requests))
    }

    /// Uncached prompt bytes in flight.
    pub fn work(&self, now_epoch: u64) -> u64 {
        self.live(now_epoch)
            .fold(0u64, |a, b| a.saturating_add(b.work))
    }

    pub(crate) fn acquire(&mut self, epoch: u64, work: u64) {
        let b = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        if b.epoch != epoch {
            *b = Bucket {
                epoch,
                requests: 0,
                work: 0,
            };
        }
        b.requests = b.requests.saturating_add(1);
        b.work = b.work.saturating_add(work);
    }

    /// Counts `work` uncached bytes just sent here towards the recent prefill work.
    pub(crate) fn sent(&mut self, now: u64, work: u64, half_life_ns: u64) {
        self.recent.add(now, work, half_life_ns);
    }

    /// Takes the engine's gauges read at `m.at_ns` (`requests`: in flight from here now), and
    /// says whether it did.
    pub(crate) fn scraped(&mut self, m: EngineMetrics, requests: u32, half_life_ns: u64) -> bool {
        // A reading older than the one held (another worker's, delivered late) is no news.
        if self.metrics.is_some_and(|p| p.at_ns > m.at_ns) {
            return false;
        }
        let prev = self
            .metrics
            .and_then(|p| Some((p.computed_tokens?, p.at_ns)));
        self.scrape.computed = match (m.computed_tokens, prev) {
            (None, _) => None,
            (Some(c), Some((pc, at))) => {
                // A counter that went down is an engine restart: count what it did since.
                let delta = if c >= pc { c - pc } else { c };
                let mut r = self.scrape.computed.unwrap_or(Recent {
                    value: 0.0,
                    at_ns: at,
                });
                r.add(m.at_ns, (delta * BYTES_PER_TOKEN) as u64, half_life_ns);
                Some(r)
            }
            (Some(_), None) => self.scrape.computed,
        };
        self.scrape.requests_then = requests;
        self.metrics = Some(m);
        true
    }

    pub(crate) fn release(&mut self, epoch: u64, work: u64) {
        let b = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        // A bucket reused for a later epoch no longer holds this ticket's count.
        if b.epoch == epoch {
            b.requests = b.requests.saturating_sub(1);
            b.work = b.work.saturating_sub(work);
        }
    }

    /// The engine's gauges if read within `max_age_ns` of `now`.
    pub fn fresh_metrics(&self, now: u64, max_age_ns: u64) -> Option<EngineMetrics> {
        self.metrics
            .filter(|m| m.at_ns <= now && now - m.at_ns <= max_age_ns)
    }
}

/// Most bytes of a metrics page read: vLLM's page is tens of KiB; a bigger body is cut, and the
/// gauges come first in practice.
pub const MAX_METRICS_BYTES: usize = 1 << 20;

/// Reads vLLM's gauges from its Prometheus text page: `vllm:num_requests_waiting`,
/// `vllm:num_requests_running`, and `vllm:gpu_cache_usage_perc` (or its newer name
/// `vllm:kv_cache_usage_perc`), and the counters `vllm:prefix_cache_queries_total` and
/// `vllm:prefix_cache_hits_total` (their difference is the prompt tokens computed), and the KV-cache
/// capacity from the labels of `vllm:cache_config_info` (`num_gpu_blocks` × `block_size`). Series with
/// several label sets (one per model) are summed, the usage is the largest. `None` when neither
/// request gauge is present (not a vLLM page).
pub fn parse_vllm_metrics(text: &[u8], at_ns: u64) -> Option<EngineMetrics> {
    let text = &text[..text.len().min(MAX_METRICS_BYTES)];
    let mut m = EngineMetrics {
        at_ns,
        ..EngineMetrics::default()
    };
    let mut seen = false;
    let (mut queries, mut hits) = (None::<f64>, None::<f64>);
    for line in text.split(|&b| b == b'\n') {
        if line.first() == Some(&b'#') {
            continue;
        }
        let name_end = line
            .iter()
            .position(|&b| b == b'{' || b == b' ' || b == b'\t')
            .unwrap_or(line.len());
        let name = &line[..name_end];
        let which = match name {
            b"vllm:num_requests_waiting" => 0,
            b"vllm:num_requests_running" => 1,
            b"vllm:gpu_cache_usage_perc" | b"vllm:kv_cache_usage_perc" => 2,
            b"vllm:prefix_cache_queries_total" => 3,
            b"vllm:prefix_cache_hits_total" => 4,
            b"vllm:cache_config_info" => {
                let rest = &line[name_end..];
                if let (Some(n), Some(b)) = (
                    label_value(rest, b"num_gpu_blocks"),
                    label_value(rest, b"block_size"),
                ) {
                    m.cache_tokens = Some(n * b).filter(|c| c.is_finite() && *c > 0.0);
                }
                continue;
            }
            _ => continue,
        };
        let Some(v) = sample_value(&line[name_end..]) else {
            continue;
        };
        match which {
            0 => {
                m.waiting += v;
                seen = true;
            }
            1 => {
                m.running += v;
                seen = true;
            }
            2 => m.kv_usage = m.kv_usage.max(v.min(1.0)),
            3 => *queries.get_or_insert(0.0) += v,
            _ => *hits.get_or_insert(0.0) += v,
        }
    }
    if let (Some(q), Some(h)) = (queries, hits) {
        m.computed_tokens = Some((q - h).max(0.0));
    }
    seen.then_some(m)
}

/// The number in label `key="..."` of a sample line after its name (`{a="1",b="2"} 1`).
fn label_value(rest: &[u8], key: &[u8]) -> Option<f64> {
    let body = rest.strip_prefix(b"{")?;
    let end = body.iter().position(|&b| b == b'}')?;
    body[..end].split(|&b| b == b',').find_map(|pair| {
        let eq = pair.iter().position(|&b| b == b'=')?;
        if pair[..eq].trim_ascii() != key {
            return None;
        }
        let v = pair[eq + 1..].trim_ascii();
        let v = v.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\""))?;
        let v: f64 = std::str::from_utf8(v).ok()?.parse().ok()?;
        (v.is_finite() && v >= 0.0).then_some(v)
    })
}

/// The value of a sample line after its name: skip `{labels}` (quoted values may hold braces),
/// then the first number. Negative, NaN and infinite values are not load.
fn sample_value(rest: &[u8]) -> Option<f64> {
    let mut i = 0;
    if rest.first() == Some(&b'{') {
        let mut quoted = false;
        let mut escaped = false;
        i = 1;
        loop {
            let c = *rest.get(i)?;
            i += 1;
            if escaped {
                escaped = false;
            } else if quoted && c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                quoted = !quoted;
            } else if c == b'}' && !quoted {
                break;
            }
        }
    }
    let s = std::str::from_utf8(&rest[i..]).ok()?;
    let v: f64 = s.split_whitespace().next()?.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_undo_acquisitions_and_leaks_expire() {
        let mut l = PodLoad::default();
        l.acquire(10, 500);
        l.acquire(10, 100);
        l.acquire(11, 50);
        assert_eq!((l.requests(11), l.work(11)), (3, 650));
        l.release(10, 100);
        assert_eq!((l.requests(11), l.work(11)), (2, 550));
        // Never released: gone once its bucket leaves the lease.
        assert_eq!(l.requests(10 + BUCKETS as u64 - 1), 2);
        assert_eq!(l.requests(10 + BUCKETS as u64), 1);
        assert_eq!(l.requests(11 + BUCKETS as u64), 0);
        // A release after the bucket was reused for a later epoch changes nothing.
        l.acquire(19, 7);
        l.release(11, 50);
        assert_eq!((l.requests(19), l.work(19)), (1, 7));
        // Over-release saturates.
        l.release(19, 7);
        l.release(19, 7);
        assert_eq!((l.requests(19), l.work(19)), (0, 0));
    }

    #[test]
    fn parses_vllm_gauges() {
        let page = b"# HELP vllm:num_requests_running Number of requests running.\n\
# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"qwen\"} 3.0\n\
vllm:num_requests_running{engine=\"1\",model_name=\"we}ird \\\"x\"} 1\n\
vllm:num_requests_waiting{model_name=\"qwen\"} 2\n\
vllm:gpu_cache_usage_perc{model_name=\"qwen\"} 0.42\n\
vllm:num_requests_waiting_total 99\n\
vllm:prompt_tokens_total 12345\n";
        let m = parse_vllm_metrics(page, 5).unwrap();
        assert_eq!(
            (m.running, m.waiting, m.kv_usage, m.at_ns),
            (4.0, 2.0, 0.42, 5)
        );
        let newer =
            b"vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc{a=\"b\"} 0.9 1700000000\n";
        let m = parse_vllm_metrics(newer, 0).unwrap();
        assert_eq!((m.waiting, m.kv_usage), (0.0, 0.9));
        assert_eq!(parse_vllm_metrics(b"up 1\n", 0), None);
        assert_eq!(parse_vllm_metrics(b"", 0), None);
        let bad = b"vllm:num_requests_waiting{x=\"unterminated 5\nvllm:num_requests_running NaN\nvllm:num_requests_running -3\nvllm:num_requests_running 2\n";
        let m = parse_vllm_metrics(bad, 0).unwrap();
        assert_eq!((m.waiting, m.running), (0.0, 2.0));
    }

    #[test]
    fn cache_capacity_is_num_gpu_blocks_times_block_size() {
        let page = b"vllm:num_requests_running 0\n\
vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"2048\"} 1.0\n";
        assert_eq!(
            parse_vllm_metrics(page, 0).unwrap().cache_tokens,
            Some(32768.0)
        );
        // Missing or unreadable labels: not reported.
        for bad in [
            &b"vllm:num_requests_running 0\nvllm:cache_config_info{block_size=\"16\"} 1.0\n"[..],
            b"vllm:num_requests_running 0\nvllm:cache_config_info{block_size=\"x\",num_gpu_blocks=\"9\"} 1\n",
            b"vllm:num_requests_running 0\nvllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"0\"} 1\n",
            b"vllm:num_requests_running 0\nvllm:cache_config_info 1\n",
        ] {
            assert_eq!(parse_vllm_metrics(bad, 0).unwrap().cache_tokens, None);
        }
    }

    #[test]
    fn computed_tokens_are_prefix_cache_queries_minus_hits() {
        let page = b"vllm:num_requests_running 1\n\
vllm:prefix_cache_queries_total{model_name=\"a\"} 900\n\
vllm:prefix_cache_queries_total{model_name=\"b\"} 100\n\
vllm:prefix_cache_hits_total{model_name=\"a\"} 600\n";
        let m = parse_vllm_metrics(page, 0).unwrap();
        assert_eq!(m.computed_tokens, Some(400.0));
        let no_hits = b"vllm:num_requests_running 1\nvllm:prefix_cache_queries_total 9\n";
        assert_eq!(
            parse_vllm_metrics(no_hits, 0).unwrap().computed_tokens,
            None
        );
    }

    #[test]
    fn scrapes_turn_counter_deltas_into_recent_computed_work() {
        let h = 1_000;
        let at = |c: f64, t: u64| EngineMetrics {
            computed_tokens: Some(c),
            at_ns: t,
            ..EngineMetrics::default()
        };
        let mut l = PodLoad::default();
        l.sent(0, 500, h);
        l.scraped(at(100.0, 10), 2, h);
        assert_eq!(l.scrape.computed, None, "one reading is no rate yet");
        assert_eq!(l.scrape.requests_then, 2);
        l.scraped(at(150.0, 10 + h), 1, h);
        let c = l.scrape.computed.unwrap();
        assert_eq!(c.at(10 + h, h), 50.0 * BYTES_PER_TOKEN);
        // A restarted engine counts from zero: what it did since is the delta.
        l.scraped(at(30.0, 10 + 2 * h), 1, h);
        let c = l.scrape.computed.unwrap().at(10 + 2 * h, h);
        assert_eq!(c, 100.0 + 30.0 * BYTES_PER_TOKEN);
        // An older reading (another worker's, late) changes nothing; no counters forget them.
        let before = l.clone();
        l.scraped(at(999.0, 5), 0, h);
        assert_eq!(l, before);
        l.scraped(
            EngineMetrics {
                at_ns: 10 + 3 * h,
                ..EngineMetrics::default()
            },
            1,
            h,
        );
        assert_eq!(l.scrape.computed, None);
    }

    #[test]
    fn metrics_go_stale() {
        let l = PodLoad {
            metrics: parse_vllm_metrics(b"vllm:num_requests_waiting 4\n", 1_000),
            ..PodLoad::default()
        };
        assert!(l.fresh_metrics(1_500, 600).is_some());
        assert!(l.fresh_metrics(1_700, 600).is_none());
        assert!(l.fresh_metrics(999, 600).is_none(), "from the future");
    }
}
