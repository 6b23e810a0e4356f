//! One HTTP request through the model-router filter: read the body, carry out the request plan,
//! judge the response, write the audit line at the end. `router_core::plan` decides; this moves
//! headers and bytes.

use crate::budget::{self, RequestView};
use crate::marks::mark;
use crate::worker::Worker;
use filter_edge::{self as edge, Buffer, Level, Map};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use router_core::audit::{caller_label, client_address, AuditRecord, Outcome};
use router_core::body::BodyWindow;
use router_core::config::Tier;
use router_core::errors::{ApiError, ErrorShape};
use router_core::headers::{ATTEMPT_COUNT_HEADER, DESTINATION_ENDPOINT_HEADER};
use router_core::plan::{
    check_body_size, check_request, plan_head, plan_request, retry_after_quarantine, Checked,
    Forward, HeadPlan, Refusal, RequestInputs,
};
use router_core::quarantine::{left_ejected, went_silent};
use router_core::response::{ResponseHead, ResponseJudge};
use router_core::router::RequestHeaders;
use router_core::scan::{Fields, ScanError, Scanner};
use std::rc::Rc;

const ENDPOINT_METADATA: &[&str] = &[
    "xds",
    "upstream_host_metadata",
    "filter_metadata",
    "llmkube",
];

/// A body scan in progress, for a body that arrives in pieces.
type Pieces = BodyWindow<Box<Scanner>>;

/// Where a request stands. (A callout, e.g. a budget reservation, will be a phase between
/// reading the body and forwarding.)
enum Phase {
    /// Before the request headers, or a request that is not ours to route: passed on as it is.
    Passing,
    /// The body is being read for a routing decision. A body arriving in pieces is scanned as
    /// they come; one that arrives whole uses the worker's scanner and no window.
    ReadingBody(Option<Pieces>),
    /// The decision is stamped and the request went upstream.
    Forwarded(Routed),
    /// We answered locally: later callbacks for this stream only see our own reply.
    Answered,
}

pub(crate) struct Request {
    worker: Option<Rc<Worker>>,
    /// The host's id of this HTTP context (the root resumes or answers a request by it).
    context_id: u32,
    phase: Phase,
    headers: RequestHeaders,
    /// The request's start by the host's clock, read only when something needs it: the audit
    /// line's latency, a quarantine check, a pick ([`started_clock`]); `0` until then.
    started_ns: u64,
    audit: AuditRecord,
    /// Whether this request is one we audit (inference and models requests).
    audited: bool,
    /// Rule and backend (the chosen one, then the one that answered) the counters are kept by.
    rule_index: Option<usize>,
    backend_index: Option<usize>,
    /// The request's header map as read, for `:method` and `:path` read in place (budgets and
    /// usage asking read the path, shadow copies both).
    line: RequestLine,
    /// What the request holds on its budgets until it settles or releases.
    budget: Option<budget::Metered>,
    /// The usage its response reports (`crate::usage`).
    meter: crate::usage::Meter,
    /// The pod this request holds, for an endpoint-picked backend (released in `on_log`).
    pick: Option<crate::pick::Held>,
    /// The pick's inputs while a shared ledger decides on the request.
    pending_pick: Option<crate::pick::Pending>,
    /// Which API's error shape the client reads (Anthropic's on the Messages path).
    shape: ErrorShape,
    /// `content-type`, kept for shadow copies.
    content_type: Option<String>,
    /// Shadow copies prepared, sent once the request goes upstream (`crate::shadow`).
    shadow: Vec<crate::shadow::Prepared>,
}

/// A request's header map as the host handed it over, with where `:method` and `:path` are in
/// it: they are read in place, not copied out.
#[derive(Default)]
struct RequestLine {
    map: Option<edge::HeaderMap>,
    method: Option<usize>,
    path: Option<usize>,
}

impl RequestLine {
    fn value(&self, at: Option<usize>) -> &[u8] {
        match (&self.map, at) {
            (Some(map), Some(i)) => map.value(i),
            _ => &[],
        }
    }

    fn method(&self) -> &[u8] {
        self.value(self.method)
    }

    fn path(&self) -> &[u8] {
        self.value(self.path)
    }
}

/// A forwarded request, as its response is judged.
struct Routed {
    judge: ResponseJudge,
    /// The backend whose response headers came through (status below 500).
    served: Option<usize>,
    /// Its response reached end of stream.
    complete: bool,
    /// The attempt order, for how long a failed request's backends stay ejected.
    order: Vec<usize>,
}

/// The request's start by the host's clock, read on first use (`0`: not read yet).
fn started_clock(started_ns: &mut u64) -> u64 {
    if *started_ns == 0 {
        *started_ns = edge::now_nanos();
    }
    *started_ns
}

/// Why a piece of the body could not be read.
enum PieceError {
    Scan(ScanError),
    Host(String),
}

/// Reads the body bytes up to `size` that `pieces` has not parsed (with the few it kept of a cut
/// token: Envoy holds the whole body while the filter reads it) and scans them.
fn read_piece(
    pieces: &mut Pieces,
    size: usize,
    complete: bool,
) -> Result<Option<Fields>, PieceError> {
    let from = pieces.read_from();
    let piece = if size > from {
        match edge::buffer(Buffer::RequestBody, from, size - from) {
            Ok(p) => p.unwrap_or_default(),
            Err(e) => return Err(PieceError::Host(format!("reading the request body: {e}"))),
        }
    } else {
        Vec::new()
    };
    pieces.feed_read(piece, complete).map_err(PieceError::Scan)
}

impl Request {
    pub fn new(worker: Option<Rc<Worker>>, context_id: u32) -> Self {
        Request {
            worker,
            context_id,
            phase: Phase::Passing,
            headers: RequestHeaders::new(),
            started_ns: 0,
            // `router` is filled in when the line is written: most requests never write one.
            audit: AuditRecord::default(),
            audited: false,
            rule_index: None,
            backend_index: None,
            line: RequestLine::default(),
            budget: None,
            meter: crate::usage::Meter::default(),
            pick: None,
            pending_pick: None,
            shape: ErrorShape::OpenAi,
            content_type: None,
            shadow: Vec::new(),
        }
    }

    fn fail(&mut self, err: &ApiError, outcome: Outcome) -> Action {
        self.fail_retry(err, outcome, None)
    }

    /// An error answer in the client's API shape; `retry_after` (seconds) when coming back later
    /// can help.
    fn fail_retry(&mut self, err: &ApiError, outcome: Outcome, retry_after: Option<u64>) -> Action {
        self.settle(outcome);
        let body = err.body_in(self.shape, self.audit.request_id.as_deref());
        match retry_after.map(|s| s.to_string()) {
            Some(s) => self.reply(err.status, &body, err.code, &[("retry-after", &s)]),
            None => self.reply(err.status, &body, err.code, &[]),
        }
    }

    fn refuse(&mut self, refusal: Refusal) -> Action {
        self.fail(&refusal.error, refusal.outcome)
    }

    /// Records how the request ended: the audit outcome and its counter, once.
    fn settle(&mut self, outcome: Outcome) {
        if self.audit.outcome.is_some() {
            return;
        }
        self.audit.outcome = Some(outcome);
        if let Some(worker) = &self.worker {
            worker
                .metrics
                .count(self.rule_index, self.backend_index, outcome);
        }
    }

    /// Answers locally with a JSON body, the request id (the one the audit line records) and
    /// `Retry-After` when given.
    fn reply(
        &mut self,
        status: u32,
        body: &[u8],
        details: &str,
        extra: &[(&'static str, &str)],
    ) -> Action {
        self.phase = Phase::Answered;
        self.audit.status = status;
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(self.id_headers());
        headers.extend_from_slice(extra);
        if let Err(e) = edge::respond(status, &headers, body, details) {
            edge::log(
                Level::Error,
                &format!("model-router: local response failed: {e}"),
            );
        }
        Action::Pause
    }

    /// The response headers that carry the request id: `x-request-id` (OpenAI's SDKs read it),
    /// and `request-id` too on the Messages path (Anthropic's SDKs read that one).
    fn id_headers(&self) -> impl Iterator<Item = (&'static str, &str)> + '_ {
        let id = self.audit.request_id.as_deref();
        let anthropic = self.shape == ErrorShape::Anthropic;
        id.map(|id| ("x-request-id", id))
            .into_iter()
            .chain(id.filter(|_| anthropic).map(|id| ("request-id", id)))
    }

    /// Puts the request id on a response that came from upstream or from Envoy itself.
    fn stamp_id(&self) {
        for (name, value) in self.id_headers() {
            if let Err(e) = edge::set_header(Map::ResponseHeaders, name, value) {
                edge::log(
                    Level::Warn,
                    &format!("model-router: setting {name} on the response: {e}"),
                );
            }
        }
    }

    fn internal(&mut self, what: &str) -> Action {
        edge::log(Level::Error, &format!("model-router: {what}"));
        self.fail(&ApiError::internal(what), Outcome::InvalidRequest)
    }

    /// Reads the request headers once: routing inputs, audit inputs, method and path (kept in
    /// `self.line`), length.
    ///
    /// Decision headers are ours alone: whatever the client sent under those names is removed
    /// here, on every request, before anything reads headers. Reading the map once and removing
    /// only names that are present keeps this to one hostcall for a request that sends none.
    fn read_headers(&mut self, worker: &Worker) -> Result<Option<u64>, String> {
        let mut pairs = edge::header_map(Map::RequestHeaders)
            .map_err(|e| format!("reading request headers: {e}"))?;
        pairs
            .remove_present(
                Map::RequestHeaders,
                worker.stamped.iter().map(String::as_str),
            )
            .map_err(|e| format!("removing decision headers: {e}"))?;
        mark!("headers: decision names removed");
        let router = &worker.router;
        let needed = router.needed_headers();
        let audit_cfg = &router.config.audit;
        let (mut method, mut path, mut length) = (None, None, None);
        let mut xff: Vec<String> = Vec::new();
        self.headers.clear();
        for (i, (name, value)) in pairs.iter().enumerate() {
            match name {
                b":method" => method = Some(i),
                b":path" => path = Some(i),
                b"content-length" => {
                    length = std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                }
                b"x-request-id" => {
                    self.audit.request_id = Some(caller_label(value));
                }
                b"content-type" if worker.shadow.is_some() => {
                    self.content_type = std::str::from_utf8(value).ok().map(str::to_string);
                }
                b"x-forwarded-for" if audit_cfg.log_client_address => {
                    xff.push(String::from_utf8_lossy(value).into_owned());
                }
                _ => {
                    // Envoy hands names over lower-cased; compare case-blind anyway, without
                    // allocating for the many headers routing never looks at.
                    let is = |want: &str| name.eq_ignore_ascii_case(want.as_bytes());
                    if self.audit.caller.is_none()
                        && audit_cfg.caller_header.as_deref().is_some_and(is)
                    {
                        self.audit.caller = Some(caller_label(value));
                    }
                    if let Some(lower) = needed.iter().find(|n| is(n)) {
                        self.headers
                            .push(lower.clone(), String::from_utf8_lossy(value).into_owned());
                    }
                }
            }
        }
        mark!("headers: walked");
        if self.audit.request_id.is_none() {
            // No gateway id (Envoy always sets one): make one, and send it upstream as well so
            // the backend's logs can name the same request.
            let id = {
                let mut ids = worker.ids.borrow_mut();
                router_core::audit::new_request_id(ids.next_u64(), ids.next_u64())
            };
            edge::set_header(Map::RequestHeaders, "x-request-id", &id)
                .map_err(|e| format!("setting x-request-id: {e}"))?;
            self.audit.request_id = Some(id);
        }
        if audit_cfg.log_client_address {
            let peer = edge::property(&["source", "address"])
                .ok()
                .flatten()
                .map(|p| String::from_utf8_lossy(&p).into_owned())
                .unwrap_or_default();
            let hops: Vec<&str> = xff.iter().map(String::as_str).collect();
            self.audit.client = Some(client_address(&peer, &hops, &worker.trusted_proxies));
        }
        let first = |name: &str| self.headers.first(name).map(|v| v.to_string());
        self.audit.classification = first(router.classification_header());
        self.audit.task_complexity = first(router.complexity_header());
        self.line = RequestLine {
            map: Some(pairs),
            method,
            path,
        };
        mark!("headers: audit fields");
        Ok(length)
    }

    /// Carries out the request plan for the scanned body (`body_len` bytes; the body itself when
    /// it arrived whole or the audit policy wants it in the record).
    fn route(
        &mut self,
        worker: &Worker,
        scanned: Result<Fields, ScanError>,
        body_len: usize,
        body: Option<&[u8]>,
    ) -> Action {
        // What the budget step reads of the scan (not the model name: no copy of it).
        let budget_fields = worker
            .budgets
            .as_ref()
            .and(scanned.as_ref().ok())
            .map(|f| Fields {
                model: String::new(),
                stream: f.stream,
                spans: f.spans.clone(),
                knobs: f.knobs,
            });
        let ask_usage = scanned
            .as_ref()
            .ok()
            .and_then(|f| crate::usage::asking(f, body_len, self.line.path()));
        let audit_body = body.filter(|_| worker.router.config.audit.include_request_body);
        let spans = scanned
            .as_ref()
            .map(|f| f.spans.clone())
            .unwrap_or_default();
        mark!("route: fields kept for budgets, usage, pick");
        let checked = match check_request(scanned) {
            Ok(c) => c,
            Err(refusal) => return self.refuse(refusal),
        };
        self.audit.model = Some(checked.model.clone());
        if let Some(body) = audit_body {
            self.audit.request_body = Some(String::from_utf8_lossy(body).into_owned());
        }
        let router = &worker.router;
        if let Some(Err(refusal)) = router
            .allowlists()
            .map(|a| a.check(&self.headers, &checked.model))
        {
            return self.refuse(refusal);
        }
        let mut forward = match self.plan(worker, &checked, body_len) {
            Ok(f) => f,
            Err(answer) => return answer,
        };
        mark!("route: checked, planned (rules, order, stamps)");
        // Hashed before the budget step edits the body; charged only once it is admitted.
        let pick = worker
            .pick
            .prepare(&forward.decision, &spans, body, body_len);
        mark!("route: pick prepared");
        let backend = forward.backend();
        self.audit.backend = Some(backend.name.clone());
        self.audit.tier = Some(backend.tier.as_str());
        self.audit.rule = forward.rule_name().map(str::to_string);
        self.rule_index = forward.decision.rule;
        self.backend_index = Some(forward.decision.backend());
        self.prepare_shadow(
            worker,
            &forward.decision,
            checked.model_span,
            body,
            body_len,
        );
        mark!("route: audit fields, shadow");
        let fields = budget_fields.as_ref();
        self.meter = crate::usage::Meter::new(body_len, false);
        if let Some(action) = self.budget_step(worker, &mut forward, body, body_len, fields) {
            return action;
        }
        mark!("route: budget step");
        if self.budget.is_none() {
            if let Some(action) = self.ask_usage(&mut forward, ask_usage, body, body_len) {
                return action;
            }
        }
        self.note_failover_skipped(worker, forward.decision.order.len(), body_len);
        self.phase = Phase::Forwarded(Routed {
            judge: forward.judge,
            served: None,
            complete: false,
            // Not read again from the plan: moved, not copied.
            order: std::mem::take(&mut forward.decision.order),
        });
        mark!("route: usage asked, phase");
        self.dispatch(worker, &forward, pick)
    }

    /// The rules' plan for a checked request: its attempt order (quarantined backends left
    /// out) and stamps, or the refusal's answer, with `Retry-After` when only quarantined
    /// backends could serve it.
    fn plan<'w>(
        &mut self,
        worker: &'w Worker,
        checked: &Checked,
        body_len: usize,
    ) -> Result<Forward<'w>, Action> {
        let router = &worker.router;
        let planned = {
            let started = &mut self.started_ns;
            let quarantined = worker.quarantine.active(|| started_clock(started));
            let eligible = |b: usize| {
                quarantined
                    .as_ref()
                    .is_none_or(|(q, now)| !q.is_quarantined(b, *now))
            };
            let mut rng = worker.rng.borrow_mut();
            let inputs = RequestInputs {
                headers: &self.headers,
                eligible: &eligible,
                random: &mut || rng.next_u64(),
            };
            plan_request(router, checked, body_len, inputs).map_err(|refusal| {
                // Refused while backends it could use are quarantined: say when one is back.
                let retry_after = quarantined.as_ref().and_then(|(q, now)| {
                    retry_after_quarantine(router, &checked.model, &self.headers, q, *now)
                });
                (refusal, retry_after)
            })
        };
        planned.map_err(|(refusal, retry_after)| {
            self.fail_retry(&refusal.error, refusal.outcome, retry_after)
        })
    }

    /// Sends an admitted, planned request on: its decision stamps written, then held for the
    /// shared ledger's answer, or its pod picked, then held for budget room on worker leases
    /// or passed with its shadow copies.
    fn dispatch(
        &mut self,
        worker: &Worker,
        forward: &Forward<'_>,
        pick: Option<crate::pick::Pending>,
    ) -> Action {
        for (name, value) in &forward.stamps {
            if let Err(e) = edge::set_header(Map::RequestHeaders, name, value) {
                return self.internal(&format!("setting {name}: {e}"));
            }
        }
        if self.budget.as_ref().is_some_and(budget::Metered::awaiting) {
            // The shared ledger's answer picks and resumes it (`on_http_call_response`).
            self.pending_pick = pick;
            return Action::Pause;
        }
        mark!("route: stamps written");
        let now = match pick {
            Some(_) => started_clock(&mut self.started_ns),
            None => 0,
        };
        let action = self.pick_pod(worker, pick, now);
        if action == Action::Continue {
            if self
                .budget
                .as_ref()
                .is_some_and(budget::Metered::held_for_room)
            {
                // Worker leases: the root resumes it once other workers give the room back,
                // or answers it (`budget::Budgets::wake`). It has no shadow copies to send.
                return Action::Pause;
            }
            self.send_shadow(worker);
        }
        mark!("route: picked, shadow sent");
        action
    }

    /// The request's shadow copies, from the client's request as it arrived (before the budget
    /// step may edit the body). A body that arrived in pieces is read back whole only here,
    /// for a request that has copies to send.
    fn prepare_shadow(
        &mut self,
        worker: &Worker,
        decision: &router_core::router::Decision,
        model_span: Option<router_core::scan::Span>,
        body: Option<&[u8]>,
        body_len: usize,
    ) {
        let Some(shadow) = &worker.shadow else {
            return;
        };
        if !shadow.wants(&worker.router, decision) {
            return;
        }
        let read;
        let body = match body {
            Some(b) => b,
            None => match edge::buffer(Buffer::RequestBody, 0, body_len) {
                Ok(b) => {
                    read = b.unwrap_or_default();
                    &read
                }
                Err(e) => {
                    edge::log(
                        Level::Warn,
                        &format!("model-router: shadow: reading the body: {e}"),
                    );
                    return;
                }
            },
        };
        let method = String::from_utf8_lossy(self.line.method());
        let path = String::from_utf8_lossy(self.line.path());
        let original = router_core::shadow::Original {
            method: &method,
            path: &path,
            content_type: self.content_type.as_deref(),
            request_id: self.audit.request_id.as_deref(),
            body,
            model_span,
        };
        self.shadow = shadow.prepare(&worker.router, decision, &original);
    }

    /// The request goes upstream: its prepared copies go too.
    fn send_shadow(&mut self, worker: &Worker) {
        if let Some(shadow) = &worker.shadow {
            let prepared = std::mem::take(&mut self.shadow);
            shadow.send(&worker.router, prepared, &mut self.audit);
        }
    }

    /// A body over the gateway's replay limit gets one attempt (`router_core::replay`): counted
    /// and audited, so the trade the router was compiled with shows per request.
    fn note_failover_skipped(&mut self, worker: &Worker, order_len: usize, body_len: usize) {
        let limit = worker.router.config.failover_replay_limit;
        if router_core::replay::failover_skipped(limit, order_len, body_len as u64) {
            self.audit.failover_skipped = true;
            worker.metrics.failover_skipped();
        }
    }

    /// The pick, once the request is admitted: charge a pod and name it for Envoy.
    fn pick_pod(
        &mut self,
        worker: &Worker,
        pick: Option<crate::pick::Pending>,
        now: u64,
    ) -> Action {
        let Some(pending) = pick else {
            return Action::Continue;
        };
        match worker.pick.commit(pending, now, &mut self.pick) {
            Ok(Some(addr)) => {
                if let Err(e) =
                    edge::set_header(Map::RequestHeaders, DESTINATION_ENDPOINT_HEADER, &addr)
                {
                    return self.internal(&format!("setting {DESTINATION_ENDPOINT_HEADER}: {e}"));
                }
                Action::Continue
            }
            Ok(None) => Action::Continue,
            Err(err) => self.fail(&err, Outcome::AllBackendsFailed),
        }
    }

    /// The budget step, once routing has decided: reserve on the request's budgets or answer
    /// (429/503) before anything goes upstream; carry out its body edit. `None`: go on.
    /// Admission reads what it needs from the scan (`fields`), so a body that arrived in pieces
    /// (`body` is `None`) is not read back; an edit replaces only the body's head.
    fn budget_step(
        &mut self,
        worker: &Worker,
        forward: &mut Forward,
        body: Option<&[u8]>,
        body_len: usize,
        fields: Option<&Fields>,
    ) -> Option<Action> {
        let (Some(budgets), Some(fields)) = (&worker.budgets, fields) else {
            return None;
        };
        let view = RequestView {
            rule: forward.rule_name(),
            headers: &self.headers,
            body,
            body_len,
            fields,
            order: &forward.decision.order,
            path: self.line.path(),
            context_id: self.context_id,
            may_wait: self.shadow.is_empty(),
            shape: self.shape,
        };
        let admitted = match budgets.admit(&view, &mut self.audit) {
            Ok(Some(a)) => a,
            Ok(None) => return None,
            Err(answer) => return Some(self.answer_budget(&answer)),
        };
        self.budget = Some(admitted.metered);
        let splice = admitted.splice?;
        if let Err(e) = crate::usage::send(forward, body_len, &splice) {
            return Some(self.internal(&e));
        }
        self.meter = crate::usage::Meter::new(body_len, splice.asked);
        None
    }

    /// A stream no budget covers asks for usage all the same (`crate::usage::asking`); its
    /// usage-only chunk is then stripped. A head that cannot be read leaves the body as sent.
    fn ask_usage(
        &mut self,
        forward: &mut Forward,
        edits: Option<router_core::budget::inject::Edits>,
        body: Option<&[u8]>,
        body_len: usize,
    ) -> Option<Action> {
        let splice = match crate::usage::splice_of(&edits?, body) {
            Ok(s) => s?,
            Err(e) => {
                edge::log(Level::Warn, &format!("model-router: usage: {e}"));
                return None;
            }
        };
        if let Err(e) = crate::usage::send(forward, body_len, &splice) {
            return Some(self.internal(&e));
        }
        self.meter = crate::usage::Meter::new(body_len, splice.asked);
        None
    }

    /// A budget refusal: 429 with `Retry-After`, or 503 when the ledgers cannot be reached.
    fn answer_budget(&mut self, answer: &budget::Answer) -> Action {
        let (err, headers, outcome) = answer.parts();
        self.settle(outcome);
        let body = err.body_in(self.shape, self.audit.request_id.as_deref());
        let extra: Vec<(&'static str, &str)> =
            headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        self.reply(err.status, &body, err.code, &extra)
    }

    /// The root answered this request while its budgets held it for room: that answer is ours
    /// (the request id goes on it, the audit line records it).
    fn answered_while_held(&mut self) {
        let Some((status, outcome)) = self
            .budget
            .as_ref()
            .and_then(budget::Metered::answered_while_held)
        else {
            return;
        };
        if !matches!(self.phase, Phase::Answered) {
            self.stamp_id();
            self.phase = Phase::Answered;
        }
        self.audit.status = status;
        self.settle(outcome);
    }

    /// A request whose last attempt failed in a way that leaves its backends ejected by Envoy:
    /// seconds until the first of them is back (`None` for other failures, which a retry may
    /// get past at once).
    fn ejected_retry_after(&self, worker: &Worker, status: u32, now: u64) -> Option<u64> {
        let Phase::Forwarded(routed) = &self.phase else {
            return None;
        };
        let details = edge::property(&["response", "code_details"]).ok().flatten();
        if !left_ejected(status, details.as_deref()) {
            return None;
        }
        let mut ejections = worker.ejections.borrow_mut();
        if details.as_deref() == Some(b"via_upstream".as_slice()) {
            if let Some(b) = self.backend_index {
                ejections.record(b, now);
            }
        }
        let duration_ns = worker.router.config.quarantine_ms.saturating_mul(1_000_000);
        ejections.retry_after(&routed.order, now, duration_ns)
    }

    /// A response that started and then never finished because the stream idle timeout cut it
    /// quarantines the backend that went silent (the ModelRouter spec's "wedged replica").
    /// Envoy's outlier detection never hears of that cut, so the filter keeps the backend out of
    /// its orders.
    fn quarantine_if_went_silent(&self) {
        let (Some(worker), Phase::Forwarded(routed)) = (&self.worker, &self.phase) else {
            return;
        };
        if routed.served.is_none() || routed.complete {
            // Nothing to ask the host about.
            return;
        }
        let details = edge::property(&["response", "code_details"]).ok().flatten();
        if let Some(backend) = went_silent(routed.served, routed.complete, details.as_deref()) {
            worker.quarantine.quarantine(
                backend,
                edge::now_nanos(),
                "its stream went silent past streamIdleTimeout",
            );
        }
    }

    /// A piece of a body that is still arriving: scanned now, so that by the time the last
    /// piece is here most of the work is done (and a broken body is refused early).
    fn scan_piece(&mut self, size: usize) -> Action {
        let Phase::ReadingBody(pieces) = &mut self.phase else {
            return Action::Continue;
        };
        let read = read_piece(pieces.get_or_insert_with(BodyWindow::scan), size, false);
        match read {
            Ok(_) => Action::Pause,
            Err(PieceError::Scan(e)) => self.refuse(Refusal::scan(&e)),
            Err(PieceError::Host(e)) => self.internal(&e),
        }
    }

    /// The body is complete (`size` bytes, or all that is buffered for `usize::MAX`).
    fn finish_body(&mut self, size: usize) -> Action {
        let Some(worker) = self.worker.clone() else {
            return self.internal("filter is not configured");
        };
        let pieces = match std::mem::replace(&mut self.phase, Phase::Passing) {
            Phase::ReadingBody(pieces) => pieces,
            other => {
                self.phase = other;
                return Action::Continue;
            }
        };
        let (scanned, whole, len) = match pieces {
            // Arrived in pieces: finish the scan in progress.
            Some(mut pieces) => {
                let size = if size == usize::MAX {
                    pieces.seen()
                } else {
                    size
                };
                let scanned = match read_piece(&mut pieces, size, true) {
                    Ok(fields) => fields.ok_or(ScanError::MissingModel),
                    Err(PieceError::Scan(e)) => Err(e),
                    Err(PieceError::Host(e)) => return self.internal(&e),
                };
                (scanned, None, pieces.seen())
            }
            None => {
                let body = match edge::buffer(Buffer::RequestBody, 0, size) {
                    Ok(b) => b.unwrap_or_default(),
                    Err(e) => return self.internal(&format!("reading the request body: {e}")),
                };
                let scanned = worker.scanner.borrow_mut().scan(&body);
                mark!("body: scanned");
                let len = body.len();
                (scanned, Some(body), len)
            }
        };
        if len == 0 {
            return self.refuse(Refusal::invalid(ApiError::empty_body()));
        }
        // The audit policy may want the body in its record; one that arrived in pieces is read
        // back whole. (Budgets need only what the scan read, never the body again.)
        let body = if whole.is_none() && worker.router.config.audit.include_request_body {
            edge::buffer(Buffer::RequestBody, 0, len).ok().flatten()
        } else {
            whole
        };
        self.route(&worker, scanned, len, body.as_deref())
    }
}

impl Context for Request {
    /// The shared ledger answered this request's reservation: go upstream, or answer instead.
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(worker) = self.worker.clone() else {
            return;
        };
        let (Some(budgets), Some(m)) = (&worker.budgets, self.budget.as_mut()) else {
            return;
        };
        if budgets.settle_answered(m, token, num_headers, body_size) {
            // The last response bytes waited for the settle: the hold is gone, send them.
            if let Err(e) = edge::resume(edge::Stream::Response) {
                edge::log(
                    Level::Error,
                    &format!("model-router: budgets: resuming the response: {e}"),
                );
            }
            return;
        }
        match budgets.answered(m, token, num_headers, body_size, &mut self.audit) {
            None => {}
            Some(Ok(())) => {
                let pick = self.pending_pick.take();
                if self.pick_pod(&worker, pick, edge::now_nanos()) != Action::Continue {
                    return;
                }
                self.send_shadow(&worker);
                if let Err(e) = edge::resume(edge::Stream::Request) {
                    edge::log(
                        Level::Error,
                        &format!("model-router: budgets: resuming the request: {e}"),
                    );
                }
            }
            Some(Err(answer)) => {
                self.answer_budget(&answer);
            }
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(worker) = self.worker.clone() else {
            return self.internal("filter is not configured");
        };
        // The start is read here only for the audit line's latency; routing reads it when it
        // needs a time (`started_clock`), and most requests need none.
        if worker.audit_logged.get() {
            self.started_ns = edge::now_nanos();
        }
        let length = match self.read_headers(&worker) {
            Ok(v) => v,
            Err(e) => return self.internal(&e),
        };
        let (method, path) = (self.line.method(), self.line.path());
        self.shape = ErrorShape::for_path(path);
        let head = plan_head(&worker.router.config, method, path, length, end_of_stream);
        mark!("headers: planned");
        match head {
            HeadPlan::Models => {
                self.audited = true;
                self.settle(Outcome::Ok);
                self.reply(200, worker.router.models_body(), "llmkube_models", &[])
            }
            HeadPlan::Model(id) => {
                self.audited = true;
                let listed = id.as_deref().and_then(|id| worker.router.model_body(id));
                match listed {
                    Some(body) => {
                        self.settle(Outcome::Ok);
                        self.reply(200, body, "llmkube_models", &[])
                    }
                    None => {
                        let err = ApiError::model_not_listed(id.as_deref().unwrap_or_default());
                        self.fail(&err, Outcome::NoRoute)
                    }
                }
            }
            HeadPlan::Pass => Action::Continue,
            HeadPlan::Refuse(refusal) => {
                self.audited = true;
                self.refuse(refusal)
            }
            HeadPlan::ReadBody => {
                self.audited = true;
                self.phase = Phase::ReadingBody(None);
                Action::Pause
            }
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match self.phase {
            Phase::Answered => return Action::Pause,
            Phase::ReadingBody(_) => {}
            Phase::Passing | Phase::Forwarded(_) => return Action::Continue,
        }
        let Some(worker) = self.worker.clone() else {
            return self.internal("filter is not configured");
        };
        if let Err(refusal) = check_body_size(&worker.router.config, body_size as u64) {
            return self.refuse(refusal);
        }
        if !end_of_stream {
            // Envoy keeps buffering; the decision waits for the whole body.
            return self.scan_piece(body_size);
        }
        mark!("body: size checked");
        self.finish_body(body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        match self.phase {
            Phase::Answered => Action::Pause,
            // Trailers end the request: the body buffered so far is all there is.
            Phase::ReadingBody(_) => self.finish_body(usize::MAX),
            Phase::Passing | Phase::Forwarded(_) => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.answered_while_held();
        // Our own answers carry it already.
        if !matches!(self.phase, Phase::Answered) {
            self.stamp_id();
        }
        let (Some(worker), Phase::Forwarded(routed)) = (self.worker.clone(), &self.phase) else {
            return Action::Continue;
        };
        let judge = routed.judge;
        // Two property reads cost more than the rest of the response path; skip them when they
        // cannot tell anything new.
        let ask_endpoint = judge.ask_endpoint();
        let head = match edge::header_map(Map::ResponseHeaders) {
            Ok(pairs) => ResponseHead::read_iter(pairs.iter()),
            Err(_) => ResponseHead::unreadable(),
        };
        mark!("response headers: map read");
        self.audit.attempts = head.attempts;
        // Internal detail: the client needs none of it. (No hostcall when it isn't there.)
        if head.attempt_count_sent {
            let _ = edge::remove_header(Map::ResponseHeaders, ATTEMPT_COUNT_HEADER);
        }
        // Which backend actually answered, from the endpoint's metadata (absent when Envoy
        // answered itself, e.g. no healthy upstream).
        let served = |key: &str| {
            let mut path = ENDPOINT_METADATA.to_vec();
            path.push(key);
            edge::property(&path)
                .ok()
                .flatten()
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        if let Some(backend) = ask_endpoint.then(|| served("backend")).flatten() {
            let tier = served("tier");
            let known = tier.as_deref().and_then(Tier::parse);
            self.backend_index = worker.router.backend_index(&backend);
            self.audit.backend = Some(backend);
            if let Some(t) = known {
                self.audit.tier = Some(t.as_str());
            }
            if judge.violation(known) {
                // The route table and the upstream guard should make this impossible. If it
                // happens anyway, say so as loudly as the gateway can.
                self.audit.violation = true;
                worker.metrics.violation();
                edge::log(
                    Level::Critical,
                    &format!(
                        "model-router: SENSITIVE DATA VIOLATION: a sensitive request was served by backend {:?} (tier {:?})",
                        self.audit.backend, tier
                    ),
                );
            }
        }
        self.audit.status = head.status;
        if let Some(held) = &mut self.pick {
            held.response(head.status, head.attempts, end_of_stream);
        }
        let verdict = judge.verdict(head.status, head.streaming);
        if let Some(err) = verdict.replace {
            let retry_after = self.ejected_retry_after(&worker, head.status, edge::now_nanos());
            return self.fail_retry(&err, verdict.outcome, retry_after);
        }
        if let Phase::Forwarded(routed) = &mut self.phase {
            routed.served = self.backend_index;
            routed.complete = end_of_stream;
        }
        mark!("response headers: endpoint, verdict");
        self.settle(verdict.outcome);
        mark!("response headers: settled (counter)");
        self.meter.start(head.status, head.streaming);
        mark!("response headers: usage reader started");
        if let (Some(budgets), Some(m)) = (&worker.budgets, self.budget.as_mut()) {
            budgets.on_response_headers(m, head.status, self.backend_index);
            if end_of_stream && budgets.on_response_end(m, &mut self.meter, &mut self.audit) {
                return Action::Pause;
            }
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(held) = &mut self.pick {
            held.body(body_size, end_of_stream);
        }
        if let (true, Phase::Forwarded(routed)) = (end_of_stream, &mut self.phase) {
            routed.complete = true;
        }
        if !self.meter.feed(body_size, end_of_stream) {
            return Action::Continue;
        }
        if let (Some(worker), Some(m)) = (&self.worker, self.budget.as_mut()) {
            if let Some(budgets) = &worker.budgets {
                if budgets.on_response_end(m, &mut self.meter, &mut self.audit) {
                    // Until the shared ledger has the settle (`settle_answered` resumes).
                    return Action::Pause;
                }
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.answered_while_held();
        if let (Some(worker), Some(held)) = (&self.worker, self.pick.take()) {
            worker.pick.release(held, edge::now_nanos());
        }
        if !self.audited {
            return;
        }
        self.quarantine_if_went_silent();
        // Holds of a request that did not settle: released, or charged the estimate of what
        // streamed.
        if let (Some(worker), Some(m)) = (&self.worker, self.budget.as_mut()) {
            if let Some(budgets) = &worker.budgets {
                budgets.end(m, &mut self.meter, &mut self.audit);
            }
        }
        mark!("log: budgets ended");
        if let Some(worker) = &self.worker {
            let backend = self.backend_index;
            crate::usage::publish(&mut self.meter, &worker.usage, backend, &mut self.audit);
        }
        mark!("log: usage published");
        self.settle(Outcome::Cancelled);
        // The audit line goes to the gateway's log at info; if the operator set the wasm log
        // above that, Envoy would drop it, so don't spend the serialisation.
        if !self.worker.as_ref().is_some_and(|w| w.audit_logged.get()) {
            return;
        }
        if let Some(worker) = &self.worker {
            self.audit.router.clone_from(&worker.router.config.router);
        }
        let now = edge::now_nanos();
        // Not read at the start when the line was off then (the level changed since): from the
        // first time routing read, or 0.
        let started = if self.started_ns == 0 {
            now
        } else {
            self.started_ns
        };
        self.audit.latency_ms = now.saturating_sub(started) as f64 / 1e6;
        edge::log(Level::Info, &self.audit.line());
    }
}
