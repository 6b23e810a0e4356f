//! Token usage of every response the filter forwards, budget or not: the gateway asks an
//! OpenAI-shaped stream for its usage chunk (and strips that chunk when the client did not ask
//! for it), reads `usage` from every 2xx body as it streams by ([`Meter`]), and publishes it
//! when the request ends: the audit line's `tokens`, and per backend, requested model and team
//! the histogram `gen_ai.client.token.usage` ([`UsageStats`]). Budgets charge from the same
//! reading.
//!
//! The histogram's name and its `gen_ai_token_type` values (`input`, `output`, `cached_input`)
//! are OpenTelemetry's GenAI conventions, the ones Envoy AI Gateway and agentgateway export.
//! Envoy's stats have no labels of their own: the labels are written into the stat name in the
//! `name=.=value;.;` form, and the generated bootstrap's `stats_config.stats_tags` turns them
//! back into Prometheus labels (`gen_ai_client_token_usage_bucket{gen_ai_token_type="input",
//! gen_ai_request_model="…",llmkube_backend="…",llmkube_team="…"}`).

use crate::marks::mark;
use filter_edge::{self as edge, Buffer, Level, MetricKind};
use fnv::FnvHashMap;
use router_core::audit::{AuditRecord, AuditTokens};
use router_core::budget::bound::request_facts;
use router_core::budget::inject::{edits, stream_needs_asking, Edits, Splice};
use router_core::budget::usage::{
    charge, BodyKind, Charge, Usage, UsageReader, USAGE_STAT, USAGE_STAT_TAGS,
};
use router_core::budget::usage_tail;
use router_core::headers::MODEL_SPAN_HEADER;
use router_core::plan::Forward;
use router_core::scan::Fields;
use std::cell::{Cell, RefCell};

/// Series (backend × model × team) a worker defines at most; later combinations are recorded
/// under model and team `other` of their backend. Envoy cannot drop a stat once defined, and
/// models and teams come from requests.
pub(crate) const MAX_SERIES: usize = 256;
/// A label value is cut to this many bytes.
const MAX_LABEL: usize = 64;

/// The edits that ask a stream for usage, when the request is an OpenAI-shaped stream whose
/// client did not ask itself (`include_usage: false` is left as the client said: without a
/// budget there is nothing to charge). Read before the scan's fields are consumed.
pub(crate) fn asking(fields: &Fields, body_len: usize, path: &[u8]) -> Option<Edits> {
    if !fields.stream {
        return None;
    }
    let path = std::str::from_utf8(path).unwrap_or("");
    let facts = request_facts(body_len, fields);
    if facts.include_usage.is_some() {
        return None;
    }
    edits(fields, &facts, stream_needs_asking(path), None)
}

/// The splice for `e`, made from the body when the filter holds it, else from the few head
/// bytes it needs (none when only members go after the opening brace at byte 0).
pub(crate) fn splice_of(e: &Edits, body: Option<&[u8]>) -> Result<Option<Splice>, String> {
    let needed = e.needed();
    let read;
    let head: &[u8] = match body {
        Some(b) => b,
        None if needed == 1 => b"{",
        None => {
            read = edge::buffer(Buffer::RequestBody, 0, needed)
                .map_err(|e| format!("reading the request body: {e}"))?
                .unwrap_or_default();
            &read
        }
    };
    Ok(e.splice(head))
}

/// Sends the edited head upstream in place of the client's first bytes, the rest of the body
/// untouched, and moves the stamped `model` span with it (Envoy does not fix `content-length`
/// itself). `len`: the client's body length.
pub(crate) fn send(forward: &mut Forward, len: usize, splice: &Splice) -> Result<(), String> {
    edge::replace_buffer(Buffer::RequestBody, splice.replace, &splice.with)
        .map_err(|e| format!("editing the request body: {e}"))?;
    edge::set_header(
        edge::Map::RequestHeaders,
        "content-length",
        &splice.new_len(len).to_string(),
    )
    .map_err(|e| format!("setting content-length: {e}"))?;
    // The per-attempt filter finds `model` by the stamped span and body length.
    for (name, value) in forward.stamps.iter_mut() {
        if *name == MODEL_SPAN_HEADER {
            if let Some((span, _)) = router_core::rewrite::parse_span(value.as_bytes()) {
                *value = router_core::rewrite::format_span(splice.moved(span), splice.new_len(len))
                    .into();
            }
        }
    }
    Ok(())
}

/// The usage of one request's response, read as its body streams by.
#[derive(Default)]
pub(crate) struct Meter {
    request_bytes: u64,
    /// The gateway added `include_usage`: the usage-only chunk is not the client's.
    strip: bool,
    /// From 2xx response headers on.
    reader: Option<UsageReader>,
    out: Vec<u8>,
    /// What the body reported, once it ended (or was cut and finished).
    ended: Option<Usage>,
    /// A JSON body is read (not an event stream).
    json: bool,
    /// The length of a JSON body that came whole and was read from its end, not fed to the
    /// reader ([`usage_tail`]).
    whole: u64,
    /// A piece of the body with bytes in it came before (read or not).
    seen: bool,
}

impl Meter {
    pub fn new(request_bytes: usize, strip: bool) -> Meter {
        Meter {
            request_bytes: request_bytes as u64,
            strip,
            ..Meter::default()
        }
    }

    /// The response headers came through with `status`: a 2xx body is read.
    pub fn start(&mut self, status: u32, streaming: bool) {
        if (200..300).contains(&status) {
            let kind = if streaming {
                BodyKind::EventStream
            } else {
                BodyKind::Json
            };
            self.reader = Some(UsageReader::new(kind, self.strip));
            self.json = !streaming;
        }
    }

    /// Bytes of content seen so far (the completion estimate's base).
    pub fn content_bytes(&self) -> u64 {
        self.reader.as_ref().map_or(0, UsageReader::content_bytes) + self.whole
    }

    /// A piece of the response body (`size` bytes: this chunk only). When stripping, the
    /// chunk the client gets is written back. `true` at the end of the body.
    pub fn feed(&mut self, size: usize, end: bool) -> bool {
        let Some(reader) = self.reader.as_mut() else {
            return false;
        };
        if self.ended.is_some() {
            return false;
        }
        let chunk = if size > 0 {
            edge::buffer(Buffer::ResponseBody, 0, size).unwrap_or_else(|e| {
                // Usage is then estimated from what was read; the body goes on unchanged.
                edge::log(
                    Level::Warn,
                    &format!("model-router: usage: response body: {e}"),
                );
                None
            })
        } else {
            None
        };
        let chunk = chunk.unwrap_or_default();
        mark!("usage: body read");
        // A JSON body in one piece (the usual non-streamed answer): its usage is read from its
        // end when the end proves it, and the body is not walked. Not after an earlier piece,
        // even one that could not be read: the walk has (or lost) the body's start.
        let first = !self.seen;
        self.seen |= size > 0;
        if end && self.json && first {
            if let Some(usage) = usage_tail::whole_json_usage(&chunk) {
                self.whole = chunk.len() as u64;
                self.ended = Some(usage);
                mark!("usage: read from the end");
                return end;
            }
        }
        self.out.clear();
        reader.feed(&chunk, &mut self.out);
        mark!("usage: fed");
        if end {
            self.ended = Some(reader.finish(&mut self.out));
        }
        mark!("usage: finished");
        if reader.strips() && (size > 0 || !self.out.is_empty()) {
            if let Err(e) = edge::replace_buffer(Buffer::ResponseBody, size, &self.out) {
                edge::log(Level::Warn, &format!("model-router: usage: stripping: {e}"));
            }
        }
        end
    }

    /// What the response reported: at its end, or as far as it got (a cut body is finished
    /// here, what it held back dropped). `None`: no 2xx body was read.
    pub fn usage(&mut self) -> Option<Usage> {
        if self.ended.is_none() {
            let reader = self.reader.as_mut()?;
            let mut sink = Vec::new();
            self.ended = Some(reader.finish(&mut sink));
        }
        self.ended
    }

    /// The request's tokens: what was reported, a missing side estimated from bytes.
    pub fn charge(&mut self) -> Option<Charge> {
        let usage = self.usage()?;
        Some(charge(usage, self.request_bytes, self.content_bytes()))
    }
}

/// The histogram ids of one series: input, output, cached input.
type Ids = Option<[u32; 3]>;

/// `gen_ai.client.token.usage` per backend, requested model and team, one worker's ids.
pub(crate) struct UsageStats {
    backends: Vec<String>,
    /// Per backend index: [`series_key`] of model and team → ids.
    series: RefCell<Vec<FnvHashMap<String, Ids>>>,
    defined: Cell<usize>,
    /// The series recorded last (backend, key) and its ids: consecutive requests mostly repeat
    /// it, and comparing is cheaper than building and hashing the key. A key's ids never change
    /// once looked up (the maps only grow; once full, they stay full).
    last: RefCell<(usize, String, Ids)>,
}

/// One map key for a model and a team: a model holds no control character
/// (`plan::check_request`), so the first NUL ends it.
fn series_key(model: &str, team: &str) -> String {
    let mut key = String::with_capacity(model.len() + 1 + team.len());
    key.push_str(model);
    key.push('\0');
    key.push_str(team);
    key
}

impl UsageStats {
    pub fn new(backends: impl Iterator<Item = String>) -> UsageStats {
        let backends: Vec<String> = backends.map(|b| label(&b)).collect();
        UsageStats {
            series: RefCell::new(vec![FnvHashMap::default(); backends.len()]),
            backends,
            defined: Cell::new(0),
            last: RefCell::new((usize::MAX, String::new(), None)),
        }
    }

    /// Records what a response reported (estimates are not usage: OpenTelemetry's convention
    /// records only counts the system gave).
    pub fn record(&self, backend: usize, model: &str, team: &str, usage: &Usage) {
        if usage.is_empty() && usage.cached.is_none() {
            return;
        }
        let Some(ids) = self.ids(backend, model, team) else {
            return;
        };
        for (id, n) in ids
            .iter()
            .zip([usage.prompt, usage.completion, usage.cached])
        {
            if let Some(n) = n {
                edge::record_metric(*id, n);
            }
        }
    }

    fn ids(&self, backend: usize, model: &str, team: &str) -> Ids {
        let mut last = self.last.borrow_mut();
        let k = last.1.as_bytes();
        let same = last.0 == backend
            && k.len() == model.len() + 1 + team.len()
            && k.starts_with(model.as_bytes())
            && k.ends_with(team.as_bytes())
            && k[model.len()] == 0;
        if !same {
            let key = series_key(model, team);
            last.2 = self.look_up(backend, &key, model, team);
            last.0 = backend;
            last.1 = key;
        }
        last.2
    }

    fn look_up(&self, backend: usize, key: &str, model: &str, team: &str) -> Ids {
        let mut series = self.series.borrow_mut();
        let per_backend = series.get_mut(backend)?;
        if let Some(ids) = per_backend.get(key) {
            return *ids;
        }
        let (key, model, team) = if self.defined.get() >= MAX_SERIES {
            let other = series_key("other", "other");
            if let Some(ids) = per_backend.get(&other) {
                return *ids;
            }
            (other, "other", "other")
        } else {
            (key.to_string(), model, team)
        };
        let ids = self.define(&self.backends[backend], &label(model), &label(team));
        self.defined.set(self.defined.get() + 1);
        per_backend.insert(key, ids);
        ids
    }

    fn define(&self, backend: &str, model: &str, team: &str) -> Ids {
        let mut ids = [0u32; 3];
        for (id, kind) in ids.iter_mut().zip(["input", "output", "cached_input"]) {
            let mut name = String::with_capacity(160);
            for (tag, value) in USAGE_STAT_TAGS.iter().zip([kind, backend, model, team]) {
                name.push_str(tag);
                name.push_str("=.=");
                name.push_str(value);
                name.push_str(";.;");
            }
            name.push_str(USAGE_STAT);
            *id = match edge::define_metric(MetricKind::Histogram, &name) {
                Ok(id) => id,
                Err(e) => {
                    edge::log(Level::Warn, &format!("model-router: metric {name}: {e}"));
                    return None;
                }
            };
        }
        Some(ids)
    }
}

/// A label value as a stat name can carry it: the tag delimiters (`;` `=`) and anything
/// outside printable ASCII become `_`, cut to [`MAX_LABEL`] bytes, `none` when empty.
fn label(v: &str) -> String {
    if v.is_empty() {
        return "none".to_string();
    }
    v.bytes()
        .take(MAX_LABEL)
        .map(|b| match b {
            b';' | b'=' => '_',
            0x21..=0x7e => b as char,
            _ => '_',
        })
        .collect()
}

/// The team a request's usage is counted under: its team budget's team (the audit line's
/// `budget/team`), else the caller label (`auditLog.callerHeader`), else none.
pub(crate) fn team_of(audit: &AuditRecord) -> &str {
    audit
        .budgets
        .iter()
        .find_map(|b| b.split_once('/').map(|(_, team)| team))
        .or(audit.caller.as_deref())
        .unwrap_or("")
}

/// Publishes the usage of an ended request: the audit line's `tokens` (and
/// `usage_estimated`), and the histograms of what the response reported.
pub(crate) fn publish(
    meter: &mut Meter,
    stats: &UsageStats,
    backend: Option<usize>,
    audit: &mut AuditRecord,
) {
    let (Some(usage), Some(c)) = (meter.usage(), meter.charge()) else {
        return;
    };
    mark!("log: usage charged");
    audit.tokens = Some(AuditTokens {
        prompt: c.prompt,
        completion: c.completion,
        cached: usage.cached,
    });
    audit.usage_estimated = c.estimated;
    mark!("log: audit tokens");
    if let Some(b) = backend {
        let model = audit.model.as_deref().unwrap_or("");
        stats.record(b, model, team_of(audit), &usage);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_keep_the_tag_syntax_intact() {
        assert_eq!(label("qwen3-8b"), "qwen3-8b");
        assert_eq!(label("a;.;b=.=c d\u{e9}"), "a_._b_._c_d__");
        assert_eq!(label(""), "none");
        assert_eq!(label(&"x".repeat(100)).len(), MAX_LABEL);
    }

    #[test]
    fn the_team_is_the_budgets_then_the_callers() {
        let mut a = AuditRecord {
            caller: Some("svc".into()),
            ..AuditRecord::default()
        };
        assert_eq!(team_of(&a), "svc");
        a.budgets = vec!["all".into(), "per-team/blue".into()];
        assert_eq!(team_of(&a), "blue");
    }
}
