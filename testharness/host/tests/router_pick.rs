//! The pick step's workers on one shared store (Envoy's `--concurrency 2`): what one worker
//! picks reaches the others' queues from the first request on, not from its first root tick.

mod support;

use serde_json::json;
use support::*;
use wasm_host::{Host, SharedStore};

const PODS: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];

/// A worker with its own randomness (`seed`), as Envoy's workers each draw their own.
fn pick_worker(shared: &SharedStore, seed: u64) -> Host {
    let mut c = router_config();
    c["backends"][0]["pick"] = json!({
        "endpoints": PODS,
        "prefix_affinity": {"block_bytes": 256}
    });
    worker(shared, &c, Some(seed))
}

/// The members of the pick channel, in the order they joined.
fn members(shared: &SharedStore) -> Vec<String> {
    let (list, _) = shared
        .get("", "llmkube.pick-events/llm/demo")
        .expect("the pick channel's member list");
    String::from_utf8(list)
        .unwrap()
        .split('\n')
        .map(str::to_string)
        .collect()
}

/// The worker that joined first knew no other when it joined. Without the later worker's hello
/// it would learn of it on its first root tick (100 ms), and its picks before that, at startup,
/// would never reach the other worker: the other's picture of the pods would lack them for
/// good (the e2e `a_pod_sent_far_more_prefill_than_the_others_sheds_its_known_prefix` once saw
/// its probe picked on such a worker).
#[test]
fn the_first_worker_s_first_pick_reaches_a_worker_that_joined_after_it() {
    let shared = SharedStore::new();
    let mut first = pick_worker(&shared, 1);
    let mut second = pick_worker(&shared, 2);
    let names = members(&shared);
    assert_eq!(names.len(), 2, "{names:?}");
    let (first_q, second_q) = (&names[0], &names[1]);
    // The hello is all that waits on the first worker's queue; nothing on the second's.
    assert_eq!(shared.queue_len("", first_q), Some(1));
    assert_eq!(shared.queue_len("", second_q), Some(0));

    let body = json!({
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "a prompt of some length ".repeat(40)}]
    })
    .to_string();
    let o = post(&mut first, &[], &body);
    let pod = o
        .header("x-gateway-destination-endpoint")
        .unwrap_or_else(|| panic!("picked: {:?}", o.forwarded_headers));
    assert!(PODS.contains(&pod), "{pod}");
    assert_eq!(shared.queue_len("", first_q), Some(0), "the hello was read");
    assert!(
        shared.queue_len("", second_q).unwrap() >= 1,
        "the first worker's pick went to the worker that joined after it"
    );
    // The second worker reads it (and no hello of its own comes back to it as an event).
    let o = post(&mut second, &[], &body);
    assert_eq!(o.header("x-gateway-destination-endpoint"), Some(pod));
}
