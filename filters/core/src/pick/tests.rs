use super::*;

const S: u64 = 1_000_000_000;

fn pods(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.0.0.{}:8000", i + 1)).collect()
}

fn prompt(text: &str, block: usize) -> Prompt {
    let mut p = Prompt::default();
    hash_prompt(&[text.as_bytes()], block, 0, &mut p);
    p
}

fn req(p: &Prompt) -> Request<'_> {
    Request {
        prompt: p,
        session: None,
        avoid: None,
    }
}

fn pod(c: Choice) -> Ticket {
    match c {
        Choice::Pod(t) => t,
        Choice::NoEligiblePod => panic!("no eligible pod"),
    }
}

fn done() -> Outcome {
    Outcome::Done {
        prompt_tokens: None,
        cached_tokens: None,
    }
}

fn cfg() -> Config {
    Config {
        prefix: Some(PrefixAffinity {
            block_bytes: 256,
            max_blocks_per_endpoint: 1024,
        }),
        ..Config::default()
    }
}

fn text(tag: &str, bytes: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!("{tag} word {i}; "));
        i += 1;
    }
    s
}

#[test]
fn round_robin_cycles_and_ignores_affinity() {
    let c = Config {
        mode: Mode::RoundRobin,
        session: Some(SessionAffinity {
            headers: vec!["x-session".into()],
            idle_ns: 60 * S,
        }),
        ..cfg()
    };
    let mut p = Picker::new(c, &pods(3));
    let pr = prompt(&text("a", 2000), 256);
    let r = Request {
        session: Some(5),
        ..req(&pr)
    };
    let got: Vec<usize> = (0..6)
        .map(|_| {
            let t = pod(p.pick(&r, 0));
            let i = t.pod();
            p.release(t, done(), 0);
            i
        })
        .collect();
    assert_eq!(got, vec![0, 1, 2, 0, 1, 2]);
    assert!(p.table(0).unwrap().is_empty(), "nothing remembered");
    assert!(p.table(0).unwrap().heap_bytes() <= 64, "no table memory");
}

#[test]
fn least_loaded_without_prefix_affinity() {
    let c = Config {
        prefix: None,
        ..cfg()
    };
    let mut p = Picker::new(c, &pods(3));
    let pr = prompt(&text("a", 2000), 256);
    let t0 = pod(p.pick(&req(&pr), 0));
    let t1 = pod(p.pick(&req(&pr), 0));
    let t2 = pod(p.pick(&req(&pr), 0));
    let mut seen = vec![t0.pod(), t1.pod(), t2.pod()];
    seen.sort();
    assert_eq!(seen, vec![0, 1, 2], "each pod once");
    let freed = t1.pod();
    p.release(t1, done(), 0);
    let t = pod(p.pick(&req(&pr), 0));
    assert_eq!(t.pod(), freed);
    for t in [t0, t2, t] {
        p.release(t, done(), 0);
    }
    assert!((0..3).all(|i| p.load_bytes(i, 0) == 0), "no leak");
}

#[test]
fn a_prompt_returns_to_the_pod_holding_its_prefix() {
    let mut p = Picker::new(cfg(), &pods(4));
    let system = text("tenant-a system prompt", 8000);
    let first = prompt(&format!("{system} question one"), 256);
    let t = pod(p.pick(&req(&first), 0));
    let home = t.pod();
    p.release(t, done(), 0);
    for q in 0..10 {
        let pr = prompt(&format!("{system} another question {q}"), 256);
        let t = pod(p.pick(&req(&pr), S));
        assert_eq!(t.pod(), home, "question {q}");
        assert!(t.predicted_uncached_bytes() < 512);
        p.release(t, done(), S);
    }
}

#[test]
fn a_warm_pod_loses_to_an_idle_one_when_its_queue_outweighs_the_prefix() {
    let c = Config {
        // Load in flight only: the 30 KB held there would also put the warm pod past the
        // known-prefix bound on recent prefill work (tested on its own below).
        known_balance_percent: 0,
        ..cfg()
    };
    let mut p = Picker::new(c, &pods(2));
    let system = text("sys", 2000);
    let t = pod(p.pick(&req(&prompt(&system, 256)), 0));
    let home = t.pod();
    p.release(t, done(), 0);
    // Load the warm pod past the load bound with unrelated work.
    let mut held = Vec::new();
    for k in 0..=place::LOAD_SLACK_REQUESTS {
        let big = prompt(&text(&format!("other {k}"), 6000), 256);
        let only_home = Request {
            avoid: Some(1 - home),
            ..req(&big)
        };
        held.push(pod(p.pick(&only_home, 0)));
    }
    assert!(held.iter().all(|t| t.pod() == home));
    let t = pod(p.pick(&req(&prompt(&format!("{system} q"), 256)), 0));
    assert_ne!(t.pod(), home);
    p.release(t, done(), 0);
    // Unloaded again, the warm pod wins.
    for t in held {
        p.release(t, done(), 0);
    }
    let t = pod(p.pick(&req(&prompt(&format!("{system} q2"), 256)), 0));
    assert_eq!(t.pod(), home);
    p.release(t, done(), 0);
}

#[test]
fn unseen_prefixes_are_placed_alike_by_independent_replicas() {
    let mut a = Picker::new(cfg(), &pods(8));
    // Another replica, configured with the pods in another order.
    let mut order = pods(8);
    order.reverse();
    let mut b = Picker::new(cfg(), &order);
    let mut spread = [0usize; 8];
    for k in 0..64 {
        let pr = prompt(&text(&format!("tenant {k}"), 3000), 256);
        let ta = pod(a.pick(&req(&pr), 0));
        let tb = pod(b.pick(&req(&pr), 0));
        assert_eq!(a.address(ta.pod()), b.address(tb.pod()), "tenant {k}");
        spread[ta.pod()] += 1;
        a.release(ta, done(), 0);
        b.release(tb, done(), 0);
    }
    assert!(
        spread.iter().all(|&n| n >= 2),
        "rendezvous spreads: {spread:?}"
    );
}

#[test]
fn a_pick_is_always_a_configured_pod_and_none_left_says_so() {
    let c = Config {
        quarantine_ns: 10 * S,
        ..cfg()
    };
    let mut p = Picker::new(c, &pods(2));
    let pr = prompt("short", 256);
    for _ in 0..2 {
        for i in 0..2 {
            let t = pod(p.pick(
                &Request {
                    avoid: Some(1 - i),
                    ..req(&pr)
                },
                0,
            ));
            assert_eq!(t.pod(), i);
            assert!(p.address(t.pod()).is_some());
            p.release(t, Outcome::Failed, 0);
        }
    }
    assert!(p.is_quarantined(0, S) && p.is_quarantined(1, S));
    assert_eq!(p.pick(&req(&pr), S), Choice::NoEligiblePod);
    // The deadline passes: eligible again.
    assert!(matches!(p.pick(&req(&pr), 10 * S), Choice::Pod(_)));
    let mut empty = Picker::new(cfg(), &[]);
    assert_eq!(empty.pick(&req(&pr), 0), Choice::NoEligiblePod);
}

#[test]
fn two_failures_in_a_row_quarantine_and_a_success_resets_the_count() {
    let mut p = Picker::new(cfg(), &pods(2));
    let pr = prompt("x", 256);
    let on0 = |p: &mut Picker| {
        pod(p.pick(
            &Request {
                avoid: Some(1),
                ..req(&pr)
            },
            0,
        ))
    };
    let t = on0(&mut p);
    p.release(t, Outcome::Failed, 0);
    let t = on0(&mut p);
    p.release(t, done(), 0);
    let t = on0(&mut p);
    p.release(t, Outcome::Failed, 0);
    assert!(!p.is_quarantined(0, 0), "failures were not in a row");
    let t = on0(&mut p);
    p.release(t, Outcome::Aborted, 0);
    assert!(!p.is_quarantined(0, 0), "a client abort says nothing");
    let t = on0(&mut p);
    p.release(t, Outcome::Failed, 0);
    assert!(p.is_quarantined(0, 0));
    let t = pod(p.pick(&req(&pr), 0));
    assert_eq!(t.pod(), 1);
    p.release(t, Outcome::StreamIdle, 0);
    assert!(
        p.is_quarantined(1, 0),
        "a silent stream quarantines at once"
    );
}

fn sessions_cfg() -> Config {
    Config {
        prefix: None,
        session: Some(SessionAffinity {
            headers: vec!["x-session-id".into()],
            idle_ns: 60 * S,
        }),
        ..cfg()
    }
}

#[test]
fn a_session_stays_moves_only_when_its_pod_queues_and_is_clearly_busier_then_stays() {
    let mut p = Picker::new(sessions_cfg(), &pods(3));
    let pr = prompt("hello", 256);
    let s = Request {
        session: Some(42),
        ..req(&pr)
    };
    let other = req(&pr);
    // Busy pods 0 and 1 past the new-prompt bound: the new session goes to pod 2.
    let busy = Request {
        avoid: Some(2),
        ..other
    };
    let b: Vec<Ticket> = (0..4).map(|_| pod(p.pick(&busy, 0))).collect();
    let t = pod(p.pick(&s, 0));
    let home = t.pod();
    assert_eq!(home, 2);
    p.release(t, done(), 0);
    for t in b {
        p.release(t, done(), 0);
    }
    // Load on the session's pod without queuing (gauges say nothing waits): it stays.
    p.set_metrics(
        home,
        EngineMetrics {
            waiting: 0.0,
            running: 1.0,
            kv_usage: 0.5,
            computed_tokens: None,
            cache_tokens: None,
            at_ns: 0,
        },
    );
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(pod(p.pick(&Request { avoid: None, ..s }, 0)));
    }
    assert!(held.iter().all(|t| t.pod() == home));
    p.set_metrics(
        home,
        EngineMetrics {
            waiting: 0.0,
            running: 4.0,
            kv_usage: 0.5,
            computed_tokens: None,
            cache_tokens: None,
            at_ns: S,
        },
    );
    let t = pod(p.pick(&s, S));
    assert_eq!(t.pod(), home, "busy but not queuing");
    p.release(t, done(), S);
    // Queuing and clearly busier: it moves.
    p.set_metrics(
        home,
        EngineMetrics {
            waiting: 3.0,
            running: 4.0,
            kv_usage: 0.9,
            computed_tokens: None,
            cache_tokens: None,
            at_ns: S,
        },
    );
    let t = pod(p.pick(&s, S));
    let moved = t.pod();
    assert_ne!(moved, home);
    p.release(t, done(), S);
    // And it stays where it moved, even once the old pod is idle again.
    for t in held.drain(..) {
        p.release(t, done(), S);
    }
    p.set_metrics(
        home,
        EngineMetrics {
            at_ns: 2 * S,
            ..EngineMetrics::default()
        },
    );
    let t = pod(p.pick(&s, 2 * S));
    assert_eq!(t.pod(), moved);
    p.release(t, done(), 2 * S);
    // Idle past the timeout: placed by load again (and rebound).
    let busy = pod(p.pick(
        &Request {
            avoid: Some(home),
            ..other
        },
        70 * S,
    ));
    let t = pod(p.pick(&s, 100 * S));
    assert_ne!(t.pod(), busy.pod());
    p.release(t, done(), 100 * S);
    p.release(busy, done(), 100 * S);
}

#[test]
fn cached_tokens_correct_the_table_bound() {
    let c = Config {
        prefix: Some(PrefixAffinity {
            block_bytes: 256,
            max_blocks_per_endpoint: 4096,
        }),
        ..cfg()
    };
    let mut p = Picker::new(c, &pods(1));
    let pr = prompt(&text("sys", 4096), 256);
    let t = pod(p.pick(&req(&pr), 0));
    p.release(t, done(), 0);
    let t = pod(p.pick(&req(&pr), 0));
    assert_eq!(t.predicted, 16);
    // The engine had none of it: its cache is smaller than the table thinks.
    p.release(
        t,
        Outcome::Done {
            prompt_tokens: Some(1000),
            cached_tokens: Some(0),
        },
        0,
    );
    assert_eq!(p.table(0).unwrap().limit(), 3072);
    let t = pod(p.pick(&req(&pr), 0));
    p.release(
        t,
        Outcome::Done {
            prompt_tokens: Some(1000),
            cached_tokens: Some(1000),
        },
        0,
    );
    assert_eq!(p.table(0).unwrap().limit(), 3072 + 16);
    // Repeated contradictions stop at the floor.
    for _ in 0..100 {
        let t = pod(p.pick(&req(&pr), 0));
        p.release(
            t,
            Outcome::Done {
                prompt_tokens: Some(1000),
                cached_tokens: Some(0),
            },
            0,
        );
    }
    assert_eq!(p.table(0).unwrap().limit(), MIN_LIMIT);
}

#[test]
fn lost_releases_stop_counting_after_the_lease() {
    let c = Config {
        in_flight_expiry_ns: 70 * S,
        ..cfg()
    };
    let mut p = Picker::new(c, &pods(1));
    let pr = prompt(&text("a", 1000), 256);
    let t = pod(p.pick(&req(&pr), 0));
    assert!(p.load_bytes(0, 0) > 0);
    assert!(p.load_bytes(0, 69 * S) > 0);
    assert_eq!(p.load_bytes(0, 81 * S), 0);
    // Releasing late is harmless.
    p.release(t, done(), 200 * S);
    assert_eq!(p.load_bytes(0, 200 * S), 0);
}

#[test]
fn a_new_session_starts_on_the_same_pod_from_every_replica() {
    let c = Config {
        session: Some(SessionAffinity {
            headers: vec!["x-session-id".into()],
            idle_ns: 60 * S,
        }),
        ..cfg()
    };
    let mut order = pods(6);
    order.rotate_left(2);
    let (mut a, mut b) = (Picker::new(c.clone(), &pods(6)), Picker::new(c, &order));
    let mut used = std::collections::HashSet::new();
    for k in 0..40u64 {
        let pa = prompt(&text(&format!("first turn {k}"), 1500), 256);
        let pb = pa.clone();
        let ta = pod(a.pick(
            &Request {
                session: Some(k),
                ..req(&pa)
            },
            0,
        ));
        let tb = pod(b.pick(
            &Request {
                session: Some(k),
                ..req(&pb)
            },
            0,
        ));
        assert_eq!(a.address(ta.pod()), b.address(tb.pod()), "session {k}");
        used.insert(ta.pod());
        a.release(ta, done(), 0);
        b.release(tb, done(), 0);
    }
    assert!(used.len() >= 4, "sessions spread: {used:?}");
}

/// What an engine reports: `requests` running, `computed` prompt tokens so far, read at `at`.
fn gauges(requests: f64, computed: f64, at: u64) -> EngineMetrics {
    EngineMetrics {
        running: requests,
        computed_tokens: Some(computed),
        at_ns: at,
        ..EngineMetrics::default()
    }
}

/// When a request ends, its prefill work counts as what the engine says it computed, not as
/// the pick predicted: a prompt another replica had already put on the pod (all of it cached)
/// stops counting, and one the pod had evicted (none of it cached) counts in full.
#[test]
fn recent_prefill_work_is_what_the_engine_reports_computed() {
    let run = |cached_share: u64| {
        let c = cfg();
        let h = c.recent_half_life_ns;
        let mut pk = Picker::new(c, &pods(2));
        let pr = prompt(&text("a tenant", 4000), 256);
        let t = pod(pk.pick(&req(&pr), 0));
        let i = t.pod();
        let predicted = t.predicted_uncached_bytes() as f64;
        // 1,000 prompt tokens, `cached_share` per cent of them cached.
        let outcome = Outcome::Done {
            prompt_tokens: Some(1000),
            cached_tokens: Some(cached_share * 10),
        };
        pk.release(t, outcome, 0);
        (pk.loads[i].recent.at(0, h), predicted, pr.bytes as f64)
    };
    let (all_cached, predicted, _) = run(100);
    assert!(predicted > 0.0);
    assert_eq!(all_cached, 0.0, "the prediction does not stay");
    let (half, _, bytes) = run(50);
    assert!((half - bytes / 2.0).abs() <= 1.0, "{half} vs {bytes}");
}

/// A pod recently sent more than `known_balance_percent` of the mean prefill work sheds even
/// the prefixes it holds, and two replicas in the same state shed a prefix to the same pod
/// (ranked by the prompt's first block), so it is copied once, not once per replica.
#[test]
fn a_known_prefix_leaves_a_pod_past_the_known_bound_for_the_same_pod_everywhere() {
    let run = |known_balance_percent: u64| {
        let c = Config {
            known_balance_percent,
            ..cfg()
        };
        let h = c.recent_half_life_ns;
        let pr = prompt(&text("a popular tenant", 4000), 256);
        let mut replicas = [
            Picker::new(c.clone(), &pods(4)),
            Picker::new(c.clone(), &pods(4)),
        ];
        let mut picked = Vec::new();
        for pk in replicas.iter_mut() {
            let t = pod(pk.pick(&req(&pr), 0));
            let home = t.pod();
            pk.release(t, done(), 0);
            // The home then computed far more than the others (its other prefixes).
            pk.loads[home].sent(0, 60_000, h);
            for i in (0..4).filter(|&i| i != home) {
                pk.loads[i].sent(0, 20_000, h);
            }
            let t = pod(pk.pick(&req(&pr), 0));
            picked.push((home, t.pod()));
            pk.release(t, done(), 0);
        }
        picked
    };
    let stay = run(0);
    assert!(stay.iter().all(|(home, p)| home == p), "{stay:?}");
    let shed = run(130);
    assert!(shed.iter().all(|(home, p)| home != p), "{shed:?}");
    assert_eq!(shed[0], shed[1], "both replicas spill to the same pod");
}

/// Gauges for pods `0..n` at `at`, each engine having computed `bytes[i]` prompt bytes since
/// the previous call (`prev` holds the running token counters).
fn computed_since(p: &mut Picker, prev: &mut [f64], bytes: &[f64], at: u64) {
    for (i, b) in bytes.iter().enumerate() {
        prev[i] += b / load::BYTES_PER_TOKEN;
        p.set_metrics(i, gauges(0.0, prev[i], at));
    }
}

/// A gateway whose own (usage-corrected) prefill is about what the engines computed is alone;
/// one that sent a third of it shares the pods with other replicas.
#[test]
fn other_gateways_show_as_engine_work_this_one_did_not_send() {
    let run = |engines_over_own: f64| {
        let c = cfg();
        let h = c.recent_half_life_ns;
        let mut p = Picker::new(c, &pods(2));
        let mut counters = [0.0; 2];
        computed_since(&mut p, &mut counters, &[0.0, 0.0], S);
        for i in 0..2 {
            p.loads[i].sent(2 * S, 40_000, h);
        }
        let e = 40_000.0 * engines_over_own;
        computed_since(&mut p, &mut counters, &[e, e], 2 * S);
        p.others_send(2 * S)
    };
    assert!(!run(1.0), "alone");
    assert!(!run(1.3), "alone, the engine's bytes per token differing");
    assert!(run(3.0), "one of three");
    assert!(run(2.0), "one of two");
    // Stale gauges are no evidence.
    let c = cfg();
    let mut p = Picker::new(c, &pods(1));
    let mut counters = [0.0];
    computed_since(&mut p, &mut counters, &[0.0], S);
    computed_since(&mut p, &mut counters, &[120_000.0], 2 * S);
    assert!(p.others_send(2 * S));
    assert!(!p.others_send(2 * S + p.config().metrics_max_age_ns + 1));
}

/// The share of the engines' work this gateway sent is compared in tokens on both sides: a
/// lone gateway whose prompts run at 2.5 JSON bytes per token (the engines' `usage` says so)
/// is alone, and one whose pods also compute another gateway's equal traffic is not. Counting
/// its own prefill in bytes against the engines' tokens at 4 bytes each read the lone
/// gateway's share as 0.63, below the 0.7 line: "others".
#[test]
fn a_lone_gateway_is_alone_whatever_its_prompts_bytes_per_token() {
    let run = |other_gateways: f64| {
        let mut p = Picker::new(cfg(), &pods(2));
        let mut counters = [0.0; 2];
        computed_since(&mut p, &mut counters, &[0.0, 0.0], S);
        // Two scrapes' worth, so that a lone reading is trusted.
        for scrape in [2 * S, 3 * S] {
            let mut tokens = [0.0; 2];
            for k in 0..10 {
                let pr = prompt(&text(&format!("chat {scrape} {k}"), 4000), 256);
                let t = pod(p.pick(&req(&pr), scrape - S / 2));
                let prompt_tokens = pr.bytes as u64 * 2 / 5;
                tokens[t.pod()] += prompt_tokens as f64 * (1.0 + other_gateways);
                let outcome = Outcome::Done {
                    prompt_tokens: Some(prompt_tokens),
                    cached_tokens: Some(0),
                };
                p.release(t, outcome, scrape - S / 2);
            }
            let engine_bytes = tokens.map(|t| t * load::BYTES_PER_TOKEN);
            computed_since(&mut p, &mut counters, &engine_bytes, scrape);
        }
        assert!(
            (p.bytes_per_token() - 2.5).abs() < 0.01,
            "{}",
            p.bytes_per_token()
        );
        p.company(3 * S)
    };
    assert_eq!(run(0.0), Company::Alone);
    assert_eq!(run(1.0), Company::Others, "one of two");
}

/// A snapshot of the engine's running requests, read at this gateway's own scrape moment, does
/// not enter a pod's load (another replica read another snapshot); requests waiting there do,
/// with the engine's whole count, since queueing is what other replicas' traffic may cause.
#[test]
fn the_engine_count_counts_only_while_the_engine_queues() {
    let run = |waiting: f64| {
        let c = cfg();
        let cost = REQUEST_COST_BYTES;
        let mut p = Picker::new(c, &pods(1));
        let m = EngineMetrics {
            running: 3.0,
            waiting,
            at_ns: S,
            ..EngineMetrics::default()
        };
        p.set_metrics(0, m);
        p.load_bytes(0, S) / cost
    };
    assert_eq!(run(0.0), 0, "running elsewhere, nothing queued: own count");
    assert_eq!(run(2.0), 5, "queueing: the engine's count");
}

/// The table forgets what the engine cannot hold: bounded by the KV cache the engine reports
/// (`cache_config_info`), a prompt sent before enough other prompts to fill that cache is no
/// longer credited to the pod; without the report the table would still credit it.
#[test]
fn the_table_forgets_what_the_engine_reports_it_cannot_hold() {
    let run = |cache_tokens: Option<f64>| {
        let mut p = Picker::new(cfg(), &pods(1));
        // 4 KiB of cache at the assumed 4 bytes per token: 16 blocks of 256 B.
        p.set_metrics(
            0,
            EngineMetrics {
                cache_tokens,
                at_ns: S,
                ..EngineMetrics::default()
            },
        );
        let old = prompt(&text("an old tenant", 2048), 256);
        let t = pod(p.pick(&req(&old), S));
        p.release(t, done(), S);
        for k in 0..4 {
            let t = pod(p.pick(&req(&prompt(&text(&format!("new {k}"), 2048), 256)), S));
            p.release(t, done(), S);
        }
        (p.tables[0].limit(), p.tables[0].matched_prefix(&old.blocks))
    };
    assert_eq!(run(Some(1024.0)), (16, 0), "bounded: forgotten");
    let (limit, held) = run(None);
    assert_eq!(limit, 1024);
    assert!(held >= 7, "unbounded: still credited ({held} blocks)");
}

/// Where other gateways send to the same pods, the engine's cache also holds their prompts: a
/// gateway that sent a third of what the engines computed bounds each table to a third of the
/// reported cache.
#[test]
fn among_other_gateways_a_table_holds_its_share_of_the_engine_cache() {
    let run = |engines_over_own: f64| {
        let c = cfg();
        let h = c.recent_half_life_ns;
        let mut p = Picker::new(c, &pods(1));
        let mut counters = [0.0];
        computed_since(&mut p, &mut counters, &[0.0], S);
        p.loads[0].sent(2 * S, 40_000, h);
        counters[0] += 40_000.0 * engines_over_own / load::BYTES_PER_TOKEN;
        p.set_metrics(
            0,
            EngineMetrics {
                computed_tokens: Some(counters[0]),
                cache_tokens: Some(30_000.0),
                at_ns: 2 * S,
                ..EngineMetrics::default()
            },
        );
        p.tables[0].limit()
    };
    // 30,000 tokens at 4 bytes in 256-byte blocks: 468 blocks alone, a third with two others.
    assert_eq!(run(1.0), 468);
    assert_eq!(run(3.0), 156);
}

/// A prompt no pod is known to hold goes to its rendezvous home, so one the table forgot (or
/// another replica placed) returns there; while the home has more than one request in flight
/// beyond the least loaded pod, the next pod in the same order takes it, alike at every
/// replica with the same loads.
#[test]
fn a_forgotten_prefix_returns_to_its_home_within_the_load_bound() {
    let mut p = Picker::new(cfg(), &pods(4));
    let tenant = prompt(&text("a tenant's system prompt", 3000), 256);
    let t = pod(p.pick(&req(&tenant), 0));
    let home = t.pod();
    p.release(t, done(), 0);
    for t in p.tables.iter_mut() {
        t.clear();
    }
    let t = pod(p.pick(&req(&tenant), 0));
    assert_eq!(t.pod(), home, "forgotten, back home");
    p.release(t, done(), 0);
    for t in p.tables.iter_mut() {
        t.clear();
    }
    // The home two requests ahead of the others: the next pod by rendezvous.
    let other = prompt(&text("unrelated", 300), 256);
    let mut q = Picker::new(cfg(), &pods(4));
    let on_home = |p: &mut Picker| {
        let allowed: Vec<bool> = (0..4).map(|i| i == home).collect();
        (0..=place::HOME_SLACK_REQUESTS)
            .map(|_| pod(p.pick_within(&req(&other), &allowed, 0)))
            .collect::<Vec<_>>()
    };
    let a = on_home(&mut p);
    let b = on_home(&mut q);
    let (ta, tb) = (pod(p.pick(&req(&tenant), 0)), pod(q.pick(&req(&tenant), 0)));
    assert_ne!(ta.pod(), home, "over the bound");
    assert_eq!(ta.pod(), tb.pod(), "the same next pod at both replicas");
    for t in a.into_iter().chain([ta]) {
        p.release(t, done(), 0);
    }
    for t in b.into_iter().chain([tb]) {
        q.release(t, done(), 0);
    }
}

/// Among other gateways a prompt this one does not know goes to its home while the home is
/// within the known-prefix load slack (the other replicas' copies of it are there, and this
/// gateway's in-flight count is only its share of the pod's load); a lone gateway keeps the
/// tight home slack.
#[test]
fn among_other_gateways_an_unknown_prompt_goes_home_within_the_known_prefix_slack() {
    let run = |others: bool| {
        let c = Config {
            known_balance_percent: 0,
            ..cfg()
        };
        let tenant = prompt(&text("another replica's tenant", 3000), 256);
        let home = {
            let mut probe = Picker::new(c.clone(), &pods(4));
            pod(probe.pick(&req(&tenant), 0)).pod()
        };
        let mut p = Picker::new(c, &pods(4));
        let mut counters = [0.0; 4];
        computed_since(&mut p, &mut counters, &[0.0; 4], S);
        let engines = if others { 40_000.0 } else { 0.0 };
        computed_since(&mut p, &mut counters, &[engines; 4], 2 * S);
        assert_eq!(p.others_send(2 * S), others);
        // Two requests in flight on the home, none elsewhere.
        let allowed: Vec<bool> = (0..4).map(|i| i == home).collect();
        let short = prompt("hi", 256);
        let held: Vec<Ticket> = (0..2)
            .map(|_| pod(p.pick_within(&req(&short), &allowed, 2 * S)))
            .collect();
        let t = pod(p.pick(&req(&tenant), 2 * S));
        let at = t.pod();
        for t in held.into_iter().chain([t]) {
            p.release(t, done(), 2 * S);
        }
        (home, at)
    };
    let (home, at) = run(true);
    assert_eq!(at, home, "among others: home within the known-prefix slack");
    let (home, at) = run(false);
    assert_ne!(at, home, "alone: past the home slack");
}

/// `pick_knowing` places by the caller's count of each pod's cached prefix, not by the tables:
/// a prompt the tables credit to its pod goes where the caller says the engines hold it, and
/// the charge predicts that pod's uncached part from the caller's count.
#[test]
fn a_pick_knowing_the_caches_follows_them_not_the_tables() {
    let mut p = Picker::new(cfg(), &pods(4));
    let system = text("tenant-b system prompt", 8000);
    let first = prompt(&format!("{system} question one"), 256);
    let t = pod(p.pick(&req(&first), 0));
    let tabled = t.pod();
    p.release(t, done(), 0);
    let pr = prompt(&format!("{system} question two"), 256);
    let blocks = pr.blocks.len();
    // The engines say another pod holds all but the last block and the tabled pod nothing
    // (it evicted, or another gateway placed the prompt).
    let holder = (tabled + 2) % 4;
    let mut matched = vec![0; 4];
    matched[holder] = blocks - 1;
    let t = pod(p.pick_knowing(&req(&pr), &matched, S));
    assert_eq!(t.pod(), holder);
    assert!(t.predicted_uncached_bytes() <= 2 * 256);
    p.release(t, done(), S);
    // A count past the prompt is the whole prompt; a missing entry is nothing cached.
    let t = pod(p.pick_knowing(&req(&pr), &[0, 0, 0, usize::MAX][..], 2 * S));
    assert_eq!(t.pod(), 3);
    assert!(t.predicted_uncached_bytes() < 256, "only the partial tail");
    p.release(t, done(), 2 * S);
    // Nothing cached anywhere: the prompt's home, as a picker that never saw it places it.
    let t = pod(p.pick_knowing(&req(&pr), &[], 3 * S));
    let fresh = pod(Picker::new(cfg(), &pods(4)).pick(&req(&pr), 0));
    assert_eq!(t.pod(), fresh.pod());
    p.release(t, done(), 3 * S);
}
