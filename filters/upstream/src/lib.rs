//! The per-attempt upstream filter. Envoy runs it on the cluster a route sends to, once for every
//! attempt (the first and each failover), after the attempt's endpoint is chosen: the last point
//! where a request can be stopped before bytes leave for a backend.
//!
//! `router_core::attempt::plan_attempt` decides (refuse a sensitive request to a cloud or
//! unidentified endpoint; the attempt-backend mark the per-backend credential injectors select
//! on; provider headers; the `model` rewrite). This filter reads its inputs, clears every provider
//! credential and version header first (Envoy keeps header edits across attempts, so whatever a
//! previous attempt got must not reach this one), carries the plan out, and fixes
//! `content-length` after a rewrite (Envoy does not).

// A filter must not panic (in Envoy a trap fails every later request on the worker, closed).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use filter_edge::{self as edge, Buffer, Level, Map, MetricKind};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use router_core::attempt::{plan_attempt, AttemptInputs, AttemptPlan, Located};
use router_core::errors::ApiError;
use router_core::headers::{MODEL_SPAN_HEADER, SENSITIVE_HEADER};
use router_core::provider::provider_headers;
use router_core::rewrite::rewrite_head;
use router_core::router::Router;
use router_core::scan::Scanner;
use std::cell::RefCell;
use std::rc::Rc;

const BACKEND_PROPERTY: &[&str] = &[
    "xds",
    "upstream_host_metadata",
    "filter_metadata",
    "llmkube",
    "backend",
];

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

/// Per-VM state every attempt on this worker reads.
struct Worker {
    router: Router,
    /// Provider credential and version headers, cleared on every attempt.
    provider_headers: Vec<&'static str>,
    scanner: RefCell<Scanner>,
    blocked_metric: Option<u32>,
    rewrites_metric: Option<u32>,
    /// Rewrites that had to scan the body because the downstream span did not fit it.
    rescans_metric: Option<u32>,
}

#[derive(Default)]
struct Root {
    worker: Option<Rc<Worker>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        match edge::configured_router() {
            Ok(router) => {
                self.worker = Some(Rc::new(Worker {
                    router,
                    provider_headers: provider_headers(),
                    scanner: RefCell::new(Scanner::new()),
                    blocked_metric: edge::define_metric(
                        MetricKind::Counter,
                        "llmkube.upstream.fail_closed_blocked",
                    )
                    .ok(),
                    rewrites_metric: edge::define_metric(
                        MetricKind::Counter,
                        "llmkube.upstream.model_rewrites",
                    )
                    .ok(),
                    rescans_metric: edge::define_metric(
                        MetricKind::Counter,
                        "llmkube.upstream.model_rewrite_rescans",
                    )
                    .ok(),
                }));
                true
            }
            Err(e) => {
                edge::log(
                    Level::Error,
                    &format!("llmkube upstream: invalid configuration: {e}"),
                );
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Attempt {
            worker: self.worker.clone(),
            phase: Phase::Passing,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Where an attempt stands.
enum Phase {
    /// Nothing (more) to do to the request.
    Passing,
    /// The body is buffered for its `model` to become `to`; `located` is where the downstream
    /// filter found it.
    Rewriting {
        to: String,
        located: Option<Located>,
    },
    /// A local response ended the request.
    Answered,
}

struct Attempt {
    worker: Option<Rc<Worker>>,
    phase: Phase,
}

impl Attempt {
    fn refuse(&mut self, err: &ApiError) -> Action {
        self.phase = Phase::Answered;
        edge::respond_json("llmkube upstream", err.status, &err.body(), err.code);
        Action::Pause
    }

    fn internal(&mut self, what: &str) -> Action {
        edge::log(Level::Error, &format!("llmkube upstream: {what}"));
        self.refuse(&ApiError::internal(what))
    }
}

impl Context for Attempt {}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
        let Some(worker) = self.worker.clone() else {
            return self.internal("filter is not configured");
        };
        let router = &worker.router;
        let mut pairs = match edge::header_pairs(Map::RequestHeaders) {
            Ok(pairs) => pairs,
            Err(e) => return self.internal(&format!("reading request headers: {e}")),
        };
        // Envoy keeps header edits across attempts: whatever a previous attempt got must not
        // reach this one.
        if let Err(e) = edge::remove_present(
            Map::RequestHeaders,
            &mut pairs,
            worker.provider_headers.iter().copied(),
        ) {
            return self.internal(&format!("removing credential headers: {e}"));
        }
        let value = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k.as_slice() == name.as_bytes())
                .map(|(_, v)| v.as_slice())
        };
        let sensitive = value(SENSITIVE_HEADER) == Some(b"true".as_slice());
        let located =
            Located::from_headers(value(MODEL_SPAN_HEADER), value(&router.config.model_header));
        if let Some(len) = located
            .as_ref()
            .and_then(|l| l.restore_length(value("content-length")))
        {
            if let Err(e) = edge::set_header(Map::RequestHeaders, "content-length", &len) {
                return self.internal(&format!("restoring content-length: {e}"));
            }
        }
        let endpoint = match edge::property(BACKEND_PROPERTY) {
            Ok(name) => name,
            Err(e) => return self.internal(&format!("reading endpoint metadata: {e}")),
        };
        let inputs = AttemptInputs {
            sensitive,
            endpoint_backend: endpoint.as_deref(),
        };
        let send = match plan_attempt(router, inputs) {
            AttemptPlan::Unidentified => return Action::Continue,
            AttemptPlan::Refuse { error, prevented } => {
                if let Some(name) = prevented {
                    if let Some(m) = worker.blocked_metric {
                        edge::increment_metric(m, 1);
                    }
                    edge::log(
                        Level::Error,
                        &format!(
                            "llmkube upstream: VIOLATION PREVENTED: sensitive request attempted cloud backend {name:?}; refused before sending"
                        ),
                    );
                }
                return self.refuse(&error);
            }
            AttemptPlan::Send(send) => send,
        };
        if let Err(e) =
            edge::remove_present(Map::RequestHeaders, &mut pairs, send.remove.iter().copied())
        {
            return self.internal(&format!("removing routing headers: {e}"));
        }
        for (name, value) in &send.set {
            if let Err(e) = edge::set_header(Map::RequestHeaders, name, value) {
                return self.internal(&format!("setting {name}: {e}"));
            }
        }
        let Some(model) = send
            .rewrite_model
            .filter(|m| !end_of_stream && Located::needs_rewrite(located.as_ref(), m))
        else {
            return Action::Continue;
        };
        self.phase = Phase::Rewriting {
            to: model.to_string(),
            located,
        };
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match &self.phase {
            Phase::Answered => return Action::Pause,
            Phase::Passing => return Action::Continue,
            Phase::Rewriting { .. } if !end_of_stream => return Action::Pause,
            Phase::Rewriting { .. } => {}
        }
        let Phase::Rewriting { to: model, located } =
            std::mem::replace(&mut self.phase, Phase::Passing)
        else {
            return Action::Continue;
        };
        let Some(worker) = self.worker.clone() else {
            return self.internal("filter is not configured");
        };
        if let Some(located) = located.filter(|l| l.fits(body_size)) {
            match self.rewrite_head(&located, &model) {
                Some(Ok(new_len)) => return self.rewritten(&worker, new_len),
                Some(Err(e)) => return self.internal(&e),
                // The span does not point at the routed model any more: scan.
                None => {}
            }
        }
        if let Some(m) = worker.rescans_metric {
            edge::increment_metric(m, 1);
        }
        let body = match edge::buffer(Buffer::RequestBody, 0, body_size) {
            Ok(Some(b)) => b,
            Ok(None) => return Action::Continue,
            Err(e) => return self.internal(&format!("reading the request body: {e}")),
        };
        // The downstream filter validated this body; a failure here means it changed in between.
        let span = match worker.scanner.borrow_mut().scan(&body) {
            Ok(f) => f.spans.model,
            Err(_) => None,
        };
        let Some(span) = span else {
            return self.internal("the request body no longer has a model to rewrite");
        };
        let rewritten = router_core::rewrite::replace_with_string(&body, span, &model);
        if let Err(e) = edge::replace_buffer(Buffer::RequestBody, body.len(), &rewritten) {
            return self.internal(&format!("rewriting the request body: {e}"));
        }
        self.rewritten(&worker, rewritten.len())
    }
}

impl Attempt {
    /// Rewrites `model` from the span the downstream filter stamped, touching only the bytes up
    /// to its end. `None` when the span no longer fits the body (the caller scans instead).
    fn rewrite_head(&self, located: &Located, model: &str) -> Option<Result<usize, String>> {
        let (span, body_size) = (located.span, located.body_len);
        let head = match edge::buffer(Buffer::RequestBody, 0, span.1) {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(e) => return Some(Err(format!("reading the request body: {e}"))),
        };
        let old_len = head.len();
        let new_head = rewrite_head(head, span, &located.model, model)?;
        Some(
            edge::replace_buffer(Buffer::RequestBody, old_len, &new_head)
                .map(|_| body_size - old_len + new_head.len())
                .map_err(|e| format!("rewriting the request body: {e}")),
        )
    }

    /// The body now has `len` bytes: say so in `content-length` (Envoy does not) and count it.
    fn rewritten(&mut self, worker: &Worker, len: usize) -> Action {
        if let Err(e) = edge::set_header(Map::RequestHeaders, "content-length", &len.to_string()) {
            return self.internal(&format!("setting content-length: {e}"));
        }
        if let Some(m) = worker.rewrites_metric {
            edge::increment_metric(m, 1);
        }
        Action::Continue
    }
}
