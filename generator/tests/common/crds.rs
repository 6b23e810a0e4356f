//! Checking generated Kubernetes documents against the upstream CRDs vendored in
//! `generator/schemas/` (their sources and versions in its README): the OpenAPI schema of the
//! document's apiVersion with a JSON-schema validator, unknown fields (any property not listed
//! under `properties`, except below `x-kubernetes-preserve-unknown-fields`), and the
//! `x-kubernetes-validations` CEL rules with `cel-interpreter`. Rules it cannot compile or
//! evaluate are counted and listed, never silently passed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

/// `generator/schemas/`: the upstream CRDs and agentgateway's config schema.
pub fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas")
}

/// Every served version's schema, by `(group/version, kind)`.
pub struct Crds {
    schemas: BTreeMap<(String, String), Value>,
}

/// What checking documents found.
#[derive(Debug, Default)]
pub struct Report {
    /// Schema violations, unknown fields and CEL rules that evaluated to false.
    pub errors: Vec<String>,
    /// CEL rules evaluated (true or false).
    pub cel_evaluated: usize,
    /// CEL rules `cel-interpreter` cannot compile, by rule text.
    pub cel_unparsable: BTreeMap<String, usize>,
    /// CEL rules that compiled but failed to evaluate (unsupported function, ...), by rule text.
    pub cel_failed: BTreeMap<String, String>,
    /// Transition rules (`oldSelf`): they need the stored object, which a generator has not.
    pub cel_transition: usize,
}

impl Report {
    pub fn summary(&self) -> String {
        format!(
            "CEL rules: {} evaluated, {} unparsable by cel-interpreter ({} distinct), {} failed to evaluate, {} transition rules not applicable; unparsable: {:#?}; failed: {:#?}",
            self.cel_evaluated,
            self.cel_unparsable.values().sum::<usize>(),
            self.cel_unparsable.len(),
            self.cel_failed.len(),
            self.cel_transition,
            self.cel_unparsable.keys().collect::<Vec<_>>(),
            self.cel_failed,
        )
    }
}

impl Crds {
    /// Every CRD but agentgateway's (the largest files, for another target).
    pub fn load() -> Crds {
        Self::load_dirs(false)
    }

    /// Every CRD, agentgateway's included.
    pub fn load_all() -> Crds {
        Self::load_dirs(true)
    }

    fn load_dirs(agentgateway: bool) -> Crds {
        let mut schemas = BTreeMap::new();
        for sub in std::fs::read_dir(crds_dir()).unwrap() {
            let sub = sub.unwrap().path();
            if !sub.is_dir() || (!agentgateway && sub.ends_with("agentgateway")) {
                continue;
            }
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_none_or(|e| e != "yaml") {
                    continue;
                }
                let text = std::fs::read_to_string(&f).unwrap();
                for doc in serde_norway::Deserializer::from_str(&text) {
                    let crd = Value::deserialize(doc).unwrap();
                    if crd["kind"] != "CustomResourceDefinition" {
                        continue;
                    }
                    let group = crd["spec"]["group"].as_str().unwrap().to_string();
                    let kind = crd["spec"]["names"]["kind"].as_str().unwrap().to_string();
                    for v in crd["spec"]["versions"].as_array().unwrap() {
                        let api = format!("{group}/{}", v["name"].as_str().unwrap());
                        schemas.insert((api, kind.clone()), v["schema"]["openAPIV3Schema"].clone());
                    }
                }
            }
        }
        Crds { schemas }
    }

    /// Checks one document, adding what it finds to `report`.
    pub fn check(&self, doc: &Value, report: &mut Report) {
        let api = doc["apiVersion"].as_str().unwrap_or("").to_string();
        let kind = doc["kind"].as_str().unwrap_or("").to_string();
        let name = format!("{kind}/{}", doc["metadata"]["name"].as_str().unwrap_or(""));
        let Some(schema) = self.schemas.get(&(api.clone(), kind.clone())) else {
            report.errors.push(format!(
                "{name}: no CRD in generator/schemas serves {api} {kind}"
            ));
            return;
        };
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(false)
            .build(schema)
            .unwrap();
        for e in validator.iter_errors(doc) {
            report
                .errors
                .push(format!("{name}: {}: {e}", e.instance_path()));
        }
        walk(schema, doc, &name, "", true, report);
    }
}

/// Unknown fields and CEL rules, node by node. `metadata` at the root is the API server's
/// ObjectMeta (the CRD schema leaves it open).
fn walk(schema: &Value, value: &Value, name: &str, path: &str, root: bool, report: &mut Report) {
    if let Some(rules) = schema["x-kubernetes-validations"].as_array() {
        for r in rules {
            cel(r, value, name, path, report);
        }
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
        return;
    }
    match value {
        Value::Object(m) => {
            let props = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in m {
                if root && k == "metadata" {
                    continue;
                }
                let p = format!("{path}.{k}");
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(s), _) => walk(s, v, name, &p, false, report),
                    (None, Some(a)) => walk(a, v, name, &p, false, report),
                    (None, None) => report.errors.push(format!(
                        "{name}: {p}: unknown field (not in the CRD schema)"
                    )),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(
                    &schema["items"],
                    v,
                    name,
                    &format!("{path}[{i}]"),
                    false,
                    report,
                );
            }
        }
        _ => {}
    }
}

fn cel(rule: &Value, value: &Value, name: &str, path: &str, report: &mut Report) {
    let text = rule["rule"].as_str().unwrap_or("");
    if text.contains("oldSelf") {
        report.cel_transition += 1;
        return;
    }
    let program = match cel_interpreter::Program::compile(text) {
        Ok(p) => p,
        Err(_) => {
            *report.cel_unparsable.entry(text.to_string()).or_default() += 1;
            return;
        }
    };
    let mut ctx = cel_interpreter::Context::default();
    if ctx.add_variable("self", value).is_err() {
        report
            .cel_failed
            .insert(text.to_string(), "self does not convert".into());
        return;
    }
    match program.execute(&ctx) {
        Ok(cel_interpreter::Value::Bool(true)) => report.cel_evaluated += 1,
        Ok(cel_interpreter::Value::Bool(false)) => {
            report.cel_evaluated += 1;
            report.errors.push(format!(
                "{name}: {}: CEL rule {text:?} is false: {}",
                if path.is_empty() { "<root>" } else { path },
                rule["message"].as_str().unwrap_or("")
            ));
        }
        Ok(other) => {
            report
                .cel_failed
                .insert(text.to_string(), format!("not a bool: {other:?}"));
        }
        Err(e) => {
            report.cel_failed.insert(text.to_string(), e.to_string());
        }
    }
}

/// The documents of a YAML stream.
pub fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}
