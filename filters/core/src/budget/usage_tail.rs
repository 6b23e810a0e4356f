//! The usage of a JSON response that arrived whole, read from its end.
//!
//! OpenAI's chat and Responses bodies and Anthropic's messages put `usage` last: the body ends
//! `"usage":{…}}`. When it does, the object is read where it stands and nothing before it is
//! walked; only a search for a raw `usage"` runs over the rest, and only when the object does not
//! set every count (prompt, completion, cached) itself. Otherwise the caller walks the body as
//! before ([`super::usage::UsageReader`]).
//!
//! Why the answer is the walk's, for a body that is one JSON object:
//! - the body's last byte (whitespace aside) is outside any string; walking back from it over
//!   bytes without a backslash, every quote is a delimiter, so whether a byte is inside a string
//!   is known from the count of quotes after it: the object before the last `}` is found by its
//!   brackets outside strings, and before it `:` and a string `"usage"` (with `,` or `{` before
//!   it): the key `usage`;
//! - after the key's object come only whitespace, one `}` and whitespace: that `}` is the last
//!   byte of the document, so it closes the top-level object, and the key is a top-level member,
//!   the object one the walk captures;
//! - nothing comes after it, so the walk captures no later object, and of earlier ones each
//!   count it read would be overridden by this object's, unless this one lacks it: then the
//!   bytes before it must hold no key `usage` (a key the walk reads is its raw bytes between
//!   quotes, so no raw `usage"` means none), and the walk captured nothing else.
//!
//! A body that is not valid JSON may be read differently from the walk (which does not validate
//! either: a backend's bytes are only read for accounting); the property tests and the
//! `usage_stream` fuzz target compare the two on every body serde_json accepts as an object.

use super::usage::MAX_USAGE_BYTES;
use super::usage_object::{parse_usage, Usage};

const KEY: &[u8] = b"\"usage\"";

/// The usage of `body`, a whole JSON response, when its end proves it (see the module doc);
/// `None`: walk the body.
pub fn whole_json_usage(body: &[u8]) -> Option<Usage> {
    let end = trim_end(body, body.len());
    if end == 0 || body[end - 1] != b'}' {
        return None;
    }
    let close = trim_end(body, end - 1).checked_sub(1)?;
    if body[close] != b'}' {
        return None;
    }
    let open = object_start(body, close)?;
    let colon = trim_end(body, open).checked_sub(1)?;
    if body[colon] != b':' {
        return None;
    }
    let at = trim_end(body, colon).checked_sub(KEY.len())?;
    if &body[at..at + KEY.len()] != KEY {
        return None;
    }
    let before = trim_end(body, at);
    if before == 0 || !matches!(body[before - 1], b',' | b'{') {
        return None;
    }
    let usage = parse_usage(&body[open..=close]);
    let complete = usage.prompt.is_some() && usage.completion.is_some() && usage.cached.is_some();
    if !complete && holds_usage_key(&body[..at]) {
        return None;
    }
    Some(usage)
}

fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// The length of `b[..to]` without its trailing whitespace.
fn trim_end(b: &[u8], mut to: usize) -> usize {
    while to > 0 && is_ws(b[to - 1]) {
        to -= 1;
    }
    to
}

/// The `{` that opens the object closed by the `}` at `close`, found walking backwards, within
/// [`MAX_USAGE_BYTES`] (a longer object is not captured by the walk). The bytes from there to
/// the body's end are outside a string at the end; with no backslash among them, every quote in
/// them is a delimiter, so walking back each quote enters or leaves a string and brackets count
/// only outside strings. A backslash: `None` (an escaped quote would break that count).
fn object_start(b: &[u8], close: usize) -> Option<usize> {
    let floor = close.saturating_sub(MAX_USAGE_BYTES - 1);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut i = close;
    loop {
        match b[i] {
            b'\\' => return None,
            b'"' => in_string = !in_string,
            b'}' | b']' if !in_string => depth += 1,
            b'{' | b'[' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return (b[i] == b'{').then_some(i);
                }
            }
            _ => {}
        }
        if i == floor {
            return None;
        }
        i -= 1;
    }
}

/// Whether `b` holds a raw `usage"`: the end of a key the walk would read as `usage`.
fn holds_usage_key(b: &[u8]) -> bool {
    crate::fast::quote_after(b, b"usage")
}

/// The property the unit tests and the `usage_stream` fuzz target check: on a body serde_json
/// accepts as a JSON object, an answer from the end is the walk's.
#[doc(hidden)]
pub fn agrees_with_walk(body: &[u8]) -> Result<(), String> {
    let Some(tail) = whole_json_usage(body) else {
        return Ok(());
    };
    if !matches!(
        serde_json::from_slice::<serde_json::Value>(body),
        Ok(serde_json::Value::Object(_))
    ) {
        return Ok(());
    }
    let mut r = super::usage::UsageReader::new(super::usage::BodyKind::Json, false);
    let mut out = Vec::new();
    r.feed(body, &mut out);
    let walked = r.finish(&mut out);
    if walked != tail {
        return Err(format!("read from the end {tail:?}, walked {walked:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(p: u64, c: u64, cached: Option<u64>) -> Option<Usage> {
        Some(Usage {
            prompt: Some(p),
            completion: Some(c),
            cached,
        })
    }

    #[test]
    fn real_shapes_are_read_from_the_end() {
        let openai = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":200,"completion_tokens":16,"total_tokens":216}}"#;
        assert_eq!(whole_json_usage(openai), u(200, 16, None));
        let cached = br#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}
"#;
        assert_eq!(whole_json_usage(cached), u(9, 2, Some(4)));
        let anthropic = br#"{"type":"message","content":[{"type":"text","text":"hi"}], "usage" : { "input_tokens":10,"cache_read_input_tokens":5,"output_tokens":7 } }"#;
        assert_eq!(whole_json_usage(anthropic), u(15, 7, Some(5)));
    }

    #[test]
    fn only_a_provable_top_level_last_member_is_taken() {
        for body in [
            // Nested: two closes follow.
            &br#"{"a":{"usage":{"prompt_tokens":1,"completion_tokens":1}}}"#[..],
            // Escaped quote: inside a string value.
            br#"{"a":"x\"usage\":{\"prompt_tokens\":1}}"}"#,
            // Not last.
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":1},"b":1}"#,
            // An earlier key `usage` and this object lacks a count: the walk merges them.
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":1}},"usage":{"prompt_tokens":2,"completion_tokens":2}}"#,
            br#"{"message":{"usage":{"prompt_tokens":1}},"usage":{"completion_tokens":2}}"#,
            // Not an object's end.
            br#"["usage":{}]"#,
            b"",
        ] {
            assert_eq!(whole_json_usage(body), None, "{}", String::from_utf8_lossy(body));
            agrees_with_walk(body).unwrap();
        }
        // Complete counts override anything earlier, as in the walk.
        let body = br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        assert_eq!(whole_json_usage(body), u(2, 3, Some(0)));
        agrees_with_walk(body).unwrap();
    }

    /// Generated objects whose members are drawn from what can fool a read from the end: keys
    /// `usage` at the top, under `message`/`response` and deeper, strings holding `"usage":{…}}`
    /// with escapes, partial and complete usage objects, whitespace; every read from the end
    /// must be the walk's, and the common shape must be read from the end (the mechanism on).
    #[test]
    fn generated_objects_read_from_the_end_as_the_walk() {
        const MEMBERS: [&str; 14] = [
            r#""usage":{"prompt_tokens":4,"completion_tokens":5}"#,
            r#""usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}"#,
            r#""usage":{"input_tokens":3,"cache_read_input_tokens":2,"output_tokens":1}"#,
            r#""usage" : {"completion_tokens":7}"#,
            r#""usage":null"#,
            r#""message":{"usage":{"prompt_tokens":8}}"#,
            r#""response":{"usage":{"output_tokens":9,"input_tokens":1}}"#,
            r#""choices":[{"message":{"content":"x\"usage\":{\"prompt_tokens\":99}}"}}]"#,
            r#""a":{"usage":{"prompt_tokens":6,"completion_tokens":6}}"#,
            r#""t":"usage\"}"#,
            r#""t":"\\""#,
            r#""usage":{"prompt_tokens":"x"}"#,
            r#""n":[1,{"usage":{}}]"#,
            r#""id":"chatcmpl-1""#,
        ];
        let mut next = crate::test_rng::xorshift(0x2545_f491_4f6c_dd1du64);
        let mut from_end = 0;
        for _ in 0..5000 {
            let mut doc = String::from("{");
            let n = 1 + next() % 5;
            for k in 0..n {
                if k > 0 {
                    doc.push_str(if next().is_multiple_of(3) {
                        " ,\n"
                    } else {
                        ","
                    });
                }
                doc.push_str(MEMBERS[(next() % MEMBERS.len() as u64) as usize]);
            }
            doc.push_str(if next().is_multiple_of(2) {
                "}"
            } else {
                " }\n"
            });
            if whole_json_usage(doc.as_bytes()).is_some() {
                from_end += 1;
            }
            if let Err(e) = agrees_with_walk(doc.as_bytes()) {
                panic!("{e}: {doc}");
            }
        }
        assert!(from_end > 1000, "{from_end} of 5000 read from the end");
    }
}
