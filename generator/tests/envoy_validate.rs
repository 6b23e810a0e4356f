//! Every generated bootstrap must pass `envoy --mode validate`, which also loads the real wasm
//! filter and runs its `on_configure` on the generated plugin config.
//!
//! Envoy: `$ENVOY_BIN`, else `<repo>/.venv/bin/envoy` (scripts/setup.sh installs it). A missing
//! Envoy FAILS these tests. The filter: `$LLMKUBE_WASM_DIR`, else built here with
//! `cargo build --release --target wasm32-wasip1 -p llmkube-model-router` (a no-op when fresh).

mod common;
use common::envoy_run::{envoy_validate, model_router_dir, repo_root};
use common::*;
use llmkube_gen::targets::envoy::{UPSTREAM_WASM_FILE, WASM_FILE};
use llmkube_gen::Source;
use llmkube_gen::{compile_envoy, EnvoyOptions, Format};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The filter directory, with `llmkube_upstream.wasm` in it. Until the upstream filter is built
/// next to the model-router one, a temp dir holds a copy of the model-router module under that
/// name as a stand-in: `--mode validate` only loads it and runs `on_configure`, and both modules
/// accept the same plugin config.
fn wasm_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = model_router_dir();
        if d.join(UPSTREAM_WASM_FILE).is_file() {
            return d;
        }
        let tmp = std::env::temp_dir().join(format!("llmkube-gen-wasm-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        for name in [WASM_FILE, UPSTREAM_WASM_FILE] {
            std::fs::copy(d.join(WASM_FILE), tmp.join(name)).unwrap();
        }
        eprintln!(
            "note: {UPSTREAM_WASM_FILE} not in {}; validating with the model-router module as a stand-in",
            d.display()
        );
        tmp
    })
}

/// Compiles `text` and runs `envoy --mode validate` on the result.
fn validate(name: &str, text: String, mut opts: EnvoyOptions) {
    opts.wasm_dir = wasm_dir().to_path_buf();
    let out = compile_envoy(
        &[Source {
            name: name.into(),
            text,
        }],
        &opts,
    )
    .unwrap_or_else(|e| {
        panic!(
            "{name}: {:#?}",
            e.iter().map(|p| p.to_string()).collect::<Vec<_>>()
        )
    });
    let ext = if opts.format == Format::Json {
        "json"
    } else {
        "yaml"
    };
    let (ok, report) = envoy_validate(&format!("{name}.{ext}"), &out);
    assert!(ok, "{report}");
}

#[test]
fn harness_detects_a_broken_bootstrap() {
    let mut opts = EnvoyOptions {
        wasm_dir: wasm_dir().to_path_buf(),
        ..Default::default()
    };
    opts.format = Format::Yaml;
    let good = compile_envoy(
        &[Source {
            name: "x".into(),
            text: example(),
        }],
        &opts,
    )
    .unwrap();
    let bad = good.replace("STRICT_DNS", "STRICTER_DNS");
    assert_ne!(good, bad);
    let (ok, report) = envoy_validate("broken.yaml", &bad);
    assert!(!ok, "Envoy accepted a broken bootstrap: {report}");
    // A plugin config the filter refuses (unknown field) fails at config load too.
    let refused = good.replacen("\"router\":", "\"no_such_field\":1,\"router\":", 1);
    assert_ne!(good, refused);
    let (ok, report) = envoy_validate("refused.yaml", &refused);
    assert!(
        !ok,
        "the filter accepted an unknown plugin-config field: {report}"
    );
}

fn example() -> String {
    std::fs::read_to_string(repo_root().join("envoy-examples/router.yaml")).unwrap()
}

#[test]
fn example_router_defaults() {
    validate("example-defaults", example(), EnvoyOptions::default());
}

#[test]
fn example_router_local_run_json() {
    let opts = EnvoyOptions {
        listen: "127.0.0.1:18080".parse().unwrap(),
        admin: "127.0.0.1:18081".parse().unwrap(),
        resolve: [
            ("qwen3-8b".into(), ("127.0.0.1".into(), 8001)),
            ("llama-3-70b".into(), ("localhost".into(), 8002)),
        ]
        .into(),
        max_body_bytes: Some(2 * 1024 * 1024),
        model_header: Some("X-Gateway-Base-Model-Name".into()),
        format: Format::Json,
        ..Default::default()
    };
    validate("example-local", example(), opts);
}

#[test]
fn endpoints_tls_providers_and_no_idle_timeout() {
    let mut r = router();
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    r["spec"]["backends"][0]["balancing"] = json!({"mode": "LoadAware", "prefixAffinity": {"blockBytes": 512}, "sessionAffinity": {"headers": ["x-session-id"]}});
    r["spec"]["backends"][1]["resolution"] = json!("endpoint");
    r["spec"]["backends"].as_array_mut().unwrap().push(json!({
        "name": "claude", "tier": "cloud",
        "external": {"provider": "anthropic", "model": "claude-opus-4", "url": "https://gateway.example.com/v1/", "credentialsSecretRef": {"name": "anth"}}
    }));
    r["spec"]["backends"].as_array_mut().unwrap().push(json!({
        "name": "lite", "tier": "cloud", "external": {"provider": "litellm", "model": "m", "url": "http://[::1]:4000/v1"}
    }));
    r["spec"]["rules"] = json!([
        {"name": "pii", "failClosed": true, "timeout": "5s", "match": {"dataClassification": ["pii"]}, "route": {"backends": ["local-a", "local-b"]}},
        {"name": "shadow", "match": {"headers": {"X-Team": "research"}}, "route": {"strategy": "shadow", "backends": ["claude", "lite", "cloud"]}},
    ]);
    set(&mut r, "/spec/proxy/streamIdleTimeout", json!("0s"));
    set(&mut r, "/spec/proxy/responseHeaderTimeout", json!("10m"));
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "isvc-a-1", "namespace": "llm", "labels": {"kubernetes.io/service-name": "isvc-a"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}]
    });
    let anth = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "anth", "namespace": "llm"}, "stringData": {"ANTHROPIC_API_KEY": "sk-ant"}});
    let opts = EnvoyOptions {
        endpoints: [(
            "isvc-b".into(),
            vec![("10.0.1.1".into(), 8000), ("fd00::2".into(), 8000)],
        )]
        .into(),
        ..Default::default()
    };
    validate(
        "endpoints-tls",
        docs(&[
            r,
            isvc("isvc-a", Some(8000)),
            isvc("isvc-b", None),
            secret(),
            anth,
            slice,
        ]),
        opts,
    );
}

/// The data-plane router reduced to the named rules (and the fail-closed `pii` one).
fn dataplane_with(rules: &[&str]) -> String {
    let mut r = dataplane_router();
    let all = r["spec"]["rules"].as_array().unwrap().clone();
    r["spec"]["rules"] = json!(all
        .into_iter()
        .filter(|x| x["name"] == "pii" || rules.contains(&x["name"].as_str().unwrap()))
        .collect::<Vec<_>>());
    dataplane_docs(r)
}

#[test]
fn weighted_three_backends_six_permutations() {
    validate("dp-w3", dataplane_with(&["w3"]), EnvoyOptions::default());
}

#[test]
fn weighted_five_backends_five_routes() {
    validate("dp-w5", dataplane_with(&["w5"]), EnvoyOptions::default());
}

#[test]
fn shadow_rule_with_a_cloud_target() {
    validate(
        "dp-shadow",
        dataplane_with(&["sh"]),
        EnvoyOptions::default(),
    );
}

#[test]
fn mixed_tier_rule_with_local_only_variant() {
    validate(
        "dp-mixed",
        dataplane_with(&["mixed"]),
        EnvoyOptions::default(),
    );
}

#[test]
fn anthropic_and_openai_in_one_aggregate() {
    let opts = EnvoyOptions {
        format: Format::Json,
        ..Default::default()
    };
    validate("dp-ext", dataplane_with(&["ext"]), opts);
}

#[test]
fn whole_data_plane_with_name_match() {
    let mut r = dataplane_router();
    r["spec"]["defaultRouteStrategy"] = json!("BackendNameMatch");
    validate("dp-all", dataplane_docs(r), EnvoyOptions::default());
}

/// Attempts with different timeouts go through internal listeners (`attempt-<b>`), including to
/// external backends with TLS, credentials and a Host rewrite.
#[test]
fn per_backend_timeouts_through_internal_listeners() {
    let mut r = dataplane_router();
    r["spec"]["backends"][6]["timeout"] = json!("30s");
    let all = r["spec"]["rules"].as_array().unwrap().clone();
    r["spec"]["rules"] = json!(all
        .into_iter()
        .filter(|x| ["pii", "ext", "sh"].contains(&x["name"].as_str().unwrap()))
        .collect::<Vec<_>>());
    let text = dataplane_docs(r);
    assert!(text.contains("claude"));
    let opts = EnvoyOptions {
        format: Format::Json,
        ..Default::default()
    };
    let out = compile_envoy(
        &[Source {
            name: "x.yaml".into(),
            text: text.clone(),
        }],
        &opts,
    )
    .unwrap();
    for s in ["attempt-claude", "attempts.cloud.claude", "via-local-b"] {
        assert!(out.contains(s), "{s}");
    }
    validate("dp-attempts", text, opts);
}

#[test]
fn auth_chain_remote_and_file_jwks() {
    let mut r = router();
    r["spec"]["policy"] = json!({"auth": {
        "jwt": {"issuer": "https://idp.example.com/", "jwksURI": "https://idp.example.com/certs", "provider": "kc", "teamClaim": "team"},
        "allowlists": [{"team": "research", "models": ["qwen3-*"]}, {"team": "ops"}],
    }});
    validate("auth-remote", full(r.clone()), EnvoyOptions::default());
    let dir = std::env::temp_dir().join(format!("llmkube-gen-jwks-v-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jwks.json");
    std::fs::write(&file, r#"{"keys":[{"kty":"RSA","alg":"RS256","kid":"k","n":"sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw","e":"AQAB"}]}"#).unwrap();
    validate(
        "auth-file",
        full(r),
        EnvoyOptions {
            jwks_file: Some(file),
            ..Default::default()
        },
    );
}

/// A LoadAware endpoint backend (ORIGINAL_DST cluster, pick config in the filter) alone and
/// failing over to a cloud backend through the hops.
#[test]
fn endpoint_picking_backend() {
    let mut r = router();
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    r["spec"]["backends"][0]["balancing"] = json!({"mode": "LoadAware", "prefixAffinity": {},
        "sessionAffinity": {"headers": ["x-session-id"]}});
    r["spec"]["rules"] = json!([
        {"name": "r0", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["local-a"]}},
        {"name": "r1", "match": {"models": ["big"]}, "route": {"backends": ["local-a", "cloud"]}}
    ]);
    let opts = EnvoyOptions {
        endpoints: common::two_pods("isvc-a"),
        ..Default::default()
    };
    validate("endpoint-picking", full(r), opts);
}

/// The bundled example compiled for the envoy target with `opts`.
fn compile_example(opts: &EnvoyOptions) -> String {
    compile_envoy(
        &[Source {
            name: "example".into(),
            text: example(),
        }],
        opts,
    )
    .unwrap()
}

#[test]
fn budgets_service_cluster_by_ip_and_by_name() {
    for host in ["127.0.0.1", "llmkube-budgets.llm.svc.cluster.local"] {
        let opts = EnvoyOptions {
            budgets_service: Some((host.into(), 8090)),
            format: Format::Json,
            wasm_dir: wasm_dir().to_path_buf(),
            ..Default::default()
        };
        let out = compile_example(&opts);
        let b: serde_json::Value = serde_json::from_str(&out).unwrap();
        let clusters = b["static_resources"]["clusters"].as_array().unwrap();
        let c = clusters
            .iter()
            .find(|c| c["name"] == "llmkube-budgets")
            .expect("the llmkube-budgets cluster");
        let addr = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"];
        assert_eq!(
            (addr["address"].as_str(), addr["port_value"].as_u64()),
            (Some(host), Some(8090))
        );
        // The model-router's plugin configuration keeps its budgets on that cluster.
        let plugin = b.to_string().replace("\\\"", "\"");
        assert!(
            plugin.contains(r#""service":{"cluster":"llmkube-budgets","timeout_ms":1000}"#),
            "no budgets.service in the plugin configuration"
        );
        validate("budgets-service", example(), opts);
    }
}

/// Lease mode (`--budgets-lease-tokens`/`--budgets-lease-usd`) puts `budgets.service.lease` in
/// the plugin configuration, which the filter accepts in a real Envoy.
#[test]
fn budgets_service_in_lease_mode() {
    let opts = EnvoyOptions {
        budgets_service: Some(("127.0.0.1".into(), 8090)),
        budgets_lease: Some(router_core::budget::shared_lease::LeaseConfig {
            max_tokens: Some(20_000),
            max_usd: Some("0.5".into()),
            report_ms: 100,
            team_slots: router_core::budget::lease_slots::DEFAULT_TEAM_SLOTS,
            unsafe_lease_unheld: false,
        }),
        format: Format::Json,
        wasm_dir: wasm_dir().to_path_buf(),
        ..Default::default()
    };
    let out = compile_example(&opts);
    let plugin = out.replace("\\\"", "\"");
    assert!(
        plugin.contains(r#""lease":{"max_tokens":20000,"max_usd":"0.5","report_ms":100}"#),
        "no budgets.service.lease in the plugin configuration"
    );
    validate("budgets-lease", example(), opts);
}

/// Per-request mode (`--budgets-per-request`) puts `budgets.per_request` in the plugin
/// configuration, which the filter accepts in a real Envoy (the default, worker leases, writes
/// nothing and is the plain example's validation).
#[test]
fn budgets_per_request() {
    let opts = EnvoyOptions {
        budgets_per_request: true,
        format: Format::Json,
        wasm_dir: wasm_dir().to_path_buf(),
        ..Default::default()
    };
    let out = compile_example(&opts);
    assert!(
        out.replace("\\\"", "\"").contains(r#""per_request":true"#),
        "no budgets.per_request in the plugin configuration"
    );
    validate("budgets-per-request", example(), opts);
}
