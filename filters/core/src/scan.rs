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
pub struct Fields {
    pub model: String,
    /// `stream: true` at the top level; any other value (or absence) is not streaming.
    pub stream: bool,
    pub spans: TopLevel,
    pub knobs: Knobs,
}

/// The top-level numbers and flags that bound what a request may cost (budgets,
/// `budget::bound`), read in the same pass as everything else so admission needs neither the
/// body again nor a second walk over it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Knobs {
    /// The largest of `max_tokens`, `max_completion_tokens`, `max_output_tokens` given as a
    /// non-negative integer (a backend may read any of them); other values are not caps.
    pub max_output: Option<u64>,
    /// The larger of `n` and `best_of` given as a non-negative integer.
    pub choices: Option<u64>,
    /// `stream_options.include_usage` when `stream_options` is an object and it is a boolean.
    pub include_usage: Option<bool>,
    /// Offset of the body's opening `{` (after any leading whitespace).
    pub open: usize,
    /// A message of `messages` has a `tool_calls` key (its arguments reach the chat template:
    /// `budget::template`).
    pub tool_calls: bool,
}

/// Reusable state, so a filter scans request after request without re-allocating. It also
/// holds a scan in progress: a body can be fed in growing prefixes as it arrives ([`Scanner::resume`]),
/// so most of the work is done while the rest of the body is still on the wire.
pub struct Scanner {
    /// Key fingerprints of the open objects, innermost last.
    keys: Vec<u64>,
    /// For each open object: where its keys start in `keys`, its serial, whether it spilled.
    frames: Vec<Frame>,
    /// Fingerprints of objects with many keys, tagged with the object's serial. The hasher is
    /// keyed per process so an attacker cannot aim keys at one bucket.
    spilled: hashbrown::HashSet<(u32, u64), RandomState>,
    at: Progress,
    /// Fewest new bytes worth another look at an unfinished body (`MIN_STEP`).
    min_step: usize,
}

/// Fewest new bytes worth another look at an unfinished body: bounds the number of attempts a
/// body trickled in tiny pieces can cause.
const MIN_STEP: usize = 16 * 1024;

/// Where an unfinished scan stands; everything before `pos` has been parsed.
struct Progress {
    state: State,
    pos: usize,
    /// Body length at the last parse attempt.
    attempted: usize,
    /// Inside a string value nobody reads (its quote at `pos`): skipping resumes here instead of
    /// at the quote, so a long prompt is walked once however many pieces it arrives in.
    skipping: Option<usize>,
    spans: TopLevel,
    model: Option<String>,
    model_not_string: bool,
    stream: bool,
    knobs: Knobs,
    /// The key just read is `include_usage` directly inside `stream_options`.
    at_include_usage: bool,
    serial: u32,
    top_key: TopKey,
    top_value_start: usize,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            state: State::Start,
            pos: 0,
            attempted: 0,
            skipping: None,
            spans: TopLevel::default(),
            model: None,
            model_not_string: false,
            stream: false,
            knobs: Knobs::default(),
            at_include_usage: false,
            serial: 0,
            top_key: TopKey::Other,
            top_value_start: 0,
        }
    }
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
    MaxOutput,
    Choices,
    Other,
}

#[derive(Clone, Copy)]
enum State {
    Start,
    KeyOrEnd { first: bool },
    Value,
    ValueOrEnd,
    AfterValue,
}

/// Why parsing stopped before the end of the body.
enum Halt {
    Error(ScanError),
    /// The bytes so far end inside a token (or before the end of the object): wait for more.
    More,
}

impl From<ScanError> for Halt {
    fn from(e: ScanError) -> Self {
        Halt::Error(e)
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

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
            at: Progress::default(),
            min_step: MIN_STEP,
        }
    }

    /// Tests and fuzzing only: look at every piece, however small.
    #[doc(hidden)]
    pub fn look_at_every_piece(&mut self) {
        self.min_step = 0;
    }

    /// Validates `body` as one JSON object and extracts `model` (required, a non-empty string)
    /// and `stream`. The first problem in the body wins (invalid JSON or UTF-8, a duplicate key,
    /// too deep), then model problems; the answer is the same however the body is fed to
    /// [`Scanner::resume`].
    pub fn scan(&mut self, body: &[u8]) -> Result<Fields, ScanError> {
        self.begin();
        match self.resume(body, true)? {
            Some(fields) => Ok(fields),
            None => Err(invalid(body.len(), "unexpected end of body")),
        }
    }

    /// Starts a new body (forgets any scan in progress).
    pub fn begin(&mut self) {
        self.keys.clear();
        self.frames.clear();
        self.spilled.clear();
        self.at = Progress::default();
    }

    /// Goes on with the body started by [`Scanner::begin`]. `body` is every byte received so
    /// far (each call a longer prefix of the same body), `complete` that it is all of it.
    /// `Ok(None)`: fine so far, more is needed. An error is final: no continuation can fix it,
    /// and it is the error [`Scanner::scan`] gives for the whole body.
    pub fn resume(&mut self, body: &[u8], complete: bool) -> Result<Option<Fields>, ScanError> {
        self.resume_window(body, 0, complete)
    }

    /// [`Scanner::resume`] without keeping the whole body: `window` holds the bytes received so
    /// far from offset `base` on, and `base` may be anything up to [`Scanner::needed_from`] of
    /// the call before. A filter drops what is before `needed_from` after each call, so it
    /// holds about one token, not the body.
    ///
    /// Work is skipped until enough new bytes have arrived to be worth it (at least
    /// `MIN_STEP`, and at least as many as a cut token makes it re-read), so a body trickled in
    /// tiny pieces costs at most about twice a whole-body scan.
    pub fn resume_window(
        &mut self,
        window: &[u8],
        base: usize,
        complete: bool,
    ) -> Result<Option<Fields>, ScanError> {
        let total = base + window.len();
        if !complete {
            let arrived = total.saturating_sub(self.at.attempted);
            let reread = self.at.attempted.saturating_sub(self.needed_from());
            if arrived < self.min_step.max(reread) || arrived == 0 {
                return Ok(None);
            }
        }
        self.at.attempted = total;
        if base == 0 {
            if window.starts_with(BOM) {
                return Err(invalid(0, "a UTF-8 byte order mark is not allowed"));
            }
            if !complete && BOM.starts_with(window) {
                return Ok(None);
            }
        }
        // UTF-8 is checked inside strings, in the walk that finds their end (`fast::skip_string`,
        // `Parser::string`): outside strings the grammar takes ASCII only, so a non-ASCII byte
        // there is refused by the grammar at that byte. Every byte is loaded once.
        match self.parse(window, base, complete) {
            Ok(()) => self.finish().map(Some),
            Err(Halt::Error(e)) => Err(e),
            Err(Halt::More) if complete => Err(invalid(total, "unexpected end of body")),
            Err(Halt::More) => Ok(None),
        }
    }

    /// The first body offset an unfinished scan may still read: a caller of
    /// [`Scanner::resume_window`] keeps the bytes from here on.
    pub fn needed_from(&self) -> usize {
        self.at.skipping.unwrap_or(self.at.pos)
    }

    /// The model checks once the whole body has parsed.
    fn finish(&mut self) -> Result<Fields, ScanError> {
        let at = std::mem::take(&mut self.at);
        match at.model {
            Some(m) if !m.is_empty() => Ok(Fields {
                model: m,
                stream: at.stream,
                spans: at.spans,
                knobs: at.knobs,
            }),
            Some(_) => Err(ScanError::MissingModel),
            None if at.model_not_string => Err(ScanError::ModelNotString),
            None => Err(ScanError::MissingModel),
        }
    }

    /// Parses from where the last attempt stopped; `window` holds the body from `base` on.
    /// `Ok` once the object closed and `complete` says nothing follows; `Halt::More` (progress
    /// saved) when the bytes end first. Error offsets are the body's.
    fn parse(&mut self, window: &[u8], base: usize, complete: bool) -> Result<(), Halt> {
        let skipping = self.at.skipping.take();
        let mut p = Parser {
            b: window,
            base,
            i: skipping.unwrap_or(self.at.pos) - base,
            complete,
            resume_at: None,
        };
        let mut state = self.at.state;
        let mut r = Ok(());
        if skipping.is_some() {
            // Inside a string value: no whitespace or dispatch, just skip on.
            r = p.skip_string(p.i).map(|()| state = self.string_ended(&p));
        }
        if r.is_ok() {
            r = self.parse_from(&mut p, &mut state);
        }
        match r {
            Err(Halt::More) => {
                // `p.i` is at the start of the token that was cut (or past everything).
                self.at.state = state;
                self.at.pos = base + p.i;
                self.at.skipping = p.resume_at.map(|j| base + j);
                Err(Halt::More)
            }
            Err(Halt::Error(ScanError::Invalid { at, what })) => {
                Err(invalid(base + at, what).into())
            }
            other => other,
        }
    }

    /// The grammar, one token per turn: each state's step reads what that state allows and
    /// names the state that follows (`None`: the object closed and nothing follows). The state
    /// is a local while the bytes last and is saved only when they run out (`Halt::More`: the
    /// step that stopped is the one taken again).
    fn parse_from(&mut self, p: &mut Parser<'_>, state: &mut State) -> Result<(), Halt> {
        let mut now = *state;
        let r = loop {
            p.ws();
            let next = match now {
                State::Start => self.open_body(p).map(Some),
                State::KeyOrEnd { first } => self.key_or_end(p, first).map(Some),
                State::ValueOrEnd => self.value_or_end(p).map(Some),
                State::Value => self.value(p).map(Some),
                State::AfterValue => self.after_value(p),
            };
            match next {
                Ok(Some(s)) => now = s,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        *state = now;
        r
    }

    /// The body's first token: it must open an object.
    fn open_body(&mut self, p: &mut Parser<'_>) -> Result<State, Halt> {
        match p.peek() {
            None => Err(p.end(p.i, "the body is empty")),
            Some(b'{') => {
                self.at.knobs.open = p.base + p.i;
                p.i += 1;
                self.push_frame(true)?;
                Ok(State::KeyOrEnd { first: true })
            }
            Some(_) => Err(ScanError::NotObject.into()),
        }
    }

    /// Inside an object, before a key (or its `}` when `first`): the key is read, noted (the
    /// top-level facts, then duplicates) and its colon passed in one step.
    #[inline(always)]
    fn key_or_end(&mut self, p: &mut Parser<'_>, first: bool) -> Result<State, Halt> {
        match p.peek() {
            Some(b'"') => {
                let depth = self.frames.len();
                let key_start = p.i;
                let key = p.read_string()?;
                p.ws();
                let colon = p.peek();
                if colon.is_none() && !p.complete {
                    // Key and colon are one step (the key is noted once): cut between them,
                    // the key is read again.
                    p.i = key_start;
                    return Err(Halt::More);
                }
                self.note_key_facts(depth, &key);
                self.note_key(fingerprint(key.as_bytes()), &key, depth == 1)?;
                if colon != Some(b':') {
                    return Err(invalid(p.i, "expected ':' after an object key").into());
                }
                p.i += 1;
                Ok(State::Value)
            }
            Some(b'}') if first => {
                p.i += 1;
                Ok(self.closed(p))
            }
            Some(_) => Err(invalid(
                p.i,
                if first {
                    "expected a string key or '}'"
                } else {
                    "expected a string key after ','"
                },
            )
            .into()),
            None => Err(p.end(p.i, "unexpected end of body inside an object")),
        }
    }

    /// What a key says about the request, by where it sits: which top-level field the next value
    /// is, `stream_options.include_usage`, a message's `tool_calls`.
    #[inline(always)]
    fn note_key_facts(&mut self, depth: usize, key: &str) {
        match depth {
            1 => {
                self.at.top_key = classify_top(key);
                self.at.at_include_usage = false;
            }
            2 => {
                self.at.at_include_usage =
                    self.at.top_key == TopKey::StreamOptions && key == "include_usage";
            }
            3 if self.at.top_key == TopKey::Messages && key == "tool_calls" => {
                self.at.knobs.tool_calls = true;
            }
            _ => {}
        }
    }

    /// Just inside an array: its `]`, or its first value.
    #[inline(always)]
    fn value_or_end(&mut self, p: &mut Parser<'_>) -> Result<State, Halt> {
        match p.peek() {
            Some(b']') => {
                p.i += 1;
                Ok(self.closed(p))
            }
            None if !p.complete => Err(Halt::More),
            _ => self.value(p),
        }
    }

    /// A value starts at `p.i`: containers open, scalars are read whole (the model, the
    /// top-level numbers and flags routing and budgets use) or skipped.
    #[inline(always)]
    fn value(&mut self, p: &mut Parser<'_>) -> Result<State, Halt> {
        let at_top = self.frames.len() == 1;
        let is_model = at_top && self.at.top_key == TopKey::Model;
        if at_top {
            self.at.top_value_start = p.base + p.i;
            // Until it turns out to be a string.
            self.at.model_not_string |= is_model;
        }
        match p.peek() {
            Some(b'"') if is_model => {
                self.at.model = Some(p.read_string()?.into_owned());
                self.at.model_not_string = false;
            }
            Some(b'"') => p.skip_value_string()?,
            Some(b'{') => {
                p.i += 1;
                self.push_frame(true)?;
                return Ok(State::KeyOrEnd { first: true });
            }
            Some(b'[') => {
                p.i += 1;
                self.push_frame(false)?;
                return Ok(State::ValueOrEnd);
            }
            Some(b'-' | b'0'..=b'9') => {
                let start = p.i;
                p.number()?;
                if at_top {
                    self.note_number(&p.b[start..p.i]);
                }
            }
            Some(b't') => {
                p.literal(b"true")?;
                if at_top && self.at.top_key == TopKey::Stream {
                    self.at.stream = true;
                }
                self.note_include_usage(true);
            }
            Some(b'f') => {
                p.literal(b"false")?;
                self.note_include_usage(false);
            }
            Some(b'n') => p.literal(b"null")?,
            Some(_) => return Err(invalid(p.i, "expected a JSON value").into()),
            None => return Err(p.end(p.i, "unexpected end of body, expected a value")),
        }
        if at_top {
            self.note_top_span(p.base + p.i);
        }
        Ok(State::AfterValue)
    }

    /// The container whose closing byte is just before `p.i` ended: a top-level value's
    /// span is noted.
    #[inline(always)]
    fn closed(&mut self, p: &Parser<'_>) -> State {
        self.pop_frame();
        if self.frames.len() == 1 {
            self.note_top_span(p.base + p.i);
        }
        State::AfterValue
    }

    /// A string value skipped across pieces ended at `p.i`.
    fn string_ended(&mut self, p: &Parser<'_>) -> State {
        if self.frames.len() == 1 {
            self.note_top_span(p.base + p.i);
        }
        State::AfterValue
    }

    /// After a value: a top-level one has its span noted; then the enclosing container goes on
    /// (`,`) or closes. `None` once the body's object closed with nothing after it.
    #[inline(always)]
    fn after_value(&mut self, p: &mut Parser<'_>) -> Result<Option<State>, Halt> {
        let Some(frame) = self.frames.last() else {
            if p.i != p.b.len() {
                return Err(invalid(p.i, "unexpected data after the JSON object").into());
            }
            if !p.complete {
                return Err(Halt::More);
            }
            return Ok(None);
        };
        let is_object = frame.is_object;
        match (p.peek(), is_object) {
            (Some(b','), true) => {
                p.i += 1;
                Ok(Some(State::KeyOrEnd { first: false }))
            }
            (Some(b','), false) => {
                p.i += 1;
                Ok(Some(State::Value))
            }
            (Some(b'}'), true) | (Some(b']'), false) => {
                p.i += 1;
                Ok(Some(self.closed(p)))
            }
            (None, _) => Err(p.end(p.i, "unexpected end of body")),
            (Some(_), true) => Err(invalid(p.i, "expected ',' or '}'").into()),
            (Some(_), false) => Err(invalid(p.i, "expected ',' or ']'").into()),
        }
    }

    /// A top-level value just ended at `end`: remember where it sat.
    #[inline(always)]
    fn note_top_span(&mut self, end: usize) {
        let span = Some((self.at.top_value_start, end));
        let spans = &mut self.at.spans;
        match self.at.top_key {
            TopKey::Model => spans.model = span,
            TopKey::Stream => spans.stream = span,
            TopKey::StreamOptions => spans.stream_options = span,
            TopKey::Messages => spans.messages = span,
            TopKey::Tools => spans.tools = span,
            TopKey::System => spans.system = span,
            TopKey::Prompt => spans.prompt = span,
            TopKey::Input => spans.input = span,
            TopKey::MaxOutput | TopKey::Choices | TopKey::Other => {}
        }
        self.at.top_key = TopKey::Other;
    }

    /// A top-level number: a cap when its key is one and it is a non-negative integer.
    fn note_number(&mut self, text: &[u8]) {
        let slot = match self.at.top_key {
            TopKey::MaxOutput => &mut self.at.knobs.max_output,
            TopKey::Choices => &mut self.at.knobs.choices,
            _ => return,
        };
        if let Some(n) = std::str::from_utf8(text)
            .ok()
            .and_then(|t| t.parse::<u64>().ok())
        {
            *slot = Some(slot.map_or(n, |f| f.max(n)));
        }
    }

    /// A boolean ended: `stream_options.include_usage` when that is where it sits.
    fn note_include_usage(&mut self, value: bool) {
        if self.frames.len() == 2
            && self.at.at_include_usage
            && self.at.top_key == TopKey::StreamOptions
        {
            self.at.knobs.include_usage = Some(value);
        }
    }

    fn push_frame(&mut self, is_object: bool) -> Result<(), ScanError> {
        if self.frames.len() >= MAX_DEPTH {
            return Err(ScanError::TooDeep);
        }
        self.at.serial = self.at.serial.wrapping_add(1);
        self.frames.push(Frame {
            is_object,
            keys_start: self.keys.len(),
            serial: self.at.serial,
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

/// `rest` (from the first byte UTF-8 validation refused) is the start of a sequence the end of
/// the bytes so far cut off, not an invalid one.
fn cut_sequence(rest: &[u8]) -> bool {
    rest.len() < 4
        && std::str::from_utf8(rest)
            .err()
            .is_some_and(|e| e.valid_up_to() == 0 && e.error_len().is_none())
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
        "max_tokens" | "max_completion_tokens" | "max_output_tokens" => TopKey::MaxOutput,
        "n" | "best_of" => TopKey::Choices,
        _ => TopKey::Other,
    }
}

/// A fingerprint of the decoded key, 8 bytes per multiply. Two distinct keys colliding is a
/// false "duplicate" that only rejects the sender's own request, so a fast non-cryptographic
/// fingerprint is enough; keys of up to 8 bytes (nearly all) of one length never collide: their
/// bytes are read whole into one word and every step after that is a bijection.
fn fingerprint(key: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mix = |h: u64, w: u64| {
        let x = (h ^ w).wrapping_mul(K);
        x ^ (x >> 29)
    };
    let n = key.len();
    let h = mix(0, n as u64);
    let word = match n {
        0 => 0,
        1..=3 => key[0] as u64 | (key[n / 2] as u64) << 8 | (key[n - 1] as u64) << 16,
        4..=8 => u32_at(key, 0) as u64 | (u32_at(key, n - 4) as u64) << 32,
        _ => {
            let mut h = h;
            let mut at = 0;
            while at + 8 < n {
                h = mix(h, u64_at(key, at));
                at += 8;
            }
            return mix(h, u64_at(key, n - 8));
        }
    };
    mix(h, word)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
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

/// Parses a window of the body: `b` holds the bytes from offset `base` on; `i` and the offsets
/// in its errors are relative to the window.
///
/// Its methods are inlined into the grammar's loop and the work they hand off (a long string, a
/// string to decode, a number) goes to free functions that take the bytes and an index and
/// return one: the parser's address never leaves the loop, so its position lives in a register
/// rather than being stored and reloaded around every byte.
struct Parser<'a> {
    b: &'a [u8],
    base: usize,
    i: usize,
    /// `b` is the whole body: its end is the body's end, not just the bytes so far.
    complete: bool,
    /// Where skipping a cut string goes on (see `Progress::skipping`).
    resume_at: Option<usize>,
}

impl<'a> Parser<'a> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn ws(&mut self) {
        // Most tokens follow nothing or one space (`", "`, `": "`): decided without the loop.
        match self.b.get(self.i) {
            Some(&c) if c > b' ' => return,
            Some(b' ') => {
                self.i += 1;
                if self.b.get(self.i).is_some_and(|&c| c > b' ') {
                    return;
                }
            }
            _ => {}
        }
        while let Some(&c) = self.b.get(self.i) {
            // Every token starts with a byte above the space: one compare decides most bytes.
            if c > b' ' || !(c == b' ' || c == b'\n' || c == b'\r' || c == b'\t') {
                break;
            }
            self.i += 1;
        }
    }

    /// The bytes ran out: an error at `at` for a whole body, else wait for more.
    #[inline(always)]
    fn end(&self, at: usize, what: &'static str) -> Halt {
        if self.complete {
            Halt::Error(invalid(at, what))
        } else {
            Halt::More
        }
    }

    #[inline(always)]
    fn literal(&mut self, lit: &'static [u8]) -> Result<(), Halt> {
        let rest = &self.b[self.i..];
        // The literals are 4 or 5 bytes: a word compare, not a call to a byte-wise memcmp.
        if rest.len() >= lit.len()
            && u32_at(rest, 0) == u32_at(lit, 0)
            && rest[4..lit.len()] == lit[4..]
        {
            self.i += lit.len();
            Ok(())
        } else if rest.len() < lit.len() && lit.starts_with(rest) {
            Err(self.end(self.i, "invalid literal (expected true, false or null)"))
        } else {
            Err(invalid(self.i, "invalid literal (expected true, false or null)").into())
        }
    }

    #[inline(always)]
    fn number(&mut self) -> Result<(), Halt> {
        if !self.complete && number_runs_to_end(self.b, self.i) {
            // A number that runs to the end of the bytes so far may go on in the next piece.
            return Err(Halt::More);
        }
        self.i = number_end(self.b, self.i)?;
        Ok(())
    }

    /// Reads the string whose opening quote is at `i` (a key, the model): a short plain one
    /// is borrowed as it is, anything else decoded by [`decode_string`].
    #[inline(always)]
    fn read_string(&mut self) -> Result<Cow<'a, str>, Halt> {
        let b = self.b;
        let start = self.i + 1;
        let (s, next) = match crate::fast::plain_string_end(b, start) {
            // SAFETY: `plain_string_end` saw only ASCII bytes before the quote.
            Some(q) => (
                Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(&b[start..q]) }),
                q + 1,
            ),
            None => decode_string(b, start, self.complete)?,
        };
        self.i = next;
        Ok(s)
    }

    /// Skips the string value whose opening quote is at `i`: a short plain one in a load or
    /// two, anything else by [`skip_string`].
    #[inline(always)]
    fn skip_value_string(&mut self) -> Result<(), Halt> {
        match crate::fast::plain_string_end(self.b, self.i + 1) {
            Some(q) => {
                self.i = q + 1;
                Ok(())
            }
            None => self.skip_string(self.i + 1),
        }
    }

    /// Skips the rest of a string value nobody reads from `from` (just after its opening quote,
    /// or where an earlier piece cut it); a cut one leaves where to go on in `resume_at`.
    #[inline(always)]
    fn skip_string(&mut self, from: usize) -> Result<(), Halt> {
        match skip_string(self.b, from, self.complete) {
            Ok(next) => {
                self.i = next;
                Ok(())
            }
            Err(Skipped::Cut(at)) => {
                self.resume_at = Some(at);
                Err(Halt::More)
            }
            Err(Skipped::Halt(h)) => Err(h),
        }
    }
}

/// A number at `i` that runs to the end of the bytes.
fn number_runs_to_end(b: &[u8], i: usize) -> bool {
    b[i..]
        .iter()
        .all(|c| matches!(c, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
}

/// Where the number at `start` ends.
fn number_end(b: &[u8], start: usize) -> Result<usize, ScanError> {
    let mut i = start;
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
    let int_end = i;
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !matches!(b.get(i), Some(b'0'..=b'9')) {
            return Err(invalid(i, "invalid number: digits must follow '.'"));
        }
        while matches!(b.get(i), Some(b'0'..=b'9')) {
            i += 1;
        }
    }
    let exponent = matches!(b.get(i), Some(b'e' | b'E'));
    if exponent {
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
    // Past an f64 (±1.8e308), serde_json (agentgateway), Go's encoding/json (Envoy AI
    // Gateway) and Python's json (as a float) cannot hold the number: refused here as
    // invalid rather than passed on to a gateway or engine that answers with an error of its
    // own. Only a long integer part or an exponent can get there; the rest skips the parse.
    if int_end - start > 300 || exponent {
        let finite = std::str::from_utf8(&b[start..i])
            .ok()
            .and_then(|t| t.parse::<f64>().ok())
            .is_some_and(f64::is_finite);
        if !finite {
            return Err(invalid(start, "number out of range (past a 64-bit float)"));
        }
    }
    Ok(i)
}

/// Why a string walk stopped before the closing quote.
enum Skipped {
    Halt(Halt),
    /// The bytes ran out inside the string: the next piece goes on from this index.
    Cut(usize),
}

/// Skips the rest of a string value nobody reads from `from` (just after its opening quote,
/// or where an earlier piece cut it) and returns the index after its closing quote. Nearly
/// every byte of a body is in such strings (prompt text): they are validated (escapes and
/// UTF-8) without copying, escapes handled in place.
fn skip_string(b: &[u8], from: usize, complete: bool) -> Result<usize, Skipped> {
    use crate::fast::Walk;
    let mut cut = None;
    let walked = crate::fast::skip_string(b, from, |j| {
        if b[j] != b'\\' {
            return Err(Halt::Error(invalid(j, "control character in string")));
        }
        // The two-byte escapes (`\n`, `\"`, ...) inline; `\u` and errors in escape().
        match b.get(j + 1) {
            Some(&e) if SIMPLE_ESCAPE[e as usize] => Ok(j + 2),
            _ => escape(b, j, complete, None).inspect_err(|h| {
                if matches!(h, Halt::More) {
                    cut = Some(j);
                }
            }),
        }
    });
    match walked {
        Walk::Quote(q) => Ok(q + 1),
        Walk::BadUtf8(x) => Err(Skipped::Halt(invalid(x, "invalid UTF-8").into())),
        Walk::Special(Halt::More) => match cut {
            Some(j) => Err(Skipped::Cut(j)),
            None => Err(Skipped::Halt(Halt::More)),
        },
        Walk::Special(e) => Err(Skipped::Halt(e)),
        // The bytes ran out inside the string: check what the walk left, knowing now
        // whether the body ends here (then a cut sequence is invalid) or goes on (then the
        // next piece resumes at the cut sequence's first byte).
        Walk::End { unchecked } => match crate::fast::validate_utf8(&b[unchecked..]) {
            Err(n) if complete || !cut_sequence(&b[unchecked + n..]) => Err(Skipped::Halt(
                invalid(unchecked + n, "invalid UTF-8").into(),
            )),
            Err(n) => Err(Skipped::Cut(unchecked + n)),
            Ok(()) if complete => Err(Skipped::Halt(
                invalid(b.len(), "unterminated string").into(),
            )),
            Ok(()) => Err(Skipped::Cut(b.len())),
        },
    }
}

/// Reads and decodes the string whose content starts at `start` (after its opening quote;
/// keys and the model) and returns it with the index after its closing quote. Its raw bytes
/// are UTF-8-checked before any error in them is reported, so the first problem by offset
/// wins, as in a skipped string.
fn decode_string(b: &[u8], start: usize, complete: bool) -> Result<(Cow<'_, str>, usize), Halt> {
    let end = |at: usize, what: &'static str| {
        if complete {
            Halt::Error(invalid(at, what))
        } else {
            Halt::More
        }
    };
    let mut i = start;
    // Decoded content, only used once an escape shows up; bytes in `copied..i` are not in it yet.
    let mut decoded: Vec<u8> = Vec::new();
    let mut escaped = false;
    let mut copied = start;
    // The raw content up to `to` (an ASCII byte, or the end of a whole body): a sequence
    // `to` cuts is invalid.
    let utf8 = move |to: usize| -> Result<&str, Halt> {
        std::str::from_utf8(&b[start..to])
            .map_err(|e| invalid(start + e.valid_up_to(), "invalid UTF-8").into())
    };
    loop {
        i = crate::fast::find_string_special(b, i);
        let Some(&c) = b.get(i) else {
            if complete {
                utf8(i)?;
            }
            return Err(end(i, "unterminated string"));
        };
        match c {
            b'"' => {
                let raw = utf8(i)?;
                if !escaped {
                    return Ok((Cow::Borrowed(raw), i + 1));
                }
                decoded.extend_from_slice(&b[copied..i]);
                let s = String::from_utf8(decoded).map_err(|_| invalid(start, "invalid UTF-8"))?;
                return Ok((Cow::Owned(s), i + 1));
            }
            b'\\' => {
                decoded.extend_from_slice(&b[copied..i]);
                escaped = true;
                i = match escape(b, i, complete, Some(&mut decoded)) {
                    Ok(next) => next,
                    Err(e) => {
                        utf8(i)?;
                        return Err(e);
                    }
                };
                copied = i;
            }
            _ => {
                utf8(i)?;
                return Err(invalid(i, "control character in string").into());
            }
        }
    }
}

/// Handles the escape at `i` (a backslash); returns the index after it, its character added to
/// `out` when given. An escape the end of the bytes so far may have cut (the longest, a
/// surrogate pair, is 12 bytes) is judged once more bytes are here.
fn escape(b: &[u8], i: usize, complete: bool, out: Option<&mut Vec<u8>>) -> Result<usize, Halt> {
    let r = escape_end(b, i, out);
    if r.is_err() && !complete && i + 12 > b.len() {
        return Err(Halt::More);
    }
    Ok(r?)
}

fn escape_end(b: &[u8], i: usize, out: Option<&mut Vec<u8>>) -> Result<usize, ScanError> {
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
        if let Some(out) = out {
            out.push(ch);
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
    if let Some(out) = out {
        // Surrogates were excluded above, so this is always a valid char.
        let ch = char::from_u32(cp).ok_or(invalid(i, "invalid \\u escape"))?;
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    Ok(next)
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
            .map(|f| (f.model, f.stream))
    }

    fn is_invalid(r: Result<(String, bool), ScanError>) -> bool {
        matches!(r, Err(ScanError::Invalid { .. }))
    }

    type Outcome = Result<(String, bool, TopLevel), ScanError>;

    fn whole(body: &[u8]) -> Outcome {
        Scanner::new()
            .scan(body)
            .map(|f| (f.model, f.stream, f.spans))
    }

    /// Feeds `body` in the pieces `cuts` (increasing lengths), then whole; an error on the way
    /// ends it. Every step looks at its piece.
    fn in_pieces(s: &mut Scanner, body: &[u8], cuts: &[usize]) -> Outcome {
        s.begin();
        s.look_at_every_piece();
        for &k in cuts {
            if let Some(f) = s.resume(&body[..k], false)? {
                panic!("finished on an incomplete piece: {:?}", f.model);
            }
        }
        match s.resume(body, true)? {
            Some(f) => Ok((f.model, f.stream, f.spans)),
            None => panic!("not finished on the whole body"),
        }
    }

    /// As a filter feeds it: each piece appended to a window that keeps only the bytes from
    /// `needed_from` on.
    fn in_window(s: &mut Scanner, body: &[u8], cuts: &[usize]) -> Outcome {
        s.begin();
        s.look_at_every_piece();
        let (mut window, mut base, mut seen) = (Vec::new(), 0, 0);
        for &k in cuts.iter().chain([&body.len()]) {
            let k = k.max(seen);
            window.extend_from_slice(&body[seen..k]);
            seen = k;
            let complete = k == body.len();
            let got = s.resume_window(&window, base, complete)?;
            if let Some(f) = got {
                assert!(complete, "finished on an incomplete piece");
                return Ok((f.model, f.stream, f.spans));
            }
            assert!(!complete, "not finished on the whole body");
            let keep = s.needed_from();
            assert!(keep >= base, "needs bytes it was told to drop");
            window.drain(..keep - base);
            base = keep;
        }
        unreachable!()
    }

    /// Whatever the pieces, the answer is the whole-body answer (an early error included).
    fn pieces_agree(body: &[u8]) {
        let want = whole(body);
        let mut s = Scanner::new();
        for k in 0..=body.len() {
            let why = format!("cut at {k}: {:?}", String::from_utf8_lossy(body));
            assert_eq!(in_pieces(&mut s, body, &[k]), want, "{why}");
            assert_eq!(in_window(&mut s, body, &[k]), want, "window {why}");
            let two = [k / 2, k];
            assert_eq!(in_window(&mut s, body, &two), want, "window {two:?}: {why}");
        }
        let every: Vec<usize> = (0..=body.len()).collect();
        assert_eq!(
            in_pieces(&mut s, body, &every),
            want,
            "byte by byte: {:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(in_window(&mut s, body, &every), want, "window byte by byte");
        for step in [2, 3, 5, 7, 13] {
            let cuts: Vec<usize> = (0..=body.len()).step_by(step).collect();
            assert_eq!(in_pieces(&mut s, body, &cuts), want, "every {step} bytes");
            assert_eq!(
                in_window(&mut s, body, &cuts),
                want,
                "window every {step} bytes"
            );
        }
    }

    #[test]
    fn pieces_give_the_whole_body_answer() {
        let bodies: &[&[u8]] = &[
            br#"{"model":"qwen3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            br#" {"messages": [], "model" : "m" , "n": -12.5e+3, "t": true, "f": false, "z": null} "#,
            br#"{"model":"a\"b\\c\u00e9\ud83d\ude00\n","stream":false}"#,
            br#"{"messages":[{"content":"line\nnext \"q\" \\ \/ \b\f\r\t \u0041 \ud83d\ude00 end"}],"model":"m"}"#,
            "{\"model\":\"m\",\"x\":\"été 日本 😀\"}".as_bytes(),
            br#"{"model":"m","a":{"b":[1,2,[3,{"c":"d"}]],"e":{}},"f":[]}"#,
            br#"{"model":"m","model":"n"}"#,
            br#"{"a":{"x":1,"x":2},"model":"m"}"#,
            br#"{"model":"m","k\u0061":1,"ka":2}"#,
            br#"{"model":"m","a":1"#,
            br#"{"model":"m",}"#,
            br#"{"model":"m"} x"#,
            br#"{"model":"m"}{}"#,
            br#"{"model":12}"#,
            br#"{"model":""}"#,
            br#"{"stream":true}"#,
            br#"[1,2]"#,
            b"",
            b"   ",
            b"\xEF\xBB\xBF{\"model\":\"m\"}",
            b"{\"model\":\"m\",\"x\":\"a\xC3\"}",
            b"{\"model\":\"m\",\"x\":\"\xF0\x9F\x98\"}",
            b"{\"model\":\"m\" \xFF}",
            b"{\"a\" x \xFF}",
            b"{\"model\":\"m\",\"x\":\"\x01\"}",
            br#"{"model":"m","x":"\ud800\u0041"}"#,
            br#"{"model":"m","n":-x}"#,
            br#"{"model":"m","t":truex}"#,
            br#"{"model":"m","t":nul"#,
            br#"{"model":"m","x":"unterminated"#,
            br#"{"model" "m"}"#,
            br#"{"model":"m","x":[1,]}"#,
            br#"{"model":"m","x":[}"#,
            br#"{"model":"m" "x":1}"#,
        ];
        for body in bodies {
            pieces_agree(body);
        }
        for body in INVALID_JSON {
            pieces_agree(body.as_bytes());
        }
        // Long strings cut in their 64-byte blocks, escapes straddling every cut.
        let mut long = String::from(r#"{"messages":[{"content":""#);
        for i in 0..300 {
            long.push_str(["ab\\n", "\\\"", "cd é", "\\\\", "\\u00e9x"][i % 5]);
        }
        long.push_str(r#""}],"model":"m"}"#);
        pieces_agree(long.as_bytes());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 2), "]".repeat(MAX_DEPTH + 2));
        pieces_agree(format!(r#"{{"model":"m","d":{deep}}}"#).as_bytes());
    }

    /// UTF-8 is checked in the walk over each string (not in a pass of its own): multi-byte
    /// text, and one bad or cut sequence, at every offset around the walk's 16- and 64-byte
    /// steps, next to escapes; each body also cut at every byte.
    #[test]
    fn utf8_checked_in_the_string_walk_at_every_offset() {
        let text = "日本語 é😀 ".repeat(12);
        for bad in [
            &b"\xC3("[..],
            b"\xFF",
            b"\xE2\x82",
            b"\xED\xA0\x80",
            b"\xF0\x9F\x98\\n",
        ] {
            for pos in (0..140).step_by(3) {
                let mut body = br#"{"messages":[{"content":""#.to_vec();
                body.extend(std::iter::repeat_n(b'a', pos));
                let at = body.len();
                body.extend_from_slice(bad);
                body.extend_from_slice(br#"\n tail ""#);
                body.extend_from_slice(br#"}],"model":"m"}"#);
                assert_eq!(
                    Scanner::new().scan(&body),
                    Err(invalid(at, "invalid UTF-8")),
                    "{bad:?} at {pos}"
                );
                if pos % 21 == 0 {
                    pieces_agree(&body);
                }
                // Valid multi-byte text before it: the bad byte is still found exactly.
                let mut mixed = br#"{"messages":[{"content":""#.to_vec();
                mixed.extend_from_slice(text.as_bytes());
                mixed.extend(std::iter::repeat_n(b'a', pos));
                let at = mixed.len();
                mixed.extend_from_slice(bad);
                mixed.extend_from_slice(br#" tail"}],"model":"m"}"#);
                assert_eq!(
                    Scanner::new().scan(&mixed),
                    Err(invalid(at, "invalid UTF-8")),
                    "{bad:?} at {pos} after text"
                );
            }
        }
        // Valid text at every phase scans, whole and in pieces.
        for pad in 0..70 {
            let body = format!(
                r#"{{"messages":[{{"content":"{}{text}\"x\" {text}"}}],"model":"m"}}"#,
                "a".repeat(pad)
            );
            assert_eq!(
                Scanner::new().scan(body.as_bytes()).map(|f| f.model),
                Ok("m".into())
            );
            if pad % 10 == 0 {
                pieces_agree(body.as_bytes());
            }
        }
    }

    /// The first problem by offset wins between UTF-8 and the grammar, in keys, the model and
    /// skipped strings alike; outside strings a non-ASCII byte is refused by the grammar.
    #[test]
    fn first_problem_wins_between_utf8_and_grammar() {
        let cases: &[(&[u8], usize, &str)] = &[
            (
                b"{\"model\":\"m\",\"x\":\"a\xFF\x01\"}",
                19,
                "invalid UTF-8",
            ),
            (
                b"{\"model\":\"m\",\"x\":\"a\x01\xFF\"}",
                19,
                "control character in string",
            ),
            (b"{\"model\":\"m\",\"x\":\"a\xC3\\q\"}", 19, "invalid UTF-8"),
            (
                b"{\"model\":\"m\",\"x\":\"a\\q\xC3\"}",
                19,
                "invalid escape",
            ),
            (b"{\"k\xC3\":1,\"model\":\"m\"}", 3, "invalid UTF-8"),
            (b"{\"k\xC3\x01\":1}", 3, "invalid UTF-8"),
            (b"{\"k\x01\xC3\":1}", 3, "control character in string"),
            (b"{\"model\":\"m\xE2\x82\"}", 11, "invalid UTF-8"),
            (b"{\"model\":\"m\xE2\x82\\n\"}", 11, "invalid UTF-8"),
            (b"{\"model\":\"m\",\"x\":\"abc\xC3", 21, "invalid UTF-8"),
            (b"{\"model\":\"m\",\"x\":\"abc", 21, "unterminated string"),
            (b"{\"model\":\"m\" \xFF}", 13, "expected ',' or '}'"),
            (
                "{\"model\":\"m\",é:1}".as_bytes(),
                13,
                "expected a string key after ','",
            ),
        ];
        for &(body, at, what) in cases {
            assert_eq!(
                Scanner::new().scan(body),
                Err(invalid(at, what)),
                "{:?}",
                String::from_utf8_lossy(body)
            );
            pieces_agree(body);
        }
        assert_eq!(Scanner::new().scan(b"\xFF{}"), Err(ScanError::NotObject));
    }

    /// Random token soup, some valid and most not: the pieces never change the answer.
    #[test]
    fn pieces_agree_on_random_bodies() {
        let tokens: &[&str] = &[
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\"model\"",
            "\"m\"",
            "\"k\"",
            "\"a\\\"b\"",
            "1",
            "-2.5e3",
            "true",
            "null",
            "\"é\"",
            "\"\\u00e9\"",
            "\"\\ud83d\\ude00\"",
            "\"stream\"",
            "\"x\\n\\\\y\"",
            "\u{1F600}",
            "\"",
        ];
        let mut seed = 0x9E3779B97F4A7C15u64;
        for _ in 0..400 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut s = seed;
            let mut body = String::from("{\"model\":\"m\",");
            for _ in 0..(seed % 24) {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                body.push_str(tokens[(s >> 33) as usize % tokens.len()]);
            }
            pieces_agree(body.as_bytes());
        }
    }

    #[test]
    fn unfinished_bodies_wait_and_broken_ones_fail_early() {
        let mut s = Scanner::new();
        s.begin();
        s.look_at_every_piece();
        let body = br#"{"model":"m","x":"abc"#;
        assert_eq!(s.resume(body, false), Ok(None));
        assert!(s.resume(body, true).is_err());
        s.begin();
        s.look_at_every_piece();
        // The error shows before the body is complete.
        assert_eq!(
            s.resume(br#"{"model":"m",}"#, false),
            Err(invalid(13, "expected a string key after ','"))
        );
        // Without the test hook, small pieces wait for MIN_STEP new bytes.
        let mut s = Scanner::new();
        s.begin();
        assert_eq!(s.resume(br#"{"model":"m",}"#, false), Ok(None));
    }

    #[test]
    fn notes_tool_calls_in_messages_only() {
        let knob = |body: &str| {
            Scanner::new()
                .scan(body.as_bytes())
                .unwrap()
                .knobs
                .tool_calls
        };
        assert!(knob(
            r#"{"model":"m","messages":[{"role":"assistant","tool\u005fcalls":[]}]}"#
        ));
        assert!(!knob(
            r#"{"model":"m","tool_calls":[],"messages":[{"role":"user"}]}"#
        ));
        assert!(!knob(
            r#"{"model":"m","messages":[{"role":"user","content":[{"tool_calls":1}]}]}"#
        ));
        assert!(!knob(r#"{"model":"m","x":[{"tool_calls":1}]}"#));
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
    fn distinct_keys_get_distinct_fingerprints() {
        // Keys of up to 8 bytes are read whole: none of one length may collide. Every key of one
        // and two printable bytes, the request fields and their neighbours at each length up to
        // and past a word, and keys differing only in length or in their middle byte.
        let mut keys: Vec<Vec<u8>> = (b' '..=b'~').map(|c| vec![c]).collect();
        for a in b' '..=b'~' {
            for b in b' '..=b'~' {
                keys.push(vec![a, b]);
            }
        }
        for k in [
            "model",
            "messages",
            "role",
            "content",
            "tools",
            "tool_calls",
            "stream",
            "stream_options",
            "include_usage",
            "max_tokens",
            "max_completion_tokens",
            "max_output_tokens",
            "temperature",
            "n",
            "best_of",
            "user",
            "name",
            "type",
            "a",
            "aa",
            "aaa",
            "aaaa",
            "aaaaa",
            "aaaaaaa",
            "aaaaaaaa",
            "aaaaaaaaa",
            "aaaaaaaaaaaaaaaa",
            "aaaaaaaaaaaaaaaaa",
            "abcdefgh",
            "abcdefgi",
            "abcXefgh",
            "abcdefghijklmnop",
            "abcdefghijklmnoq",
            "Xbcdefghijklmnop",
            "\0",
            "\0\0",
        ] {
            keys.push(k.as_bytes().to_vec());
        }
        keys.sort();
        keys.dedup();
        let mut seen = std::collections::HashMap::new();
        for k in &keys {
            if let Some(other) = seen.insert(fingerprint(k), k) {
                panic!("{other:?} and {k:?} share a fingerprint");
            }
        }
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

    /// Bodies that are not JSON (or not one object's worth of it).
    const INVALID_JSON: &[&str] = &[
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
    ];

    #[test]
    fn invalid_json_is_refused() {
        for body in INVALID_JSON {
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
    fn numbers_past_a_64_bit_float_are_refused() {
        for n in [
            "9".repeat(5000),
            format!("-{}", "9".repeat(400)),
            format!("{}e99999", "9".repeat(10)),
            "1e309".to_string(),
            "-1.8E+308".to_string(),
        ] {
            let body = format!("{{\"model\":\"m\",\"n\":{n}}}");
            assert!(
                matches!(scan(&body), Err(ScanError::Invalid { at: 17, .. })),
                "{n}"
            );
        }
        // Tiny, long-fractioned, past u64 and up to f64::MAX: numbers every parser holds.
        let ok = format!(
            "{{\"model\":\"m\",\"f\":-0.5E+3,\"g\":1e-400,\"h\":18446744073709551616,\"i\":0.{},\"j\":1.7e308,\"k\":{}}}",
            "1".repeat(500),
            "9".repeat(300)
        );
        assert!(scan(&ok).is_ok());
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
