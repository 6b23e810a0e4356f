//! Every golden case compiled for every implemented target and compared byte for byte with
//! `tests/golden/<case>/<target>.yaml` (`UPDATE_GOLDEN=1` rewrites them). The case's input is kept
//! next to it as `input.yaml` (the `example` cases compile envoy-examples/router.yaml and
//! envoy-examples/envoy-gateway/router.yaml), so `llmkube-gen compile -f
//! tests/golden/<case>/input.yaml ...` reproduces the output; for `envoy-gateway.yaml` the router
//! also gets `gatewayRef: {name: ai-gateway, namespace: envoy-gateway-system}`, and the module is
//! pinned with a placeholder `--wasm-sha256`.

mod common;
use common::*;
use llmkube_gen::targets::envoy_gateway::{compile_envoy_gateway, GatewayOptions, WasmSource};
use llmkube_gen::{compile_envoy, CompileOptions, EnvoyOptions, Source};
use serde_json::json;

struct Case {
    name: &'static str,
    input: String,
    /// Whether `input.yaml` is kept next to the outputs (not for inputs that live elsewhere in
    /// the repository).
    keep_input: bool,
    common: CompileOptions,
}

fn cases() -> Vec<Case> {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/router.yaml"
    ))
    .unwrap();
    vec![
        Case {
            name: "example",
            input: example,
            keep_input: false,
            common: CompileOptions {
                resolve: [
                    ("qwen3-8b".into(), ("127.0.0.1".into(), 8001)),
                    ("llama-3-70b".into(), ("127.0.0.1".into(), 8002)),
                ]
                .into(),
                ..Default::default()
            },
        },
        Case {
            name: "dataplane",
            input: dataplane_docs(dataplane_router()),
            keep_input: true,
            common: CompileOptions::default(),
        },
        Case {
            name: "per-backend-timeouts",
            input: dataplane_docs(reference_example(None)),
            keep_input: true,
            common: CompileOptions::default(),
        },
    ]
}

fn envoy_options(common: CompileOptions) -> EnvoyOptions {
    EnvoyOptions {
        wasm_dir: "/opt/llmkube/wasm".into(),
        ..EnvoyOptions::with_common(common)
    }
}

fn sources(c: &Case) -> Vec<Source> {
    vec![Source {
        name: format!("{}/input.yaml", c.name),
        text: c.input.clone(),
    }]
}

/// The cases with a Gateway to attach to, for the envoy-gateway target.
fn gateway_cases() -> Vec<Case> {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/envoy-gateway/router.yaml"
    ))
    .unwrap();
    let mut out = vec![Case {
        name: "envoy-gateway-example",
        input: example,
        keep_input: false,
        common: CompileOptions::default(),
    }];
    for c in cases().into_iter().filter(|c| c.keep_input) {
        // The same router, attached to a Gateway.
        let input = c.input.replacen(
            "\"spec\":{",
            &format!(
                "\"spec\":{{\"gatewayRef\":{},",
                json!({"name": "ai-gateway", "namespace": "envoy-gateway-system"})
            ),
            1,
        );
        out.push(Case { input, ..c });
    }
    out
}

#[test]
fn envoy_gateway_target_matches_its_golden_files() {
    let mut failures = Vec::new();
    for c in gateway_cases() {
        let o = GatewayOptions {
            common: c.common.clone(),
            wasm_sha256: Some("0".repeat(64)),
            ..GatewayOptions::new(WasmSource::Http(
                "https://wasm.example.internal/llmkube_model_router.wasm".into(),
            ))
        };
        let out =
            compile_envoy_gateway(&sources(&c), &o).unwrap_or_else(|e| panic!("{}: {e:?}", c.name));
        if let Err(e) = golden::check(c.name, "envoy-gateway.yaml", &out) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn envoy_target_matches_its_golden_files() {
    let mut failures = Vec::new();
    for c in cases() {
        let out = compile_envoy(&sources(&c), &envoy_options(c.common.clone()))
            .unwrap_or_else(|e| panic!("{}: {e:?}", c.name));
        let input = c.keep_input.then_some(("input.yaml", c.input.as_str()));
        for (file, text) in input.into_iter().chain([("envoy.yaml", out.as_str())]) {
            if let Err(e) = golden::check(c.name, file, text) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The walkthrough example with budgets on the shared ledger the generator deploys
/// (`--budgets-redis-secret redis-url --budgets-image ghcr.io/example/llmkube-budgets:1`).
#[test]
fn envoy_gateway_shared_budgets_match_their_golden_files() {
    let input = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/envoy-gateway/router.yaml"
    ))
    .unwrap()
    .replace(
        "  policy:\n",
        "  policy:\n    budgets:\n      - {name: monthly, scope: router, maxTokens: 1000000, windowSeconds: 3600}\n      - {name: per-team, scope: team, headerKey: x-team, maxTokens: 50000}\n",
    );
    assert!(input.contains("name: per-team"));
    let o = GatewayOptions {
        wasm_sha256: Some("0".repeat(64)),
        budgets: llmkube_gen::targets::envoy_gateway::budgets::from_flags(
            None,
            Some("redis-url"),
            Some("ghcr.io/example/llmkube-budgets:1"),
        )
        .unwrap(),
        ..GatewayOptions::new(WasmSource::Http(
            "https://wasm.example.internal/llmkube_model_router.wasm".into(),
        ))
    };
    let case = "envoy-gateway-budgets";
    let src = [Source {
        name: format!("{case}/input.yaml"),
        text: input.clone(),
    }];
    let out = compile_envoy_gateway(&src, &o).unwrap_or_else(|e| panic!("{e:?}"));
    let failures: Vec<String> = [("input.yaml", input.as_str()), ("envoy-gateway.yaml", &out)]
        .into_iter()
        .filter_map(|(file, text)| golden::check(case, file, text).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A LoadAware `resolution: endpoint` backend picked by the filter (its ORIGINAL_DST cluster and
/// routes by EnvoyPatchPolicy), with the pods given as `--endpoints isvc-a=10.0.0.1:8000,10.0.0.2:8000`.
#[test]
fn envoy_gateway_endpoint_picking_matches_its_golden_files() {
    let mut r = router();
    r["spec"]["gatewayRef"] = json!({"name": "ai-gateway", "namespace": "envoy-gateway-system"});
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    r["spec"]["backends"][0]["balancing"] =
        json!({"mode": "LoadAware", "prefixAffinity": {"blockBytes": 512}});
    let input = full(r);
    let o = GatewayOptions {
        wasm_sha256: Some("0".repeat(64)),
        common: CompileOptions {
            endpoints: common::two_pods("isvc-a"),
            ..Default::default()
        },
        ..GatewayOptions::new(WasmSource::Http(
            "https://wasm.example.internal/llmkube_model_router.wasm".into(),
        ))
    };
    let case = "envoy-gateway-pick";
    let src = [Source {
        name: format!("{case}/input.yaml"),
        text: input.clone(),
    }];
    let out = compile_envoy_gateway(&src, &o).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(out.contains("ORIGINAL_DST"));
    let failures: Vec<String> = [("input.yaml", input.as_str()), ("envoy-gateway.yaml", &out)]
        .into_iter()
        .filter_map(|(file, text)| golden::check(case, file, text).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
