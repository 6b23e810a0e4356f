//! The response to a forwarded request, as the model-router filter judges it: what its head
//! says, whether the answering backend must be read from the endpoint, whether a sensitive
//! request reached a tier it must not, and what a final 5xx becomes.

use crate::audit::Outcome;
use crate::config::Tier;
use crate::errors::ApiError;
use crate::headers::ATTEMPT_COUNT_HEADER;

/// How the response to a forwarded request is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseJudge {
    fail_closed: bool,
    sensitive: bool,
    /// The order has other backends Envoy may fail over to.
    alternatives: bool,
}

/// What the response path reads of a response's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// `:status`; 0 when absent or not a number.
    pub status: u32,
    /// `content-type: text/event-stream`.
    pub streaming: bool,
    /// Envoy's attempt count (`include_attempt_count_in_response`); 0 when absent.
    pub attempts: u32,
    /// The attempt count header is there, to be removed (the client needs none of it).
    pub attempt_count_sent: bool,
}

impl ResponseHead {
    /// Reads the response header map (as the host hands it over, names lower-cased).
    pub fn read(pairs: &[(Vec<u8>, Vec<u8>)]) -> Self {
        Self::read_iter(pairs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())))
    }

    /// [`ResponseHead::read`] over borrowed (name, value) pairs.
    pub fn read_iter<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Self {
        let number = |v: &[u8]| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let mut head = ResponseHead {
            status: 0,
            streaming: false,
            attempts: 0,
            attempt_count_sent: false,
        };
        for (k, v) in pairs {
            head.attempt_count_sent |= k.eq_ignore_ascii_case(ATTEMPT_COUNT_HEADER.as_bytes());
            match k {
                b":status" => head.status = number(v),
                b"content-type" => head.streaming = v.starts_with(b"text/event-stream"),
                b"x-envoy-attempt-count" => head.attempts = number(v),
                _ => {}
            }
        }
        head
    }

    /// The host would not hand the map over: nothing is known, and the attempt count header is
    /// removed in case it is there.
    pub fn unreadable() -> Self {
        ResponseHead {
            status: 0,
            streaming: false,
            attempts: 0,
            attempt_count_sent: true,
        }
    }
}

/// The judgement of a response's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    /// The filter answers this instead of the response (the last attempt failed).
    pub replace: Option<ApiError>,
}

impl ResponseJudge {
    /// For a request of a fail-closed rule (or none), sensitive or not, whose attempt order has
    /// other backends Envoy may fail over to (`alternatives`).
    pub fn new(fail_closed: bool, sensitive: bool, alternatives: bool) -> Self {
        ResponseJudge {
            fail_closed,
            sensitive,
            alternatives,
        }
    }

    /// Whether the answering backend must be read from the endpoint: only when it may differ
    /// from the one decided, or to check a sensitive request's tier (the alarm for a route
    /// table that sent it somewhere it must not go).
    pub fn ask_endpoint(&self) -> bool {
        self.alternatives || self.sensitive
    }

    /// A sensitive request answered by a backend of tier `tier` (`None`: the endpoint says no
    /// tier we know) is a violation unless that tier is local.
    pub fn violation(&self, tier: Option<Tier>) -> bool {
        self.sensitive && tier != Some(Tier::Local)
    }

    /// A final 5xx becomes 503 `fail_closed` for a fail-closed rule or a sensitive request,
    /// else 502 `all_backends_failed`; anything else passes with its outcome.
    pub fn verdict(&self, status: u32, streaming: bool) -> Verdict {
        if status >= 500 {
            let (error, outcome) = if self.fail_closed || self.sensitive {
                let err = ApiError::fail_closed(format!(
                    "no eligible backend could serve this request (last status {status}); the rule is fail-closed"
                ));
                (err, Outcome::FailClosedRuntime)
            } else {
                (
                    ApiError::all_backends_failed(status),
                    Outcome::AllBackendsFailed,
                )
            };
            return Verdict {
                outcome,
                replace: Some(error),
            };
        }
        let outcome = match (status, streaming) {
            (200..=299, true) => Outcome::OkStream,
            (200..=299, false) => Outcome::Ok,
            _ => Outcome::UpstreamError,
        };
        Verdict {
            outcome,
            replace: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_response_head_is_read_once() {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = [
            (":status", "200"),
            ("content-type", "text/event-stream; charset=utf-8"),
            ("x-envoy-attempt-count", "3"),
        ]
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        let head = ResponseHead::read(&pairs);
        assert_eq!(
            head,
            ResponseHead {
                status: 200,
                streaming: true,
                attempts: 3,
                attempt_count_sent: true
            }
        );
        let head = ResponseHead::read(&pairs[..1]);
        assert!(!head.streaming && !head.attempt_count_sent && head.attempts == 0);
        let garbage = vec![(b":status".to_vec(), b"2x".to_vec())];
        assert_eq!(ResponseHead::read(&garbage).status, 0);
        assert!(ResponseHead::unreadable().attempt_count_sent);
    }

    #[test]
    fn a_final_5xx_is_replaced_by_the_filter() {
        let open = ResponseJudge::new(false, false, true);
        let closed = ResponseJudge::new(true, false, false);
        let sensitive = ResponseJudge::new(false, true, true);
        let v = open.verdict(503, false);
        assert_eq!(v.outcome, Outcome::AllBackendsFailed);
        assert_eq!(
            v.replace.map(|e| (e.status, e.code)),
            Some((502, "all_backends_failed"))
        );
        for j in [closed, sensitive] {
            let v = j.verdict(500, true);
            assert_eq!(v.outcome, Outcome::FailClosedRuntime);
            assert_eq!(
                v.replace.map(|e| (e.status, e.code)),
                Some((503, "fail_closed"))
            );
        }
        let pass = |status, streaming| {
            let v = open.verdict(status, streaming);
            assert_eq!(v.replace, None);
            v.outcome
        };
        assert_eq!(pass(200, false), Outcome::Ok);
        assert_eq!(pass(204, true), Outcome::OkStream);
        assert_eq!(pass(429, false), Outcome::UpstreamError);
        assert_eq!(pass(0, false), Outcome::UpstreamError);
    }

    #[test]
    fn the_endpoint_is_asked_only_when_it_can_tell_something() {
        assert!(!ResponseJudge::new(true, false, false).ask_endpoint());
        assert!(ResponseJudge::new(false, false, true).ask_endpoint());
        assert!(ResponseJudge::new(false, true, false).ask_endpoint());
    }
}
