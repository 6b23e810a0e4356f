//! A whole request decision: fuzzed headers and body through scanner and router. Beyond not
//! panicking, it checks the security invariant: a request classified pii is never given a
//! cloud backend, whatever set of backends is quarantined (taken from the input's first byte),
//! and every order it stamps has a route (is one the generator enumerates).
#![no_main]
use libfuzzer_sys::fuzz_target;
use router_core::config::{PluginConfig, Tier};
use router_core::router::{RequestHeaders, Router};
use router_core::scan::Scanner;
use std::sync::OnceLock;

fn router() -> &'static Router {
    static R: OnceLock<Router> = OnceLock::new();
    R.get_or_init(|| {
        let cfg: PluginConfig =
            serde_json::from_str(include_str!("../route_request_router.json")).unwrap();
        Router::new(cfg).unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    // Layout: up to 4 header lines "name:value\n", a blank line, then the body.
    let split = data.windows(2).position(|w| w == b"\n\n").unwrap_or(0);
    let (head, body) = data.split_at(split);
    let body = body.get(2..).unwrap_or(&[]);
    let mut headers = RequestHeaders::new();
    let mut sensitive = false;
    for line in head.split(|&b| b == b'\n').take(4) {
        let line = String::from_utf8_lossy(line);
        if let Some((n, v)) = line.split_once(':') {
            let n = n.trim().to_ascii_lowercase();
            if n == "x-llmkube-classification"
                && v.split(',').any(|c| ["pii", "phi"].contains(&c.trim().to_ascii_lowercase().as_str()))
            {
                sensitive = true;
            }
            headers.push(n, v.to_string());
        }
    }
    let mut scanner = Scanner::new();
    let Ok(fields) = scanner.scan(body) else { return };
    let r = router();
    let mut n = data.len() as u64;
    let down = data.first().copied().unwrap_or(0);
    let healthy = |b: usize| b >= 8 || down & (1 << b) == 0;
    if let Ok(d) = r.decide_among(&fields.model, &headers, &healthy, &mut || { n = n.wrapping_mul(6364136223846793005).wrapping_add(1); n }) {
        if sensitive {
            assert!(d.order.iter().all(|&b| r.backend(b).tier == Tier::Local), "pii routed to cloud");
        }
        if let Some(ri) = d.rule {
            assert!(r.rule_orders(ri).contains(&d.order), "order {:?} has no route", d.order);
        }
    }
});
