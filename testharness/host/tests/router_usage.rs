//! Token usage for every request, no budget needed: an OpenAI-shaped stream is asked for its
//! usage chunk (which the client then does not get, unless it asked), every 2xx response's
//! usage is read, and it is published in the audit line and as `gen_ai.client.token.usage` per
//! backend, model and team, in a bounded number of series.

use serde_json::Value;
use wasm_host::{Host, StreamOutcome};

mod support;
use support::*;

const STREAM: &str =
    r#"{"model":"qwen3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const CONTENT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\n";
const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn series(kind: &str, backend: &str, model: &str, team: &str) -> String {
    format!(
        "gen_ai_token_type=.={kind};.;llmkube_backend=.={backend};.;gen_ai_request_model=.={model};.;llmkube_team=.={team};.;gen_ai.client.token.usage"
    )
}

/// (count, sum) of a usage histogram; (0, 0) when it was never defined.
fn recorded(h: &Host, name: &str) -> (u64, u64) {
    h.metric(name).map_or((0, 0), |m| (m.count, m.sum))
}

fn answer(h: &mut Host, req: &StreamOutcome, content_type: &str, body: &str) -> String {
    assert!(req.local_response.is_none(), "{:?}", req.local_response);
    let res = h
        .run_response(
            req.stream,
            &[(":status", "200"), ("content-type", content_type)],
            body.as_bytes(),
            7,
        )
        .unwrap();
    h.log_and_done(req.stream).unwrap();
    String::from_utf8(res.forwarded_body).unwrap()
}

fn last_audit(h: &Host) -> Value {
    let line = h
        .logs_matching("llmkube-audit")
        .pop()
        .expect("an audit line");
    let json = &line[line.find('{').unwrap()..];
    serde_json::from_str(json).unwrap()
}

#[test]
fn an_unbudgeted_stream_is_asked_for_usage_and_the_client_does_not_get_the_chunk() {
    let mut h = router();
    let req = post(&mut h, &[], STREAM);
    let sent: Value = serde_json::from_slice(&req.forwarded_body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert!(sent.get("max_tokens").is_none(), "no budget: nothing else");
    let len = req
        .forwarded_headers
        .as_ref()
        .and_then(|hs| hs.iter().find(|(k, _)| k == "content-length"))
        .map(|(_, v)| v.clone());
    assert_eq!(len, Some(req.forwarded_body.len().to_string()));
    let got = answer(
        &mut h,
        &req,
        "text/event-stream",
        &format!("{CONTENT}{USAGE}{DONE}"),
    );
    assert_eq!(
        got,
        format!("{CONTENT}{DONE}"),
        "the chunk it did not ask for"
    );
    let audit = last_audit(&h);
    assert_eq!(
        audit["tokens"],
        serde_json::json!({"prompt": 12, "completion": 3, "cached": 8})
    );
    assert!(audit.get("usage_estimated").is_none());
    let s = |kind| series(kind, "qwen-small", "qwen3-8b", "none");
    assert_eq!(recorded(&h, &s("input")), (1, 12));
    assert_eq!(recorded(&h, &s("output")), (1, 3));
    assert_eq!(recorded(&h, &s("cached_input")), (1, 8));
}

#[test]
fn a_client_that_asked_keeps_the_chunk_and_one_that_said_false_is_left_alone() {
    let mut h = router();
    let asked = r#"{"model":"qwen3-8b","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
    let req = post(&mut h, &[("x-llmkube-client", "svc-a")], asked);
    assert_eq!(req.forwarded_body, asked.as_bytes(), "no edit");
    let body = format!("{CONTENT}{USAGE}{DONE}");
    assert_eq!(answer(&mut h, &req, "text/event-stream", &body), body);
    // The caller label is the team when no team budget names one.
    let s = |kind| series(kind, "qwen-small", "qwen3-8b", "svc-a");
    assert_eq!(recorded(&h, &s("input")), (1, 12));

    let refused = r#"{"model":"qwen3-8b","stream":true,"stream_options":{"include_usage":false},"messages":[]}"#;
    let req = post(&mut h, &[("x-llmkube-client", "svc-b")], refused);
    assert_eq!(req.forwarded_body, refused.as_bytes(), "no budget: as sent");
    answer(
        &mut h,
        &req,
        "text/event-stream",
        &format!("{CONTENT}{DONE}"),
    );
    // No usage reported: the audit line estimates and says so; the histograms record only
    // what an engine reported.
    let audit = last_audit(&h);
    assert_eq!(audit["usage_estimated"], true);
    let s = |kind| series(kind, "qwen-small", "qwen3-8b", "svc-b");
    assert_eq!(recorded(&h, &s("input")), (0, 0));
}

#[test]
fn a_json_response_is_read_on_every_api_shape() {
    let mut h = router();
    let body = r#"{"model":"qwen3-8b","messages":[{"role":"user","content":"hi"}]}"#;
    let req = post(&mut h, &[], body);
    assert_eq!(req.forwarded_body, body.as_bytes(), "not a stream: no edit");
    let res = r#"{"choices":[{"message":{"content":"x"}}],"usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":16},"output_tokens":2}}"#;
    assert_eq!(answer(&mut h, &req, "application/json", res), res);
    let s = |kind| series(kind, "qwen-small", "qwen3-8b", "none");
    assert_eq!(recorded(&h, &s("input")), (1, 30));
    assert_eq!(recorded(&h, &s("output")), (1, 2));
    assert_eq!(recorded(&h, &s("cached_input")), (1, 16));
    assert_eq!(last_audit(&h)["tokens"]["cached"], 16);
    // A failed response is not read.
    let req = post(&mut h, &[], body);
    let res = h
        .run_response(
            req.stream,
            &[(":status", "400"), ("content-type", "application/json")],
            res.as_bytes(),
            0,
        )
        .unwrap();
    h.log_and_done(req.stream).unwrap();
    assert!(res.local_response.is_none());
    assert_eq!(recorded(&h, &s("input")), (1, 30));
}

#[test]
fn series_are_bounded_per_worker() {
    let mut h = router();
    let body = r#"{"model":"qwen3-8b","messages":[]}"#;
    let res = r#"{"usage":{"prompt_tokens":1,"completion_tokens":1}}"#;
    for i in 0..300 {
        let team = format!("t{i}");
        let req = post(&mut h, &[("x-llmkube-client", team.as_str())], body);
        answer(&mut h, &req, "application/json", res);
    }
    let defined = h
        .metrics()
        .iter()
        .filter(|m| m.name.ends_with(";.;gen_ai.client.token.usage"))
        .count();
    // 256 series and the backend's `other`, three token types each.
    assert_eq!(defined, 3 * 257);
    let other = series("input", "qwen-small", "other", "other");
    assert_eq!(recorded(&h, &other), (300 - 256, 300 - 256));
}
