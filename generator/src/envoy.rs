//! `compile --target envoy`: a standalone Envoy v3 bootstrap that loads the model-router filter.
//!
//! Layout (the contract is docs/architecture.md, "Failover, weighted picks, shadow, quarantine"):
//! one listener, one http_connection_manager with `[envoy.filters.http.wasm,
//! envoy.filters.http.router]`. The filter stamps `x-llmkube-route: <key>`; the route table has
//! exactly one route per key the filter can stamp (enumerated from `router_core::router::Router`
//! built from the same plugin config: `rule_orders` per rule, then `unruled_targets`), each
//! matching the header exactly, and a final catch-all `direct_response` 404 (OpenAI-shaped JSON)
//! so a request the filter did not decide never reaches a backend.
//!
//! A one-backend order goes to `backend-<name>`; a longer one to the aggregate
//! `order.<b1>.<b2>...` over those backend clusters, failing over with a retry policy
//! (`previous_priorities`). Backend clusters carry the quarantine (outlier detection + TCP health
//! check, no panic mode); shadow rules mirror to `shadow-<name>` clusters. Clusters that can send
//! to an external backend run the upstream chain (upstream wasm, per-backend credential injector
//! reading `static_resources.secrets` `cred-<name>`, marker removal, codec).
//!
//! Route `timeout: 0s`: Envoy's route timeout spans until the whole response has been received,
//! which would cut long streams; `per_try_timeout` bounds the time to response headers per attempt
//! and `idle_timeout` (`spec.proxy.streamIdleTimeout`) a silent stream. `per_try_timeout` is one
//! value per route, so an order whose attempts need different timeouts (no rule timeout, backends
//! with different ones) goes to the aggregate `attempts.<b1>.<b2>...` over `via-<b>` clusters
//! instead: each attempt passes through the internal listener `attempt-<b>`, whose route to
//! `backend-<b>` carries b's own timeout (and where `backend-<b>`'s own upstream chain runs).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use router_core::config::{
    self as rc, ATTEMPT_BACKEND_HEADER, DEFAULT_MAX_BODY_BYTES, ROUTE_HEADER, SHADOW_HEADER,
};
use router_core::orders;
use router_core::router::Router;
use serde_json::{json, Value};

use crate::duration::{envoy_duration, parse_duration};
use crate::inputs::{namespace_of, router_key, secret_values, Inputs, Source};
use crate::model::*;
use crate::plugin::{plugin_config, PluginContext};
use crate::validate::{response_header_cap, validate_router, RefPolicy};
use crate::{Diagnostics, Problem};

pub const WASM_FILE: &str = "llmkube_model_router.wasm";
/// The upstream filter (per attempt: fail-closed guard, model rewrite, attempt marker).
pub const UPSTREAM_WASM_FILE: &str = "llmkube_upstream.wasm";
pub const RETRY_ON: &str = "5xx,reset,connect-failure,refused-stream";
/// Shadow copies in flight per target; the rest are dropped (`upstream_rq_active_overflow`).
pub const SHADOW_MAX_REQUESTS: u32 = 4;
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10000";
pub const DEFAULT_ADMIN: &str = "127.0.0.1:9901";
pub const DEFAULT_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
const MIB: u64 = 1024 * 1024;

/// Output syntax of the bootstrap. Both are accepted by `envoy -c` (JSON is valid YAML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Yaml,
    Json,
}

/// Options of `compile --target envoy`.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    /// Directory holding `llmkube_model_router.wasm`; made absolute in the output.
    pub wasm_dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// `--resolve NAME=HOST:PORT`: InferenceService name → address used instead of cluster DNS.
    pub resolve: BTreeMap<String, (String, u16)>,
    /// `--endpoints NAME=IP:PORT,...`: pods of `resolution: endpoint` backends on that
    /// InferenceService (instead of EndpointSlices).
    pub endpoints: BTreeMap<String, Vec<(String, u16)>>,
    /// `--router NAME`: which ModelRouter to compile when the input holds several.
    pub router: Option<String>,
    pub model_header: Option<String>,
    pub max_body_bytes: Option<u64>,
    /// CA bundle for verifying https upstreams.
    pub ca_file: String,
    pub format: Format,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            wasm_dir: default_wasm_dir(),
            listen: DEFAULT_LISTEN.parse().unwrap(),
            admin: DEFAULT_ADMIN.parse().unwrap(),
            resolve: BTreeMap::new(),
            endpoints: BTreeMap::new(),
            router: None,
            model_header: None,
            max_body_bytes: None,
            ca_file: DEFAULT_CA_FILE.to_string(),
            format: Format::Yaml,
        }
    }
}

/// The workspace's release build output for wasm32-wasip1 (`$CARGO_TARGET_DIR` when the generator
/// was built with one set).
pub fn default_wasm_dir() -> PathBuf {
    let target = match option_env!("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target"),
    };
    target.join("wasm32-wasip1").join("release")
}

/// A parsed `http(s)://host[:port][/path]` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedUrl {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing `/` (empty for none).
    pub path: String,
}

impl ParsedUrl {
    pub fn host_is_ip(&self) -> bool {
        self.host.parse::<IpAddr>().is_ok()
    }
    /// Host header value: host, plus the port when it is not the scheme's default.
    pub fn authority(&self) -> String {
        let h = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if (self.https && self.port == 443) || (!self.https && self.port == 80) {
            h
        } else {
            format!("{h}:{}", self.port)
        }
    }
}

/// Parses an external backend URL. Credentials, query strings and fragments are refused.
pub fn parse_url(u: &str) -> Result<ParsedUrl, String> {
    let lower = u.to_ascii_lowercase();
    let (https, rest) = if lower.starts_with("https://") {
        (true, &u[8..])
    } else if lower.starts_with("http://") {
        (false, &u[7..])
    } else {
        return Err(format!("{u:?} must be an http:// or https:// URL"));
    };
    if rest.contains(['?', '#']) {
        return Err(format!("{u:?} must not have a query or fragment"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(format!(
            "{u:?} must not carry credentials; use credentialsSecretRef"
        ));
    }
    let (host, port) = split_host_port(authority).map_err(|e| format!("{u:?}: {e}"))?;
    let port = port.unwrap_or(if https { 443 } else { 80 });
    if path.contains(char::is_whitespace) || path.contains("//") {
        return Err(format!("{u:?} has an invalid path"));
    }
    Ok(ParsedUrl {
        https,
        host: host.to_ascii_lowercase(),
        port,
        path: path.trim_end_matches('/').to_string(),
    })
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(s: &str) -> Result<(String, Option<u16>), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']').ok_or("unclosed '['")?;
        let host = &rest[..end];
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{host:?} is not an IPv6 address"));
        }
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err("unexpected text after ']'".into()),
        };
        (host.to_string(), port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("missing host".into());
    }
    if !host.contains(':')
        && !host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-' || c == b'_')
    {
        return Err(format!("{host:?} is not a valid host name"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|c| c.is_ascii_digit()) => Some(n),
            _ => return Err(format!("{p:?} is not a valid port")),
        },
    };
    Ok((host, port))
}

/// Parses `HOST:PORT` (port required).
pub fn parse_host_port(s: &str) -> Result<(String, u16), String> {
    match split_host_port(s)? {
        (h, Some(p)) => Ok((h, p)),
        (_, None) => Err(format!("{s:?} needs a port (HOST:PORT)")),
    }
}

/// Compiles the inputs to an Envoy bootstrap; the `Err` holds every problem. Warnings are dropped:
/// use [`compile_envoy_diag`] to see them.
pub fn compile_envoy(sources: &[Source], opts: &EnvoyOptions) -> Result<String, Vec<Problem>> {
    let mut diags = Diagnostics::default();
    match compile_envoy_diag(sources, opts, &mut diags) {
        Some(out) if diags.errors.is_empty() => Ok(out),
        _ => Err(diags.errors),
    }
}

/// Compiles the inputs, reporting errors and warnings into `diags`. `None` when there is any error.
pub fn compile_envoy_diag(
    sources: &[Source],
    opts: &EnvoyOptions,
    diags: &mut Diagnostics,
) -> Option<String> {
    let inputs = crate::inputs::load(sources, diags);
    let router = select_router(&inputs, opts.router.as_deref(), diags)?;
    let refs = RefPolicy {
        missing_is_error: true,
        resolved_names: opts
            .resolve
            .keys()
            .chain(opts.endpoints.keys())
            .cloned()
            .collect(),
    };
    validate_router(router, &inputs, &refs, diags);
    envoy_target_checks(router, opts, diags);
    if !diags.errors.is_empty() {
        return None;
    }
    let bootstrap = bootstrap(router, &inputs, opts, diags)?;
    if !diags.errors.is_empty() {
        return None;
    }
    Some(match opts.format {
        Format::Json => serde_json::to_string_pretty(&bootstrap).expect("JSON") + "\n",
        Format::Yaml => serde_norway::to_string(&bootstrap).expect("YAML"),
    })
}

/// Picks the ModelRouter of the compile unit: the one named by `--router`, else the only one.
pub fn select_router<'a>(
    inputs: &'a Inputs,
    name: Option<&str>,
    diags: &mut Diagnostics,
) -> Option<&'a ModelRouter> {
    match name {
        Some(n) => {
            let found: Vec<&ModelRouter> = inputs
                .routers
                .iter()
                .filter(|r| r.metadata.name.as_deref() == Some(n) || router_key(r) == n)
                .collect();
            match found.len() {
                1 => Some(found[0]),
                0 => {
                    diags.error(Problem::new(
                        format!("ModelRouter/{n}"),
                        "",
                        "--router names a ModelRouter that is not in the input",
                    ));
                    None
                }
                _ => {
                    diags.error(Problem::new(
                        format!("ModelRouter/{n}"),
                        "",
                        "several ModelRouters have this name; use --router NAMESPACE/NAME",
                    ));
                    None
                }
            }
        }
        None => match inputs.routers.len() {
            1 => Some(&inputs.routers[0]),
            0 => {
                if diags.errors.is_empty() {
                    diags.error(Problem::new(
                        "input",
                        "",
                        "no ModelRouter (inference.llmkube.dev/v1alpha1) found",
                    ));
                }
                None
            }
            _ => {
                let names: Vec<String> = inputs.routers.iter().map(router_key).collect();
                diags.error(Problem::new(
                    "input",
                    "",
                    format!("the envoy target compiles exactly one ModelRouter; found {} ({}): pick one with --router NAME", names.len(), names.join(", ")),
                ));
                None
            }
        },
    }
}

/// What the envoy target refuses or warns about beyond the spec's own rules.
fn envoy_target_checks(router: &ModelRouter, opts: &EnvoyOptions, diags: &mut Diagnostics) {
    let label = format!(
        "ModelRouter/{}",
        router.metadata.name.as_deref().unwrap_or("")
    );
    let spec = &router.spec;
    for (i, b) in spec.backends.iter().enumerate() {
        if let Some(e) = &b.external {
            if matches!(e.provider, Provider::Bedrock | Provider::VertexAi) {
                diags.error(Problem::new(
                    &label,
                    format!("spec.backends[{i}].external.provider"),
                    format!("provider {} is not supported by the envoy target yet (it needs request signing); use litellm in front of it", e.provider.as_str()),
                ));
            }
            if e.credentials_secret_ref.is_none() && e.provider != Provider::Litellm {
                diags.warn(Problem::new(
                    &label,
                    format!("spec.backends[{i}].external"),
                    format!(
                        "no credentialsSecretRef: requests to {} are sent without credentials",
                        e.provider.as_str()
                    ),
                ));
            }
        }
    }
    if let Some(auth) = spec.policy.as_ref().and_then(|p| p.auth.as_ref()) {
        if auth.jwt.is_some() || !auth.allowlists.is_empty() {
            diags.error(Problem::new(&label, "spec.policy.auth", "is not enforced by the envoy target yet; refusing rather than serving unauthenticated"));
        }
    }
    if spec.policy.as_ref().is_some_and(|p| !p.budgets.is_empty()) {
        diags.warn(Problem::new(&label, "spec.policy.budgets", "are validated but not enforced by the envoy target yet (the plugin config carries no budgets)"));
    }
    if let Some(dp) = spec.data_plane.filter(|d| *d != DataPlane::Proxy) {
        diags.warn(Problem::new(&label, "spec.dataPlane", format!("{dp:?} selects LLMKube's own data plane; the envoy target runs the whole spec in Envoy regardless")));
    }
    if opts.max_body_bytes == Some(0) {
        diags.error(Problem::new(
            "options",
            "--max-body-bytes",
            "must be greater than 0",
        ));
    }
    if let Some(h) = &opts.model_header {
        if !crate::validate::is_header_token(h) {
            diags.error(Problem::new(
                "options",
                "--model-header",
                format!("{h:?} is not a valid HTTP header name"),
            ));
        }
    }
    let wasm = wasm_path(opts);
    if !wasm.is_file() {
        diags.warn(Problem::new(
            "options",
            "--wasm-dir",
            format!("{} does not exist yet (build it: cargo build --release --target wasm32-wasip1 -p llmkube-model-router)", wasm.display()),
        ));
    }
    let upstream_wasm = upstream_wasm_path(opts);
    if spec.backends.iter().any(|b| b.external.is_some()) && !upstream_wasm.is_file() {
        diags.warn(Problem::new(
            "options",
            "--wasm-dir",
            format!("{} does not exist yet (external backends need the upstream filter: build filters/upstream for wasm32-wasip1)", upstream_wasm.display()),
        ));
    }
}

pub fn wasm_path(opts: &EnvoyOptions) -> PathBuf {
    absolute(opts.wasm_dir.join(WASM_FILE))
}

pub fn upstream_wasm_path(opts: &EnvoyOptions) -> PathBuf {
    absolute(opts.wasm_dir.join(UPSTREAM_WASM_FILE))
}

fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

fn socket(host: &str, port: u16) -> Value {
    json!({"socket_address": {"address": host, "port_value": port}})
}

fn typed(type_name: &str) -> Value {
    json!({"@type": format!("type.googleapis.com/{type_name}")})
}

#[derive(Clone, Copy, PartialEq)]
enum Discovery {
    Static,
    StrictDns,
}

struct Upstream {
    endpoints: Vec<(String, u16)>,
    tls: Option<String>,
    /// External backends: the Host header value (the URL's authority).
    host_rewrite: Option<String>,
    path_prefix: String,
    /// External backends with a credential: the value injected upstream (`Bearer <key>`, or the
    /// raw key for anthropic). Only ever written into `static_resources.secrets`.
    credential: Option<String>,
    /// `authorization` or `x-api-key`.
    credential_header: &'static str,
}

impl Upstream {
    fn external(&self) -> bool {
        self.host_rewrite.is_some()
    }
    /// A path rewrite that changes something (`/v1` alone is the identity).
    fn rewrites_path(&self) -> bool {
        !self.path_prefix.is_empty() && self.path_prefix != "/v1"
    }
}

/// Cluster names (see docs/architecture.md, "Failover, weighted picks, shadow, quarantine").
pub fn backend_cluster(name: &str) -> String {
    format!("backend-{name}")
}
pub fn shadow_cluster(name: &str) -> String {
    format!("shadow-{name}")
}
pub fn aggregate_cluster(order: &[&str]) -> String {
    format!("order.{}", order.join("."))
}
/// The aggregate of a route whose attempts have different timeouts: over `via-<b>` clusters.
pub fn attempts_cluster(order: &[&str]) -> String {
    format!("attempts.{}", order.join("."))
}
/// A cluster whose one endpoint is the internal listener [`attempt_listener`] of a backend.
pub fn via_cluster(name: &str) -> String {
    format!("via-{name}")
}
/// The internal listener that sends one attempt to `backend-<name>` with that backend's timeout.
pub fn attempt_listener(name: &str) -> String {
    format!("attempt-{name}")
}
pub fn secret_name(backend: &str) -> String {
    format!("cred-{backend}")
}

/// One route of the table: a route key the downstream filter can stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePlan {
    /// `orders::route_key(rule, order)`; `~/<b>` for unruled targets.
    pub key: String,
    /// Backend indexes in attempt order.
    pub order: Vec<usize>,
    /// Effective response-header timeout of each attempt (same length as `order`):
    /// `min(rule.timeout || backend.timeout || cap, cap)` with the attempt's backend.
    pub attempt_timeouts_ms: Vec<u64>,
    /// Backends mirrored to (shadow rules: every backend after the first).
    pub mirrors: Vec<usize>,
}

impl RoutePlan {
    /// True when the attempts need different response-header timeouts: Envoy's
    /// `per_try_timeout` is one value per route, so such a route sends each attempt through an
    /// internal listener that applies that backend's own timeout (see [`via_cluster`]).
    pub fn per_backend_timeouts(&self) -> bool {
        self.attempt_timeouts_ms
            .iter()
            .any(|&t| t != self.attempt_timeouts_ms[0])
    }

    /// The route-level `per_try_timeout` when every attempt has the same one.
    pub fn uniform_timeout_ms(&self) -> Option<u64> {
        (!self.per_backend_timeouts()).then(|| self.attempt_timeouts_ms[0])
    }
}

/// Every route key the filter can stamp for this plugin config, in table order: rules in
/// declaration order, each rule's orders as `rule_orders` lists them, then the unruled targets.
/// `cap_ms` is `spec.proxy.responseHeaderTimeout`: the timeout of an attempt without a rule or
/// backend timeout, and the upper bound of every resolved one.
pub fn route_plans(router: &Router, cap_ms: u64) -> Vec<RoutePlan> {
    let attempt_timeout = |rule: Option<u64>, b: usize| -> u64 {
        rule.or(router.backend(b).timeout_ms)
            .unwrap_or(cap_ms)
            .min(cap_ms)
    };
    let mut out = Vec::new();
    for i in 0..router.rules_len() {
        let rule = router.rule(i);
        for order in router.rule_orders(i) {
            let names: Vec<&str> = order
                .iter()
                .map(|&b| router.backend(b).name.as_str())
                .collect();
            let attempt_timeouts_ms = order
                .iter()
                .map(|&b| attempt_timeout(rule.timeout_ms, b))
                .collect();
            let mirrors = if rule.strategy == rc::Strategy::Shadow {
                order[1..].to_vec()
            } else {
                Vec::new()
            };
            out.push(RoutePlan {
                key: orders::route_key(&rule.name, &names),
                order,
                attempt_timeouts_ms,
                mirrors,
            });
        }
    }
    for b in router.unruled_targets() {
        let be = router.backend(b);
        out.push(RoutePlan {
            key: orders::route_key(orders::UNRULED, &[be.name.as_str()]),
            order: vec![b],
            attempt_timeouts_ms: vec![attempt_timeout(None, b)],
            mirrors: Vec::new(),
        });
    }
    out
}

fn dur_ms(ms: u64) -> String {
    envoy_duration(Duration::from_millis(ms))
}

/// The wasm filter entry (downstream model-router or upstream), same plugin config JSON.
fn wasm_filter(name: &str, root_id: &str, vm_id: &str, file: &Path, plugin_json: &str) -> Value {
    let mut tc = typed("envoy.extensions.filters.http.wasm.v3.Wasm");
    tc["config"] = json!({
        "name": name,
        "root_id": root_id,
        "allow_on_headers_stop_iteration": true,
        "fail_open": false,
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": plugin_json},
        "vm_config": {
            "vm_id": vm_id,
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": file.to_string_lossy()}},
        },
    });
    json!({"name": "envoy.filters.http.wasm", "typed_config": tc})
}

/// The upstream HTTP filter chain of a cluster that can send to an external backend: the upstream
/// wasm (per-attempt guard, model rewrite, `x-llmkube-attempt-backend`), one credential injector
/// per external backend with a credential (runs only when the attempt goes to that backend), the
/// removal of the marker header, the codec.
fn upstream_chain(externals: &[(&str, &Upstream)], wasm: &Path, plugin_json: &str) -> Value {
    let mut filters = vec![wasm_filter(
        "llmkube-upstream",
        "upstream",
        "llmkube-upstream",
        wasm,
        plugin_json,
    )];
    for (name, up) in externals {
        if up.credential.is_none() {
            continue;
        }
        let mut generic = typed("envoy.extensions.http.injected_credentials.generic.v3.Generic");
        generic["credential"] = json!({"name": secret_name(name)});
        generic["header"] = json!(up.credential_header);
        let mut injector =
            typed("envoy.extensions.filters.http.credential_injector.v3.CredentialInjector");
        injector["overwrite"] = json!(true);
        injector["credential"] =
            json!({"name": "envoy.http.injected_credentials.generic", "typed_config": generic});
        let mut input = typed("envoy.type.matcher.v3.HttpRequestHeaderMatchInput");
        input["header_name"] = json!(ATTEMPT_BACKEND_HEADER);
        let mut wrapped = typed("envoy.extensions.common.matching.v3.ExtensionWithMatcher");
        wrapped["extension_config"] =
            json!({"name": "envoy.filters.http.credential_injector", "typed_config": injector});
        wrapped["xds_matcher"] = json!({"matcher_list": {"matchers": [{
            "predicate": {"not_matcher": {"single_predicate": {
                "input": {"name": "attempt-backend", "typed_config": input},
                "value_match": {"exact": name},
            }}},
            "on_match": {"action": {"name": "skip", "typed_config": typed("envoy.extensions.filters.common.matcher.action.v3.SkipFilter")}},
        }]}});
        filters.push(json!({"name": secret_name(name), "typed_config": wrapped}));
    }
    let mut hm = typed("envoy.extensions.filters.http.header_mutation.v3.HeaderMutation");
    hm["mutations"] = json!({"request_mutations": [{"remove": ATTEMPT_BACKEND_HEADER}]});
    filters.push(json!({"name": "envoy.filters.http.header_mutation", "typed_config": hm}));
    filters.push(json!({"name": "envoy.filters.http.upstream_codec", "typed_config": typed("envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec")}));
    let mut opts = typed("envoy.extensions.upstreams.http.v3.HttpProtocolOptions");
    opts["explicit_http_config"] = json!({"http_protocol_options": {}});
    opts["http_filters"] = Value::Array(filters);
    json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts})
}

/// A backend or shadow cluster over one backend's endpoints.
fn endpoint_cluster(
    name: &str,
    backend: &str,
    tier: rc::Tier,
    up: &Upstream,
    buffer_limit: u64,
    ca_file: &str,
) -> Value {
    let all_ip = up
        .endpoints
        .iter()
        .all(|(h, _)| h.parse::<IpAddr>().is_ok());
    let discovery = if all_ip {
        Discovery::Static
    } else {
        Discovery::StrictDns
    };
    let tier = match tier {
        rc::Tier::Local => "local",
        rc::Tier::Cloud => "cloud",
    };
    let lb_endpoints: Vec<Value> = up
        .endpoints
        .iter()
        .map(|(h, p)| {
            let mut ep = json!({"address": socket(h, *p)});
            if let Some(authority) = &up.host_rewrite {
                // `auto_host_rewrite` on routes over aggregates sets Host from this, per attempt.
                ep["hostname"] = json!(authority);
            }
            json!({"endpoint": ep, "metadata": {"filter_metadata": {"llmkube": {"backend": backend, "tier": tier}}}})
        })
        .collect();
    let mut c = json!({
        "name": name,
        "type": if discovery == Discovery::Static { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "5s",
        "lb_policy": "ROUND_ROBIN",
        "per_connection_buffer_limit_bytes": buffer_limit,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": lb_endpoints}]},
    });
    if discovery == Discovery::StrictDns {
        c["dns_lookup_family"] = json!("V4_PREFERRED");
    }
    if let Some(host) = &up.tls {
        let san_type = if host.parse::<IpAddr>().is_ok() {
            "IP_ADDRESS"
        } else {
            "DNS"
        };
        let mut tls = json!({
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {"validation_context": {
                "trusted_ca": {"filename": ca_file},
                "match_typed_subject_alt_names": [{"san_type": san_type, "matcher": {"exact": host}}],
            }},
        });
        if san_type == "DNS" {
            tls["sni"] = json!(host);
        }
        c["transport_socket"] = json!({"name": "envoy.transport_sockets.tls", "typed_config": tls});
    }
    c
}

/// The Host and path handling of a route that sends to this backend alone (an external backend's
/// URL authority and path prefix).
fn direct_rewrites(action: &mut Value, up: &Upstream) {
    if let Some(h) = &up.host_rewrite {
        action["host_rewrite_literal"] = json!(h);
    }
    if !up.path_prefix.is_empty() {
        // Requests are `/v1/...`; a base URL that already ends in /v1 replaces it, any other
        // prefix is put in front.
        let (pattern, substitution) = match up.path_prefix.strip_suffix("/v1") {
            Some(_) => ("^/v1/".to_string(), format!("{}/", up.path_prefix)),
            None => ("^/".to_string(), format!("{}/", up.path_prefix)),
        };
        action["regex_rewrite"] =
            json!({"pattern": {"regex": pattern}, "substitution": substitution});
    }
}

/// Limits of the `via-<b>` clusters: they only carry attempts to an in-process listener, so
/// the real limits are those of `backend-<b>` behind it.
const VIA_CIRCUIT_LIMIT: u32 = 1_000_000;

/// `via-<b>`: one endpoint, the internal listener `attempt-<b>`, carrying the same endpoint
/// metadata as `backend-<b>`'s endpoints, so the downstream filter sees which backend served. No
/// outlier detection and no health check: the quarantine lives on `backend-<b>`, behind the
/// listener. No upstream filter chain either (nor on the `attempts.*` aggregate): `backend-<b>`'s
/// own chain runs behind the listener, once per attempt, on a request of its own, so header edits
/// of one attempt (an external backend's `content-length`, credentials) never reach the next.
fn via_cluster_config(backend: &str, tier: rc::Tier, buffer_limit: u64) -> Value {
    let name = via_cluster(backend);
    let tier = match tier {
        rc::Tier::Local => "local",
        rc::Tier::Cloud => "cloud",
    };
    let ep = json!({"address": {"envoy_internal_address": {"server_listener_name": attempt_listener(backend)}}});
    let raw = json!({"name": "envoy.transport_sockets.raw_buffer",
        "typed_config": typed("envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer")});
    let mut internal =
        typed("envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport");
    internal["transport_socket"] = raw;
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "lb_policy": "ROUND_ROBIN",
        "per_connection_buffer_limit_bytes": buffer_limit,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
            "endpoint": ep,
            "metadata": {"filter_metadata": {"llmkube": {"backend": backend, "tier": tier}}},
        }]}]},
        "transport_socket": {"name": "envoy.transport_sockets.internal_upstream", "typed_config": internal},
        "circuit_breakers": {"thresholds": [{
            "max_connections": VIA_CIRCUIT_LIMIT,
            "max_pending_requests": VIA_CIRCUIT_LIMIT,
            "max_requests": VIA_CIRCUIT_LIMIT,
            "max_retries": VIA_CIRCUIT_LIMIT,
        }]},
    })
}

/// `attempt-<b>`: an internal listener that sends every request to `backend-<b>` with b's own
/// response-header timeout (`per_try_timeout`, no retry). A timeout is its 504, a quarantined
/// backend its immediate 503: both reach the outer route as a 5xx and move the request to the
/// next backend. No idle or request timeout here (the outer route's `idle_timeout` guards
/// streams) and no header edits beyond the direct route's Host/path handling; for an external
/// backend, `backend-<b>`'s upstream chain does the per-attempt guard, model rewrite and
/// credential.
fn attempt_listener_config(
    backend: &str,
    up: &Upstream,
    timeout_ms: u64,
    buffer_limit: u64,
) -> Value {
    let name = attempt_listener(backend);
    let mut action = json!({
        "cluster": backend_cluster(backend),
        "timeout": "0s",
        "retry_policy": {"num_retries": 0, "per_try_timeout": dur_ms(timeout_ms)},
    });
    direct_rewrites(&mut action, up);
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name.replace('-', "_"),
        "codec_type": "AUTO",
        "stream_idle_timeout": "0s",
        "request_timeout": "0s",
        // The outer listener accepted the headers at its default limit (60 KiB) and added a few.
        "max_request_headers_kb": 96,
        "route_config": {"name": name, "virtual_hosts": [{
            "name": name,
            "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": action}],
        }]},
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")},
        ],
    });
    json!({
        "name": name,
        "internal_listener": {},
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    })
}

fn bootstrap(
    router: &ModelRouter,
    inputs: &Inputs,
    opts: &EnvoyOptions,
    diags: &mut Diagnostics,
) -> Option<Value> {
    let spec = &router.spec;
    let namespace = namespace_of(&router.metadata);
    let label = format!(
        "ModelRouter/{}",
        router.metadata.name.as_deref().unwrap_or("")
    );
    let max_body = opts.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    let buffer_limit = max_body.saturating_add(MIB);
    let pc = plugin_config(
        router,
        &PluginContext {
            inputs,
            model_header: opts.model_header.as_deref(),
            max_body_bytes: Some(max_body),
        },
    );
    let plugin_json = serde_json::to_string(&pc).expect("plugin config serialises");
    // The filter's own view of the config: the routes are enumerated from it, so the generator
    // and the filter cannot disagree on which route keys exist.
    let core = match Router::new(pc.clone()) {
        Ok(r) => r,
        Err(e) => {
            diags.error(Problem::new(
                &label,
                "spec",
                format!("the filter refuses the plugin config: {e}"),
            ));
            return None;
        }
    };

    let mut ups: Vec<Option<Upstream>> = Vec::with_capacity(spec.backends.len());
    for (i, b) in spec.backends.iter().enumerate() {
        let path = format!("spec.backends[{i}]");
        ups.push(upstream(b, namespace, inputs, opts, &label, &path, diags));
    }
    if !diags.errors.is_empty() {
        return None;
    }
    let ups: Vec<Upstream> = ups.into_iter().map(|u| u.expect("no error")).collect();
    let name_of = |b: usize| core.backend(b).name.as_str();

    let cap_ms = response_header_cap(spec).as_millis().min(u64::MAX as u128) as u64;
    let plans = route_plans(&core, cap_ms);

    // Path prefixes are route-level in Envoy: only a route to that backend alone can apply one.
    for (i, up) in ups.iter().enumerate() {
        if !up.rewrites_path() {
            continue;
        }
        let shared = plans
            .iter()
            .find(|p| (p.order.len() > 1 && p.order.contains(&i)) || p.mirrors.contains(&i));
        if let Some(p) = shared {
            diags.error(Problem::new(
                &label,
                format!("spec.backends[{i}].external.url"),
                format!("the path {:?} can only be applied on a route to {} alone, but route {:?} {} (Envoy rewrites paths per route, not per attempt); use a URL without a path, or one ending in /v1", up.path_prefix, name_of(i), p.key, if p.mirrors.contains(&i) { "mirrors to it" } else { "fails over across it and other backends" }),
            ));
        }
    }
    if !diags.errors.is_empty() {
        return None;
    }

    let stream_idle = spec
        .proxy
        .as_ref()
        .and_then(|p| p.stream_idle_timeout.as_deref())
        .and_then(|s| parse_duration(s).ok())
        .unwrap_or(DEFAULT_STREAM_IDLE_TIMEOUT);
    let quarantine = spec.quarantine();
    let upstream_wasm = upstream_wasm_path(opts);

    // Routes, and the aggregates / shadow targets / attempt hops they need (first-seen order:
    // deterministic).
    let mut routes = Vec::new();
    let mut aggregates: Vec<(String, Vec<usize>)> = Vec::new();
    let mut shadow_targets: Vec<usize> = Vec::new();
    // Backends some route reaches through `via-<b>` → `attempt-<b>`, with their attempt timeout.
    let mut hops: BTreeMap<usize, u64> = BTreeMap::new();
    for p in &plans {
        let names: Vec<&str> = p.order.iter().map(|&b| name_of(b)).collect();
        let external = p.order.iter().any(|&b| ups[b].external());
        let per_try = p.uniform_timeout_ms();
        let cluster = if p.order.len() == 1 {
            backend_cluster(names[0])
        } else {
            let agg = match per_try {
                Some(_) => aggregate_cluster(&names),
                None => {
                    for (&b, &t) in p.order.iter().zip(&p.attempt_timeouts_ms) {
                        let prev = hops.insert(b, t);
                        debug_assert!(prev.is_none_or(|x| x == t), "one timeout per backend");
                    }
                    attempts_cluster(&names)
                }
            };
            if !aggregates.iter().any(|(n, _)| *n == agg) {
                aggregates.push((agg.clone(), p.order.clone()));
            }
            agg
        };
        let mut retry = json!({
            "retry_on": RETRY_ON,
            "num_retries": p.order.len() - 1,
            "retry_priority": {"name": "envoy.retry_priorities.previous_priorities",
                "typed_config": typed("envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig")},
            "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": typed("envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate")}],
            "host_selection_retry_max_attempts": p.order.len().max(3),
        });
        retry["retry_priority"]["typed_config"]["update_frequency"] = json!(1);
        // Without it (attempts with different timeouts), each attempt's own timeout is applied
        // by the internal listener `attempt-<b>` it goes through.
        if let Some(ms) = per_try {
            retry["per_try_timeout"] = json!(dur_ms(ms));
        }
        let mut action = json!({
            "cluster": cluster,
            "timeout": "0s",
            "idle_timeout": envoy_duration(stream_idle),
            "retry_policy": retry,
        });
        if p.order.len() == 1 {
            direct_rewrites(&mut action, &ups[p.order[0]]);
        } else if external && per_try.is_some() {
            // Host per attempt from the endpoint's `hostname` (set on external endpoints).
            action["auto_host_rewrite"] = json!(true);
        }
        if !p.mirrors.is_empty() {
            action["request_mirror_policies"] = Value::Array(
                p.mirrors
                    .iter()
                    .map(|&b| {
                        if !shadow_targets.contains(&b) {
                            shadow_targets.push(b);
                        }
                        json!({
                            "cluster": shadow_cluster(name_of(b)),
                            "request_headers_mutations": [{"append": {
                                "header": {"key": SHADOW_HEADER, "value": "true"},
                                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}],
                        })
                    })
                    .collect(),
            );
        }
        routes.push(json!({
            "name": p.key,
            "match": {"prefix": "/", "headers": [{"name": ROUTE_HEADER, "string_match": {"exact": p.key}}]},
            "route": action,
            "request_headers_to_remove": ["authorization"],
        }));
    }
    shadow_targets.sort_unstable();

    let chain_for = |members: &[usize]| -> Option<Value> {
        let externals: Vec<(&str, &Upstream)> = members
            .iter()
            .filter(|&&b| ups[b].external())
            .map(|&b| (name_of(b), &ups[b]))
            .collect();
        (!externals.is_empty()).then(|| upstream_chain(&externals, &upstream_wasm, &plugin_json))
    };

    let mut clusters = Vec::new();
    let mut secrets = Vec::new();
    for (i, up) in ups.iter().enumerate() {
        let name = name_of(i);
        let cname = backend_cluster(name);
        let mut c = endpoint_cluster(
            &cname,
            name,
            core.backend(i).tier,
            up,
            buffer_limit,
            &opts.ca_file,
        );
        c["outlier_detection"] = json!({
            "consecutive_5xx": 1,
            "enforcing_consecutive_5xx": 100,
            "interval": "1s",
            "base_ejection_time": envoy_duration(quarantine),
            "max_ejection_time": envoy_duration(quarantine),
            "max_ejection_percent": 100,
            "split_external_local_origin_errors": true,
            "enforcing_consecutive_local_origin_failure": 0,
            "enforcing_success_rate": 0,
            "enforcing_local_origin_success_rate": 0,
        });
        c["health_checks"] = json!([{
            "timeout": "1s",
            "interval": "1s",
            "no_traffic_interval": "1s",
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "tcp_health_check": {},
        }]);
        c["common_lb_config"] = json!({"healthy_panic_threshold": {"value": 0}});
        if let Some(chain) = chain_for(&[i]) {
            c["typed_extension_protocol_options"] = chain;
        }
        clusters.push(c);
        if let Some(cred) = &up.credential {
            secrets.push(json!({"name": secret_name(name), "generic_secret": {"secret": {"inline_string": cred}}}));
        }
    }
    for &b in &shadow_targets {
        let name = name_of(b);
        let mut c = endpoint_cluster(
            &shadow_cluster(name),
            name,
            core.backend(b).tier,
            &ups[b],
            buffer_limit,
            &opts.ca_file,
        );
        c["circuit_breakers"] = json!({"thresholds": [{"max_requests": SHADOW_MAX_REQUESTS}]});
        if let Some(chain) = chain_for(&[b]) {
            c["typed_extension_protocol_options"] = chain;
        }
        clusters.push(c);
    }
    for (name, members) in &aggregates {
        let mut agg = typed("envoy.extensions.clusters.aggregate.v3.ClusterConfig");
        let through_listeners = name.starts_with("attempts.");
        let member = if through_listeners {
            via_cluster
        } else {
            backend_cluster
        };
        agg["clusters"] = json!(members
            .iter()
            .map(|&b| member(name_of(b)))
            .collect::<Vec<_>>());
        let mut c = json!({
            "name": name,
            // Dots in a cluster name split Envoy's stat tag extraction (`envoy_cluster_name`
            // would be "order"); backend names are DNS labels, so '_' is unambiguous here.
            "alt_stat_name": name.replace('.', "_"),
            "connect_timeout": "5s",
            "lb_policy": "CLUSTER_PROVIDED",
            "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": agg},
        });
        // Over via- clusters the chain runs behind each attempt listener instead.
        if !through_listeners {
            if let Some(chain) = chain_for(members) {
                c["typed_extension_protocol_options"] = chain;
            }
        }
        clusters.push(c);
    }
    let mut attempt_listeners = Vec::new();
    for (&b, &timeout_ms) in &hops {
        let name = name_of(b);
        clusters.push(via_cluster_config(name, core.backend(b).tier, buffer_limit));
        attempt_listeners.push(attempt_listener_config(
            name,
            &ups[b],
            timeout_ms,
            buffer_limit,
        ));
    }

    let body = json!({"error": {
        "message": "no route: the request was not assigned to a backend of this router",
        "type": "invalid_request_error", "param": null, "code": "model_not_found"}})
    .to_string();
    routes.push(json!({
        "name": "no-backend",
        "match": {"prefix": "/"},
        "direct_response": {"status": 404, "body": {"inline_string": body}},
        "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    }));

    let wasm = wasm_path(opts);
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "llmkube",
        "codec_type": "AUTO",
        "normalize_path": true,
        "merge_slashes": true,
        "stream_idle_timeout": envoy_duration(stream_idle),
        "route_config": {"name": "llmkube", "virtual_hosts": [{
            "name": "llmkube",
            "domains": ["*"],
            "include_attempt_count_in_response": true,
            "routes": routes,
        }]},
        "http_filters": [
            wasm_filter("llmkube-model-router", "model-router", "llmkube", &wasm, &plugin_json),
            {"name": "envoy.filters.http.router", "typed_config": typed("envoy.extensions.filters.http.router.v3.Router")},
        ],
    });
    let mut listeners = vec![json!({
        "name": "llmkube",
        "address": socket(&opts.listen.ip().to_string(), opts.listen.port()),
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    })];
    let hop_routes = !attempt_listeners.is_empty();
    listeners.extend(attempt_listeners);
    let mut resources = json!({
        "listeners": listeners,
        "clusters": clusters,
    });
    if !secrets.is_empty() {
        resources["secrets"] = Value::Array(secrets);
    }
    let mut bootstrap = json!({
        "node": {"id": format!("llmkube-{}", router_key(router).replace('/', ".")), "cluster": "llmkube"},
        "admin": {"address": socket(&opts.admin.ip().to_string(), opts.admin.port())},
        "static_resources": resources,
    });
    if hop_routes {
        bootstrap["bootstrap_extensions"] = json!([{
            "name": "envoy.bootstrap.internal_listener",
            "typed_config": typed("envoy.extensions.bootstrap.internal_listener.v3.InternalListener"),
        }]);
    }
    Some(bootstrap)
}

/// Where a backend's traffic goes.
fn upstream(
    b: &RouterBackend,
    namespace: &str,
    inputs: &Inputs,
    opts: &EnvoyOptions,
    label: &str,
    path: &str,
    diags: &mut Diagnostics,
) -> Option<Upstream> {
    let mut err = |p: String, m: String| diags.error(Problem::new(label, p, m));
    if let Some(r) = &b.inference_service_ref {
        let isvc = inputs.inference_service(namespace, &r.name);
        let endpoints = if b.resolution() == Resolution::Endpoint {
            if let Some(eps) = opts.endpoints.get(&r.name) {
                eps.clone()
            } else {
                let slices = inputs.endpoint_slices_for(namespace, &r.name);
                if slices.is_empty() {
                    err(
                        format!("{path}.resolution"),
                        format!("resolution: endpoint needs EndpointSlices labelled kubernetes.io/service-name: {} in namespace {namespace}, or --endpoints {}=IP:PORT,...", r.name, r.name),
                    );
                    return None;
                }
                let mut eps = Vec::new();
                for s in slices {
                    let ports: Vec<u16> = s
                        .ports
                        .iter()
                        .flatten()
                        .filter(|p| p.protocol.as_deref().is_none_or(|pr| pr == "TCP"))
                        .filter_map(|p| p.port.and_then(|n| u16::try_from(n).ok()))
                        .collect();
                    for e in &s.endpoints {
                        // A nil ready condition means "unknown": consumers treat it as ready.
                        if e.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                            continue;
                        }
                        for a in &e.addresses {
                            for p in &ports {
                                eps.push((a.clone(), *p));
                            }
                        }
                    }
                }
                eps.sort();
                eps.dedup();
                if eps.is_empty() {
                    diags.warn(Problem::new(label, format!("{path}.resolution"), format!("the EndpointSlices of {} list no ready endpoint; the backend answers 503 until regenerated", r.name)));
                }
                eps
            }
        } else if let Some((h, p)) = opts.resolve.get(&r.name) {
            vec![(h.clone(), *p)]
        } else if let Some(i) = isvc {
            vec![(
                format!("{}.{}.svc.cluster.local", i.name, i.namespace),
                i.port,
            )]
        } else {
            // Same line as validation's, so it is reported once.
            err(
                format!("{path}.inferenceServiceRef.name"),
                format!("InferenceService {namespace}/{} is not in the input (add it, or give its address with --resolve/--endpoints)", r.name),
            );
            return None;
        };
        return Some(Upstream {
            endpoints,
            tls: None,
            host_rewrite: None,
            path_prefix: String::new(),
            credential: None,
            credential_header: "authorization",
        });
    }
    let e = b.external.as_ref()?;
    let url = match e.url.as_deref().or(e.provider.default_url()) {
        Some(u) => u,
        None => {
            err(
                format!("{path}.external.url"),
                format!(
                    "provider {} has no default URL in the envoy target; set url",
                    e.provider.as_str()
                ),
            );
            return None;
        }
    };
    let u = match parse_url(url) {
        Ok(u) => u,
        Err(why) => {
            err(format!("{path}.external.url"), why);
            return None;
        }
    };
    let credential_header = match e.provider {
        Provider::Anthropic => "x-api-key",
        _ => "authorization",
    };
    let mut credential = None;
    if let Some(s) = &e.credentials_secret_ref {
        if let Some(secret) = inputs.secret(namespace, &s.name) {
            let values = secret_values(secret);
            let key = e.provider.secret_key();
            match values.get(key).map(|v| v.trim()) {
                None | Some("") => {
                    err(
                        format!("{path}.external.credentialsSecretRef.name"),
                        format!(
                            "Secret {namespace}/{} has no key {key} (the {} credential)",
                            s.name,
                            e.provider.as_str()
                        ),
                    );
                    return None;
                }
                Some(v) if v.bytes().any(|c| c < 0x20 || c == 0x7f) => {
                    err(
                        format!("{path}.external.credentialsSecretRef.name"),
                        format!(
                            "Secret {namespace}/{} key {key} contains control characters",
                            s.name
                        ),
                    );
                    return None;
                }
                Some(v) => {
                    credential = Some(match e.provider {
                        Provider::Anthropic => v.to_string(),
                        _ => format!("Bearer {v}"),
                    })
                }
            }
        }
    }
    Some(Upstream {
        endpoints: vec![(u.host.clone(), u.port)],
        tls: u.https.then(|| u.host.clone()),
        host_rewrite: Some(u.authority()),
        path_prefix: u.path.clone(),
        credential,
        credential_header,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://litellm.llm.svc:4000").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.path.as_str()),
            (false, "litellm.llm.svc", 4000, "")
        );
        assert_eq!(u.authority(), "litellm.llm.svc:4000");
        let u = parse_url("https://api.openai.com/v1/").unwrap();
        assert_eq!(
            (u.https, u.port, u.path.as_str(), u.authority()),
            (true, 443, "/v1", "api.openai.com".to_string())
        );
        let u = parse_url("http://[::1]:8080/x").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.authority()),
            ("::1", 8080, "[::1]:8080".to_string())
        );
        for bad in [
            "ftp://x",
            "http://",
            "http://a:b",
            "http://u:p@h",
            "http://h/?q",
            "litellm:4000",
            "http://h:0",
            "http://h x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
