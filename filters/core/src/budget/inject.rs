//! Asking an OpenAI-shaped backend for usage on a stream: `stream_options.include_usage: true`,
//! added with a byte edit that keeps everything else as the client sent it.

use super::bound::RequestFacts;
use crate::scan::{Fields, Span};

const OPTION: &[u8] = br#""include_usage":true"#;

/// Whether a stream on this API path needs asking for usage: OpenAI chat and completions send
/// it only when asked; the Responses and Anthropic messages streams always carry it.
pub fn stream_needs_asking(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    matches!(path, "/v1/chat/completions" | "/v1/completions")
}

/// The body to send upstream when the gateway must add `include_usage` (a `stream: true` request
/// whose client did not set it), or `None` when the body goes as sent: not streaming, the client
/// said `true` (it wants the chunk) or `false` (the gateway then estimates), or `stream_options`
/// is something other than an object or null (the backend will refuse it anyway).
/// When `Some`, the client did not ask for the usage chunk and the response reader should strip it.
pub fn add_include_usage(body: &[u8], fields: &Fields, facts: &RequestFacts) -> Option<Vec<u8>> {
    if !fields.stream || facts.include_usage.is_some() {
        return None;
    }
    match fields.spans.stream_options {
        None => {
            let close = body.iter().rposition(|&c| c == b'}')?;
            let mut out = Vec::with_capacity(body.len() + OPTION.len() + 20);
            out.extend_from_slice(&body[..close]);
            out.extend_from_slice(br#","stream_options":{"#);
            out.extend_from_slice(OPTION);
            out.push(b'}');
            out.extend_from_slice(&body[close..]);
            Some(out)
        }
        Some((a, b)) => {
            let value = body.get(a..b)?;
            let mut out = Vec::with_capacity(body.len() + OPTION.len() + 2);
            out.extend_from_slice(&body[..a]);
            if value == b"null" {
                out.push(b'{');
                out.extend_from_slice(OPTION);
                out.push(b'}');
            } else if value.first() == Some(&b'{') {
                let empty = value[1..]
                    .iter()
                    .all(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'}'));
                out.push(b'{');
                out.extend_from_slice(OPTION);
                if !empty {
                    out.push(b',');
                }
                out.extend_from_slice(&value[1..]);
            } else {
                return None;
            }
            out.extend_from_slice(&body[b..]);
            Some(out)
        }
    }
}

/// The body with `"max_tokens": n` added as its last top-level member: the client set no
/// completion cap and the backend declares no context length, so the gateway sets one the backend
/// enforces for the reserved bound to hold ([`super::bound::Bound::set_max_tokens`]). `None` when
/// the body has no closing brace (the scanner accepted no such body).
pub fn add_max_tokens(body: &[u8], n: u64) -> Option<Vec<u8>> {
    let close = body.iter().rposition(|&c| c == b'}')?;
    let member = format!(",\"max_tokens\":{n}");
    let mut out = Vec::with_capacity(body.len() + member.len());
    out.extend_from_slice(&body[..close]);
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(&body[close..]);
    Some(out)
}

/// Where a span of the client's body (the `model` token) is after [`add_include_usage`] made the
/// body `grew` bytes longer: the edit is at `stream_options` (or at the closing brace, after
/// every member), so only a span after `stream_options` moves.
pub fn span_after_include_usage(span: Span, fields: &Fields, grew: usize) -> Span {
    match fields.spans.stream_options {
        Some((a, _)) if span.0 > a => (span.0 + grew, span.1 + grew),
        _ => span,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::bound::request_facts;
    use crate::scan::Scanner;

    fn inject(body: &str) -> Option<String> {
        let fields = Scanner::new().scan(body.as_bytes()).unwrap();
        let facts = request_facts(body.as_bytes(), &fields);
        add_include_usage(body.as_bytes(), &fields, &facts).map(|b| String::from_utf8(b).unwrap())
    }

    fn options(body: &str) -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["stream_options"].clone()
    }

    #[test]
    fn adds_include_usage_only_when_the_client_did_not_say() {
        let got = inject(r#"{"model":"m","stream":true,"messages":[]}"#).unwrap();
        assert_eq!(
            got,
            r#"{"model":"m","stream":true,"messages":[],"stream_options":{"include_usage":true}}"#
        );
        let got = inject("{\"model\":\"m\",\"stream\":true,\"stream_options\":{ \"x\" : 1 } }\n")
            .unwrap();
        assert_eq!(
            options(&got),
            serde_json::json!({"include_usage": true, "x": 1})
        );
        assert!(got.ends_with(" }\n"));
        let got = inject(r#"{"model":"m","stream":true,"stream_options":{ }}"#).unwrap();
        assert_eq!(options(&got), serde_json::json!({"include_usage": true}));
        let got = inject(r#"{"model":"m","stream_options":null,"stream":true}"#).unwrap();
        assert_eq!(options(&got), serde_json::json!({"include_usage": true}));
        for as_sent in [
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m","stream":false}"#,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":false}}"#,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"model":"m","stream":true,"stream_options":[]}"#,
        ] {
            assert_eq!(inject(as_sent), None, "{as_sent}");
        }
    }

    #[test]
    fn only_openai_chat_and_completions_streams_need_asking() {
        assert!(stream_needs_asking("/v1/chat/completions"));
        assert!(stream_needs_asking("/v1/completions?x=1"));
        assert!(!stream_needs_asking("/v1/responses"));
        assert!(!stream_needs_asking("/v1/messages"));
        assert!(!stream_needs_asking("/v1/embeddings"));
    }

    #[test]
    fn the_edited_body_still_scans_with_the_same_model() {
        for body in [
            r#"{"model":"m","stream":true}"#,
            r#"{"stream":true,"model":"m","stream_options":{"a":{"b":[1,2]}}}"#,
        ] {
            let got = inject(body).unwrap();
            let fields = Scanner::new().scan(got.as_bytes()).unwrap();
            assert_eq!(fields.model, "m");
            assert_eq!(options(&got)["include_usage"], serde_json::json!(true));
        }
    }

    #[test]
    fn max_tokens_goes_last_and_the_model_span_follows_the_edit() {
        let body = br#"{"stream_options":null,"stream":true,"model":"m"} "#;
        let got = add_max_tokens(body, 4096).unwrap();
        assert_eq!(
            got,
            br#"{"stream_options":null,"stream":true,"model":"m","max_tokens":4096} "#
        );
        let fields = Scanner::new().scan(body).unwrap();
        let facts = request_facts(body, &fields);
        let edited = add_include_usage(body, &fields, &facts).unwrap();
        let span = fields.spans.model.unwrap();
        let moved = span_after_include_usage(span, &fields, edited.len() - body.len());
        assert_eq!(&edited[moved.0..moved.1], br#""m""#);
        // A model before stream_options stays where it was.
        let body = br#"{"model":"m","stream":true,"stream_options":{}}"#;
        let fields = Scanner::new().scan(body).unwrap();
        let facts = request_facts(body, &fields);
        let edited = add_include_usage(body, &fields, &facts).unwrap();
        let span = fields.spans.model.unwrap();
        let kept = span_after_include_usage(span, &fields, edited.len() - body.len());
        assert_eq!(&edited[kept.0..kept.1], br#""m""#);
        assert_eq!(add_max_tokens(b"no object", 1), None);
    }
}
