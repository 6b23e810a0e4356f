//! One HTTP request through the model-router filter.

use crate::Shared;
use filter_edge::{self as edge, Buffer, Level, Map};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use router_core::config::{BACKEND_HEADER, ROUTE_HEADER, RULE_HEADER, SENSITIVE_HEADER};
use router_core::errors::ApiError;
use router_core::router::RequestHeaders;
use std::rc::Rc;

/// Longest `model` we put into a header; longer ones are refused rather than forwarded.
const MAX_MODEL_BYTES: usize = 256;

pub(crate) struct Request {
    shared: Option<Rc<Shared>>,
    /// Set while this request's body is being buffered for a routing decision.
    routing: bool,
    /// A local response was sent: ignore any later callbacks for this stream.
    answered: bool,
    headers: RequestHeaders,
}

impl Request {
    pub fn new(shared: Option<Rc<Shared>>) -> Self {
        Request {
            shared,
            routing: false,
            answered: false,
            headers: RequestHeaders::new(),
        }
    }

    fn fail(&mut self, err: &ApiError) -> Action {
        self.respond(err.status, &err.body(), err.code)
    }

    fn respond(&mut self, status: u32, body: &[u8], details: &str) -> Action {
        self.answered = true;
        self.routing = false;
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
        self.fail(&ApiError::internal(what))
    }

    fn route(&mut self, shared: &Shared, body: &[u8]) -> Action {
        let mut scanner = shared.scanner.borrow_mut();
        let fields = match scanner.scan(body) {
            Ok(f) => f,
            Err(e) => {
                drop(scanner);
                return self.fail(&ApiError::from_scan(&e));
            }
        };
        let model = fields.model.as_ref();
        if model.len() > MAX_MODEL_BYTES || model.bytes().any(|b| b < 0x20 || b == 0x7f) {
            let err = ApiError::invalid_model(MAX_MODEL_BYTES);
            drop(scanner);
            return self.fail(&err);
        }
        let router = &shared.router;
        let mut rng = shared.rng.borrow_mut();
        let decision = match router.decide(model, &self.headers, &mut || rng.next_u64()) {
            Ok(d) => d,
            Err(e) => {
                drop(scanner);
                return self.fail(&e);
            }
        };
        drop(rng);
        let backend = &router.backend(decision.backend()).name;
        let route_key = router.route_key(&decision);
        let mut stamp = vec![
            (router.config.model_header.as_str(), model),
            (BACKEND_HEADER, backend.as_str()),
            (ROUTE_HEADER, route_key.as_str()),
        ];
        if let Some(ri) = decision.rule {
            stamp.push((RULE_HEADER, router.rule(ri).name.as_str()));
        }
        if decision.sensitive {
            stamp.push((SENSITIVE_HEADER, "true"));
        }
        for (name, value) in stamp {
            if let Err(e) = edge::set_header(Map::RequestHeaders, name, value) {
                drop(scanner);
                return self.internal(&format!("setting {name}: {e}"));
            }
        }
        Action::Continue
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(shared) = self.shared.clone() else {
            return self.internal("filter is not configured");
        };
        // Decision headers are ours alone: drop whatever the client sent, on every request,
        // before anything reads them.
        for name in &shared.stamped {
            if let Err(e) = edge::remove_header(Map::RequestHeaders, name) {
                return self.internal(&format!("removing {name}: {e}"));
            }
        }
        let pairs = match edge::header_pairs(Map::RequestHeaders) {
            Ok(p) => p,
            Err(e) => return self.internal(&format!("reading request headers: {e}")),
        };
        let router = &shared.router;
        let needed = router.needed_headers();
        let (mut method, mut path, mut content_length) = (None, None, None);
        self.headers.clear();
        for (name, value) in pairs {
            match name.as_slice() {
                b":method" => method = Some(value),
                b":path" => path = Some(value),
                b"content-length" => content_length = Some(value),
                _ => {
                    // Header names arrive lower-cased from Envoy; compare lower-cased anyway.
                    let lower = String::from_utf8_lossy(&name).to_ascii_lowercase();
                    if needed.iter().any(|n| *n == lower) {
                        self.headers
                            .push(lower, String::from_utf8_lossy(&value).into_owned());
                    }
                }
            }
        }
        let path = path.unwrap_or_default();
        let path = match path.iter().position(|&b| b == b'?') {
            Some(q) => &path[..q],
            None => &path[..],
        };
        let method = method.unwrap_or_default();
        let config = &router.config;

        if method == b"GET" && path == config.models_path.as_bytes() {
            return self.respond(200, router.models_body(), "llmkube_models");
        }
        if method != b"POST" || !config.inference_paths.iter().any(|p| p.as_bytes() == path) {
            // Not ours to route: with the decision headers gone, the route table cannot send it
            // to a backend.
            return Action::Continue;
        }
        if end_of_stream {
            return self.fail(&ApiError::empty_body());
        }
        if let Some(len) = content_length
            .as_deref()
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            if len > config.max_body_bytes {
                return self.fail(&ApiError::body_too_large(config.max_body_bytes));
            }
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
        let Some(shared) = self.shared.clone() else {
            return self.internal("filter is not configured");
        };
        let limit = shared.router.config.max_body_bytes;
        if body_size as u64 > limit {
            return self.fail(&ApiError::body_too_large(limit));
        }
        if !end_of_stream {
            // Keep buffering until the whole body is here.
            return Action::Pause;
        }
        self.routing = false;
        let body = match edge::buffer(Buffer::RequestBody, 0, body_size) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => return self.internal(&format!("reading the request body: {e}")),
        };
        if body.is_empty() {
            return self.fail(&ApiError::empty_body());
        }
        self.route(&shared, &body)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        if self.answered {
            return Action::Pause;
        }
        if self.routing {
            // Trailers end the request: the body we buffered is all there is.
            let Some(shared) = self.shared.clone() else {
                return self.internal("filter is not configured");
            };
            self.routing = false;
            let body = match edge::buffer(Buffer::RequestBody, 0, usize::MAX) {
                Ok(Some(b)) => b,
                Ok(None) => Vec::new(),
                Err(e) => return self.internal(&format!("reading the request body: {e}")),
            };
            if body.is_empty() {
                return self.fail(&ApiError::empty_body());
            }
            return self.route(&shared, &body);
        }
        Action::Continue
    }
}
