//! Body edits that keep every other byte as the client sent it: only the value in one span
//! changes, so nothing the client wrote is re-serialised (and re-interpreted) on the way.

use crate::scan::Span;

/// `body` with the JSON value at `span` replaced by the string `value` (JSON-escaped).
pub fn replace_with_string(body: &[u8], span: Span, value: &str) -> Vec<u8> {
    let quoted = serde_json::to_string(value).unwrap_or_else(|_| String::from("\"\""));
    let mut out = Vec::with_capacity(body.len() - (span.1 - span.0) + quoted.len());
    out.extend_from_slice(&body[..span.0]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&body[span.1..]);
    out
}

/// The model span and the body length as the downstream filter hands them to the per-attempt
/// filter (`MODEL_SPAN_HEADER`): `<start>-<end>/<body length>`, byte offsets of the JSON string
/// token. The length lets an attempt that does not rewrite restore `content-length` after an
/// earlier attempt's rewrite changed it (Envoy keeps header edits across retries but re-sends the
/// original body).
pub fn format_span(span: Span, body_len: usize) -> String {
    format!("{}-{}/{}", span.0, span.1, body_len)
}

pub fn parse_span(value: &[u8]) -> Option<(Span, usize)> {
    let s = std::str::from_utf8(value).ok()?;
    let (span, len) = s.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let span = (a.parse().ok()?, b.parse().ok()?);
    let len: usize = len.parse().ok()?;
    (span.0 + 2 <= span.1 && span.1 <= len).then_some((span, len))
}

/// Rewrites `model` using only the body bytes up to the end of its span (`head`), so a large
/// body is neither scanned again nor copied whole: the result replaces `head` (Envoy's
/// drain-and-prepend). The value is the last thing in `head`, so it is replaced in place: with
/// `model` last in a big body, `head` is nearly the whole body, and each copy of it costs about
/// as much as scanning it. `None` unless `head[span]` is exactly the JSON string `expected`, i.e.
/// the span still points at the model the downstream filter routed on.
pub fn rewrite_head(mut head: Vec<u8>, span: Span, expected: &str, value: &str) -> Option<Vec<u8>> {
    if span.1 != head.len() {
        return None;
    }
    let token = head.get(span.0..span.1)?;
    if token.first() != Some(&b'"') {
        return None;
    }
    let current: String = serde_json::from_slice(token).ok()?;
    if current != expected {
        return None;
    }
    let quoted = serde_json::to_string(value).unwrap_or_else(|_| String::from("\"\""));
    head.truncate(span.0);
    head.extend_from_slice(quoted.as_bytes());
    Some(head)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::Scanner;

    #[test]
    fn head_rewrite_matches_whole_body_rewrite_and_checks_the_span() {
        let body =
            br#"{"messages":[{"role":"user","content":"x"}],"model":"qwen\/local","stream":true}"#;
        let f = Scanner::new().scan(body).unwrap();
        let span = f.spans.model.unwrap();
        assert_eq!(
            parse_span(format_span(span, body.len()).as_bytes()),
            Some((span, body.len()))
        );
        let head = rewrite_head(body[..span.1].to_vec(), span, "qwen/local", "gpt-5").unwrap();
        let mut via_head = head.clone();
        via_head.extend_from_slice(&body[span.1..]);
        assert_eq!(via_head, replace_with_string(body, span, "gpt-5"));
        // Anything that does not point at that model is refused.
        assert_eq!(
            rewrite_head(body[..span.1].to_vec(), span, "other", "gpt-5"),
            None
        );
        assert_eq!(
            rewrite_head(body[..span.1 - 1].to_vec(), span, "qwen/local", "g"),
            None
        );
        let shifted = (span.0 - 1, span.1 - 1);
        assert_eq!(
            rewrite_head(body[..shifted.1].to_vec(), shifted, "qwen/local", "g"),
            None
        );
        for bad in [
            &b""[..],
            b"12",
            b"5-6/9",
            b"-3/9",
            b"a-b/9",
            b"9-4/9",
            b"1-9",
            b"1-9/8",
            b"1-9/x",
            b"1-99999999999999999999999/9",
        ] {
            assert_eq!(parse_span(bad), None, "{:?}", bad);
        }
    }

    #[test]
    fn rewrites_only_the_model_value() {
        let body = br#"{"messages":[{"role":"user","content":"keep \u00e9 exactly"}], "model" : "local-qwen" ,"stream":true}"#;
        let f = Scanner::new().scan(body).unwrap();
        let out = replace_with_string(body, f.spans.model.unwrap(), "gpt-5 \"quoted\"");
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"messages":[{"role":"user","content":"keep \u00e9 exactly"}], "model" : "gpt-5 \"quoted\"" ,"stream":true}"#
        );
        let again = Scanner::new().scan(&out).unwrap();
        assert_eq!(again.model, "gpt-5 \"quoted\"");
        assert!(again.stream);
    }
}
