//! `GET /v1/models`, answered from the config: one entry per backend, id = displayName else name.
//! With `modelInfo` set, the entry also carries `context_length` (when known) and the input and
//! output modalities, defaulted as the ModelRouter reference says: input `["text","image"]` for a
//! backend with the `vision` capability, else `["text"]`; output `["text"]`.

use crate::config::PluginConfig;
use serde_json::{json, Map, Value};

pub fn models_body(config: &PluginConfig) -> Vec<u8> {
    let data: Vec<Value> = config
        .backends
        .iter()
        .map(|b| {
            let mut entry = Map::new();
            let id = b.display_name.as_deref().unwrap_or(&b.name);
            entry.insert("id".into(), json!(id));
            entry.insert("object".into(), json!("model"));
            entry.insert("created".into(), json!(0));
            entry.insert("owned_by".into(), json!("llmkube"));
            if let Some(info) = &b.model_info {
                if let Some(n) = info.context_length {
                    entry.insert("context_length".into(), json!(n));
                }
                let input = info.input_modalities.clone().unwrap_or_else(|| {
                    if b.capabilities.iter().any(|c| c == "vision") {
                        vec!["text".into(), "image".into()]
                    } else {
                        vec!["text".into()]
                    }
                });
                let output = info
                    .output_modalities
                    .clone()
                    .unwrap_or_else(|| vec!["text".into()]);
                entry.insert("input_modalities".into(), json!(input));
                entry.insert("output_modalities".into(), json!(output));
            }
            Value::Object(entry)
        })
        .collect();
    serde_json::to_vec(&json!({"object": "list", "data": data})).unwrap_or_default()
}
