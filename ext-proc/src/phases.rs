//! One ext_proc stream = one HTTP stream of the filter. Each ext_proc message becomes the
//! proxy-wasm callback Envoy would run (request headers → `on_http_request_headers`, body →
//! `on_http_request_body`, response phases likewise) and what the filter did becomes the answer:
//! header and body mutations, an immediate response, dynamic metadata. Anything that cannot be
//! answered faithfully is answered fail-closed (503, our JSON error), never passed through.

use crate::pool::{Lease, Pool, PoolError};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders, HttpTrailers,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value, Struct, Value};
use llmkube_wasm_runtime::{LocalResponse, StreamOutcome};
use std::collections::BTreeMap;

type Headers = Vec<(String, String)>;

/// `HeaderValueOption.append_action`: replace what is there.
const OVERWRITE_IF_EXISTS_OR_ADD: i32 = 2;
/// ... or add another value.
const APPEND_IF_EXISTS_OR_ADD: i32 = 0;

/// The decision headers published as dynamic metadata (namespace `llmkube`) for later filters
/// and access logs.
const DECISION_METADATA: &[(&str, &str)] = &[
    ("x-llmkube-backend", "backend"),
    ("x-llmkube-rule", "rule"),
    ("x-llmkube-route", "route"),
];

/// Where one ext_proc stream stands.
pub struct Exchange<'p> {
    pool: &'p Pool,
    lease: Option<Lease>,
    request_headers: Headers,
    /// The request headers' mutations were sent (a headers or body response carried them).
    request_decided: bool,
    response_headers: Headers,
    response_decided: bool,
    /// An immediate response was sent: Envoy sends nothing more that needs an answer.
    answered: bool,
}

impl<'p> Exchange<'p> {
    pub fn new(pool: &'p Pool) -> Self {
        Exchange {
            pool,
            lease: None,
            request_headers: Vec::new(),
            request_decided: false,
            response_headers: Vec::new(),
            response_decided: false,
            answered: false,
        }
    }

    /// The answer to one message, or `None` for a message that needs none.
    pub fn handle(&mut self, msg: ProcessingRequest) -> Option<ProcessingResponse> {
        use processing_request::Request as Rq;
        if self.answered {
            // The client closes the stream after an immediate response; should it send more
            // anyway, an empty answer keeps it from waiting on us.
            return msg.request.map(|r| passthrough(&r));
        }
        if msg.observability_mode {
            // Observability mode expects no answers, and the filter could not enforce anything.
            return Some(self.fail_closed("ext_proc observability mode cannot enforce routing"));
        }
        let attributes = attribute_properties(&msg);
        let r = match msg.request? {
            Rq::RequestHeaders(h) => self.request_headers(h, &attributes),
            Rq::RequestBody(b) => self.request_body(b),
            Rq::RequestTrailers(t) => self.trailers(t, false),
            Rq::ResponseHeaders(h) => self.response_headers(h),
            Rq::ResponseBody(b) => self.response_body(b),
            Rq::ResponseTrailers(t) => self.trailers(t, true),
        };
        Some(r.unwrap_or_else(|why| self.fail_closed(&why)))
    }

    /// Ends the filter's stream (access log, teardown).
    pub fn finish(mut self) {
        if let Some(lease) = self.lease.take() {
            self.pool.close(lease);
        }
    }

    fn lease(&self) -> Result<Lease, String> {
        self.lease
            .ok_or_else(|| "a body or response arrived before the request headers".to_string())
    }

    fn request_headers(
        &mut self,
        h: HttpHeaders,
        attributes: &[(Vec<String>, Vec<u8>)],
    ) -> Result<ProcessingResponse, String> {
        if self.lease.is_some() {
            return Err("request headers arrived twice".into());
        }
        let lease = self.pool.open().map_err(pool_error)?;
        self.lease = Some(lease);
        self.request_headers = pairs(h.headers.map(|m| m.headers).unwrap_or_default());
        let headers = self.request_headers.clone();
        let eos = h.end_of_stream;
        let out = self
            .pool
            .with(&lease, |vm, id| {
                for (path, value) in attributes {
                    let path: Vec<&str> = path.iter().map(String::as_str).collect();
                    vm.set_stream_property(id, &path, value.clone())?;
                }
                vm.request_headers(id, &refs(&headers), eos)?;
                vm.request_outcome(id)
            })
            .map_err(pool_error)?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let response = match &out.forwarded_headers {
            Some(fwd) => {
                self.request_decided = true;
                common(mutation(&self.request_headers, fwd), None)
            }
            None if eos => {
                return Err(
                    "the filter neither answered nor passed a request without a body".into(),
                )
            }
            // The filter waits for the body (request_body_mode BUFFERED): its decision goes
            // with the body response, which may still change the held headers.
            None => CommonResponse::default(),
        };
        Ok(reply(
            processing_response::Response::RequestHeaders(HeadersResponse {
                response: Some(response),
            }),
            out.forwarded_headers
                .as_ref()
                .and_then(|h| decision_metadata(h)),
        ))
    }

    fn request_body(&mut self, b: HttpBody) -> Result<ProcessingResponse, String> {
        let lease = self.lease()?;
        if !b.end_of_stream && !self.request_decided {
            return Err("the request body must be sent whole (processing_mode.request_body_mode: BUFFERED) for the filter to decide on it".into());
        }
        let (out, forwarded) = self
            .pool
            .with(&lease, |vm, id| {
                vm.request_body(id, &b.body, b.end_of_stream)?;
                let out = vm.request_outcome(id)?;
                let forwarded = vm.take_forwarded_body(id, false)?;
                Ok((out, forwarded))
            })
            .map_err(pool_error)?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let Some(fwd) = &out.forwarded_headers else {
            return Err(
                "the filter neither answered nor passed the request after its whole body".into(),
            );
        };
        if !out.complete && b.end_of_stream {
            return Err("the filter holds the request after its whole body (a callout this server does not make)".into());
        }
        let mut metadata = None;
        let headers = if self.request_decided {
            None
        } else {
            self.request_decided = true;
            metadata = decision_metadata(fwd);
            Some(mutation(&self.request_headers, fwd))
        };
        let body = (forwarded != b.body).then_some(forwarded);
        Ok(reply(
            processing_response::Response::RequestBody(BodyResponse {
                response: Some(common(headers.unwrap_or_default(), body)),
            }),
            metadata,
        ))
    }

    fn response_headers(&mut self, h: HttpHeaders) -> Result<ProcessingResponse, String> {
        let lease = self.lease()?;
        self.response_headers = pairs(h.headers.map(|m| m.headers).unwrap_or_default());
        let headers = self.response_headers.clone();
        let out: StreamOutcome = self
            .pool
            .with(&lease, |vm, id| {
                vm.response_headers(id, &refs(&headers), h.end_of_stream)?;
                vm.response_outcome(id)
            })
            .map_err(pool_error)?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let response = match &out.forwarded_headers {
            Some(fwd) => {
                self.response_decided = true;
                common(mutation(&self.response_headers, fwd), None)
            }
            None if h.end_of_stream => {
                return Err(
                    "the filter neither answered nor passed a response without a body".into(),
                )
            }
            None => CommonResponse::default(),
        };
        Ok(reply(
            processing_response::Response::ResponseHeaders(HeadersResponse {
                response: Some(response),
            }),
            None,
        ))
    }

    fn response_body(&mut self, b: HttpBody) -> Result<ProcessingResponse, String> {
        let lease = self.lease()?;
        let (out, forwarded) = self
            .pool
            .with(&lease, |vm, id| {
                vm.response_body(id, &b.body, b.end_of_stream)?;
                let out = vm.response_outcome(id)?;
                let forwarded = vm.take_forwarded_body(id, true)?;
                Ok((out, forwarded))
            })
            .map_err(pool_error)?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let headers = match (&out.forwarded_headers, self.response_decided) {
            (Some(fwd), false) => {
                self.response_decided = true;
                mutation(&self.response_headers, fwd)
            }
            _ => HeaderMutation::default(),
        };
        // A chunk the filter holds is cleared here and comes back with a later one.
        let body = if forwarded == b.body {
            None
        } else {
            Some(forwarded)
        };
        Ok(reply(
            processing_response::Response::ResponseBody(BodyResponse {
                response: Some(common(headers, body)),
            }),
            None,
        ))
    }

    fn trailers(&mut self, t: HttpTrailers, response: bool) -> Result<ProcessingResponse, String> {
        let lease = self.lease()?;
        let trailers = pairs(t.trailers.map(|m| m.headers).unwrap_or_default());
        let out = self
            .pool
            .with(&lease, |vm, id| {
                if response {
                    vm.response_trailers(id, &refs(&trailers))?;
                    vm.response_outcome(id)
                } else {
                    vm.request_trailers(id, &refs(&trailers))?;
                    vm.request_outcome(id)
                }
            })
            .map_err(pool_error)?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let header_mutation = out
            .forwarded_trailers
            .as_ref()
            .map(|fwd| mutation(&trailers, fwd));
        let r = TrailersResponse { header_mutation };
        Ok(reply(
            if response {
                processing_response::Response::ResponseTrailers(r)
            } else {
                processing_response::Response::RequestTrailers(r)
            },
            None,
        ))
    }

    fn immediate(&mut self, lr: &LocalResponse) -> ProcessingResponse {
        self.answered = true;
        let set_headers = lr
            .headers
            .iter()
            .filter(|(k, _)| !k.starts_with(':'))
            .map(|(k, v)| option(k, v, APPEND_IF_EXISTS_OR_ADD))
            .collect();
        reply(
            processing_response::Response::ImmediateResponse(ImmediateResponse {
                status: Some(HttpStatus {
                    code: lr.status as i32,
                }),
                headers: Some(HeaderMutation {
                    set_headers,
                    remove_headers: vec![],
                }),
                body: lr.body.clone(),
                grpc_status: None,
                details: lr.details.clone(),
            }),
            None,
        )
    }

    /// 503 with the project's `fail_closed` error: nothing is forwarded.
    fn fail_closed(&mut self, why: &str) -> ProcessingResponse {
        eprintln!("llmkube-ext-proc: failing closed: {why}");
        let body = serde_json::json!({"error": {
            "message": format!("the routing filter could not decide this request ({why}); it is refused, not forwarded"),
            "type": "api_error", "param": null, "code": "fail_closed"}});
        self.immediate(&LocalResponse {
            status: 503,
            details: "llmkube_ext_proc_fail_closed".into(),
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            grpc_status: -1,
        })
    }
}

/// The answer that changes nothing, of the type `r` expects.
fn passthrough(r: &processing_request::Request) -> ProcessingResponse {
    use processing_request::Request as Rq;
    use processing_response::Response as Rs;
    let headers = || HeadersResponse {
        response: Some(CommonResponse::default()),
    };
    let body = || BodyResponse {
        response: Some(CommonResponse::default()),
    };
    let r = match r {
        Rq::RequestHeaders(_) => Rs::RequestHeaders(headers()),
        Rq::ResponseHeaders(_) => Rs::ResponseHeaders(headers()),
        Rq::RequestBody(_) => Rs::RequestBody(body()),
        Rq::ResponseBody(_) => Rs::ResponseBody(body()),
        Rq::RequestTrailers(_) => Rs::RequestTrailers(TrailersResponse::default()),
        Rq::ResponseTrailers(_) => Rs::ResponseTrailers(TrailersResponse::default()),
    };
    reply(r, None)
}

fn pool_error(e: PoolError) -> String {
    e.to_string()
}

fn reply(r: processing_response::Response, dynamic_metadata: Option<Struct>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(r),
        dynamic_metadata,
        ..Default::default()
    }
}

/// Header changes re-select the route (the decision headers are what routes match on).
fn common(header_mutation: HeaderMutation, body: Option<Vec<u8>>) -> CommonResponse {
    let changed =
        !header_mutation.set_headers.is_empty() || !header_mutation.remove_headers.is_empty();
    CommonResponse {
        header_mutation: changed.then_some(header_mutation),
        body_mutation: body.map(|b| BodyMutation {
            mutation: Some(body_mutation::Mutation::Body(b)),
        }),
        clear_route_cache: changed,
        ..Default::default()
    }
}

fn pairs(headers: Vec<HeaderValue>) -> Headers {
    headers
        .into_iter()
        .map(|h| {
            let value = if h.raw_value.is_empty() {
                h.value
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            };
            (h.key.to_ascii_lowercase(), value)
        })
        .collect()
}

fn refs(headers: &Headers) -> Vec<(&str, &str)> {
    headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn option(key: &str, value: &str, append_action: i32) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action,
        ..Default::default()
    }
}

/// The mutation that turns `before` into `after`: names whose values changed are set (the first
/// value replaces, the others append), names gone are removed.
pub fn mutation(before: &Headers, after: &Headers) -> HeaderMutation {
    let (b, a) = (group(before), group(after));
    let mut out = HeaderMutation::default();
    for (name, values) in &a {
        if b.get(name) == Some(values) {
            continue;
        }
        for (i, v) in values.iter().enumerate() {
            let action = if i == 0 {
                OVERWRITE_IF_EXISTS_OR_ADD
            } else {
                APPEND_IF_EXISTS_OR_ADD
            };
            out.set_headers.push(option(name, v, action));
        }
    }
    out.remove_headers = b
        .keys()
        .filter(|k| !a.contains_key(*k))
        .map(|k| k.to_string())
        .collect();
    out
}

fn group(h: &Headers) -> BTreeMap<&str, Vec<&str>> {
    let mut m: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (k, v) in h {
        m.entry(k.as_str()).or_default().push(v.as_str());
    }
    m
}

fn decision_metadata(headers: &Headers) -> Option<Struct> {
    let fields: BTreeMap<String, Value> = DECISION_METADATA
        .iter()
        .filter_map(|(header, key)| {
            let v = headers.iter().find(|(k, _)| k == header)?;
            Some((
                key.to_string(),
                Value {
                    kind: Some(value::Kind::StringValue(v.1.clone())),
                },
            ))
        })
        .collect();
    if fields.is_empty() {
        return None;
    }
    let inner = Struct {
        fields: fields.into_iter().collect(),
    };
    Some(Struct {
        fields: [(
            "llmkube".to_string(),
            Value {
                kind: Some(value::Kind::StructValue(inner)),
            },
        )]
        .into_iter()
        .collect(),
    })
}

/// String attributes the gateway sent (`request_attributes` / `response_attributes`, e.g.
/// `source.address`) as stream properties, the path split at dots as Envoy's property paths are.
fn attribute_properties(msg: &ProcessingRequest) -> Vec<(Vec<String>, Vec<u8>)> {
    let mut out = Vec::new();
    for s in msg.attributes.values() {
        for (name, v) in &s.fields {
            if let Some(value::Kind::StringValue(text)) = &v.kind {
                let path = name.split('.').map(str::to_string).collect();
                out.push((path, text.clone().into_bytes()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn mutations_set_changed_names_and_remove_gone_ones() {
        let before = h(&[
            (":path", "/v1/chat/completions"),
            ("x-llmkube-backend", "spoofed"),
            ("x-llmkube-backend", "again"),
            ("x-llmkube-shadow", "true"),
            ("accept", "*/*"),
        ]);
        let after = h(&[
            (":path", "/v1/chat/completions"),
            ("accept", "*/*"),
            ("x-llmkube-backend", "qwen"),
            ("x-ai-eg-model", "qwen3-8b"),
        ]);
        let m = mutation(&before, &after);
        let set: Vec<(String, String, i32)> = m
            .set_headers
            .iter()
            .map(|o| {
                let hv = o.header.as_ref().unwrap();
                (
                    hv.key.clone(),
                    String::from_utf8(hv.raw_value.clone()).unwrap(),
                    o.append_action,
                )
            })
            .collect();
        assert_eq!(
            set,
            vec![
                (
                    "x-ai-eg-model".into(),
                    "qwen3-8b".into(),
                    OVERWRITE_IF_EXISTS_OR_ADD
                ),
                (
                    "x-llmkube-backend".into(),
                    "qwen".into(),
                    OVERWRITE_IF_EXISTS_OR_ADD
                ),
            ]
        );
        assert_eq!(m.remove_headers, vec!["x-llmkube-shadow".to_string()]);
        assert_eq!(mutation(&after, &after), HeaderMutation::default());
    }

    #[test]
    fn a_trap_is_answered_503_fail_closed_and_nothing_passes() {
        use envoy_types::pb::envoy::config::core::v3::HeaderMap;
        let wat = r#"(module (memory (export "memory") 1)
          (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
          (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) unreachable))"#;
        let module = llmkube_wasm_runtime::WasmModule::compile(wat.as_bytes()).unwrap();
        let pool = Pool::new(module, Default::default(), 1).unwrap();
        let mut x = Exchange::new(&pool);
        let headers = HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: ":path".into(),
                    value: String::new(),
                    raw_value: b"/v1/chat/completions".to_vec(),
                }],
            }),
            end_of_stream: false,
            ..Default::default()
        };
        let r = x
            .handle(ProcessingRequest {
                request: Some(processing_request::Request::RequestHeaders(headers)),
                ..Default::default()
            })
            .unwrap();
        let Some(processing_response::Response::ImmediateResponse(ir)) = r.response else {
            panic!("{r:?}")
        };
        assert_eq!(ir.status.unwrap().code, 503);
        let body: serde_json::Value = serde_json::from_slice(&ir.body).unwrap();
        assert_eq!(body["error"]["code"], "fail_closed");
        x.finish();
    }

    #[test]
    fn decision_headers_become_llmkube_metadata() {
        let s =
            decision_metadata(&h(&[("x-llmkube-backend", "a"), ("x-llmkube-rule", "r")])).unwrap();
        let Some(value::Kind::StructValue(inner)) = &s.fields["llmkube"].kind else {
            panic!("{s:?}")
        };
        assert_eq!(
            inner.fields["backend"].kind,
            Some(value::Kind::StringValue("a".into()))
        );
        assert!(decision_metadata(&h(&[("accept", "x")])).is_none());
    }
}
