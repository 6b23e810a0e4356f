//! `GET /v1/models` and `GET /v1/models/{id}`, answered from the config: one entry per backend,
//! id = displayName else name. With `modelInfo` set, the entry also carries `context_length` (when
//! known) and the input and output modalities, defaulted as the ModelRouter reference says: input
//! `["text","image"]` for a backend with the `vision` capability, else `["text"]`; output
//! `["text"]`. The list and each entry are serialised once, at config load.

use crate::config::PluginConfig;
use serde_json::{json, Map, Value};

/// Every entry of the models list, and the list itself.
#[derive(Debug, Clone, Default)]
pub struct ModelTable {
    list: Vec<u8>,
    /// `(id, entry body)` in backend order; a repeated id answers with its first entry.
    entries: Vec<(String, Vec<u8>)>,
}

impl ModelTable {
    pub fn new(config: &PluginConfig) -> Self {
        let values = entries(config);
        let list =
            serde_json::to_vec(&json!({"object": "list", "data": values})).unwrap_or_default();
        let entries = config
            .backends
            .iter()
            .zip(&values)
            .map(|(b, v)| {
                let id = b.display_name.as_deref().unwrap_or(&b.name).to_string();
                (id, serde_json::to_vec(v).unwrap_or_default())
            })
            .collect();
        ModelTable { list, entries }
    }

    /// The `/v1/models` body.
    pub fn list(&self) -> &[u8] {
        &self.list
    }

    /// The `/v1/models/{id}` body of the entry with this id, if the list has one.
    pub fn entry(&self, id: &str) -> Option<&[u8]> {
        self.entries
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, body)| body.as_slice())
    }
}

pub fn models_body(config: &PluginConfig) -> Vec<u8> {
    ModelTable::new(config).list
}

/// The id in a models path's tail (after `/v1/models/`), percent-decoded: ids hold `/` (e.g.
/// `meta-llama/Llama-3.3-70B-Instruct`), sent either as it is or as `%2F`. `None` for an empty
/// id or one that does not decode to UTF-8.
pub fn decode_id(tail: &[u8]) -> Option<String> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(tail.len());
    let mut i = 0;
    while i < tail.len() {
        if tail[i] == b'%' {
            let hi = tail.get(i + 1).copied().and_then(hex)?;
            let lo = tail.get(i + 2).copied().and_then(hex)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(tail[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

fn entries(config: &PluginConfig) -> Vec<Value> {
    config
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listed_entry_is_retrievable_by_its_id() {
        let cfg: PluginConfig = serde_json::from_value(json!({
            "router": "r",
            "backends": [
                {"name": "a", "display_name": "meta-llama/Llama-3.3-70B-Instruct",
                 "model_info": {"context_length": 8}},
                {"name": "b"},
                {"name": "c", "display_name": "b"}
            ]
        }))
        .unwrap();
        let t = ModelTable::new(&cfg);
        let list: Value = serde_json::from_slice(t.list()).unwrap();
        for listed in list["data"].as_array().unwrap().iter().take(2) {
            let id = listed["id"].as_str().unwrap();
            let one: Value = serde_json::from_slice(t.entry(id).unwrap()).unwrap();
            assert_eq!(&one, listed);
        }
        // A repeated id answers with its first entry, as name matching does.
        let b: Value = serde_json::from_slice(t.entry("b").unwrap()).unwrap();
        assert_eq!(b, list["data"][1]);
        assert!(
            t.entry("a").is_none(),
            "the name behind a displayName is not listed"
        );
        assert!(t.entry("").is_none());
        assert_eq!(t.list(), models_body(&cfg).as_slice());
    }

    #[test]
    fn ids_are_percent_decoded() {
        let id = |s: &str| decode_id(s.as_bytes());
        assert_eq!(id("qwen3-8b").as_deref(), Some("qwen3-8b"));
        assert_eq!(id("meta-llama/L").as_deref(), Some("meta-llama/L"));
        assert_eq!(id("meta-llama%2fL%2F").as_deref(), Some("meta-llama/L/"));
        assert_eq!(id("a%20b").as_deref(), Some("a b"));
        for bad in ["", "%", "%2", "%zz", "%ff"] {
            assert_eq!(id(bad), None, "{bad}");
        }
    }
}
