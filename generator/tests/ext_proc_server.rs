//! How `compile --target agentgateway` runs `llmkube-ext-proc`: the Deployment's gRPC health
//! probes, its resources sized from the server's memory budget, the grace period matching the
//! server's drain deadline, and agentgateway's deadline on its calls to the server (standalone
//! and Kubernetes). The documents themselves are checked against agentgateway's config schema
//! and CRDs in `agentgateway.rs`.

mod common;
use common::*;
use llmkube_gen::targets::agentgateway::{compile_agentgateway, AgentgatewayOptions};
use llmkube_gen::{CompileOptions, Source};
use serde_json::{json, Value};

fn compile(max_body: u64) -> Vec<(&'static str, String)> {
    let mut r = router();
    r["spec"]["agentGatewayRef"] = json!({"name": "agw", "namespace": "agentgateway-system"});
    let text = docs(&[
        r,
        isvc("isvc-a", Some(8000)),
        isvc("isvc-b", None),
        secret(),
    ]);
    let o = AgentgatewayOptions {
        common: CompileOptions {
            max_body_bytes: Some(max_body),
            ..Default::default()
        },
        wasm_dir: "/opt/llmkube/wasm".into(),
        wasm_sha256: Some("0".repeat(64)),
        ..Default::default()
    };
    compile_agentgateway(
        &[Source {
            name: "input.yaml".into(),
            text,
        }],
        &o,
    )
    .unwrap_or_else(|e| panic!("{e:#?}"))
}

fn file(out: &[(&'static str, String)], name: &str) -> Value {
    let text = &out.iter().find(|(n, _)| *n == name).unwrap().1;
    serde_norway::from_str(text).unwrap()
}

fn documents(out: &[(&'static str, String)]) -> Vec<Value> {
    let text = &out.iter().find(|(n, _)| *n == "kubernetes.yaml").unwrap().1;
    common::crds::documents(text)
}

fn mib(quantity: &Value) -> u64 {
    quantity
        .as_str()
        .and_then(|q| q.strip_suffix("Mi"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a Mi quantity: {quantity}"))
}

#[test]
fn the_deployment_is_probed_over_grpc_health_and_sized_from_the_memory_budget() {
    for max_body in [65_536u64, 8 << 20, 64 << 20] {
        let out = compile(max_body);
        let server = file(&out, "ext-proc.yaml");
        let budget = server["memory_budget_bytes"].as_u64().unwrap();
        let drain_ms = server["drain_timeout_ms"].as_u64().unwrap();
        assert!(
            budget > max_body,
            "the budget holds at least one largest body"
        );
        let docs = documents(&out);
        let dep = docs
            .iter()
            .find(|d| d["kind"] == "Deployment")
            .expect("a Deployment");
        let pod = &dep["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(c[probe]["grpc"]["port"], 50051, "{probe}: {c}");
            assert!(c[probe].get("tcpSocket").is_none());
        }
        let limit = mib(&c["resources"]["limits"]["memory"]);
        assert_eq!(
            limit,
            (2 * budget + (256 << 20)).div_ceil(1 << 20),
            "twice the budget and room for the instances"
        );
        assert_eq!(mib(&c["resources"]["requests"]["memory"]), limit);
        assert!(c["resources"]["limits"].get("cpu").is_none());
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(
            grace * 1000 > drain_ms,
            "the kubelet waits out the drain: {grace} s vs {drain_ms} ms"
        );
    }
}

#[test]
fn agentgateway_bounds_its_calls_to_the_server() {
    let out = compile(65_536);
    let cfg = file(&out, "agentgateway.yaml");
    let ep = &cfg["binds"][0]["listeners"][0]["policies"]["extProc"];
    assert_eq!(ep["policies"]["http"]["requestTimeout"], "5s", "{ep}");
    let docs = documents(&out);
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("the server's Service");
    let timeout = docs
        .iter()
        .find(|d| {
            d["kind"] == "AgentgatewayPolicy"
                && d["spec"]["targetRefs"][0]["kind"] == "Service"
                && d["spec"]["targetRefs"][0]["name"] == service["metadata"]["name"]
        })
        .expect("a backend policy on the server's Service");
    assert_eq!(timeout["spec"]["backend"]["http"]["requestTimeout"], "5s");
}
