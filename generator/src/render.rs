//! Serialising what a target built: one document as YAML or JSON, or a YAML document stream.

use serde_json::Value;

use crate::{Diagnostics, Problem};

/// Output syntax of a single document (the envoy target's bootstrap: `envoy -c` reads both; JSON
/// is valid YAML).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Yaml,
    Json,
}

/// One document in `format` (JSON pretty-printed with a final newline).
pub fn render(doc: &Value, format: Format, diags: &mut Diagnostics) -> Option<String> {
    let out = match format {
        Format::Json => serde_json::to_string_pretty(doc)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string()),
        Format::Yaml => serde_norway::to_string(doc).map_err(|e| e.to_string()),
    };
    out.map_err(|e| diags.error(Problem::new("output", "", format!("cannot serialise: {e}"))))
        .ok()
}

/// A multi-document YAML stream (`---` before each document), as `kubectl apply -f` reads it.
pub fn render_documents(docs: &[Value], diags: &mut Diagnostics) -> Option<String> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&render(d, Format::Yaml, diags)?);
    }
    Some(out)
}
