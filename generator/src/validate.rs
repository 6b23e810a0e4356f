//! Static validation of a ModelRouter: everything the CRD reference states (patterns, limits,
//! cross-field rules), plus checks of the objects it references.
//!
//! Errors and warnings are [`Problem`]s: `<Kind>/<name>: <field.path>: <why>`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::duration::parse_duration;
use crate::inputs::{namespace_of, Inputs};
use crate::model::*;
use crate::{Diagnostics, Problem};

/// Header names that carry credentials; `policy.auditLog.callerHeader` may not name one.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// How references to other objects (InferenceServices, Secrets) that are not in the input are
/// treated. `validate` checks a manifest on its own (the objects may exist in the cluster): a
/// warning. `compile` needs them (port, namespace, credentials): an error, unless the command line
/// supplies the address (`--resolve` / `--endpoints`).
#[derive(Debug, Clone, Default)]
pub struct RefPolicy {
    pub missing_is_error: bool,
    /// InferenceService names whose address is given on the command line.
    pub resolved_names: BTreeSet<String>,
}

struct Ctx<'a> {
    label: String,
    diags: &'a mut Diagnostics,
}

impl Ctx<'_> {
    fn err(&mut self, path: impl Into<String>, msg: impl Into<String>) {
        self.diags.error(Problem::new(&self.label, path, msg));
    }
    fn warn(&mut self, path: impl Into<String>, msg: impl Into<String>) {
        self.diags.warn(Problem::new(&self.label, path, msg));
    }
    fn duration(&mut self, path: &str, s: &str) -> Option<Duration> {
        match parse_duration(s) {
            Ok(d) => Some(d),
            Err(e) => {
                self.err(path, e);
                None
            }
        }
    }
    fn range(&mut self, path: &str, v: i64, min: i64, max: i64) -> bool {
        if v < min || v > max {
            self.err(path, format!("must be between {min} and {max}, got {v}"));
            false
        } else {
            true
        }
    }
    fn header(&mut self, path: &str, name: &str) {
        if !is_header_token(name) {
            self.err(
                path,
                format!("{name:?} is not a valid HTTP header name (RFC 7230 token)"),
            );
        }
    }
}

/// `^[a-z0-9][a-z0-9-]{0,62}$`
pub fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// RFC 7230 `token` (tchar+).
pub fn is_header_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
}

/// `^[0-9]+(\.[0-9]+)?$`
pub fn is_decimal(s: &str) -> bool {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    !int.is_empty()
        && int.bytes().all(|c| c.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()))
}

/// RFC 1123 label: `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, at most 63.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A CIDR (`10.0.0.0/8`, `fd00::/8`) or a single address.
pub fn is_cidr_or_addr(s: &str) -> bool {
    match s.split_once('/') {
        None => s.parse::<IpAddr>().is_ok(),
        Some((ip, len)) => match (ip.parse::<IpAddr>(), len.parse::<u8>()) {
            (Ok(IpAddr::V4(_)), Ok(l)) => l <= 32 && !len.starts_with('+'),
            (Ok(IpAddr::V6(_)), Ok(l)) => l <= 128 && !len.starts_with('+'),
            _ => false,
        },
    }
}

/// Glob syntax used by `match.models`: `*`, `?`, `[...]` (with `!`/`^` negation, ranges).
pub fn check_glob(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("empty pattern".into());
    }
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                let mut n = 0;
                if matches!(chars.peek(), Some('!') | Some('^')) {
                    chars.next();
                }
                loop {
                    match chars.next() {
                        None => return Err(format!("unclosed '[' in glob {s:?}")),
                        Some(']') if n > 0 => break,
                        Some('\\') => {
                            chars.next();
                            n += 1
                        }
                        Some(_) => n += 1,
                    }
                }
            }
            '\\' if chars.next().is_none() => return Err(format!("trailing '\\' in glob {s:?}")),
            _ => {}
        }
    }
    Ok(())
}

/// The response-header timeout cap (`spec.proxy.responseHeaderTimeout`, default 120s); the
/// default when the value is invalid (which is reported separately).
pub fn response_header_cap(spec: &ModelRouterSpec) -> Duration {
    spec.proxy
        .as_ref()
        .and_then(|p| p.response_header_timeout.as_deref())
        .and_then(|s| parse_duration(s).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_RESPONSE_HEADER_TIMEOUT)
}

/// Validates one ModelRouter. `inputs` supplies the referenced objects; `refs` says how missing
/// ones are reported.
pub fn validate_router(
    router: &ModelRouter,
    inputs: &Inputs,
    refs: &RefPolicy,
    diags: &mut Diagnostics,
) {
    let name = router.metadata.name.clone().unwrap_or_default();
    let mut cx = Ctx {
        label: format!("ModelRouter/{name}"),
        diags,
    };
    let cx = &mut cx;
    if !is_dns_subdomain(&name) {
        cx.err(
            "metadata.name",
            format!("{name:?} is not a valid Kubernetes name (RFC 1123 subdomain)"),
        );
    }
    let namespace = namespace_of(&router.metadata).to_string();
    if !is_dns_label(&namespace) {
        cx.err(
            "metadata.namespace",
            format!("{namespace:?} is not a valid namespace name (RFC 1123 label)"),
        );
    }
    let spec = &router.spec;
    let data_plane = spec.data_plane.unwrap_or_default();

    let cap = validate_proxy(cx, spec);
    validate_backends(cx, spec, cap, data_plane);
    validate_rules(cx, spec, cap);
    if let Some(d) = &spec.default_route {
        if spec.backend(d).is_none() {
            cx.err(
                "spec.defaultRoute",
                format!("backend {d:?} is not declared in spec.backends"),
            );
        }
    }
    validate_policy(cx, spec);
    validate_data_plane_refs(cx, spec, data_plane);
    validate_endpoint(cx, spec);
    if spec.mcp_server.as_ref().and_then(|m| m.enabled) == Some(true) {
        cx.warn(
            "spec.mcpServer.enabled",
            "MCP exposure is reserved and not implemented; ignored",
        );
    }
    validate_references(cx, spec, &namespace, inputs, refs);
}

fn validate_proxy(cx: &mut Ctx, spec: &ModelRouterSpec) -> Duration {
    let mut cap = DEFAULT_RESPONSE_HEADER_TIMEOUT;
    let Some(p) = &spec.proxy else { return cap };
    if let Some(s) = &p.response_header_timeout {
        if let Some(d) = cx.duration("spec.proxy.responseHeaderTimeout", s) {
            if d.is_zero() {
                cx.err("spec.proxy.responseHeaderTimeout", "must be greater than 0");
            } else {
                cap = d;
            }
        }
    }
    if let Some(s) = &p.stream_idle_timeout {
        cx.duration("spec.proxy.streamIdleTimeout", s);
    }
    if let Some(s) = &p.quarantine_duration {
        if let Some(d) = cx.duration("spec.proxy.quarantineDuration", s) {
            if d.is_zero() {
                cx.err("spec.proxy.quarantineDuration", "must be greater than 0");
            }
        }
    }
    if let Some(s) = &p.drain_timeout {
        if let Some(d) = cx.duration("spec.proxy.drainTimeout", s) {
            if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
                cx.err(
                    "spec.proxy.drainTimeout",
                    format!("must be between 1s and 1h, got {s:?}"),
                );
            }
        }
    }
    if let Some(r) = p.replicas {
        cx.range("spec.proxy.replicas", r, 1, 10);
    }
    if let Some(r) = p.revision_history_limit {
        cx.range("spec.proxy.revisionHistoryLimit", r, 0, i32::MAX as i64);
    }
    if let Some(n) = &p.service_name {
        if !is_dns_label(n) || !n.as_bytes()[0].is_ascii_lowercase() {
            cx.err(
                "spec.proxy.serviceName",
                format!(
                    "{n:?} must match ^[a-z]([-a-z0-9]*[a-z0-9])?$ and be at most 63 characters"
                ),
            );
        }
    }
    if let Some(n) = &p.runtime_class_name {
        if !is_dns_subdomain(n) {
            cx.err(
                "spec.proxy.runtimeClassName",
                format!("{n:?} is not a valid RuntimeClass name"),
            );
        }
    }
    if let Some(i) = &p.image {
        if i.trim().is_empty() || i.contains(char::is_whitespace) {
            cx.err(
                "spec.proxy.image",
                format!("{i:?} is not a valid image reference"),
            );
        }
    }
    for (i, s) in p.image_pull_secrets.iter().flatten().enumerate() {
        if s.name.is_empty() {
            cx.err(
                format!("spec.proxy.imagePullSecrets[{i}].name"),
                "must not be empty",
            );
        }
    }
    // Light checks of the pod-spec passthrough blobs.
    if let Some(v) = &p.affinity {
        if !v.is_object() {
            cx.err(
                "spec.proxy.affinity",
                "must be an object (core/v1 Affinity)",
            );
        } else {
            for k in v.as_object().unwrap().keys() {
                if !matches!(
                    k.as_str(),
                    "nodeAffinity" | "podAffinity" | "podAntiAffinity"
                ) {
                    cx.err(format!("spec.proxy.affinity.{k}"), "unknown field, expected one of `nodeAffinity`, `podAffinity`, `podAntiAffinity`");
                }
            }
        }
    }
    if let Some(v) = &p.resources {
        match v.as_object() {
            None => cx.err(
                "spec.proxy.resources",
                "must be an object (core/v1 ResourceRequirements)",
            ),
            Some(m) => {
                for (k, val) in m {
                    match k.as_str() {
                        "limits" | "requests" => {
                            if !val
                                .as_object()
                                .is_some_and(|o| o.values().all(|q| q.is_string() || q.is_number()))
                            {
                                cx.err(
                                    format!("spec.proxy.resources.{k}"),
                                    "must map resource names to quantities",
                                );
                            }
                        }
                        "claims" => {
                            if !val.as_array().is_some_and(|a| {
                                a.iter()
                                    .all(|c| c.get("name").is_some_and(|n| n.is_string()))
                            }) {
                                cx.err(
                                    "spec.proxy.resources.claims",
                                    "must be a list of objects with a name",
                                );
                            }
                        }
                        _ => cx.err(
                            format!("spec.proxy.resources.{k}"),
                            "unknown field, expected one of `claims`, `limits`, `requests`",
                        ),
                    }
                }
            }
        }
    }
    if let Some(v) = &p.tolerations {
        match v.as_array() {
            None => cx.err(
                "spec.proxy.tolerations",
                "must be a list (core/v1 Toleration)",
            ),
            Some(a) => {
                for (i, t) in a.iter().enumerate() {
                    if !t.is_object() {
                        cx.err(format!("spec.proxy.tolerations[{i}]"), "must be an object");
                    }
                }
            }
        }
    }
    if let Some(v) = &p.topology_spread_constraints {
        match v.as_array() {
            None => cx.err(
                "spec.proxy.topologySpreadConstraints",
                "must be a list (core/v1 TopologySpreadConstraint)",
            ),
            Some(a) => {
                for (i, t) in a.iter().enumerate() {
                    for req in ["maxSkew", "topologyKey", "whenUnsatisfiable"] {
                        if t.get(req).is_none() {
                            cx.err(
                                format!("spec.proxy.topologySpreadConstraints[{i}].{req}"),
                                "is required",
                            );
                        }
                    }
                }
            }
        }
    }
    cap
}

fn validate_backends(cx: &mut Ctx, spec: &ModelRouterSpec, cap: Duration, data_plane: DataPlane) {
    if spec.backends.is_empty() {
        cx.err("spec.backends", "at least one backend must be declared");
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut ids: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, b) in spec.backends.iter().enumerate() {
        let p = format!("spec.backends[{i}]");
        if !is_name(&b.name) {
            cx.err(
                format!("{p}.name"),
                format!("{:?} must match ^[a-z0-9][a-z0-9-]{{0,62}}$", b.name),
            );
        }
        let dup_name = if let Some(j) = seen.insert(&b.name, i) {
            cx.err(
                format!("{p}.name"),
                format!(
                    "duplicate backend name {:?} (also spec.backends[{j}])",
                    b.name
                ),
            );
            true
        } else {
            false
        };
        if let Some(d) = &b.display_name {
            if d.trim().is_empty() {
                cx.err(format!("{p}.displayName"), "must not be empty when set");
            }
        }
        if let Some(j) = ids.insert(b.model_id(), i) {
            if !dup_name {
                cx.err(
                    p.clone(),
                    format!("model id {:?} (displayName, else name) is also published by spec.backends[{j}]", b.model_id()),
                );
            }
        }
        match (&b.inference_service_ref, &b.external) {
            (Some(_), Some(_)) => cx.err(
                p.clone(),
                "inferenceServiceRef and external are mutually exclusive; set exactly one",
            ),
            (None, None) => cx.err(
                p.clone(),
                "exactly one of inferenceServiceRef or external must be set",
            ),
            _ => {}
        }
        if let Some(r) = &b.inference_service_ref {
            if !is_dns_subdomain(&r.name) {
                cx.err(
                    format!("{p}.inferenceServiceRef.name"),
                    format!("{:?} is not a valid InferenceService name", r.name),
                );
            }
        }
        if let Some(e) = &b.external {
            if e.model.trim().is_empty() {
                cx.err(format!("{p}.external.model"), "must not be empty");
            }
            match &e.url {
                None if e.provider == Provider::Litellm => cx.err(
                    format!("{p}.external.url"),
                    "is required for provider litellm (the LiteLLM proxy's base URL)",
                ),
                None => {}
                Some(u) => {
                    if let Err(why) = crate::envoy::parse_url(u) {
                        cx.err(format!("{p}.external.url"), why);
                    }
                }
            }
            if let Some(s) = &e.credentials_secret_ref {
                if !is_dns_subdomain(&s.name) {
                    cx.err(
                        format!("{p}.external.credentialsSecretRef.name"),
                        format!("{:?} is not a valid Secret name", s.name),
                    );
                }
            }
            if b.resolution.is_some() {
                cx.warn(
                    format!("{p}.resolution"),
                    "external backends ignore resolution",
                );
            }
        }
        if let Some(w) = b.weight {
            cx.range(&format!("{p}.weight"), w, 0, i32::MAX as i64);
        }
        if let Some(t) = &b.timeout {
            check_timeout(cx, &format!("{p}.timeout"), t, cap);
        }
        if let Some(c) = &b.cost_per_million_tokens {
            for (f, v) in [
                ("completionUSD", &c.completion_usd),
                ("promptUSD", &c.prompt_usd),
            ] {
                if let Some(v) = v {
                    if !is_decimal(v) {
                        cx.err(
                            format!("{p}.costPerMillionTokens.{f}"),
                            format!("{v:?} must match ^[0-9]+(\\.[0-9]+)?$"),
                        );
                    }
                }
            }
        }
        for (j, c) in b.capabilities.iter().enumerate() {
            if c.trim().is_empty() {
                cx.err(format!("{p}.capabilities[{j}]"), "must not be empty");
            }
        }
        if let Some(h) = &b.health_check {
            if let Some(v) = h.interval_seconds {
                cx.range(
                    &format!("{p}.healthCheck.intervalSeconds"),
                    v,
                    1,
                    i32::MAX as i64,
                );
            }
            if let Some(v) = h.timeout_seconds {
                cx.range(
                    &format!("{p}.healthCheck.timeoutSeconds"),
                    v,
                    1,
                    i32::MAX as i64,
                );
            }
            if let Some(path) = &h.path {
                if !path.starts_with('/') {
                    cx.err(
                        format!("{p}.healthCheck.path"),
                        format!("{path:?} must start with '/'"),
                    );
                }
            }
        }
        if let Some(m) = &b.model_info {
            if let Some(c) = m.context_length {
                cx.range(&format!("{p}.modelInfo.contextLength"), c, 1, i64::MAX);
            }
            for (f, list) in [
                ("inputModalities", &m.input_modalities),
                ("outputModalities", &m.output_modalities),
            ] {
                if let Some(list) = list {
                    if list.len() > 5 {
                        cx.err(
                            format!("{p}.modelInfo.{f}"),
                            format!("at most 5 items, got {}", list.len()),
                        );
                    }
                    for (j, v) in list.iter().enumerate() {
                        if v.trim().is_empty() {
                            cx.err(format!("{p}.modelInfo.{f}[{j}]"), "must not be empty");
                        }
                    }
                }
            }
        }
        if let Some(ep) = &b.endpoint_picker {
            if let Some(s) = &ep.service {
                if s.name.is_empty() {
                    cx.err(
                        format!("{p}.endpointPicker.service.name"),
                        "must not be empty",
                    );
                }
                cx.range(
                    &format!("{p}.endpointPicker.service.port"),
                    s.port,
                    1,
                    65535,
                );
            }
        }
        if let Some(bal) = &b.balancing {
            validate_balancing(cx, &p, b, bal, data_plane);
        }
    }
}

fn validate_balancing(
    cx: &mut Ctx,
    p: &str,
    b: &RouterBackend,
    bal: &Balancing,
    data_plane: DataPlane,
) {
    let p = format!("{p}.balancing");
    if b.external.is_some() || b.resolution() != Resolution::Endpoint {
        cx.err(p.clone(), "balancing requires resolution: endpoint");
    }
    if data_plane != DataPlane::Proxy {
        cx.warn(p.clone(), "balancing applies to dataPlane: Proxy only; ignored by the Gateway and AgentGateway data planes");
    }
    let load_aware = bal.mode == Some(BalancingMode::LoadAware);
    if let Some(pa) = &bal.prefix_affinity {
        if !load_aware {
            cx.warn(
                format!("{p}.prefixAffinity"),
                "requires mode: LoadAware; ignored with RoundRobin (PrefixAffinityIgnored)",
            );
        }
        if let Some(v) = pa.block_bytes {
            cx.range(&format!("{p}.prefixAffinity.blockBytes"), v, 256, 16384);
        }
        if let Some(v) = pa.max_blocks_per_endpoint {
            cx.range(
                &format!("{p}.prefixAffinity.maxBlocksPerEndpoint"),
                v,
                1024,
                262144,
            );
        }
    }
    if let Some(sa) = &bal.session_affinity {
        let sp = format!("{p}.sessionAffinity");
        if !load_aware {
            cx.warn(
                sp.clone(),
                "requires mode: LoadAware; ignored with RoundRobin (SessionAffinityIgnored)",
            );
        }
        if sa.headers.is_empty() || sa.headers.len() > 8 {
            cx.err(
                format!("{sp}.headers"),
                format!("must list 1 to 8 header names, got {}", sa.headers.len()),
            );
        }
        for (i, h) in sa.headers.iter().enumerate() {
            cx.header(&format!("{sp}.headers[{i}]"), h);
        }
        if let Some(t) = &sa.idle_timeout {
            if let Some(d) = cx.duration(&format!("{sp}.idleTimeout"), t) {
                if d < Duration::from_secs(60) || d > Duration::from_secs(24 * 3600) {
                    cx.err(
                        format!("{sp}.idleTimeout"),
                        format!("must be between 1m and 24h, got {t:?}"),
                    );
                }
            }
        }
        if let Some(m) = sa.max_load_percent {
            if cx.range(&format!("{sp}.maxLoadPercent"), m, 101, 1000) {
                cx.warn(
                    format!("{sp}.maxLoadPercent"),
                    "is deprecated and has no effect",
                );
            }
        }
    }
}

fn check_timeout(cx: &mut Ctx, path: &str, s: &str, cap: Duration) -> Option<Duration> {
    let d = cx.duration(path, s)?;
    if d.is_zero() {
        cx.err(path, "must be greater than 0");
        return None;
    }
    if d > cap {
        cx.err(
            path,
            format!(
                "{s:?} exceeds spec.proxy.responseHeaderTimeout ({}); a per-rule or per-backend timeout can only tighten the cap",
                crate::duration::envoy_duration(cap)
            ),
        );
    }
    Some(d)
}

fn validate_rules(cx: &mut Ctx, spec: &ModelRouterSpec, cap: Duration) {
    let sensitive = spec.sensitive_classifications();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let mut catch_all: Option<usize> = None;
    for (i, r) in spec.rules.iter().enumerate() {
        let p = format!("spec.rules[{i}]");
        if !is_name(&r.name) {
            cx.err(
                format!("{p}.name"),
                format!("{:?} must match ^[a-z0-9][a-z0-9-]{{0,62}}$", r.name),
            );
        }
        if let Some(j) = seen.insert(&r.name, i) {
            cx.err(
                format!("{p}.name"),
                format!("duplicate rule name {:?} (also spec.rules[{j}])", r.name),
            );
        }
        if let Some(j) = catch_all {
            cx.warn(p.clone(), format!("unreachable: spec.rules[{j}] has no match conditions and matches every request first"));
        }
        let m = r.match_.clone().unwrap_or_default();
        if m.is_catch_all() && catch_all.is_none() {
            catch_all = Some(i);
        }
        let strategy = r.route.strategy.unwrap_or_default();
        if let Some(t) = &r.timeout {
            check_timeout(cx, &format!("{p}.timeout"), t, cap);
        }
        // Route backends.
        let rb = format!("{p}.route.backends");
        if r.route.backends.is_empty() {
            cx.err(rb.clone(), "at least one backend is required");
        }
        let mut in_rule = BTreeSet::new();
        let mut declared = Vec::new();
        for (j, name) in r.route.backends.iter().enumerate() {
            match spec.backend(name) {
                None => cx.err(
                    format!("{rb}[{j}]"),
                    format!("backend {name:?} is not declared in spec.backends"),
                ),
                Some(b) => declared.push(b),
            }
            if !in_rule.insert(name.as_str()) {
                cx.err(
                    format!("{rb}[{j}]"),
                    format!("backend {name:?} is listed twice"),
                );
            }
        }
        match strategy {
            Strategy::Weighted => {
                if !declared.is_empty() && declared.iter().all(|b| b.effective_weight() <= 0) {
                    cx.err(
                        format!("{p}.route.strategy"),
                        "a weighted rule needs at least one backend with a positive weight",
                    );
                }
            }
            Strategy::Shadow => {
                if r.route.backends.len() < 2 {
                    cx.err(
                        format!("{p}.route.backends"),
                        "the shadow strategy needs at least two backends",
                    );
                }
            }
            Strategy::PrimaryFallback => {}
        }
        // Match.
        let mp = format!("{p}.match");
        let mut lower_names = BTreeMap::new();
        for k in m.headers.keys() {
            cx.header(&format!("{mp}.headers.{k}"), k);
            if let Some(prev) = lower_names.insert(k.to_ascii_lowercase(), k) {
                cx.err(
                    format!("{mp}.headers.{k}"),
                    format!("duplicates header {prev:?} (names are case-insensitive)"),
                );
            }
        }
        for (j, g) in m.models.iter().enumerate() {
            if let Err(e) = check_glob(g) {
                cx.err(format!("{mp}.models[{j}]"), e);
            }
        }
        if let Some(l) = m.latency_slo_ms {
            if cx.range(&format!("{mp}.latencySLOMs"), l, 1, i32::MAX as i64)
                && strategy != Strategy::PrimaryFallback
            {
                cx.warn(
                    format!("{mp}.latencySLOMs"),
                    "is honored only by the primary-fallback strategy",
                );
            }
        }
        for (j, c) in m.data_classification.iter().enumerate() {
            if c.trim().is_empty() {
                cx.err(format!("{mp}.dataClassification[{j}]"), "must not be empty");
            }
        }
        let sensitive_hit: Vec<&String> = m
            .data_classification
            .iter()
            .filter(|c| sensitive.contains(&c.to_ascii_lowercase()))
            .collect();
        if let Some(first) = sensitive_hit.first() {
            if r.fail_closed != Some(true) {
                cx.err(
                    format!("{p}.failClosed"),
                    format!(
                        "rule matches sensitive classification {:?} and must set failClosed: true",
                        first.to_ascii_lowercase()
                    ),
                );
            }
            for (j, name) in r.route.backends.iter().enumerate() {
                if let Some(b) = spec.backend(name) {
                    if b.effective_tier() != Tier::Local {
                        cx.err(
                            format!("{rb}[{j}]"),
                            format!(
                                "rule matches sensitive classification {:?} and may only route to tier: local backends; {name:?} is cloud{}",
                                first.to_ascii_lowercase(),
                                if b.tier.is_none() { " (external backends default to tier: cloud)" } else { "" }
                            ),
                        );
                    }
                }
            }
        } else if r.fail_closed == Some(true) {
            for (j, name) in r.route.backends.iter().enumerate() {
                if spec
                    .backend(name)
                    .is_some_and(|b| b.effective_tier() != Tier::Local)
                {
                    cx.err(format!("{rb}[{j}]"), format!("fail-closed rules can only route to tier: local backends; {name:?} is cloud"));
                }
            }
        }
        if !m.required_capabilities.is_empty() && !declared.is_empty() {
            let ok = declared.iter().any(|b| {
                m.required_capabilities
                    .iter()
                    .all(|c| b.capabilities.contains(c))
            });
            if !ok {
                cx.err(
                    format!("{mp}.requiredCapabilities"),
                    format!(
                        "no backend of the route advertises all of {:?}; the rule could never match",
                        m.required_capabilities
                    ),
                );
            }
        }
    }
}

fn validate_policy(cx: &mut Ctx, spec: &ModelRouterSpec) {
    let Some(policy) = &spec.policy else { return };
    if let Some(c) = &policy.classification {
        if let Some(h) = &c.header_key {
            cx.header("spec.policy.classification.headerKey", h);
        }
        match c.mode.unwrap_or_default() {
            ClassificationMode::HeaderOnly => {}
            m @ (ClassificationMode::Detector | ClassificationMode::Hybrid) => cx.err(
                "spec.policy.classification.mode",
                format!(
                    "ClassifierNotImplemented: mode {:?} is reserved for a future content classifier; only header-only is implemented",
                    if m == ClassificationMode::Detector { "detector" } else { "hybrid" }
                ),
            ),
        }
        if let Some(list) = &c.sensitive_classifications {
            for (i, s) in list.iter().enumerate() {
                if s.trim().is_empty() {
                    cx.err(
                        format!("spec.policy.classification.sensitiveClassifications[{i}]"),
                        "must not be empty",
                    );
                }
            }
        }
    }
    if let Some(a) = &policy.audit_log {
        if let Some(h) = &a.caller_header {
            let p = "spec.policy.auditLog.callerHeader";
            if h.len() > 64 {
                cx.err(p, format!("at most 64 characters, got {}", h.len()));
            }
            if h.is_empty()
                || !h
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+.^_|~-".contains(&c))
            {
                cx.err(
                    p,
                    format!("{h:?} is not a valid HTTP header name (RFC 7230 token)"),
                );
            } else if CREDENTIAL_HEADERS.contains(&h.to_ascii_lowercase().as_str()) {
                cx.err(
                    p,
                    format!("{h:?} carries a credential and cannot be logged as caller"),
                );
            }
        }
        if let Some(cidrs) = &a.trusted_proxy_cidrs {
            if cidrs.len() > 32 {
                cx.err(
                    "spec.policy.auditLog.trustedProxyCIDRs",
                    format!("at most 32 entries, got {}", cidrs.len()),
                );
            }
            for (i, c) in cidrs.iter().enumerate() {
                if !is_cidr_or_addr(c) {
                    cx.err(
                        format!("spec.policy.auditLog.trustedProxyCIDRs[{i}]"),
                        format!("{c:?} is not a CIDR or an IP address"),
                    );
                }
            }
            if !cidrs.is_empty() && a.log_client_address != Some(true) {
                cx.err(
                    "spec.policy.auditLog.trustedProxyCIDRs",
                    "requires logClientAddress: true",
                );
            }
        }
        if a.file_path.is_some() && a.sink != Some(AuditSink::File) {
            cx.warn(
                "spec.policy.auditLog.filePath",
                "is used only with sink: file",
            );
        }
    }
    if let Some(auth) = &policy.auth {
        if let Some(j) = &auth.jwt {
            for (f, v) in [
                ("issuer", &j.issuer),
                ("jwksURI", &j.jwks_uri),
                ("provider", &j.provider),
                ("teamClaim", &j.team_claim),
            ] {
                if v.is_empty() {
                    cx.err(format!("spec.policy.auth.jwt.{f}"), "must not be empty");
                }
            }
            if let Some(h) = &j.header_key {
                cx.header("spec.policy.auth.jwt.headerKey", h);
            }
        }
        if !auth.allowlists.is_empty() && auth.jwt.is_none() {
            cx.err(
                "spec.policy.auth.allowlists",
                "authorization requires authentication: set spec.policy.auth.jwt",
            );
        }
        let mut teams = BTreeMap::new();
        for (i, a) in auth.allowlists.iter().enumerate() {
            if a.team.is_empty() {
                cx.err(
                    format!("spec.policy.auth.allowlists[{i}].team"),
                    "must not be empty",
                );
            } else if let Some(j) = teams.insert(a.team.as_str(), i) {
                cx.err(
                    format!("spec.policy.auth.allowlists[{i}].team"),
                    format!("duplicate team {:?} (also allowlists[{j}])", a.team),
                );
            }
        }
    }
    let mut names = BTreeMap::new();
    for (i, b) in policy.budgets.iter().enumerate() {
        let p = format!("spec.policy.budgets[{i}]");
        if !is_name(&b.name) {
            cx.err(
                format!("{p}.name"),
                format!("{:?} must match ^[a-z0-9][a-z0-9-]{{0,62}}$", b.name),
            );
        }
        if let Some(j) = names.insert(b.name.as_str(), i) {
            cx.err(
                format!("{p}.name"),
                format!(
                    "duplicate budget name {:?} (also spec.policy.budgets[{j}])",
                    b.name
                ),
            );
        }
        if b.max_tokens.is_none() && b.max_usd.is_none() {
            cx.err(
                p.clone(),
                "either maxTokens or maxUSD (or both) must be set",
            );
        }
        if let Some(t) = b.max_tokens {
            cx.range(&format!("{p}.maxTokens"), t, 1, i64::MAX);
        }
        if let Some(u) = &b.max_usd {
            if !is_decimal(u) {
                cx.err(
                    format!("{p}.maxUSD"),
                    format!("{u:?} must match ^[0-9]+(\\.[0-9]+)?$"),
                );
            }
        }
        if let Some(w) = b.window_seconds {
            cx.range(&format!("{p}.windowSeconds"), w, 1, i32::MAX as i64);
        }
        if let Some(h) = &b.header_key {
            cx.header(&format!("{p}.headerKey"), h);
        }
        match b.scope {
            BudgetScope::Rule => match &b.rule_name {
                None => cx.err(format!("{p}.ruleName"), "is required when scope is rule"),
                Some(r) if !spec.rules.iter().any(|x| &x.name == r) => cx.err(
                    format!("{p}.ruleName"),
                    format!("rule {r:?} is not declared in spec.rules"),
                ),
                Some(_) => {}
            },
            _ => {
                if b.rule_name.is_some() {
                    cx.warn(format!("{p}.ruleName"), "is used only when scope is rule");
                }
            }
        }
        if b.header_key.is_some() && b.scope != BudgetScope::Team {
            cx.warn(format!("{p}.headerKey"), "is used only when scope is team");
        }
    }
}

fn validate_data_plane_refs(cx: &mut Ctx, spec: &ModelRouterSpec, data_plane: DataPlane) {
    if let Some(g) = &spec.gateway_ref {
        if g.name.is_empty() {
            cx.err("spec.gatewayRef.name", "must not be empty");
        }
    }
    if data_plane == DataPlane::Gateway && spec.gateway_ref.is_none() {
        cx.err("spec.gatewayRef", "is required when dataPlane is Gateway");
    }
    if data_plane == DataPlane::AgentGateway && spec.agent_gateway_ref.is_none() {
        cx.err(
            "spec.agentGatewayRef",
            "is required when dataPlane is AgentGateway",
        );
    }
    let Some(a) = &spec.agent_gateway_ref else {
        return;
    };
    let p = "spec.agentGatewayRef";
    if a.name.is_empty() {
        cx.err(format!("{p}.name"), "must not be empty");
    }
    if let Some(port) = a.endpoint_picker_port {
        cx.range(&format!("{p}.endpointPickerPort"), port, 1, 65535);
    }
    if a.endpoint_picker.is_some() != a.endpoint_picker_port.is_some() {
        cx.err(
            format!("{p}.endpointPickerPort"),
            "endpointPicker and endpointPickerPort must be set together",
        );
    }
    if let Some(h) = &a.hostnames {
        if h.is_empty() || h.len() > 16 {
            cx.err(
                format!("{p}.hostnames"),
                format!("must list 1 to 16 hostnames, got {}", h.len()),
            );
        }
    }
    if let Some(s) = &a.section_name {
        if !is_dns_subdomain(s) {
            cx.err(
                format!("{p}.sectionName"),
                format!("{s:?} must be a lowercase RFC 1123 subdomain of at most 253 characters"),
            );
        }
    }
    if a.routing == Some(AgentGatewayRouting::Model) && data_plane == DataPlane::AgentGateway {
        if a.section_name.is_none() && a.hostnames.is_none() {
            cx.err(
                format!("{p}.routing"),
                "routing: Model requires sectionName or hostnames",
            );
        }
        if !spec.rules.is_empty() {
            cx.err(
                "spec.rules",
                "are refused with agentGatewayRef.routing: Model",
            );
        }
        if spec.default_route.is_some() {
            cx.err(
                "spec.defaultRoute",
                "is refused with agentGatewayRef.routing: Model",
            );
        }
        for (i, b) in spec.backends.iter().enumerate() {
            if b.external.is_some() {
                cx.err(
                    format!("spec.backends[{i}].external"),
                    "external backends are refused with agentGatewayRef.routing: Model",
                );
            }
            if b.resolution == Some(Resolution::Endpoint) {
                cx.err(
                    format!("spec.backends[{i}].resolution"),
                    "resolution: endpoint is refused with agentGatewayRef.routing: Model",
                );
            }
            if b.endpoint_picker.is_some() {
                cx.err(
                    format!("spec.backends[{i}].endpointPicker"),
                    "per-backend endpoint pickers are refused with agentGatewayRef.routing: Model",
                );
            }
        }
    }
}

fn validate_endpoint(cx: &mut Ctx, spec: &ModelRouterSpec) {
    let Some(e) = &spec.endpoint else { return };
    if e.api_key_secret_ref.is_some() {
        cx.err(
            "spec.endpoint.apiKeySecretRef",
            "is not supported on ModelRouter",
        );
    }
    if let Some(p) = e.port {
        cx.range("spec.endpoint.port", p, 1, 65535);
    }
    if let Some(n) = e.node_port {
        cx.range("spec.endpoint.nodePort", n, 30000, 32767);
        if e.service_type != Some(ServiceType::NodePort) {
            cx.err("spec.endpoint.nodePort", "requires endpoint.type NodePort");
        }
    }
    if e.external_traffic_policy.is_some()
        && !matches!(
            e.service_type,
            Some(ServiceType::NodePort | ServiceType::LoadBalancer)
        )
    {
        cx.err(
            "spec.endpoint.externalTrafficPolicy",
            "requires endpoint.type NodePort or LoadBalancer",
        );
    }
    if let Some(path) = &e.path {
        if !path.starts_with('/') {
            cx.err(
                "spec.endpoint.path",
                format!("{path:?} must start with '/'"),
            );
        }
    }
    if let Some(g) = &e.gateway {
        if g.gateway_ref.name.is_empty() {
            cx.err("spec.endpoint.gateway.gatewayRef.name", "must not be empty");
        }
    }
}

fn validate_references(
    cx: &mut Ctx,
    spec: &ModelRouterSpec,
    namespace: &str,
    inputs: &Inputs,
    refs: &RefPolicy,
) {
    let report = |cx: &mut Ctx, path: String, msg: String| {
        if refs.missing_is_error {
            cx.err(path, msg)
        } else {
            cx.warn(path, msg)
        }
    };
    for (i, b) in spec.backends.iter().enumerate() {
        if let Some(r) = &b.inference_service_ref {
            if r.name.is_empty() || refs.resolved_names.contains(&r.name) {
                continue;
            }
            if inputs.inference_service(namespace, &r.name).is_none() {
                report(
                    cx,
                    format!("spec.backends[{i}].inferenceServiceRef.name"),
                    format!("InferenceService {namespace}/{} is not in the input (add it, or give its address with --resolve/--endpoints)", r.name),
                );
            }
        }
        if let Some(s) = b
            .external
            .as_ref()
            .and_then(|e| e.credentials_secret_ref.as_ref())
        {
            if !s.name.is_empty() && inputs.secret(namespace, &s.name).is_none() {
                report(
                    cx,
                    format!("spec.backends[{i}].external.credentialsSecretRef.name"),
                    format!("Secret {namespace}/{} is not in the input", s.name),
                );
            }
        }
    }
}
