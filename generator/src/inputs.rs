//! Reading manifests: multi-document YAML into the objects the generator understands.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use crate::model::{ModelRouter, ModelRouterSpec, API_VERSION};
use crate::{Diagnostics, Problem};

/// One input file (or stdin) with the name used in messages.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// The LLMKube InferenceService fields the generator uses, parsed loosely (other fields ignored).
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceServiceInfo {
    pub name: String,
    pub namespace: String,
    /// `spec.endpoint.port`, 8080 when absent.
    pub port: u16,
    /// Default for `modelInfo.contextLength` (vLLM `maxModelLen` / `--max-model-len`; llama.cpp
    /// `contextSize / parallelSlots`).
    pub context_length: Option<u64>,
    /// The runtime is vLLM (its pods serve vLLM's `/metrics`).
    pub vllm: bool,
    /// The model name its engine answers to, when the manifest says: `--served-model-name` in
    /// extraArgs (vLLM, SGLang), else `spec.gateway.modelName`.
    pub served_model: Option<String>,
}

pub const DEFAULT_ISVC_PORT: u16 = 8080;

/// Everything read from the inputs, in input order.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub routers: Vec<ModelRouter>,
    pub inference_services: Vec<InferenceServiceInfo>,
    pub secrets: Vec<Secret>,
    pub endpoint_slices: Vec<EndpointSlice>,
}

impl Inputs {
    pub fn inference_service(&self, namespace: &str, name: &str) -> Option<&InferenceServiceInfo> {
        self.inference_services
            .iter()
            .find(|i| i.name == name && i.namespace == namespace)
    }
    pub fn secret(&self, namespace: &str, name: &str) -> Option<&Secret> {
        self.secrets.iter().find(|s| {
            s.metadata.name.as_deref() == Some(name) && namespace_of(&s.metadata) == namespace
        })
    }
    /// EndpointSlices labelled `kubernetes.io/service-name: <service>` in `namespace`, sorted by name.
    pub fn endpoint_slices_for(&self, namespace: &str, service: &str) -> Vec<&EndpointSlice> {
        let mut v: Vec<&EndpointSlice> = self
            .endpoint_slices
            .iter()
            .filter(|s| {
                namespace_of(&s.metadata) == namespace
                    && s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("kubernetes.io/service-name"))
                        .map(String::as_str)
                        == Some(service)
            })
            .collect();
        v.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        v
    }
}

pub fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
}

/// `namespace/name` of a router.
pub fn router_key(r: &ModelRouter) -> String {
    format!(
        "{}/{}",
        namespace_of(&r.metadata),
        r.metadata.name.as_deref().unwrap_or("")
    )
}

/// Parses every document of every source. Problems go to `diags`; objects that could not be read
/// are left out of the result.
pub fn load(sources: &[Source], diags: &mut Diagnostics) -> Inputs {
    let mut inputs = Inputs::default();
    for src in sources {
        for (i, doc) in serde_norway::Deserializer::from_str(&src.text).enumerate() {
            let value = match Value::deserialize(doc) {
                Ok(v) => v,
                Err(e) => {
                    diags.error(Problem::new(
                        &src.name,
                        format!("documents[{i}]"),
                        format!("invalid YAML: {e}"),
                    ));
                    break;
                }
            };
            load_object(&src.name, i, value, &mut inputs, diags);
        }
    }
    inputs
}

fn load_object(
    file: &str,
    index: usize,
    value: Value,
    inputs: &mut Inputs,
    diags: &mut Diagnostics,
) {
    let obj = match value {
        Value::Null => return,
        Value::Object(m) => m,
        _ => {
            diags.error(Problem::new(
                file,
                format!("documents[{index}]"),
                "not a Kubernetes object (expected a mapping)",
            ));
            return;
        }
    };
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let name = obj
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let label = if name.is_empty() {
        format!(
            "{}/{file}#{index}",
            if kind.is_empty() { "object" } else { &kind }
        )
    } else {
        format!("{kind}/{name}")
    };
    if kind.is_empty() || api_version.is_empty() {
        diags.error(Problem::new(&label, "", "apiVersion and kind are required"));
        return;
    }
    if name.is_empty() {
        diags.error(Problem::new(&label, "metadata.name", "is required"));
        return;
    }
    match (api_version.as_str(), kind.as_str()) {
        (_, "ModelRouter") if api_version.starts_with("inference.llmkube.dev/") => {
            if api_version != API_VERSION {
                diags.error(Problem::new(
                    &label,
                    "apiVersion",
                    format!("unsupported version {api_version:?} (expected {API_VERSION:?})"),
                ));
                return;
            }
            if let Some(r) = load_router(&label, obj, diags) {
                inputs.routers.push(r);
            }
        }
        (_, "InferenceService") if api_version.starts_with("inference.llmkube.dev/") => {
            if let Some(i) = load_inference_service(&label, &name, &obj, diags) {
                inputs.inference_services.push(i);
            }
        }
        ("v1", "Secret") => match serde_json::from_value::<Secret>(Value::Object(obj)) {
            Ok(s) => inputs.secrets.push(s),
            Err(e) => diags.error(Problem::new(&label, "", format!("invalid Secret: {e}"))),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            match serde_json::from_value::<EndpointSlice>(Value::Object(obj)) {
                Ok(s) => inputs.endpoint_slices.push(s),
                Err(e) => diags.error(Problem::new(
                    &label,
                    "",
                    format!("invalid EndpointSlice: {e}"),
                )),
            }
        }
        _ => diags.warn(Problem::new(
            &label,
            "",
            format!("{api_version} {kind} is not used by the generator; ignored"),
        )),
    }
}

fn load_router(
    label: &str,
    mut obj: serde_json::Map<String, Value>,
    diags: &mut Diagnostics,
) -> Option<ModelRouter> {
    let mut ok = true;
    for key in obj.keys() {
        if !matches!(
            key.as_str(),
            "apiVersion" | "kind" | "metadata" | "spec" | "status"
        ) {
            diags.error(Problem::new(label, key, "unknown field"));
            ok = false;
        }
    }
    let metadata: ObjectMeta =
        match serde_json::from_value(obj.remove("metadata").unwrap_or(Value::Null)) {
            Ok(m) => m,
            Err(e) => {
                diags.error(Problem::new(label, "metadata", format!("invalid: {e}")));
                return None;
            }
        };
    let Some(spec_value) = obj.remove("spec") else {
        diags.error(Problem::new(label, "spec", "is required"));
        return None;
    };
    let spec: ModelRouterSpec = match serde_path_to_error::deserialize(spec_value) {
        Ok(s) => s,
        Err(e) => {
            let (path, message) =
                describe_serde_error(&e.path().to_string(), &e.inner().to_string());
            diags.error(Problem::new(label, path, message));
            return None;
        }
    };
    if !ok {
        return None;
    }
    let name = metadata.name.clone().unwrap_or_default();
    let mut router = ModelRouter::new(&name, spec);
    router.metadata = metadata;
    Some(router)
}

/// Turns a serde_path_to_error path + message into a `spec.…` field path and a reason, moving an
/// unknown or missing field's name into the path.
fn describe_serde_error(path: &str, msg: &str) -> (String, String) {
    let mut full = String::from("spec");
    if !path.is_empty() && path != "." {
        if !path.starts_with('[') {
            full.push('.');
        }
        full.push_str(path);
    }
    for (prefix, reason) in [
        ("unknown field `", "unknown field"),
        ("missing field `", "is required"),
    ] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            if let Some(end) = rest.find('`') {
                let field = &rest[..end];
                let tail = rest[end + 1..].trim_start_matches(',').trim();
                // For an unknown field serde_path_to_error already points at it; for a missing one
                // it points at the containing object.
                if !full.ends_with(&format!(".{field}")) {
                    full.push('.');
                    full.push_str(field);
                }
                let message = if tail.is_empty() {
                    reason.to_string()
                } else {
                    format!("{reason}, {tail}")
                };
                return (full, message);
            }
        }
    }
    (full, msg.to_string())
}

fn load_inference_service(
    label: &str,
    name: &str,
    obj: &serde_json::Map<String, Value>,
    diags: &mut Diagnostics,
) -> Option<InferenceServiceInfo> {
    let namespace = obj
        .get("metadata")
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default")
        .to_string();
    let spec = obj.get("spec");
    let port = match spec
        .and_then(|s| s.get("endpoint"))
        .and_then(|e| e.get("port"))
    {
        None | Some(Value::Null) => DEFAULT_ISVC_PORT,
        Some(p) => match p.as_u64() {
            Some(p @ 1..=65535) => p as u16,
            _ => {
                diags.error(Problem::new(
                    label,
                    "spec.endpoint.port",
                    format!("must be an integer between 1 and 65535, got {p}"),
                ));
                return None;
            }
        },
    };
    Some(InferenceServiceInfo {
        name: name.to_string(),
        namespace,
        port,
        context_length: spec.and_then(context_length_of),
        vllm: spec.is_some_and(runtime_is_vllm),
        served_model: spec.and_then(served_model_of),
    })
}

/// The model name an InferenceService's engine serves, when its manifest says:
/// `--served-model-name` in extraArgs (its first name: vLLM reports that one and answers to
/// each), else `spec.gateway.modelName` (the name the InferenceService's own gateway route
/// forwards unchanged, so the engine serves it).
pub fn served_model_of(spec: &Value) -> Option<String> {
    let args = extra_args(spec);
    // vLLM's flag (SGLang's has the same name).
    let flag = flag_value(&args, &["--served-model-name"])
        .filter(|v| !v.is_empty() && !v.starts_with('-'));
    flag.or_else(|| {
        spec.get("gateway")
            .and_then(|g| g.get("modelName"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    })
    .map(str::to_string)
}

fn runtime_of(spec: &Value) -> Option<String> {
    spec.get("runtime")
        .and_then(Value::as_str)
        .map(|s| s.to_ascii_lowercase())
}

fn extra_args(spec: &Value) -> Vec<&str> {
    spec.get("extraArgs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether an InferenceService spec runs vLLM: `runtime: vllm`, or no runtime and vLLM's own
/// settings.
pub fn runtime_is_vllm(spec: &Value) -> bool {
    match runtime_of(spec).as_deref() {
        Some(r) => r == "vllm",
        None => {
            spec.get("vllmConfig").is_some()
                || flag_value(&extra_args(spec), &["--max-model-len"]).is_some()
        }
    }
}

/// The context window one request gets, derived as the LLMKube controller does: vLLM's
/// `vllmConfig.maxModelLen` or `--max-model-len` in extraArgs; llama.cpp's `contextSize` divided
/// across `parallelSlots` (none when extraArgs set those flags themselves); other runtimes none.
pub fn context_length_of(spec: &Value) -> Option<u64> {
    let runtime = runtime_of(spec);
    let args = extra_args(spec);
    let is_vllm = runtime_is_vllm(spec);
    let is_llamacpp = match runtime.as_deref() {
        Some(r) => matches!(r, "llamacpp" | "llama.cpp" | "llama-cpp" | "llama_cpp"),
        None => spec.get("contextSize").is_some(),
    };
    if is_vllm {
        if let Some(n) = spec
            .get("vllmConfig")
            .and_then(|v| v.get("maxModelLen"))
            .and_then(as_u64_loose)
        {
            return Some(n).filter(|n| *n > 0);
        }
        return flag_value(&args, &["--max-model-len"])
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|n| *n > 0);
    }
    if is_llamacpp {
        if flag_value(&args, &["-c", "--ctx-size", "-np", "--parallel"]).is_some() {
            return None;
        }
        let ctx = spec.get("contextSize").and_then(as_u64_loose)?;
        let slots = spec
            .get("parallelSlots")
            .and_then(as_u64_loose)
            .unwrap_or(1)
            .max(1);
        return Some(ctx / slots).filter(|n| *n > 0);
    }
    None
}

fn as_u64_loose(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

/// Value of `--flag N`, `--flag=N` in an argument list (any of `names`).
fn flag_value<'a>(args: &[&'a str], names: &[&str]) -> Option<&'a str> {
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        for n in names {
            if a == n {
                return Some(it.peek().copied().copied().unwrap_or(""));
            }
            if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                return Some(v);
            }
        }
    }
    None
}

/// Keys of a Secret with their decoded values (`data` wins over `stringData` as the API server
/// merges stringData into data).
pub fn secret_values(s: &Secret) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(sd) = &s.string_data {
        for (k, v) in sd {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(d) = &s.data {
        for (k, v) in d {
            out.insert(k.clone(), String::from_utf8_lossy(&v.0).into_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serde_paths() {
        assert_eq!(
            describe_serde_error(
                "backends[0].wieght",
                "unknown field `wieght`, expected one of `a`, `b`"
            ),
            (
                "spec.backends[0].wieght".into(),
                "unknown field, expected one of `a`, `b`".into()
            )
        );
        assert_eq!(
            describe_serde_error("rules[1]", "missing field `route`"),
            ("spec.rules[1].route".into(), "is required".into())
        );
    }

    #[test]
    fn served_model_names() {
        assert_eq!(
            served_model_of(
                &json!({"runtime":"vllm","extraArgs":["--served-model-name","Qwen/Qwen3-8B","q"]})
            ),
            Some("Qwen/Qwen3-8B".into())
        );
        assert_eq!(
            served_model_of(&json!({"runtime":"vllm","extraArgs":["--served-model-name=qwen"]})),
            Some("qwen".into())
        );
        assert_eq!(
            served_model_of(
                &json!({"runtime":"vllm","extraArgs":["--served-model-name"],"gateway":{"modelName":"g"}})
            ),
            Some("g".into())
        );
        assert_eq!(
            served_model_of(
                &json!({"runtime":"llamacpp","gateway":{"enabled":true,"modelName":"g"}})
            ),
            Some("g".into())
        );
        assert_eq!(
            served_model_of(&json!({"runtime":"vllm","modelRef":"m"})),
            None
        );
        assert_eq!(served_model_of(&json!({"gateway":{"modelName":""}})), None);
    }

    #[test]
    fn context_lengths() {
        assert_eq!(
            context_length_of(&json!({"runtime":"vllm","vllmConfig":{"maxModelLen":32768}})),
            Some(32768)
        );
        assert_eq!(
            context_length_of(&json!({"runtime":"vllm","extraArgs":["--max-model-len","8192"]})),
            Some(8192)
        );
        assert_eq!(
            context_length_of(&json!({"extraArgs":["--max-model-len=4096"]})),
            Some(4096)
        );
        assert_eq!(
            context_length_of(&json!({"runtime":"llamacpp","contextSize":16384,"parallelSlots":4})),
            Some(4096)
        );
        assert_eq!(context_length_of(&json!({"contextSize":8192})), Some(8192));
        assert_eq!(
            context_length_of(
                &json!({"runtime":"llamacpp","contextSize":8192,"extraArgs":["-np","2"]})
            ),
            None
        );
        assert_eq!(
            context_length_of(&json!({"runtime":"sglang","contextSize":8192})),
            None
        );
    }
}
