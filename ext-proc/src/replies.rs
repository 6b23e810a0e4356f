//! The server's own answers to a request (not the filter's): OpenAI-shaped error bodies sent as
//! an ext_proc `immediate_response`, so the gateway answers the client with a status it can act
//! on instead of turning a gRPC error into a 500.

use envoy_types::pb::envoy::config::core::v3::HeaderValueOption;
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response, HeaderMutation, ImmediateResponse, ProcessingResponse,
};

/// `Retry-After` on a 503 the server answers while it is up but full: long enough for a burst
/// to pass, short enough that a client retries soon.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// One of the server's refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// Every stream slot is taken: 503, `Retry-After`.
    Overloaded,
    /// The memory budget cannot hold this request's body: 503, `Retry-After`.
    OverMemory,
    /// The server is shutting down and this request was not complete: 503, `Retry-After`.
    ShuttingDown,
    /// The next part of the request did not arrive in time: 408.
    IdleTimeout,
    /// The whole request did not arrive in time: 408.
    RequestTimeout,
    /// A newer request took the slot of this stalled upload: 408.
    Evicted,
    /// More request headers than the gateway would take back with the filter's added: 431.
    TooManyHeaders,
}

impl Reply {
    fn parts(self) -> (u32, &'static str, &'static str, &'static str) {
        match self {
            Reply::Overloaded => (
                503,
                "api_error",
                "overloaded",
                "the routing service is at its limit of requests in flight; retry after the Retry-After delay",
            ),
            Reply::OverMemory => (
                503,
                "api_error",
                "overloaded",
                "the routing service cannot hold this request body now (its memory budget is in use); retry after the Retry-After delay",
            ),
            Reply::ShuttingDown => (
                503,
                "api_error",
                "shutting_down",
                "the routing service is shutting down; retry after the Retry-After delay",
            ),
            Reply::IdleTimeout => (
                408,
                "invalid_request_error",
                "request_timeout",
                "the request body stopped arriving before it was complete",
            ),
            Reply::RequestTimeout => (
                408,
                "invalid_request_error",
                "request_timeout",
                "the request took too long to arrive",
            ),
            Reply::Evicted => (
                408,
                "invalid_request_error",
                "request_timeout",
                "the request body stopped arriving and its place was given to another request",
            ),
            Reply::TooManyHeaders => (
                431,
                "invalid_request_error",
                "too_many_headers",
                "the request has too many headers for the gateway to add its routing headers; send fewer",
            ),
        }
    }

    pub fn status(self) -> u32 {
        self.parts().0
    }

    /// The `details` Envoy logs (`%RESPONSE_CODE_DETAILS%`).
    fn details(self) -> &'static str {
        match self {
            Reply::Overloaded => "llmkube_ext_proc_overloaded",
            Reply::OverMemory => "llmkube_ext_proc_memory_budget",
            Reply::ShuttingDown => "llmkube_ext_proc_shutting_down",
            Reply::IdleTimeout => "llmkube_ext_proc_idle_timeout",
            Reply::RequestTimeout => "llmkube_ext_proc_request_timeout",
            Reply::Evicted => "llmkube_ext_proc_evicted",
            Reply::TooManyHeaders => "llmkube_ext_proc_too_many_headers",
        }
    }

    pub fn body(self) -> Vec<u8> {
        let (_, kind, code, message) = self.parts();
        serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            .to_string()
            .into_bytes()
    }

    /// The `immediate_response` that carries it.
    pub fn response(self) -> ProcessingResponse {
        let status = self.status();
        let mut headers = vec![header("content-type", "application/json")];
        if status == 503 {
            headers.push(header("retry-after", &RETRY_AFTER_SECONDS.to_string()));
        }
        ProcessingResponse {
            response: Some(processing_response::Response::ImmediateResponse(
                ImmediateResponse {
                    status: Some(HttpStatus {
                        code: status as i32,
                    }),
                    headers: Some(HeaderMutation {
                        set_headers: headers,
                        remove_headers: vec![],
                    }),
                    body: self.body(),
                    grpc_status: None,
                    details: self.details().into(),
                },
            )),
            ..Default::default()
        }
    }
}

/// A header of an immediate response (the append action does not matter there).
fn header(key: &str, value: &str) -> HeaderValueOption {
    crate::phases::option(key, value, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_openai_shaped_and_503s_say_when_to_retry() {
        for r in [
            Reply::Overloaded,
            Reply::OverMemory,
            Reply::ShuttingDown,
            Reply::IdleTimeout,
            Reply::RequestTimeout,
            Reply::Evicted,
            Reply::TooManyHeaders,
        ] {
            let Some(processing_response::Response::ImmediateResponse(ir)) = r.response().response
            else {
                panic!("{r:?}")
            };
            let body: serde_json::Value = serde_json::from_slice(&ir.body).unwrap();
            assert!(body["error"]["code"].is_string(), "{body}");
            let retry = ir
                .headers
                .unwrap()
                .set_headers
                .iter()
                .any(|h| h.header.as_ref().is_some_and(|h| h.key == "retry-after"));
            assert_eq!(retry, ir.status.unwrap().code == 503, "{r:?}");
        }
    }
}
