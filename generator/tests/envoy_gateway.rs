//! `compile --target envoy-gateway`: every document checked against its upstream CRD (schema,
//! unknown fields, CEL rules), the extension policy's config equal to the envoy target's plugin
//! config, the module pinned by its sha256, deterministic output, credentials only in Secrets
//! (derived under `apiKey` when the input carries the ModelRouter's), and the target's own refusals.

mod common;
use common::crds::{documents, Crds, Report};
use common::eg::*;
use common::*;
use llmkube_gen::targets::envoy_gateway::{
    budgets, compile_envoy_gateway, compile_envoy_gateway_diag, GatewayOptions, WasmSource,
};
use llmkube_gen::{compile_envoy, CompileOptions, Diagnostics, EnvoyOptions, Source};
use router_core::config::PluginConfig;
use serde_json::{json, Value};

fn src(text: &str) -> Vec<Source> {
    vec![Source {
        name: "eg.yaml".into(),
        text: text.to_string(),
    }]
}

fn compile_docs(text: &str, o: &GatewayOptions) -> Vec<Value> {
    let out = compile_envoy_gateway(&src(text), o)
        .unwrap_or_else(|e| panic!("{:#?}", e.iter().map(|p| p.to_string()).collect::<Vec<_>>()));
    documents(&out)
}

fn compile_err(text: &str, o: &GatewayOptions) -> Vec<String> {
    compile_envoy_gateway(&src(text), o)
        .expect_err("should fail")
        .iter()
        .map(|p| p.to_string())
        .collect()
}

/// The inputs every structural test runs on: the walkthrough example and the whole data plane
/// (every strategy, more route keys than one AIGatewayRoute holds).
fn corpus() -> Vec<(&'static str, String)> {
    vec![
        ("example", example()),
        (
            "dataplane",
            dataplane_docs(with_gateway(dataplane_router())),
        ),
        (
            "per-backend-timeouts",
            dataplane_docs(with_gateway(reference_example(None))),
        ),
        (
            "auth",
            dataplane_docs(with_auth(with_gateway(dataplane_router()))),
        ),
    ]
}

fn with_auth(mut r: Value) -> Value {
    r["spec"]["policy"] = json!({"auth": {
        "jwt": {"issuer": "https://idp.example.com/realms/llm", "jwksURI": "https://idp.example.com/certs", "provider": "kc", "teamClaim": "grp"},
        "allowlists": [{"team": "research", "models": ["qwen3-*"]}],
    }});
    r
}

#[test]
fn auth_is_a_security_policy_on_every_route() {
    let docs = compile_docs(
        &dataplane_docs(with_auth(with_gateway(dataplane_router()))),
        &opts(),
    );
    let routes: Vec<&str> = of_kind(&docs, "AIGatewayRoute")
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap())
        .collect();
    let policies = of_kind(&docs, "SecurityPolicy");
    assert!(!policies.is_empty());
    let mut targeted = Vec::new();
    for p in &policies {
        let spec = &p["spec"];
        assert_eq!(
            spec["jwt"]["providers"],
            json!([{
                "name": "kc", "issuer": "https://idp.example.com/realms/llm",
                "remoteJWKS": {"uri": "https://idp.example.com/certs"},
                "claimToHeaders": [{"header": "x-llmkube-team", "claim": "grp"}],
            }])
        );
        for t in spec["targetRefs"].as_array().unwrap() {
            assert_eq!(t["kind"], "HTTPRoute");
            targeted.push(t["name"].as_str().unwrap());
        }
    }
    assert_eq!(targeted, routes, "every generated route is authenticated");
    // The allowlists travel in the filter's config; the 401 gets our shape through the patch.
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    let cfg: PluginConfig =
        serde_json::from_value(eep["spec"]["wasm"][0]["config"].clone()).unwrap();
    assert_eq!(cfg.auth.unwrap().team_header, "x-llmkube-team");
    let patch = of_kind(&docs, "EnvoyPatchPolicy")[0];
    let lrc = patch["spec"]["jsonPatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["operation"]["path"] == "/local_reply_config")
        .expect("a local_reply_config patch");
    assert_eq!(
        lrc["operation"]["value"]["mappers"][0]["body_format_override"]["json_format"]["error"]
            ["code"],
        "invalid_token"
    );
    // Without auth: no SecurityPolicy, no patch.
    let docs = compile_docs(&dataplane_docs(with_gateway(dataplane_router())), &opts());
    assert!(of_kind(&docs, "SecurityPolicy").is_empty());
}

#[test]
fn every_document_matches_its_crd_schema_and_cel_rules() {
    let crds = Crds::load();
    let mut report = Report::default();
    for (name, text) in corpus() {
        for o in [
            opts(),
            GatewayOptions {
                wasm: WasmSource::Image("oci://ghcr.io/example/llmkube-model-router:1".into()),
                ..opts()
            },
        ] {
            for d in compile_docs(&text, &o) {
                let before = report.errors.len();
                match check_core(&d) {
                    Ok(true) => {}
                    Ok(false) => crds.check(&d, &mut report),
                    Err(e) => report.errors.push(e),
                }
                for e in &mut report.errors[before..] {
                    *e = format!("{name}: {e}");
                }
            }
        }
    }
    eprintln!("{}", report.summary());
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    // The CEL check is not vacuous: rules of these CRDs were actually evaluated, and every rule
    // met was compiled and evaluated by cel-interpreter.
    assert!(report.cel_evaluated > 50, "{}", report.summary());
    assert!(
        report.cel_unparsable.is_empty() && report.cel_failed.is_empty(),
        "{}",
        report.summary()
    );
}

#[test]
fn crd_checks_catch_unknown_fields_bad_values_and_cel_violations() {
    let crds = Crds::load();
    let docs = compile_docs(&example(), &opts());
    let check = |d: &Value| {
        let mut r = Report::default();
        crds.check(d, &mut r);
        r.errors
    };
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0].clone();
    assert!(check(&eep).is_empty());
    let mut typo = eep.clone();
    typo["spec"]["wasm"][0]["failopen"] = json!(false);
    assert!(
        check(&typo)
            .iter()
            .any(|e| e.contains(".spec.wasm[0].failopen: unknown field")),
        "{:?}",
        check(&typo)
    );
    let mut bad_enum = eep.clone();
    bad_enum["spec"]["wasm"][0]["code"]["type"] = json!("ConfigMap");
    assert!(!check(&bad_enum).is_empty());
    // Below x-kubernetes-preserve-unknown-fields anything goes (the plugin config).
    let mut free = eep.clone();
    free["spec"]["wasm"][0]["config"]["anything"] = json!({"x": 1});
    assert!(check(&free).is_empty(), "{:?}", check(&free));
    // AIServiceBackend: the CEL rule requires an Envoy Gateway Backend.
    let mut svc = of_kind(&docs, "AIServiceBackend")[0].clone();
    svc["spec"]["backendRef"] = json!({"name": "x", "kind": "Service", "group": ""});
    assert!(
        check(&svc).iter().any(|e| e.contains("CEL rule")),
        "{:?}",
        check(&svc)
    );
}

/// The input as the envoy target reads it: it inlines credentials under the ModelRouter's key
/// names (the plugin config does not depend on them).
fn for_envoy(text: &str) -> String {
    text.replace("  apiKey: sk-openai", "  OPENAI_API_KEY: sk-openai")
        .replace("  apiKey: sk-ant", "  ANTHROPIC_API_KEY: sk-ant")
}

#[test]
fn extension_policy_config_is_the_envoy_targets_plugin_config() {
    for (name, text) in corpus() {
        let docs = compile_docs(&text, &opts());
        // The envoy target inlines credentials under the ModelRouter's key names; the plugin
        // config does not depend on them.
        let envoy_text = for_envoy(&text);
        let envoy = compile_envoy(
            &src(&envoy_text),
            &EnvoyOptions {
                wasm_dir: "/opt/wasm".into(),
                format: llmkube_gen::Format::Json,
                ..Default::default()
            },
        );
        // Envoy-target refusals (signing providers) do not apply to these inputs.
        let envoy: Value = serde_json::from_str(&envoy.unwrap()).unwrap();
        let envoy_json = serde_json::to_string(&envoy::plugin_of(&envoy)).unwrap();
        for eep in of_kind(&docs, "EnvoyExtensionPolicy") {
            let config = &eep["spec"]["wasm"][0]["config"];
            let pc: PluginConfig = serde_json::from_value(config.clone()).unwrap();
            assert_eq!(serde_json::to_string(&pc).unwrap(), envoy_json, "{name}");
            let envoy_value: Value = serde_json::from_str(&envoy_json).unwrap();
            assert_eq!(*config, envoy_value, "{name}");
            let wasm = &eep["spec"]["wasm"][0];
            assert_eq!(wasm["failOpen"], false);
            assert_eq!(wasm["rootID"], "model-router");
            assert_eq!(wasm["code"]["http"]["sha256"], SHA);
        }
    }
}

#[test]
fn sha256_is_that_of_the_built_module_unless_given() {
    let dir = std::env::temp_dir().join(format!("llmkube-gen-eg-sha-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let module = dir.join("llmkube_model_router.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0 not really a module").unwrap();
    let expected = {
        let out = std::process::Command::new("sha256sum")
            .arg(&module)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    };
    let o = GatewayOptions {
        wasm_sha256: None,
        wasm_dir: dir.clone(),
        ..opts()
    };
    let docs = compile_docs(&example(), &o);
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    assert_eq!(eep["spec"]["wasm"][0]["code"]["http"]["sha256"], expected);
    // Missing module and no --wasm-sha256: an error naming both ways out.
    let missing = GatewayOptions {
        wasm_dir: dir.join("nope"),
        ..o.clone()
    };
    let e = compile_err(&example(), &missing);
    assert!(
        e.iter()
            .any(|e| e.starts_with("options: --wasm-sha256: cannot read ")
                && e.contains("pass --wasm-sha256")),
        "{e:?}"
    );
    let bad = GatewayOptions {
        wasm_sha256: Some("ABC".into()),
        ..opts()
    };
    assert_eq!(
        compile_err(&example(), &bad),
        ["options: --wasm-sha256: \"ABC\" must be 64 lowercase hex digits"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deterministic_output() {
    for (_, text) in corpus() {
        let a = compile_envoy_gateway(&src(&text), &opts()).unwrap();
        for _ in 0..3 {
            assert_eq!(a, compile_envoy_gateway(&src(&text), &opts()).unwrap());
        }
    }
}

/// Credentials never leave a Secret: the ModelRouter's Secret in the input (its key the
/// provider's, e.g. `OPENAI_API_KEY`) becomes a derived Secret holding the same value under
/// `apiKey`, the key Envoy AI Gateway reads, which the policy references; nothing else of the
/// output holds the value. A Secret already keyed `apiKey` (the walkthrough's) is referenced as
/// it is, and nothing is derived.
#[test]
fn credentials_are_derived_into_secrets_never_inlined() {
    let text = dataplane_docs(with_gateway(dataplane_router()));
    let out = compile_envoy_gateway(&src(&text), &opts()).unwrap();
    let docs = documents(&out);
    let secrets = of_kind(&docs, "Secret");
    let decoded = |d: &Value| {
        let data: k8s_openapi::ByteString =
            serde_json::from_value(d["data"]["apiKey"].clone()).unwrap();
        String::from_utf8(data.0).unwrap()
    };
    let derived: Vec<(&str, String)> = secrets
        .iter()
        .map(|d| (d["metadata"]["name"].as_str().unwrap(), decoded(d)))
        .collect();
    assert_eq!(
        derived,
        [
            ("llmkube-dp-cloud", OPENAI_KEY.to_string()),
            ("llmkube-dp-claude", ANTHROPIC_KEY.to_string()),
        ]
    );
    for d in &secrets {
        assert_eq!(d["metadata"]["namespace"], "llm");
        assert_eq!(d["type"], "Opaque");
        assert_eq!(
            d["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "llmkube-gen"
        );
        assert!(d.get("stringData").is_none(), "{d}");
        assert_eq!(d["data"].as_object().unwrap().len(), 1, "{d}");
    }
    assert_eq!(
        secrets[0]["metadata"]["annotations"]["llmkube.dev/derived-from"],
        "Secret llm/openai key OPENAI_API_KEY"
    );
    // Outside the Secrets, no credential in any form.
    let rest: Vec<&Value> = docs.iter().filter(|d| d["kind"] != "Secret").collect();
    let rest = serde_json::to_string(&rest).unwrap();
    for secret in [OPENAI_KEY, ANTHROPIC_KEY] {
        assert!(text.contains(secret));
        assert!(!rest.contains(secret), "{secret} leaked outside a Secret");
    }
    for d in &secrets {
        let b64 = d["data"]["apiKey"].as_str().unwrap();
        assert!(!rest.contains(b64), "a credential leaked outside a Secret");
    }
    // Each policy reads its backend's derived Secret, applied before it.
    let position = |kind: &str, name: &str| {
        docs.iter()
            .position(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap()
    };
    let by_type: Vec<(String, Value)> = of_kind(&docs, "BackendSecurityPolicy")
        .iter()
        .map(|p| {
            let t = p["spec"]["type"].as_str().unwrap().to_string();
            let field = if t == "APIKey" {
                "apiKey"
            } else {
                "anthropicAPIKey"
            };
            let name = p["metadata"]["name"].as_str().unwrap();
            assert!(position("Secret", name) < position("BackendSecurityPolicy", name));
            (t, p["spec"][field]["secretRef"].clone())
        })
        .collect();
    assert_eq!(
        by_type,
        [
            (
                "APIKey".to_string(),
                json!({"name": "llmkube-dp-cloud", "namespace": "llm"})
            ),
            (
                "AnthropicAPIKey".to_string(),
                json!({"name": "llmkube-dp-claude", "namespace": "llm"})
            ),
        ]
    );
    assert!(check_all(&docs).is_empty(), "{:#?}", check_all(&docs));

    // The walkthrough's Secrets hold `apiKey` already: referenced, nothing derived or written.
    let example_out = compile_envoy_gateway(&src(&example()), &opts()).unwrap();
    for secret in [
        "sk-openai-example-not-a-real-key",
        "sk-ant-example-not-a-real-key",
    ] {
        assert!(!example_out.contains(secret));
    }
    let docs = documents(&example_out);
    assert!(of_kind(&docs, "Secret").is_empty());
    let refs: Vec<&Value> = of_kind(&docs, "BackendSecurityPolicy")
        .iter()
        .map(|p| &p["spec"]["apiKey"]["secretRef"]["name"])
        .filter(|n| !n.is_null())
        .collect();
    assert_eq!(refs, [&json!("openai-credentials")]);
}

/// Which Secret the policy reads, by what the input holds: not there → the ModelRouter's
/// Secret with a warning (its key cannot be derived); there with the provider's key → derived,
/// no warning; there with only `apiKey` → referenced, no warning; there with neither → an
/// error naming both keys.
#[test]
fn the_derived_secret_follows_what_the_input_holds() {
    let compile = |secret: Option<Value>| {
        let mut v = vec![
            with_gateway(router()),
            isvc("isvc-a", Some(8000)),
            isvc("isvc-b", None),
        ];
        v.extend(secret);
        let mut diags = Diagnostics::default();
        let out = compile_envoy_gateway_diag(&src(&docs(&v)), &opts(), &mut diags);
        (out.map(|o| documents(&o)), diags)
    };
    let policy_ref = |docs: &[Value]| {
        of_kind(docs, "BackendSecurityPolicy")[0]["spec"]["apiKey"]["secretRef"].clone()
    };
    let secret_with = |data: Value| {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "openai", "namespace": "llm"}, "stringData": data})
    };

    let (docs, diags) = compile(None);
    let docs = docs.unwrap();
    assert!(of_kind(&docs, "Secret").is_empty());
    assert_eq!(
        policy_ref(&docs),
        json!({"name": "openai", "namespace": "llm"})
    );
    assert!(
        diags.warnings.iter().any(|w| w.to_string().starts_with(
            "ModelRouter/demo: spec.backends[2].external.credentialsSecretRef.name: Secret llm/openai is not in the input, so no Secret with key \"apiKey\""
        )),
        "{:?}",
        diags.warnings
    );

    let (docs, diags) = compile(Some(secret())); // OPENAI_API_KEY: sk-test
    let docs = docs.unwrap();
    assert!(
        diags
            .warnings
            .iter()
            .all(|w| !w.to_string().contains("credentialsSecretRef")),
        "{:?}",
        diags.warnings
    );
    assert_eq!(
        policy_ref(&docs),
        json!({"name": "llmkube-demo-cloud", "namespace": "llm"})
    );
    let s = of_kind(&docs, "Secret");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0]["metadata"]["name"], "llmkube-demo-cloud");
    assert_eq!(s[0]["data"], json!({"apiKey": "c2stdGVzdA=="})); // base64("sk-test")
    assert!(check_all(&docs).is_empty(), "{:#?}", check_all(&docs));

    let (docs, diags) = compile(Some(secret_with(json!({"apiKey": "sk-x"}))));
    let docs = docs.unwrap();
    assert!(
        diags
            .warnings
            .iter()
            .all(|w| !w.to_string().contains("credentialsSecretRef")),
        "{:?}",
        diags.warnings
    );
    assert!(of_kind(&docs, "Secret").is_empty());
    assert_eq!(
        policy_ref(&docs),
        json!({"name": "openai", "namespace": "llm"})
    );

    let (docs, diags) = compile(Some(secret_with(json!({"OTHER": "x"}))));
    assert!(docs.is_none());
    assert_eq!(
        diags.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        ["ModelRouter/demo: spec.backends[2].external.credentialsSecretRef.name: Secret llm/openai has no key OPENAI_API_KEY (the openai credential) nor \"apiKey\""]
    );
}

/// Every route key the filter can stamp is matched by exactly one rule, whose backends are the
/// order's, by priority in attempt order; at most 15 rules per AIGatewayRoute.
#[test]
fn one_rule_per_route_key_in_attempt_order() {
    let text = dataplane_docs(with_gateway(dataplane_router()));
    let docs = compile_docs(&text, &opts());
    let routes = of_kind(&docs, "AIGatewayRoute");
    assert!(routes.len() > 1, "the data plane needs more than one route");
    let mut keys = Vec::new();
    for r in &routes {
        let rules = r["spec"]["rules"].as_array().unwrap();
        assert!(rules.len() <= 15);
        assert_eq!(r["spec"]["parentRefs"][0]["name"], "ai-gateway");
        for rule in rules {
            let m = &rule["matches"][0]["headers"][0];
            assert_eq!(
                (m["name"].as_str(), m["type"].as_str()),
                (Some("x-llmkube-route"), Some("Exact"))
            );
            let key = m["value"].as_str().unwrap().to_string();
            let order: Vec<String> = key
                .split_once('/')
                .unwrap()
                .1
                .split(',')
                .map(|b| format!("llmkube-dp-{b}"))
                .collect();
            let refs: Vec<(String, u64)> = rule["backendRefs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| {
                    (
                        b["name"].as_str().unwrap().to_string(),
                        b["priority"].as_u64().unwrap(),
                    )
                })
                .collect();
            let expected: Vec<(String, u64)> = order.into_iter().zip(0..).collect();
            assert_eq!(refs, expected, "{key}");
            assert_eq!(rule["timeouts"]["request"], "0s");
            keys.push(key);
        }
    }
    // Exactly the filter's keys (the envoy target's route names).
    let envoy: Value = serde_json::from_str(
        &compile_envoy(
            &src(&text),
            &EnvoyOptions {
                wasm_dir: "/opt/wasm".into(),
                format: llmkube_gen::Format::Json,
                ..Default::default()
            },
        )
        .unwrap(),
    )
    .unwrap();
    let envoy_keys: Vec<String> = common::envoy::keys(&envoy);
    assert_eq!(keys, envoy_keys);
    // External backends get their provider model name.
    let cloud_rule = routes
        .iter()
        .flat_map(|r| r["spec"]["rules"].as_array().unwrap())
        .find(|r| r["matches"][0]["headers"][0]["value"] == "ext/cloud,claude")
        .unwrap();
    assert_eq!(cloud_rule["backendRefs"][0]["modelNameOverride"], "gpt-5");
    assert_eq!(
        cloud_rule["backendRefs"][1]["modelNameOverride"],
        "claude-opus-4"
    );
}

#[test]
fn retries_timeouts_and_quarantine_per_rule() {
    let text = dataplane_docs(with_gateway(dataplane_router()));
    let docs = compile_docs(&text, &opts());
    let rules: Vec<(String, String)> = of_kind(&docs, "AIGatewayRoute")
        .iter()
        .flat_map(|r| {
            let route = r["metadata"]["name"].as_str().unwrap().to_string();
            r["spec"]["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |x| (route.clone(), x["name"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut targeted = Vec::new();
    for p in of_kind(&docs, "BackendTrafficPolicy") {
        let s = &p["spec"];
        assert_eq!(s["healthCheck"]["passive"]["consecutive5XxErrors"], 1);
        assert_eq!(s["healthCheck"]["passive"]["baseEjectionTime"], "20s");
        assert_eq!(s["healthCheck"]["panicThreshold"], 0);
        assert_eq!(s["timeout"]["http"]["streamIdleTimeout"], "45s");
        for t in s["targetRefs"].as_array().unwrap() {
            targeted.push((
                t["name"].as_str().unwrap().to_string(),
                t["sectionName"].as_str().unwrap().to_string(),
            ));
        }
    }
    targeted.sort();
    let mut expected = rules.clone();
    expected.sort();
    assert_eq!(
        targeted, expected,
        "every rule has exactly one traffic policy"
    );
    // The mixed rule's timeout (7s) is the per-try timeout of its routes.
    let mixed = of_kind(&docs, "BackendTrafficPolicy")
        .into_iter()
        .find(|p| {
            p["spec"]["targetRefs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["sectionName"].as_str().unwrap().ends_with("-mixed"))
        })
        .unwrap();
    assert_eq!(mixed["spec"]["retry"]["perRetry"]["timeout"], "7s");
}

#[test]
fn patches_name_what_envoy_gateway_generates() {
    let docs = compile_docs(
        &example(),
        &GatewayOptions {
            listener: "https".into(),
            ..opts()
        },
    );
    let epp = of_kind(&docs, "EnvoyPatchPolicy")[0];
    assert_eq!(epp["metadata"]["namespace"], "envoy-gateway-system");
    let patches = epp["spec"]["jsonPatches"].as_array().unwrap();
    assert_eq!(patches[0]["name"], "envoy-gateway-system/ai-gateway/https");
    assert_eq!(
        patches[0]["operation"]["jsonPath"],
        "..http_filters[?(@.name=='envoy.filters.http.wasm/envoyextensionpolicy/llm/llmkube-llm-router/wasm/0')].typed_config.config"
    );
    assert_eq!(
        patches[0]["operation"]["path"],
        "/allow_on_headers_stop_iteration"
    );
    let ctp = of_kind(&docs, "ClientTrafficPolicy")[0];
    assert_eq!(
        ctp["spec"]["connection"]["bufferLimit"],
        8 * 1024 * 1024 + 1024 * 1024
    );
    assert_eq!(ctp["spec"]["targetRefs"][0]["sectionName"], "https");
    // The extension policy targets the HTTPRoutes Envoy AI Gateway makes of the AIGatewayRoutes.
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    let targets: Vec<&str> = eep["spec"]["targetRefs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    let routes: Vec<&str> = of_kind(&docs, "AIGatewayRoute")
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(targets, routes);
}

#[test]
fn refusals_and_warnings() {
    // No gatewayRef.
    let text = full(router());
    let e = compile_err(&text, &opts());
    assert!(e.contains(&"ModelRouter/demo: spec.gatewayRef: is required for the envoy-gateway target: it names the Gateway the policies and routes attach to".to_string()), "{e:?}");
    // Envoy Gateway fetches a remote JWKS over HTTPS only.
    let mut r = with_auth(with_gateway(router()));
    r["spec"]["policy"]["auth"]["jwt"]["jwksURI"] = json!("http://idp.example.com/certs");
    assert_eq!(compile_err(&full(r), &opts()), ["ModelRouter/demo: spec.policy.auth.jwt.jwksURI: the envoy-gateway target fetches the JWKS over HTTPS only (SecurityPolicy remoteJWKS.uri); use an https:// URL"]);
    // Secrets need not be in the input (the_derived_secret_follows_what_the_input_holds).
    // Generated names stay within Kubernetes' 253 characters.
    let mut r = with_gateway(router());
    r["metadata"]["name"] = json!(vec!["a".repeat(60); 4].join("."));
    let e = compile_err(&full(r), &opts());
    assert!(
        e.len() == 1 && e[0].contains("would be longer than 253 characters"),
        "{e:?}"
    );
    // Shadow copies to an external backend are not sent, with a warning.
    let mut diags = Diagnostics::default();
    compile_envoy_gateway_diag(
        &src(&dataplane_docs(with_gateway(dataplane_router()))),
        &opts(),
        &mut diags,
    )
    .unwrap();
    assert!(
        diags.warnings.iter().any(|w| w.to_string().contains(
            "spec.rules[3].route.strategy: shadow copies to external backend(s) cloud are not sent"
        )),
        "{:?}",
        diags.warnings
    );
}

#[test]
fn signing_providers_are_served_by_the_ai_gateway() {
    let mut r = with_gateway(router());
    r["spec"]["backends"][2]["external"] = json!({"provider": "bedrock", "model": "anthropic.claude-v2", "url": "https://bedrock-runtime.eu-west-1.amazonaws.com", "credentialsSecretRef": {"name": "aws"}});
    r["spec"]["backends"].as_array_mut().unwrap().push(json!({"name": "vertex", "external": {"provider": "vertex_ai", "model": "gemini-2.5-pro", "url": "https://europe-west4-aiplatform.googleapis.com/v1/projects/acme/locations/europe-west4", "credentialsSecretRef": {"name": "gcp"}}}));
    let text = docs(&[r.clone(), isvc("isvc-a", Some(8000)), isvc("isvc-b", None)]);
    let docs_out = compile_docs(&text, &opts());
    let crds = Crds::load();
    let mut report = Report::default();
    for d in &docs_out {
        crds.check(d, &mut report);
    }
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    let bsp = of_kind(&docs_out, "BackendSecurityPolicy");
    assert_eq!(bsp[0]["spec"]["type"], "AWSCredentials");
    assert_eq!(bsp[0]["spec"]["awsCredentials"]["region"], "eu-west-1");
    assert_eq!(bsp[1]["spec"]["type"], "GCPCredentials");
    assert_eq!(bsp[1]["spec"]["gcpCredentials"]["projectName"], "acme");
    let schemas: Vec<&Value> = of_kind(&docs_out, "AIServiceBackend")
        .iter()
        .map(|b| &b["spec"]["schema"]["name"])
        .collect();
    assert_eq!(
        schemas,
        [
            &json!("OpenAI"),
            &json!("OpenAI"),
            &json!("AWSBedrock"),
            &json!("GCPVertexAI")
        ]
    );
    // A URL the region cannot be read from is refused with the form to use.
    r["spec"]["backends"][2]["external"]["url"] = json!("https://bedrock.example.com");
    let e = compile_err(
        &docs(&[r, isvc("isvc-a", Some(8000)), isvc("isvc-b", None)]),
        &opts(),
    );
    assert_eq!(e, ["ModelRouter/demo: spec.backends[2].external.url: the AWS region is read from the URL: use https://bedrock-runtime.<region>.amazonaws.com, not \"bedrock.example.com\""]);
}

#[test]
fn common_options_apply_to_this_target() {
    let o = GatewayOptions {
        common: CompileOptions {
            resolve: [("isvc-a".into(), ("10.1.2.3".into(), 9000))].into(),
            max_body_bytes: Some(1024),
            ..Default::default()
        },
        ..opts()
    };
    let docs = compile_docs(
        &docs(&[
            with_gateway(router()),
            isvc("isvc-a", Some(8000)),
            isvc("isvc-b", None),
            secret(),
        ]),
        &o,
    );
    let backend = of_kind(&docs, "Backend")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "llmkube-demo-local-a")
        .unwrap();
    assert_eq!(
        backend["spec"]["endpoints"],
        json!([{"ip": {"address": "10.1.2.3", "port": 9000}}])
    );
    let b = of_kind(&docs, "Backend")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "llmkube-demo-local-b")
        .unwrap();
    assert_eq!(
        b["spec"]["endpoints"],
        json!([{"fqdn": {"hostname": "isvc-b.llm.svc.cluster.local", "port": 8080}}])
    );
    let ctp = of_kind(&docs, "ClientTrafficPolicy")[0];
    assert_eq!(ctp["spec"]["connection"]["bufferLimit"], 1024 + 1024 * 1024);
    let cloud = of_kind(&docs, "Backend")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "llmkube-demo-cloud")
        .unwrap();
    assert_eq!(
        cloud["spec"]["tls"],
        json!({"sni": "api.openai.com", "wellKnownCACertificates": "System"})
    );
}

/// The walkthrough example with a router budget and a team budget.
fn budgets_example() -> String {
    example().replace(
        "  policy:\n",
        "  policy:\n    budgets:\n      - {name: monthly, scope: router, maxTokens: 1000000, windowSeconds: 3600}\n      - {name: per-team, scope: team, headerKey: x-team, maxTokens: 50000}\n",
    )
}

fn deploy_budgets() -> GatewayOptions {
    GatewayOptions {
        budgets: budgets::from_flags(
            None,
            Some("redis-url"),
            Some("ghcr.io/example/llmkube-budgets:1"),
        )
        .unwrap(),
        ..opts()
    }
}

/// Core Kubernetes kinds (no CRD in generator/schemas): the document must deserialise into
/// k8s-openapi's type and serialise back to itself, so an unknown or misspelt field (dropped by
/// the typed round trip) or a wrongly typed value fails.
fn check_core(d: &Value) -> Result<bool, String> {
    fn round<T: serde::de::DeserializeOwned + serde::Serialize>(d: &Value) -> Result<bool, String> {
        let t: T = serde_json::from_value(d.clone()).map_err(|e| e.to_string())?;
        let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
        if back != *d {
            return Err(format!("not what k8s-openapi reads: {d}\nread as: {back}"));
        }
        Ok(true)
    }
    use k8s_openapi::api::{
        apps::v1::Deployment,
        core::v1::{Secret, Service},
        networking::v1::NetworkPolicy,
    };
    match (d["apiVersion"].as_str(), d["kind"].as_str()) {
        (Some("apps/v1"), Some("Deployment")) => round::<Deployment>(d),
        (Some("v1"), Some("Service")) => round::<Service>(d),
        (Some("v1"), Some("Secret")) => round::<Secret>(d),
        (Some("networking.k8s.io/v1"), Some("NetworkPolicy")) => round::<NetworkPolicy>(d),
        _ => Ok(false),
    }
}

/// Every document: core kinds through k8s-openapi, the rest against its CRD (schema, unknown
/// fields, CEL).
fn check_all(docs: &[Value]) -> Vec<String> {
    let crds = Crds::load();
    let mut report = Report::default();
    for d in docs {
        match check_core(d) {
            Ok(true) => {}
            Ok(false) => crds.check(d, &mut report),
            Err(e) => report.errors.push(e),
        }
    }
    report.errors
}

#[test]
fn shared_budgets_deploy_the_ledger_and_add_its_cluster() {
    let docs = compile_docs(&budgets_example(), &deploy_budgets());
    assert!(check_all(&docs).is_empty(), "{:#?}", check_all(&docs));
    // The filter calls the router's own cluster.
    let cluster = "llmkube-budgets/llm/llm-router";
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    let cfg: PluginConfig =
        serde_json::from_value(eep["spec"]["wasm"][0]["config"].clone()).unwrap();
    let service = cfg.budgets.as_ref().unwrap().service.as_ref().unwrap();
    assert_eq!(service.cluster, cluster);
    // ... which the EnvoyPatchPolicy adds whole, at the generated Service.
    let patch = of_kind(&docs, "EnvoyPatchPolicy")[0];
    let add: Vec<&Value> = patch["spec"]["jsonPatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster"
                && !p["name"].as_str().unwrap().starts_with("httproute/")
        })
        .collect();
    assert_eq!(add.len(), 1);
    assert_eq!(add[0]["name"], cluster);
    assert_eq!(add[0]["operation"]["op"], "add");
    assert_eq!(add[0]["operation"]["path"], "");
    let c = &add[0]["operation"]["value"];
    assert_eq!(c["name"], cluster);
    assert_eq!(c["type"], "STRICT_DNS");
    let addr = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    assert_eq!(
        (addr["address"].as_str(), addr["port_value"].as_u64()),
        (
            Some("llmkube-llm-router-budgets.llm.svc.cluster.local"),
            Some(8080)
        )
    );
    // The same plugin config as the envoy target's with --budgets-service, but for the name.
    let envoy = compile_envoy(
        &src(&for_envoy(&budgets_example())),
        &EnvoyOptions {
            wasm_dir: "/opt/wasm".into(),
            format: llmkube_gen::Format::Json,
            budgets_service: Some(("llmkube-budgets".into(), 8080)),
            ..Default::default()
        },
    )
    .unwrap();
    let mut envoy_cfg = envoy::plugin_of(&serde_json::from_str(&envoy).unwrap());
    envoy_cfg
        .budgets
        .as_mut()
        .unwrap()
        .service
        .as_mut()
        .unwrap()
        .cluster = cluster.into();
    assert_eq!(
        serde_json::to_value(&cfg).unwrap(),
        serde_json::to_value(&envoy_cfg).unwrap()
    );
    // The Deployment reads the Redis URL from the Secret; no URL is written anywhere.
    let dep = of_kind(&docs, "Deployment")[0];
    assert_eq!(dep["metadata"]["name"], "llmkube-llm-router-budgets");
    assert_eq!(dep["metadata"]["namespace"], "llm");
    let ctr = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(ctr["image"], "ghcr.io/example/llmkube-budgets:1");
    assert_eq!(
        ctr["args"],
        json!([
            "--listen",
            "0.0.0.0:8080",
            "--redis",
            "$(LLMKUBE_BUDGETS_REDIS)"
        ])
    );
    assert_eq!(
        ctr["env"],
        json!([{"name": "LLMKUBE_BUDGETS_REDIS", "valueFrom": {"secretKeyRef": {"name": "redis-url", "key": "url", "optional": false}}}])
    );
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/healthz");
    assert!(ctr.get("livenessProbe").is_none());
    let out = compile_envoy_gateway(&src(&budgets_example()), &deploy_budgets()).unwrap();
    assert!(!out.contains("redis://"));
    let svc = of_kind(&docs, "Service")[0];
    assert_eq!(svc["spec"]["ports"][0]["port"], 8080);
    assert_eq!(
        svc["spec"]["selector"],
        dep["spec"]["template"]["metadata"]["labels"]
    );
    // Only this Gateway's Envoy pods reach it.
    let np = of_kind(&docs, "NetworkPolicy")[0];
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
        json!({"gateway.envoyproxy.io/owning-gateway-name": "ai-gateway", "gateway.envoyproxy.io/owning-gateway-namespace": "envoy-gateway-system"})
    );
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        svc["spec"]["selector"]
    );
    // The core-kind check is not vacuous: a misspelt field and a wrongly typed value fail it.
    let mut typo = dep.clone();
    typo["spec"]["replica"] = json!(2);
    assert!(check_core(&typo).is_err());
    let mut typo = dep.clone();
    typo["spec"]["template"]["spec"]["containers"][0]["envFrom"] =
        json!([{"secretRef": {"name": "x"}, "prefx": "A"}]);
    assert!(check_core(&typo).is_err());
    let mut wrong = svc.clone();
    wrong["spec"]["ports"][0]["port"] = json!("8080");
    assert!(check_core(&wrong).is_err());
    assert_eq!(check_core(svc), Ok(true));
}

#[test]
fn shared_budgets_at_a_running_service_add_only_the_cluster() {
    let o = GatewayOptions {
        budgets: budgets::from_flags(Some("10.0.0.7:9090"), None, None).unwrap(),
        ..opts()
    };
    let docs = compile_docs(&budgets_example(), &o);
    assert!(check_all(&docs).is_empty(), "{:#?}", check_all(&docs));
    for kind in ["Deployment", "Service", "NetworkPolicy"] {
        assert!(of_kind(&docs, kind).is_empty(), "{kind}");
    }
    let patch = of_kind(&docs, "EnvoyPatchPolicy")[0];
    let c = patch["spec"]["jsonPatches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster")
        .unwrap();
    let c = &c["operation"]["value"];
    assert_eq!(c["type"], "STATIC");
    assert_eq!(
        c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"],
        json!({"address": "10.0.0.7", "port_value": 9090})
    );
    // Without a shared ledger: budgets embedded, no cluster.
    let docs = compile_docs(&budgets_example(), &opts());
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    let cfg: PluginConfig =
        serde_json::from_value(eep["spec"]["wasm"][0]["config"].clone()).unwrap();
    assert!(cfg.budgets.unwrap().service.is_none());
    // (The only cluster patches are the quarantine's, on Envoy Gateway's own rule clusters.)
    assert!(json_patches(&docs)
        .iter()
        .filter(|p| p["type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster")
        .all(|p| p["name"].as_str().unwrap().starts_with("httproute/")
            && p["operation"]["path"] != ""));
}

#[test]
fn shared_budgets_refusals() {
    let e = |s: Option<&str>, r: Option<&str>, i: Option<&str>| {
        budgets::from_flags(s, r, i).unwrap_err().to_string()
    };
    assert!(e(Some("a:1"), Some("s"), Some("i"))
        .starts_with("options: --budgets-service: give --budgets-service"));
    assert!(e(None, Some("s"), None)
        .starts_with("options: --budgets-image: is required with --budgets-redis-secret"));
    assert!(e(None, None, Some("i"))
        .starts_with("options: --budgets-redis-secret: is required with --budgets-image"));
    assert!(e(None, Some("Bad_Name"), Some("i")).contains("must be NAME or NAME/KEY"));
    assert!(e(None, Some("s/a b"), Some("i")).contains("must be NAME or NAME/KEY"));
    assert!(e(Some("nope"), None, None).starts_with("options: --budgets-service: \"nope\""));
    assert_eq!(
        budgets::from_flags(None, Some("redis/REDIS_URL"), Some("img")).unwrap(),
        Some(budgets::BudgetsService::Deploy {
            image: "img".into(),
            secret: "redis".into(),
            key: "REDIS_URL".into()
        })
    );
    // A router without budgets: warned, nothing emitted for them.
    let mut diags = Diagnostics::default();
    let out = compile_envoy_gateway_diag(&src(&example()), &deploy_budgets(), &mut diags).unwrap();
    assert!(
        diags.warnings.iter().any(|w| w.to_string()
            == "ModelRouter/llm-router: spec.policy.budgets: is not set: the budgets service flags are ignored and nothing is emitted for them"),
        "{:?}",
        diags.warnings
    );
    assert!(!out.contains("kind: Deployment") && !out.contains("llmkube-budgets"));
    // A Service name must be a DNS label.
    let long = budgets_example().replace("name: llm-router", &format!("name: {}", "r".repeat(60)));
    let errs = compile_err(&long, &deploy_budgets());
    assert!(
        errs.iter()
            .any(|e| e.contains("the budgets Service would be named")),
        "{errs:?}"
    );
}

/// The regular expression of a patch selecting xDS routes by name (a JSONPath regex literal,
/// which a `/` would end).
fn route_regex(patch: &Value) -> regex::Regex {
    let jp = patch["operation"]["jsonPath"].as_str().unwrap();
    let re = jp
        .strip_prefix("$.virtual_hosts[*].routes[?(@.name =~ /")
        .and_then(|r| r.strip_suffix("/)]"))
        .unwrap_or_else(|| panic!("{jp}"));
    assert!(!re.contains('/'), "a / would end the JSONPath regex: {re}");
    regex::Regex::new(re).unwrap()
}

/// One-backend rules: a per-try timeout and no retry; the EnvoyPatchPolicy removes the
/// `retry_on` Envoy Gateway writes by default from exactly their xDS routes (named as its
/// translator names them), and from no other.
#[test]
fn one_backend_routes_carry_no_retry_conditions() {
    let text = dataplane_docs(with_gateway(dataplane_router()));
    let docs = compile_docs(&text, &opts());
    let patch = of_kind(&docs, "EnvoyPatchPolicy")[0];
    let removals: Vec<&Value> = patch["spec"]["jsonPatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["operation"]["op"] == "remove")
        .collect();
    assert!(!removals.is_empty());
    let regexes: Vec<regex::Regex> = removals
        .iter()
        .map(|p| {
            assert_eq!(
                p["type"],
                "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
            );
            assert_eq!(p["name"], "envoy-gateway-system/ai-gateway/http");
            assert_eq!(p["operation"]["path"], "/route/retry_policy/retry_on");
            route_regex(p)
        })
        .collect();
    let policies = of_kind(&docs, "BackendTrafficPolicy");
    let mut singles = 0;
    for r in of_kind(&docs, "AIGatewayRoute") {
        let route = r["metadata"]["name"].as_str().unwrap();
        for (i, rule) in r["spec"]["rules"].as_array().unwrap().iter().enumerate() {
            let single = rule["backendRefs"].as_array().unwrap().len() == 1;
            singles += single as usize;
            for host in ["ai_example_com", "*"] {
                let xds = format!("httproute/llm/{route}/rule/{i}/match/0/{host}");
                let hits = regexes.iter().filter(|re| re.is_match(&xds)).count();
                assert_eq!(hits, single as usize, "{xds}");
                let other = format!("httproute/llm/{route}x/rule/{i}/match/0/{host}");
                assert!(!regexes.iter().any(|re| re.is_match(&other)), "{other}");
            }
            let btp = policies
                .iter()
                .find(|p| {
                    p["spec"]["targetRefs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|t| t["name"] == route && t["sectionName"] == rule["name"])
                })
                .unwrap();
            let retry = &btp["spec"]["retry"];
            assert_eq!(
                retry["numRetries"],
                rule["backendRefs"].as_array().unwrap().len() - 1
            );
            assert_eq!(retry.get("retryOn").is_none(), single, "{retry}");
            assert!(retry["perRetry"]["timeout"].is_string());
        }
    }
    assert!(singles > 0);
}

fn picked(mut r: Value) -> Value {
    r["spec"]["backends"][0]["resolution"] = json!("endpoint");
    r["spec"]["backends"][0]["balancing"] =
        json!({"mode": "LoadAware", "prefixAffinity": {"blockBytes": 512}});
    r["spec"]["rules"] = json!([
        {"name": "r0", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["local-a"]}},
        {"name": "r2", "match": {"models": ["other"]}, "route": {"backends": ["local-b"]}}
    ]);
    r
}

fn pods() -> CompileOptions {
    CompileOptions {
        endpoints: common::two_pods("isvc-a"),
        ..Default::default()
    }
}

/// A LoadAware `resolution: endpoint` backend: the filter gets its pods (the envoy target's
/// pick config), and the EnvoyPatchPolicy adds its ORIGINAL_DST cluster on the filter's header
/// and points exactly the xDS routes of its one-backend rules at it.
#[test]
fn picked_backends_get_an_original_dst_cluster_on_the_filters_header() {
    let o = GatewayOptions {
        common: pods(),
        ..opts()
    };
    let text = full(picked(with_gateway(router())));
    let docs = compile_docs(&text, &o);
    assert!(check_all(&docs).is_empty(), "{:#?}", check_all(&docs));
    let cluster = "llmkube-pick/llm/demo/local-a";
    let eep = of_kind(&docs, "EnvoyExtensionPolicy")[0];
    let cfg: PluginConfig =
        serde_json::from_value(eep["spec"]["wasm"][0]["config"].clone()).unwrap();
    let pick = cfg.backends[0]
        .pick
        .as_ref()
        .expect("pods in the plugin config");
    assert_eq!(pick.endpoints, ["10.0.0.1:8000", "10.0.0.2:8000"]);
    assert_eq!(pick.scrape_cluster.as_deref(), Some(cluster));
    assert!(cfg.backends[1].pick.is_none());
    // The envoy target's pick config, but for the cluster's name.
    let envoy = compile_envoy(
        &src(&for_envoy(&text)),
        &EnvoyOptions {
            wasm_dir: "/opt/wasm".into(),
            format: llmkube_gen::Format::Json,
            ..EnvoyOptions::with_common(pods())
        },
    )
    .unwrap();
    let mut envoy_cfg = envoy::plugin_of(&serde_json::from_str(&envoy).unwrap());
    envoy_cfg.backends[0].pick.as_mut().unwrap().scrape_cluster = Some(cluster.into());
    assert_eq!(
        serde_json::to_value(&cfg).unwrap(),
        serde_json::to_value(&envoy_cfg).unwrap()
    );
    let patches = json_patches(&docs);
    let add = patches
        .iter()
        .find(|p| p["name"] == cluster && p["operation"]["op"] == "add")
        .expect("the ORIGINAL_DST cluster");
    let c = &add["operation"]["value"];
    assert_eq!(c["name"], cluster);
    assert_eq!(c["type"], "ORIGINAL_DST");
    assert_eq!(c["lb_policy"], "CLUSTER_PROVIDED");
    assert_eq!(
        c["original_dst_lb_config"],
        json!({"use_http_header": true, "http_header_name": "x-gateway-destination-endpoint"})
    );
    let replace: Vec<&Value> = patches
        .iter()
        .filter(|p| p["operation"]["op"] == "replace")
        .collect();
    assert!(replace
        .iter()
        .all(|p| p["operation"]["path"] == "/route/cluster" && p["operation"]["value"] == cluster));
    let regexes: Vec<regex::Regex> = replace.iter().map(|p| route_regex(p)).collect();
    let mut sent = 0;
    for r in of_kind(&docs, "AIGatewayRoute") {
        let route = r["metadata"]["name"].as_str().unwrap();
        for (i, rule) in r["spec"]["rules"].as_array().unwrap().iter().enumerate() {
            let refs: Vec<&str> = rule["backendRefs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["name"].as_str().unwrap())
                .collect();
            let to_pick = refs == ["llmkube-demo-local-a"];
            sent += to_pick as usize;
            let xds = format!("httproute/llm/{route}/rule/{i}/match/0/*");
            assert_eq!(regexes.iter().any(|re| re.is_match(&xds)), to_pick, "{xds}");
        }
    }
    assert!(
        sent >= 2,
        "r0 and the default route go to the picked backend"
    );
    // Without LoadAware: no pick, no patch.
    let mut rr = picked(with_gateway(router()));
    rr["spec"]["backends"][0]["balancing"] = json!({"mode": "RoundRobin"});
    let docs = compile_docs(&full(rr), &o);
    assert!(!docs.iter().any(|d| d.to_string().contains("llmkube-pick/")));
}

#[test]
fn a_picked_backend_sharing_an_order_is_refused() {
    let mut r = picked(with_gateway(router()));
    r["spec"]["rules"][1]["route"]["backends"] = json!(["local-a", "cloud"]);
    let o = GatewayOptions {
        common: pods(),
        ..opts()
    };
    let e = compile_err(&full(r), &o);
    assert!(
        e.iter().any(|e| e.starts_with("ModelRouter/demo: spec.rules[1].route.backends: backend local-a has its pods picked by the gateway (spec.backends[0]: resolution: endpoint, balancing.mode: LoadAware) and shares the attempt order local-a → cloud (route \"r2/local-a,cloud\")")
            && e.contains("make local-a the only backend of spec.rules[1].route.backends, or set spec.backends[0].balancing.mode: RoundRobin")),
        "{e:?}"
    );
}

/// Shadow rules: each shadow route key's xDS route (and no other) gets mirror policies to the
/// patch-added clusters of its local mirrored backends, marked as shadow copies; no copy goes
/// to an external backend.
#[test]
fn shadow_rules_mirror_to_local_backends() {
    let text = dataplane_docs(with_gateway(dataplane_router()));
    let docs = compile_docs(&text, &opts());
    let patches = json_patches(&docs);
    let shadow_cluster = "llmkube-shadow/llm/dp/local-b";
    let add = patches
        .iter()
        .find(|p| p["name"] == shadow_cluster)
        .expect("the shadow cluster");
    assert_eq!(add["operation"]["op"], "add");
    assert_eq!(add["operation"]["path"], "");
    let c = &add["operation"]["value"];
    assert_eq!(c["name"], shadow_cluster);
    assert_eq!(c["circuit_breakers"]["thresholds"][0]["max_requests"], 4);
    assert!(!patches.iter().any(|p| p["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("llmkube-shadow/") && n.ends_with("/cloud"))));
    let mirrors: Vec<(regex::Regex, Value)> = patches
        .iter()
        .filter(|p| p["operation"]["path"] == "/route/request_mirror_policies")
        .map(|p| (route_regex(p), p["operation"]["value"].clone()))
        .collect();
    let mut shadowed = 0;
    for r in of_kind(&docs, "AIGatewayRoute") {
        let route = r["metadata"]["name"].as_str().unwrap();
        for (i, rule) in r["spec"]["rules"].as_array().unwrap().iter().enumerate() {
            let key = rule["matches"][0]["headers"][0]["value"].as_str().unwrap();
            let xds = format!("httproute/llm/{route}/rule/{i}/match/0/*");
            let hit: Vec<&Value> = mirrors
                .iter()
                .filter(|(re, _)| re.is_match(&xds))
                .map(|(_, v)| v)
                .collect();
            // `sh/<primary>,<mirrors...>`: the local mirrors of the key, in order.
            let expected: Vec<Value> = key
                .strip_prefix("sh/")
                .map(|o| o.split(',').skip(1).filter(|b| *b != "cloud").collect::<Vec<_>>())
                .unwrap_or_default()
                .into_iter()
                .map(|b| {
                    json!({"cluster": format!("llmkube-shadow/llm/dp/{b}"),
                        "request_headers_mutations": [{"append": {"header": {"key": "x-llmkube-shadow", "value": "true"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]})
                })
                .collect();
            if expected.is_empty() {
                assert!(hit.is_empty(), "{key}");
            } else {
                shadowed += 1;
                assert_eq!(hit, [&json!(expected)], "{key}");
            }
        }
    }
    assert!(shadowed > 0);
}

/// The upstream module's per-attempt header edits, as each external backend's
/// `headerMutation` (Envoy AI Gateway's upstream filter applies it on every attempt to that
/// backend): provider credential and version headers its own credential does not set are
/// removed, and so are the decision headers; Anthropic gets its version header. Local backends
/// get none (the envoy target edits no headers on attempts to them either).
#[test]
fn external_backends_carry_the_upstream_modules_header_edits() {
    let docs = compile_docs(&example(), &opts());
    let mutation = |b: &str| {
        of_kind(&docs, "AIServiceBackend")
            .into_iter()
            .find(|d| d["metadata"]["name"] == format!("llmkube-llm-router-{b}"))
            .unwrap_or_else(|| panic!("{b}"))["spec"]
            .get("headerMutation")
            .cloned()
    };
    let decision = ["x-llmkube-rule", "x-llmkube-backend", "x-llmkube-route"];
    for local in ["qwen3-8b", "llama-3-70b"] {
        assert_eq!(mutation(local), None, "{local}");
    }
    let gpt = mutation("gpt").expect("gpt");
    let mut remove = vec!["x-api-key", "anthropic-version"];
    remove.extend(decision);
    assert_eq!(gpt, json!({"remove": remove}));
    let claude = mutation("claude").expect("claude");
    let mut remove = vec!["authorization"];
    remove.extend(decision);
    assert_eq!(
        claude,
        json!({"remove": remove, "set": [{"name": "anthropic-version", "value": "2023-06-01"}]})
    );
    // The same as the core's attempt plan: what it sets is set, the rest of the provider
    // headers cleared.
    let router = router_core::router::Router::from_json(
        serde_json::to_string(&for_envoy_plugin(&docs))
            .unwrap()
            .as_bytes(),
    )
    .unwrap();
    let plan = router_core::attempt::plan_attempt(
        &router,
        router_core::attempt::AttemptInputs {
            sensitive: false,
            endpoint_backend: Some(b"claude"),
        },
    );
    let router_core::attempt::AttemptPlan::Send(send) = plan else {
        panic!("{plan:?}")
    };
    assert!(send.set.contains(&("anthropic-version", "2023-06-01")));
    assert_eq!(send.remove, &decision);
}

fn for_envoy_plugin(docs: &[Value]) -> PluginConfig {
    serde_json::from_value(
        of_kind(docs, "EnvoyExtensionPolicy")[0]["spec"]["wasm"][0]["config"].clone(),
    )
    .unwrap()
}

/// The client's `authorization` is removed on the xDS route of every route key (as the envoy
/// target's routes do), so a client's token reaches no backend, picked pods and shadow copies
/// included; nothing else is selected.
#[test]
fn every_route_removes_the_clients_authorization() {
    let text = dataplane_docs(with_gateway(dataplane_router()));
    let docs = compile_docs(&text, &opts());
    let patches = json_patches(&docs);
    let regexes: Vec<regex::Regex> = patches
        .iter()
        .filter(|p| p["operation"]["path"] == "/request_headers_to_remove")
        .map(|p| {
            assert_eq!(p["operation"]["op"], "add");
            assert_eq!(p["operation"]["value"], json!(["authorization"]));
            assert_eq!(p["name"], "envoy-gateway-system/ai-gateway/http");
            route_regex(p)
        })
        .collect();
    let routes = of_kind(&docs, "AIGatewayRoute");
    assert!(routes.len() > 1, "the corpus spans several AIGatewayRoutes");
    assert_eq!(regexes.len(), routes.len());
    for r in routes {
        let route = r["metadata"]["name"].as_str().unwrap();
        let rules = r["spec"]["rules"].as_array().unwrap().len();
        for i in 0..rules {
            let xds = format!("httproute/llm/{route}/rule/{i}/match/0/*");
            assert_eq!(
                regexes.iter().filter(|re| re.is_match(&xds)).count(),
                1,
                "{xds}"
            );
        }
        // The final `route-not-found` rule answers 404 itself: not selected.
        let not_found = format!("httproute/llm/{route}/rule/{rules}/match/0/*");
        assert!(
            !regexes.iter().any(|re| re.is_match(&not_found)),
            "{not_found}"
        );
    }
}

/// Warnings that say which field to change: attempts with different timeouts (each attempt's
/// timeout and the field it comes from), and the APIs Envoy AI Gateway cannot send to a
/// provider's schema.
#[test]
fn warnings_name_the_field_and_the_fix() {
    let warnings = |text: &str| {
        let mut diags = Diagnostics::default();
        compile_envoy_gateway_diag(&src(text), &opts(), &mut diags).expect("compiles");
        diags
            .warnings
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
    };
    let w = warnings(&dataplane_docs(with_gateway(reference_example(None))));
    assert!(w.contains(&"ModelRouter/seed: spec.rules[0].timeout: is unset and route \"pf/local,anthropic\" tries backends with different response-header timeouts: local 10s (spec.backends[0].timeout), anthropic 1m (spec.backends[1].timeout); Envoy Gateway applies one per-try timeout per rule (BackendTrafficPolicy retry.perRetry.timeout), so every attempt gets 1m: set spec.rules[0].timeout to the timeout every attempt of this rule should have, or give these backends the same timeout".to_string()), "{w:#?}");
    assert!(
        w.iter().any(|w| w.starts_with("ModelRouter/seed: spec.backends[1].external.provider: Envoy AI Gateway v1.1.0 sends only /v1/messages")),
        "{w:#?}"
    );
    // With a rule timeout every attempt has it: no timeout warning.
    let w = warnings(&dataplane_docs(with_gateway(reference_example(Some(
        "30s",
    )))));
    assert!(!w.iter().any(|w| w.contains(".timeout:")), "{w:#?}");
}

/// The JSON patches of the (one) EnvoyPatchPolicy.
fn json_patches(docs: &[Value]) -> Vec<Value> {
    of_kind(docs, "EnvoyPatchPolicy")[0]["spec"]["jsonPatches"]
        .as_array()
        .unwrap()
        .clone()
}
