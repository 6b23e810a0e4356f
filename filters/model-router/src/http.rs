//! One HTTP request through the model-router filter: decide on the request path, check and
//! account on the response path, write the audit line at the end.

use crate::Shared;
use filter_edge::{self as edge, Buffer, Level, Map};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use router_core::audit::{caller_label, client_address, AuditRecord, Outcome};
use router_core::config::Tier;
use router_core::errors::ApiError;
use router_core::headers::{
    BACKEND_HEADER, MODEL_SPAN_HEADER, ROUTE_HEADER, RULE_HEADER, SENSITIVE_HEADER,
};
use router_core::rewrite::format_span;
use router_core::router::RequestHeaders;
use router_core::scan::{Fields, ScanError, Scanner};
use std::rc::Rc;

/// Longest `model` we put into a header; longer ones are refused rather than forwarded.
const MAX_MODEL_BYTES: usize = 256;
const ENDPOINT_METADATA: &[&str] = &[
    "xds",
    "upstream_host_metadata",
    "filter_metadata",
    "llmkube",
];
const ATTEMPT_COUNT_HEADER: &str = "x-envoy-attempt-count";
/// Envoy's response code details when the route/HCM idle timeout ends a stream.
const STREAM_IDLE_DETAILS: &[u8] = b"stream_idle_timeout";

pub(crate) struct Request {
    shared: Option<Rc<Shared>>,
    /// Set while this request's body is being buffered for a routing decision.
    routing: bool,
    /// We answered locally: later callbacks for this stream only see our own reply.
    answered: bool,
    headers: RequestHeaders,
    started_ns: u64,
    /// What the routing decision needs to be judged on the response path.
    routed: Option<Routed>,
    audit: AuditRecord,
    /// Whether this request is one we audit (inference and models requests).
    audited: bool,
    /// Rule and backend (the chosen one, then the one that answered) the counters are kept by.
    rule_index: Option<usize>,
    backend_index: Option<usize>,
    /// A body arriving in pieces: its scan so far, the bytes it may read again (from
    /// `window_base` on), and how many bytes have been read. A body that arrives whole uses the
    /// worker's shared scanner and none of these.
    scanner: Option<Box<Scanner>>,
    window: Vec<u8>,
    window_base: usize,
    seen: usize,
}

/// `:method`, `:path` and `content-length` of a request.
type RequestLine = (Vec<u8>, Vec<u8>, Option<u64>);

struct Routed {
    fail_closed: bool,
    sensitive: bool,
    /// The order has other backends Envoy may fail over to, so the one that answered must be
    /// asked of the endpoint (for a single-backend order it can only be that backend).
    alternatives: bool,
    /// The backend whose response headers came through (status below 500).
    served: Option<usize>,
    /// Its response reached end of stream.
    complete: bool,
}

/// The answer when the last attempt failed: 503 `fail_closed` for a fail-closed rule or a
/// sensitive request, else 502 `all_backends_failed`.
fn unavailable(fail_closed: bool, sensitive: bool, status: u32) -> (ApiError, Outcome) {
    if fail_closed || sensitive {
        let err = ApiError::fail_closed(format!(
            "no eligible backend could serve this request (last status {status}); the rule is fail-closed"
        ));
        (err, Outcome::FailClosedRuntime)
    } else {
        (
            ApiError::all_backends_failed(status),
            Outcome::AllBackendsFailed,
        )
    }
}

impl Request {
    pub fn new(shared: Option<Rc<Shared>>) -> Self {
        Request {
            shared,
            routing: false,
            answered: false,
            headers: RequestHeaders::new(),
            started_ns: 0,
            routed: None,
            // `router` is filled in when the line is written: most requests never write one.
            audit: AuditRecord::default(),
            audited: false,
            rule_index: None,
            backend_index: None,
            scanner: None,
            window: Vec::new(),
            window_base: 0,
            seen: 0,
        }
    }

    fn fail(&mut self, err: &ApiError, outcome: Outcome) -> Action {
        self.settle(outcome);
        self.respond(err.status, &err.body(), err.code)
    }

    /// Records how the request ended: the audit outcome and its counter, once.
    fn settle(&mut self, outcome: Outcome) {
        if self.audit.outcome.is_some() {
            return;
        }
        self.audit.outcome = Some(outcome);
        if let Some(shared) = &self.shared {
            shared
                .metrics
                .count(self.rule_index, self.backend_index, outcome);
        }
    }

    fn respond(&mut self, status: u32, body: &[u8], details: &str) -> Action {
        self.answered = true;
        self.routing = false;
        self.audit.status = status;
        let headers = [("content-type", "application/json")];
        if let Err(e) = edge::respond(status, &headers, body, details) {
            edge::log(
                Level::Error,
                &format!("model-router: local response failed: {e}"),
            );
        }
        Action::Pause
    }

    fn internal(&mut self, what: &str) -> Action {
        edge::log(Level::Error, &format!("model-router: {what}"));
        self.fail(&ApiError::internal(what), Outcome::InvalidRequest)
    }

    /// Reads the request headers once: routing inputs, audit inputs, method, path, length.
    ///
    /// Decision headers are ours alone: whatever the client sent under those names is removed
    /// here, on every request, before anything reads headers. Reading the map once and removing
    /// only names that are present keeps this to one hostcall for a request that sends none.
    fn read_headers(&mut self, shared: &Shared) -> Result<RequestLine, String> {
        let mut pairs = edge::header_pairs(Map::RequestHeaders)
            .map_err(|e| format!("reading request headers: {e}"))?;
        edge::remove_present(
            Map::RequestHeaders,
            &mut pairs,
            shared.stamped.iter().map(String::as_str),
        )
        .map_err(|e| format!("removing decision headers: {e}"))?;
        let router = &shared.router;
        let needed = router.needed_headers();
        let audit_cfg = &router.config.audit;
        let (mut method, mut path, mut length) = (Vec::new(), Vec::new(), None);
        let mut xff: Vec<String> = Vec::new();
        self.headers.clear();
        for (name, value) in pairs {
            match name.as_slice() {
                b":method" => method = value,
                b":path" => path = value,
                b"content-length" => {
                    length = std::str::from_utf8(&value)
                        .ok()
                        .and_then(|v| v.trim().parse().ok())
                }
                b"x-request-id" => {
                    self.audit.request_id = Some(caller_label(&value));
                }
                b"x-forwarded-for" if audit_cfg.log_client_address => {
                    xff.push(String::from_utf8_lossy(&value).into_owned());
                }
                _ => {
                    // Envoy hands names over lower-cased; compare case-blind anyway, without
                    // allocating for the many headers routing never looks at.
                    let is = |want: &str| name.eq_ignore_ascii_case(want.as_bytes());
                    if self.audit.caller.is_none()
                        && audit_cfg.caller_header.as_deref().is_some_and(is)
                    {
                        self.audit.caller = Some(caller_label(&value));
                    }
                    if let Some(lower) = needed.iter().find(|n| is(n)) {
                        self.headers
                            .push(lower.clone(), String::from_utf8_lossy(&value).into_owned());
                    }
                }
            }
        }
        if audit_cfg.log_client_address {
            let peer = edge::property(&["source", "address"])
                .ok()
                .flatten()
                .map(|p| String::from_utf8_lossy(&p).into_owned())
                .unwrap_or_default();
            let hops: Vec<&str> = xff.iter().map(String::as_str).collect();
            self.audit.client = Some(client_address(&peer, &hops, &shared.trusted_proxies));
        }
        let cfg = &router.config;
        let first = |name: &str| self.headers.first(name).map(|v| v.to_string());
        self.audit.classification = first(&cfg.classification_header.to_ascii_lowercase());
        self.audit.task_complexity = first(&cfg.complexity_header.to_ascii_lowercase());
        Ok((method, path, length))
    }

    /// Routes on the scanned body (`body_len` bytes; the body itself only when the audit
    /// policy wants it in the record).
    fn route(
        &mut self,
        shared: &Shared,
        scanned: Result<Fields, ScanError>,
        body_len: usize,
        audit_body: Option<&[u8]>,
    ) -> Action {
        let scanned = scanned.map(|f| (f.model, f.spans.model));
        let (model, model_span) = match scanned {
            Ok(m) => m,
            Err(e) => return self.fail(&ApiError::from_scan(&e), Outcome::InvalidRequest),
        };
        if model.len() > MAX_MODEL_BYTES || model.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return self.fail(
                &ApiError::invalid_model(MAX_MODEL_BYTES),
                Outcome::InvalidRequest,
            );
        }
        self.audit.model = Some(model.clone());
        if let Some(body) = audit_body {
            self.audit.request_body = Some(String::from_utf8_lossy(body).into_owned());
        }
        let router = &shared.router;
        let decision = {
            let mut rng = shared.rng.borrow_mut();
            match shared.health.table(self.started_ns) {
                Some(q) => router.decide_among(
                    &model,
                    &self.headers,
                    &|b| !q.is_quarantined(b, self.started_ns),
                    &mut || rng.next_u64(),
                ),
                None => router.decide(&model, &self.headers, &mut || rng.next_u64()),
            }
        };
        let decision = match decision {
            Ok(d) => d,
            Err(e) => {
                let outcome = match e.code {
                    "model_not_found" => Outcome::NoRoute,
                    "all_backends_failed" => Outcome::AllBackendsFailed,
                    _ => Outcome::FailClosed,
                };
                return self.fail(&e, outcome);
            }
        };
        let fail_closed = decision.rule.is_some_and(|r| router.rule(r).fail_closed);
        let backend = router.backend(decision.backend());
        self.audit.backend = Some(backend.name.clone());
        self.audit.tier = Some(backend.tier.as_str());
        self.audit.rule = decision.rule.map(|r| router.rule(r).name.clone());
        self.rule_index = decision.rule;
        self.backend_index = Some(decision.backend());
        self.routed = Some(Routed {
            fail_closed,
            sensitive: decision.sensitive,
            alternatives: decision.order.len() > 1,
            served: None,
            complete: false,
        });
        let route_key = router.route_key(&decision);
        let mut stamp = vec![
            (router.config.model_header.as_str(), model.as_str()),
            (BACKEND_HEADER, backend.name.as_str()),
            (ROUTE_HEADER, route_key.as_str()),
        ];
        if let Some(ri) = decision.rule {
            stamp.push((RULE_HEADER, router.rule(ri).name.as_str()));
        }
        if decision.sensitive {
            stamp.push((SENSITIVE_HEADER, "true"));
        }
        // An attempt to an external backend gets its `model` rewritten by the per-attempt filter;
        // tell it where the value is so it need not scan the body again.
        let span_value;
        if let Some(span) = model_span.filter(|_| {
            decision
                .order
                .iter()
                .any(|&b| router.backend(b).external_model.is_some())
        }) {
            span_value = format_span(span, body_len);
            stamp.push((MODEL_SPAN_HEADER, span_value.as_str()));
        }
        for (name, value) in stamp {
            if let Err(e) = edge::set_header(Map::RequestHeaders, name, value) {
                return self.internal(&format!("setting {name}: {e}"));
            }
        }
        Action::Continue
    }

    /// A response that started and then never finished because the stream idle timeout cut it
    /// quarantines the backend that went silent (the seed's "wedged replica"). Envoy's outlier
    /// detection never hears of that cut, so the filter keeps the backend out of its orders.
    fn quarantine_if_went_silent(&self) {
        let (Some(shared), Some(routed)) = (&self.shared, &self.routed) else {
            return;
        };
        let Some(backend) = routed.served.filter(|_| !routed.complete) else {
            return;
        };
        let cut_idle = edge::property(&["response", "code_details"])
            .ok()
            .flatten()
            .is_some_and(|d| d == STREAM_IDLE_DETAILS);
        if cut_idle {
            shared.health.quarantine(
                backend,
                edge::now_nanos(),
                "its stream went silent past streamIdleTimeout",
            );
        }
    }

    /// A piece of a body that is still arriving: scanned now, so that by the time the last
    /// piece is here most of the work is done (and a broken body is refused early).
    fn scan_piece(&mut self, size: usize) -> Action {
        match self.feed(size, false) {
            Ok(_) => Action::Pause,
            Err(Ok(e)) => self.fail(&ApiError::from_scan(&e), Outcome::InvalidRequest),
            Err(Err(e)) => self.internal(&e),
        }
    }

    /// Reads the body bytes from `seen` up to `size` and scans them. Only the bytes the scan may
    /// read again are kept: usually none, as a cut usually falls inside prompt text, so the
    /// piece Envoy copied in is scanned where it landed and then freed (copying it again would
    /// cost as much as the scan). Errors: the scan's, or a hostcall's.
    fn feed(
        &mut self,
        size: usize,
        complete: bool,
    ) -> Result<Option<Fields>, Result<ScanError, String>> {
        let piece = if size > self.seen {
            match edge::buffer(Buffer::RequestBody, self.seen, size - self.seen) {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => return Err(Err(format!("reading the request body: {e}"))),
            }
        } else {
            Vec::new()
        };
        self.seen += piece.len();
        let window = if self.window.is_empty() {
            self.window_base = self.seen - piece.len();
            piece
        } else {
            let mut w = std::mem::take(&mut self.window);
            w.extend_from_slice(&piece);
            w
        };
        let scanner = self.scanner.get_or_insert_with(|| {
            let mut s = Box::new(Scanner::new());
            s.begin();
            s
        });
        let fields = scanner
            .resume_window(&window, self.window_base, complete)
            .map_err(Ok)?;
        let keep = scanner.needed_from().clamp(self.window_base, self.seen);
        if keep < self.seen && fields.is_none() {
            let mut w = window;
            w.drain(..keep - self.window_base);
            self.window = w;
            self.window_base = keep;
        }
        Ok(fields)
    }

    /// The body is complete (`size` bytes, or all that is buffered for `usize::MAX`).
    fn finish_body(&mut self, size: usize) -> Action {
        let Some(shared) = self.shared.clone() else {
            return self.internal("filter is not configured");
        };
        self.routing = false;
        let (scanned, whole) = if self.scanner.is_some() {
            // Arrived in pieces: finish the scan in progress.
            let size = if size == usize::MAX { self.seen } else { size };
            let scanned = match self.feed(size, true) {
                Ok(fields) => fields.ok_or(ScanError::MissingModel),
                Err(Ok(e)) => Err(e),
                Err(Err(e)) => return self.internal(&e),
            };
            self.scanner = None;
            self.window = Vec::new();
            (scanned, None)
        } else {
            let body = match edge::buffer(Buffer::RequestBody, 0, size) {
                Ok(b) => b.unwrap_or_default(),
                Err(e) => return self.internal(&format!("reading the request body: {e}")),
            };
            self.seen = body.len();
            (shared.scanner.borrow_mut().scan(&body), Some(body))
        };
        if self.seen == 0 {
            return self.fail(&ApiError::empty_body(), Outcome::InvalidRequest);
        }
        // Only the audit policy keeps the body; one that arrived in pieces is read back whole.
        let audit_body = if shared.router.config.audit.include_request_body {
            whole.or_else(|| {
                edge::buffer(Buffer::RequestBody, 0, self.seen)
                    .ok()
                    .flatten()
            })
        } else {
            None
        };
        let len = self.seen;
        self.route(&shared, scanned, len, audit_body.as_deref())
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.started_ns = edge::now_nanos();
        let Some(shared) = self.shared.clone() else {
            return self.internal("filter is not configured");
        };
        let (method, path, length) = match self.read_headers(&shared) {
            Ok(v) => v,
            Err(e) => return self.internal(&e),
        };
        let path = match path.iter().position(|&b| b == b'?') {
            Some(q) => &path[..q],
            None => &path[..],
        };
        let config = &shared.router.config;
        if method == b"GET" && path == config.models_path.as_bytes() {
            self.audited = true;
            self.settle(Outcome::Ok);
            return self.respond(200, shared.router.models_body(), "llmkube_models");
        }
        if method != b"POST" || !config.inference_paths.iter().any(|p| p.as_bytes() == path) {
            // Not ours to route: with the decision headers gone, no route sends it to a backend.
            return Action::Continue;
        }
        self.audited = true;
        if end_of_stream {
            return self.fail(&ApiError::empty_body(), Outcome::InvalidRequest);
        }
        if length.is_some_and(|l| l > config.max_body_bytes) {
            return self.fail(
                &ApiError::body_too_large(config.max_body_bytes),
                Outcome::InvalidRequest,
            );
        }
        self.routing = true;
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.answered {
            return Action::Pause;
        }
        if !self.routing {
            return Action::Continue;
        }
        let limit = self
            .shared
            .as_ref()
            .map_or(0, |s| s.router.config.max_body_bytes);
        if body_size as u64 > limit {
            return self.fail(&ApiError::body_too_large(limit), Outcome::InvalidRequest);
        }
        if !end_of_stream {
            // Envoy keeps buffering; the decision waits for the whole body.
            return self.scan_piece(body_size);
        }
        self.finish_body(body_size)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.answered {
            return Action::Pause;
        }
        if self.routing {
            // Trailers end the request: the body buffered so far is all there is.
            return self.finish_body(usize::MAX);
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.answered {
            return Action::Continue;
        }
        let (Some(shared), Some(routed)) = (self.shared.clone(), self.routed.as_ref()) else {
            return Action::Continue;
        };
        let (fail_closed, sensitive) = (routed.fail_closed, routed.sensitive);
        // Two property reads cost more than the rest of the response path; skip them when they
        // cannot tell anything new. A sensitive request always asks: the tier check below is the
        // alarm for a route table that sent it somewhere it must not go.
        let ask_endpoint = routed.alternatives || sensitive;
        let mut status = 0u32;
        let mut streaming = false;
        // Unless the map says it is absent, the attempt count gets removed below.
        let mut attempt_count_sent = true;
        if let Ok(pairs) = edge::header_pairs(Map::ResponseHeaders) {
            attempt_count_sent = false;
            for (k, v) in &pairs {
                attempt_count_sent |= k.eq_ignore_ascii_case(ATTEMPT_COUNT_HEADER.as_bytes());
                match k.as_slice() {
                    b":status" => {
                        status = std::str::from_utf8(v)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0)
                    }
                    b"content-type" => streaming = v.starts_with(b"text/event-stream"),
                    b"x-envoy-attempt-count" => {
                        self.audit.attempts = std::str::from_utf8(v)
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0)
                    }
                    _ => {}
                }
            }
        }
        // Internal detail: the client needs none of it. (No hostcall when it isn't there.)
        if attempt_count_sent {
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
            self.backend_index = shared.router.backend_index(&backend);
            self.audit.backend = Some(backend);
            if let Some(t) = tier.as_deref().and_then(Tier::parse) {
                self.audit.tier = Some(t.as_str());
            }
            if sensitive && tier.as_deref() != Some("local") {
                // The route table and the upstream guard should make this impossible. If it
                // happens anyway, say so as loudly as the gateway can.
                self.audit.violation = true;
                shared.metrics.violation();
                edge::log(
                    Level::Critical,
                    &format!(
                        "model-router: SENSITIVE DATA VIOLATION: a sensitive request was served by backend {:?} (tier {:?})",
                        self.audit.backend, tier
                    ),
                );
            }
        }
        self.audit.status = status;
        if status >= 500 {
            let (err, outcome) = unavailable(fail_closed, sensitive, status);
            return self.fail(&err, outcome);
        }
        if let Some(routed) = self.routed.as_mut() {
            routed.served = self.backend_index;
            routed.complete = end_of_stream;
        }
        let outcome = match (status, streaming) {
            (200..=299, true) => Outcome::OkStream,
            (200..=299, false) => Outcome::Ok,
            _ => Outcome::UpstreamError,
        };
        self.settle(outcome);
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            if let Some(routed) = self.routed.as_mut() {
                routed.complete = true;
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if !self.audited {
            return;
        }
        self.quarantine_if_went_silent();
        self.settle(Outcome::Cancelled);
        // The audit line goes to the gateway's log at info; if the operator set the wasm log
        // above that, Envoy would drop it, so don't spend the serialisation.
        if !self.shared.as_ref().is_some_and(|s| s.audit_logged.get()) {
            return;
        }
        if let Some(shared) = &self.shared {
            self.audit.router.clone_from(&shared.router.config.router);
        }
        let now = edge::now_nanos();
        self.audit.latency_ms = now.saturating_sub(self.started_ns) as f64 / 1e6;
        edge::log(Level::Info, &self.audit.line());
    }
}
