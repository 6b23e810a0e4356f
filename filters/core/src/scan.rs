//! A strict, single-pass JSON validator that picks the few top-level fields routing needs.
//!
//! Why not a JSON tree: a chat request can be megabytes of prompt and routing reads one field, so
//! building `serde_json::Value` costs ~1 µs/KiB and allocates per node. This scanner validates the
//! whole body (so a truncated or smuggled body never reaches a backend) without allocating per
//! value, and records where the interesting top-level values sit so later stages (model rewrite,
//! usage injection, prefix hashing) can slice the body instead of re-parsing it.
//!
//! Strictness is a security property here: the gateway and the backend must read the same `model`,
//! so anything a lenient parser might read differently is refused: duplicate keys at any depth
//! (compared after unescaping), a UTF-8 BOM, invalid UTF-8, lone surrogates, trailing data.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::hash::Hasher;

/// Nesting deeper than this is refused; the scanner itself is iterative, the bound protects
/// whatever parses the body after us (Python's json recursion limit is about 1000).
pub const MAX_DEPTH: usize = 512;

/// Objects with more keys than this switch duplicate detection from a linear scan to a hash set.
const LINEAR_KEYS: usize = 16;

/// Byte range `[start, end)` of a value in the body, quotes included for strings.
pub type Span = (usize, usize);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// Not JSON: `at` is the byte offset, `what` says what was wrong there.
    Invalid {
        at: usize,
        what: &'static str,
    },
    TooDeep,
    NotObject,
    /// The same key twice in one object. `key` is printable-escaped and cut for the message.
    DuplicateKey {
        key: String,
        top_level: bool,
    },
    MissingModel,
    ModelNotString,
}

/// Spans of the top-level values later stages use, when present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopLevel {
    pub model: Option<Span>,
    pub stream: Option<Span>,
    pub stream_options: Option<Span>,
    pub messages: Option<Span>,
    pub tools: Option<Span>,
    pub system: Option<Span>,
    pub prompt: Option<Span>,
    pub input: Option<Span>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields<'a> {
    pub model: Cow<'a, str>,
    /// `stream: true` at the top level; any other value (or absence) is not streaming.
    pub stream: bool,
    pub spans: TopLevel,
}

/// Reusable state, so a filter scans request after request without re-allocating.
pub struct Scanner {
    /// Key fingerprints of the open objects, innermost last.
    keys: Vec<u64>,
    /// For each open object: where its keys start in `keys`, its serial, whether it spilled.
    frames: Vec<Frame>,
    /// Fingerprints of objects with many keys, tagged with the object's serial. The hasher is
    /// keyed per process so an attacker cannot aim keys at one bucket.
    spilled: hashbrown::HashSet<(u32, u64), RandomState>,
}

#[derive(Clone, Copy)]
struct Frame {
    is_object: bool,
    keys_start: usize,
    serial: u32,
    spilled: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum TopKey {
    Model,
    Stream,
    StreamOptions,
    Messages,
    Tools,
    System,
    Prompt,
    Input,
    Other,
}

enum State {
    KeyOrEnd { first: bool },
    Value,
    ValueOrEnd,
    AfterValue,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    pub fn new() -> Self {
        Scanner {
            keys: Vec::new(),
            frames: Vec::new(),
            spilled: hashbrown::HashSet::with_hasher(RandomState::new()),
        }
    }

    /// Validates `body` as one JSON object and extracts `model` (required, a non-empty string)
    /// and `stream`. Errors come in this order: invalid JSON, duplicate key, model problems.
    pub fn scan<'a>(&mut self, body: &'a [u8]) -> Result<Fields<'a>, ScanError> {
        self.keys.clear();
        self.frames.clear();
        self.spilled.clear();
        let mut p = Parser {
            b: body,
            i: 0,
            scratch: Vec::new(),
        };
        let mut spans = TopLevel::default();
        let mut model: Option<Cow<'a, str>> = None;
        let mut model_not_string = false;
        let mut stream = false;
        let mut serial: u32 = 0;
        let mut top_key = TopKey::Other;
        let mut top_value_start = 0usize;

        if body.starts_with(b"\xEF\xBB\xBF") {
            return Err(invalid(0, "a UTF-8 byte order mark is not allowed"));
        }
        // Validate UTF-8 once for the whole body, so string scanning only looks for the bytes
        // that end or interrupt a string. Outside strings, non-ASCII is a grammar error anyway.
        if let Err(valid_up_to) = crate::fast::validate_utf8(body) {
            return Err(invalid(valid_up_to, "invalid UTF-8"));
        }
        p.ws();
        match p.peek() {
            None => return Err(invalid(p.i, "the body is empty")),
            Some(b'{') => {}
            Some(_) => return Err(ScanError::NotObject),
        }
        p.i += 1;
        self.push_frame(true, &mut serial)?;
        let mut state = State::KeyOrEnd { first: true };

        loop {
            p.ws();
            match state {
                State::KeyOrEnd { first } => match p.peek() {
                    Some(b'}') if first => {
                        p.i += 1;
                        self.pop_frame();
                        state = State::AfterValue;
                    }
                    Some(b'"') => {
                        let depth = self.frames.len();
                        let key = p.string(true)?;
                        let fp = fingerprint(&key.decoded);
                        if depth == 1 {
                            top_key = classify_top(&key.decoded);
                        }
                        self.note_key(fp, &key.decoded, depth == 1)?;
                        p.ws();
                        if p.peek() != Some(b':') {
                            return Err(invalid(p.i, "expected ':' after an object key"));
                        }
                        p.i += 1;
                        state = State::Value;
                    }
                    Some(_) => {
                        return Err(invalid(
                            p.i,
                            if first {
                                "expected a string key or '}'"
                            } else {
                                "expected a string key after ','"
                            },
                        ))
                    }
                    None => return Err(invalid(p.i, "unexpected end of body inside an object")),
                },
                State::ValueOrEnd => {
                    if p.peek() == Some(b']') {
                        p.i += 1;
                        self.pop_frame();
                        state = State::AfterValue;
                    } else {
                        state = State::Value;
                    }
                }
                State::Value => {
                    let at_top = self.frames.len() == 1;
                    if at_top {
                        top_value_start = p.i;
                    }
                    match p.peek() {
                        Some(b'{') => {
                            p.i += 1;
                            self.push_frame(true, &mut serial)?;
                            state = State::KeyOrEnd { first: true };
                        }
                        Some(b'[') => {
                            p.i += 1;
                            self.push_frame(false, &mut serial)?;
                            state = State::ValueOrEnd;
                        }
                        Some(b'"') => {
                            let want = at_top && top_key == TopKey::Model;
                            let s = p.string(want)?;
                            if want {
                                model = Some(s.decoded);
                            }
                            state = State::AfterValue;
                        }
                        Some(b't') => {
                            p.literal(b"true")?;
                            if at_top && top_key == TopKey::Stream {
                                stream = true;
                            }
                            state = State::AfterValue;
                        }
                        Some(b'f') => {
                            p.literal(b"false")?;
                            state = State::AfterValue;
                        }
                        Some(b'n') => {
                            p.literal(b"null")?;
                            state = State::AfterValue;
                        }
                        Some(b'-' | b'0'..=b'9') => {
                            p.number()?;
                            state = State::AfterValue;
                        }
                        Some(_) => return Err(invalid(p.i, "expected a JSON value")),
                        None => {
                            return Err(invalid(p.i, "unexpected end of body, expected a value"))
                        }
                    }
                    if at_top && top_key == TopKey::Model && model.is_none() {
                        model_not_string = true;
                    }
                }
                State::AfterValue => {
                    if self.frames.len() == 1 {
                        // A top-level value just ended: remember where it sat.
                        let span = Some((top_value_start, p.i_before_ws()));
                        match top_key {
                            TopKey::Model => spans.model = span,
                            TopKey::Stream => spans.stream = span,
                            TopKey::StreamOptions => spans.stream_options = span,
                            TopKey::Messages => spans.messages = span,
                            TopKey::Tools => spans.tools = span,
                            TopKey::System => spans.system = span,
                            TopKey::Prompt => spans.prompt = span,
                            TopKey::Input => spans.input = span,
                            TopKey::Other => {}
                        }
                        top_key = TopKey::Other;
                    }
                    let Some(frame) = self.frames.last().copied() else {
                        if p.i != body.len() {
                            return Err(invalid(p.i, "unexpected data after the JSON object"));
                        }
                        break;
                    };
                    match (p.peek(), frame.is_object) {
                        (Some(b','), true) => {
                            p.i += 1;
                            state = State::KeyOrEnd { first: false };
                        }
                        (Some(b'}'), true) => {
                            p.i += 1;
                            self.pop_frame();
                        }
                        (Some(b','), false) => {
                            p.i += 1;
                            state = State::Value;
                        }
                        (Some(b']'), false) => {
                            p.i += 1;
                            self.pop_frame();
                        }
                        (None, _) => return Err(invalid(p.i, "unexpected end of body")),
                        (Some(_), true) => return Err(invalid(p.i, "expected ',' or '}'")),
                        (Some(_), false) => return Err(invalid(p.i, "expected ',' or ']'")),
                    }
                }
            }
        }

        match model {
            Some(m) if !m.is_empty() => Ok(Fields {
                model: m,
                stream,
                spans,
            }),
            Some(_) => Err(ScanError::MissingModel),
            None if model_not_string => Err(ScanError::ModelNotString),
            None => Err(ScanError::MissingModel),
        }
    }

    fn push_frame(&mut self, is_object: bool, serial: &mut u32) -> Result<(), ScanError> {
        if self.frames.len() >= MAX_DEPTH {
            return Err(ScanError::TooDeep);
        }
        *serial = serial.wrapping_add(1);
        self.frames.push(Frame {
            is_object,
            keys_start: self.keys.len(),
            serial: *serial,
            spilled: false,
        });
        Ok(())
    }

    fn pop_frame(&mut self) {
        if let Some(f) = self.frames.pop() {
            self.keys.truncate(f.keys_start);
        }
    }

    fn note_key(&mut self, fp: u64, key: &str, top_level: bool) -> Result<(), ScanError> {
        let dup = || ScanError::DuplicateKey {
            key: printable(key),
            top_level,
        };
        let Some(frame) = self.frames.last_mut() else {
            return Ok(());
        };
        if frame.spilled {
            return if self.spilled.insert((frame.serial, fp)) {
                Ok(())
            } else {
                Err(dup())
            };
        }
        let own = &self.keys[frame.keys_start..];
        if own.contains(&fp) {
            return Err(dup());
        }
        if own.len() >= LINEAR_KEYS {
            frame.spilled = true;
            let serial = frame.serial;
            for &k in own {
                self.spilled.insert((serial, k));
            }
            self.spilled.insert((serial, fp));
            self.keys.truncate(frame.keys_start);
        } else {
            self.keys.push(fp);
        }
        Ok(())
    }
}

fn invalid(at: usize, what: &'static str) -> ScanError {
    ScanError::Invalid { at, what }
}

fn classify_top(key: &str) -> TopKey {
    match key {
        "model" => TopKey::Model,
        "stream" => TopKey::Stream,
        "stream_options" => TopKey::StreamOptions,
        "messages" => TopKey::Messages,
        "tools" => TopKey::Tools,
        "system" => TopKey::System,
        "prompt" => TopKey::Prompt,
        "input" => TopKey::Input,
        _ => TopKey::Other,
    }
}

/// FNV-1a of the decoded key. Two distinct keys colliding is a false "duplicate" that only rejects
/// the sender's own request, so a fast non-cryptographic fingerprint is enough.
fn fingerprint(key: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(key.as_bytes());
    h.finish()
}

/// Keys go into error messages: keep them short and printable.
pub fn printable(s: &str) -> String {
    const MAX: usize = 64;
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == MAX {
            out.push('…');
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.push('?');
        }
    }
    out
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
    scratch: Vec<u8>,
}

struct Str<'a> {
    decoded: Cow<'a, str>,
}

impl<'a> Parser<'a> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if c == b' ' || c == b'\n' || c == b'\r' || c == b'\t' {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    /// End of the last token: `i` may already be past whitespace that followed it.
    fn i_before_ws(&self) -> usize {
        let mut j = self.i;
        while j > 0 && matches!(self.b[j - 1], b' ' | b'\n' | b'\r' | b'\t') {
            j -= 1;
        }
        j
    }

    fn literal(&mut self, lit: &'static [u8]) -> Result<(), ScanError> {
        if self.b[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            Err(invalid(
                self.i,
                "invalid literal (expected true, false or null)",
            ))
        }
    }

    fn number(&mut self) -> Result<(), ScanError> {
        let b = self.b;
        let start = self.i;
        let mut i = self.i;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while matches!(b.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => return Err(invalid(start, "invalid number")),
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if !matches!(b.get(i), Some(b'0'..=b'9')) {
                return Err(invalid(i, "invalid number: digits must follow '.'"));
            }
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !matches!(b.get(i), Some(b'0'..=b'9')) {
                return Err(invalid(
                    i,
                    "invalid number: digits must follow the exponent",
                ));
            }
            while matches!(b.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        self.i = i;
        Ok(())
    }

    /// Scans a string starting at the opening quote. With `decode`, returns its decoded value
    /// (borrowed when it has no escapes); otherwise the returned value is empty.
    fn string(&mut self, decode: bool) -> Result<Str<'a>, ScanError> {
        let b = self.b;
        let start = self.i + 1;
        if !decode {
            // Nearly every byte of a body is in strings nobody reads (prompt text): validate
            // them without copying, escapes handled in place.
            let end = crate::fast::skip_string(b, start, |j| {
                if b[j] != b'\\' {
                    return Err(invalid(j, "control character in string"));
                }
                // The two-byte escapes (`\n`, `\"`, ...) inline; `\u` and errors in escape().
                match b.get(j + 1) {
                    Some(&e) if SIMPLE_ESCAPE[e as usize] => Ok(j + 2),
                    _ => self.escape(j, false),
                }
            })?;
            let Some(end) = end else {
                return Err(invalid(b.len(), "unterminated string"));
            };
            self.i = end + 1;
            return Ok(Str {
                decoded: Cow::Borrowed(""),
            });
        }
        let mut i = start;
        let mut escaped = false;
        // Bytes in `copied..i` are not yet in `scratch` (only used once an escape shows up).
        let mut copied = start;
        self.scratch.clear();
        loop {
            i = crate::fast::find_string_special(b, i);
            let Some(&c) = b.get(i) else {
                return Err(invalid(i, "unterminated string"));
            };
            match c {
                b'"' => {
                    self.i = i + 1;
                    if !decode {
                        return Ok(Str {
                            decoded: Cow::Borrowed(""),
                        });
                    }
                    if !escaped {
                        let s = std::str::from_utf8(&b[start..i])
                            .map_err(|_| invalid(start, "invalid UTF-8"))?;
                        return Ok(Str {
                            decoded: Cow::Borrowed(s),
                        });
                    }
                    self.scratch.extend_from_slice(&b[copied..i]);
                    let s = String::from_utf8(std::mem::take(&mut self.scratch))
                        .map_err(|_| invalid(start, "invalid UTF-8"))?;
                    return Ok(Str {
                        decoded: Cow::Owned(s),
                    });
                }
                b'\\' => {
                    if decode {
                        self.scratch.extend_from_slice(&b[copied..i]);
                    }
                    escaped = true;
                    i = self.escape(i, decode)?;
                    copied = i;
                }
                _ => return Err(invalid(i, "control character in string")),
            }
        }
    }

    /// Handles the escape at `i` (a backslash); returns the index after it.
    fn escape(&mut self, i: usize, decode: bool) -> Result<usize, ScanError> {
        let b = self.b;
        let Some(&e) = b.get(i + 1) else {
            return Err(invalid(i, "unterminated escape"));
        };
        let simple = match e {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(0x08),
            b'f' => Some(0x0C),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            b'u' => None,
            _ => return Err(invalid(i, "invalid escape")),
        };
        if let Some(ch) = simple {
            if decode {
                self.scratch.push(ch);
            }
            return Ok(i + 2);
        }
        let hi = hex4(b, i + 2).ok_or(invalid(i, "invalid \\u escape"))?;
        let (cp, next) = match hi {
            0xD800..=0xDBFF => {
                if b.get(i + 6) != Some(&b'\\') || b.get(i + 7) != Some(&b'u') {
                    return Err(invalid(i, "lone surrogate in \\u escape"));
                }
                let lo = hex4(b, i + 8).ok_or(invalid(i + 6, "invalid \\u escape"))?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return Err(invalid(i, "lone surrogate in \\u escape"));
                }
                (0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), i + 12)
            }
            0xDC00..=0xDFFF => return Err(invalid(i, "lone surrogate in \\u escape")),
            _ => (hi, i + 6),
        };
        if decode {
            // Surrogates were excluded above, so this is always a valid char.
            let ch = char::from_u32(cp).ok_or(invalid(i, "invalid \\u escape"))?;
            let mut buf = [0u8; 4];
            self.scratch
                .extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
        Ok(next)
    }
}

/// The bytes that may follow a backslash as a two-byte escape (`\u` is handled apart).
static SIMPLE_ESCAPE: [bool; 256] = {
    let mut t = [false; 256];
    let mut k = 0;
    let simple = *b"\"\\/bfnrt";
    while k < simple.len() {
        t[simple[k] as usize] = true;
        k += 1;
    }
    t
};

fn hex4(b: &[u8], at: usize) -> Option<u32> {
    let digits = b.get(at..at + 4)?;
    let mut v = 0u32;
    for &d in digits {
        let n = (d as char).to_digit(16)?;
        v = v * 16 + n;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(body: &str) -> Result<(String, bool), ScanError> {
        Scanner::new()
            .scan(body.as_bytes())
            .map(|f| (f.model.into_owned(), f.stream))
    }

    fn is_invalid(r: Result<(String, bool), ScanError>) -> bool {
        matches!(r, Err(ScanError::Invalid { .. }))
    }

    #[test]
    fn reads_model_and_stream() {
        assert_eq!(
            scan(
                r#"{"model":"qwen3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
            ),
            Ok(("qwen3-8b".into(), true))
        );
        assert_eq!(
            scan(" {\n\"messages\": [], \"model\" : \"m\" } \n"),
            Ok(("m".into(), false))
        );
        assert_eq!(
            scan(r#"{"model":"m","stream":"true"}"#),
            Ok(("m".into(), false))
        );
        assert_eq!(
            scan(r#"{"model":"m","stream":false}"#),
            Ok(("m".into(), false))
        );
    }

    #[test]
    fn decodes_escaped_model_and_keys() {
        assert_eq!(
            scan(r#"{"mo\u0064el":"a\/b\u00e9"}"#),
            Ok(("a/bé".into(), false))
        );
        assert_eq!(
            scan(r#"{"model":"\ud83d\ude00x"}"#),
            Ok(("😀x".into(), false))
        );
    }

    #[test]
    fn nested_model_is_not_the_model() {
        assert_eq!(
            scan(r#"{"metadata":{"model":"evil"}}"#),
            Err(ScanError::MissingModel)
        );
        assert_eq!(
            scan(r#"{"messages":[{"model":"evil"}],"model":"good"}"#),
            Ok(("good".into(), false))
        );
    }

    #[test]
    fn model_must_be_a_non_empty_string() {
        assert_eq!(scan(r#"{"model":5}"#), Err(ScanError::ModelNotString));
        assert_eq!(scan(r#"{"model":null}"#), Err(ScanError::ModelNotString));
        assert_eq!(scan(r#"{"model":["a"]}"#), Err(ScanError::ModelNotString));
        assert_eq!(
            scan(r#"{"model":{"a":"b"}}"#),
            Err(ScanError::ModelNotString)
        );
        assert_eq!(scan(r#"{"model":""}"#), Err(ScanError::MissingModel));
        assert_eq!(scan(r#"{}"#), Err(ScanError::MissingModel));
    }

    #[test]
    fn duplicate_keys_are_refused_at_every_depth_after_unescaping() {
        for (body, top) in [
            (r#"{"model":"cheap","model":"pii-forbidden"}"#, true),
            (r#"{"model":"a","mo\u0064el":"b"}"#, true),
            (r#"{"model":"a","x":1,"x":2}"#, true),
            (r#"{"model":"a","m":[{"role":"u","role":"s"}]}"#, false),
            (r#"{"model":"a","m":{"k":{"z":1,"z":1}}}"#, false),
        ] {
            match scan(body) {
                Err(ScanError::DuplicateKey { top_level, .. }) => {
                    assert_eq!(top_level, top, "{body}")
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        // The same key in sibling objects is fine.
        assert!(scan(r#"{"model":"a","m":[{"role":"u"},{"role":"s"}],"o":{"role":1}}"#).is_ok());
    }

    #[test]
    fn duplicates_found_in_objects_with_many_keys() {
        let mut body = String::from(r#"{"model":"m","o":{"#);
        for k in 0..100 {
            body.push_str(&format!(r#""k{k}":{k},"#));
        }
        let ok = format!("{}\"end\":1}}}}", body);
        assert!(scan(&ok).is_ok(), "{ok}");
        let dup = format!("{}\"k7\":1}}}}", body);
        assert!(matches!(
            scan(&dup),
            Err(ScanError::DuplicateKey {
                top_level: false,
                ..
            })
        ));
        // Many top-level keys, the duplicate far apart.
        let mut top = String::from(r#"{"model":"m","#);
        for k in 0..40 {
            top.push_str(&format!(r#""t{k}":true,"#));
        }
        top.push_str(r#""model":"x"}"#);
        assert!(matches!(
            scan(&top),
            Err(ScanError::DuplicateKey {
                top_level: true,
                ..
            })
        ));
    }

    #[test]
    fn invalid_json_is_refused() {
        for body in [
            "",
            "   ",
            "{",
            r#"{"model":"m""#,
            r#"{"model":"m",}"#,
            r#"{"model":"m"}}"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m" "x":1}"#,
            r#"{"model":'m'}"#,
            r#"{model:"m"}"#,
            r#"{"model":"m","a":[1,]}"#,
            r#"{"model":"m","a":01}"#,
            r#"{"model":"m","a":1.}"#,
            r#"{"model":"m","a":-}"#,
            r#"{"model":"m","a":1e}"#,
            r#"{"model":"m","a":tru}"#,
            r#"{"model":"m","a":NaN}"#,
            r#"{"model":"m","a":"\x"}"#,
            r#"{"model":"m","a":"\u12"}"#,
            r#"{"model":"m","a":"\ud800"}"#,
            r#"{"model":"m","a":"\udc00\ud800"}"#,
            "{\"model\":\"m\",\"a\":\"tab\there\"}",
            "{\"model\":\"m\u{0}\"}",
            "\u{feff}{\"model\":\"m\"}",
        ] {
            assert!(is_invalid(scan(body)), "{body:?} -> {:?}", scan(body));
        }
        assert_eq!(scan(r#"["model"]"#), Err(ScanError::NotObject));
        assert_eq!(scan(r#""model""#), Err(ScanError::NotObject));
    }

    #[test]
    fn invalid_utf8_is_refused_everywhere() {
        for bytes in [
            &b"{\"model\":\"m\xff\"}"[..],
            &b"{\"model\":\"m\",\"c\":\"\xc3\"}"[..],
            &b"{\"model\":\"m\",\"c\":\"\xed\xa0\x80\"}"[..], // encoded surrogate
            &b"{\"model\":\"m\",\"c\":\"\xc0\xaf\"}"[..],     // overlong
            &b"{\"model\":\"m\",\"c\":\"\xf4\x90\x80\x80\"}"[..], // > U+10FFFF
            &b"{\"model\":\"m\",\xff:1}"[..],
        ] {
            assert!(
                matches!(Scanner::new().scan(bytes), Err(ScanError::Invalid { .. })),
                "{bytes:?}"
            );
        }
        assert!(Scanner::new()
            .scan("{\"model\":\"m\",\"c\":\"日本語 😀 é\"}".as_bytes())
            .is_ok());
    }

    #[test]
    fn deep_nesting_is_bounded_without_recursion() {
        let deep = format!(
            "{{\"model\":\"m\",\"a\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(scan(&deep), Err(ScanError::TooDeep));
        let ok = format!(
            "{{\"model\":\"m\",\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(scan(&ok).is_ok());
    }

    #[test]
    fn huge_numbers_are_just_numbers() {
        let body = format!(
            "{{\"model\":\"m\",\"n\":{}e99999,\"f\":-0.5E+3}}",
            "9".repeat(10_000)
        );
        assert!(scan(&body).is_ok());
    }

    #[test]
    fn spans_point_at_top_level_values() {
        let body = r#"{ "model" : "m" , "stream":true, "messages":[{"a":1}] ,"tools": [] }"#;
        let f = Scanner::new().scan(body.as_bytes()).unwrap();
        let s = |sp: Option<Span>| &body[sp.unwrap().0..sp.unwrap().1];
        assert_eq!(s(f.spans.model), "\"m\"");
        assert_eq!(s(f.spans.stream), "true");
        assert_eq!(s(f.spans.messages), r#"[{"a":1}]"#);
        assert_eq!(s(f.spans.tools), "[]");
        assert_eq!(f.spans.system, None);
    }

    #[test]
    fn agrees_with_serde_json_on_validity() {
        // Every prefix of a realistic body: all but the full one are truncated JSON.
        let body = r#"{"model":"llama-3-70b","messages":[{"role":"system","content":"Be brief. \"quoted\" \u00e9"},{"role":"user","content":"日本語 and numbers 1.5e3 -0 [1,2,{\"x\":null}]"}],"temperature":0.7,"max_tokens":128,"stream":false,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]}"#;
        let mut s = Scanner::new();
        for cut in 0..=body.len() {
            let Some(prefix) = body.get(..cut) else {
                continue;
            };
            let ours = s.scan(prefix.as_bytes()).is_ok();
            let theirs = serde_json::from_str::<serde_json::Value>(prefix).is_ok();
            assert_eq!(ours, theirs, "prefix of {cut} bytes: {prefix}");
        }
    }
}
