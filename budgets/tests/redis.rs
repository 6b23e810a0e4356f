//! `llmkube-budgets` against a real `redis-server`: the ledger semantics shared with the core,
//! concurrency, restarts, Redis down, abandoned reservations, windows rolling on Redis TIME.

mod common;

use common::{http, wait_healthy, Binary, Cluster, InProcess};
use llmkube_budgets::store::{RedisStore, Reserve};
use router_core::budget::money::{format_usd, parse_usd};
use router_core::budget::protocol::LedgerRef;
use router_core::budget::{Amount, Caps, Ledger, Shape, Wait};
use serde_json::{json, Value};
use std::time::Duration;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A key prefix no other test or case uses. A free port alone is not unique: the port is
/// free again once checked, so two cases in one process drew the same one and read each
/// other's spend (a flake seen in a CI rehearsal: 22 tokens spent where the case spent 2).
fn unique(tag: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "test/{tag}-{}-{}-{n}",
        std::process::id(),
        common::free_port()
    )
}

/// Every case of cases.json, step by step, on the core's Ledger and on the Lua script with the
/// same clock: both must give the answers the table states.
#[test]
fn lua_and_core_agree_on_the_shared_table_of_cases() {
    let Some(redis) = common::redis() else { return };
    let table: Value = serde_json::from_str(include_str!("cases.json")).unwrap();
    let rt = rt();
    rt.block_on(async {
        let store = RedisStore::new(&redis.url(), &common::test_options(true, false)).unwrap();
        for case in table["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let mut window_s = case["window_s"].as_u64().unwrap();
            let ttl_s = case["ttl_s"].as_u64().unwrap();
            let mut l = LedgerRef {
                budget: "b".into(),
                // A team budget's ledger (its lease names the team): keyed by the team.
                team: case["team"].as_str().map(String::from),
                window_s,
                max_tokens: case["max_tokens"].as_u64(),
                max_usd: case["max_usd"].as_str().map(String::from),
            };
            let caps: Caps = l.caps().unwrap();
            let mut shape = Shape::new(window_s, ttl_s);
            let router = unique("cases");
            let mut core = Ledger::new(&shape);
            let mut core_holds = std::collections::HashMap::new();
            let mut redis_ids = std::collections::HashMap::new();
            // Lease mode: the core's live leases (id -> expiry), as the script's `:l`.
            let mut core_leases = std::collections::HashMap::new();
            for (n, step) in case["steps"].as_array().unwrap().iter().enumerate() {
                let at = step["at"].as_u64().unwrap();
                let id = step["id"].as_str().unwrap_or("");
                let amount = Amount::new(
                    step["tokens"].as_u64().unwrap_or(0),
                    step["usd"].as_str().map_or(0, |u| parse_usd(u).unwrap()),
                );
                let ctx = format!("{name}, step {n}: {step}");
                if let Some(w) = step["window_s"].as_u64().filter(|w| *w != window_s) {
                    // The budget's window changed: the core reads the bytes it kept under the
                    // new shape (as a gateway with the new config does), the script is called
                    // with it.
                    window_s = w;
                    l.window_s = w;
                    shape = Shape::new(w, ttl_s);
                    core = Ledger::decode(core.as_bytes(), &shape, at).unwrap();
                }
                match step["op"].as_str().unwrap() {
                    "reserve" => {
                        let core_got = core.try_reserve(&shape, &caps, amount, at);
                        let rid = format!("{id}-{n}");
                        let redis_got = store
                            .reserve(Some(at), &router, &l, &rid, amount, ttl_s * 1000)
                            .await
                            .unwrap()
                            .0;
                        match step["expect"].as_str().unwrap() {
                            "held" => {
                                assert!(core_got.is_ok(), "core {ctx}: {core_got:?}");
                                assert_eq!(redis_got, Reserve::Held, "redis {ctx}");
                                core_holds.insert(id.to_string(), core_got.unwrap());
                                redis_ids.insert(id.to_string(), rid);
                            }
                            expect => {
                                let w = step["wait_s"].as_i64().unwrap();
                                let (core_want, redis_want) = if w < 0 {
                                    (Wait::Never, Reserve::Refused(None))
                                } else if expect == "reclaiming" {
                                    // Only holds in the way, leases among them: the script
                                    // also asks the leases for their room back.
                                    (Wait::Seconds(w as u64), Reserve::Reclaiming)
                                } else {
                                    (Wait::Seconds(w as u64), Reserve::Refused(Some(w as u64)))
                                };
                                assert_eq!(core_got, Err(core_want), "core {ctx}");
                                assert_eq!(redis_got, redis_want, "redis {ctx}");
                            }
                        }
                    }
                    op @ ("settle" | "release") => {
                        let actual = (op == "settle").then_some(amount);
                        let hold = core_holds.remove(id);
                        match actual {
                            Some(a) => core.settle(&shape, hold.as_ref(), a, at),
                            None => core.release(&shape, &hold.unwrap(), at),
                        }
                        let rid = redis_ids.remove(id).unwrap_or_else(|| format!("none-{n}"));
                        store
                            .settle(Some(at), &router, &l, &rid, actual, ttl_s * 1000)
                            .await
                            .unwrap();
                    }
                    "lease" => {
                        lease_step(
                            &store,
                            LeaseStep {
                                at,
                                step,
                                ctx: &ctx,
                                router: &router,
                                l: &l,
                                ttl_s,
                            },
                            (&mut core, &shape, &caps),
                            &mut core_holds,
                            &mut core_leases,
                        )
                        .await;
                    }
                    "usage" => {
                        let (spent, held) = store.usage(Some(at), &router, &l).await.unwrap();
                        let core_spent = core.spent(&shape, at);
                        let core_held = core.held(&shape, at);
                        assert_eq!(spent, core_spent, "spent {ctx}");
                        assert_eq!(held, core_held, "held {ctx}");
                        assert_eq!(Some(spent.tokens), step["spent_tokens"].as_u64(), "{ctx}");
                        assert_eq!(Some(held.tokens), step["held_tokens"].as_u64(), "{ctx}");
                        if let Some(u) = step["spent_usd"].as_str() {
                            assert_eq!(format_usd(spent.pico), u, "{ctx}");
                        }
                        if let Some(u) = step["held_usd"].as_str() {
                            assert_eq!(format_usd(held.pico), u, "{ctx}");
                        }
                    }
                    other => panic!("unknown op {other}"),
                }
            }
        }
    });
}

struct LeaseStep<'a> {
    at: u64,
    step: &'a Value,
    ctx: &'a str,
    router: &'a str,
    l: &'a LedgerRef,
    ttl_s: u64,
}

/// A `lease` step of cases.json: on the core, the old lease's hold settled with its use, the
/// grant computed by `budget::shared_lease::grant` over the live leases and reserved; on Redis, the
/// `lease` op. Both must grant what the table says.
async fn lease_step(
    store: &RedisStore,
    s: LeaseStep<'_>,
    (core, shape, caps): (&mut Ledger, &Shape, &Caps),
    core_holds: &mut std::collections::HashMap<String, router_core::budget::Hold>,
    core_leases: &mut std::collections::HashMap<String, u64>,
) {
    use llmkube_budgets::store::lease::LeaseCall;
    use router_core::budget::shared_lease::grant;
    let (at, step, ctx) = (s.at, s.step, s.ctx);
    let usd = |k: &str| step[k].as_str().map_or(0, |u| parse_usd(u).unwrap());
    let used = Amount::new(step["tokens"].as_u64().unwrap_or(0), usd("usd"));
    let admitted = Amount::new(
        step["admitted_tokens"].as_u64().unwrap_or(0),
        usd("admitted_usd"),
    );
    let max = Amount::new(step["max_tokens"].as_u64().unwrap_or(0), usd("max_usd"));
    let id = step["id"].as_str().unwrap();
    let old = step["old"].as_str();
    let want = Amount::new(step["granted_tokens"].as_u64().unwrap(), usd("granted_usd"));
    let applied = step["applied"].as_bool().unwrap_or(true);
    let got = store
        .lease(
            Some(at),
            s.router,
            s.l,
            LeaseCall {
                old,
                id,
                used,
                admitted,
                max,
                ttl_ms: s.ttl_s * 1000,
                max_teams: step["max_teams"].as_u64(),
                unheld: false,
            },
        )
        .await
        .unwrap();
    assert_eq!((got.granted, got.applied), (want, applied), "redis {ctx}");
    if !applied {
        return;
    }
    let hold = old.and_then(|o| core_holds.remove(o));
    core.settle(shape, hold.as_ref(), used, at);
    if let Some(o) = old {
        core_leases.remove(o);
    }
    core_leases.retain(|_, exp| *exp > at);
    let holders = core_leases.len() as u64 + 1;
    let taken = core.spent(shape, at).plus(core.held(shape, at));
    let g = grant(caps, taken, max, admitted, holders, false);
    assert_eq!(g, want, "core {ctx}");
    if !g.is_zero() {
        let h = core.try_reserve(shape, caps, g, at).expect(ctx);
        core_holds.insert(id.to_string(), h);
        core_leases.insert(id.to_string(), at + s.ttl_s * 1000);
    }
}

fn ledger(budget: &str, team: Option<&str>, window_s: u64, max_tokens: u64) -> Value {
    let mut l = json!({"budget": budget, "window_s": window_s, "max_tokens": max_tokens});
    if let Some(t) = team {
        l["team"] = json!(t);
    }
    l
}

/// 64 clients at once, each reserving 10 tokens, holding its reservation a while, then settling
/// 10, against a cap of 100. Returns the tokens spent in the window afterwards.
fn concurrent_run(hold: bool) -> Option<u64> {
    let redis = common::redis()?;
    let svc = InProcess::start(&redis.url(), hold);
    let router = unique("concurrency");
    let ledgers = json!([ledger("all", None, 3600, 100)]);
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (addr, router, ledgers) = (svc.addr, router.clone(), ledgers.clone());
            std::thread::spawn(move || {
                let req = json!({"router": router, "ledgers": ledgers, "amount": {"tokens": 10}});
                let (status, v) = http(addr, "POST", "/v1/reserve", Some(&req));
                assert_eq!(status, 200, "{v}");
                if v["admitted"] != json!(true) {
                    assert!(v["retry_after_s"].as_u64().unwrap() >= 1);
                    return false;
                }
                std::thread::sleep(Duration::from_millis(300));
                let settle = json!({"router": router, "ledgers": ledgers,
                    "reservation": v["reservation"], "amount": {"tokens": 10}});
                let (status, v) = http(addr, "POST", "/v1/settle", Some(&settle));
                assert_eq!(status, 200, "{v}");
                true
            })
        })
        .collect();
    let admitted = threads
        .into_iter()
        .filter(|_| true)
        .map(|t| t.join().unwrap())
        .filter(|a| *a)
        .count();
    let (status, v) = http(
        svc.addr,
        "GET",
        &format!("/v1/status?router={router}"),
        None,
    );
    assert_eq!(status, 200, "{v}");
    let used = v["budgetUtilization"][0]["tokensUsed"].as_u64().unwrap();
    assert_eq!(used, admitted as u64 * 10);
    Some(used)
}

#[test]
fn concurrent_reserves_never_overshoot_the_cap() {
    let Some(used) = concurrent_run(true) else {
        return;
    };
    // Every reservation is a true upper bound here, so the bound is the cap itself.
    assert_eq!(used, 100, "exactly the cap is admitted");
}

#[test]
fn without_holding_the_same_run_overshoots() {
    let Some(used) = concurrent_run(false) else {
        return;
    };
    assert!(
        used > 100,
        "check-only admission should overshoot, spent {used}"
    );
}

#[test]
fn status_has_the_seed_shape_with_teams() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("status");
    let charge = |l: Value, tokens: u64, usd: &str| {
        let req = json!({"router": router, "ledgers": [l.clone()], "amount": {"tokens": tokens, "usd": usd}});
        let (s, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
        assert_eq!((s, &v["admitted"]), (200, &json!(true)), "{v}");
        let settle = json!({"router": router, "ledgers": [l], "reservation": v["reservation"],
            "amount": {"tokens": tokens, "usd": usd}});
        assert_eq!(http(svc.addr, "POST", "/v1/settle", Some(&settle)).0, 200);
    };
    let mut usd_budget = ledger("spend", None, 60, 1000);
    usd_budget["max_usd"] = json!("2");
    charge(usd_budget, 100, "1.5");
    charge(ledger("teams", Some("alpha"), 60, 1000), 250, "0");
    charge(ledger("teams", Some("beta"), 60, 1000), 500, "0");
    let (s, v) = http(
        svc.addr,
        "GET",
        &format!("/v1/status?router={router}"),
        None,
    );
    assert_eq!(s, 200);
    let u = &v["budgetUtilization"];
    assert_eq!(u[0]["name"], "spend");
    assert_eq!(u[0]["tokensUsed"], 100);
    assert_eq!(u[0]["usdUsed"], "1.5");
    // max(100/1000, 1.5/2)
    assert_eq!(u[0]["utilization"], "0.75");
    assert_eq!(u[1]["name"], "teams");
    assert_eq!(u[1]["team"], "beta");
    assert_eq!(u[1]["utilization"], "0.5");
    assert_eq!(u[1]["teams"].as_array().unwrap().len(), 2);
    assert_eq!(u[1]["teams"][0]["tokensUsed"], 250);
    // `llmkube-budgets status` prints the same: a row per budget and per team, or the JSON.
    let flags = |json: bool| {
        let mut a = vec![
            "--service".to_string(),
            svc.addr.to_string(),
            "--router".into(),
            router.clone(),
        ];
        if json {
            a.push("--json".into());
        }
        llmkube_budgets::status::StatusFlags::parse(a).unwrap()
    };
    let table = llmkube_budgets::status::run(&flags(false)).unwrap();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0][..5],
        ["spend", "-", "100", "1.5", "0.75"],
        "{table}"
    );
    assert_eq!(rows[1][..3], ["teams", "alpha", "250"], "{table}");
    assert_eq!(rows[2][..3], ["teams", "beta", "500"], "{table}");
    let printed: Value =
        serde_json::from_str(&llmkube_budgets::status::run(&flags(true)).unwrap()).unwrap();
    assert_eq!(printed, v);
    // Bad requests say what is wrong.
    let (s, v) = http(
        svc.addr,
        "POST",
        "/v1/reserve",
        Some(
            &json!({"router": "x", "ledgers": [{"budget": "b", "window_s": 60}], "amount": {"tokens": 1}}),
        ),
    );
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("neither max_tokens nor max_usd"),
        "{v}"
    );
    let (s, _) = http(svc.addr, "GET", "/v1/status", None);
    assert_eq!(s, 400);
}

#[test]
fn a_refusal_holds_nothing_on_the_other_ledgers() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("all-or-nothing");
    let big = ledger("big", None, 60, 1000);
    let small = ledger("small", None, 60, 5);
    let req = json!({"router": router, "ledgers": [big.clone(), small.clone()], "amount": {"tokens": 10}});
    let (s, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(s, 200);
    assert_eq!(v["admitted"], false);
    assert_eq!(v["never"], true);
    assert_eq!(v["refused"], json!(["small"]));
    let (_, st) = http(
        svc.addr,
        "GET",
        &format!("/v1/status?router={router}"),
        None,
    );
    for u in st["budgetUtilization"].as_array().unwrap() {
        assert_eq!(u["tokensReserved"], 0, "{u}");
    }
}

#[test]
fn abandoned_reservations_expire_on_redis_time() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("expiry");
    let l = json!([ledger("b", None, 60, 10)]);
    let reserve = |ttl: u64| {
        let req = json!({"router": router, "ledgers": l, "amount": {"tokens": 10}, "ttl_s": ttl});
        http(svc.addr, "POST", "/v1/reserve", Some(&req)).1
    };
    assert_eq!(reserve(1)["admitted"], true);
    // The gateway "crashed": no settle. The hold blocks others until its ttl passes.
    let refused = reserve(1);
    assert_eq!(refused["admitted"], false);
    assert_eq!(refused["retry_after_s"], 1);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(reserve(60)["admitted"], true);
}

#[test]
fn windows_roll_on_redis_time_and_retry_after_is_honest() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("roll");
    let l = json!([ledger("b", None, 2, 10)]);
    let req = json!({"router": router, "ledgers": l, "amount": {"tokens": 10}});
    let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(v["admitted"], true);
    let settle = json!({"router": router, "ledgers": l, "reservation": v["reservation"], "amount": {"tokens": 10}});
    http(svc.addr, "POST", "/v1/settle", Some(&settle));
    let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(v["admitted"], false);
    let retry = v["retry_after_s"].as_u64().unwrap();
    // A 2 s window in 1 s buckets: the charge rolls off 2 to 3 s after it was made.
    assert!((2..=3).contains(&retry), "{v}");
    std::thread::sleep(Duration::from_millis(retry * 1000 + 50));
    let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(v["admitted"], true, "admitted after Retry-After: {v}");
}

#[test]
fn redis_down_is_a_distinct_503_and_recovery_needs_no_restart() {
    let Some(mut redis) = common::redis() else {
        return;
    };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("down");
    let req =
        json!({"router": router, "ledgers": [ledger("b", None, 60, 100)], "amount": {"tokens": 1}});
    assert_eq!(http(svc.addr, "POST", "/v1/reserve", Some(&req)).0, 200);
    redis.stop();
    let (s, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["code"], "budget_store_unavailable");
    assert_eq!(v["error"]["type"], "api_error");
    assert_eq!(http(svc.addr, "GET", "/healthz", None).0, 503);
    redis.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
        if s == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "service did not recover"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A service that never reached Redis answers the same way.
    let nowhere = InProcess::start(&format!("redis://127.0.0.1:{}", common::free_port()), true);
    let (s, v) = http(nowhere.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("budget_store_unavailable"))
    );
}

#[test]
fn restarting_the_service_or_redis_loses_nothing() {
    let Some(mut redis) = common::redis() else {
        return;
    };
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = redis.url();
    let args = [
        "--listen",
        listen.as_str(),
        "--redis",
        url.as_str(),
        "--redis-timeout-ms",
        "5000",
    ];
    let bin = Binary::start(&args);
    assert!(
        bin.ready_line.contains("ready on http://127.0.0.1:"),
        "{}",
        bin.ready_line
    );
    let addr = listen.parse().unwrap();
    wait_healthy(addr);
    let router = unique("restart");
    let l = json!([ledger("b", Some("alpha"), 3600, 100)]);
    let req = json!({"router": router, "ledgers": l, "amount": {"tokens": 30}});
    let (s, v) = http(addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!((s, &v["admitted"]), (200, &json!(true)), "{v}");
    let settle = json!({"router": router, "ledgers": l, "reservation": v["reservation"], "amount": {"tokens": 30, "usd": "0.25"}});
    let (s, v) = http(addr, "POST", "/v1/settle", Some(&settle));
    assert_eq!(s, 200, "{v}");
    // A hold in flight across the restarts too.
    let (_, held) = http(addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(held["admitted"], true);
    let status = bin.terminate();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    redis.start_again();
    let bin = Binary::start(&args);
    wait_healthy(addr);
    let (_, st) = http(addr, "GET", &format!("/v1/status?router={}", router), None);
    let team = &st["budgetUtilization"][0]["teams"][0];
    assert_eq!(team["team"], "alpha");
    assert_eq!(team["tokensUsed"], 30);
    assert_eq!(team["usdUsed"], "0.25");
    assert_eq!(team["tokensReserved"], 30);
    // 30 spent + 30 held + 30 fits; one more does not.
    assert_eq!(
        http(addr, "POST", "/v1/reserve", Some(&req)).1["admitted"],
        true
    );
    assert_eq!(
        http(addr, "POST", "/v1/reserve", Some(&req)).1["admitted"],
        false
    );
    assert!(bin.terminate().success());
}

#[test]
fn bad_flags_exit_non_zero_with_a_clear_message() {
    for (args, says) in [
        (vec![], "--listen is required"),
        (vec!["--listen", "127.0.0.1:1"], "--redis is required"),
        (
            vec![
                "--listen",
                "127.0.0.1:1",
                "--redis",
                "redis://h:1",
                "--redis-timeout-ms",
                "0",
            ],
            "--redis-timeout-ms \"0\": milliseconds",
        ),
        (
            vec!["--listen", "nowhere", "--redis", "redis://127.0.0.1:6379"],
            "not HOST:PORT",
        ),
        (
            vec!["--listen", "127.0.0.1:1", "--redis", "http://x"],
            "must be redis://",
        ),
        (
            vec![
                "--listen",
                "127.0.0.1:1",
                "--redis",
                "redis://u:secret@h:1",
                "--bogus",
            ],
            "unknown argument",
        ),
        (vec!["--listen"], "needs a value"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmkube-budgets"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("secret"), "credentials in the message: {err}");
    }
}

#[test]
fn a_redis_cluster_keeps_each_ledger_on_one_node() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let url = cluster.nodes[0].url().replace("/0", "");
    let svc = InProcess::start_with(&url, true, true);
    let router = unique("cluster");
    // Many teams: their ledgers hash to slots on every node; each script call touches three keys
    // of one ledger, which CROSSSLOT would refuse if they were not under one hash tag.
    for i in 0..30 {
        let team = format!("team-{i}");
        let l = json!([
            ledger("teams", Some(&team), 3600, 100),
            ledger("all", None, 3600, 100_000)
        ]);
        let req = json!({"router": router, "ledgers": l, "amount": {"tokens": 60}});
        let (s, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
        assert_eq!((s, &v["admitted"]), (200, &json!(true)), "{v}");
        let settle = json!({"router": router, "ledgers": l, "reservation": v["reservation"], "amount": {"tokens": 60}});
        let (s, v) = http(svc.addr, "POST", "/v1/settle", Some(&settle));
        assert_eq!((s, &v["holds_found"]), (200, &json!(2)), "{v}");
        // The team's cap holds in the cluster too.
        let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
        assert_eq!(v["admitted"], false, "{v}");
    }
    let per_node = cluster.keys_per_node();
    assert!(
        per_node.iter().all(|&n| n > 0),
        "ledgers spread over every node: {per_node:?}"
    );
    let (s, v) = http(
        svc.addr,
        "GET",
        &format!("/v1/status?router={router}"),
        None,
    );
    assert_eq!(s, 200, "{v}");
    let u = v["budgetUtilization"].as_array().unwrap();
    assert_eq!(u[0]["name"], "all");
    assert_eq!(u[0]["tokensUsed"], 30 * 60);
    assert_eq!(u[1]["teams"].as_array().unwrap().len(), 30);
}

/// The gateway chooses the reservation id, so a client that left before the reserve answer
/// came can still release it: a release that arrives first leaves a tombstone, and the reserve
/// arriving after it holds nothing (the hold does not wait for its ttl). A reserve repeated
/// with the same id holds once.
#[test]
fn a_release_before_its_reserve_leaves_no_hold() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("release-first");
    let l = json!([ledger("b", None, 60, 100)]);
    let reserve = |id: &str| {
        let req =
            json!({"router": router, "ledgers": l, "amount": {"tokens": 30}, "reservation": id});
        http(svc.addr, "POST", "/v1/reserve", Some(&req)).1
    };
    let release = |id: &str| {
        let req = json!({"router": router, "ledgers": l, "reservation": id});
        http(svc.addr, "POST", "/v1/release", Some(&req))
    };
    let (s, v) = release("gw1-1");
    assert_eq!((s, &v["holds_found"]), (200, &json!(0)), "{v}");
    let v = reserve("gw1-1");
    assert_eq!(v["admitted"], true, "{v}");
    assert_eq!(v["reservation"], "gw1-1");
    assert_eq!(
        svc_tokens(&svc, &router, "b"),
        (0, 0),
        "the late reserve held nothing"
    );
    // The same id again (a retried call) holds once; its release drops it.
    reserve("gw1-2");
    reserve("gw1-2");
    assert_eq!(svc_tokens(&svc, &router, "b"), (0, 30));
    assert_eq!(release("gw1-2").1["holds_found"], 1);
    assert_eq!(svc_tokens(&svc, &router, "b"), (0, 0));
    // A tombstone lives the hold's ttl, then goes (Redis keeps no ended ids beyond it).
    let short = json!({"router": router, "ledgers": l, "reservation": "gw1-3", "ttl_s": 1});
    assert_eq!(http(svc.addr, "POST", "/v1/release", Some(&short)).0, 200);
    std::thread::sleep(Duration::from_millis(1100));
    reserve("gw1-3");
    assert_eq!(
        svc_tokens(&svc, &router, "b"),
        (0, 30),
        "the expired tombstone blocks nothing"
    );
    release("gw1-3");
    // An id the service cannot keep is refused, not truncated.
    let bad =
        json!({"router": router, "ledgers": l, "amount": {"tokens": 1}, "reservation": "a b"});
    assert_eq!(http(svc.addr, "POST", "/v1/reserve", Some(&bad)).0, 400);
}

/// A settle sent again (the first answer was lost, the service restarted) charges once; every
/// answer carries the ledgers as they are after it (the gateway's gauges).
#[test]
fn settles_apply_once_and_answers_carry_the_ledgers() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("settle-once");
    let l = json!([
        ledger("b", None, 60, 100),
        ledger("t", Some("alpha"), 60, 50)
    ]);
    let req =
        json!({"router": router, "ledgers": l, "amount": {"tokens": 30}, "reservation": "s-1"});
    let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
    assert_eq!(v["admitted"], true, "{v}");
    assert_eq!(v["ledgers"][0]["tokens_reserved"], 30, "{v}");
    assert_eq!(v["ledgers"][1]["team"], "alpha", "{v}");
    let settle =
        json!({"router": router, "ledgers": l, "reservation": "s-1", "amount": {"tokens": 12}});
    for round in 0..3 {
        let (s, v) = http(svc.addr, "POST", "/v1/settle", Some(&settle));
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["holds_found"], if round == 0 { 2 } else { 0 }, "{v}");
        for state in v["ledgers"].as_array().unwrap() {
            assert_eq!(
                (&state["tokens_used"], &state["tokens_reserved"]),
                (&json!(12), &json!(0)),
                "{v}"
            );
        }
    }
    assert_eq!(svc_tokens(&svc, &router, "b"), (12, 0));
    // A refusal's answer shows the ledgers too, with nothing held by the refused request.
    let big =
        json!({"router": router, "ledgers": l, "amount": {"tokens": 45}, "reservation": "s-2"});
    let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&big));
    assert_eq!(v["admitted"], false, "{v}");
    assert_eq!(
        v["ledgers"][0]["tokens_reserved"], 0,
        "the other ledger's hold was undone: {v}"
    );
    assert_eq!(v["ledgers"][0]["tokens_used"], 12, "{v}");
}

/// (tokensUsed, tokensReserved) of a router budget from the service's status.
fn svc_tokens(svc: &InProcess, router: &str, budget: &str) -> (u64, u64) {
    let (_, st) = http(
        svc.addr,
        "GET",
        &format!("/v1/status?router={router}"),
        None,
    );
    st["budgetUtilization"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|u| u["name"] == budget)
        .map_or((0, 0), |u| {
            (
                u["tokensUsed"].as_u64().unwrap_or(0),
                u["tokensReserved"].as_u64().unwrap_or(0),
            )
        })
}

/// Every answer on a ledger carries a version above every earlier answer's on it (gateways
/// keep the newest state for their gauges, answers reaching them out of order): at the same
/// millisecond, for a refusal, when the clock steps back, and after the ledger's keys expired
/// (an idle ledger disappears from Redis, and its counter with it).
#[test]
fn answer_versions_only_grow_on_a_ledger() {
    let Some(redis) = common::redis() else { return };
    rt().block_on(async {
        let store = RedisStore::new(&redis.url(), &common::test_options(true, false)).unwrap();
        let router = unique("versions");
        let l = LedgerRef {
            budget: "b".into(),
            team: None,
            window_s: 60,
            max_tokens: Some(100),
            max_usd: None,
        };
        let ttl = 900_000;
        let t = 1_700_000_000_000u64;
        let mut last = 0;
        let mut grew = |v: u64, what: &str| {
            assert!(v > last, "{what}: version {v} after {last}");
            last = v;
        };
        let reserve = |at: u64, id: &'static str, tokens: u64| {
            let (store, router, l) = (&store, &router, &l);
            async move {
                store
                    .reserve(Some(at), router, l, id, Amount::new(tokens, 0), ttl)
                    .await
                    .unwrap()
            }
        };
        let (r, u) = reserve(t, "a", 10).await;
        assert_eq!(r, Reserve::Held);
        grew(u.version, "reserve");
        let (_, u) = store
            .settle(Some(t), &router, &l, "a", Some(Amount::new(5, 0)), ttl)
            .await
            .unwrap();
        grew(u.version, "settle in the same millisecond");
        let (r, u) = reserve(t, "big", 500).await;
        assert!(matches!(r, Reserve::Refused(_)), "{r:?}");
        grew(u.version, "refusal");
        let (_, u) = reserve(t - 60_000, "c", 1).await;
        grew(u.version, "the clock a minute back");
        let key = RedisStore::ledger_key(&router, &l);
        let port = redis
            .url()
            .rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let del = std::process::Command::new("redis-cli")
            .args([
                "-p",
                &port,
                "del",
                &format!("{key}:w"),
                &format!("{key}:r"),
                &format!("{key}:x"),
            ])
            .output()
            .expect("redis-cli runs");
        assert_eq!(String::from_utf8_lossy(&del.stdout).trim(), "3", "{del:?}");
        // Keys expire only after the ledger was idle for over a minute of Redis time.
        let (_, u) = reserve(t + 61_000, "d", 1).await;
        grew(u.version, "after the keys expired");
        assert_eq!(
            store
                .usage(Some(t + 61_000), &router, &l)
                .await
                .unwrap()
                .1
                .tokens,
            1
        );
    });
}

/// `POST /v1/end` (what a gateway's tick sends when several requests ended): each settle and
/// release applies as its own call would, once however often the batch arrives; a malformed
/// end answers its own error and does not stop the others.
#[test]
fn a_batch_of_ends_applies_each_once() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("batch");
    let l = json!([
        ledger("b", None, 60, 100),
        ledger("t", Some("alpha"), 60, 100)
    ]);
    for id in ["e-1", "e-2", "e-3"] {
        let req =
            json!({"router": router, "ledgers": l, "amount": {"tokens": 20}, "reservation": id});
        let (_, v) = http(svc.addr, "POST", "/v1/reserve", Some(&req));
        assert_eq!(v["admitted"], true, "{v}");
    }
    assert_eq!(svc_tokens(&svc, &router, "b"), (0, 60));
    let batch = json!({"ends": [
        {"router": router, "ledgers": l, "reservation": "e-1", "amount": {"tokens": 7}},
        {"router": router, "ledgers": l, "reservation": "e-2"},
        {"router": router, "ledgers": l, "reservation": "e-3", "amount": {"tokens": 5}},
        {"router": router, "ledgers": l, "reservation": "bad id", "amount": {"tokens": 50}},
    ]});
    for round in 0..2 {
        let (s, v) = http(svc.addr, "POST", "/v1/end", Some(&batch));
        assert_eq!(s, 200, "{v}");
        let r = v["results"].as_array().unwrap();
        assert_eq!(r.len(), 4, "{v}");
        let found = if round == 0 { 2 } else { 0 };
        for ok in &r[..3] {
            assert_eq!(
                (&ok["ok"], &ok["holds_found"]),
                (&json!(true), &json!(found)),
                "{v}"
            );
        }
        assert_eq!(r[3]["ok"], false, "{v}");
        assert!(
            r[3]["error"].as_str().unwrap().contains("reservation"),
            "{v}"
        );
        assert_eq!(svc_tokens(&svc, &router, "b"), (12, 0), "round {round}");
    }
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"router": router, "ledgers": l, "reservation": format!("m-{i}")}))
        .collect();
    let (s, v) = http(svc.addr, "POST", "/v1/end", Some(&json!({ "ends": many })));
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 64"),
        "{v}"
    );
}

/// A team budget keeps ledgers for at most `max_teams` teams at a time: a new team beyond them
/// is refused (the same 429 as the embedded team table's), holds nothing and leaves nothing in
/// Redis; once a team's ledger has fully rolled off, its place goes to a new team. Clocks are
/// given (Redis time in the service).
#[test]
fn a_team_budget_admits_at_most_max_teams_and_frees_quiet_places() {
    let Some(redis) = common::redis() else { return };
    rt().block_on(async {
        let store = RedisStore::new(&redis.url(), &common::test_options(true, false)).unwrap();
        let router = unique("max-teams");
        let team = |t: &str| LedgerRef {
            budget: "t".into(),
            team: Some(t.into()),
            window_s: 1,
            max_tokens: Some(100),
            max_usd: None,
        };
        let all = LedgerRef {
            budget: "all".into(),
            team: None,
            window_s: 1,
            max_tokens: Some(1000),
            max_usd: None,
        };
        let t0 = 1_700_000_000_000u64;
        let ttl = 1000;
        let reserve = |at: u64, t: &str, id: &str| {
            let ledgers = vec![all.clone(), team(t)];
            let (store, router, id) = (&store, &router, id.to_string());
            async move {
                store
                    .reserve_all(
                        Some(at),
                        router,
                        &ledgers,
                        &id,
                        Amount::new(10, 0),
                        ttl,
                        Some(2),
                    )
                    .await
                    .unwrap()
            }
        };
        for (t, id) in [("a", "r1"), ("b", "r2")] {
            let got = reserve(t0, t, id).await;
            assert_eq!(got[1].0, Reserve::Held, "{t}: {got:?}");
            store
                .settle_all(
                    Some(t0),
                    &router,
                    &[all.clone(), team(t)],
                    id,
                    Some(Amount::new(3, 0)),
                    ttl,
                )
                .await
                .unwrap();
        }
        let got = reserve(t0 + 10, "c", "r3").await;
        assert!(
            matches!(got[1].0, Reserve::TeamsFull(w) if w >= 60),
            "{got:?}"
        );
        assert_eq!(got[0].0, Reserve::NotHeld, "all or nothing: {got:?}");
        assert_eq!(
            store
                .usage(Some(t0 + 10), &router, &all)
                .await
                .unwrap()
                .1
                .tokens,
            0
        );
        let port = redis
            .url()
            .rsplit(':')
            .next()
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let key = RedisStore::ledger_key(&router, &team("c"));
        let exists = std::process::Command::new("redis-cli")
            .args([
                "-p",
                &port,
                "exists",
                &format!("{key}:w"),
                &format!("{key}:r"),
                &format!("{key}:x"),
            ])
            .output()
            .expect("redis-cli runs");
        assert_eq!(
            String::from_utf8_lossy(&exists.stdout).trim(),
            "0",
            "a refused team leaves nothing"
        );
        // Both ledgers' keys live 1 s window + 1 s bucket + 1 s ttl + 60 s after their last write
        // (and the index adds a second): past that, a new team takes a quiet team's place.
        let later = t0 + 64_001;
        let got = reserve(later, "c", "r4").await;
        assert_eq!(got[1].0, Reserve::Held, "{got:?}");
        let active: Vec<String> = {
            let out = std::process::Command::new("redis-cli")
                .args([
                    "-p",
                    &port,
                    "zrange",
                    &RedisStore::active_key(&router, "t"),
                    "0",
                    "-1",
                ])
                .output()
                .expect("redis-cli runs");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        };
        assert_eq!(active.len(), 2, "{active:?}");
        assert!(active.contains(&"c".to_string()), "{active:?}");
    });
}

/// A window that grows while every call on the ledger is refused: its keys were set to expire
/// for the old window and must now last the new one, or the spend would go with them (a
/// refusal sets no expiry of its own).
#[test]
fn a_longer_window_keeps_the_ledger_in_redis_for_it() {
    let Some(redis) = common::redis() else { return };
    rt().block_on(async {
        let store = RedisStore::new(&redis.url(), &common::test_options(true, false)).unwrap();
        let router = unique("window-keys");
        let mut l = LedgerRef {
            budget: "b".into(),
            team: None,
            window_s: 1,
            max_tokens: Some(10),
            max_usd: None,
        };
        let ttl_ms = 1000;
        store
            .settle(
                Some(1_000),
                &router,
                &l,
                "x",
                Some(Amount::new(10, 0)),
                ttl_ms,
            )
            .await
            .unwrap();
        let key = format!("{}:w", RedisStore::ledger_key(&router, &l));
        let pttl = || {
            let out = std::process::Command::new("redis-cli")
                .args(["-p", &redis.port.to_string(), "PTTL"])
                .arg(&key)
                .output()
                .expect("redis-cli");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<i64>()
                .unwrap()
        };
        let before = pttl();
        assert!(
            before > 0 && before <= 63_000,
            "kept for the 1 s window: {before}"
        );
        l.window_s = 3600;
        let (got, _) = store
            .reserve(Some(1_500), &router, &l, "a", Amount::new(1, 0), ttl_ms)
            .await
            .unwrap();
        assert!(matches!(got, Reserve::Refused(_)), "{got:?}");
        let after = pttl();
        assert!(after >= 3_600_000, "kept for the 3600 s window: {after}");
    });
}

/// `POST /v1/lease` over HTTP: a lease granted and held, its report charging the use and
/// renewing it, the same report sent again charging nothing, and malformed reports refused
/// with the field named.
#[test]
fn lease_reports_over_http_charge_once_and_refuse_malformed_ones() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("lease");
    let ledger = ledger("all", None, 3600, 1000);
    let lease = |old: Option<&str>, id: &str, used: u64| {
        let mut req = json!({"router": router, "ledger": ledger, "id": id,
            "used": {"tokens": used}, "admitted": {"tokens": 0}, "max": {"tokens": 300}});
        if let Some(o) = old {
            req["old"] = json!(o);
        }
        http(svc.addr, "POST", "/v1/lease", Some(&req))
    };
    let (status, v) = lease(None, "g-1", 0);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["granted"]["tokens"], 300);
    assert_eq!(v["ledger"]["tokens_reserved"], 300);
    let (status, v) = lease(Some("g-1"), "g-2", 40);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["applied"].as_bool(), v["ledger"]["tokens_used"].as_u64()),
        (Some(true), Some(40))
    );
    let (_, v) = lease(Some("g-1"), "g-2", 40);
    assert_eq!(
        (v["applied"].as_bool(), v["ledger"]["tokens_used"].as_u64()),
        (Some(false), Some(40)),
        "{v}"
    );
    assert_eq!(v["granted"]["tokens"], 300);
    let (status, v) = lease(Some("g-2"), "", 0);
    assert_eq!(status, 400, "{v}");
    assert!(v.to_string().contains("reservation"), "{v}");
    let (status, v) = http(
        svc.addr,
        "POST",
        "/v1/lease",
        Some(&json!({"router": router, "ledger": ledger, "id": "x", "bogus": 1})),
    );
    assert_eq!(status, 400, "{v}");
}

/// A reserve that only holds refuse (what is spent leaves room for it) while a lease holds
/// room: the script asks the leases for their room back (`rc` on the ledger), the service tries
/// the reserve again for up to its `wait_ms`, and the lease's next report grants only what is in
/// flight on it (none here) instead of half the free room, so the waiting reserve is admitted.
/// Once no lease holds room, a reserve that holds refuse is refused at once (`Retry-After: 1`).
#[test]
fn a_reserve_refused_only_by_lease_room_waits_for_the_lease_to_give_it_back() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("reclaim");
    let ledger = ledger("all", None, 3600, 1000);
    let lease = |old: Option<&str>, id: &str| {
        let mut req = json!({"router": router, "ledger": ledger, "id": id,
            "used": {"tokens": 0}, "admitted": {"tokens": 0}, "max": {"tokens": 900}});
        if let Some(o) = old {
            req["old"] = json!(o);
        }
        http(svc.addr, "POST", "/v1/lease", Some(&req))
    };
    let reserve = |id: &str, tokens: u64, wait_ms: Option<u64>| {
        let mut req = json!({"router": router, "ledgers": [ledger], "amount": {"tokens": tokens},
            "reservation": id});
        if let Some(w) = wait_ms {
            req["wait_ms"] = json!(w);
        }
        let addr = svc.addr;
        move || http(addr, "POST", "/v1/reserve", Some(&req))
    };
    let (_, v) = lease(None, "g-1");
    assert_eq!(v["granted"]["tokens"], 500, "half the free room: {v}");
    assert_eq!(reserve("r-1", 400, None)().1["admitted"], true);
    let settle = json!({"router": router, "reservation": "r-1", "ledgers": [ledger],
        "amount": {"tokens": 400}});
    assert_eq!(http(svc.addr, "POST", "/v1/settle", Some(&settle)).0, 200);
    // Spent 400, the lease holds 500: a request of 350 fits what is spent (750), not the holds.
    let waiting = std::thread::spawn(reserve("r-2", 350, Some(4000)));
    let key = format!(
        "{}:w",
        RedisStore::ledger_key(&router, &serde_json::from_value(ledger.clone()).unwrap())
    );
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while redis::cmd("HGET")
        .arg(&key)
        .arg("rc")
        .query::<Option<String>>(&mut conn)
        .unwrap()
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no reserve asked for the lease's room"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The lease's report gives its room back: nothing is in flight on it, nothing is granted
    // (else half of the 600 free, which would still keep the request out).
    let (_, v) = lease(Some("g-1"), "g-2");
    assert_eq!(v["granted"]["tokens"], 0, "{v}");
    let (status, v) = waiting.join().unwrap();
    assert_eq!((status, v["admitted"].as_bool()), (200, Some(true)), "{v}");
    // No lease holds room now: holds alone refusing is answered at once.
    let (_, v) = reserve("r-3", 300, Some(4000))();
    assert_eq!(
        (v["admitted"].as_bool(), v["retry_after_s"].as_u64()),
        (Some(false), Some(1)),
        "{v}"
    );
}

/// Team leases over HTTP: a team's lease is held and charged on that team's ledger; a new
/// team's lease past `max_teams` live teams is granted nothing (no hold, no charge, the wait
/// named), as a reserve of that team would be refused; the live team's reports go on.
#[test]
fn team_leases_charge_their_team_and_a_new_team_past_max_teams_gets_none() {
    let Some(redis) = common::redis() else { return };
    let svc = InProcess::start(&redis.url(), true);
    let router = unique("team-lease");
    let lease = |team: &str, old: Option<&str>, id: &str, used: u64| {
        let mut req = json!({"router": router, "ledger": ledger("t", Some(team), 3600, 1000),
            "id": id, "used": {"tokens": used}, "admitted": {"tokens": 0},
            "max": {"tokens": 300}, "max_teams": 1});
        if let Some(o) = old {
            req["old"] = json!(o);
        }
        http(svc.addr, "POST", "/v1/lease", Some(&req))
    };
    let (status, v) = lease("red", None, "r-1", 0);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (
            v["granted"]["tokens"].as_u64(),
            v["ledger"]["team"].as_str()
        ),
        (Some(300), Some("red")),
        "{v}"
    );
    // Red's place in the index of active teams: taken by its first lease, and pushed later by
    // every report (as a settle does), so it is not given away while red's lease lives.
    let place = || {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port.to_string(), "ZSCORE"])
            .arg(format!("llmkube:{{{router}|t}}:active"))
            .arg("red")
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().parse::<u64>()
    };
    let first = place().expect("red placed by its first lease");
    std::thread::sleep(std::time::Duration::from_millis(5));
    let (_, v) = lease("red", Some("r-1"), "r-2", 40);
    assert_eq!(v["ledger"]["tokens_used"], 40, "{v}");
    assert!(place().unwrap() > first, "a report refreshes red's place");
    let (status, v) = lease("blue", None, "b-1", 0);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["granted"]["tokens"], 0, "{v}");
    assert!(v["teams_full"].as_u64().unwrap_or(0) > 0, "{v}");
    let (_, v) = lease("red", Some("r-2"), "r-3", 5);
    assert_eq!(
        (
            v["granted"]["tokens"].as_u64(),
            v["ledger"]["tokens_used"].as_u64()
        ),
        (Some(300), Some(45)),
        "{v}"
    );
    let (status, v) = http(
        svc.addr,
        "GET",
        &format!("/v1/status?router={router}"),
        None,
    );
    assert_eq!(status, 200, "{v}");
    let text = v.to_string();
    assert!(text.contains("red") && !text.contains("blue"), "{text}");
}
