//! What the server tests share: the request-headers message a stream opens with.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, HttpHeaders, ProcessingRequest,
};

/// Request headers with `:path` only, ending the request.
pub fn headers_msg(path: &str) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: ":path".into(),
                    value: String::new(),
                    raw_value: path.as_bytes().to_vec(),
                }],
            }),
            end_of_stream: true,
            ..Default::default()
        })),
        ..Default::default()
    }
}
