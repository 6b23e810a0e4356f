//! `spec.policy.auth` as every target reads it: the JWT provider a gateway verifies tokens
//! with, the header its verified team claim lands in, and the allowlists the filter enforces.
//!
//! Authentication is the gateway's own (Envoy's `jwt_authn`, an Envoy Gateway `SecurityPolicy`,
//! agentgateway's `jwtAuth`); authorization is the filter's, from the plugin config's `auth`.

use router_core::allow::{AllowConfig, AllowEntry};

use crate::model::{Jwt, ModelRouterSpec, DEFAULT_TEAM_HEADER};
use crate::url::{parse_url, ParsedUrl};

/// The JWT provider of a validated spec.
#[derive(Debug, Clone)]
pub struct JwtPolicy<'a> {
    pub jwt: &'a Jwt,
    /// Lower-cased `headerKey` (default `x-llmkube-team`).
    pub team_header: String,
    /// `jwksURI`, parsed (`None` only if validation was skipped and it does not parse).
    pub jwks: Option<ParsedUrl>,
}

pub fn jwt(spec: &ModelRouterSpec) -> Option<JwtPolicy<'_>> {
    let jwt = spec.policy.as_ref()?.auth.as_ref()?.jwt.as_ref()?;
    Some(JwtPolicy {
        jwt,
        team_header: team_header(jwt),
        jwks: parse_url(&jwt.jwks_uri).ok(),
    })
}

pub fn team_header(jwt: &Jwt) -> String {
    jwt.header_key
        .as_deref()
        .unwrap_or(DEFAULT_TEAM_HEADER)
        .to_ascii_lowercase()
}

/// Whether the spec asks for authentication or authorization at all.
pub fn is_set(spec: &ModelRouterSpec) -> bool {
    spec.policy
        .as_ref()
        .and_then(|p| p.auth.as_ref())
        .is_some_and(|a| a.jwt.is_some() || !a.allowlists.is_empty())
}

/// The filter's part: the allowlists and the header the verified team is read from. `None`
/// when no allowlist is set (authentication only: every verified team reaches every model).
pub fn allow_config(spec: &ModelRouterSpec) -> Option<AllowConfig> {
    let auth = spec.policy.as_ref()?.auth.as_ref()?;
    if auth.allowlists.is_empty() {
        return None;
    }
    let team_header = auth
        .jwt
        .as_ref()
        .map(team_header)
        .unwrap_or_else(|| DEFAULT_TEAM_HEADER.to_string());
    Some(AllowConfig {
        team_header,
        allowlists: auth
            .allowlists
            .iter()
            .map(|a| AllowEntry {
                team: a.team.clone(),
                models: a.models.clone(),
            })
            .collect(),
    })
}
