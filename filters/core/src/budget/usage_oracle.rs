//! The response usage reader as it was before the byte-search reader (`usage.rs`): a branch
//! per byte and a `serde_json::Value` of the captured `usage` object. Kept only as the oracle
//! the new reader is compared with (unit tests, the corpus replay, the `usage_stream` fuzz
//! target through the `usage-oracle` feature); never built into the filter.

use super::usage::{BodyKind, Usage, UsageReader, MAX_HELD_EVENT, MAX_USAGE_BYTES};

const KEY_BUF: usize = 12;
const TRACKED_DEPTH: usize = 3;

fn merge(u: &mut Usage, newer: Usage) {
    u.prompt = newer.prompt.or(u.prompt);
    u.completion = newer.completion.or(u.completion);
    u.cached = newer.cached.or(u.cached);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Usage,
    Message,
    Response,
    Choices,
    Other,
}

/// Walks one JSON document byte by byte, noting where usage objects and `choices` are. Does not
/// validate: a backend's bytes are only read for accounting.
#[derive(Debug, Clone)]
struct Probe {
    depth: usize,
    /// Bit d set: the container at depth d+1 is an object (depths beyond 64 are not tracked).
    objects: u64,
    expect_key: bool,
    keys: [Key; TRACKED_DEPTH],
    in_string: bool,
    escape: bool,
    string_is_key: bool,
    key: [u8; KEY_BUF],
    key_len: usize,
    /// Capturing a usage object: the depth it opened at, and its bytes.
    capture: Option<usize>,
    captured: Vec<u8>,
    capture_overflow: bool,
    usage: Usage,
    /// After `"choices": [`: the next significant byte says whether it is empty.
    choices_opening: bool,
    choices_empty: bool,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            depth: 0,
            objects: 0,
            expect_key: false,
            keys: [Key::Other; TRACKED_DEPTH],
            in_string: false,
            escape: false,
            string_is_key: false,
            key: [0; KEY_BUF],
            key_len: 0,
            capture: None,
            captured: Vec::new(),
            capture_overflow: false,
            usage: Usage::default(),
            choices_opening: false,
            choices_empty: false,
        }
    }

    fn reset(&mut self) {
        let captured = std::mem::take(&mut self.captured);
        *self = Probe::new();
        self.captured = captured;
        self.captured.clear();
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && self.depth <= 64 && self.objects & (1 << (self.depth - 1)) != 0
    }

    fn key_at(&self, depth: usize) -> Key {
        if (1..=TRACKED_DEPTH).contains(&depth) {
            self.keys[depth - 1]
        } else {
            Key::Other
        }
    }

    /// A value starting at the current depth with byte `c`.
    fn value_start(&mut self, c: u8) {
        let usage_here = match self.depth {
            1 => self.key_at(1) == Key::Usage,
            2 => {
                matches!(self.key_at(1), Key::Message | Key::Response)
                    && self.key_at(2) == Key::Usage
            }
            _ => false,
        };
        if usage_here && c == b'{' && self.capture.is_none() {
            self.capture = Some(self.depth);
            self.captured.clear();
            self.captured.push(c);
            self.capture_overflow = false;
        }
        if self.depth == 1 && self.key_at(1) == Key::Choices && c == b'[' {
            self.choices_opening = true;
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &c in bytes {
            self.byte(c);
        }
    }

    fn byte(&mut self, c: u8) {
        if self.capture.is_some() && !self.capture_overflow {
            if self.captured.len() < MAX_USAGE_BYTES {
                self.captured.push(c);
            } else {
                self.capture_overflow = true;
            }
        }
        if self.in_string {
            if self.escape {
                self.escape = false;
                // An escaped key is never one we look for: mark it as too long.
                self.key_len = KEY_BUF + 1;
            } else if c == b'\\' {
                self.escape = true;
            } else if c == b'"' {
                self.in_string = false;
                if self.string_is_key {
                    let k = if self.key_len <= KEY_BUF {
                        &self.key[..self.key_len]
                    } else {
                        &b""[..]
                    };
                    let key = match k {
                        b"usage" => Key::Usage,
                        b"message" => Key::Message,
                        b"response" => Key::Response,
                        b"choices" => Key::Choices,
                        _ => Key::Other,
                    };
                    if self.depth >= 1 && self.depth <= TRACKED_DEPTH {
                        self.keys[self.depth - 1] = key;
                    }
                }
            } else if self.string_is_key && self.key_len < KEY_BUF {
                self.key[self.key_len] = c;
                self.key_len += 1;
            } else if self.string_is_key {
                self.key_len = KEY_BUF + 1;
            }
            return;
        }
        if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            return;
        }
        if self.choices_opening {
            self.choices_opening = false;
            self.choices_empty = c == b']';
        }
        match c {
            b'"' => {
                self.in_string = true;
                self.string_is_key = self.in_object() && self.expect_key;
                if self.string_is_key {
                    self.expect_key = false;
                    self.key_len = 0;
                } else {
                    self.value_start(c);
                }
            }
            b'{' | b'[' => {
                self.value_start(c);
                self.depth += 1;
                if self.depth <= 64 {
                    let bit = 1u64 << (self.depth - 1);
                    if c == b'{' {
                        self.objects |= bit;
                    } else {
                        self.objects &= !bit;
                    }
                }
                if self.depth <= TRACKED_DEPTH {
                    self.keys[self.depth - 1] = Key::Other;
                }
                self.expect_key = c == b'{';
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.expect_key = false;
                if self.capture == Some(self.depth) {
                    self.capture = None;
                    if !self.capture_overflow {
                        let parsed = parse_usage(&self.captured);
                        merge(&mut self.usage, parsed);
                    }
                }
            }
            b',' => self.expect_key = self.in_object(),
            b':' => {}
            _ => self.value_start(c),
        }
    }
}

pub fn parse_usage(raw: &[u8]) -> Usage {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_slice::<serde_json::Value>(raw) else {
        return Usage::default();
    };
    let n = |k: &str| m.get(k).and_then(|v| v.as_u64());
    let anthropic_input = n("input_tokens").map(|i| {
        i.saturating_add(n("cache_creation_input_tokens").unwrap_or(0))
            .saturating_add(n("cache_read_input_tokens").unwrap_or(0))
    });
    let details = |k: &str| {
        m.get(k)
            .and_then(|d| d.as_object())
            .and_then(|d| d.get("cached_tokens"))
            .and_then(|v| v.as_u64())
    };
    Usage {
        prompt: n("prompt_tokens").or(anthropic_input),
        completion: n("completion_tokens").or(n("output_tokens")),
        cached: details("prompt_tokens_details")
            .or(details("input_tokens_details"))
            .or(n("cache_read_input_tokens")),
    }
}

/// Where the server-sent-events line parser stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Reading the field name (`len` bytes so far; `data` if they spell it).
    Field {
        len: usize,
        data: bool,
    },
    /// Just after `data:`: one leading space is dropped.
    DataStart,
    Data,
    /// Another field's value, or a comment: ignored to the end of the line.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    No,
    Forwarded,
    Dropped,
}

/// Reads usage from a response body as it streams; see the module doc.
#[derive(Debug, Clone)]
pub struct OldReader {
    kind: BodyKind,
    probe: Probe,
    reported: Usage,
    line: Line,
    after_cr: bool,
    /// Data lines of the current event so far (the next one is joined with a newline).
    data_lines: usize,
    content_bytes: u64,
    strip: bool,
    held: Vec<u8>,
    /// The current event grew past [`MAX_HELD_EVENT`] and is being forwarded as it comes.
    passing: bool,
    stripped: bool,
    /// Whether the CR just seen ended an event, and what became of it: a LF right after it
    /// belongs to that event's line ending.
    cr_ended: Ended,
}

impl OldReader {
    /// `strip_usage_chunk`: hold back the usage-only event (the gateway asked for usage, the
    /// client did not). Only meaningful for event streams.
    pub fn new(kind: BodyKind, strip_usage_chunk: bool) -> OldReader {
        OldReader {
            kind,
            probe: Probe::new(),
            reported: Usage::default(),
            line: Line::Field { len: 0, data: true },
            after_cr: false,
            data_lines: 0,
            content_bytes: 0,
            strip: strip_usage_chunk && kind == BodyKind::EventStream,
            held: Vec::new(),
            passing: false,
            stripped: false,
            cr_ended: Ended::No,
        }
    }

    /// Whether [`OldReader::feed`] writes what the client should get into `out` (else the
    /// caller forwards the body unchanged and `out` is left alone).
    pub fn strips(&self) -> bool {
        self.strip
    }

    /// Whether a usage-only event was held back.
    pub fn stripped(&self) -> bool {
        self.stripped
    }

    /// Bytes of content seen: the whole body for JSON, the `data` of every event for streams
    /// (what the completion estimate is based on).
    pub fn content_bytes(&self) -> u64 {
        self.content_bytes
    }

    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.kind == BodyKind::Json {
            self.content_bytes += chunk.len() as u64;
            self.probe.feed(chunk);
            return;
        }
        for &c in chunk {
            self.sse_byte(c, out);
        }
    }

    /// The end of the body: what it reported. When stripping, the rest of a held event goes to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Usage {
        match self.kind {
            BodyKind::Json => {
                merge(&mut self.reported, self.probe.usage);
            }
            BodyKind::EventStream => {
                // A stream may end without the blank line after its last event.
                self.end_event(out);
            }
        }
        self.reported
    }

    fn sse_byte(&mut self, c: u8, out: &mut Vec<u8>) {
        if self.after_cr && c == b'\n' {
            // The second half of a CRLF: part of the line ending already handled, and dropped
            // with the event that line ending closed, if that one was dropped.
            self.after_cr = false;
            if self.strip {
                match self.cr_ended {
                    Ended::No => self.hold(c, out),
                    Ended::Forwarded => out.push(c),
                    Ended::Dropped => {}
                }
            }
            self.cr_ended = Ended::No;
            return;
        }
        self.after_cr = false;
        self.cr_ended = Ended::No;
        if self.strip {
            self.hold(c, out);
        }
        if c == b'\r' || c == b'\n' {
            self.after_cr = c == b'\r';
            if self.line == (Line::Field { len: 0, data: true }) {
                self.end_event(out);
            } else if matches!(self.line, Line::Field { data: true, len: 4 }) {
                // A bare `data` line is an empty data line.
                self.data_line();
            }
            self.line = Line::Field { len: 0, data: true };
            return;
        }
        self.line = match self.line {
            Line::Field { len, data } if c == b':' => {
                if data && len == 4 {
                    self.data_line();
                    Line::DataStart
                } else {
                    Line::Skip
                }
            }
            Line::Field { len, data } => Line::Field {
                len: len + 1,
                data: data && len < 4 && b"data"[len] == c,
            },
            Line::DataStart if c == b' ' => Line::Data,
            Line::DataStart | Line::Data => {
                self.content_bytes += 1;
                self.probe.byte(c);
                Line::Data
            }
            Line::Skip => Line::Skip,
        };
    }

    fn hold(&mut self, c: u8, out: &mut Vec<u8>) {
        if self.passing {
            out.push(c);
        } else {
            self.held.push(c);
            if self.held.len() > MAX_HELD_EVENT {
                out.append(&mut self.held);
                self.passing = true;
            }
        }
    }

    fn data_line(&mut self) {
        if self.data_lines > 0 {
            self.probe.byte(b'\n');
        }
        self.data_lines += 1;
    }

    /// The blank line after an event (or the end of the body): take its usage, then forward or
    /// drop what was held of it.
    fn end_event(&mut self, out: &mut Vec<u8>) {
        let usage = self.probe.usage;
        let usage_only = self.probe.choices_empty && !usage.is_empty() && self.data_lines > 0;
        merge(&mut self.reported, usage);
        if self.strip {
            if usage_only && !self.passing {
                self.held.clear();
                self.stripped = true;
                self.cr_ended = Ended::Dropped;
            } else {
                out.append(&mut self.held);
                self.cr_ended = Ended::Forwarded;
            }
            self.passing = false;
        }
        self.probe.reset();
        self.data_lines = 0;
    }
}

/// What the `usage_stream` fuzz target and the corpus replay also check: this reader and the
/// one before it (this module, a branch per byte and a `serde_json::Value` per `usage`
/// object) give the same usage, the same forwarded bytes after every piece, the same content
/// count and the same stripping, with `data` cut as for [`split_invariance`]; and read as one
/// `usage` object, the body gives the same counts.
pub fn matches_oracle(data: &[u8]) -> Result<(), String> {
    let (Some(&flags), Some(&a), Some(&b)) = (data.first(), data.get(1), data.get(2)) else {
        return Ok(());
    };
    let body = &data[3..];
    let kind = if flags & 1 == 0 {
        BodyKind::EventStream
    } else {
        BodyKind::Json
    };
    let strip = flags & 2 != 0;
    let cut = |x: u8| (x as usize * body.len()) / 255;
    let (i, j) = (cut(a.min(b)), cut(a.max(b)));
    let pieces: [&[u8]; 3] = [&body[..i], &body[i..j], &body[j..]];
    let mut new = UsageReader::new(kind, strip);
    let mut old = OldReader::new(kind, strip);
    for (n, p) in pieces.iter().enumerate() {
        let (mut o_new, mut o_old) = (Vec::new(), Vec::new());
        new.feed(p, &mut o_new);
        old.feed(p, &mut o_old);
        if o_new != o_old {
            return Err(format!(
                "piece {n} (cut at {i},{j}): forwarded bytes differ"
            ));
        }
    }
    let (mut o_new, mut o_old) = (Vec::new(), Vec::new());
    let got = (
        new.finish(&mut o_new),
        o_new,
        new.content_bytes(),
        new.stripped(),
    );
    let want = (
        old.finish(&mut o_old),
        o_old,
        old.content_bytes(),
        old.stripped(),
    );
    if got != want {
        return Err(format!("cut at {i},{j}: {got:?} != oracle {want:?}"));
    }
    let (u_new, u_old) = (super::usage_object::parse_usage(body), parse_usage(body));
    if u_new != u_old {
        return Err(format!("as a usage object: {u_new:?} != oracle {u_old:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{matches_oracle, OldReader};
    use crate::budget::usage::{BodyKind, UsageReader};

    /// Bodies the new reader must read exactly as the oracle: every API shape, usage inside
    /// content strings (escaped quotes and backslashes around it), nested `usage` keys that are
    /// not the response's, missing and malformed usage, CRLF and multi-line events, comments,
    /// a usage-only chunk to strip, and events longer than the held maximum.
    fn corpus() -> Vec<(BodyKind, String)> {
        let j = BodyKind::Json;
        let s = BodyKind::EventStream;
        let long = "y".repeat(super::MAX_HELD_EVENT + 10);
        let mut bodies = vec![
            (j, r#"{"id":"x","choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":999}}"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#.into()),
            (j, r#"{"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":7}}"#.into()),
            (j, r#"{"object":"response","output":[],"usage":{"input_tokens":3,"output_tokens":4}}"#.into()),
            (j, r#"{"data":{"usage":{"prompt_tokens":1}},"x":[{"usage":{"completion_tokens":2}}]}"#.into()),
            (j, r#"{"c":"a \\\"usage\\\": {\"prompt_tokens\": 5} \\\\","usage" : { "prompt_tokens" : 1 , "completion_tokens":2 } }"#.into()),
            (j, r#"{"c":"\\","usage":{"prompt_tokens":3,"completion_tokens":4}}"#.into()),
            (j, r#"{"us\u0061ge":{"prompt_tokens":1},"usage":{"prompt\u005ftokens":2,"completion_tokens":1.5}}"#.into()),
            (j, r#"{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":9,"usage":{"x":1}}},"usage":{"completion_tokens":8}}"#.into()),
            (j, r#"{"usage":null,"choices":[{"message":{"content":"é😀\u00e9"}}]}"#.into()),
            (j, r#"{"usage":{"prompt_tokens":-1,"completion_tokens":"2"}}"#.into()),
            (j, "not json at all }}]] \"usage\":{\"prompt_tokens\":1}".into()),
            (j, r#"[{"usage":{"prompt_tokens":1}}]"#.into()),
            (j, format!(r#"{{"usage":{{"prompt_tokens":1,"pad":"{}","completion_tokens":2}}}}"#, "p".repeat(super::MAX_USAGE_BYTES))),
            (s, "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo \\\"usage\\\":{}\"}}],\"usage\":null}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n".into()),
            (s, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\r\n\r\ndata: [DONE]\r\n\r\n".into()),
            (s, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\r\rdata: [DONE]\r\r".into()),
            (s, "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\nevent: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\r\n\r\n: a comment\r\nevent: message_delta\r\ndata: {\"type\":\"message_delta\",\r\ndata: \"usage\":{\"output_tokens\":15}}\r\n\r\n".into()),
            (s, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":9}}}\n\n".into()),
            (s, "data: {\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}\n\ndata: [DONE]\n\n".into()),
            (s, "data:{\"choices\":[ ],\"usage\":{\"prompt_tokens\":1}}\ndata\n\nid: 3\nretry: 10\ndat: x\ndataa: y\n\n".into()),
            (s, format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":1}},\"p\":\"{long}\"}}\n\ndata: {{\"choices\":[],\"usage\":{{\"completion_tokens\":3}}}}\n\n")),
            (s, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}".into()),
            // Containers the reader walks aside (nothing in them is read): usage inside them is
            // not the response's; escapes, brackets in strings and unbalanced closes around them.
            (j, r#"{"choices":[{"message":{"content":"a\"b}]","usage":{"prompt_tokens":9}}}],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#.into()),
            (j, r#"{"message":{"content":{"deep":[{"usage":{"prompt_tokens":5}}]},"usage":{"input_tokens":3,"output_tokens":4}}}"#.into()),
            (j, r#"{"x":{"usage":{"prompt_tokens":5}},"response":{"a":[[["\\",{"b":"}"}]]],"usage":{"input_tokens":1,"output_tokens":2}}}"#.into()),
            (j, r#"{"choices":[{"a":"unterminated}],"usage":{"prompt_tokens":1}}"#.into()),
            (j, r#"{"choices":[}}}]]],"usage":{"prompt_tokens":1}} ,"usage":{"completion_tokens":6}}"#.into()),
            (s, "data: {\"choices\":[{\"delta\":{\"content\":\"x\\\\\\\"\"}}],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3}}\n\n".into()),
        ];
        // A usage object one byte under, at and over the captured maximum: read, read, ignored.
        let base = r#"{"prompt_tokens":1,"pad":"","completion_tokens":2}"#.len();
        for len in [
            super::MAX_USAGE_BYTES - 1,
            super::MAX_USAGE_BYTES,
            super::MAX_USAGE_BYTES + 1,
        ] {
            let pad = "p".repeat(len - base);
            bodies.push((
                j,
                format!(r#"{{"usage":{{"prompt_tokens":1,"pad":"{pad}","completion_tokens":2}}}}"#),
            ));
        }
        bodies
    }

    /// Both readers over `pieces`, compared after every piece and at the end.
    fn compare(kind: BodyKind, strip: bool, pieces: &[&[u8]], what: &str) {
        let mut new = UsageReader::new(kind, strip);
        let mut old = OldReader::new(kind, strip);
        for (n, p) in pieces.iter().enumerate() {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            new.feed(p, &mut a);
            old.feed(p, &mut b);
            assert_eq!(a, b, "{what}: piece {n} forwarded differently");
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert_eq!(new.finish(&mut a), old.finish(&mut b), "{what}: usage");
        assert_eq!(a, b, "{what}: the held rest");
        assert_eq!(new.content_bytes(), old.content_bytes(), "{what}: content");
        assert_eq!(new.stripped(), old.stripped(), "{what}: stripped");
    }

    #[test]
    fn reads_as_the_oracle_at_every_split_position() {
        for (kind, body) in corpus() {
            let b = body.as_bytes();
            let short: String = body.chars().take(60).collect();
            for strip in [false, true] {
                compare(kind, strip, &[b], &short);
                let step = if b.len() > 2000 { 97 } else { 1 };
                for i in (0..=b.len()).step_by(step) {
                    compare(kind, strip, &[&b[..i], &b[i..]], &format!("{short} at {i}"));
                    for j in (i..=b.len()).step_by(13 * step) {
                        compare(
                            kind,
                            strip,
                            &[&b[..i], &b[i..j], &b[j..]],
                            &format!("{short} at {i},{j}"),
                        );
                    }
                }
                if b.len() <= 2000 {
                    let bytes: Vec<&[u8]> = b.chunks(1).collect();
                    compare(kind, strip, &bytes, &format!("{short} byte by byte"));
                }
            }
        }
    }

    #[test]
    fn the_fuzz_corpus_reads_as_the_oracle() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        let mut seen = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join("usage_stream")) else {
                continue;
            };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                for flags in 0..4u8 {
                    let mut d = data.clone();
                    if let Some(f) = d.first_mut() {
                        *f = (*f & !3) | flags;
                    }
                    matches_oracle(&d).unwrap_or_else(|why| panic!("{:?}: {why}", e.path()));
                }
                seen += 1;
            }
        }
        assert!(seen >= 8, "the usage_stream corpus is missing");
    }
}
