//! Client-facing errors in OpenAI's shape, with the statuses and codes README.md (Behaviour) lists,
//! or in Anthropic's shape on the Messages API path (`ErrorShape`), same statuses.
//! Messages name the field or limit involved so a client can act on them.

use crate::scan::ScanError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u32,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<&'static str>,
    pub message: String,
}

impl ApiError {
    fn new(status: u32, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind,
            code,
            param: None,
            message,
        }
    }

    fn param(mut self, p: &'static str) -> Self {
        self.param = Some(p);
        self
    }

    pub fn from_scan(e: &ScanError) -> Self {
        match e {
            ScanError::Invalid { at, what } => ApiError::new(
                400,
                INVALID_REQUEST,
                "invalid_json",
                format!("request body is not valid JSON: {what} at byte {at}"),
            ),
            ScanError::TooDeep => ApiError::new(
                400,
                INVALID_REQUEST,
                "invalid_json",
                format!(
                    "request body nests deeper than {} levels",
                    crate::scan::MAX_DEPTH
                ),
            ),
            ScanError::NotObject => ApiError::new(
                400,
                INVALID_REQUEST,
                "invalid_json",
                "request body must be a JSON object".into(),
            ),
            ScanError::DuplicateKey { key, top_level } => ApiError::new(
                400,
                INVALID_REQUEST,
                "duplicate_key",
                if *top_level {
                    format!("request body has the top-level key {key:?} more than once")
                } else {
                    format!("request body has the key {key:?} more than once in one object")
                },
            ),
            ScanError::MissingModel => ApiError::new(
                400,
                INVALID_REQUEST,
                "missing_model",
                "request body has no non-empty string field \"model\"".into(),
            )
            .param("model"),
            ScanError::ModelNotString => ApiError::new(
                400,
                INVALID_REQUEST,
                "missing_model",
                "request field \"model\" must be a string".into(),
            )
            .param("model"),
        }
    }

    pub fn body_too_large(limit: u64) -> Self {
        ApiError::new(
            413,
            INVALID_REQUEST,
            "request_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn empty_body() -> Self {
        ApiError::new(
            400,
            INVALID_REQUEST,
            "invalid_json",
            "request body is empty; a JSON object with \"model\" is required".into(),
        )
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError::new(
            404,
            INVALID_REQUEST,
            "model_not_found",
            format!(
                "no rule, backend name or default route serves model {:?}",
                crate::scan::printable(model)
            ),
        )
        .param("model")
    }

    pub fn invalid_model(max: usize) -> Self {
        ApiError::new(
            400,
            INVALID_REQUEST,
            "invalid_model",
            format!(
                "request field \"model\" must be at most {max} bytes without control characters"
            ),
        )
        .param("model")
    }

    /// The gateway itself failed; the message says where, never what the request contained.
    pub fn internal(what: &str) -> Self {
        ApiError::new(
            500,
            API_ERROR,
            "internal_error",
            format!("the gateway could not route this request: {what}"),
        )
    }

    pub fn all_backends_failed(last_status: u32) -> Self {
        ApiError::new(
            502,
            API_ERROR,
            "all_backends_failed",
            format!("every backend of the route failed (last status {last_status})"),
        )
    }

    /// `policy.auth.allowlists` does not let this request's verified team reach `model`.
    pub fn model_not_allowed(
        team_header: &str,
        team: &str,
        model: &str,
        why: &crate::allow::Denied,
    ) -> Self {
        use crate::allow::Denied;
        use crate::scan::printable;
        let message = match why {
            Denied::NoTeam => format!("no verified team ({team_header}): the allowlists of this router grant models to named teams only"),
            Denied::SeveralTeams => format!("the request carries more than one {team_header} value; exactly one verified team is required"),
            Denied::UnknownTeam => format!("team {:?} is not in this router's allowlists", printable(team)),
            Denied::Model => format!("team {:?} may not use model {:?}", printable(team), printable(model)),
        };
        ApiError::new(403, PERMISSION_ERROR, "model_not_allowed", message).param("model")
    }

    /// Every pod of an endpoint-picked backend is quarantined and the route has no backend after
    /// it to fall back to.
    pub fn no_eligible_pod(backend: &str) -> Self {
        ApiError::new(
            503,
            API_ERROR,
            "no_eligible_pod",
            format!("every pod of backend {backend} is quarantined after failures; retry later"),
        )
    }

    pub fn fail_closed(message: String) -> Self {
        ApiError::new(503, API_ERROR, "fail_closed", message)
    }

    /// `GET /v1/models/{id}` for an id `/v1/models` does not list.
    pub fn model_not_listed(id: &str) -> Self {
        ApiError::new(
            404,
            INVALID_REQUEST,
            "model_not_found",
            format!(
                "the model {:?} does not exist: GET /v1/models lists the models this gateway serves",
                crate::scan::printable(id)
            ),
        )
        .param("model")
    }

    /// Anthropic's error type for this error's status (the Messages API's names; its SDK picks
    /// the exception class by status, the type is what `error.type` says).
    pub fn anthropic_type(&self) -> &'static str {
        match self.status {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The body in `shape`: OpenAI's (`body`), or Anthropic's `{"type":"error","error":{"type",
    /// "message","details":{"error_code"}},"request_id"}` (the request id only when known; the
    /// stable code where Anthropic's SDKs read `error_code`).
    pub fn body_in(&self, shape: ErrorShape, request_id: Option<&str>) -> Vec<u8> {
        match shape {
            ErrorShape::OpenAi => self.body(),
            ErrorShape::Anthropic => {
                #[derive(serde::Serialize)]
                struct Details<'a> {
                    error_code: &'a str,
                }
                #[derive(serde::Serialize)]
                struct Inner<'a> {
                    #[serde(rename = "type")]
                    kind: &'a str,
                    message: &'a str,
                    details: Details<'a>,
                }
                #[derive(serde::Serialize)]
                struct Outer<'a> {
                    #[serde(rename = "type")]
                    kind: &'a str,
                    error: Inner<'a>,
                    #[serde(skip_serializing_if = "Option::is_none")]
                    request_id: Option<&'a str>,
                }
                serde_json::to_vec(&Outer {
                    kind: "error",
                    error: Inner {
                        kind: self.anthropic_type(),
                        message: &self.message,
                        details: Details {
                            error_code: self.code,
                        },
                    },
                    request_id,
                })
                .unwrap_or_default()
            }
        }
    }

    /// `{"error":{"message":…,"type":…,"param":…,"code":…}}`, in OpenAI's field order.
    pub fn body(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: &'a str,
        }
        #[derive(serde::Serialize)]
        struct Outer<'a> {
            error: Inner<'a>,
        }
        serde_json::to_vec(&Outer {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param,
                code: self.code,
            },
        })
        .unwrap_or_default()
    }
}

/// Which API's error body a client gets: Anthropic's on the Messages API path, else OpenAI's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorShape {
    #[default]
    OpenAi,
    Anthropic,
}

/// The Messages API path, whose clients (the Anthropic SDKs) read Anthropic's error shape.
pub const MESSAGES_PATH: &str = "/v1/messages";

impl ErrorShape {
    /// The shape for a request to `path` (the query string ignored).
    pub fn for_path(path: &[u8]) -> Self {
        let path = path.split(|&b| b == b'?').next().unwrap_or_default();
        if path == MESSAGES_PATH.as_bytes() {
            ErrorShape::Anthropic
        } else {
            ErrorShape::OpenAi
        }
    }
}

pub const INVALID_REQUEST: &str = "invalid_request_error";
pub const API_ERROR: &str = "api_error";
pub const PERMISSION_ERROR: &str = "permission_error";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::model_not_found("gpt-\u{7}x");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(e.status, 404);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(
            v["error"]["message"],
            "no rule, backend name or default route serves model \"gpt-?x\""
        );
        assert!(String::from_utf8(e.body())
            .unwrap()
            .starts_with(r#"{"error":{"message":"#));
        let t = ApiError::body_too_large(1024);
        let v: serde_json::Value = serde_json::from_slice(&t.body()).unwrap();
        assert_eq!(t.status, 413);
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("1024 bytes"));
    }

    #[test]
    fn messages_path_errors_have_anthropic_shape_and_type_names() {
        assert_eq!(ErrorShape::for_path(b"/v1/messages"), ErrorShape::Anthropic);
        assert_eq!(
            ErrorShape::for_path(b"/v1/messages?beta=true"),
            ErrorShape::Anthropic
        );
        for other in [
            &b"/v1/chat/completions"[..],
            b"/v1/messages/batches",
            b"/v1/models",
            b"",
        ] {
            assert_eq!(ErrorShape::for_path(other), ErrorShape::OpenAi);
        }
        let cases = [
            (
                ApiError::from_scan(&ScanError::NotObject),
                "invalid_request_error",
            ),
            (ApiError::model_not_found("x"), "not_found_error"),
            (ApiError::body_too_large(1), "request_too_large"),
            (
                ApiError::model_not_allowed("x-team", "t", "m", &crate::allow::Denied::Model),
                "permission_error",
            ),
            (ApiError::all_backends_failed(500), "api_error"),
            (ApiError::internal("x"), "api_error"),
            (ApiError::fail_closed("q".into()), "overloaded_error"),
        ];
        for (e, want) in cases {
            let v: serde_json::Value =
                serde_json::from_slice(&e.body_in(ErrorShape::Anthropic, Some("r-1"))).unwrap();
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], want, "{}", e.code);
            assert_eq!(v["error"]["message"], e.message.as_str());
            assert_eq!(v["error"]["details"]["error_code"], e.code);
            assert_eq!(v["request_id"], "r-1");
            assert_eq!(v.as_object().unwrap().len(), 3);
        }
        let mut e = ApiError::body_too_large(1);
        e.status = 429;
        assert_eq!(e.anthropic_type(), "rate_limit_error");
        e.status = 401;
        assert_eq!(e.anthropic_type(), "authentication_error");
        let v: serde_json::Value =
            serde_json::from_slice(&e.body_in(ErrorShape::Anthropic, None)).unwrap();
        assert!(v.get("request_id").is_none());
        assert_eq!(e.body_in(ErrorShape::OpenAi, Some("r")), e.body());
        let nf = ApiError::model_not_listed("nope");
        assert_eq!(
            (nf.status, nf.code, nf.param),
            (404, "model_not_found", Some("model"))
        );
    }

    #[test]
    fn scan_errors_map_to_documented_codes() {
        let code = |e: ScanError| ApiError::from_scan(&e).code;
        assert_eq!(
            code(ScanError::Invalid { at: 1, what: "x" }),
            "invalid_json"
        );
        assert_eq!(code(ScanError::TooDeep), "invalid_json");
        assert_eq!(code(ScanError::NotObject), "invalid_json");
        assert_eq!(
            code(ScanError::DuplicateKey {
                key: "model".into(),
                top_level: true
            }),
            "duplicate_key"
        );
        assert_eq!(code(ScanError::MissingModel), "missing_model");
        assert_eq!(code(ScanError::ModelNotString), "missing_model");
    }
}
