//! External providers: what an attempt to one must carry.
//!
//! The generator writes the credential (from a Secret) into the gateway's own credential
//! injection in the form `Credential` describes; the upstream filter sets the version header and
//! clears every provider header on each attempt, so one attempt's credential never reaches the
//! next backend.

use serde::{Deserialize, Serialize};

/// `BackendConfig.provider` on the wire: `openai`, `anthropic`, `litellm`, `bedrock`,
/// `vertex_ai`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    Openai,
    Anthropic,
    Litellm,
    Bedrock,
    VertexAi,
}

/// How a provider wants its API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credential {
    /// Lower-cased header name.
    pub header: &'static str,
    /// Prepended to the key (`Bearer `), or empty for the raw key.
    pub prefix: &'static str,
}

impl Credential {
    /// The header value for `key`.
    pub fn value(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

const BEARER: Credential = Credential {
    header: "authorization",
    prefix: "Bearer ",
};
const ANTHROPIC_KEY: Credential = Credential {
    header: "x-api-key",
    prefix: "",
};

impl Provider {
    pub const ALL: [Provider; 5] = [
        Provider::Openai,
        Provider::Anthropic,
        Provider::Litellm,
        Provider::Bedrock,
        Provider::VertexAi,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Litellm => "litellm",
            Provider::Bedrock => "bedrock",
            Provider::VertexAi => "vertex_ai",
        }
    }

    pub fn parse(s: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The header and form its API key travels in.
    pub fn credential(self) -> Credential {
        match self {
            Provider::Anthropic => ANTHROPIC_KEY,
            _ => BEARER,
        }
    }

    /// The API version header the provider requires on every request, if any.
    pub fn version_header(self) -> Option<(&'static str, &'static str)> {
        match self {
            Provider::Anthropic => Some(("anthropic-version", "2023-06-01")),
            _ => None,
        }
    }

    /// The conventional Secret key holding this provider's credential.
    pub fn secret_key(self) -> &'static str {
        match self {
            Provider::Anthropic => "ANTHROPIC_API_KEY",
            Provider::Openai => "OPENAI_API_KEY",
            Provider::Litellm => "LITELLM_MASTER_KEY",
            Provider::Bedrock => "AWS_SECRET_ACCESS_KEY",
            Provider::VertexAi => "GOOGLE_APPLICATION_CREDENTIALS",
        }
    }

    /// Published base URL of a first-party provider that needs no request signing.
    pub fn default_url(self) -> Option<&'static str> {
        match self {
            Provider::Anthropic => Some("https://api.anthropic.com"),
            Provider::Openai => Some("https://api.openai.com"),
            _ => None,
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every header some provider's credential or version travels in, each once: an attempt clears
/// them all before the gateway adds the ones its backend needs.
pub fn provider_headers() -> Vec<&'static str> {
    let mut names = Vec::new();
    for p in Provider::ALL {
        let version = p.version_header().map(|(name, _)| name);
        for name in std::iter::once(p.credential().header).chain(version) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::CREDENTIAL_HEADERS;

    #[test]
    fn wire_names_round_trip() {
        for p in Provider::ALL {
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.as_str()));
            assert_eq!(serde_json::from_str::<Provider>(&json).unwrap(), p);
            assert_eq!(Provider::parse(p.as_str()), Some(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(Provider::parse("Anthropic"), None);
        assert!(serde_json::from_str::<Provider>("\"azure\"").is_err());
    }

    #[test]
    fn credentials_and_versions() {
        assert_eq!(Provider::Openai.credential().value("k"), "Bearer k");
        assert_eq!(Provider::Litellm.credential().header, "authorization");
        let a = Provider::Anthropic.credential();
        assert_eq!((a.header, a.value("k").as_str()), ("x-api-key", "k"));
        assert_eq!(
            Provider::Anthropic.version_header(),
            Some(("anthropic-version", "2023-06-01"))
        );
        assert_eq!(Provider::Openai.version_header(), None);
        for p in Provider::ALL {
            assert!(CREDENTIAL_HEADERS.contains(&p.credential().header), "{p}");
        }
    }

    #[test]
    fn every_provider_header_is_cleared_once() {
        assert_eq!(
            provider_headers(),
            ["authorization", "x-api-key", "anthropic-version"]
        );
    }
}
