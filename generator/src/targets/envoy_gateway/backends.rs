//! One AIServiceBackend + Backend per backend of the router, and a BackendSecurityPolicy for
//! each external credential. Envoy AI Gateway translates to the provider's API and signs AWS
//! Bedrock / GCP Vertex AI requests itself, so those providers work here (the envoy target
//! refuses them). Credentials are Secret references only.

use std::net::IpAddr;

use router_core::attempt::INTERNAL_ROUTING_HEADERS;
use router_core::provider::provider_headers;
use serde_json::{json, Value};

use super::names;
use super::{metadata, object};
use crate::ir::{Backend, External, Ir};
use crate::model::Provider;
use crate::{Diagnostics, Problem};

const AIG_API: &str = "aigateway.envoyproxy.io/v1beta1";
const EG_API: &str = "gateway.envoyproxy.io/v1alpha1";

/// The Secret key Envoy AI Gateway reads for each credential type.
fn ai_gateway_secret_key(p: Provider) -> &'static str {
    match p {
        Provider::Bedrock => "credentials",
        Provider::VertexAi => "service_account.json",
        _ => "apiKey",
    }
}

/// Problems with the external backends as this target serves them: a provider whose region or
/// project cannot be read from its URL, and Secrets that lack the key Envoy AI Gateway reads.
pub(super) fn check(ir: &Ir, diags: &mut Diagnostics) {
    for (i, b) in ir.backends.iter().enumerate() {
        let Some(e) = b.external() else { continue };
        if let Err(why) = cloud_location(e) {
            diags.error(Problem::new(
                &ir.label,
                format!("spec.backends[{i}].external.url"),
                why,
            ));
        }
        if let Some(why) = untranslated_api(e.provider) {
            diags.warn(Problem::new(
                &ir.label,
                format!("spec.backends[{i}].external.provider"),
                format!("{why}: a request of that API the filter routes to backend {} fails in Envoy AI Gateway's upstream filter", b.name),
            ));
        }
        let Some(c) = &e.credential else { continue };
        let key = ai_gateway_secret_key(e.provider);
        let has_key = c
            .secret_keys
            .as_ref()
            .is_some_and(|keys| keys.iter().any(|k| k == key));
        if !has_key {
            diags.warn(Problem::new(
                &ir.label,
                format!("spec.backends[{i}].external.credentialsSecretRef.name"),
                format!("Envoy AI Gateway reads the credential from key {key:?} of Secret {}/{} (the ModelRouter convention is {}): add that key to the Secret", c.secret.namespace, c.secret.name, c.secret.key),
            ));
        }
    }
}

/// The client API Envoy AI Gateway v1.1.0 cannot send to a provider's schema
/// (`internal/endpointspec/endpointspec.go`, the `GetTranslator` of each endpoint): chat
/// completions have no translator to the native `Anthropic` schema, and `/v1/messages` none to
/// `GCPVertexAI`.
fn untranslated_api(p: Provider) -> Option<&'static str> {
    match p {
        Provider::Anthropic => Some("Envoy AI Gateway v1.1.0 sends only /v1/messages (Anthropic API) requests to an Anthropic-schema backend, not /v1/chat/completions (no translation from the OpenAI API to it; the envoy target forwards those to Anthropic's OpenAI-compatible endpoint); for OpenAI-API clients reach Claude through provider bedrock or litellm"),
        Provider::VertexAi => Some("Envoy AI Gateway v1.1.0 does not send /v1/messages (Anthropic API) requests to a GCPVertexAI-schema backend; OpenAI-API requests are translated"),
        _ => None,
    }
}

/// AWS region or GCP project/region of a signing provider, from its URL
/// (`bedrock-runtime.<region>.amazonaws.com`; `<region>-aiplatform.googleapis.com` with a path
/// `/v1/projects/<project>/locations/<region>`). `Ok(None)` for the other providers.
fn cloud_location(e: &External) -> Result<Option<(Option<String>, String)>, String> {
    let host = e.url.host.as_str();
    match e.provider {
        Provider::Bedrock => host
            .strip_prefix("bedrock-runtime.")
            .and_then(|r| r.strip_suffix(".amazonaws.com"))
            .filter(|r| !r.is_empty() && !r.contains('.'))
            .map(|r| Some((None, r.to_string())))
            .ok_or_else(|| format!("the AWS region is read from the URL: use https://bedrock-runtime.<region>.amazonaws.com, not {host:?}")),
        Provider::VertexAi => {
            let parts: Vec<&str> = e.url.path.split('/').collect();
            match parts.as_slice() {
                ["", "v1", "projects", project, "locations", region, ..]
                    if !project.is_empty() && !region.is_empty() =>
                {
                    Ok(Some((Some(project.to_string()), region.to_string())))
                }
                _ => Err("the GCP project and region are read from the URL: use https://<region>-aiplatform.googleapis.com/v1/projects/<project>/locations/<region>".into()),
            }
        }
        _ => Ok(None),
    }
}

pub(super) fn documents(ir: &Ir) -> Vec<Value> {
    let mut docs = Vec::new();
    for b in &ir.backends {
        let name = names::backend(ir, &b.name);
        docs.push(backend(ir, b, &name));
        docs.push(ai_service_backend(ir, b, &name));
        if let Some(p) = b.external().and_then(|e| security_policy(ir, e, &name)) {
            docs.push(p);
        }
    }
    docs
}

/// The Envoy Gateway Backend: the IR's endpoints (the InferenceService's Service, `--resolve`,
/// the pods of a `resolution: endpoint` backend, or the external URL's host), TLS with the
/// system CAs and SNI for https.
fn backend(ir: &Ir, b: &Backend, name: &str) -> Value {
    let endpoints: Vec<Value> = b
        .endpoints
        .iter()
        .map(|(host, port)| match host.parse::<IpAddr>() {
            Ok(_) => json!({"ip": {"address": host, "port": port}}),
            Err(_) => json!({"fqdn": {"hostname": host, "port": port}}),
        })
        .collect();
    // `type` is the API server's default, written out so the CRD's CEL rules read it here too.
    let mut spec = json!({"type": "Endpoints", "endpoints": endpoints});
    if let Some(e) = b.external().filter(|e| e.url.https) {
        spec["tls"] = json!({"sni": e.url.host, "wellKnownCACertificates": "System"});
    }
    object(EG_API, "Backend", metadata(name, &ir.namespace, ir), spec)
}

/// The API schema Envoy AI Gateway translates to, and the path prefix: a URL path ending in
/// `/v1` is the prefix itself, any other path is put in front of `/v1` (as the envoy target
/// rewrites paths), no path keeps the schema's default.
fn schema(b: &Backend) -> Value {
    let Some(e) = b.external() else {
        return json!({"name": "OpenAI"});
    };
    let name = match e.provider {
        Provider::Anthropic => "Anthropic",
        Provider::Bedrock => "AWSBedrock",
        Provider::VertexAi => "GCPVertexAI",
        Provider::Openai | Provider::Litellm => "OpenAI",
    };
    let mut s = json!({"name": name});
    let path = e.url.path.as_str();
    if matches!(
        e.provider,
        Provider::Openai | Provider::Litellm | Provider::Anthropic
    ) && !path.is_empty()
    {
        s["prefix"] = json!(if path.ends_with("/v1") {
            path.to_string()
        } else {
            format!("{path}/v1")
        });
    }
    s
}

fn ai_service_backend(ir: &Ir, b: &Backend, name: &str) -> Value {
    let mut spec = json!({
        "schema": schema(b),
        // The CRD defaults to a core Service; Envoy AI Gateway accepts only a Backend.
        "backendRef": {"name": name, "kind": "Backend", "group": "gateway.envoyproxy.io"},
    });
    if let Some(m) = b.external().map(header_mutation) {
        spec["headerMutation"] = m;
    }
    object(
        AIG_API,
        "AIServiceBackend",
        metadata(name, &ir.namespace, ir),
        spec,
    )
}

/// The headers the envoy target's upstream module edits on each attempt to an external backend
/// (`router_core::attempt::plan_attempt`), as the backend's `headerMutation`, which Envoy AI
/// Gateway's upstream filter applies on every attempt to this backend (and undoes on a retry
/// to another, `internal/headermutator`): every provider credential or version header the
/// backend's own credential does not set is removed (a client's, or one a previous attempt
/// carried), as are the decision headers naming the router's rules and orders; the provider's
/// version header is set (`anthropic-version`, which Envoy AI Gateway's Anthropic passthrough
/// does not add). The credential itself is the BackendSecurityPolicy's, applied after these
/// edits; the model rewrite is the route's `modelNameOverride`.
fn header_mutation(e: &External) -> Value {
    let version = e.provider.version_header();
    let credential = e.credential.as_ref().map(|c| c.header);
    let remove: Vec<&str> = provider_headers()
        .into_iter()
        .filter(|h| Some(*h) != credential && Some(*h) != version.map(|(v, _)| v))
        .chain(INTERNAL_ROUTING_HEADERS.iter().copied())
        .collect();
    let mut m = json!({"remove": remove});
    if let Some((name, value)) = version {
        m["set"] = json!([{"name": name, "value": value}]);
    }
    m
}

/// The credential of an external backend, by Secret reference.
fn security_policy(ir: &Ir, e: &External, name: &str) -> Option<Value> {
    let c = e.credential.as_ref()?;
    let secret_ref = json!({"secretRef": {"name": c.secret.name, "namespace": c.secret.namespace}});
    let location = cloud_location(e).ok().flatten();
    let (kind, field, value) = match e.provider {
        Provider::Anthropic => ("AnthropicAPIKey", "anthropicAPIKey", secret_ref),
        Provider::Bedrock => {
            let (_, region) = location?;
            (
                "AWSCredentials",
                "awsCredentials",
                json!({"region": region, "credentialsFile": secret_ref}),
            )
        }
        Provider::VertexAi => {
            let (project, region) = location?;
            (
                "GCPCredentials",
                "gcpCredentials",
                json!({"projectName": project, "region": region, "credentialsFile": secret_ref}),
            )
        }
        Provider::Openai | Provider::Litellm => ("APIKey", "apiKey", secret_ref),
    };
    let mut spec = json!({
        "targetRefs": [{"group": "aigateway.envoyproxy.io", "kind": "AIServiceBackend", "name": name}],
        "type": kind,
    });
    spec[field] = value;
    Some(object(
        AIG_API,
        "BackendSecurityPolicy",
        metadata(name, &ir.namespace, ir),
        spec,
    ))
}
