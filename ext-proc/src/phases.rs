//! One ext_proc stream = one HTTP stream of the filter. Each ext_proc message becomes the
//! proxy-wasm callback Envoy would run (request headers → `on_http_request_headers`, body →
//! `on_http_request_body`, response phases likewise) and what the filter did becomes the answer:
//! header and body mutations, an immediate response, dynamic metadata. Anything that cannot be
//! answered faithfully is answered fail-closed (503, our JSON error), never passed through.

mod duplex;

use crate::pool::{Pool, PoolError, PoolSeat};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, BodyMutation, BodyResponse,
    CommonResponse, HeaderMutation, HeadersResponse, HttpBody, HttpHeaders, HttpTrailers,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
    StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value, Struct, Value};
use llmkube_wasm_runtime::{HostError, LocalResponse, StreamId, StreamOutcome, Vm};
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

/// `ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED`.
pub(crate) const FULL_DUPLEX_STREAMED: i32 = 4;

/// Which directions stream full-duplex on this ext_proc stream.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Duplex {
    pub request: bool,
    pub response: bool,
}

impl Duplex {
    pub(crate) fn of(pc: &ProtocolConfiguration) -> Duplex {
        Duplex {
            request: pc.request_body_mode == FULL_DUPLEX_STREAMED,
            response: pc.response_body_mode == FULL_DUPLEX_STREAMED,
        }
    }
}

/// One direction's headers as the gateway sent them, and whether the filter's changes to them
/// went out: they go once, with the headers answer or with the first body answer after it.
#[derive(Default)]
struct Side {
    headers: Headers,
    decided: bool,
}

impl Side {
    /// The filter's changes to the headers (`forwarded`), the first time only.
    fn decide(&mut self, forwarded: &Headers) -> Option<HeaderMutation> {
        if self.decided {
            return None;
        }
        self.decided = true;
        Some(mutation(&self.headers, forwarded))
    }
}

/// Where one ext_proc stream stands.
pub struct Exchange<'p> {
    pool: &'p Pool,
    seat: Option<PoolSeat>,
    request: Side,
    response: Side,
    /// An immediate response was sent: Envoy sends nothing more that needs an answer.
    answered: bool,
    /// Directions whose body streams full-duplex (from the gateway's `protocol_config`).
    duplex: Duplex,
}

impl<'p> Exchange<'p> {
    pub fn new(pool: &'p Pool) -> Self {
        Exchange {
            pool,
            seat: None,
            request: Side::default(),
            response: Side::default(),
            answered: false,
            duplex: Default::default(),
        }
    }

    /// The answer to one message, or `None` for a message that needs none. It waits while the
    /// filter waits on its own callouts (the gateway holds the request meanwhile).
    pub async fn handle(&mut self, msg: ProcessingRequest) -> Option<ProcessingResponse> {
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
            Rq::RequestHeaders(h) => self.request_headers(h, &attributes).await,
            Rq::RequestBody(b) => self.request_body(b).await,
            Rq::RequestTrailers(t) => self.trailers(t, false),
            Rq::ResponseHeaders(h) => self.response_headers(h).await,
            Rq::ResponseBody(b) => self.response_body(b).await,
            Rq::ResponseTrailers(t) => self.trailers(t, true),
        };
        Some(r.unwrap_or_else(|why| self.fail_closed(&why)))
    }

    /// An immediate response went out: nothing more of the request is awaited.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// Ends the filter's stream (access log, teardown).
    pub fn finish(mut self) {
        if let Some(seat) = self.seat.take() {
            self.pool.close(seat);
        }
    }

    fn side(&mut self, response: bool) -> &mut Side {
        if response {
            &mut self.response
        } else {
            &mut self.request
        }
    }

    fn seat(&self) -> Result<PoolSeat, String> {
        self.seat
            .ok_or_else(|| "a body or response arrived before the request headers".to_string())
    }

    /// Runs one callback on the stream's instance, then, while the filter is neither done with
    /// this phase (`ready`) nor answered and has callouts out, waits for them to settle (answer,
    /// failure or timeout wake the instance's waiters). Returns where the direction stands and
    /// the body bytes it forwarded.
    async fn run(
        &self,
        seat: PoolSeat,
        response: bool,
        deliver: impl FnOnce(&mut Vm, StreamId) -> Result<(), HostError>,
        ready: impl Fn(&StreamOutcome) -> bool,
    ) -> Result<(StreamOutcome, Vec<u8>), String> {
        let outcome = |vm: &mut Vm, id: StreamId| {
            let out = if response {
                vm.response_outcome(id)?
            } else {
                vm.request_outcome(id)?
            };
            Ok::<_, HostError>((out, vm.pending_http_calls_of(id)))
        };
        let settled = self.pool.settled(&seat);
        let mut wake = std::pin::pin!(settled.notified());
        wake.as_mut().enable();
        let (mut out, mut pending) = self
            .pool
            .with(&seat, |vm, id| {
                deliver(vm, id)?;
                outcome(vm, id)
            })
            .map_err(pool_error)?;
        while out.local_response.is_none() && !ready(&out) && pending > 0 {
            wake.as_mut().await;
            wake.set(settled.notified());
            wake.as_mut().enable();
            (out, pending) = self.pool.with(&seat, outcome).map_err(pool_error)?;
        }
        let forwarded = self
            .pool
            .with(&seat, |vm, id| vm.take_forwarded_body(id, response))
            .map_err(pool_error)?;
        Ok((out, forwarded))
    }

    async fn request_headers(
        &mut self,
        h: HttpHeaders,
        attributes: &[(Vec<String>, Vec<u8>)],
    ) -> Result<ProcessingResponse, String> {
        if self.seat.is_some() {
            return Err("request headers arrived twice".into());
        }
        let seat = self.pool.open().map_err(pool_error)?;
        self.seat = Some(seat);
        self.request.headers = pairs(h.headers.map(|m| m.headers).unwrap_or_default());
        let headers = self.request.headers.clone();
        let eos = h.end_of_stream;
        let (out, _) = self
            .run(
                seat,
                false,
                |vm, id| {
                    for (path, value) in attributes {
                        let path: Vec<&str> = path.iter().map(String::as_str).collect();
                        vm.set_stream_property(id, &path, value.clone())?;
                    }
                    vm.request_headers(id, &refs(&headers), eos).map(drop)
                },
                |out| out.forwarded_headers.is_some(),
            )
            .await?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let response = Self::headers_common(&mut self.request, &out, eos, "request")?;
        Ok(reply(
            processing_response::Response::RequestHeaders(HeadersResponse {
                response: Some(response),
            }),
            out.forwarded_headers.as_ref().and_then(decision_metadata),
        ))
    }

    /// The answer to a headers message: the filter's changes if it passed the headers; nothing
    /// yet if it waits for the body (its decision goes with the body answer, which may still
    /// change the held headers); an error if it did neither on a message that ends the stream.
    fn headers_common(
        side: &mut Side,
        out: &StreamOutcome,
        end_of_stream: bool,
        direction: &str,
    ) -> Result<CommonResponse, String> {
        match &out.forwarded_headers {
            Some(fwd) => Ok(common(side.decide(fwd).unwrap_or_default(), None)),
            None if end_of_stream => Err(format!(
                "the filter neither answered nor passed a {direction} without a body"
            )),
            None => Ok(CommonResponse::default()),
        }
    }

    async fn request_body(&mut self, b: HttpBody) -> Result<ProcessingResponse, String> {
        let seat = self.seat()?;
        if !b.end_of_stream && !self.request.decided {
            return Err("the request body must be sent whole (processing_mode.request_body_mode: BUFFERED) for the filter to decide on it".into());
        }
        let eos = b.end_of_stream;
        let (out, forwarded) = self
            .run(
                seat,
                false,
                |vm, id| vm.request_body(id, &b.body, eos).map(drop),
                |out| out.complete || !eos,
            )
            .await?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let Some(fwd) = &out.forwarded_headers else {
            return Err(
                "the filter neither answered nor passed the request after its whole body".into(),
            );
        };
        if !out.complete && b.end_of_stream {
            return Err(
                "the filter holds the request after its whole body and has no callout out".into(),
            );
        }
        let headers = self.request.decide(fwd);
        let metadata = headers.as_ref().and_then(|_| decision_metadata(fwd));
        let body = (forwarded != b.body).then_some(forwarded);
        Ok(reply(
            processing_response::Response::RequestBody(BodyResponse {
                response: Some(common(headers.unwrap_or_default(), body)),
            }),
            metadata,
        ))
    }

    async fn response_headers(&mut self, h: HttpHeaders) -> Result<ProcessingResponse, String> {
        let seat = self.seat()?;
        self.response.headers = pairs(h.headers.map(|m| m.headers).unwrap_or_default());
        let headers = self.response.headers.clone();
        let eos = h.end_of_stream;
        let (out, _) = self
            .run(
                seat,
                true,
                |vm, id| vm.response_headers(id, &refs(&headers), eos).map(drop),
                |out| out.forwarded_headers.is_some(),
            )
            .await?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let response = Self::headers_common(&mut self.response, &out, eos, "response")?;
        Ok(reply(
            processing_response::Response::ResponseHeaders(HeadersResponse {
                response: Some(response),
            }),
            None,
        ))
    }

    /// One chunk of a streamed (or the whole of a buffered) response body: what the filter
    /// passed replaces the chunk, so a filter that strips or rewrites a chunk does so here too.
    async fn response_body(&mut self, b: HttpBody) -> Result<ProcessingResponse, String> {
        let seat = self.seat()?;
        let eos = b.end_of_stream;
        let (out, forwarded) = self
            .run(
                seat,
                true,
                |vm, id| vm.response_body(id, &b.body, eos).map(drop),
                |out| out.complete || !eos,
            )
            .await?;
        if let Some(lr) = &out.local_response {
            return Ok(self.immediate(lr));
        }
        let headers = out
            .forwarded_headers
            .as_ref()
            .and_then(|fwd| self.response.decide(fwd))
            .unwrap_or_default();
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
        let seat = self.seat()?;
        let trailers = pairs(t.trailers.map(|m| m.headers).unwrap_or_default());
        let out = self
            .pool
            .with(&seat, |vm, id| {
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

pub fn option(key: &str, value: &str, append_action: i32) -> HeaderValueOption {
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

/// The attributes the gateway sent (`request_attributes` / `response_attributes`, e.g.
/// `source.address`, `request.path`, `source.port`) as stream properties, the path split at dots
/// as Envoy's property paths are, each value encoded as Envoy hands that type to a module:
/// strings as bytes, integers as 8 little-endian bytes, booleans as one byte. (Structs and lists
/// are not passed: Envoy serializes those as protobuf, which no filter of ours reads.)
fn attribute_properties(msg: &ProcessingRequest) -> Vec<(Vec<String>, Vec<u8>)> {
    let mut out = Vec::new();
    for s in msg.attributes.values() {
        for (name, v) in &s.fields {
            let bytes = match &v.kind {
                Some(value::Kind::StringValue(text)) => text.clone().into_bytes(),
                // Struct numbers are doubles; the CEL attributes behind them are integers.
                Some(value::Kind::NumberValue(n)) if n.fract() == 0.0 => {
                    (*n as i64).to_le_bytes().to_vec()
                }
                Some(value::Kind::BoolValue(b)) => vec![u8::from(*b)],
                _ => continue,
            };
            out.push((name.split('.').map(str::to_string).collect(), bytes));
        }
    }
    out
}

/// A streamed-body answer of the request (`response` false) or response phase carrying `body`.
pub(crate) fn streamed_chunk(
    response: bool,
    body: Vec<u8>,
    end_of_stream: bool,
) -> ProcessingResponse {
    let r = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body,
                        end_of_stream,
                        ..Default::default()
                    },
                )),
            }),
            ..Default::default()
        }),
    };
    reply(
        if response {
            processing_response::Response::ResponseBody(r)
        } else {
            processing_response::Response::RequestBody(r)
        },
        None,
    )
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
        let pool = Pool::new(module, Default::default(), 1, None).unwrap();
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
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt
            .block_on(x.handle(ProcessingRequest {
                request: Some(processing_request::Request::RequestHeaders(headers)),
                ..Default::default()
            }))
            .unwrap();
        let Some(processing_response::Response::ImmediateResponse(ir)) = r.response else {
            panic!("{r:?}")
        };
        assert_eq!(ir.status.unwrap().code, 503);
        let body: serde_json::Value = serde_json::from_slice(&ir.body).unwrap();
        assert_eq!(body["error"]["code"], "fail_closed");
        x.finish();
    }

    pub(super) fn headers_msg(response: bool, eos: bool) -> ProcessingRequest {
        use envoy_types::pb::envoy::config::core::v3::HeaderMap;
        let h = HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue {
                    key: if response { ":status" } else { ":path" }.into(),
                    value: String::new(),
                    raw_value: if response {
                        b"200".to_vec()
                    } else {
                        b"/".to_vec()
                    },
                }],
            }),
            end_of_stream: eos,
            ..Default::default()
        };
        ProcessingRequest {
            request: Some(if response {
                processing_request::Request::ResponseHeaders(h)
            } else {
                processing_request::Request::RequestHeaders(h)
            }),
            ..Default::default()
        }
    }

    fn response_chunk(body: &[u8], eos: bool) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(processing_request::Request::ResponseBody(HttpBody {
                body: body.to_vec(),
                end_of_stream: eos,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn body_mutation(r: &ProcessingResponse) -> Option<Vec<u8>> {
        let Some(processing_response::Response::ResponseBody(b)) = &r.response else {
            panic!("{r:?}")
        };
        match b
            .response
            .as_ref()?
            .body_mutation
            .as_ref()?
            .mutation
            .as_ref()?
        {
            body_mutation::Mutation::Body(b) => Some(b.clone()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_streamed_response_chunk_the_filter_holds_is_cleared_and_comes_back_with_the_next() {
        // Holds every response chunk until the last (StopIterationAndBuffer), then passes all.
        let wat = r#"(module (memory (export "memory") 1)
          (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
          (func (export "proxy_on_response_body") (param i32 i32 i32) (result i32)
            (i32.eqz (local.get 2))))"#;
        let module = llmkube_wasm_runtime::WasmModule::compile(wat.as_bytes()).unwrap();
        let pool = Pool::new(module, Default::default(), 1, None).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut x = Exchange::new(&pool);
            x.handle(headers_msg(false, true)).await.unwrap();
            x.handle(headers_msg(true, false)).await.unwrap();
            let first = x
                .handle(response_chunk(b"data: a\n\n", false))
                .await
                .unwrap();
            assert_eq!(body_mutation(&first), Some(vec![]));
            let last = x
                .handle(response_chunk(b"data: b\n\n", true))
                .await
                .unwrap();
            assert_eq!(
                body_mutation(&last).as_deref(),
                Some(&b"data: a\n\ndata: b\n\n"[..])
            );
            x.finish();
        });
    }

    #[test]
    fn attributes_become_properties_encoded_as_envoy_hands_them_over() {
        let attrs = Struct {
            fields: [
                (
                    "source.address",
                    value::Kind::StringValue("10.0.0.7:5555".into()),
                ),
                ("source.port", value::Kind::NumberValue(5555.0)),
                ("connection.mtls", value::Kind::BoolValue(true)),
                ("request.time", value::Kind::NullValue(0)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value { kind: Some(v) }))
            .collect(),
        };
        let msg = ProcessingRequest {
            attributes: [("envoy.filters.http.ext_proc".to_string(), attrs)]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let mut props = attribute_properties(&msg);
        props.sort();
        let p =
            |path: &[&str], v: &[u8]| (path.iter().map(|s| s.to_string()).collect(), v.to_vec());
        assert_eq!(
            props,
            vec![
                p(&["connection", "mtls"], &[1]),
                p(&["source", "address"], b"10.0.0.7:5555"),
                p(&["source", "port"], &5555i64.to_le_bytes()),
            ]
        );
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
