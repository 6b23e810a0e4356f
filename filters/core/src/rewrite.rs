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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::Scanner;

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
