//! `FULL_DUPLEX_STREAMED` body modes (Envoy's, and agentgateway's `fullDuplexStreamed`, the only
//! mode in which agentgateway v1.3.1 streams a response body to ext_proc).
//!
//! In this mode the gateway sends body chunks as they arrive, without waiting for an answer to
//! the headers or to the previous chunk, and forwards only what the server sends back as
//! `streamed_response` chunks. Answers are therefore not one per message: the headers answer is
//! held until the filter lets its headers through (the request's decision needs the whole body),
//! a chunk the filter holds gets no answer and comes back inside a later one, and the last
//! answer carries `end_of_stream`. Order is the gateway's contract: the headers answer first,
//! then body chunks, then trailers.
//!
//! The mode in force comes from the first message's `protocol_config`; without one the stream is
//! answered as before (one answer per message, `BUFFERED`/`STREAMED` semantics).

use super::{
    common, decision_metadata, mutation, pairs, refs, reply, streamed_chunk, Duplex, Exchange,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, processing_response, HttpBody, HttpTrailers, ProcessingRequest,
    ProcessingResponse, TrailersResponse,
};
use llmkube_wasm_runtime::StreamOutcome;

impl Exchange<'_> {
    /// Every answer one message calls for, in order (none, one, or the held headers answer
    /// followed by body). The service sends them all.
    pub async fn answers(&mut self, msg: ProcessingRequest) -> Vec<ProcessingResponse> {
        use processing_request::Request as Rq;
        if let Some(pc) = &msg.protocol_config {
            self.duplex = Duplex::of(pc);
        }
        let duplex = !self.answered
            && !msg.observability_mode
            && match &msg.request {
                Some(Rq::RequestHeaders(h)) => self.duplex.request && !h.end_of_stream,
                Some(Rq::RequestBody(_) | Rq::RequestTrailers(_)) => self.duplex.request,
                Some(Rq::ResponseHeaders(h)) => self.duplex.response && !h.end_of_stream,
                Some(Rq::ResponseBody(_) | Rq::ResponseTrailers(_)) => self.duplex.response,
                None => false,
            };
        if !duplex {
            return self.handle(msg).await.into_iter().collect();
        }
        let response_side = matches!(
            &msg.request,
            Some(Rq::ResponseHeaders(_) | Rq::ResponseBody(_) | Rq::ResponseTrailers(_))
        );
        let r = match msg.request {
            // The headers callback runs as in the other modes; its answer goes out only once the
            // filter let the headers through, else it waits for the body's.
            Some(Rq::RequestHeaders(_) | Rq::ResponseHeaders(_)) => {
                let decided_before = self.decided(response_side);
                self.handle(msg).await.map(|answer| {
                    let passed = self.decided(response_side) && !decided_before;
                    if self.answered || passed {
                        vec![answer]
                    } else {
                        Vec::new()
                    }
                })
            }
            Some(Rq::RequestBody(b)) => Some(self.duplex_body(b, false).await),
            Some(Rq::ResponseBody(b)) => Some(self.duplex_body(b, true).await),
            Some(Rq::RequestTrailers(t)) => Some(self.duplex_trailers(t, false).await),
            Some(Rq::ResponseTrailers(t)) => Some(self.duplex_trailers(t, true).await),
            None => None,
        };
        r.unwrap_or_default()
    }

    fn decided(&self, response: bool) -> bool {
        if response {
            self.response.decided
        } else {
            self.request.decided
        }
    }

    async fn duplex_body(&mut self, b: HttpBody, response: bool) -> Vec<ProcessingResponse> {
        let eos = b.end_of_stream;
        let r = async {
            let seat = self.seat()?;
            let (out, forwarded) = self
                .run(
                    seat,
                    response,
                    |vm, id| {
                        if response {
                            vm.response_body(id, &b.body, eos).map(drop)
                        } else {
                            vm.request_body(id, &b.body, eos).map(drop)
                        }
                    },
                    |out| out.complete || !eos,
                )
                .await?;
            Ok::<_, String>((out, forwarded))
        }
        .await;
        match r {
            Ok((out, forwarded)) => self
                .flush(response, &out, forwarded, eos, eos)
                .unwrap_or_else(|why| vec![self.fail_closed(&why)]),
            Err(why) => vec![self.fail_closed(&why)],
        }
    }

    async fn duplex_trailers(
        &mut self,
        t: HttpTrailers,
        response: bool,
    ) -> Vec<ProcessingResponse> {
        let trailers = pairs(t.trailers.map(|m| m.headers).unwrap_or_default());
        let r = async {
            let seat = self.seat()?;
            let held = trailers.clone();
            self.run(
                seat,
                response,
                |vm, id| {
                    let t = refs(&held);
                    if response {
                        vm.response_trailers(id, &t).map(drop)
                    } else {
                        vm.request_trailers(id, &t).map(drop)
                    }
                },
                |out| out.complete,
            )
            .await
        }
        .await;
        let (out, forwarded) = match r {
            Ok(r) => r,
            Err(why) => return vec![self.fail_closed(&why)],
        };
        // The body ends with the trailers: its last chunk says so by being followed by them.
        let mut answers = match self.flush(response, &out, forwarded, true, false) {
            Ok(a) => a,
            Err(why) => return vec![self.fail_closed(&why)],
        };
        if self.answered {
            return answers;
        }
        let r = TrailersResponse {
            header_mutation: out
                .forwarded_trailers
                .as_ref()
                .map(|fwd| mutation(&trailers, fwd)),
        };
        answers.push(reply(
            if response {
                processing_response::Response::ResponseTrailers(r)
            } else {
                processing_response::Response::RequestTrailers(r)
            },
            None,
        ));
        answers
    }

    /// What the filter let through after a body chunk or the trailers: the held headers answer
    /// (once), then the forwarded bytes as one streamed chunk. `end` says the direction's data
    /// is all in (the last chunk, or trailers); `eos_chunk` whether the streamed chunk ends it.
    fn flush(
        &mut self,
        response: bool,
        out: &StreamOutcome,
        forwarded: Vec<u8>,
        end: bool,
        eos_chunk: bool,
    ) -> Result<Vec<ProcessingResponse>, String> {
        if let Some(lr) = &out.local_response {
            return Ok(vec![self.immediate(lr)]);
        }
        let mut answers = Vec::new();
        if !self.decided(response) {
            let Some(fwd) = &out.forwarded_headers else {
                if end {
                    return Err(format!(
                        "the filter neither answered nor passed the {} after its whole body",
                        side(response)
                    ));
                }
                // Still deciding: the chunk is held in the filter's buffer.
                return Ok(answers);
            };
            answers.push(self.headers_answer(response, fwd));
        }
        if end && !out.complete {
            return Err(format!(
                "the filter holds the {} after its whole body and has no callout out",
                side(response)
            ));
        }
        if !forwarded.is_empty() || eos_chunk {
            answers.push(streamed_chunk(response, forwarded, eos_chunk));
        }
        Ok(answers)
    }

    fn headers_answer(&mut self, response: bool, fwd: &[(String, String)]) -> ProcessingResponse {
        let fwd = fwd.to_vec();
        let m = self.side(response).decide(&fwd).unwrap_or_default();
        let metadata = if response {
            None
        } else {
            decision_metadata(&fwd)
        };
        let headers = envoy_types::pb::envoy::service::ext_proc::v3::HeadersResponse {
            response: Some(common(m, None)),
        };
        reply(
            if response {
                processing_response::Response::ResponseHeaders(headers)
            } else {
                processing_response::Response::RequestHeaders(headers)
            },
            metadata,
        )
    }
}

fn side(response: bool) -> &'static str {
    if response {
        "response"
    } else {
        "request"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phases::FULL_DUPLEX_STREAMED;
    use crate::pool::Pool;
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    use envoy_types::pb::envoy::service::ext_proc::v3::{body_mutation, ProtocolConfiguration};
    use processing_response::Response as Rs;

    /// Holds the request headers and buffers the body until its end (as the routing filter
    /// does), passes trailers and the whole response.
    const DECIDES_ON_THE_WHOLE_BODY: &str = r#"(module (memory (export "memory") 1)
      (func (export "proxy_on_memory_allocate") (param i32) (result i32) i32.const 1024)
      (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) i32.const 1)
      (func (export "proxy_on_request_body") (param i32 i32 i32) (result i32)
        (i32.eqz (local.get 2)))
      (func (export "proxy_on_request_trailers") (param i32 i32) (result i32) i32.const 0))"#;

    fn pool() -> Pool {
        let module =
            llmkube_wasm_runtime::WasmModule::compile(DECIDES_ON_THE_WHOLE_BODY.as_bytes())
                .unwrap();
        let opts = llmkube_wasm_runtime::VmOptions {
            // As the server runs it (Envoy's default since 1.30).
            allow_on_headers_stop_iteration: true,
            ..Default::default()
        };
        Pool::new(module, opts, 1, None).unwrap()
    }

    fn msg(r: processing_request::Request) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(r),
            ..Default::default()
        }
    }

    fn first_headers(response: bool) -> ProcessingRequest {
        let mut m = super::super::tests::headers_msg(response, false);
        if !response {
            m.protocol_config = Some(ProtocolConfiguration {
                request_body_mode: FULL_DUPLEX_STREAMED,
                response_body_mode: FULL_DUPLEX_STREAMED,
                ..Default::default()
            });
        }
        m
    }

    fn body(response: bool, bytes: &[u8], eos: bool) -> ProcessingRequest {
        let b = HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        };
        msg(if response {
            processing_request::Request::ResponseBody(b)
        } else {
            processing_request::Request::RequestBody(b)
        })
    }

    /// What each answer is: `H` headers, `B(bytes, eos)` a streamed chunk, `T` trailers.
    fn kinds(answers: &[ProcessingResponse]) -> Vec<String> {
        answers
            .iter()
            .map(|a| match a.response.as_ref().unwrap() {
                Rs::RequestHeaders(_) | Rs::ResponseHeaders(_) => "H".to_string(),
                Rs::RequestBody(b) | Rs::ResponseBody(b) => {
                    match b
                        .response
                        .as_ref()
                        .unwrap()
                        .body_mutation
                        .as_ref()
                        .unwrap()
                        .mutation
                    {
                        Some(body_mutation::Mutation::StreamedResponse(ref s)) => format!(
                            "B({},{})",
                            String::from_utf8_lossy(&s.body),
                            s.end_of_stream
                        ),
                        ref other => panic!("not a streamed chunk: {other:?}"),
                    }
                }
                Rs::RequestTrailers(_) | Rs::ResponseTrailers(_) => "T".to_string(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn the_headers_answer_waits_for_the_decision_and_held_chunks_come_back_together() {
        let pool = pool();
        block_on(async {
            let mut x = Exchange::new(&pool);
            assert!(x.answers(first_headers(false)).await.is_empty());
            assert!(x.answers(body(false, b"ab", false)).await.is_empty());
            let at_end = x.answers(body(false, b"cd", true)).await;
            assert_eq!(kinds(&at_end), ["H", "B(abcd,true)"]);
            // The response passes chunk by chunk, its headers answered at once.
            assert_eq!(kinds(&x.answers(first_headers(true)).await), ["H"]);
            assert_eq!(
                kinds(&x.answers(body(true, b"data: 1\n\n", false)).await),
                ["B(data: 1\n\n,false)"]
            );
            assert_eq!(kinds(&x.answers(body(true, b"", true)).await), ["B(,true)"]);
            x.finish();
        });
    }

    #[test]
    fn trailers_end_the_body_after_its_last_chunk() {
        let pool = pool();
        block_on(async {
            let mut x = Exchange::new(&pool);
            assert!(x.answers(first_headers(false)).await.is_empty());
            assert!(x.answers(body(false, b"ab", false)).await.is_empty());
            let trailers = msg(processing_request::Request::RequestTrailers(HttpTrailers {
                trailers: Some(HeaderMap {
                    headers: vec![HeaderValue {
                        key: "x-checksum".into(),
                        value: "1".into(),
                        raw_value: vec![],
                    }],
                }),
            }));
            assert_eq!(kinds(&x.answers(trailers).await), ["H", "B(ab,false)", "T"]);
            x.finish();
        });
    }

    #[test]
    fn without_protocol_config_a_stream_is_answered_one_message_at_a_time() {
        let pool = pool();
        block_on(async {
            let mut x = Exchange::new(&pool);
            let mut first = first_headers(false);
            first.protocol_config = None;
            // The BUFFERED answer to held headers: an empty headers response.
            assert_eq!(kinds(&x.answers(first).await), ["H"]);
            x.finish();
        });
    }
}
