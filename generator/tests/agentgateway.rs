//! `compile --target agentgateway`: the standalone config against agentgateway v1.3.1's own
//! config schema, kubernetes.yaml against the CRDs (unknown fields and CEL rules included), the
//! routing the filter's route keys select, the module pin, determinism, no secret values in the
//! manifests, the refusals, golden files, and — when `AGENTGATEWAY_BIN` is set — the real
//! binary's `--validate-only`.

mod common;
use common::crds::{crds_dir, Crds, Report};
use common::*;
use llmkube_gen::targets::agentgateway::{
    compile_agentgateway, AgentgatewayOptions, Output, NO_BACKEND_PROVIDER, RETRY_REPLAY_LIMIT,
};
use llmkube_gen::{CompileOptions, Source};
use serde_json::{json, Value};

const FAKE_SHA: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn opts(max_body: Option<u64>) -> AgentgatewayOptions {
    AgentgatewayOptions {
        common: CompileOptions {
            max_body_bytes: max_body,
            ..Default::default()
        },
        wasm_dir: "/opt/llmkube/wasm".into(),
        wasm_sha256: Some(FAKE_SHA.into()),
        ..Default::default()
    }
    .with_pods()
}

/// The pods of `isvc-pods` (only a `resolution: endpoint` backend reads them).
trait WithPods {
    fn with_pods(self) -> Self;
}
impl WithPods for AgentgatewayOptions {
    fn with_pods(mut self) -> Self {
        self.common.endpoints = common::two_pods("isvc-pods");
        self
    }
}

/// A router with a picked backend (`resolution: endpoint`, LoadAware) beside plain ones.
fn picked_router() -> Value {
    let mut r = with_gateway(router());
    r["spec"]["backends"].as_array_mut().unwrap().push(json!({
        "name": "pods", "tier": "local", "inferenceServiceRef": {"name": "isvc-pods"},
        "resolution": "endpoint",
        "balancing": {"mode": "LoadAware", "prefixAffinity": {"blockBytes": 256},
                      "sessionAffinity": {"headers": ["x-session-id"]}}
    }));
    r["spec"]["rules"] = json!([
        {"name": "picked", "match": {"models": ["qwen3-*"]}, "route": {"backends": ["pods"]}},
        {"name": "fo", "match": {"models": ["fo"]}, "route": {"backends": ["local-a", "cloud"]}}
    ]);
    r
}

fn picked() -> String {
    picked_docs(picked_router())
}

/// `router` with the objects a picked router references.
fn picked_docs(router: Value) -> String {
    common::docs(&[
        router,
        isvc("isvc-a", Some(8000)),
        isvc("isvc-b", None),
        isvc("isvc-pods", Some(8000)),
        secret(),
    ])
}

fn src(text: &str) -> Vec<Source> {
    vec![Source {
        name: "input.yaml".into(),
        text: text.into(),
    }]
}

fn with_gateway(mut r: Value) -> Value {
    r["spec"]["agentGatewayRef"] = json!({"name": "agw", "namespace": "agentgateway-system"});
    r
}

fn example() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../agentgateway-examples/router.yaml"
    ))
    .unwrap()
}

/// The data-plane router on a Gateway.
fn dataplane() -> String {
    dataplane_docs(with_gateway(dataplane_router()))
}

fn compile(text: &str, o: &AgentgatewayOptions) -> Output {
    compile_agentgateway(&src(text), o).unwrap_or_else(|e| panic!("{e:#?}"))
}

fn errors(text: &str, o: &AgentgatewayOptions) -> Vec<String> {
    match compile_agentgateway(&src(text), o) {
        Ok(_) => panic!("expected a refusal"),
        Err(e) => e.iter().map(|p| p.to_string()).collect(),
    }
}

fn file<'a>(out: &'a Output, name: &str) -> &'a str {
    &out.iter().find(|(n, _)| *n == name).unwrap().1
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).unwrap()
}

fn corpus() -> Vec<(&'static str, String, Option<u64>)> {
    vec![
        ("example", example(), Some(RETRY_REPLAY_LIMIT)),
        ("dataplane", dataplane(), Some(RETRY_REPLAY_LIMIT)),
        (
            "per-backend-timeouts",
            dataplane_docs(with_gateway(reference_example(None))),
            Some(4096),
        ),
        ("picked", picked(), Some(RETRY_REPLAY_LIMIT)),
    ]
}

/// agentgateway v1.3.1's own schema of its standalone config.
fn config_schema() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(crds_dir().join("agentgateway/config-schema-v1.3.1.json"))
            .unwrap(),
    )
    .unwrap();
    jsonschema::options()
        .should_validate_formats(false)
        .build(&schema)
        .unwrap()
}

#[test]
fn standalone_config_matches_agentgateway_v1_3_1_config_schema() {
    let validator = config_schema();
    for (name, text, max) in corpus() {
        let out = compile(&text, &opts(max));
        let cfg = yaml(file(&out, "agentgateway.yaml"));
        let errs: Vec<String> = validator
            .iter_errors(&cfg)
            .map(|e| format!("{name}: {}: {e}", e.instance_path()))
            .collect();
        assert!(errs.is_empty(), "{errs:#?}");
    }
    // The check is not vacuous: a typo and a bad enum value are caught.
    let out = compile(&example(), &opts(Some(RETRY_REPLAY_LIMIT)));
    let mut cfg = yaml(file(&out, "agentgateway.yaml"));
    cfg["binds"][0]["listeners"][0]["policies"]["extProc"]["failuremode"] = json!("failClosed");
    assert!(!validator.is_valid(&cfg));
    let mut cfg = yaml(file(&out, "agentgateway.yaml"));
    cfg["binds"][0]["listeners"][0]["policies"]["extProc"]["failureMode"] = json!("closed");
    assert!(!validator.is_valid(&cfg));
}

/// Core objects have no CRD: they must survive a round trip through the k8s-openapi types
/// (which drop unknown fields) unchanged.
fn check_core(d: &Value) -> Result<(), String> {
    fn round<T: serde::de::DeserializeOwned + serde::Serialize>(
        d: &Value,
    ) -> Result<Value, String> {
        let t: T = serde_json::from_value(d.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(t).map_err(|e| e.to_string())
    }
    let back = match d["kind"].as_str() {
        Some("Deployment") => round::<k8s_openapi::api::apps::v1::Deployment>(d)?,
        Some("Service") => round::<k8s_openapi::api::core::v1::Service>(d)?,
        Some("ConfigMap") => round::<k8s_openapi::api::core::v1::ConfigMap>(d)?,
        k => return Err(format!("unexpected core kind {k:?}")),
    };
    (back == *d)
        .then_some(())
        .ok_or_else(|| format!("{} changes in a round trip: {back}", d["kind"]))
}

#[test]
fn kubernetes_documents_match_their_crds_and_cel_rules() {
    let crds = Crds::load_all();
    let mut report = Report::default();
    let mut kinds = std::collections::BTreeSet::new();
    for (name, text, max) in corpus() {
        let out = compile(&text, &opts(max));
        for d in common::crds::documents(file(&out, "kubernetes.yaml")) {
            kinds.insert(d["kind"].as_str().unwrap().to_string());
            if matches!(d["apiVersion"].as_str(), Some("v1" | "apps/v1")) {
                if let Err(e) = check_core(&d) {
                    report.errors.push(format!("{name}: {e}"));
                }
                continue;
            }
            let before = report.errors.len();
            crds.check(&d, &mut report);
            for e in &mut report.errors[before..] {
                *e = format!("{name}: {e}");
            }
        }
    }
    eprintln!("{}", report.summary());
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert!(report.cel_evaluated > 20, "{}", report.summary());
    for k in [
        "ConfigMap",
        "Deployment",
        "Service",
        "AgentgatewayPolicy",
        "AgentgatewayBackend",
        "HTTPRoute",
        "ReferenceGrant",
    ] {
        assert!(kinds.contains(k), "no {k} in {kinds:?}");
    }
}

#[test]
fn crd_checks_catch_mistakes_in_agentgateway_objects() {
    let crds = Crds::load_all();
    let out = compile(&example(), &opts(Some(RETRY_REPLAY_LIMIT)));
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let check = |d: &Value| {
        let mut r = Report::default();
        crds.check(d, &mut r);
        r.errors
    };
    let policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "AgentgatewayPolicy" && d["spec"]["traffic"]["phase"] == "PreRouting"
        })
        .unwrap()
        .clone();
    assert!(check(&policy).is_empty());
    let mut typo = policy.clone();
    typo["spec"]["traffic"]["extProc"]["failuremode"] = json!("FailClosed");
    assert!(
        check(&typo).iter().any(|e| e.contains("unknown field")),
        "{:?}",
        check(&typo)
    );
    // PreRouting forbids retries (a CEL rule).
    let mut retry = policy.clone();
    retry["spec"]["traffic"]["retry"] = json!({"attempts": 1});
    assert!(
        check(&retry).iter().any(|e| e.contains("CEL rule")),
        "{:?}",
        check(&retry)
    );
}

fn listener(cfg: &Value) -> &Value {
    &cfg["binds"][0]["listeners"][0]
}

#[test]
fn ext_proc_runs_before_routing_and_fails_closed() {
    let o = AgentgatewayOptions {
        ext_proc: ("10.0.0.7".into(), 19000),
        listen: "127.0.0.1:14001".parse().unwrap(),
        ..opts(Some(RETRY_REPLAY_LIMIT))
    };
    let out = compile(&example(), &o);
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    assert_eq!(cfg["binds"][0]["port"], 14001);
    // Listener-level (gateway) policy: it runs before route selection; no route has its own.
    let ep = &listener(&cfg)["policies"]["extProc"];
    assert_eq!(ep["host"], "10.0.0.7:19000");
    assert_eq!(ep["failureMode"], "failClosed");
    assert_eq!(ep["processingOptions"]["requestBodyMode"], "buffered");
    for r in listener(&cfg)["routes"].as_array().unwrap() {
        assert!(r["policies"].get("extProc").is_none(), "{r}");
    }
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let pre: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d["kind"] == "AgentgatewayPolicy" && d["spec"]["traffic"].get("extProc").is_some()
        })
        .collect();
    assert_eq!(pre.len(), 1);
    assert_eq!(pre[0]["spec"]["traffic"]["phase"], "PreRouting");
    assert_eq!(
        pre[0]["spec"]["traffic"]["extProc"]["failureMode"],
        "FailClosed"
    );
    assert_eq!(pre[0]["spec"]["targetRefs"][0]["kind"], "Gateway");
    assert_eq!(pre[0]["metadata"]["namespace"], "agentgateway-system");
}

/// Every route key the filter can stamp gets one route with its attempt order as priority
/// groups, a sensitive order never holds a cloud provider, and anything else is a 404.
#[test]
fn one_route_per_route_key_in_attempt_order() {
    let text = dataplane();
    let out = compile(&text, &opts(Some(RETRY_REPLAY_LIMIT)));
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    let routes = listener(&cfg)["routes"].as_array().unwrap().clone();
    let (last, keyed) = routes.split_last().unwrap();
    assert_eq!(last["policies"]["directResponse"]["status"], 404);
    assert!(last["matches"][0].get("headers").is_none());
    let envoy = common::envoy::compile(with_gateway(dataplane_router()));
    let pc = common::envoy::plugin_of(&envoy);
    let router = router_core::router::Router::new(pc.clone()).unwrap();
    let plans = llmkube_gen::ir::route_plans(&router, 300_000);
    assert_eq!(keyed.len(), plans.len());
    // The local server's no-backend listener: the `--ext-proc` port plus two.
    let server = yaml(file(&out, "ext-proc.yaml"));
    assert_eq!(server["no_backend_listen"], "127.0.0.1:50053");
    for (r, p) in keyed.iter().zip(&plans) {
        assert_eq!(r["matches"][0]["headers"][0]["name"], "x-llmkube-route");
        assert_eq!(
            r["matches"][0]["headers"][0]["value"]["exact"],
            p.key.as_str()
        );
        let groups = r["backends"][0]["ai"]["groups"].as_array().unwrap();
        let mut names: Vec<&str> = groups
            .iter()
            .map(|g| {
                assert_eq!(g["providers"].as_array().unwrap().len(), 1);
                g["providers"][0]["name"].as_str().unwrap()
            })
            .collect();
        // The last group: the no-backend listener, never evicted, after the whole order.
        assert_eq!(names.pop(), Some(NO_BACKEND_PROVIDER), "{}", p.key);
        let sink = &groups.last().unwrap()["providers"][0];
        assert_eq!(sink["hostOverride"], server["no_backend_listen"]);
        assert!(sink.get("policies").is_none(), "{sink}");
        let expected: Vec<&str> = p
            .order
            .iter()
            .map(|&b| router.backend(b).name.as_str())
            .collect();
        assert_eq!(names, expected, "{}", p.key);
        // One retry per backend of the order: the last one reaches the no-backend group.
        let retry = &r["policies"]["retry"];
        assert_eq!(retry["attempts"], p.order.len() as u64, "{}", p.key);
        assert_eq!(retry["backoff"], "25ms");
        if p.rule.as_deref() == Some("pii") {
            assert!(names.iter().all(|n| n.starts_with("local-")), "{names:?}");
        }
    }
    // The external providers carry their model; the local ones keep the request's.
    let cloud = keyed
        .iter()
        .flat_map(|r| r["backends"][0]["ai"]["groups"].as_array().unwrap().iter())
        .map(|g| &g["providers"][0])
        .find(|p| p["name"] == "claude")
        .unwrap();
    assert_eq!(cloud["provider"]["anthropic"]["model"], "claude-opus-4");
    assert_eq!(cloud["hostOverride"], "api.anthropic.com:443");
    assert_eq!(cloud["policies"]["backendTLS"], json!({}));
    assert_eq!(cloud["policies"]["health"]["eviction"]["duration"], "20s");
}

/// The per-attempt timeout of each priority group's provider.
fn group_timeouts(groups: &Value) -> Vec<&str> {
    groups
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["providers"][0]["name"] != NO_BACKEND_PROVIDER)
        .map(|g| {
            g["providers"][0]["policies"]["http"]["requestTimeout"]
                .as_str()
                .unwrap()
        })
        .collect()
}

#[test]
fn per_attempt_timeouts_are_per_provider() {
    let text = dataplane_docs(with_gateway(reference_example(None)));
    let out = compile(&text, &opts(Some(4096)));
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    let route = listener(&cfg)["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["backends"][0]["ai"]["groups"]
                .as_array()
                .is_some_and(|g| g.len() == 3)
        })
        .unwrap();
    assert_eq!(
        group_timeouts(&route["backends"][0]["ai"]["groups"]),
        ["10s", "1m"]
    );
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let b = docs
        .iter()
        .find(|d| {
            d["kind"] == "AgentgatewayBackend"
                && d["spec"]["ai"]["groups"].as_array().unwrap().len() == 3
        })
        .unwrap();
    assert_eq!(group_timeouts(&b["spec"]["ai"]["groups"]), ["10s", "1m"]);
    // Last: the routing server's no-backend listener, a port of its Service.
    let sink = &b["spec"]["ai"]["groups"][2]["providers"][0];
    assert_eq!(sink["name"], NO_BACKEND_PROVIDER);
    assert!(sink.get("policies").is_none(), "{sink}");
    let service = docs
        .iter()
        .find(|d| {
            d["kind"] == "Service"
                && sink["host"]
                    .as_str()
                    .unwrap()
                    .starts_with(d["metadata"]["name"].as_str().unwrap())
        })
        .unwrap();
    assert!(service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["port"] == sink["port"]));
}

#[test]
fn ext_proc_config_pins_the_built_module() {
    let dir = std::env::temp_dir().join(format!("agw-wasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wasm = b"\0asm\x01\0\0\0 pretend module";
    std::fs::write(dir.join("llmkube_model_router.wasm"), wasm).unwrap();
    let o = AgentgatewayOptions {
        wasm_dir: dir.clone(),
        wasm_sha256: None,
        ..opts(Some(RETRY_REPLAY_LIMIT))
    };
    let out = compile(&example(), &o);
    let cfg = yaml(file(&out, "ext-proc.yaml"));
    use sha2::Digest;
    let sha: String = sha2::Sha256::digest(wasm)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(cfg["module"]["sha256"], sha.as_str());
    assert_eq!(
        cfg["module"]["path"],
        dir.join("llmkube_model_router.wasm")
            .to_string_lossy()
            .as_ref()
    );
    assert_eq!(cfg["root_id"], "model-router");
    // The plugin config is the envoy target's (same router, same options).
    let envoy = common::envoy::compile_text(example());
    let envoy: Value = serde_json::from_str(&envoy).unwrap();
    let mut theirs = common::envoy::plugin_of(&envoy);
    let ours: router_core::config::PluginConfig =
        serde_json::from_value(cfg["plugin_config"].clone()).unwrap();
    theirs.max_body_bytes = ours.max_body_bytes;
    assert_eq!(ours, theirs);
    // The in-cluster copy pins the same digest at the image's path.
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let in_cluster = yaml(cm["data"]["ext-proc.yaml"].as_str().unwrap());
    assert_eq!(in_cluster["module"]["sha256"], sha.as_str());
    assert_eq!(
        in_cluster["module"]["path"],
        "/opt/llmkube/wasm/llmkube_model_router.wasm"
    );
    // A missing module is an actionable error.
    let o = AgentgatewayOptions {
        wasm_dir: dir.join("nope"),
        wasm_sha256: None,
        ..opts(Some(RETRY_REPLAY_LIMIT))
    };
    let e = errors(&example(), &o);
    assert!(
        e.iter()
            .any(|e| e.starts_with("options: --wasm-sha256: cannot read")),
        "{e:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn deterministic_output() {
    for (_, text, max) in corpus() {
        assert_eq!(compile(&text, &opts(max)), compile(&text, &opts(max)));
    }
}

#[test]
fn secrets_are_referenced_in_manifests_never_inlined() {
    let out = compile(&dataplane(), &opts(Some(RETRY_REPLAY_LIMIT)));
    for f in ["kubernetes.yaml", "ext-proc.yaml"] {
        for key in [OPENAI_KEY, ANTHROPIC_KEY] {
            assert!(!file(&out, f).contains(key), "{f} holds a secret value");
        }
    }
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let refs: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "AgentgatewayBackend")
        .flat_map(|d| d["spec"]["ai"]["groups"].as_array().unwrap().clone())
        .map(|g| g["providers"][0]["policies"]["auth"].clone())
        .filter(|a| !a.is_null())
        .collect();
    assert!(
        refs.contains(&json!({"secretRef": {"name": "openai", "key": "OPENAI_API_KEY"}})),
        "{refs:?}"
    );
    // The standalone file follows the envoy target for local runs: the key, without "Bearer ".
    let cfg = file(&out, "agentgateway.yaml");
    assert!(cfg.contains(&format!("value: {OPENAI_KEY}")), "{cfg}");
    assert!(!cfg.contains("Bearer"));
    // Without the Secret in the input, the standalone file reads the key from a file.
    let mut r = with_gateway(router());
    r["spec"]["rules"] =
        json!([{"name": "r0", "match": {"models": ["gpt-*"]}, "route": {"backends": ["cloud"]}}]);
    let text = docs_of(r);
    let out = compile(&text, &opts(None));
    assert!(file(&out, "agentgateway.yaml").contains("file: /var/run/secrets/llmkube/llm/openai/"));
}

fn docs_of(r: Value) -> String {
    common::docs(&[r, isvc("isvc-a", Some(8000)), isvc("isvc-b", None)])
}

#[test]
fn refusals_name_the_field_and_the_reason() {
    // Failover with a body limit above what agentgateway replays.
    let e = errors(&dataplane(), &opts(None));
    assert!(
        e.iter().any(|e| e.starts_with(
            "ModelRouter/dp: spec.rules[0].route.backends: failover needs the request replayed"
        )),
        "{e:?}"
    );
    // No Gateway to attach to.
    let e = errors(&dataplane_docs(dataplane_router()), &opts(Some(4096)));
    assert!(
        e.iter()
            .any(|e| e.starts_with("ModelRouter/dp: spec.agentGatewayRef: is required")),
        "{e:?}"
    );
    // A pod set without LoadAware: agentgateway has nothing to spread it.
    let mut r = picked_router();
    r["spec"]["backends"][3]["balancing"] = json!({"mode": "RoundRobin"});
    let e = errors(&picked_docs(r), &opts(Some(4096)));
    assert!(
        e.iter().any(|e| e.starts_with(
            "ModelRouter/demo: spec.backends[3].balancing.mode: \"pods\" has resolution: endpoint without balancing.mode LoadAware"
        )),
        "{e:?}"
    );
    // Failover across a picked backend.
    let mut r = picked_router();
    r["spec"]["rules"][0]["route"]["backends"] = json!(["pods", "cloud"]);
    let e = errors(&picked_docs(r), &opts(Some(4096)));
    assert!(
        e.iter().any(|e| e.starts_with(
            "ModelRouter/demo: spec.rules[0].route.backends: failover across \"pods\", whose pods are picked"
        )),
        "{e:?}"
    );
    // Signing providers.
    let mut r = with_gateway(router());
    r["spec"]["backends"][2]["external"] = json!({"provider": "bedrock", "model": "m", "url": "https://bedrock-runtime.us-east-1.amazonaws.com"});
    let e = errors(&full(r), &opts(Some(4096)));
    assert!(
        e.iter()
            .any(|e| e.contains("spec.backends[2].external.provider: bedrock is not served")),
        "{e:?}"
    );
}

/// `--failover-within-replay-limit`: the refusal above becomes an explicit trade. The routes,
/// priority groups and retries are those of a router whose bodies all fit the replay limit;
/// the body limit stays the default, and the filter is told the replay limit, so it counts and
/// audits each larger request (served by its first backend only) as `failover_skipped`. The
/// routes are the same either way, so only the plugin config differs.
#[test]
fn failover_within_the_replay_limit_is_an_explicit_trade() {
    use llmkube_gen::targets::agentgateway::Failover;
    let within = AgentgatewayOptions {
        failover: Failover::WithinReplayLimit,
        ..opts(None)
    };
    let out = compile(&dataplane(), &within);
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    let errs: Vec<String> = config_schema()
        .iter_errors(&cfg)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errs.is_empty(), "{errs:#?}");
    let replayable = compile(&dataplane(), &opts(Some(RETRY_REPLAY_LIMIT)));
    assert_eq!(
        file(&out, "agentgateway.yaml"),
        file(&replayable, "agentgateway.yaml")
    );
    assert!(file(&out, "agentgateway.yaml").contains("retry:"));
    let plugin = |out: &Output| yaml(file(out, "ext-proc.yaml"))["plugin_config"].clone();
    assert_eq!(plugin(&out)["failover_replay_limit"], RETRY_REPLAY_LIMIT);
    assert_eq!(plugin(&out)["max_body_bytes"], 8 * 1024 * 1024);
    assert!(plugin(&replayable).get("failover_replay_limit").is_none());
    // The in-cluster server reads the same plugin config.
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let in_cluster = yaml(cm["data"]["ext-proc.yaml"].as_str().unwrap());
    assert_eq!(in_cluster["plugin_config"], plugin(&out));
    // The filter accepts it.
    let _: router_core::config::PluginConfig = serde_json::from_value(plugin(&out)).unwrap();
    // Bodies within the replay limit anyway: nothing to trade, nothing told.
    let small = compile(
        &dataplane(),
        &AgentgatewayOptions {
            failover: Failover::WithinReplayLimit,
            ..opts(Some(RETRY_REPLAY_LIMIT))
        },
    );
    assert!(plugin(&small).get("failover_replay_limit").is_none());
    // Without the flag the same router is refused, naming the flag.
    let e = errors(&dataplane(), &opts(None));
    assert!(
        e.iter()
            .any(|e| e.contains("or --failover-within-replay-limit")),
        "{e:?}"
    );
}

/// Shadow rules: agentgateway's mirrors drop the body, so the filter in `llmkube-ext-proc`
/// sends the copies: the plugin config names a callout cluster per local mirror, which
/// `ext-proc.yaml` declares at the backend's address; a copy to a cloud mirror is warned and
/// not sent, and agentgateway's own config mirrors nothing.
#[test]
fn shadow_copies_are_sent_by_the_filter_to_local_mirrors_only() {
    let mut diags = llmkube_gen::Diagnostics::default();
    let out = llmkube_gen::targets::agentgateway::compile_agentgateway_diag(
        &src(&dataplane()),
        &opts(Some(RETRY_REPLAY_LIMIT)),
        &mut diags,
    )
    .unwrap_or_else(|| panic!("{:#?}", diags.errors));
    let warned: Vec<String> = diags.warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        warned.iter().any(|w| w.starts_with(
            "ModelRouter/dp: spec.rules[3].route.strategy: shadow copies to cloud are not sent by the agentgateway target"
        )),
        "{warned:?}"
    );
    let server = yaml(file(&out, "ext-proc.yaml"));
    let plugin: router_core::config::PluginConfig =
        serde_json::from_value(server["plugin_config"].clone()).unwrap();
    let shadow = plugin.shadow.clone().expect("a shadow section");
    assert_eq!(shadow.max_in_flight, 4, "Envoy's shadow clusters' bound");
    let targets: Vec<(&str, &str)> = shadow
        .targets
        .iter()
        .map(|t| (t.backend.as_str(), t.cluster.as_str()))
        .collect();
    assert_eq!(targets, vec![("local-b", "llmkube-shadow-local-b")]);
    let t = &shadow.targets[0];
    assert_eq!(
        server["clusters"][&t.cluster]["address"].as_str(),
        Some(t.authority.as_str())
    );
    assert!(t.authority.starts_with("isvc-b."), "{}", t.authority);
    // The filter takes it as written (every target a known local backend).
    let router = router_core::router::Router::new(plugin).unwrap();
    assert!(router_core::shadow::Shadow::new(&router).unwrap().is_some());
    // The in-cluster server gets the same, and agentgateway mirrors nothing itself.
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let in_cluster = yaml(cm["data"]["ext-proc.yaml"].as_str().unwrap());
    assert_eq!(
        in_cluster["plugin_config"]["shadow"],
        server["plugin_config"]["shadow"]
    );
    assert_eq!(in_cluster["clusters"], server["clusters"]);
    for f in ["agentgateway.yaml", "kubernetes.yaml"] {
        assert!(!file(&out, f).contains("requestMirror"), "{f}");
    }
    // A router without shadow rules has neither.
    let out = compile(&example(), &opts(Some(RETRY_REPLAY_LIMIT)));
    let server = yaml(file(&out, "ext-proc.yaml"));
    assert!(server["plugin_config"].get("shadow").is_none());
}

#[test]
fn agentgateway_target_matches_its_golden_files() {
    let mut failures = Vec::new();
    for (name, text, max) in corpus() {
        let out = compile(&text, &opts(max));
        for (f, t) in &out {
            if let Err(e) = common::golden::check(&format!("agentgateway-{name}"), f, t) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The agentgateway binary the `real_agentgateway_*` tests run; they are `#[ignore]`d, so
/// reaching this without one is a mistake to report, not a pass.
fn agentgateway_bin() -> std::ffi::OsString {
    std::env::var_os("AGENTGATEWAY_BIN").unwrap_or_else(|| {
        panic!("AGENTGATEWAY_BIN is not set: this test needs an agentgateway v1.3.x binary (docs/agentgateway.md, \"Getting an agentgateway binary\")")
    })
}

/// With a real agentgateway (`AGENTGATEWAY_BIN`), the generated config passes `--validate-only`.
/// Ignored (reported as such, never as passed) unless run with `--include-ignored`, which
/// `.ci/run` passes when `AGENTGATEWAY_BIN` is set; run that way without it, it fails.
#[test]
#[ignore = "needs AGENTGATEWAY_BIN (an agentgateway v1.3.x binary): run with --include-ignored"]
fn real_agentgateway_accepts_the_config() {
    let bin = agentgateway_bin();
    let dir = std::env::temp_dir().join(format!("agw-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, max) in corpus() {
        let out = compile(&text, &opts(max));
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, file(&out, "agentgateway.yaml")).unwrap();
        let o = std::process::Command::new(&bin)
            .arg("-f")
            .arg(&path)
            .arg("--validate-only")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn auth_is_refused_with_the_reason() {
    let mut r = with_gateway(router());
    r["spec"]["policy"] = json!({"auth": {"jwt": {"issuer": "https://idp/", "jwksURI": "https://idp/certs", "provider": "kc", "teamClaim": "team"}}});
    let e = errors(&full(r), &opts(None));
    assert!(
        e.iter().any(|l| l.starts_with(
            "ModelRouter/demo: spec.policy.auth: is not enforced by the agentgateway target: "
        ) && l.contains("extProc")),
        "{e:?}"
    );
}

/// Budgets settle from the response body, which agentgateway streams to ext_proc only in
/// `fullDuplexStreamed` mode: with budgets the generated policy asks for it (standalone and
/// in-cluster, both valid against their schemas), and without them too (usage is read from
/// every response); and
/// `--budgets-service` becomes the `llmkube-budgets` cluster of the server's config, named by
/// the plugin config's budget service.
#[test]
fn budgets_stream_the_response_body_full_duplex_and_reach_the_budgets_service() {
    let mut r = with_gateway(router());
    r["spec"]["policy"] = json!({"budgets": [{"name": "all", "scope": "router", "maxTokens": 1000, "windowSeconds": 60}]});
    let text = full(r);
    let validator = config_schema();
    let crds = Crds::load_all();

    let o = AgentgatewayOptions {
        budgets_service: Some(("budgets.llm.svc".into(), 9090)),
        ..opts(None)
    };
    let out = compile(&text, &o);
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    let modes = &listener(&cfg)["policies"]["extProc"]["processingOptions"];
    assert_eq!(modes["responseBodyMode"], "fullDuplexStreamed");
    assert_eq!(modes["requestBodyMode"], "buffered");
    let errs: Vec<String> = validator
        .iter_errors(&cfg)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errs.is_empty(), "{errs:#?}");

    let server = yaml(file(&out, "ext-proc.yaml"));
    assert_eq!(
        server["clusters"],
        json!({"llmkube-budgets": {"address": "budgets.llm.svc:9090"}})
    );
    assert_eq!(
        server["plugin_config"]["budgets"]["service"]["cluster"],
        "llmkube-budgets"
    );
    let mut report = Report::default();
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    for d in &docs {
        if d["kind"] == "AgentgatewayPolicy" {
            crds.check(d, &mut report);
        }
    }
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    let policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "AgentgatewayPolicy" && d["spec"]["traffic"].get("extProc").is_some()
        })
        .unwrap();
    assert_eq!(
        policy["spec"]["traffic"]["extProc"]["processingOptions"]["responseBodyMode"],
        "FullDuplexStreamed"
    );
    let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
    let in_cluster = yaml(cm["data"]["ext-proc.yaml"].as_str().unwrap());
    assert_eq!(in_cluster["clusters"], server["clusters"]);

    // Embedded ledgers: no cluster, no service; the body is still streamed.
    let out = compile(&text, &opts(None));
    let server = yaml(file(&out, "ext-proc.yaml"));
    assert!(server.get("clusters").is_none(), "{server}");
    assert!(server["plugin_config"]["budgets"].get("service").is_none());
    // No budgets: the body is streamed all the same (the filter reads every response's usage
    // and strips the usage chunk it asked a stream for).
    let out = compile(&example(), &opts(Some(RETRY_REPLAY_LIMIT)));
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    assert_eq!(
        listener(&cfg)["policies"]["extProc"]["processingOptions"]["responseBodyMode"],
        "fullDuplexStreamed"
    );
}

#[test]
fn a_picked_backend_is_a_service_whose_pod_the_endpoint_picker_names() {
    let out = compile(&picked(), &opts(Some(RETRY_REPLAY_LIMIT)));
    let cfg = yaml(file(&out, "agentgateway.yaml"));
    // The logical Service agentgateway requires for a service backend, without endpoints.
    assert_eq!(
        cfg["services"],
        json!([{"name": "isvc-pods", "namespace": "llm",
                "hostname": "isvc-pods.llm.svc.cluster.local", "vips": [], "ports": {"8000": 8000}}])
    );
    let routes = listener(&cfg)["routes"].as_array().unwrap();
    let picked: Vec<&Value> = routes
        .iter()
        .filter(|r| r["backends"][0].get("service").is_some())
        .collect();
    assert_eq!(picked.len(), 1, "{routes:#?}");
    let b = &picked[0]["backends"][0];
    assert_eq!(
        b["service"],
        json!({"name": "llm/isvc-pods.llm.svc.cluster.local", "port": 8000})
    );
    // The picker listens on the --ext-proc port plus one; passthrough: it names only the pods
    // its plugin config lists.
    assert_eq!(
        b["policies"]["inferenceRouting"],
        json!({"endpointPicker": {"host": "127.0.0.1:50052"}, "destinationMode": "passthrough"})
    );
    assert!(picked[0]["policies"].get("retry").is_none());
    // Every other route keeps its AI backend.
    assert!(routes
        .iter()
        .filter(|r| r["name"] != "no-route" && r["backends"][0].get("service").is_none())
        .all(|r| r["backends"][0].get("ai").is_some()));

    // The picker's config: the gateway-level server's, in endpoint-picker mode, with the pods
    // (only the picker picks; the gateway-level pass routes).
    let server = yaml(file(&out, "ext-proc.yaml"));
    let mut picker = yaml(file(&out, "endpoint-picker.yaml"));
    assert_eq!(picker["endpoint_picker"], json!({}));
    let pick = picker["plugin_config"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "pods")
        .unwrap()["pick"]
        .clone();
    assert_eq!(pick["endpoints"], json!(["10.0.0.1:8000", "10.0.0.2:8000"]));
    assert!(pick.get("scrape_cluster").is_none(), "{pick}");
    assert!(!server["plugin_config"].to_string().contains("10.0.0.2"));
    let obj = picker.as_object_mut().unwrap();
    obj.remove("endpoint_picker");
    obj.remove("plugin_config");
    let mut rest = server.clone();
    rest.as_object_mut().unwrap().remove("plugin_config");
    // Only the routing server answers the routes' no-backend group.
    assert!(rest
        .as_object_mut()
        .unwrap()
        .remove("no_backend_listen")
        .is_some());
    assert_eq!(picker, rest);

    // Kubernetes: an InferencePool of the pods, its picker the llmkube-epp Service.
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let pool = docs.iter().find(|d| d["kind"] == "InferencePool").unwrap();
    assert_eq!(
        pool["spec"],
        json!({"selector": {"matchLabels": {"inference.llmkube.dev/service": "isvc-pods"}},
               "targetPorts": [{"number": 8000}],
               "endpointPickerRef": {"name": "llmkube-epp-demo", "port": {"number": 50051},
                                     "failureMode": "FailClose"}})
    );
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "llmkube-epp-demo")
        .unwrap();
    assert!(cm["data"]["ext-proc.yaml"]
        .as_str()
        .unwrap()
        .contains("endpoint_picker"));
    assert!(docs
        .iter()
        .any(|d| d["kind"] == "Service" && d["metadata"]["name"] == "llmkube-epp-demo"));
    let refs: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "HTTPRoute")
        .flat_map(|d| d["spec"]["rules"].as_array().unwrap())
        .map(|r| &r["backendRefs"][0])
        .collect();
    assert!(
        refs.contains(&&json!({"group": "inference.networking.k8s.io",
        "kind": "InferencePool", "name": "llmkube-demo-pods"}))
    );
    // No AgentgatewayBackend for the picked route key.
    let backends = docs
        .iter()
        .filter(|d| d["kind"] == "AgentgatewayBackend")
        .count();
    assert_eq!(backends + 1, refs.len());
}

/// With budgets and a picked backend, the gateway-level server holds and settles the budgets and
/// the endpoint picker only picks: a picker running the budget step too would charge every picked
/// request twice.
#[test]
fn the_endpoint_picker_charges_no_budget() {
    let mut r = picked_router();
    r["spec"]["policy"] = json!({"budgets": [{"name": "all", "scope": "router", "maxTokens": 1000, "windowSeconds": 60}]});
    let out = compile(&picked_docs(r), &opts(Some(RETRY_REPLAY_LIMIT)));
    let server = yaml(file(&out, "ext-proc.yaml"));
    assert!(server["plugin_config"]["budgets"].is_object(), "{server}");
    let picker = yaml(file(&out, "endpoint-picker.yaml"));
    assert!(picker["plugin_config"]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b.get("pick").is_some()));
    assert!(picker["plugin_config"].get("budgets").is_none(), "{picker}");
    let docs = common::crds::documents(file(&out, "kubernetes.yaml"));
    let picker_cm = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.contains("epp"))
        })
        .unwrap();
    let in_cluster = yaml(picker_cm["data"]["ext-proc.yaml"].as_str().unwrap());
    assert!(in_cluster["plugin_config"].get("budgets").is_none());
}
