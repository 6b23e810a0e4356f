//! The validated intermediate form every target emits from: one ModelRouter with its plugin
//! config, the filter's own [`Router`] built from it, each backend resolved to where its traffic
//! goes, the route keys the filter can stamp (with attempt orders, per-attempt timeouts and
//! shadow targets) and the durations the gateways apply.
//!
//! Built once by [`build`] after validation; emitters (`targets::*`) only render it, so two
//! targets cannot decide differently. Credentials are Secret references; the value is filled in
//! only when the Secret is part of the input, for the envoy target's inline secret store.

use std::collections::BTreeMap;
use std::time::Duration;

use router_core::config::{self as rc, PluginConfig, DEFAULT_MAX_BODY_BYTES};
use router_core::orders;
use router_core::router::Router;

pub mod callout_clusters;
pub mod picks;

use crate::inputs::{namespace_of, router_key, secret_values, Inputs};
use crate::model::*;
use crate::plugin::{plugin_config, PluginContext};
use crate::url::{parse_url, ParsedUrl};
use crate::{Diagnostics, Problem};

/// What a compile needs besides the manifests, whatever the target.
#[derive(Debug, Clone, Default)]
pub struct CompileOptions {
    /// `--router NAME`: which ModelRouter to compile when the input holds several.
    pub router: Option<String>,
    /// `--resolve NAME=HOST:PORT`: InferenceService name → address used instead of cluster DNS.
    pub resolve: BTreeMap<String, (String, u16)>,
    /// `--endpoints NAME=IP:PORT,...`: pods of `resolution: endpoint` backends on that
    /// InferenceService (instead of EndpointSlices).
    pub endpoints: BTreeMap<String, Vec<(String, u16)>>,
    pub model_header: Option<String>,
    pub max_body_bytes: Option<u64>,
    /// UNSAFE, tests only, not on the command line: budgets check without reserving and charge
    /// after the response (concurrent requests overshoot). The end-to-end test's counterexample.
    pub unsafe_budgets_charge_after: bool,
    /// The cluster of `llmkube-budgets` when budgets are kept there (the envoy target's
    /// `--budgets-service`); `None`: in the gateway's shared data.
    pub budgets_cluster: Option<String>,
    /// `--budgets-fail-open`: with the shared ledger unreachable, admit requests unbudgeted
    /// (audited, counted) instead of answering 503.
    pub budgets_fail_open: bool,
    /// `--budgets-hold-ttl SECONDS`: how long a reservation lives if its request never ends.
    pub budgets_hold_ttl_s: Option<u64>,
    /// `--budgets-per-request`: embedded ledgers reserve and settle per request instead of
    /// admitting on per-worker leases (the default).
    pub budgets_per_request: bool,
    /// UNSAFE, tests only, not on the command line: worker leases whose room is not held in
    /// the ledger. The end-to-end control that shows the hold keeps the bound.
    pub unsafe_budgets_worker_leases_unheld: bool,
    /// Lease mode of the shared ledger (`--budgets-lease-tokens`/`--budgets-lease-usd`); only
    /// with `budgets_cluster`.
    pub budgets_lease: Option<router_core::budget::shared_lease::LeaseConfig>,
}

/// How long the filter waits for `llmkube-budgets` to answer a reservation before failing closed.
const SERVICE_TIMEOUT_MS: u64 = 1000;

/// One compiled ModelRouter.
pub struct Ir {
    /// The validated manifest (targets read `gatewayRef`, `policy`, `dataPlane` from it).
    pub router: ModelRouter,
    /// `namespace/name`.
    pub key: String,
    /// `ModelRouter/<name>`, the object part of problem lines.
    pub label: String,
    pub namespace: String,
    pub plugin: PluginConfig,
    /// `plugin` as the JSON string every target hands to the filters.
    pub plugin_json: String,
    /// The filter's view of `plugin`: route keys are enumerated from it.
    pub core: Router,
    /// Same order and indexes as `core`'s backends.
    pub backends: Vec<Backend>,
    /// Every route key the filter can stamp, in table order.
    pub routes: Vec<RoutePlan>,
    /// Backends some shadow rule mirrors to, ascending.
    pub shadow_targets: Vec<usize>,
    pub timeouts: Timeouts,
    pub max_body_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `proxy.responseHeaderTimeout`: bounds every attempt.
    pub response_header_cap: Duration,
    /// `proxy.streamIdleTimeout`; zero = off.
    pub stream_idle: Duration,
    /// `proxy.quarantineDuration`: how long a failed backend stays ejected.
    pub quarantine: Duration,
}

/// Where one backend's traffic goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    pub name: String,
    pub tier: rc::Tier,
    /// `host:port` pairs Envoy connects to (service DNS, `--resolve`, pods, or the URL's host).
    pub endpoints: Vec<(String, u16)>,
    pub kind: BackendKind,
    /// An InferenceService running vLLM (its pods serve vLLM's `/metrics`).
    pub vllm: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// An LLMKube InferenceService (its Service, or its pods with `resolution: endpoint`).
    Service {
        service: String,
        port: u16,
        resolution: Resolution,
    },
    External(External),
}

#[derive(Debug, Clone, PartialEq)]
pub struct External {
    pub provider: Provider,
    /// `external.url`, else the provider's published default.
    pub url: ParsedUrl,
    pub model: String,
    pub credential: Option<Credential>,
}

/// A provider credential: always a Secret reference; `value` (the header value to inject) only
/// when the Secret is in the input and holds the provider's key.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    pub secret: SecretRef,
    /// `authorization`, or `x-api-key` for anthropic.
    pub header: &'static str,
    pub value: Option<String>,
    /// The keys the Secret holds, when it is in the input (never their values).
    pub secret_keys: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl Ir {
    /// The route plans rule `name` stamps, in table order.
    pub fn rule_plans(&self, name: &str) -> Vec<&RoutePlan> {
        self.routes
            .iter()
            .filter(|p| p.rule.as_deref() == Some(name))
            .collect()
    }

    /// A local backend's served model name, when its InferenceService says it: every target
    /// rewrites `model` to it on the way to that backend, as it does an external backend's.
    pub fn served_model(&self, b: &Backend) -> Option<&str> {
        let i = self.core.backend_index(&b.name)?;
        self.core.backend(i).served_model.as_deref()
    }
}

impl Backend {
    pub fn external(&self) -> Option<&External> {
        match &self.kind {
            BackendKind::External(e) => Some(e),
            BackendKind::Service { .. } => None,
        }
    }
    /// The Host header value an external backend needs (the URL's authority).
    pub fn host_rewrite(&self) -> Option<String> {
        self.external().map(|e| e.url.authority())
    }
    /// The URL path of an external backend, without a trailing `/` (empty for none).
    pub fn path_prefix(&self) -> &str {
        self.external().map_or("", |e| e.url.path.as_str())
    }
    /// A path rewrite that changes something (`/v1` alone is the identity).
    pub fn rewrites_path(&self) -> bool {
        let p = self.path_prefix();
        !p.is_empty() && p != "/v1"
    }
}

/// One route of the table: a route key the downstream filter can stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePlan {
    /// `orders::route_key(rule, order)`; `~/<b>` for unruled targets.
    pub key: String,
    /// The rule that stamps it (`None` for unruled targets).
    pub rule: Option<String>,
    /// Backend indexes in attempt order.
    pub order: Vec<usize>,
    /// Effective response-header timeout of each attempt (same length as `order`):
    /// `min(rule.timeout || backend.timeout || cap, cap)` with the attempt's backend.
    pub attempt_timeouts_ms: Vec<u64>,
    /// Backends mirrored to (shadow rules: every backend after the first).
    pub mirrors: Vec<usize>,
}

impl RoutePlan {
    /// True when the attempts need different response-header timeouts (a gateway whose
    /// per-try timeout is one value per route has to apply them per backend instead).
    pub fn per_backend_timeouts(&self) -> bool {
        self.attempt_timeouts_ms
            .iter()
            .any(|&t| t != self.attempt_timeouts_ms[0])
    }

    /// The route-level per-try timeout when every attempt has the same one.
    pub fn uniform_timeout_ms(&self) -> Option<u64> {
        (!self.per_backend_timeouts()).then(|| self.attempt_timeouts_ms[0])
    }
}

pub fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
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
            let mirrors = router_core::shadow::mirrors(rule.strategy, &order).to_vec();
            out.push(RoutePlan {
                key: orders::route_key(&rule.name, &names),
                rule: Some(rule.name.clone()),
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
            rule: None,
            order: vec![b],
            attempt_timeouts_ms: vec![attempt_timeout(None, b)],
            mirrors: Vec::new(),
        });
    }
    out
}

/// Picks the ModelRouter of the compile unit: the one named by `--router`, else the only one.
pub fn select_router<'a>(
    inputs: &'a Inputs,
    name: Option<&str>,
    target: &str,
    diags: &mut Diagnostics,
) -> Option<&'a ModelRouter> {
    let Some(n) = name else {
        return match inputs.routers.len() {
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
                    format!("the {target} target compiles exactly one ModelRouter; found {} ({}): pick one with --router NAME", names.len(), names.join(", ")),
                ));
                None
            }
        };
    };
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

pub fn label_of(router: &ModelRouter) -> String {
    format!(
        "ModelRouter/{}",
        router.metadata.name.as_deref().unwrap_or("")
    )
}

/// Builds the IR of a validated router. `None` (with errors in `diags`) when a backend cannot be
/// resolved or the filter refuses the plugin config.
pub fn build(
    router: &ModelRouter,
    inputs: &Inputs,
    opts: &CompileOptions,
    diags: &mut Diagnostics,
) -> Option<Ir> {
    let spec = &router.spec;
    let namespace = namespace_of(&router.metadata).to_string();
    let label = label_of(router);
    let max_body_bytes = opts.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    let mut plugin = plugin_config(
        router,
        &PluginContext {
            inputs,
            model_header: opts.model_header.as_deref(),
            max_body_bytes: Some(max_body_bytes),
        },
    );
    if let Some(b) = plugin.budgets.as_mut() {
        apply_budget_options(b, opts);
        if let Err(e) = b.compile() {
            let field = crate::plugin::budget_field(spec, b, &e.path);
            diags.error(Problem::new(&label, field, e.why));
            return None;
        }
    }
    let (plugin_json, core) = compile_plugin(&plugin, &label, diags)?;
    let backends = resolve_backends(spec, &plugin, &label, &namespace, inputs, opts, diags);
    if !diags.errors.is_empty() {
        return None;
    }
    let timeouts = Timeouts {
        response_header_cap: spec.response_header_cap(),
        stream_idle: spec.stream_idle_timeout(),
        quarantine: spec.quarantine(),
    };
    let routes = route_plans(&core, ms(timeouts.response_header_cap));
    let mut shadow_targets: Vec<usize> = routes
        .iter()
        .flat_map(|p| p.mirrors.iter().copied())
        .collect();
    shadow_targets.sort_unstable();
    shadow_targets.dedup();
    Some(Ir {
        router: router.clone(),
        key: router_key(router),
        label,
        namespace,
        plugin,
        plugin_json,
        core,
        backends,
        routes,
        shadow_targets,
        timeouts,
        max_body_bytes,
    })
}

/// The compile options that choose the budget ledgers' mode (the embedded default, per-request
/// holds or the shared ledger), written into the plugin config's budgets.
fn apply_budget_options(b: &mut rc::budgets::BudgetsConfig, opts: &CompileOptions) {
    b.unsafe_charge_after = opts.unsafe_budgets_charge_after;
    // Leases are the embedded default, so only the way back is written: the default output
    // stays what it was before either mode existed.
    let embedded = opts.budgets_cluster.is_none();
    b.per_request = opts.budgets_per_request && embedded;
    b.unsafe_worker_leases_unheld =
        embedded && !b.per_request && opts.unsafe_budgets_worker_leases_unheld;
    b.service =
        opts.budgets_cluster
            .clone()
            .map(|cluster| router_core::budget::compiled::ServiceConfig {
                cluster,
                timeout_ms: SERVICE_TIMEOUT_MS,
                fail_open: opts.budgets_fail_open,
                lease: opts.budgets_lease.clone(),
            });
    if let Some(ttl) = opts.budgets_hold_ttl_s {
        b.hold_ttl_s = ttl;
    }
}

/// The plugin config as the filter reads it, and the filter's own router built from it: the
/// generator plans routes with the decision engine the filter runs, so a config the filter would
/// refuse is refused here.
fn compile_plugin(
    plugin: &PluginConfig,
    label: &str,
    diags: &mut Diagnostics,
) -> Option<(String, Router)> {
    let refuse = |diags: &mut Diagnostics, msg: String| {
        diags.error(Problem::new(label, "spec", msg));
        None
    };
    let plugin_json = match serde_json::to_string(plugin) {
        Ok(j) => j,
        Err(e) => return refuse(diags, format!("cannot serialise the plugin config: {e}")),
    };
    match Router::new(plugin.clone()) {
        Ok(core) => Some((plugin_json, core)),
        Err(e) => refuse(diags, format!("the filter refuses the plugin config: {e}")),
    }
}

/// Every backend the cluster can resolve, with its tier from the plugin config (the backends
/// that cannot be resolved are errors in `diags`).
fn resolve_backends(
    spec: &ModelRouterSpec,
    plugin: &PluginConfig,
    label: &str,
    namespace: &str,
    inputs: &Inputs,
    opts: &CompileOptions,
    diags: &mut Diagnostics,
) -> Vec<Backend> {
    let mut backends = Vec::with_capacity(spec.backends.len());
    for (i, (b, pb)) in spec.backends.iter().zip(&plugin.backends).enumerate() {
        let cx = Site {
            label,
            path: format!("spec.backends[{i}]"),
            namespace,
        };
        if let Some((kind, endpoints)) = resolve_backend(b, &cx, inputs, opts, diags) {
            backends.push(Backend {
                name: b.name.clone(),
                tier: pb.tier,
                endpoints,
                kind,
                vllm: b
                    .inference_service_ref
                    .as_ref()
                    .and_then(|r| inputs.inference_service(namespace, &r.name))
                    .is_some_and(|s| s.vllm),
            });
        }
    }
    backends
}

/// Where a backend sits in the manifest, for problem lines.
struct Site<'a> {
    label: &'a str,
    path: String,
    namespace: &'a str,
}

impl Site<'_> {
    fn error(&self, diags: &mut Diagnostics, field: &str, msg: String) {
        diags.error(Problem::new(
            self.label,
            format!("{}.{field}", self.path),
            msg,
        ));
    }
}

fn resolve_backend(
    b: &RouterBackend,
    cx: &Site,
    inputs: &Inputs,
    opts: &CompileOptions,
    diags: &mut Diagnostics,
) -> Option<(BackendKind, Vec<(String, u16)>)> {
    if let Some(r) = &b.inference_service_ref {
        return resolve_service(b, &r.name, cx, inputs, opts, diags);
    }
    let e = b.external.as_ref()?;
    let Some(url) = e.url.as_deref().or(e.provider.default_url()) else {
        cx.error(
            diags,
            "external.url",
            format!(
                "provider {} has no default URL; set url",
                e.provider.as_str()
            ),
        );
        return None;
    };
    let url = match parse_url(url) {
        Ok(u) => u,
        Err(why) => {
            cx.error(diags, "external.url", why);
            return None;
        }
    };
    let credential = match &e.credentials_secret_ref {
        None => None,
        Some(s) => Some(credential(e.provider, &s.name, cx, inputs, diags)?),
    };
    let endpoints = vec![(url.host.clone(), url.port)];
    Some((
        BackendKind::External(External {
            provider: e.provider,
            url,
            model: e.model.clone(),
            credential,
        }),
        endpoints,
    ))
}

/// The provider credential in Secret `name`: its reference always, its value when the Secret is
/// in the input with the provider's key (a value with control characters is an error; a missing
/// key is for each target to judge).
fn credential(
    provider: Provider,
    name: &str,
    cx: &Site,
    inputs: &Inputs,
    diags: &mut Diagnostics,
) -> Option<Credential> {
    let key = provider.secret_key();
    let form = provider.credential();
    let mut value = None;
    let mut secret_keys = None;
    if let Some(secret) = inputs.secret(cx.namespace, name) {
        let field = "external.credentialsSecretRef.name";
        let ns = cx.namespace;
        let values = secret_values(secret);
        secret_keys = Some(values.keys().cloned().collect());
        match values.get(key).map(|v| v.trim()) {
            None | Some("") => {}
            Some(v) if v.bytes().any(|c| c < 0x20 || c == 0x7f) => {
                cx.error(
                    diags,
                    field,
                    format!("Secret {ns}/{name} key {key} contains control characters"),
                );
                return None;
            }
            Some(v) => value = Some(form.value(v)),
        }
    }
    Some(Credential {
        secret: SecretRef {
            namespace: cx.namespace.to_string(),
            name: name.to_string(),
            key: key.to_string(),
        },
        header: form.header,
        value,
        secret_keys,
    })
}

fn resolve_service(
    b: &RouterBackend,
    name: &str,
    cx: &Site,
    inputs: &Inputs,
    opts: &CompileOptions,
    diags: &mut Diagnostics,
) -> Option<(BackendKind, Vec<(String, u16)>)> {
    let namespace = cx.namespace;
    let isvc = inputs.inference_service(namespace, name);
    let resolution = b.resolution();
    let port = isvc.map_or(crate::inputs::DEFAULT_ISVC_PORT, |i| i.port);
    let endpoints = if resolution == Resolution::Endpoint {
        match opts.endpoints.get(name) {
            Some(eps) => eps.clone(),
            None => slice_endpoints(name, cx, inputs, diags)?,
        }
    } else if let Some((h, p)) = opts.resolve.get(name) {
        vec![(h.clone(), *p)]
    } else if let Some(i) = isvc {
        vec![(
            format!("{}.{}.svc.cluster.local", i.name, i.namespace),
            i.port,
        )]
    } else {
        // Same line as validation's, so it is reported once.
        cx.error(
            diags,
            "inferenceServiceRef.name",
            format!("InferenceService {namespace}/{name} is not in the input (add it, or give its address with --resolve/--endpoints)"),
        );
        return None;
    };
    Some((
        BackendKind::Service {
            service: name.to_string(),
            port,
            resolution,
        },
        endpoints,
    ))
}

/// The ready endpoints × TCP ports of the EndpointSlices of Service `name` (a nil `ready` counts
/// as ready, as consumers treat "unknown").
fn slice_endpoints(
    name: &str,
    cx: &Site,
    inputs: &Inputs,
    diags: &mut Diagnostics,
) -> Option<Vec<(String, u16)>> {
    let namespace = cx.namespace;
    let slices = inputs.endpoint_slices_for(namespace, name);
    if slices.is_empty() {
        cx.error(
            diags,
            "resolution",
            format!("resolution: endpoint needs EndpointSlices labelled kubernetes.io/service-name: {name} in namespace {namespace}, or --endpoints {name}=IP:PORT,..."),
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
        diags.warn(Problem::new(
            cx.label,
            format!("{}.resolution", cx.path),
            format!("the EndpointSlices of {name} list no ready endpoint; the backend answers 503 until regenerated"),
        ));
    }
    Some(eps)
}
