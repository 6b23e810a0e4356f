//! What one upstream attempt carries, decided for the per-attempt upstream filter.
//!
//! It is the last point where a request can be stopped before bytes leave for a backend, so a
//! sensitive request is refused here for any backend not shown to be local, whatever the route
//! table said (defense in depth behind the downstream decision).

use crate::config::Tier;
use crate::errors::ApiError;
use crate::headers::{ATTEMPT_BACKEND_HEADER, BACKEND_HEADER, ROUTE_HEADER, RULE_HEADER};
use crate::rewrite::parse_span;
use crate::router::Router;
use crate::scan::Span;

/// Decision headers that name the router's rules, backends and attempt orders; a provider gets
/// none of them. (Envoy keeps header edits across retries: nothing a later attempt needs is here.)
pub const INTERNAL_ROUTING_HEADERS: &[&str] = &[RULE_HEADER, BACKEND_HEADER, ROUTE_HEADER];

/// The attempt as the upstream filter finds it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttemptInputs<'a> {
    /// The downstream filter stamped the request sensitive.
    pub sensitive: bool,
    /// `llmkube.backend` of the endpoint's metadata, when it has one.
    pub endpoint_backend: Option<&'a [u8]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptPlan<'r> {
    /// The endpoint is no backend of this router and the request is not sensitive: nothing of
    /// ours to add.
    Unidentified,
    /// Refused before sending. `prevented` names the cloud backend a sensitive request was
    /// about to reach (a violation prevented: counted and logged).
    Refuse {
        error: ApiError,
        prevented: Option<&'r str>,
    },
    Send(Send<'r>),
}

/// An attempt that goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Send<'r> {
    /// Headers to set, in order: the attempt's backend (for the per-backend credential
    /// injectors) and the provider's version header.
    pub set: Vec<(&'static str, &'r str)>,
    /// Headers to remove.
    pub remove: &'static [&'static str],
    /// The body's `model` becomes this provider model name.
    pub rewrite_model: Option<&'r str>,
}

/// Plans an attempt of `router`'s request.
pub fn plan_attempt<'r>(router: &'r Router, inputs: AttemptInputs<'_>) -> AttemptPlan<'r> {
    let backend = inputs
        .endpoint_backend
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| router.backend_index(n))
        .map(|i| router.backend(i));
    let Some(b) = backend else {
        // An endpoint we cannot identify cannot be shown to be local.
        if inputs.sensitive {
            return AttemptPlan::Refuse {
                error: ApiError::fail_closed(
                    "request is sensitive and the upstream endpoint carries no llmkube backend metadata".into(),
                ),
                prevented: None,
            };
        }
        return AttemptPlan::Unidentified;
    };
    if inputs.sensitive && b.tier != Tier::Local {
        return AttemptPlan::Refuse {
            error: ApiError::fail_closed(format!(
                "sensitive request may only be served by local-tier backends; backend {:?} is cloud",
                b.name
            )),
            prevented: Some(&b.name),
        };
    }
    let mut set = vec![(ATTEMPT_BACKEND_HEADER, b.name.as_str())];
    let Some(model) = b.external_model.as_deref() else {
        // A local backend: its served model name, when known, is the name its engine answers to.
        return AttemptPlan::Send(Send {
            set,
            remove: &[],
            rewrite_model: b.served_model.as_deref(),
        });
    };
    set.extend(b.provider.and_then(|p| p.version_header()));
    AttemptPlan::Send(Send {
        set,
        remove: INTERNAL_ROUTING_HEADERS,
        rewrite_model: Some(model),
    })
}

/// Where the downstream filter found the body's `model`, and the model it routed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub span: Span,
    /// The body's length when the downstream filter read it.
    pub body_len: usize,
    pub model: String,
}

impl Located {
    /// From the model-span and model headers; `None` unless both are there and well-formed.
    pub fn from_headers(span: Option<&[u8]>, model: Option<&[u8]>) -> Option<Located> {
        let (span, body_len) = parse_span(span?)?;
        let model = std::str::from_utf8(model?).ok()?.to_string();
        Some(Located {
            span,
            body_len,
            model,
        })
    }

    /// The `content-length` this attempt must carry, when the header says otherwise: an earlier
    /// attempt's rewrite left its length behind, and this attempt carries the original body
    /// again until (and unless) it rewrites it.
    pub fn restore_length(&self, content_length: Option<&[u8]>) -> Option<String> {
        let len = self.body_len.to_string();
        content_length
            .is_some_and(|v| v != len.as_bytes())
            .then_some(len)
    }

    /// Whether the body's `model` must become `to`: not when it already names it (the body an
    /// attempt carries is the client's, whatever an earlier attempt rewrote), so that attempt is
    /// not held back to buffer the body for nothing.
    pub fn needs_rewrite(located: Option<&Located>, to: &str) -> bool {
        located.is_none_or(|l| l.model != to)
    }

    /// The span still fits a body of `body_len` bytes, so the rewrite may read only its head.
    pub fn fits(&self, body_len: usize) -> bool {
        self.body_len == body_len && self.span.1 <= body_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Router {
        Router::from_json(
            br#"{"router": "r", "backends": [
                {"name": "loc"},
                {"name": "gpt", "tier": "cloud", "external_model": "gpt-5", "provider": "openai"},
                {"name": "claude", "tier": "cloud", "external_model": "opus", "provider": "anthropic"},
                {"name": "lan", "tier": "local", "external_model": "big", "provider": "litellm"},
                {"name": "vllm", "served_model": "Qwen/Qwen3-8B"}
            ], "default_route": "loc"}"#,
        )
        .unwrap()
    }

    fn plan<'r>(r: &'r Router, sensitive: bool, backend: Option<&str>) -> AttemptPlan<'r> {
        plan_attempt(
            r,
            AttemptInputs {
                sensitive,
                endpoint_backend: backend.map(str::as_bytes),
            },
        )
    }

    #[test]
    fn a_local_backend_is_marked_and_nothing_else() {
        let r = router();
        assert_eq!(
            plan(&r, true, Some("loc")),
            AttemptPlan::Send(Send {
                set: vec![(ATTEMPT_BACKEND_HEADER, "loc")],
                remove: &[],
                rewrite_model: None
            })
        );
    }

    #[test]
    fn a_local_backend_with_a_served_model_name_gets_it() {
        let r = router();
        assert_eq!(
            plan(&r, true, Some("vllm")),
            AttemptPlan::Send(Send {
                set: vec![(ATTEMPT_BACKEND_HEADER, "vllm")],
                remove: &[],
                rewrite_model: Some("Qwen/Qwen3-8B")
            })
        );
        assert_eq!(r.backend(4).rewrite_model(), Some("Qwen/Qwen3-8B"));
        assert_eq!(r.backend(1).rewrite_model(), Some("gpt-5"));
        assert_eq!(r.backend(0).rewrite_model(), None);
    }

    #[test]
    fn an_external_backend_gets_its_model_provider_headers_and_no_internals() {
        let r = router();
        let AttemptPlan::Send(s) = plan(&r, false, Some("claude")) else {
            panic!("refused");
        };
        assert_eq!(
            s.set,
            [
                (ATTEMPT_BACKEND_HEADER, "claude"),
                ("anthropic-version", "2023-06-01")
            ]
        );
        assert_eq!(s.remove, INTERNAL_ROUTING_HEADERS);
        assert_eq!(s.rewrite_model, Some("opus"));
        let AttemptPlan::Send(s) = plan(&r, false, Some("gpt")) else {
            panic!("refused");
        };
        assert_eq!(s.set, [(ATTEMPT_BACKEND_HEADER, "gpt")]);
        // A local external backend (a LAN LiteLLM) may serve sensitive requests.
        assert!(matches!(plan(&r, true, Some("lan")), AttemptPlan::Send(_)));
    }

    #[test]
    fn sensitive_requests_never_leave_for_a_cloud_or_unknown_endpoint() {
        let r = router();
        for cloud in ["gpt", "claude"] {
            match plan(&r, true, Some(cloud)) {
                AttemptPlan::Refuse { error, prevented } => {
                    assert_eq!((error.status, error.code), (503, "fail_closed"));
                    assert_eq!(prevented, Some(cloud));
                }
                other => panic!("{cloud}: {other:?}"),
            }
        }
        for unknown in [None, Some("elsewhere")] {
            match plan(&r, true, unknown) {
                AttemptPlan::Refuse { error, prevented } => {
                    assert_eq!(error.code, "fail_closed");
                    assert_eq!(prevented, None);
                }
                other => panic!("{unknown:?}: {other:?}"),
            }
            assert_eq!(plan(&r, false, unknown), AttemptPlan::Unidentified);
        }
        let bad_utf8 = plan_attempt(
            &r,
            AttemptInputs {
                sensitive: true,
                endpoint_backend: Some(b"\xff"),
            },
        );
        assert!(matches!(
            bad_utf8,
            AttemptPlan::Refuse {
                prevented: None,
                ..
            }
        ));
    }

    #[test]
    fn located_model_and_length_restore() {
        let l = Located::from_headers(Some(b"9-14/30"), Some(b"mix")).unwrap();
        assert_eq!((l.span, l.body_len, l.model.as_str()), ((9, 14), 30, "mix"));
        assert_eq!(l.restore_length(Some(b"30")), None);
        assert_eq!(l.restore_length(Some(b"27")), Some("30".into()));
        assert_eq!(l.restore_length(None), None);
        assert!(l.fits(30) && !l.fits(31));
        assert!(!Located::needs_rewrite(Some(&l), "mix"));
        assert!(Located::needs_rewrite(Some(&l), "Qwen/Qwen3-8B"));
        assert!(
            Located::needs_rewrite(None, "mix"),
            "unknown: rewrite (by a scan)"
        );
        assert_eq!(Located::from_headers(Some(b"9-14/30"), None), None);
        assert_eq!(Located::from_headers(None, Some(b"mix")), None);
        assert_eq!(Located::from_headers(Some(b"garbage"), Some(b"m")), None);
        assert_eq!(Located::from_headers(Some(b"1-2/3"), Some(b"\xff")), None);
    }
}
