//! HTTP callouts (`proxy_http_call`): pending and bounded per VM; the embedder's transport gets
//! them after the callback.

use super::header_maps::deserialize_map;
use crate::embedder::HttpCallRecord;
use crate::hostcall::{slot, tally, BAD_ARGUMENT, C, INTERNAL_FAILURE, INVALID_MEMORY, OK};
use crate::memory::{read, read_str, write_u32};
use crate::state::HostState;
use crate::state::PendingCall;
use crate::types::find_header;
use std::time::Duration;
use wasmtime::Linker;

/// Makes `record` a pending callout of the current context (bounded per VM), its token written
/// at `ret`; the embedder's transport gets it after the callback.
pub(crate) fn register_call(c: &mut C<'_>, mut record: HttpCallRecord, ret: i32) -> i32 {
    let st = c.data();
    if st.pending_calls.len() >= st.opts.limits.max_pending_calls {
        return INTERNAL_FAILURE;
    }
    // Tokens wrap in a long-lived VM; 0 is never handed out.
    let token = st.next_token.max(1);
    if !write_u32(c, ret, token) {
        return INVALID_MEMORY;
    }
    let st = c.data_mut();
    st.next_token = token.wrapping_add(1);
    record.token = token;
    record.context_id = st.effective;
    let deadline_nanos = st.opts.clock.monotonic_nanos() + record.timeout.as_nanos() as u64;
    st.pending_calls.insert(
        token,
        PendingCall {
            record,
            deadline_nanos,
        },
    );
    st.new_calls.push(token);
    OK
}

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         us: i32,
         hp: i32,
         hs: i32,
         bp: i32,
         bs: i32,
         tp: i32,
         ts: i32,
         timeout: i32,
         ret: i32|
         -> i32 {
            tally(&mut c, const { slot("proxy_http_call") });
            let (Some(upstream), Some(h), Some(body), Some(t)) = (
                read_str(&mut c, up, us),
                read(&mut c, hp, hs),
                read(&mut c, bp, bs),
                read(&mut c, tp, ts),
            ) else {
                return INVALID_MEMORY;
            };
            let (Some(headers), Some(trailers)) = (deserialize_map(&h), deserialize_map(&t)) else {
                return BAD_ARGUMENT;
            };
            let st = c.data();
            if let Some(known) = &st.opts.known_clusters {
                if !known.contains(&upstream) {
                    return BAD_ARGUMENT;
                }
            }
            // Envoy needs these to build the request.
            if ![":method", ":path", ":authority"]
                .iter()
                .all(|n| find_header(&headers, n).is_some())
            {
                return BAD_ARGUMENT;
            }
            let record = HttpCallRecord {
                token: 0,
                context_id: 0,
                upstream,
                headers,
                body,
                trailers,
                timeout: Duration::from_millis(timeout as u32 as u64),
                grpc: None,
            };
            register_call(&mut c, record, ret)
        },
    )?;
    Ok(())
}
