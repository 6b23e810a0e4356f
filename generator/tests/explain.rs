//! `llmkube-gen explain`: the decision, the reasons, the `--json` contract, exit codes.

use llmkube_gen::cli::run;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};

const ROUTER: &str = r#"
apiVersion: inference.llmkube.dev/v1alpha1
kind: ModelRouter
metadata:
  name: demo
  namespace: llm
spec:
  defaultRouteStrategy: BackendNameMatch
  defaultRoute: small
  backends:
    - name: small
      inferenceServiceRef: {name: small}
      resolution: endpoint
      balancing:
        mode: LoadAware
        prefixAffinity: {}
        sessionAffinity: {headers: [x-session-id]}
    - name: big
      displayName: big-model
      inferenceServiceRef: {name: big}
    - name: gpt
      tier: cloud
      external: {provider: openai, model: gpt-5}
  rules:
    - name: regulated
      failClosed: true
      match: {dataClassification: [pii]}
      route: {backends: [big]}
    - name: cloud
      match: {models: ["gpt-*"]}
      route: {backends: [gpt]}
    - name: team-a
      match: {headers: {x-team: a}}
      route: {backends: [gpt, big, small]}
    - name: hard
      match: {taskComplexity: complex}
      route: {backends: [big]}
  policy:
    classification:
      sensitiveClassifications: [pii, secret]
    budgets:
      - {name: all, scope: router, maxTokens: 1000000, windowSeconds: 86400}
      - {name: team-a-rule, scope: rule, ruleName: team-a, maxUSD: "5"}
      - {name: cloud-rule, scope: rule, ruleName: cloud, maxUSD: "9"}
      - {name: per-team, scope: team, maxTokens: 5000}
"#;

struct Out {
    code: i32,
    out: String,
    err: String,
}

fn explain_with(manifest: &str, body: &str, extra: &[&str]) -> Out {
    let dir = std::env::temp_dir().join(format!("llmkube-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let file = dir.join(format!("r-{}.yaml", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&file, manifest).unwrap();
    let mut args: Vec<String> = ["explain", "-f", file.to_str().unwrap(), "--body", "-"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&args, &mut body.as_bytes(), &mut out, &mut err);
    Out {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

fn json_of(body: &str, extra: &[&str]) -> Value {
    let mut args = extra.to_vec();
    args.push("--json");
    let o = explain_with(ROUTER, body, &args);
    assert_eq!(o.code, 0, "{}", o.err);
    serde_json::from_str(&o.out).unwrap()
}

fn contract(v: &Value) -> Value {
    json!({"status": v["status"], "backend": v["backend"], "rule": v["rule"], "order": v["order"],
           "code": v["error"]["error"]["code"]})
}

#[test]
fn a_rule_match_gives_backend_order_route_key_and_stamps() {
    let v = json_of(r#"{"model":"x"}"#, &["--header", "X-Team=a"]);
    assert_eq!(
        contract(&v),
        json!({"status": 200, "backend": "gpt", "rule": "team-a",
               "order": ["gpt", "big", "small"], "code": null})
    );
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["route_key"], "team-a/gpt,big,small");
    assert_eq!(
        v["stamps"][2],
        json!(["x-llmkube-route", "team-a/gpt,big,small"])
    );
    let verdicts: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["no-match", "no-match", "matched", "not-reached"]);
    assert_eq!(
        v["rules"][1]["why"],
        r#"the model matches none of ["gpt-*"]"#
    );
    assert!(v["rules"][0]["why"]
        .as_str()
        .unwrap()
        .contains("x-llmkube-classification"));
}

#[test]
fn each_unmatched_rule_says_which_condition_failed() {
    let v = json_of(
        r#"{"model":"x"}"#,
        &[
            "--header",
            "x-team=b",
            "--header",
            "x-llmkube-task-complexity=simple",
        ],
    );
    let why: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["why"].as_str().unwrap())
        .collect();
    assert_eq!(
        why[2..],
        [
            r#"header x-team is not exactly "a""#,
            r#"x-llmkube-task-complexity is not "complex""#
        ]
    );
    // No rule: the default route (x names no backend).
    assert_eq!(v["backend"], "small");
    assert_eq!(v["fallback"], "defaultRoute: small");
    assert_eq!(v["route_key"], "~/small");
}

#[test]
fn sensitive_requests_keep_only_local_backends_or_get_503() {
    let v = json_of(
        r#"{"model":"x"}"#,
        &[
            "--header",
            "x-team=a",
            "--header",
            "x-llmkube-classification=public, SECRET",
        ],
    );
    assert_eq!(v["order"], json!(["big", "small"]));
    assert_eq!(v["sensitive"], true);
    assert_eq!(v["classifications"], json!(["public", "secret"]));
    assert!(v["stamps"]
        .as_array()
        .unwrap()
        .contains(&json!(["x-llmkube-sensitive", "true"])));
    // A route with only a cloud backend: refused, never sent out.
    let v = json_of(
        r#"{"model":"gpt-5"}"#,
        &["--header", "x-llmkube-classification=secret"],
    );
    assert_eq!(
        contract(&v),
        json!({"status": 503, "backend": null, "rule": null, "order": [], "code": "fail_closed"})
    );
    assert_eq!(v["rules"][1]["verdict"], "matched");
    assert!(v["rules"][1]["why"]
        .as_str()
        .unwrap()
        .contains("none of its backends"));
    // A fail-closed rule's match is reported.
    let v = json_of(
        r#"{"model":"x"}"#,
        &["--header", "x-llmkube-classification=pii"],
    );
    assert_eq!(
        (&v["rule"], v["fail_closed"].as_bool()),
        (&json!("regulated"), Some(true))
    );
}

#[test]
fn client_decision_headers_are_ignored_as_the_gateway_removes_them() {
    let v = json_of(
        r#"{"model":"x"}"#,
        &[
            "--header",
            "x-llmkube-backend=gpt",
            "--header",
            "x-llmkube-route=cloud/gpt",
        ],
    );
    assert_eq!(v["backend"], "small");
    assert!(v["notes"][0]
        .as_str()
        .unwrap()
        .contains("x-llmkube-backend"));
}

#[test]
fn backend_name_match_and_quarantine() {
    let v = json_of(r#"{"model":"big-model"}"#, &[]);
    assert_eq!((&v["backend"], &v["rule"]), (&json!("big"), &Value::Null));
    assert_eq!(
        v["fallback"],
        "backendNameMatch: the model names backend big"
    );
    let v = json_of(
        r#"{"model":"x"}"#,
        &["--header", "x-team=a", "--quarantined", "gpt"],
    );
    assert_eq!(v["order"], json!(["big", "small"]));
    let o = explain_with(ROUTER, r#"{"model":"x"}"#, &["--quarantined", "nope"]);
    assert_eq!(o.code, 1);
    assert!(
        o.err
            .contains("options: --quarantined: \"nope\" is not a backend of ModelRouter/demo"),
        "{}",
        o.err
    );
}

#[test]
fn refusals_before_the_rules_carry_the_error_body() {
    let v = json_of(r#"{"model":"#, &[]);
    assert_eq!(contract(&v)["status"], 400);
    assert_eq!(v["error"]["error"]["code"], "invalid_json");
    assert_eq!(v["error"]["error"]["type"], "invalid_request_error");
    assert_eq!(v["rules"], json!([]));
    let v = json_of(r#"{"messages":[]}"#, &[]);
    assert_eq!(
        (v["status"].as_u64(), &v["error"]["error"]["code"]),
        (Some(400), &json!("missing_model"))
    );
    let v = json_of(
        &format!(r#"{{"model":"x","p":"{}"}}"#, "a".repeat(200)),
        &["--max-body-bytes", "100"],
    );
    assert_eq!(
        (v["status"].as_u64(), &v["error"]["error"]["code"]),
        (Some(413), &json!("request_too_large"))
    );
    let v = json_of("", &[]);
    assert_eq!(v["status"], 400);
    // Not an inference path: passed through, and no route serves it.
    let v = json_of(r#"{"model":"x"}"#, &["--path", "/v1/other"]);
    assert_eq!(
        (v["status"].as_u64(), v["outcome"].as_str()),
        (Some(404), Some("pass"))
    );
}

#[test]
fn no_route_is_404_with_the_models_name() {
    let manifest = ROUTER.replace("  defaultRoute: small\n", "");
    let o = explain_with(&manifest, r#"{"model":"nothing"}"#, &["--json"]);
    assert_eq!(o.code, 0, "{}", o.err);
    let v: Value = serde_json::from_str(&o.out).unwrap();
    assert_eq!(
        contract(&v),
        json!({"status": 404, "backend": null, "rule": null, "order": [], "code": "model_not_found"})
    );
}

#[test]
fn budgets_in_scope_with_the_team_key_and_endpoint_inputs() {
    let v = json_of(
        r#"{"model":"x"}"#,
        &[
            "--header",
            "x-team=a",
            "--header",
            "x-llmkube-team=blue",
            "--header",
            "X-Session-Id=s1",
        ],
    );
    let names: Vec<(&str, &str)> = v["budgets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b["name"].as_str().unwrap(), b["key"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("all", "llm/demo"),
            ("team-a-rule", "team-a"),
            ("per-team", "team:blue")
        ]
    );
    assert_eq!(v["team"], "blue");
    assert_eq!(
        v["endpoint_picking"],
        json!([{"backend": "small", "resolution": "endpoint", "balancing": "LoadAware",
                "prefix_affinity": true, "session_headers": [["x-session-id", "s1"]], "endpoint_picker": null}])
    );
    // Without a team header the team budget does not apply.
    let v = json_of(r#"{"model":"x"}"#, &[]);
    assert_eq!(v["budgets"].as_array().unwrap().len(), 1);
    assert_eq!(v["team"], Value::Null);
}

#[test]
fn text_output_walks_through_the_decision() {
    let o = explain_with(ROUTER, r#"{"model":"x"}"#, &["--header", "x-team=a"]);
    assert_eq!(o.code, 0);
    for want in [
        "model: \"x\"",
        "  3. team-a: matched (every condition holds)",
        "attempt order: gpt -> big -> small",
        "route key: team-a/gpt,big,small",
        "budget team-a-rule (rule scope, key team-a): maxUSD 5",
        "answer: 200 from backend gpt",
    ] {
        assert!(o.out.contains(want), "{want:?} missing from\n{}", o.out);
    }
    assert!(
        o.err
            .contains("warning: ModelRouter/demo: spec.backends[0]"),
        "{}",
        o.err
    );
}

#[test]
fn invalid_manifests_exit_1_with_validate_problem_lines() {
    let bad = ROUTER.replace("defaultRoute: small", "defaultRoute: nope");
    let o = explain_with(&bad, r#"{"model":"x"}"#, &["--json"]);
    assert_eq!((o.code, o.out.as_str()), (1, ""));
    assert!(o.err.contains("ModelRouter/demo: spec.defaultRoute: backend \"nope\" is not declared in spec.backends"), "{}", o.err);
}

#[test]
fn usage_errors() {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let args: Vec<String> = ["explain", "-f", "x.yaml"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(run(&args, &mut &b""[..], &mut out, &mut err), 2);
    assert!(String::from_utf8_lossy(&err).contains("--body"));
    let o = explain_with(ROUTER, "{}", &["--header", "bad name=1"]);
    assert_eq!(o.code, 1);
    let o = explain_with(ROUTER, "{}", &["--target", "envoy"]);
    assert_eq!(o.code, 2);
    let args: Vec<String> = [
        "compile", "--target", "envoy", "-f", "x.yaml", "--body", "b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut err = Vec::new();
    assert_eq!(run(&args, &mut &b""[..], &mut Vec::new(), &mut err), 2);
}

#[test]
fn allowlists_refuse_before_routing() {
    let manifest = ROUTER.replace(
        "  policy:\n",
        "  policy:\n    auth:\n      jwt: {provider: kc, issuer: \"https://idp/\", jwksURI: \"https://idp/certs\", teamClaim: team}\n      allowlists: [{team: research, models: [\"gpt-*\"]}]\n",
    );
    let ex = |model: &str, team: &[&str]| {
        let mut extra = vec!["--json"];
        let h: Vec<String> = team.iter().map(|t| format!("x-llmkube-team={t}")).collect();
        for h in &h {
            extra.extend(["--header", h.as_str()]);
        }
        let o = explain_with(&manifest, &format!(r#"{{"model":"{model}"}}"#), &extra);
        assert_eq!(o.code, 0, "{}", o.err);
        serde_json::from_str::<Value>(&o.out).unwrap()
    };
    let v = ex("gpt-5", &["research"]);
    assert_eq!(
        (v["status"].clone(), v["backend"].clone()),
        (json!(200), json!("gpt"))
    );
    for (model, team) in [
        ("big-model", vec!["research"]),
        ("gpt-5", vec!["ops"]),
        ("gpt-5", vec![]),
    ] {
        let v = ex(model, &team);
        assert_eq!(v["status"], 403, "{model} {team:?}: {v}");
        assert_eq!(v["error"]["error"]["code"], "model_not_allowed", "{v}");
        assert_eq!(v["backend"], Value::Null);
    }
}
