//! One AIServiceBackend + Backend per backend of the router, and a BackendSecurityPolicy for
//! each external credential. Envoy AI Gateway translates to the provider's API and signs AWS
//! Bedrock / GCP Vertex AI requests itself, so those providers work here (the envoy target
//! refuses them). Credentials are Secret references only: Envoy AI Gateway reads an API key from
//! key `apiKey`, so when the input carries the ModelRouter's Secret (whose key is the provider's,
//! e.g. `OPENAI_API_KEY`) a Secret holding it under `apiKey` is derived and referenced.

use std::net::IpAddr;

use router_core::attempt::INTERNAL_ROUTING_HEADERS;
use router_core::provider::provider_headers;
use serde_json::{json, Value};

use super::names;
use super::objects::{metadata, object};
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
        let field = format!("spec.backends[{i}].external.credentialsSecretRef.name");
        let (ns, name) = (&c.secret.namespace, &c.secret.name);
        match (&c.secret_keys, credential_source(e)) {
            (_, CredentialSource::Derived(_)) => {}
            (Some(keys), _) if keys.iter().any(|k| k == key) => {}
            (None, _) => diags.warn(Problem::new(
                &ir.label,
                field,
                format!("Secret {ns}/{name} is not in the input, so no Secret with key {key:?} (the key Envoy AI Gateway reads) is derived from its {}: give the Secret in the input, or add that key to it", c.secret.key),
            )),
            (Some(_), _) if derivable(e.provider) => diags.error(Problem::new(
                &ir.label,
                field,
                format!("Secret {ns}/{name} has no key {} (the {} credential) nor {key:?}", c.secret.key, e.provider),
            )),
            (Some(_), _) => diags.warn(Problem::new(
                &ir.label,
                field,
                format!("Envoy AI Gateway reads the {} credential from key {key:?} of Secret {ns}/{name} (the ModelRouter convention is {}): add that key to the Secret", e.provider, c.secret.key),
            )),
        }
    }
}

/// Providers whose Envoy AI Gateway credential is the bare API key under `apiKey`, which a
/// derived Secret can carry (AWS and GCP want a credentials file instead).
fn derivable(p: Provider) -> bool {
    ai_gateway_secret_key(p) == "apiKey"
}

/// Where a BackendSecurityPolicy reads its credential from.
enum CredentialSource {
    /// The ModelRouter's Secret itself (not in the input, already holding the key Envoy AI
    /// Gateway reads, or a provider whose credential cannot be derived).
    Referenced,
    /// A Secret the generator derives from it, holding the ModelRouter's credential under
    /// `apiKey`: the API key (without the header's `Bearer ` form).
    Derived(String),
}

/// The input carries the Secret with the ModelRouter's key: the policy reads a derived Secret.
/// The ModelRouter's key wins over an `apiKey` the Secret may also hold (it is the credential
/// the other targets send).
fn credential_source(e: &External) -> CredentialSource {
    let key = e
        .credential
        .as_ref()
        .filter(|_| derivable(e.provider))
        .and_then(|c| c.value.as_deref())
        .and_then(|v| v.strip_prefix(e.provider.credential().prefix));
    match key {
        Some(k) => CredentialSource::Derived(k.to_string()),
        None => CredentialSource::Referenced,
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
        if let Some(e) = b.external() {
            if let CredentialSource::Derived(key) = credential_source(e) {
                docs.push(derived_secret(ir, e, &name, &key));
            }
            if let Some(p) = security_policy(ir, e, &name) {
                docs.push(p);
            }
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

/// The Secret an APIKey / AnthropicAPIKey policy reads: the ModelRouter's credential under the
/// key Envoy AI Gateway reads, named and labelled as the backend's other generated objects, so
/// it is applied and deleted with them (`kubectl delete -f` of the manifests removes it). No
/// credential is written anywhere but in a Secret.
fn derived_secret(ir: &Ir, e: &External, name: &str, key: &str) -> Value {
    let mut meta = metadata(name, &ir.namespace, ir);
    if let Some(c) = &e.credential {
        meta["annotations"]["llmkube.dev/derived-from"] = json!(format!(
            "Secret {}/{} key {}",
            c.secret.namespace, c.secret.name, c.secret.key
        ));
    }
    let data = k8s_openapi::ByteString(key.as_bytes().to_vec());
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {ai_gateway_secret_key(e.provider): data},
    })
}

/// The credential of an external backend, by Secret reference: the derived Secret when there is
/// one, else the ModelRouter's.
fn security_policy(ir: &Ir, e: &External, name: &str) -> Option<Value> {
    let c = e.credential.as_ref()?;
    let secret_ref = match credential_source(e) {
        CredentialSource::Derived(_) => {
            json!({"secretRef": {"name": name, "namespace": ir.namespace}})
        }
        CredentialSource::Referenced => {
            json!({"secretRef": {"name": c.secret.name, "namespace": c.secret.namespace}})
        }
    };
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
