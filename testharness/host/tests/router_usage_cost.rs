//! The usage of a JSON answer that arrives whole is read from its end (`usage` is its last
//! member in OpenAI's and Anthropic's bodies): the guest's work for the response body does not
//! grow with the completion's length. Counted in wasm instructions (wasmtime fuel, the same on
//! any machine), so these tests are a binary of their own: the process-wide engine meters fuel
//! only when `WASM_HOST_FUEL` is set before it is made.

use serde_json::Value;
use wasm_host::Host;

mod support;
use support::*;

const CHAT: &str = r#"{"model":"qwen3-8b","messages":[{"role":"user","content":"hi"}]}"#;

fn completion(content_len: usize) -> String {
    format!(
        r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":12,"completion_tokens":{},"total_tokens":99,"prompt_tokens_details":{{"cached_tokens":4}}}}}}"#,
        "word ".repeat(content_len / 5),
        content_len / 5
    )
}

/// Instructions the guest spends on the response (headers and body), and the audit's tokens.
fn answered(h: &mut Host, body: &str) -> (u64, Value) {
    let req = post(h, &[], CHAT);
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    let before = h.fuel_used().expect("fuel is metered");
    h.run_response(
        req.stream,
        &[(":status", "200"), ("content-type", "application/json")],
        body.as_bytes(),
        0,
    )
    .unwrap();
    let spent = h.fuel_used().unwrap() - before;
    h.log_and_done(req.stream).unwrap();
    let line = h
        .logs_matching("llmkube-audit")
        .pop()
        .expect("an audit line");
    let audit: Value = serde_json::from_str(&line[line.find('{').unwrap()..]).unwrap();
    (spent, audit["tokens"].clone())
}

/// A router on the fuel-metering engine: the variable is set before the process-wide engine is
/// made (`Once`: by the first test to get here, before it makes a host).
fn metered_router() -> Host {
    static METERED: std::sync::Once = std::sync::Once::new();
    // SAFETY: set once, before any engine exists; the tests of this binary read no environment
    // until a host is made, which waits for this.
    METERED.call_once(|| unsafe { std::env::set_var("WASM_HOST_FUEL", "1") });
    router()
}

#[test]
fn a_whole_json_answers_usage_costs_the_same_at_any_length() {
    let mut h = metered_router();
    // Warm: the first request defines the usage series.
    answered(&mut h, &completion(100));
    let (short, tokens) = answered(&mut h, &completion(100));
    let (long, long_tokens) = answered(&mut h, &completion(64 * 1024));
    assert_eq!(tokens["prompt"], 12);
    assert_eq!(tokens["cached"], 4);
    assert_eq!(long_tokens["completion"], 64 * 1024 / 5);
    // Walking 64 KiB of content costs thousands of instructions more (about one per 2 bytes
    // with the 16-byte string search); reading from the end costs the same.
    assert!(
        long <= short + 1_000,
        "response: {short} instructions at 100 bytes of content, {long} at 64 KiB"
    );
}

/// Read from the end, a `usage` that lacks a count is taken only when no `usage` key comes
/// before it (the walk would merge that one's counts in): the module's 16-byte search for that
/// key, with the key at every offset against the 16-byte blocks.
#[test]
fn an_earlier_usage_key_is_merged_as_the_walk_merges_it() {
    let mut h = metered_router();
    for pad in 0..18 {
        let body = format!(
            r#"{{"id":"c",{}"message":{{"usage":{{"prompt_tokens":7}}}},"choices":[],"usage":{{"completion_tokens":3}}}}"#,
            " ".repeat(pad)
        );
        let (_, tokens) = answered(&mut h, &body);
        assert_eq!(tokens["prompt"], 7, "{body}");
        assert_eq!(tokens["completion"], 3, "{body}");
    }
}
