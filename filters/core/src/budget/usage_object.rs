//! The token counts a response reports ([`Usage`]), read from one captured `usage` object
//! without building a document.
//!
//! The object is accepted or refused whole exactly as `serde_json::from_slice::<Value>` would
//! (the reader before this one, kept as the oracle in `usage_oracle`): a syntax error anywhere,
//! a string that is not valid UTF-8 or holds a lone surrogate, a number out of `f64` range or
//! nesting deeper than serde_json's limit refuses it, and then nothing is read from it. Of a
//! member repeated, the last one counts; a count that is not a non-negative integer within
//! `u64` is absent. The common shapes (ASCII strings without escapes, plain integers) are read
//! here; a string with an escape or a non-ASCII byte, and a number that is not a plain `u64`,
//! are handed to serde_json for that one token, so its rules decide the rare cases.

/// Tokens a response reports (either side may be missing, e.g. a stream cut short).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: Option<u64>,
    pub completion: Option<u64>,
    /// Prompt tokens served from the engine's prompt cache (part of `prompt`): OpenAI's
    /// `prompt_tokens_details.cached_tokens`, Responses' `input_tokens_details.cached_tokens`,
    /// Anthropic's `cache_read_input_tokens`.
    pub cached: Option<u64>,
}

impl Usage {
    pub(super) fn merge(&mut self, newer: Usage) {
        self.prompt = newer.prompt.or(self.prompt);
        self.completion = newer.completion.or(self.completion);
        self.cached = newer.cached.or(self.cached);
    }
    pub fn is_empty(&self) -> bool {
        self.prompt.is_none() && self.completion.is_none()
    }
}

/// serde_json refuses a document nested this deep (it counts down from 128 per container).
const DEPTH_LIMIT: usize = 128;

/// The members read, by position in [`MEMBERS`]; the last two are objects whose own
/// `cached_tokens` is read (OpenAI chat's and Responses' prompt-cache hits).
const MEMBERS: [&[u8]; 8] = [
    b"prompt_tokens",
    b"completion_tokens",
    b"input_tokens",
    b"output_tokens",
    b"cache_creation_input_tokens",
    b"cache_read_input_tokens",
    b"prompt_tokens_details",
    b"input_tokens_details",
];
/// Where the details objects start in [`MEMBERS`].
const DETAILS: usize = 6;

/// The object's counts, or `Usage::default()` when it is not valid JSON.
pub fn parse_usage(raw: &[u8]) -> Usage {
    let mut p = Parser { b: raw, i: 0 };
    let mut counts = [None; MEMBERS.len()];
    p.ws();
    if p.peek() != Some(b'{') {
        return Usage::default();
    }
    p.i += 1;
    if p.object(1, Some(&mut counts)).is_none() {
        return Usage::default();
    }
    p.ws();
    if p.i != raw.len() {
        return Usage::default();
    }
    let [prompt, completion, input, output, cache_creation, cache_read, prompt_cached, input_cached] =
        counts;
    let anthropic_input = input.map(|i| {
        i.saturating_add(cache_creation.unwrap_or(0))
            .saturating_add(cache_read.unwrap_or(0))
    });
    Usage {
        prompt: prompt.or(anthropic_input),
        completion: completion.or(output),
        cached: prompt_cached.or(input_cached).or(cache_read),
    }
}

/// A value read: `Some(n)` for a plain non-negative integer within `u64`.
type Count = Option<u64>;

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// The members of an object whose `{` was just read, at nesting `depth`; `counts` is
    /// `Some` for the usage object itself (its members are the ones read). `None`: invalid.
    fn object(
        &mut self,
        depth: usize,
        mut counts: Option<&mut [Count; MEMBERS.len()]>,
    ) -> Option<()> {
        if depth >= DEPTH_LIMIT {
            return None;
        }
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return None;
            }
            self.i += 1;
            self.ws();
            let member = counts
                .as_ref()
                .and_then(|_| MEMBERS.iter().position(|m| key.is(m)));
            let value = match member {
                // A details object: its `cached_tokens` is the member's count.
                Some(k) if k >= DETAILS && self.peek() == Some(b'{') => {
                    self.i += 1;
                    self.details(depth + 1)?
                }
                _ => self.value(depth)?,
            };
            if let (Some(counts), Some(k)) = (counts.as_deref_mut(), member) {
                counts[k] = value;
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A details object whose `{` was just read: its `cached_tokens` (the last one), valid or
    /// not as [`Parser::object`] judges it.
    fn details(&mut self, depth: usize) -> Option<Count> {
        if depth >= DEPTH_LIMIT {
            return None;
        }
        let mut cached = None;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(None);
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return None;
            }
            self.i += 1;
            self.ws();
            let value = self.value(depth)?;
            if key.is(b"cached_tokens") {
                cached = value;
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Some(cached);
                }
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth >= DEPTH_LIMIT {
            return None;
        }
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            self.value(depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// One value inside a container at nesting `depth`. `None`: invalid.
    fn value(&mut self, depth: usize) -> Option<Count> {
        match self.peek()? {
            b'{' => {
                self.i += 1;
                self.object(depth + 1, None).map(|()| None)
            }
            b'[' => {
                self.i += 1;
                self.array(depth + 1).map(|()| None)
            }
            b'"' => self.string().map(|_| None),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<Count> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Some(None)
        } else {
            None
        }
    }

    fn number(&mut self) -> Option<Count> {
        let start = self.i;
        while matches!(
            self.peek(),
            Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
        ) {
            self.i += 1;
        }
        let token = &self.b[start..self.i];
        let plain = token.iter().all(u8::is_ascii_digit) && (token.len() == 1 || token[0] != b'0');
        if plain {
            let mut n: u64 = 0;
            let fits = token.iter().all(|d| {
                n.checked_mul(10)
                    .and_then(|m| m.checked_add(u64::from(d - b'0')))
                    .map(|m| n = m)
                    .is_some()
            });
            if fits {
                return Some(Some(n));
            }
        }
        // Negative, fractional, exponent, too large for `u64`, or malformed: valid when
        // serde_json reads it as a number (a float out of range is its error too).
        serde_json::from_slice::<f64>(token).ok().map(|_| None)
    }

    /// A string at the current `"`; what it says, as far as member names need.
    fn string(&mut self) -> Option<Key<'a>> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.i;
        let mut j = start + 1;
        let mut plain = true;
        loop {
            j = crate::fast::find_string_special(self.b, j);
            match self.b.get(j)? {
                b'"' => break,
                b'\\' => {
                    plain = false;
                    // The escaped byte is never the closing quote; serde_json checks the rest.
                    j += 2;
                }
                // A control byte inside a string: invalid.
                _ => return None,
            }
        }
        self.i = j + 1;
        let b: &'a [u8] = self.b;
        let content = &b[start + 1..j];
        if plain && content.is_ascii() {
            return Some(Key::Raw(content));
        }
        serde_json::from_slice::<String>(&b[start..=j])
            .ok()
            .map(Key::Decoded)
    }
}

/// A member name, raw when it needed no decoding.
enum Key<'a> {
    Raw(&'a [u8]),
    Decoded(String),
}

impl Key<'_> {
    fn is(&self, name: &[u8]) -> bool {
        match self {
            Key::Raw(r) => *r == name,
            Key::Decoded(s) => s.as_bytes() == name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::usage_oracle;

    /// Objects whose every prefix, and every one-byte change from a small alphabet, must be
    /// judged as serde_json judges them.
    const OBJECTS: &[&str] = &[
        r#"{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}"#,
        r#"{ "input_tokens" : 10 , "cache_read_input_tokens":5,"cache_creation_input_tokens":2,"output_tokens":7 }"#,
        r#"{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":3,"completion_tokens":"x"}"#,
        r#"{"prompt\u005ftokens":9,"completion_tokens":18446744073709551615}"#,
        r#"{"prompt_tokens":18446744073709551616,"completion_tokens":-0,"output_tokens":4}"#,
        r#"{"prompt_tokens":1.0,"completion_tokens":1e2,"input_tokens":0}"#,
        r#"{"prompt_tokens_details":{"cached_tokens":64,"audio_tokens":0},"prompt_tokens":120,"completion_tokens_details":[1,{"a":[]},null,true,false],"completion_tokens":4}"#,
        r#"{"cost":0.00123,"prompt_tokens":3,"note":"h\u00e9llo \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t","completion_tokens":5}"#,
        r#"{"prompt_tokens":2,"x":"é","completion_tokens":3}"#,
        r#"{}"#,
        r#"{"prompt_tokens":1e400}"#,
        r#"{"prompt_tokens":01}"#,
        r#"{"a":"\ud800","prompt_tokens":1}"#,
        r#"{"a":"\udc00","prompt_tokens":1}"#,
        r#"{"a":"\ud800\u0041","prompt_tokens":1}"#,
        r#"{"a":"\x","prompt_tokens":1}"#,
        r#"{"a":1,}"#,
        r#"{"a":[1,],"prompt_tokens":1}"#,
    ];

    fn same(raw: &[u8]) {
        assert_eq!(
            parse_usage(raw),
            usage_oracle::parse_usage(raw),
            "{:?}",
            String::from_utf8_lossy(raw)
        );
    }

    #[test]
    fn judges_every_object_as_serde_json_does() {
        for o in OBJECTS {
            let b = o.as_bytes();
            for i in 0..=b.len() {
                same(&b[..i]);
            }
            for i in 0..b.len() {
                for c in [
                    b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'0', b'-', b'e', b' ', 0x01,
                    0xC3, 0x80,
                ] {
                    let mut m = b.to_vec();
                    m[i] = c;
                    same(&m);
                }
            }
        }
        // Invalid UTF-8 in a string, raw and after an escape.
        same(b"{\"a\":\"\xff\",\"prompt_tokens\":1}");
        same(b"{\"a\":\"\\n\xc3\",\"prompt_tokens\":1}");
        same(b"{\"prompt_tokens\xc3\xa9\":1}");
    }

    #[test]
    fn nesting_stops_where_serde_json_stops() {
        for depth in [1usize, 2, 126, 127, 128, 129, 300] {
            let raw = format!(
                "{{\"prompt_tokens\":7,\"x\":{}1{}}}",
                "[".repeat(depth - 1),
                "]".repeat(depth - 1)
            );
            same(raw.as_bytes());
            let objs = format!(
                "{{\"prompt_tokens\":7{}}}",
                ",\"x\":{".repeat(depth - 1) + &"}".repeat(depth - 1)
            );
            same(objs.as_bytes());
        }
    }

    #[test]
    fn reads_the_counts() {
        let u = parse_usage(OBJECTS[1].as_bytes());
        assert_eq!((u.prompt, u.completion), (Some(17), Some(7)));
        // The last of a repeated member wins, even when it is not a count.
        let u = parse_usage(OBJECTS[2].as_bytes());
        assert_eq!((u.prompt, u.completion), (Some(2), None));
        let u = parse_usage(OBJECTS[3].as_bytes());
        assert_eq!((u.prompt, u.completion), (Some(9), Some(u64::MAX)));
        assert_eq!(parse_usage(OBJECTS[10].as_bytes()), Usage::default());
    }

    #[test]
    fn reads_cached_prompt_tokens_of_every_api() {
        let u = parse_usage(OBJECTS[6].as_bytes());
        assert_eq!((u.prompt, u.cached), (Some(120), Some(64)));
        let u = parse_usage(OBJECTS[1].as_bytes());
        assert_eq!((u.prompt, u.cached), (Some(17), Some(5)));
        let responses =
            br#"{"input_tokens":30,"input_tokens_details":{"cached_tokens":16},"output_tokens":2}"#;
        assert_eq!(parse_usage(responses).cached, Some(16));
        // Not an object, or no count in it: absent.
        let odd = br#"{"prompt_tokens":3,"prompt_tokens_details":null}"#;
        assert_eq!(parse_usage(odd).cached, None);
        same(odd);
        same(responses);
    }
}
