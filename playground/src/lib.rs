//! The playground's engine: `validate` and `explain` of `llmkube-gen`, callable from a browser.
//!
//! Both take and return JSON strings, so the page needs no generated types and the native tests
//! exercise exactly what the browser calls. Nothing here does I/O: the manifest and request come
//! from the page and the answer goes back to it.

use llmkube_gen::explain::{explain_sources, render_text, Request, DEFAULT_PATH};
use llmkube_gen::{validate_sources, CompileOptions, Problem, Source};
use serde::Deserialize;
use serde_json::{json, Value};
use wasm_bindgen::prelude::wasm_bindgen;

/// The manifest's name in problem lines.
const SOURCE_NAME: &str = "manifest.yaml";

fn sources(manifest: &str) -> [Source; 1] {
    [Source {
        name: SOURCE_NAME.into(),
        text: manifest.into(),
    }]
}

fn problems(list: &[Problem]) -> Value {
    list.iter()
        .map(|p| {
            json!({"object": p.object, "path": p.path, "message": p.message, "line": p.to_string()})
        })
        .collect()
}

/// `{"errors": [...], "warnings": [...]}`, each problem with its `object`, field `path`,
/// `message` and the `line` `llmkube-gen validate` prints.
#[wasm_bindgen]
pub fn validate(manifest: &str) -> String {
    let d = validate_sources(&sources(manifest));
    json!({"errors": problems(&d.errors), "warnings": problems(&d.warnings)}).to_string()
}

/// What the page sends: the request and the health state to assume.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct PageRequest {
    path: Option<String>,
    headers: Vec<(String, String)>,
    body: String,
    quarantined: Vec<String>,
    router: Option<String>,
}

/// `request` is `{"path", "headers": [[name, value]...], "body", "quarantined": [...],
/// "router"}` (all optional). Answers `{"ok": true, "explanation": <explain --json>, "text":
/// <explain's text>, "warnings"}` or `{"ok": false, "errors", "warnings"}`.
#[wasm_bindgen]
pub fn explain(manifest: &str, request: &str) -> String {
    let page: PageRequest = match serde_json::from_str(request) {
        Ok(r) => r,
        Err(e) => {
            let p = Problem::new("request", "", format!("not a playground request: {e}"));
            return json!({"ok": false, "errors": problems(&[p]), "warnings": []}).to_string();
        }
    };
    let mut req = Request::post(page.body.into_bytes());
    req.path = page.path.unwrap_or_else(|| DEFAULT_PATH.into());
    req.headers = page.headers;
    req.quarantined = page.quarantined;
    let opts = CompileOptions {
        router: page.router.filter(|r| !r.is_empty()),
        ..Default::default()
    };
    match explain_sources(&sources(manifest), &opts, &req) {
        Ok((ex, warnings)) => json!({
            "ok": true,
            "text": render_text(&ex),
            "explanation": ex,
            "warnings": problems(&warnings),
        })
        .to_string(),
        Err(d) => {
            json!({"ok": false, "errors": problems(&d.errors), "warnings": problems(&d.warnings)})
                .to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTER: &str = include_str!("../web/example.yaml");

    fn parse(s: String) -> Value {
        serde_json::from_str(&s).unwrap()
    }

    #[test]
    fn the_example_router_is_valid() {
        let v = parse(validate(ROUTER));
        assert_eq!(v["errors"], json!([]), "{v}");
    }

    #[test]
    fn problems_carry_field_paths_and_validate_lines() {
        let v = parse(validate(
            &ROUTER.replace("defaultRoute: small", "defaultRoute: nope"),
        ));
        assert_eq!(v["errors"][0]["path"], "spec.defaultRoute");
        assert_eq!(
            v["errors"][0]["line"],
            "ModelRouter/demo: spec.defaultRoute: backend \"nope\" is not declared in spec.backends"
        );
        let v = parse(explain("kind: [", "{}"));
        assert_eq!(v["ok"], false);
        assert!(!v["errors"].as_array().unwrap().is_empty());
    }

    #[test]
    fn explains_a_request_as_the_gateway_decides() {
        let req = json!({"headers": [["x-llmkube-classification", "pii"]], "body": r#"{"model":"gpt-5"}"#});
        let v = parse(explain(ROUTER, &req.to_string()));
        assert_eq!(v["ok"], true, "{v}");
        let ex = &v["explanation"];
        assert_eq!(
            (&ex["status"], &ex["backend"]),
            (&json!(200), &json!("big"))
        );
        assert_eq!(ex["sensitive"], true);
        assert!(v["text"]
            .as_str()
            .unwrap()
            .contains("answer: 200 from backend big"));
        let v = parse(explain(
            &ROUTER.replace("  defaultRoute: small\n", ""),
            &json!({"body": r#"{"model":"nothing"}"#}).to_string(),
        ));
        assert_eq!(v["explanation"]["status"], 404);
        assert_eq!(
            v["explanation"]["error"]["error"]["code"],
            "model_not_found"
        );
    }

    #[test]
    fn a_malformed_page_request_is_a_problem_not_a_panic() {
        let v = parse(explain(ROUTER, r#"{"headers": 3}"#));
        assert_eq!(v["ok"], false);
        assert_eq!(v["errors"][0]["object"], "request");
    }
}
