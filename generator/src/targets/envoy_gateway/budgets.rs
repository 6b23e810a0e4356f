//! Budgets on the shared ledger `llmkube-budgets` (docs/budgets.md, "Operating the Redis mode").
//!
//! The filter reserves and settles through the Envoy cluster its plugin config names
//! (`budgets.service.cluster`). Envoy Gateway generates clusters only for route backends
//! (`httproute/<ns>/<route>/rule/<i>`), and a route to the ledger would let clients call a
//! service that trusts its callers, so the cluster is added whole by the router's
//! EnvoyPatchPolicy: a patch with `op: add` and an empty `path` adds a complete xDS resource
//! (envoyproxy/gateway `internal/xds/translator/jsonpatch.go`, `processJSONPatches`, at the
//! commit the CRDs in generator/schemas come from). Its name is the router's, so two routers on
//! one Gateway never add the same cluster twice.
//!
//! Two ways to get the service:
//! - `--budgets-service HOST:PORT`: one the operator runs; only the cluster is emitted;
//! - `--budgets-redis-secret NAME[/KEY]` with `--budgets-image REF`: a Deployment and Service of
//!   `llmkube-budgets` in the router's namespace, the Redis URL (which may hold a password) read
//!   from that Secret key into the container's environment and expanded by the kubelet into
//!   `--redis $(VAR)`, never written here; and a NetworkPolicy admitting only this Gateway's
//!   Envoy pods.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SecretKeySelector, SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

use super::names;
use super::objects::GatewayRef;
use crate::ir::Ir;
use crate::{Diagnostics, Problem};

/// Where `llmkube-budgets` listens in the generated Deployment.
pub const PORT: u16 = 8080;
/// The container's environment variable holding the Redis URL from the Secret.
pub const REDIS_ENV: &str = "LLMKUBE_BUDGETS_REDIS";
/// The Secret key read when `--budgets-redis-secret` names none.
pub const DEFAULT_SECRET_KEY: &str = "url";
/// The service is stateless (every ledger operation is one Redis script): two replicas so one
/// pod's restart does not fail every budgeted request closed.
const REPLICAS: i32 = 2;
/// The user the pod runs as (distroless' `nonroot`).
const NON_ROOT_UID: i64 = 65532;
/// Labels Envoy Gateway puts on the Envoy pods of a Gateway (`internal/gatewayapi/translator.go`,
/// `OwningGatewayNameLabel` / `OwningGatewayNamespaceLabel`; with `mergeGateways` on the
/// GatewayClass its pods carry `owning-gatewayclass` instead and the policy must be widened).
const OWNING_GATEWAY_NAME: &str = "gateway.envoyproxy.io/owning-gateway-name";
const OWNING_GATEWAY_NAMESPACE: &str = "gateway.envoyproxy.io/owning-gateway-namespace";

/// How the router's budgets reach a shared ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetsService {
    /// `--budgets-service HOST:PORT`.
    External { host: String, port: u16 },
    /// `--budgets-redis-secret NAME[/KEY]` + `--budgets-image REF`.
    Deploy {
        image: String,
        secret: String,
        key: String,
    },
}

/// The budgets flags of `--target envoy-gateway`, each given at most once.
pub fn from_flags(
    service: Option<&str>,
    secret: Option<&str>,
    image: Option<&str>,
) -> Result<Option<BudgetsService>, Problem> {
    let bad = |flag: &str, why: String| Problem::new("options", flag, why);
    match (service, secret, image) {
        (None, None, None) => Ok(None),
        (Some(s), None, None) => crate::url::parse_host_port(s)
            .map(|(host, port)| Some(BudgetsService::External { host, port }))
            .map_err(|why| {
                bad(
                    "--budgets-service",
                    format!("{s:?}: {why} (where llmkube-budgets listens)"),
                )
            }),
        (Some(_), _, _) => Err(bad(
            "--budgets-service",
            "give --budgets-service (a running llmkube-budgets) or --budgets-redis-secret with --budgets-image (deploy one), not both".into(),
        )),
        (None, Some(_), None) => Err(bad(
            "--budgets-image",
            "is required with --budgets-redis-secret: the llmkube-budgets image the Deployment runs".into(),
        )),
        (None, None, Some(_)) => Err(bad(
            "--budgets-redis-secret",
            "is required with --budgets-image: the Secret (NAME or NAME/KEY) holding the Redis URL; the URL is never written inline".into(),
        )),
        (None, Some(s), Some(i)) => {
            let (name, key) = s.split_once('/').unwrap_or((s, DEFAULT_SECRET_KEY));
            if !crate::validate::is_dns_subdomain(name) || !is_secret_key(key) {
                return Err(bad(
                    "--budgets-redis-secret",
                    format!("{s:?} must be NAME or NAME/KEY (a Secret in the router's namespace and its key)"),
                ));
            }
            if i.is_empty() || i.contains(char::is_whitespace) {
                return Err(bad("--budgets-image", format!("{i:?} is not an image reference")));
            }
            Ok(Some(BudgetsService::Deploy {
                image: i.to_string(),
                secret: name.to_string(),
                key: key.to_string(),
            }))
        }
    }
}

/// A Secret data key: `[-._a-zA-Z0-9]+`, at most 253 characters.
fn is_secret_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'))
}

/// Points the plugin config's ledger calls at this router's cluster.
pub(super) fn name_cluster(ir: &mut Ir) {
    let cluster = names::budgets_cluster(ir);
    let Some(service) = ir.plugin.budgets.as_mut().and_then(|b| b.service.as_mut()) else {
        return;
    };
    service.cluster = cluster;
    ir.plugin_json = serde_json::to_string(&ir.plugin).unwrap_or_default();
}

/// A flag without budgets to serve is a warning (nothing is emitted for it); a generated
/// Service name must be a DNS label.
pub(super) fn check(ir: &Ir, service: Option<&BudgetsService>, diags: &mut Diagnostics) {
    let Some(service) = service else { return };
    if ir.plugin.budgets.is_none() {
        diags.warn(Problem::new(
            &ir.label,
            "spec.policy.budgets",
            "is not set: the budgets service flags are ignored and nothing is emitted for them",
        ));
        return;
    }
    let name = names::budgets_service(ir);
    if matches!(service, BudgetsService::Deploy { .. }) && (name.len() > 63 || name.contains('.')) {
        diags.error(Problem::new(
            &ir.label,
            "metadata.name",
            format!("the budgets Service would be named {name:?}, not a DNS label of at most 63 characters; use a shorter router name or run the service yourself (--budgets-service)"),
        ));
    }
}

/// Where the cluster sends ledger calls.
fn address(ir: &Ir, service: &BudgetsService) -> (String, u16) {
    match service {
        BudgetsService::External { host, port } => (host.clone(), *port),
        BudgetsService::Deploy { .. } => (
            format!(
                "{}.{}.svc.cluster.local",
                names::budgets_service(ir),
                ir.namespace
            ),
            PORT,
        ),
    }
}

/// The EnvoyPatchPolicy patch adding the ledger's cluster (the envoy target's settings).
pub(super) fn cluster_patch(ir: &Ir, service: Option<&BudgetsService>) -> Option<Value> {
    let service = service?;
    let cluster = &ir.plugin.budgets.as_ref()?.service.as_ref()?.cluster;
    let (host, port) = address(ir, service);
    Some(json!({
        "type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": cluster,
        "operation": {
            "op": "add",
            "path": "",
            "value": crate::targets::xds::budgets_cluster_config(cluster, &host, port),
        },
    }))
}

/// Deployment, Service and NetworkPolicy of `llmkube-budgets` when the generator deploys it.
pub(super) fn documents(ir: &Ir, service: Option<&BudgetsService>, gw: &GatewayRef) -> Vec<Value> {
    let Some(BudgetsService::Deploy { image, secret, key }) = service else {
        return Vec::new();
    };
    if ir.plugin.budgets.is_none() {
        return Vec::new();
    }
    let name = names::budgets_service(ir);
    let selector: BTreeMap<String, String> = [
        (
            "app.kubernetes.io/name".to_string(),
            "llmkube-budgets".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), name.clone()),
    ]
    .into();
    let meta = object_meta(ir, &name, &selector);
    let docs = [
        serde_json::to_value(Deployment {
            metadata: meta.clone(),
            spec: Some(deployment_spec(image, secret, key, &selector)),
            ..Default::default()
        }),
        serde_json::to_value(Service {
            metadata: meta.clone(),
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                selector: Some(selector.clone()),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: PORT.into(),
                    target_port: Some(IntOrString::String("http".into())),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        serde_json::to_value(NetworkPolicy {
            metadata: meta,
            spec: Some(network_policy_spec(gw, &selector)),
        }),
    ];
    // k8s-openapi writes `apiVersion` and `kind` itself; its serialisation cannot fail.
    docs.into_iter().filter_map(Result::ok).collect()
}

fn object_meta(ir: &Ir, name: &str, selector: &BTreeMap<String, String>) -> ObjectMeta {
    let mut labels = selector.clone();
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        names::MANAGED_BY.into(),
    );
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ir.namespace.clone()),
        labels: Some(labels),
        annotations: Some([("llmkube.dev/model-router".to_string(), ir.key.clone())].into()),
        ..Default::default()
    }
}

/// Readiness on `/healthz` (which pings Redis): a pod that cannot reach Redis leaves the
/// Service rather than answering 503 to every reservation. No liveness probe on it: a Redis
/// outage must not restart every replica (the service recovers by itself when Redis returns).
fn deployment_spec(
    image: &str,
    secret: &str,
    key: &str,
    selector: &BTreeMap<String, String>,
) -> DeploymentSpec {
    let container = Container {
        name: "llmkube-budgets".into(),
        image: Some(image.to_string()),
        args: Some(
            [
                "--listen".to_string(),
                format!("0.0.0.0:{PORT}"),
                "--redis".to_string(),
                format!("$({REDIS_ENV})"),
            ]
            .into(),
        ),
        env: Some(vec![EnvVar {
            name: REDIS_ENV.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.to_string(),
                    key: key.to_string(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: PORT.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            period_seconds: Some(5),
            failure_threshold: Some(2),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    DeploymentSpec {
        replicas: Some(REPLICAS),
        selector: LabelSelector {
            match_labels: Some(selector.clone()),
            ..Default::default()
        },
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(selector.clone()),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![container],
                automount_service_account_token: Some(false),
                // Any non-root user will do (the service only listens on an unprivileged port
                // and writes nothing), so the pod starts whatever user the image names.
                security_context: Some(PodSecurityContext {
                    run_as_non_root: Some(true),
                    run_as_user: Some(NON_ROOT_UID),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        },
        ..Default::default()
    }
}

/// Ingress to the service only from the Envoy pods of the router's Gateway (in whatever
/// namespace Envoy Gateway runs them): the ledger trusts its callers.
fn network_policy_spec(gw: &GatewayRef, selector: &BTreeMap<String, String>) -> NetworkPolicySpec {
    let envoy: BTreeMap<String, String> = [
        (OWNING_GATEWAY_NAME.to_string(), gw.name.clone()),
        (OWNING_GATEWAY_NAMESPACE.to_string(), gw.namespace.clone()),
    ]
    .into();
    NetworkPolicySpec {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector.clone()),
            ..Default::default()
        }),
        policy_types: Some(vec!["Ingress".into()]),
        ingress: Some(vec![NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector::default()),
                pod_selector: Some(LabelSelector {
                    match_labels: Some(envoy),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ports: Some(vec![NetworkPolicyPort {
                port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
        }]),
        ..Default::default()
    }
}
