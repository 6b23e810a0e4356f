//! Endpoint-picker mode (`endpoint_picker:` in the config): the server answers as a Gateway API
//! Inference Extension endpoint picker (EPP). The filter module runs as on any other stream and
//! its pick step chooses the pod; this layer speaks the EPP side of the protocol around it:
//!
//! - the request body arrives in FULL_DUPLEX_STREAMED chunks (what the protocol prescribes, and
//!   all agentgateway's `inferenceRouting` sends); they are held, bounded by the filter's body
//!   limit, until the end of the body, because the pick needs the whole prompt. Then the filter
//!   sees headers and body as in BUFFERED mode, and the answers go out in the order the proxy
//!   expects: the headers response (with the pod), then the body as one streamed chunk;
//! - the pod goes out both ways the protocol names: the `x-gateway-destination-endpoint` header
//!   and the dynamic metadata `envoy.lb` → `x-gateway-destination-endpoint`, the same value;
//! - a candidate subset the proxy sends (`envoy.lb.subset_hint` →
//!   `x-gateway-destination-endpoint-subset`) bounds the pick: it reaches the filter as the
//!   stream property `llmkube.endpoint_subset`, and the pick weighs only those pods (an empty
//!   list, or none eligible, is 503); a pick outside it would never be answered either;
//! - a request the filter passes without naming a pod (no endpoint-picked backend on its order,
//!   or every pod quarantined) is answered 503, so the proxy never routes it by itself;
//! - the response phases reach the filter (status, usage) as on the wasm path, and the pick's
//!   ticket is released when the stream ends, whether it completed or the proxy aborted it.

use crate::phases::{streamed_chunk, Exchange};
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption, Metadata};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_request, processing_response, BodyMutation, CommonResponse,
    HeaderMutation, HeadersResponse, HttpBody, ImmediateResponse, ProcessingRequest,
    ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value, Struct, Value};

/// The header (and metadata key) the pod is named in.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata key of the proxy's candidate list.
pub const SUBSET: &str = "x-gateway-destination-endpoint-subset";
pub const DEFAULT_DESTINATION_NAMESPACE: &str = "envoy.lb";
pub const DEFAULT_SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";

/// `endpoint_picker:` of the server's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where the pod goes in the response's dynamic metadata.
    pub destination_namespace: String,
    /// Where the proxy's candidate subset is read from the request's metadata.
    pub subset_namespace: String,
}

/// The config file's form of [`Settings`]: every key optional.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsFile {
    #[serde(default)]
    destination_namespace: Option<String>,
    #[serde(default)]
    subset_namespace: Option<String>,
}

impl SettingsFile {
    pub fn settings(self) -> Settings {
        let d = Settings::default();
        Settings {
            destination_namespace: self
                .destination_namespace
                .unwrap_or(d.destination_namespace),
            subset_namespace: self.subset_namespace.unwrap_or(d.subset_namespace),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            destination_namespace: DEFAULT_DESTINATION_NAMESPACE.into(),
            subset_namespace: DEFAULT_SUBSET_NAMESPACE.into(),
        }
    }
}

/// One EPP stream around the filter's own exchange.
pub struct Picker<'p> {
    inner: Exchange<'p>,
    settings: &'p Settings,
    /// The bytes kept of one request body: the filter's limit plus one byte, so the filter
    /// still sees that the body is too long and answers its own 413.
    keep: usize,
    /// The request headers, held until the body's end.
    held: Option<ProcessingRequest>,
    body: Vec<u8>,
    subset: Option<Vec<String>>,
    /// An immediate response went out: what follows gets empty answers.
    answered: bool,
}

impl<'p> Picker<'p> {
    pub fn new(inner: Exchange<'p>, settings: &'p Settings, max_body_bytes: usize) -> Self {
        Picker {
            inner,
            settings,
            keep: max_body_bytes.saturating_add(1),
            held: None,
            body: Vec::new(),
            subset: None,
            answered: false,
        }
    }

    /// An immediate response went out: nothing more of the request is awaited.
    pub fn answered(&self) -> bool {
        self.answered || self.inner.answered()
    }

    /// The answers to one message: none while the body is held, two (headers, then body) when
    /// the decision is made on the body's last chunk.
    pub async fn handle(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        use processing_request::Request as Rq;
        if self.answered {
            return self.inner.handle(msg).await.into_iter().collect();
        }
        match &msg.request {
            Some(Rq::RequestHeaders(h)) if self.held.is_none() => {
                let eos = h.end_of_stream;
                if !eos && !full_duplex(&msg) {
                    return vec![self.unavailable(
                        "fail_closed",
                        "the endpoint picker needs the request body FULL_DUPLEX_STREAMED (processing_mode.request_body_mode); the gateway sends it otherwise, so the pod cannot be picked",
                    )];
                }
                let mut msg = msg;
                self.subset = subset(&msg.metadata_context, &self.settings.subset_namespace);
                match &self.subset {
                    Some(list) if list.is_empty() => {
                        return vec![self.unavailable(
                        "no_eligible_pod",
                        "the gateway allowed no pod for this request (an empty candidate subset)",
                    )]
                    }
                    Some(list) => bound_to(&mut msg, list),
                    None => {}
                }
                if eos {
                    let first = self.inner.handle(msg).await;
                    return self.decide(first, None);
                }
                self.held = Some(msg);
                Vec::new()
            }
            Some(Rq::RequestBody(b)) if self.held.is_some() => {
                let room = self.keep.saturating_sub(self.body.len());
                self.body
                    .extend_from_slice(&b.body[..b.body.len().min(room)]);
                if !b.end_of_stream {
                    return Vec::new();
                }
                self.decide_on_body(true).await
            }
            // Trailers end a body that did not say so itself.
            Some(Rq::RequestTrailers(_)) if self.held.is_some() => {
                let mut out = self.decide_on_body(false).await;
                if !self.answered {
                    out.extend(self.inner.handle(msg).await);
                }
                out
            }
            Some(Rq::ResponseBody(b)) => {
                let chunk = b.body.clone();
                let eos = b.end_of_stream;
                match self.inner.handle(msg).await {
                    Some(r) => vec![self.streamed_response_body(r, chunk, eos)],
                    None => Vec::new(),
                }
            }
            _ => {
                let out: Vec<_> = self.inner.handle(msg).await.into_iter().collect();
                self.answered |= out.iter().any(is_immediate);
                out
            }
        }
    }

    /// Ends the filter's stream: the pick's ticket is released here.
    pub fn finish(self) {
        self.inner.finish();
    }

    /// `end_of_stream`: the body's last chunk said so (no trailers follow).
    async fn decide_on_body(&mut self, end_of_stream: bool) -> Vec<ProcessingResponse> {
        let Some(mut headers) = self.held.take() else {
            return Vec::new();
        };
        if let Some(processing_request::Request::RequestHeaders(h)) = headers.request.as_mut() {
            h.end_of_stream = false;
        }
        let first = self.inner.handle(headers).await;
        if first.as_ref().is_some_and(is_immediate) {
            return self.decide(first, None);
        }
        let body = std::mem::take(&mut self.body);
        let whole = ProcessingRequest {
            request: Some(processing_request::Request::RequestBody(HttpBody {
                body: body.clone(),
                end_of_stream: true,
                ..Default::default()
            })),
            ..Default::default()
        };
        let second = self.inner.handle(whole).await;
        self.decide(first, Some((second, body, end_of_stream)))
    }

    /// Turns the filter's answers to the request into the EPP's: its immediate response as is,
    /// or the headers response naming the pod (header and metadata) and the body, streamed back
    /// (`body`: the filter's answer to it, the bytes held, and whether they end the stream).
    fn decide(
        &mut self,
        first: Option<ProcessingResponse>,
        body: Option<(Option<ProcessingResponse>, Vec<u8>, bool)>,
    ) -> Vec<ProcessingResponse> {
        let mut answers = vec![first];
        let mut sent = Vec::new();
        let mut body_ends = None;
        if let Some((second, original, end_of_stream)) = body {
            answers.push(second);
            sent = original;
            body_ends = Some(end_of_stream);
        }
        let mut mutation = HeaderMutation::default();
        let mut metadata: Option<Struct> = None;
        let mut forwarded = None;
        for answer in answers.into_iter().flatten() {
            if is_immediate(&answer) {
                self.answered = true;
                return vec![answer];
            }
            if answer.dynamic_metadata.is_some() {
                metadata = answer.dynamic_metadata;
            }
            let Some(common) = common_of(answer.response) else {
                continue;
            };
            if let Some(m) = common.header_mutation {
                mutation.set_headers.extend(m.set_headers);
                mutation.remove_headers.extend(m.remove_headers);
            }
            if let Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::Body(b)),
            }) = common.body_mutation
            {
                forwarded = Some(b);
            }
        }
        let Some(pod) = destination(&mutation) else {
            return vec![self.unavailable(
                "no_eligible_pod",
                "no pod can take this request: its route reaches no endpoint-picked backend, or every pod is quarantined",
            )];
        };
        if let Some(subset) = &self.subset {
            if !subset.iter().any(|c| c == &pod) {
                return vec![self.unavailable(
                    "no_eligible_pod",
                    "the pod picked for this request is not among the candidates the gateway allowed",
                )];
            }
        }
        let mut metadata = metadata.unwrap_or_default();
        metadata.fields.insert(
            self.settings.destination_namespace.clone(),
            string_struct(DESTINATION, &pod),
        );
        let headers = ProcessingResponse {
            response: Some(processing_response::Response::RequestHeaders(
                HeadersResponse {
                    response: Some(CommonResponse {
                        header_mutation: Some(mutation),
                        clear_route_cache: true,
                        ..Default::default()
                    }),
                },
            )),
            dynamic_metadata: Some(metadata),
            ..Default::default()
        };
        let mut out = vec![headers];
        if let Some(end_of_stream) = body_ends {
            out.push(streamed_chunk(
                false,
                forwarded.unwrap_or(sent),
                end_of_stream,
            ));
        }
        out
    }

    /// A response chunk the filter saw goes back as a streamed chunk: what the filter forwarded,
    /// or the chunk itself when it changed nothing.
    fn streamed_response_body(
        &mut self,
        r: ProcessingResponse,
        chunk: Vec<u8>,
        eos: bool,
    ) -> ProcessingResponse {
        if is_immediate(&r) {
            self.answered = true;
            return r;
        }
        let body = match common_of(r.response) {
            Some(CommonResponse {
                body_mutation:
                    Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::Body(b)),
                    }),
                ..
            }) => b,
            _ => chunk,
        };
        streamed_chunk(true, body, eos)
    }

    fn unavailable(&mut self, code: &str, message: &str) -> ProcessingResponse {
        self.answered = true;
        let body = serde_json::json!({"error": {
            "message": message, "type": "api_error", "param": null, "code": code}});
        ProcessingResponse {
            response: Some(processing_response::Response::ImmediateResponse(
                ImmediateResponse {
                    status: Some(HttpStatus { code: 503 }),
                    headers: Some(HeaderMutation {
                        set_headers: vec![HeaderValueOption {
                            header: Some(HeaderValue {
                                key: "content-type".into(),
                                value: String::new(),
                                raw_value: b"application/json".to_vec(),
                            }),
                            ..Default::default()
                        }],
                        remove_headers: vec![],
                    }),
                    body: body.to_string().into_bytes(),
                    grpc_status: None,
                    details: format!("llmkube_ext_proc_{code}"),
                },
            )),
            ..Default::default()
        }
    }
}

/// Whether the proxy streams the request body without waiting for the headers answer: what
/// it says on its first message (`protocol_config`), or, when it says nothing (older proxies),
/// assumed, as the protocol requires that mode. Holding the headers answer in any other mode
/// would stall the proxy until its message timeout.
fn full_duplex(msg: &ProcessingRequest) -> bool {
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
    msg.protocol_config
        .as_ref()
        .is_none_or(|p| p.request_body_mode == BodySendMode::FullDuplexStreamed as i32)
}

fn is_immediate(r: &ProcessingResponse) -> bool {
    matches!(
        r.response,
        Some(processing_response::Response::ImmediateResponse(_))
    )
}

fn common_of(r: Option<processing_response::Response>) -> Option<CommonResponse> {
    use processing_response::Response as Rs;
    match r? {
        Rs::RequestHeaders(h) | Rs::ResponseHeaders(h) => h.response,
        Rs::RequestBody(b) | Rs::ResponseBody(b) => b.response,
        _ => None,
    }
}

/// The pod the filter named: the value it set on the destination header. A client's own value
/// the filter left alone is not in the mutation, so it never counts.
fn destination(m: &HeaderMutation) -> Option<String> {
    let set = m.set_headers.iter().rev().find_map(|o| {
        let h = o.header.as_ref()?;
        h.key.eq_ignore_ascii_case(DESTINATION).then(|| {
            if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            }
        })
    })?;
    let pod = set.trim();
    (!pod.is_empty() && pod.parse::<std::net::SocketAddr>().is_ok()).then(|| pod.to_string())
}

/// The attribute (a stream property for the filter, `llmkube.endpoint_subset`) that bounds the
/// filter's pick to the proxy's candidates; whatever else named it is dropped first.
pub const SUBSET_ATTRIBUTE: &str = "llmkube.endpoint_subset";

fn bound_to(msg: &mut ProcessingRequest, candidates: &[String]) {
    for s in msg.attributes.values_mut() {
        s.fields.remove(SUBSET_ATTRIBUTE);
    }
    let mut ours = Struct::default();
    ours.fields.insert(
        SUBSET_ATTRIBUTE.into(),
        Value {
            kind: Some(value::Kind::StringValue(candidates.join(","))),
        },
    );
    msg.attributes
        .insert("llmkube.endpoint_picker".into(), ours);
}

/// The proxy's candidate list, when it sent one (an empty list allows nothing).
fn subset(metadata: &Option<Metadata>, namespace: &str) -> Option<Vec<String>> {
    let ns = metadata.as_ref()?.filter_metadata.get(namespace)?;
    let v = ns.fields.get(SUBSET)?;
    let mut out = Vec::new();
    match &v.kind {
        Some(value::Kind::ListValue(l)) => {
            for item in &l.values {
                if let Some(value::Kind::StringValue(s)) = &item.kind {
                    out.push(s.trim().to_string());
                }
            }
        }
        // Some proxies send the list as one comma-separated string.
        Some(value::Kind::StringValue(s)) => {
            out.extend(s.split(',').map(|p| p.trim().to_string()));
        }
        _ => {}
    }
    Some(out)
}

fn string_struct(key: &str, s: &str) -> Value {
    let mut inner = Struct::default();
    inner.fields.insert(
        key.to_string(),
        Value {
            kind: Some(value::Kind::StringValue(s.to_string())),
        },
    );
    Value {
        kind: Some(value::Kind::StructValue(inner)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn set(key: &str, value: &str) -> HeaderValueOption {
        HeaderValueOption {
            header: Some(HeaderValue {
                key: key.into(),
                value: String::new(),
                raw_value: value.as_bytes().to_vec(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_proxy_that_says_it_buffers_the_body_is_not_full_duplex() {
        use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;
        let mut msg = ProcessingRequest::default();
        assert!(full_duplex(&msg), "unsaid: the protocol's mode");
        msg.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: 4,
            ..Default::default()
        });
        assert!(full_duplex(&msg));
        msg.protocol_config = Some(ProtocolConfiguration {
            request_body_mode: 1,
            ..Default::default()
        });
        assert!(!full_duplex(&msg));
    }

    #[test]
    fn only_a_pod_the_filter_set_counts_and_it_must_be_an_address() {
        let m = HeaderMutation {
            set_headers: vec![
                set("x-llmkube-backend", "b"),
                set(DESTINATION, "10.0.0.7:8000"),
            ],
            remove_headers: vec![],
        };
        assert_eq!(destination(&m).as_deref(), Some("10.0.0.7:8000"));
        let removed = HeaderMutation {
            set_headers: vec![],
            remove_headers: vec![DESTINATION.into()],
        };
        assert_eq!(destination(&removed), None);
        let junk = HeaderMutation {
            set_headers: vec![set(DESTINATION, "metadata.internal")],
            remove_headers: vec![],
        };
        assert_eq!(destination(&junk), None);
    }

    #[test]
    fn the_subset_is_read_as_a_list_or_a_comma_string_and_absent_means_unbounded() {
        let list = |vals: &[&str]| Value {
            kind: Some(value::Kind::ListValue(ListValue {
                values: vals
                    .iter()
                    .map(|s| Value {
                        kind: Some(value::Kind::StringValue(s.to_string())),
                    })
                    .collect(),
            })),
        };
        let md = |v: Value| {
            let mut s = Struct::default();
            s.fields.insert(SUBSET.into(), v);
            let mut m = Metadata::default();
            m.filter_metadata.insert(DEFAULT_SUBSET_NAMESPACE.into(), s);
            Some(m)
        };
        assert_eq!(
            subset(
                &md(list(&["10.0.0.1:80", "10.0.0.2:80"])),
                DEFAULT_SUBSET_NAMESPACE
            ),
            Some(vec!["10.0.0.1:80".into(), "10.0.0.2:80".into()])
        );
        let comma = Value {
            kind: Some(value::Kind::StringValue("10.0.0.1:80, 10.0.0.3:80".into())),
        };
        assert_eq!(
            subset(&md(comma), DEFAULT_SUBSET_NAMESPACE),
            Some(vec!["10.0.0.1:80".into(), "10.0.0.3:80".into()])
        );
        assert_eq!(
            subset(&md(list(&[])), DEFAULT_SUBSET_NAMESPACE),
            Some(vec![])
        );
        assert_eq!(subset(&None, DEFAULT_SUBSET_NAMESPACE), None);
        assert_eq!(subset(&md(list(&["a"])), "other"), None);
    }
}
