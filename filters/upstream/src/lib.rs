//! The per-attempt upstream filter. Envoy runs it on the cluster a route sends to, once for every
//! attempt (the first and each failover), after the attempt's endpoint is chosen. It is the last
//! point where a request can be stopped before bytes leave for a backend, so:
//!
//! - it identifies the attempt's backend from the endpoint's metadata (`llmkube.backend`);
//! - it refuses an attempt of a sensitive request to a cloud-tier backend (503 `fail_closed`),
//!   whatever the route table says: defense in depth behind the downstream decision;
//! - it removes credential headers (Envoy keeps header edits across attempts, so whatever a
//!   previous attempt got must not reach this one) and marks the attempt's backend for the
//!   per-backend credential injectors that follow it in the chain;
//! - for an external backend it rewrites the body's `model` to the provider's model name and fixes
//!   `content-length` (Envoy does not), sets provider headers, and removes the router's internal
//!   rule/backend/route headers.

use filter_edge::{self as edge, Buffer, Level, Map, MetricKind};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use router_core::config::Tier;
use router_core::errors::ApiError;
use router_core::headers::{
    ATTEMPT_BACKEND_HEADER, BACKEND_HEADER, MODEL_SPAN_HEADER, ROUTE_HEADER, RULE_HEADER,
    SENSITIVE_HEADER,
};
use router_core::provider::provider_headers;
use router_core::rewrite::{parse_span, rewrite_head};
use router_core::router::Router;
use router_core::scan::Scanner;
use router_core::scan::Span;
use std::cell::RefCell;
use std::rc::Rc;

const BACKEND_PROPERTY: &[&str] = &[
    "xds",
    "upstream_host_metadata",
    "filter_metadata",
    "llmkube",
    "backend",
];
/// Decision headers that name the router's rules, backends and attempt orders; removed from
/// attempts to external providers.
const INTERNAL_ROUTING_HEADERS: &[&str] = &[RULE_HEADER, BACKEND_HEADER, ROUTE_HEADER];

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

struct Shared {
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
    shared: Option<Rc<Shared>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        match edge::plugin_configuration().and_then(|raw| Router::from_json(&raw)) {
            Ok(router) => {
                self.shared = Some(Rc::new(Shared {
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
            shared: self.shared.clone(),
            rewrite_to: None,
            located: None,
            done: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Attempt {
    shared: Option<Rc<Shared>>,
    /// The provider model name, while this attempt's body is buffered for the rewrite.
    rewrite_to: Option<String>,
    /// Where the downstream filter found `model`, and the model it routed on.
    located: Option<(Span, usize, String)>,
    /// A local response ended the request.
    done: bool,
}

impl Attempt {
    fn refuse(&mut self, err: &ApiError) -> Action {
        self.done = true;
        if let Err(e) = edge::respond(
            err.status,
            &[("content-type", "application/json")],
            &err.body(),
            err.code,
        ) {
            edge::log(
                Level::Error,
                &format!("llmkube upstream: local response failed: {e}"),
            );
        }
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
        let Some(shared) = self.shared.clone() else {
            return self.internal("filter is not configured");
        };
        let mut pairs = match edge::header_pairs(Map::RequestHeaders) {
            Ok(pairs) => pairs,
            Err(e) => return self.internal(&format!("reading request headers: {e}")),
        };
        if let Err(e) = edge::remove_present(
            Map::RequestHeaders,
            &mut pairs,
            shared.provider_headers.iter().copied(),
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
        let located = value(MODEL_SPAN_HEADER)
            .and_then(parse_span)
            .and_then(|(span, len)| {
                let model = std::str::from_utf8(value(&shared.router.config.model_header)?).ok()?;
                Some((span, len, model.to_string()))
            });
        if let Some((_, len, _)) = &located {
            // An earlier attempt's rewrite left its length behind; this attempt carries the
            // original body again until (and unless) it rewrites it.
            let len = len.to_string();
            if value("content-length").is_some_and(|v| v != len.as_bytes()) {
                if let Err(e) = edge::set_header(Map::RequestHeaders, "content-length", &len) {
                    return self.internal(&format!("restoring content-length: {e}"));
                }
            }
        }
        let backend = match edge::property(BACKEND_PROPERTY) {
            Ok(Some(name)) => String::from_utf8(name)
                .ok()
                .and_then(|n| shared.router.backend_index(&n)),
            Ok(None) => None,
            Err(e) => return self.internal(&format!("reading endpoint metadata: {e}")),
        };
        let Some(bi) = backend else {
            // An endpoint we cannot identify cannot be shown to be local.
            if sensitive {
                return self.refuse(&ApiError::fail_closed(
                    "request is sensitive and the upstream endpoint carries no llmkube backend metadata".into(),
                ));
            }
            return Action::Continue;
        };
        let b = shared.router.backend(bi);
        if sensitive && b.tier != Tier::Local {
            if let Some(m) = shared.blocked_metric {
                edge::increment_metric(m, 1);
            }
            edge::log(
                Level::Error,
                &format!(
                    "llmkube upstream: VIOLATION PREVENTED: sensitive request attempted cloud backend {:?}; refused before sending",
                    b.name
                ),
            );
            return self.refuse(&ApiError::fail_closed(format!(
                "sensitive request may only be served by local-tier backends; backend {:?} is cloud",
                b.name
            )));
        }
        if let Err(e) = edge::set_header(Map::RequestHeaders, ATTEMPT_BACKEND_HEADER, &b.name) {
            return self.internal(&format!("setting {ATTEMPT_BACKEND_HEADER}: {e}"));
        }
        let Some(model) = b.external_model.clone() else {
            return Action::Continue;
        };
        // Rule, backend and route names are the router's internals: a provider gets none of them.
        // (Envoy keeps header edits across retries: nothing a later attempt needs is removed.)
        if let Err(e) = edge::remove_present(
            Map::RequestHeaders,
            &mut pairs,
            INTERNAL_ROUTING_HEADERS.iter().copied(),
        ) {
            return self.internal(&format!("removing routing headers: {e}"));
        }
        if let Some((name, value)) = b.provider.and_then(|p| p.version_header()) {
            if let Err(e) = edge::set_header(Map::RequestHeaders, name, value) {
                return self.internal(&format!("setting {name}: {e}"));
            }
        }
        if end_of_stream {
            return Action::Continue;
        }
        self.rewrite_to = Some(model);
        self.located = located;
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.done {
            return Action::Pause;
        }
        let Some(model) = self.rewrite_to.clone() else {
            return Action::Continue;
        };
        if !end_of_stream {
            return Action::Pause;
        }
        self.rewrite_to = None;
        let Some(shared) = self.shared.clone() else {
            return self.internal("filter is not configured");
        };
        if let Some((span, _, routed_model)) = self.located.take().filter(|l| l.1 == body_size) {
            match self.rewrite_head(body_size, span, &routed_model, &model) {
                Some(Ok(new_len)) => return self.rewritten(&shared, new_len),
                Some(Err(e)) => return self.internal(&e),
                // The span does not point at the routed model any more: scan.
                None => {}
            }
        }
        if let Some(m) = shared.rescans_metric {
            edge::increment_metric(m, 1);
        }
        let body = match edge::buffer(Buffer::RequestBody, 0, body_size) {
            Ok(Some(b)) => b,
            Ok(None) => return Action::Continue,
            Err(e) => return self.internal(&format!("reading the request body: {e}")),
        };
        // The downstream filter validated this body; a failure here means it changed in between.
        let span = match shared.scanner.borrow_mut().scan(&body) {
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
        self.rewritten(&shared, rewritten.len())
    }
}

impl Attempt {
    /// Rewrites `model` from the span the downstream filter stamped, touching only the bytes up
    /// to its end. `None` when the span no longer fits the body (the caller scans instead).
    fn rewrite_head(
        &self,
        body_size: usize,
        span: Span,
        routed_model: &str,
        model: &str,
    ) -> Option<Result<usize, String>> {
        if span.1 > body_size {
            return None;
        }
        let head = match edge::buffer(Buffer::RequestBody, 0, span.1) {
            Ok(Some(h)) => h,
            Ok(None) => return None,
            Err(e) => return Some(Err(format!("reading the request body: {e}"))),
        };
        let old_len = head.len();
        let new_head = rewrite_head(head, span, routed_model, model)?;
        Some(
            edge::replace_buffer(Buffer::RequestBody, old_len, &new_head)
                .map(|_| body_size - old_len + new_head.len())
                .map_err(|e| format!("rewriting the request body: {e}")),
        )
    }

    /// The body now has `len` bytes: say so in `content-length` (Envoy does not) and count it.
    fn rewritten(&mut self, shared: &Shared, len: usize) -> Action {
        if let Err(e) = edge::set_header(Map::RequestHeaders, "content-length", &len.to_string()) {
            return self.internal(&format!("setting content-length: {e}"));
        }
        if let Some(m) = shared.rewrites_metric {
            edge::increment_metric(m, 1);
        }
        Action::Continue
    }
}
