//! The do-nothing body filter: holds the request headers until the end of the body (as a filter
//! that routes on the body must), reads the whole body into wasm memory once, and lets the request
//! go on unchanged. No headers read or written, no properties, metrics or logs.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn create_http_context(&self, _: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Req { read: 0 }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Req {
    /// Bytes received; kept so the read cannot be optimised away.
    read: usize,
}

impl Context for Req {}

impl HttpContext for Req {
    fn on_http_request_headers(&mut self, _: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            // Envoy keeps buffering until the whole body is here.
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        self.read = self.read.wrapping_add(body.len());
        Action::Continue
    }
}
