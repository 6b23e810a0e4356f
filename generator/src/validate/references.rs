//! Data-plane references (`gatewayRef`, `agentGatewayRef`), `spec.endpoint`, and the objects a
//! router references (InferenceServices, Secrets).

use std::collections::BTreeSet;

use super::reporter::Ctx;
use super::syntax::*;
use crate::inputs::Inputs;
use crate::model::*;

/// How references to other objects (InferenceServices, Secrets) that are not in the input are
/// treated. `validate` checks a manifest on its own (the objects may exist in the cluster): a
/// warning. `compile` needs them (port, namespace, credentials): an error, unless the command line
/// supplies the address (`--resolve` / `--endpoints`).
#[derive(Debug, Clone, Default)]
pub struct RefPolicy {
    pub missing_is_error: bool,
    /// Secrets must be in the input too (a target that inlines credentials); otherwise a missing
    /// Secret is only a warning (it is referenced, and may exist in the cluster).
    pub secrets_required: bool,
    /// InferenceService names whose address is given on the command line.
    pub resolved_names: BTreeSet<String>,
}

pub(super) fn validate_data_plane_refs(
    cx: &mut Ctx,
    spec: &ModelRouterSpec,
    data_plane: DataPlane,
) {
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

pub(super) fn validate_endpoint(cx: &mut Ctx, spec: &ModelRouterSpec) {
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

pub(super) fn validate_references(
    cx: &mut Ctx,
    spec: &ModelRouterSpec,
    namespace: &str,
    inputs: &Inputs,
    refs: &RefPolicy,
) {
    let report = |cx: &mut Ctx, path: String, msg: String, required: bool| {
        if refs.missing_is_error && required {
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
                    true,
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
                    refs.secrets_required,
                );
            }
        }
    }
}
