//! Which rules can send a model name a local engine may not serve. The gateway rewrites `model`
//! to a local backend's served model name when its InferenceService says it (`--served-model-name`
//! in extraArgs, or `spec.gateway.modelName`); otherwise the client's name goes through, and an
//! engine that does not serve it answers 404. A lint of `validate`: the route still compiles.

use super::reporter::Ctx;
use crate::inputs::Inputs;
use crate::model::*;

/// Warns, per rule and default route, where a model name other than a local backend's published
/// id (displayName, else name) can reach it while its served model name is unknown.
pub(crate) fn foreign_model_names(
    cx: &mut Ctx,
    spec: &ModelRouterSpec,
    namespace: &str,
    inputs: &Inputs,
) {
    let unknown = |name: &str| -> Option<(&RouterBackend, &str)> {
        let b = spec.backend(name)?;
        let isvc = b.inference_service_ref.as_ref()?;
        let served = inputs
            .inference_service(namespace, &isvc.name)
            .and_then(|i| i.served_model.as_ref());
        served.is_none().then_some((b, isvc.name.as_str()))
    };
    let advice = |b: &RouterBackend, isvc: &str| {
        format!(
            "and InferenceService/{isvc} does not say which model name its engine serves (an engine answers 404 for a name it does not serve); set --served-model-name in its extraArgs, or spec.gateway.modelName, and the gateway rewrites \"model\" to it for backend {:?}",
            b.name
        )
    };
    for (i, r) in spec.rules.iter().enumerate() {
        let models = r
            .match_
            .as_ref()
            .map(|m| m.models.as_slice())
            .unwrap_or_default();
        for (j, name) in r.route.backends.iter().enumerate() {
            let Some((b, isvc)) = unknown(name) else {
                continue;
            };
            let id = b.display_name.as_deref().unwrap_or(&b.name);
            let what = if models.is_empty() {
                "any model (no match.models)".to_string()
            } else if models.iter().all(|m| m == id) {
                continue;
            } else {
                format!("match.models {models:?}")
            };
            cx.warn(
                format!("spec.rules[{i}].route.backends[{j}]"),
                format!(
                    "can send model names other than {id:?} to local backend {name:?}: {what}, {}",
                    advice(b, isvc)
                ),
            );
        }
    }
    if let Some((b, isvc)) = spec.default_route.as_deref().and_then(unknown) {
        let id = b.display_name.as_deref().unwrap_or(&b.name);
        cx.warn(
            "spec.defaultRoute",
            format!(
                "sends every model no rule or backend name matched to local backend {:?}, not only {id:?}, {}",
                b.name,
                advice(b, isvc)
            ),
        );
    }
}
