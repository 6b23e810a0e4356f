//! Usage from response bodies, read incrementally: fed chunk by chunk as they pass, split at any
//! byte, in bounded memory.
//!
//! - JSON bodies: the top-level `usage` (OpenAI chat/completions `prompt_tokens` +
//!   `completion_tokens`; Responses and Anthropic `input_tokens` + `output_tokens`, Anthropic's
//!   cache reads and writes counted as input).
//! - Server-sent events: every event's `data` is such a document; `usage`, `message.usage`
//!   (Anthropic `message_start`) and `response.usage` (Responses `response.completed`) are read,
//!   and for each of prompt and completion the last event that carried it wins.
//! - Optionally the usage-only chunk the gateway asked for (`choices: []` plus `usage`) is held
//!   back from the client: each event is held until its blank line, then forwarded or dropped.
//!
//! Memory: a few dozen bytes of parser state, a `usage` object of at most [`MAX_USAGE_BYTES`],
//! and when stripping, one event of at most [`MAX_HELD_EVENT`] (a longer one cannot be the small
//! usage-only chunk and is forwarded as it comes).
//!
//! Cost: the walk keeps a state per byte only where one can change it. String content goes by
//! in runs found by a 16-byte search for the next quote, backslash or control byte; so does the
//! rest of an event-stream line; a held event moves once when it ends, not byte by byte; and the
//! captured `usage` object is read for its few counts without building a document
//! (`usage_object`). The answer is the reader's before this (`usage_oracle`, kept as the
//! oracle): unit tests compare the two at every split of a corpus and the `usage_stream` fuzz
//! target on any input.

/// The stat of the token usage the filter publishes (OpenTelemetry's GenAI name), and its
/// labels in the order the filter writes them into the stat name as `label=.=value;.;`; the
/// generated Envoy bootstrap extracts each as a tag (a Prometheus label).
pub const USAGE_STAT: &str = "gen_ai.client.token.usage";
pub const USAGE_STAT_TAGS: [&str; 4] = [
    "gen_ai_token_type",
    "llmkube_backend",
    "gen_ai_request_model",
    "llmkube_team",
];

/// A captured `usage` object longer than this is ignored (real ones are a few hundred bytes).
pub const MAX_USAGE_BYTES: usize = 4096;
/// Events longer than this are forwarded without being held.
pub const MAX_HELD_EVENT: usize = 16 * 1024;
/// Keys we compare are shorter than this; longer ones are "other".
const KEY_BUF: usize = 12;
/// Deepest container whose key we track (`message.usage` is at depth 2).
const TRACKED_DEPTH: usize = 3;

pub use super::usage_object::Usage;

/// What a request is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub prompt: u64,
    pub completion: u64,
    /// Some part was estimated (`"usage_estimated": true` in the audit line).
    pub estimated: bool,
}

impl Charge {
    pub fn tokens(&self) -> u64 {
        self.prompt.saturating_add(self.completion)
    }
}

/// The charge for a served request: the reported usage, with any missing side estimated as
/// `ceil(bytes / 4)` (request body bytes for the prompt, response content bytes for the
/// completion), and never zero in total.
pub fn charge(reported: Usage, request_bytes: u64, response_bytes: u64) -> Charge {
    let mut c = Charge {
        prompt: reported.prompt.unwrap_or(request_bytes.div_ceil(4)),
        completion: reported.completion.unwrap_or(response_bytes.div_ceil(4)),
        estimated: reported.prompt.is_none() || reported.completion.is_none(),
    };
    if c.tokens() == 0 {
        c.prompt = 1;
        c.estimated = true;
    }
    c
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    EventStream,
}

impl BodyKind {
    /// From the response's `content-type`.
    pub fn from_content_type(ct: &str) -> BodyKind {
        let ct = ct.trim_start().as_bytes();
        let p = b"text/event-stream";
        if ct.len() >= p.len() && ct[..p.len()].eq_ignore_ascii_case(p) {
            BodyKind::EventStream
        } else {
            BodyKind::Json
        }
    }
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

    /// One level deeper at `{` or `[`: whether it is an object (first 64 levels), no key yet.
    #[inline]
    fn open(&mut self, c: u8) {
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

    /// A value starting at the current depth with byte `c`: `true` when it starts the capture
    /// of a usage object (the caller copies the bytes in, [`Probe::capture_bytes`]).
    fn value_start(&mut self, c: u8) -> bool {
        let usage_here = match self.depth {
            1 => self.key_at(1) == Key::Usage,
            2 => {
                matches!(self.key_at(1), Key::Message | Key::Response)
                    && self.key_at(2) == Key::Usage
            }
            _ => false,
        };
        if self.depth == 1 && self.key_at(1) == Key::Choices && c == b'[' {
            self.choices_opening = true;
        }
        if usage_here && c == b'{' && self.capture.is_none() {
            self.capture = Some(self.depth);
            self.captured.clear();
            self.capture_overflow = false;
            return true;
        }
        false
    }

    /// Appends bytes of the object being captured, up to [`MAX_USAGE_BYTES`] in all (one byte
    /// more marks it overflowed: it is then ignored).
    fn capture_bytes(&mut self, b: &[u8]) {
        if self.capture_overflow {
            return;
        }
        if self.captured.is_empty() {
            // Once, not by doubling from empty as the object's bytes arrive: real `usage`
            // objects are a few dozen to a few hundred bytes.
            self.captured.reserve(256);
        }
        let room = MAX_USAGE_BYTES - self.captured.len();
        if b.len() <= room {
            self.captured.extend_from_slice(b);
        } else {
            self.captured.extend_from_slice(&b[..room]);
            self.capture_overflow = true;
        }
    }

    /// The captured object closed (its last byte captured): read its counts.
    fn capture_ended(&mut self) {
        if !self.capture_overflow {
            let parsed = super::usage_object::parse_usage(&self.captured);
            self.usage.merge(parsed);
        }
    }

    /// The same as [`Probe::byte`] for each byte, but the inside of a string goes by in runs up
    /// to its next quote, backslash or control byte (a search 16 bytes at a time): nearly all
    /// of a response is string content, and none of it but those bytes changes the state. A
    /// captured object's bytes are copied as one run per piece (from where it starts, or the
    /// piece's start, to where it ends, or the piece's end), not byte by byte.
    fn feed(&mut self, bytes: &[u8]) {
        // Where the bytes not yet copied into the capture start, while capturing.
        let mut seg = self.capture.is_some().then_some(0);
        let mut i = 0;
        while i < bytes.len() {
            if self.in_string && !self.escape {
                let j = crate::fast::find_string_special(bytes, i);
                if j > i {
                    self.key_run(&bytes[i..j]);
                    i = j;
                    if i == bytes.len() {
                        break;
                    }
                }
            } else if self.aside() {
                i = self.skip_aside(bytes, i);
                if i == bytes.len() {
                    break;
                }
                continue;
            }
            match self.step(bytes[i]) {
                Captured::Started => seg = Some(i),
                Captured::Ended => {
                    let from = seg.take().unwrap_or(i);
                    let object = &bytes[from..=i];
                    if self.captured.is_empty() && !self.capture_overflow {
                        // Opened in these bytes: read in place, not copied first (a longer
                        // one would have overflowed the capture and is ignored as such).
                        if object.len() <= MAX_USAGE_BYTES {
                            let parsed = super::usage_object::parse_usage(object);
                            self.usage.merge(parsed);
                        }
                    } else {
                        self.capture_bytes(object);
                        self.capture_ended();
                    }
                }
                Captured::Same => {}
            }
            i += 1;
        }
        if let Some(from) = seg {
            self.capture_bytes(&bytes[from..]);
        }
    }

    /// Inside a container nothing in which can be read: deeper than `message.usage`, or in a
    /// member of the top-level object other than `message` and `response` (`choices`, most of
    /// a completion). Only a `usage` object at depth 1, or at depth 2 under `message` or
    /// `response`, is captured, and only the top-level keys and those two objects' keys say
    /// where one is; so until the container closes no key needs reading and no capture can
    /// start. (Keys left unread there are never read later: a container's key slot is reset
    /// when it opens.)
    #[inline]
    fn aside(&self) -> bool {
        !self.in_string
            && self.capture.is_none()
            && !self.choices_opening
            && (self.depth > 2
                || (self.depth == 2 && !matches!(self.key_at(1), Key::Message | Key::Response)))
    }

    /// Walks bytes of an [`Probe::aside`] container from `i` keeping only its structure (depth,
    /// object or array, strings), as [`Probe::step`] would for these bytes, up to the byte after
    /// the close that ends it, or a string the bytes end in (left to the string path), or the
    /// end. Returns where it stopped.
    fn skip_aside(&mut self, b: &[u8], mut i: usize) -> usize {
        while i < b.len() {
            match b[i] {
                b'"' => {
                    // To the closing quote; a string cut by the end of the bytes goes on in the
                    // string path, as a value (never a key: keys here are not read).
                    self.in_string = true;
                    self.string_is_key = false;
                    i += 1;
                    loop {
                        i = crate::fast::find_string_special(b, i);
                        match b.get(i) {
                            None => return i,
                            Some(b'"') => break,
                            Some(b'\\') if i + 1 < b.len() => i += 2,
                            Some(b'\\') => {
                                self.escape = true;
                                return i + 1;
                            }
                            Some(_) => i += 1,
                        }
                    }
                    self.in_string = false;
                }
                c @ (b'{' | b'[') => self.open(c),
                b'}' | b']' => {
                    self.depth -= 1;
                    self.expect_key = false;
                    if !self.aside() {
                        return i + 1;
                    }
                }
                b',' => self.expect_key = self.in_object(),
                _ => {}
            }
            i += 1;
        }
        i
    }

    /// Ordinary string bytes (no quote, backslash or control byte), as [`Probe::step`] would
    /// take them one by one, for the key being read.
    fn key_run(&mut self, run: &[u8]) {
        if self.string_is_key {
            let end = self.key_len + run.len();
            if end <= KEY_BUF {
                self.key[self.key_len..end].copy_from_slice(run);
                self.key_len = end;
            } else {
                self.key_len = KEY_BUF + 1;
            }
        }
    }

    /// One byte, captured if a usage object is being captured.
    fn byte(&mut self, c: u8) {
        if self.capture.is_some() {
            self.capture_bytes(&[c]);
        }
        match self.step(c) {
            Captured::Started => self.capture_bytes(&[c]),
            Captured::Ended => self.capture_ended(),
            Captured::Same => {}
        }
    }

    /// One byte's change to the state; copying bytes into the capture is the caller's.
    #[inline]
    fn step(&mut self, c: u8) -> Captured {
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
            return Captured::Same;
        }
        if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            return Captured::Same;
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
                }
            }
            b'{' | b'[' => {
                let started = self.value_start(c);
                self.open(c);
                if started {
                    return Captured::Started;
                }
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.expect_key = false;
                if self.capture == Some(self.depth) {
                    self.capture = None;
                    return Captured::Ended;
                }
            }
            b',' => self.expect_key = self.in_object(),
            // Any other byte continues or starts a scalar (a number, `true`, …): only an
            // opening `{` or `[` can start what `value_start` looks for.
            _ => {}
        }
        Captured::Same
    }
}

/// What a byte did to the capture of a usage object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Captured {
    Same,
    /// This byte opened the object to capture.
    Started,
    /// This byte closed it.
    Ended,
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
pub struct UsageReader {
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

impl UsageReader {
    /// `strip_usage_chunk`: hold back the usage-only event (the gateway asked for usage, the
    /// client did not). Only meaningful for event streams.
    pub fn new(kind: BodyKind, strip_usage_chunk: bool) -> UsageReader {
        UsageReader {
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

    /// Whether [`UsageReader::feed`] writes what the client should get into `out` (else the
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
        // When stripping, `chunk[seg..i]` are bytes of the current event not yet held or
        // forwarded: they move once, when the event ends or the chunk does, not byte by byte.
        let mut seg = 0;
        let mut i = 0;
        while i < chunk.len() {
            if matches!(self.line, Line::Data | Line::Skip) {
                // The rest of the line goes by as one run (no byte in it changes the line's
                // state); a data line's run goes to the probe.
                let j = crate::fast::find_line_end(chunk, i);
                if self.line == Line::Data {
                    self.content_bytes += (j - i) as u64;
                    self.probe.feed(&chunk[i..j]);
                }
                i = j;
                if i == chunk.len() {
                    break;
                }
            }
            let c = chunk[i];
            i += 1;
            if self.after_cr && c == b'\n' {
                // The second half of a CRLF: part of the line ending already handled, and
                // dropped with the event that line ending closed, if that one was dropped.
                self.after_cr = false;
                if self.strip {
                    match self.cr_ended {
                        // Held with the event it belongs to.
                        Ended::No => {}
                        Ended::Forwarded => {
                            out.push(c);
                            seg = i;
                        }
                        Ended::Dropped => seg = i,
                    }
                }
                self.cr_ended = Ended::No;
                continue;
            }
            self.after_cr = false;
            self.cr_ended = Ended::No;
            if c == b'\r' || c == b'\n' {
                self.after_cr = c == b'\r';
                if self.line == (Line::Field { len: 0, data: true }) {
                    self.end_event(&chunk[seg..i], out);
                    seg = i;
                } else if matches!(self.line, Line::Field { data: true, len: 4 }) {
                    // A bare `data` line is an empty data line.
                    self.data_line();
                }
                self.line = Line::Field { len: 0, data: true };
                continue;
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
        if self.strip {
            self.hold(&chunk[seg..], out);
        }
    }

    /// The end of the body: what it reported. When stripping, the rest of a held event goes to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Usage {
        match self.kind {
            BodyKind::Json => {
                self.reported.merge(self.probe.usage);
            }
            BodyKind::EventStream => {
                // A stream may end without the blank line after its last event.
                self.end_event(&[], out);
            }
        }
        self.reported
    }

    /// The part of the current event a chunk ended in: held until the event ends, unless the
    /// event is longer than [`MAX_HELD_EVENT`] (then it is forwarded as it comes).
    fn hold(&mut self, part: &[u8], out: &mut Vec<u8>) {
        if self.passing {
            out.extend_from_slice(part);
        } else if self.held.len() + part.len() > MAX_HELD_EVENT {
            out.append(&mut self.held);
            out.extend_from_slice(part);
            self.passing = true;
        } else {
            self.held.extend_from_slice(part);
        }
    }

    fn data_line(&mut self) {
        if self.data_lines > 0 {
            self.probe.byte(b'\n');
        }
        self.data_lines += 1;
    }

    /// The blank line after an event (or the end of the body), `tail` the event's bytes in this
    /// chunk up to and including that line's end: take its usage, then forward or drop the
    /// event.
    fn end_event(&mut self, tail: &[u8], out: &mut Vec<u8>) {
        let usage = self.probe.usage;
        let usage_only = self.probe.choices_empty && !usage.is_empty() && self.data_lines > 0;
        self.reported.merge(usage);
        if self.strip {
            let passing = self.passing || self.held.len() + tail.len() > MAX_HELD_EVENT;
            if usage_only && !passing {
                self.held.clear();
                self.stripped = true;
                self.cr_ended = Ended::Dropped;
            } else {
                out.append(&mut self.held);
                out.extend_from_slice(tail);
                self.cr_ended = Ended::Forwarded;
            }
            self.passing = false;
        }
        self.probe.reset();
        self.data_lines = 0;
    }
}

/// The property the `usage_stream` fuzz target and the corpus replay check: reading `data` in
/// pieces gives the same usage, the same forwarded bytes and the same content count as reading
/// it whole, and a reader that strips nothing forwards every byte. The first byte picks the body
/// kind and stripping, the next two are cut points, the rest is the body.
#[doc(hidden)]
pub fn split_invariance(data: &[u8]) -> Result<(), String> {
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
    let run = |pieces: &[&[u8]]| {
        let mut r = UsageReader::new(kind, strip);
        let mut out = Vec::new();
        for p in pieces {
            r.feed(p, &mut out);
        }
        let usage = r.finish(&mut out);
        (usage, out, r.content_bytes(), r.stripped())
    };
    let whole = run(&[body]);
    let cut = |x: u8| (x as usize * body.len()) / 255;
    let (i, j) = (cut(a.min(b)), cut(a.max(b)));
    let pieces = run(&[&body[..i], &body[i..j], &body[j..]]);
    if pieces != whole {
        return Err(format!("split at {i},{j}: {pieces:?} != {whole:?}"));
    }
    if body.len() <= 4096 {
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        let single = run(&bytes);
        if single != whole {
            return Err(format!("byte by byte: {single:?} != {whole:?}"));
        }
    }
    let forwarded_all = !strip || kind == BodyKind::Json || !whole.3;
    let expected_out: &[u8] = if strip && kind == BodyKind::EventStream {
        body
    } else {
        &[]
    };
    if forwarded_all && whole.1 != expected_out {
        return Err("bytes were changed without stripping a usage chunk".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI_JSON: &str = r#"{"id":"x","choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":999}}"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
    const ANTHROPIC_JSON: &str = r#"{"type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":10,"cache_read_input_tokens":5,"output_tokens":7}}"#;
    const RESPONSES_JSON: &str =
        r#"{"object":"response","output":[],"usage":{"input_tokens":3,"output_tokens":4}}"#;
    const NESTED_ONLY: &str =
        r#"{"data":{"usage":{"prompt_tokens":1}},"x":[{"usage":{"completion_tokens":2}}]}"#;

    const OPENAI_SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n\
        data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n\
        data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n\
        data: [DONE]\n\n";
    const ANTHROPIC_SSE: &str = "event: message_start\r\n\
        data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n\
        event: content_block_delta\r\n\
        data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"usage\"}}\r\n\r\n\
        : a comment\r\n\
        event: message_delta\r\n\
        data: {\"type\":\"message_delta\",\r\n\
        data: \"usage\":{\"output_tokens\":15}}\r\n\r\n";
    const RESPONSES_SSE: &str = "event: response.output_text.delta\n\
        data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n\
        event: response.completed\n\
        data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":8,\"output_tokens\":9}}}\n\n";
    const NO_USAGE_SSE: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}\n\ndata: [DONE]\n\n";

    fn read(kind: BodyKind, strip: bool, pieces: &[&[u8]]) -> (Usage, Vec<u8>, u64) {
        let mut r = UsageReader::new(kind, strip);
        let mut out = Vec::new();
        for p in pieces {
            r.feed(p, &mut out);
        }
        let u = r.finish(&mut out);
        (u, out, r.content_bytes())
    }

    fn u(p: u64, c: u64) -> Usage {
        Usage {
            prompt: Some(p),
            completion: Some(c),
            cached: None,
        }
    }

    fn cases() -> Vec<(BodyKind, &'static str, Usage)> {
        vec![
            (BodyKind::Json, OPENAI_JSON, u(12, 34)),
            (
                BodyKind::Json,
                ANTHROPIC_JSON,
                Usage {
                    cached: Some(5),
                    ..u(15, 7)
                },
            ),
            (BodyKind::Json, RESPONSES_JSON, u(3, 4)),
            (BodyKind::Json, NESTED_ONLY, Usage::default()),
            (BodyKind::EventStream, OPENAI_SSE, u(5, 2)),
            (BodyKind::EventStream, ANTHROPIC_SSE, u(25, 15)),
            (BodyKind::EventStream, RESPONSES_SSE, u(8, 9)),
            (BodyKind::EventStream, NO_USAGE_SSE, Usage::default()),
        ]
    }

    #[test]
    fn reads_usage_of_every_api_shape() {
        for (kind, body, want) in cases() {
            assert_eq!(read(kind, false, &[body.as_bytes()]).0, want, "{body}");
        }
    }

    #[test]
    fn every_split_position_gives_the_same_answer() {
        for (kind, body, want) in cases() {
            let b = body.as_bytes();
            let whole = read(kind, true, &[b]);
            for i in 0..=b.len() {
                assert_eq!(
                    read(kind, true, &[&b[..i], &b[i..]]),
                    whole,
                    "{body} at {i}"
                );
                for j in (i..=b.len()).step_by(7) {
                    let got = read(kind, true, &[&b[..i], &b[i..j], &b[j..]]);
                    assert_eq!(got.0, want, "{body} at {i},{j}");
                    assert_eq!(got.1, whole.1);
                }
            }
            let bytes: Vec<&[u8]> = b.chunks(1).collect();
            assert_eq!(read(kind, true, &bytes), whole);
        }
    }

    #[test]
    fn strips_only_the_usage_only_chunk() {
        let (usage, out, _) = read(BodyKind::EventStream, true, &[OPENAI_SSE.as_bytes()]);
        assert_eq!(usage, u(5, 2));
        let want = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n\
            data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n\
            data: [DONE]\n\n";
        assert_eq!(String::from_utf8(out).unwrap(), want);
        // CRLF framing: the whole event goes, line endings included.
        let crlf = OPENAI_SSE.replace('\n', "\r\n");
        let (_, out, _) = read(BodyKind::EventStream, true, &[crlf.as_bytes()]);
        assert_eq!(String::from_utf8(out).unwrap(), want.replace('\n', "\r\n"));
        // Anthropic and Responses streams carry usage in content events: nothing is dropped.
        for body in [ANTHROPIC_SSE, RESPONSES_SSE, NO_USAGE_SSE] {
            let (_, out, _) = read(BodyKind::EventStream, true, &[body.as_bytes()]);
            assert_eq!(out, body.as_bytes());
        }
        // A usage chunk that still carries choices is content: kept.
        let with_choice = "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n";
        assert_eq!(
            read(BodyKind::EventStream, true, &[with_choice.as_bytes()]).1,
            with_choice.as_bytes()
        );
    }

    #[test]
    fn long_events_pass_without_being_held_whole() {
        let text = "x".repeat(MAX_HELD_EVENT * 2);
        let body = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n");
        let mut r = UsageReader::new(BodyKind::EventStream, true);
        let mut out = Vec::new();
        r.feed(&body.as_bytes()[..MAX_HELD_EVENT + 100], &mut out);
        assert_eq!(
            out.len(),
            MAX_HELD_EVENT + 100,
            "forwarded before the event ended"
        );
        r.feed(&body.as_bytes()[MAX_HELD_EVENT + 100..], &mut out);
        r.finish(&mut out);
        assert_eq!(out, body.as_bytes());
    }

    #[test]
    fn oversized_or_malformed_usage_is_ignored_not_misread() {
        let pad = " ".repeat(MAX_USAGE_BYTES);
        let big = format!("{{\"usage\":{{\"prompt_tokens\":1,{pad}\"completion_tokens\":2}}}}");
        assert_eq!(
            read(BodyKind::Json, false, &[big.as_bytes()]).0,
            Usage::default()
        );
        for odd in [
            r#"{"usage":{"prompt_tokens":-1,"completion_tokens":"2"}}"#,
            r#"{"usage":null}"#,
            r#"{"us\u0061ge":{"prompt_tokens":1}}"#,
            r#"[{"usage":{"prompt_tokens":1}}]"#,
            "not json at all }}]]",
        ] {
            assert_eq!(
                read(BodyKind::Json, false, &[odd.as_bytes()]).0,
                Usage::default(),
                "{odd}"
            );
        }
    }

    #[test]
    fn a_stream_without_usage_is_charged_an_estimate_never_zero() {
        let (usage, _, content) = read(BodyKind::EventStream, false, &[NO_USAGE_SSE.as_bytes()]);
        let c = charge(usage, 401, content);
        assert_eq!(
            content,
            ("{\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}".len() + "[DONE]".len()) as u64
        );
        assert_eq!(c.prompt, 101);
        assert_eq!(c.completion, content.div_ceil(4));
        assert!(c.estimated);
        let zero = charge(Usage::default(), 0, 0);
        assert_eq!((zero.tokens(), zero.estimated), (1, true));
        let real = charge(u(5, 2), 999, 999);
        assert_eq!(
            (real.prompt, real.completion, real.estimated),
            (5, 2, false)
        );
        let half = charge(
            Usage {
                prompt: None,
                completion: Some(3),
                cached: None,
            },
            8,
            999,
        );
        assert_eq!((half.prompt, half.completion, half.estimated), (2, 3, true));
    }

    /// Documents built from the pieces that move the reader in and out of containers it walks
    /// aside (`choices`, deep members, `message`/`response` beside them, strings holding
    /// brackets, quotes and backslashes, unbalanced closes), read as the oracle reads them.
    #[test]
    fn generated_documents_read_as_the_oracle() {
        const PIECES: [&str; 22] = [
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\"usage\"",
            "\"message\"",
            "\"response\"",
            "\"choices\"",
            "\"x\"",
            "\"a\\\"]}\"",
            "\"\\\\\"",
            "\"}\"",
            "1",
            "\"prompt_tokens\":4",
            "{\"prompt_tokens\":2,\"completion_tokens\":3}",
            "\"usage\":{\"output_tokens\":5}",
            "\n",
            "\"completion_tokens\":7",
            "\"\\",
        ];
        let mut next = crate::test_rng::xorshift(0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..4000 {
            let mut data = vec![(next() % 4) as u8, next() as u8, next() as u8];
            if data[0] & 1 == 0 {
                data.extend_from_slice(b"data: ");
            }
            data.extend_from_slice(br#"{"choices":[{"message":{"#);
            for _ in 0..(next() % 40) {
                data.extend_from_slice(PIECES[(next() % PIECES.len() as u64) as usize].as_bytes());
            }
            if let Err(e) = super::super::usage_oracle::matches_oracle(&data) {
                panic!("{e}: {:?}", String::from_utf8_lossy(&data));
            }
        }
    }

    #[test]
    fn content_type_picks_the_reader() {
        assert_eq!(
            BodyKind::from_content_type("text/event-stream; charset=utf-8"),
            BodyKind::EventStream
        );
        assert_eq!(
            BodyKind::from_content_type("Text/Event-Stream"),
            BodyKind::EventStream
        );
        assert_eq!(
            BodyKind::from_content_type("application/json"),
            BodyKind::Json
        );
        assert_eq!(BodyKind::from_content_type("text/event"), BodyKind::Json);
    }
}
