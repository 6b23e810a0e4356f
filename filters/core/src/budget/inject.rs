//! The gateway's edits to a request body for budgets: `stream_options.include_usage: true` for an
//! OpenAI-shaped stream, `max_tokens` when nothing else bounds the completion. Byte edits that
//! keep everything else as the client sent it.
//!
//! Envoy lets a filter replace only the first bytes of a buffered body (`proxy_set_buffer_bytes`
//! from offset 0: drain that many, prepend the new ones), so the edits are made as one splice of
//! the body's head ([`Splice`]): new members go right after the opening brace, and an existing
//! `stream_options` object is edited where it is. The rest of the body (the prompt, most of it)
//! is neither read back nor copied. Member order means nothing in JSON, and the scanner refuses
//! duplicate keys, so a member the client did not send can go first.

use super::bound::RequestFacts;
use crate::scan::{Fields, Span};

const OPTION: &[u8] = br#""include_usage":true"#;

/// Whether a stream on this API path needs asking for usage: OpenAI chat and completions send
/// it only when asked; the Responses and Anthropic messages streams always carry it.
pub fn stream_needs_asking(path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    matches!(path, "/v1/chat/completions" | "/v1/completions")
}

/// What to change in a request body, before its bytes are looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edits {
    /// The opening brace.
    open: usize,
    /// `stream_options` to edit in place (the client sent it without `include_usage`).
    options: Option<Span>,
    /// Members to add after the opening brace, each followed by a comma.
    front: Vec<u8>,
    /// `include_usage` is to be asked for (in `front` or in `options`).
    ask: bool,
}

/// The edits as one replacement of the body's first `replace` bytes by `with`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Splice {
    pub replace: usize,
    pub with: Vec<u8>,
    /// The gateway added `include_usage`: the usage-only chunk is not the client's, strip it.
    pub asked: bool,
    /// Where bytes were added, in the client's body, and how many: `(at, grew)`, in order.
    moves: Vec<(usize, usize)>,
}

impl Splice {
    /// Length of the edited body, from the client's `len`.
    pub fn new_len(&self, len: usize) -> usize {
        len - self.replace + self.with.len()
    }

    /// Where a span of the client's body (the `model` token) is in the edited body.
    pub fn moved(&self, span: Span) -> Span {
        let grew: usize = self
            .moves
            .iter()
            .filter(|(at, _)| *at <= span.0)
            .map(|(_, g)| g)
            .sum();
        (span.0 + grew, span.1 + grew)
    }

    /// The whole edited body (tests, and hosts that rewrite bodies whole).
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        let mut out = self.with.clone();
        out.extend_from_slice(&body[self.replace.min(body.len())..]);
        out
    }
}

/// The edits a request needs: `ask_usage` (a budgeted stream on a path that needs asking) unless
/// the client asked for usage itself (a client's `include_usage: false` is turned into `true`:
/// the charge is then the engine's count, not an estimate, and the client still gets no usage
/// chunk), and `max_tokens` = `set_max_tokens`. `None`: the body goes as sent.
pub fn edits(
    fields: &Fields,
    facts: &RequestFacts,
    ask_usage: bool,
    set_max_tokens: Option<u64>,
) -> Option<Edits> {
    let ask = ask_usage && fields.stream && facts.include_usage != Some(true);
    let mut front = Vec::new();
    if let Some(n) = set_max_tokens {
        front.extend_from_slice(format!("\"max_tokens\":{n},").as_bytes());
    }
    let options = fields.spans.stream_options.filter(|_| ask);
    if ask && options.is_none() {
        front.extend_from_slice(br#""stream_options":{"#);
        front.extend_from_slice(OPTION);
        front.extend_from_slice(b"},");
    }
    if front.is_empty() && options.is_none() {
        return None;
    }
    Some(Edits {
        open: fields.knobs.open,
        options,
        front,
        ask,
    })
}

impl Edits {
    /// How many of the body's first bytes the splice is made from (and replaces): up to the
    /// opening brace, or to the end of a `stream_options` edited in place.
    pub fn needed(&self) -> usize {
        self.options.map_or(self.open + 1, |(_, b)| b)
    }

    /// The splice, from `head`: the body's first [`Edits::needed`] bytes (`None` if it is
    /// shorter). A `stream_options` that is neither an object nor null is left alone (the
    /// backend refuses it anyway): then usage is not asked for.
    pub fn splice(&self, head: &[u8]) -> Option<Splice> {
        let head = head.get(..self.needed())?;
        let body_open = self.open + 1;
        let mut with = Vec::with_capacity(head.len() + self.front.len() + OPTION.len() + 2);
        with.extend_from_slice(&head[..body_open]);
        with.extend_from_slice(&self.front);
        let mut moves = Vec::with_capacity(2);
        if !self.front.is_empty() {
            moves.push((body_open, self.front.len()));
        }
        let mut asked = self.ask;
        if let Some((a, b)) = self.options {
            with.extend_from_slice(&head[body_open..a]);
            let value = &head[a..b];
            let before = with.len();
            if value == b"null" {
                with.push(b'{');
                with.extend_from_slice(OPTION);
                with.push(b'}');
            } else if let Some(at) = false_include_usage(value) {
                // `false` becomes `true ` (a space after a value is JSON): same length, so no
                // byte after it moves.
                with.extend_from_slice(&value[..at]);
                with.extend_from_slice(b"true ");
                with.extend_from_slice(&value[at + 5..]);
            } else if value.first() == Some(&b'{') {
                let empty = value[1..]
                    .iter()
                    .all(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r' | b'}'));
                with.push(b'{');
                with.extend_from_slice(OPTION);
                if !empty {
                    with.push(b',');
                }
                with.extend_from_slice(&value[1..]);
            } else {
                with.extend_from_slice(value);
                asked = false;
            }
            let grew = (with.len() - before) - value.len();
            if grew > 0 {
                // Inside the value: only what comes after its start moves.
                moves.push((a + 1, grew));
            }
        }
        if moves.is_empty() && !(asked && self.options.is_some()) {
            return None;
        }
        Some(Splice {
            replace: head.len(),
            with,
            asked,
            moves,
        })
    }
}

/// Where the `false` of a member `"include_usage": false` directly inside the JSON object
/// `value` starts (the body was validated by the scanner, which refuses duplicate keys).
fn false_include_usage(value: &[u8]) -> Option<usize> {
    const KEY: &[u8] = br#""include_usage""#;
    let (mut depth, mut i) = (0usize, 0usize);
    while i < value.len() {
        match value[i] {
            b'"' => {
                let start = i;
                i += 1;
                while i < value.len() && value[i] != b'"' {
                    i += if value[i] == b'\\' { 2 } else { 1 };
                }
                let end = (i + 1).min(value.len());
                if depth == 1 && value.get(start..end) == Some(KEY) {
                    let mut j = end;
                    while value.get(j).is_some_and(|c| c.is_ascii_whitespace()) {
                        j += 1;
                    }
                    if value.get(j) == Some(&b':') {
                        j += 1;
                        while value.get(j).is_some_and(|c| c.is_ascii_whitespace()) {
                            j += 1;
                        }
                        if value.get(j..j + 5) == Some(b"false") {
                            return Some(j);
                        }
                    }
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::bound::request_facts;
    use crate::scan::Scanner;
    use serde_json::{json, Value};

    /// The edited body and its splice, for `body` with usage asked for and `max_tokens`.
    fn edit(body: &str, max_tokens: Option<u64>) -> Option<(String, Splice)> {
        let fields = Scanner::new().scan(body.as_bytes()).unwrap();
        let facts = request_facts(body.len(), &fields);
        let splice = edits(&fields, &facts, true, max_tokens)?.splice(body.as_bytes())?;
        let out = String::from_utf8(splice.apply(body.as_bytes())).unwrap();
        Some((out, splice))
    }

    fn inject(body: &str) -> Option<String> {
        edit(body, None).filter(|(_, s)| s.asked).map(|(b, _)| b)
    }

    fn options(body: &str) -> Value {
        let v: Value = serde_json::from_str(body).unwrap();
        v["stream_options"].clone()
    }

    #[test]
    fn adds_include_usage_only_when_the_client_did_not_say() {
        let got = inject(r#"{"model":"m","stream":true,"messages":[]}"#).unwrap();
        assert_eq!(
            got,
            r#"{"stream_options":{"include_usage":true},"model":"m","stream":true,"messages":[]}"#
        );
        let got = inject("{\"model\":\"m\",\"stream\":true,\"stream_options\":{ \"x\" : 1 } }\n")
            .unwrap();
        assert_eq!(options(&got), json!({"include_usage": true, "x": 1}));
        assert!(got.ends_with(" }\n"));
        let got = inject(r#"{"model":"m","stream":true,"stream_options":{ }}"#).unwrap();
        assert_eq!(options(&got), json!({"include_usage": true}));
        let got = inject(r#"{"model":"m","stream_options":null,"stream":true}"#).unwrap();
        assert_eq!(options(&got), json!({"include_usage": true}));
        // A client's `false` is turned into `true` in place (same length), and stripped.
        let body = r#"{"model":"m","stream":true,"stream_options":{"x":{"include_usage":false}, "include_usage" : false},"n":1}"#;
        let (got, splice) = edit(body, None).unwrap();
        assert!(splice.asked);
        assert_eq!(got.len(), body.len());
        assert_eq!(
            options(&got),
            json!({"x": {"include_usage": false}, "include_usage": true})
        );
        for as_sent in [
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m","stream":false}"#,
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

    /// Every edit leaves the body the client's JSON plus the members added, scanning to the
    /// same model at the moved span, and replaces only the head it needed.
    #[test]
    fn the_splice_is_the_clients_json_plus_the_edits_and_the_model_span_follows() {
        let bodies = [
            r#"{"model":"m","stream":true}"#,
            " \n\t{\"stream\":true,\"model\":\"m\"} ",
            r#"{"stream":true,"model":"m","stream_options":{"a":{"b":[1,2]}}}"#,
            r#"{"stream_options":null,"stream":true,"model":"m"} "#,
            r#"{"model":"m","stream":true,"stream_options":{}}"#,
            r#"{"model":"m","stream_options":{ },"stream":true,"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"m","stream":true,"stream_options":[]}"#,
            r#"{"model":"m","messages":[]}"#,
        ];
        for body in bodies {
            let fields = Scanner::new().scan(body.as_bytes()).unwrap();
            let span = fields.spans.model.unwrap();
            for max_tokens in [None, Some(4096)] {
                let Some((got, splice)) = edit(body, max_tokens) else {
                    assert!(max_tokens.is_none(), "{body}");
                    continue;
                };
                assert_eq!(splice.new_len(body.len()), got.len());
                let scanned = Scanner::new().scan(got.as_bytes()).unwrap();
                assert_eq!(scanned.model, "m", "{got}");
                let moved = splice.moved(span);
                assert_eq!(&got[moved.0..moved.1], r#""m""#, "{got}");
                assert_eq!(scanned.spans.model, Some(moved));
                let mut want: Value = serde_json::from_str(body).unwrap();
                if let Some(n) = max_tokens {
                    want["max_tokens"] = json!(n);
                }
                if splice.asked {
                    let o = &mut want["stream_options"];
                    if o.is_null() {
                        *o = json!({});
                    }
                    o["include_usage"] = json!(true);
                }
                assert_eq!(serde_json::from_str::<Value>(&got).unwrap(), want, "{got}");
                let head = fields
                    .spans
                    .stream_options
                    .map_or(fields.knobs.open + 1, |s| s.1);
                assert!(
                    splice.replace <= head,
                    "{body}: replaced {}",
                    splice.replace
                );
                assert!(got.ends_with(&body[splice.replace..]));
            }
        }
    }

    #[test]
    fn max_tokens_goes_first_and_only_the_brace_is_replaced() {
        let body = r#"{"messages":[{"role":"user","content":"long prompt"}],"model":"m"}"#;
        let (got, splice) = edit(body, Some(4096)).unwrap();
        assert_eq!(
            got,
            r#"{"max_tokens":4096,"messages":[{"role":"user","content":"long prompt"}],"model":"m"}"#
        );
        assert_eq!(
            (splice.replace, splice.with.as_slice()),
            (1, &br#"{"max_tokens":4096,"#[..])
        );
        assert!(!splice.asked);
        // A head shorter than what the edit needs gives no splice.
        let fields = Scanner::new().scan(body.as_bytes()).unwrap();
        let facts = request_facts(body.len(), &fields);
        let e = edits(&fields, &facts, false, Some(1)).unwrap();
        assert_eq!(e.needed(), 1);
        assert_eq!(e.splice(b""), None);
    }
}
