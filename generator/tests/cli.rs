//! The binary: exit codes, stdin, output files.

mod common;
use common::*;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_llmkube-gen");

fn run(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut si = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            si.write_all(s.as_bytes()).unwrap();
        }
    }
    child.wait_with_output().unwrap()
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("llmkube-gen-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn example() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy-examples/router.yaml").to_string()
}

#[test]
fn validate_ok_and_invalid() {
    let o = run(&["validate", "-f", &example()], None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut r = router();
    r["spec"]["rules"][0]["route"]["backends"] = json!(["gpt"]);
    let o = run(&["validate", "-f", "-"], Some(&full(r)));
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), "ModelRouter/demo: spec.rules[0].route.backends[0]: backend \"gpt\" is not declared in spec.backends\n");
}

#[test]
fn validate_several_files_and_warnings() {
    let d = tmpdir("several");
    let a = d.join("router.yaml");
    let b = d.join("objects.yaml");
    std::fs::write(&a, serde_json::to_string(&router()).unwrap()).unwrap();
    std::fs::write(&b, docs(&[isvc("isvc-a", None), isvc("isvc-b", None)])).unwrap();
    let o = run(
        &[
            "validate",
            "-f",
            a.to_str().unwrap(),
            "-f",
            b.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0));
    let unknown = "and InferenceService/isvc-a does not say which model name its engine serves (an engine answers 404 for a name it does not serve); set --served-model-name in its extraArgs, or spec.gateway.modelName, and the gateway rewrites \"model\" to it for backend \"local-a\"";
    assert_eq!(
        stderr(&o),
        format!(
            "warning: ModelRouter/demo: spec.backends[2].external.credentialsSecretRef.name: Secret llm/openai is not in the input\n\
             warning: ModelRouter/demo: spec.rules[0].route.backends[0]: can send model names other than \"local-a\" to local backend \"local-a\": match.models [\"qwen3-*\"], {unknown}\n\
             warning: ModelRouter/demo: spec.defaultRoute: sends every model no rule or backend name matched to local backend \"local-a\", not only \"local-a\", {unknown}\n"
        )
    );
}

#[test]
fn missing_file_is_an_error() {
    let o = run(&["validate", "-f", "/nonexistent/router.yaml"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("/nonexistent/router.yaml: cannot read:"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn compile_from_stdin_to_stdout() {
    let text = std::fs::read_to_string(example()).unwrap();
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "--wasm-dir",
            "/opt/w",
            "-f",
            "-",
        ],
        Some(&text),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_norway::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"],
        10000
    );
}

/// `compile --target envoy -f <example> -o <out> <extra>...`, which must succeed silently.
fn compile_example_to(out: &Path, extra: &[&str]) {
    let example = example();
    let mut args = vec!["compile", "--target", "envoy", "-f", &example];
    args.extend(["-o", out.to_str().unwrap()]);
    args.extend(extra);
    let o = run(&args, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
}

#[test]
fn compile_writes_output_deterministically() {
    let d = tmpdir("out");
    let out1 = d.join("a.yaml");
    let out2 = d.join("b.yaml");
    for out in [&out1, &out2] {
        compile_example_to(
            out,
            &[
                "--listen",
                "127.0.0.1:18000",
                "--admin",
                "127.0.0.1:18001",
                "--wasm-dir",
                "/opt/w",
            ],
        );
    }
    let a = std::fs::read(&out1).unwrap();
    assert_eq!(a, std::fs::read(&out2).unwrap());
    let text = String::from_utf8(a).unwrap();
    assert!(text.contains("port_value: 18000") && text.contains("port_value: 18001"));
    // Only the output files are left (no temp files).
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 2);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&out1).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}

#[test]
fn json_output_by_extension() {
    let d = tmpdir("json");
    let out = d.join("envoy.json");
    compile_example_to(&out, &[]);
    let _: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
}

#[test]
fn invalid_input_writes_no_file() {
    let d = tmpdir("invalid");
    let out = d.join("envoy.yaml");
    let compile_invalid = || {
        let mut r = router();
        r["spec"]["defaultRoute"] = json!("nope");
        let o = run(
            &[
                "compile",
                "--target",
                "envoy",
                "-f",
                "-",
                "-o",
                out.to_str().unwrap(),
            ],
            Some(&full(r)),
        );
        assert_eq!(o.status.code(), Some(1));
        o
    };
    let o = compile_invalid();
    assert_eq!(
        stderr(&o).lines().last().unwrap(),
        "ModelRouter/demo: spec.defaultRoute: backend \"nope\" is not declared in spec.backends"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    // An existing file is left untouched.
    std::fs::write(&out, "old").unwrap();
    compile_invalid();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "old");
}

#[test]
fn agentgateway_target_writes_three_files_into_the_output_dir() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../agentgateway-examples/router.yaml"
    );
    let o = run(
        &["compile", "--target", "agentgateway", "-f", example],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("-o DIR is required"), "{}", stderr(&o));
    let d = tmpdir("agw").join("out");
    let sha = "a".repeat(64);
    let args = [
        "compile",
        "--target",
        "agentgateway",
        "-f",
        example,
        "-o",
        d.to_str().unwrap(),
        "--wasm-sha256",
        &sha,
        "--ext-proc",
        "127.0.0.1:19001",
        "--listen",
        "127.0.0.1:14001",
    ];
    // The default body limit is above what agentgateway replays for a fallback: refused, and
    // nothing written.
    let o = run(&args, None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("failover needs the request replayed"),
        "{}",
        stderr(&o)
    );
    assert!(!d.exists());
    let mut ok = args.to_vec();
    ok.extend(["--max-body-bytes", "65536"]);
    let o = run(&ok, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for f in ["agentgateway.yaml", "ext-proc.yaml", "kubernetes.yaml"] {
        assert!(d.join(f).is_file(), "{f}");
    }
    let server = std::fs::read_to_string(d.join("ext-proc.yaml")).unwrap();
    assert!(server.contains(&sha));
    // `--budgets-service`: the server's config gets the `llmkube-budgets` cluster.
    ok.extend(["--budgets-service", "budgets.llm:8090"]);
    let o = run(&ok, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let server: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(d.join("ext-proc.yaml")).unwrap()).unwrap();
    assert_eq!(
        server["clusters"]["llmkube-budgets"]["address"],
        "budgets.llm:8090"
    );
    // `--failover-within-replay-limit` instead of the small body limit: accepted, and the
    // filter is told the replay limit.
    let mut within = args.to_vec();
    within.push("--failover-within-replay-limit");
    let o = run(&within, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let server: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(d.join("ext-proc.yaml")).unwrap()).unwrap();
    assert_eq!(server["plugin_config"]["failover_replay_limit"], 65536);
    // Only agentgateway has that limit.
    let envoy_example = format!(
        "{}/../envoy-examples/router.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "-f",
            &envoy_example,
            "--failover-within-replay-limit",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--failover-within-replay-limit is not an option of --target envoy"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &[
            "compile",
            "--target",
            "agentgateway",
            "-f",
            example,
            "-o",
            "/tmp/x",
            "--admin",
            "127.0.0.1:1",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--admin is not an option of --target agentgateway"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn envoy_gateway_target_from_the_command_line() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../envoy-examples/envoy-gateway/router.yaml"
    );
    let sha = "ab".repeat(32);
    let d = tmpdir("eg");
    let out = d.join("eg.yaml");
    let args = [
        "compile",
        "--target",
        "envoy-gateway",
        "-f",
        example,
        "--wasm-image",
        "oci://ghcr.io/example/llmkube-model-router:1",
        "--wasm-sha256",
        &sha,
        "--gateway-listener",
        "web",
        "-o",
        out.to_str().unwrap(),
    ];
    let o = run(&args, None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("---\napiVersion: "));
    assert!(text.contains("type: Image") && text.contains(&sha));
    assert!(text.contains("name: envoy-gateway-system/ai-gateway/web"));
    // The module source is required; flags of the envoy target are refused.
    let o = run(
        &["compile", "--target", "envoy-gateway", "-f", example],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("options: --wasm-url: the envoy-gateway target needs --wasm-url URL or --wasm-image REF"), "{}", stderr(&o));
    let o = run(
        &[
            "compile",
            "--target",
            "envoy-gateway",
            "-f",
            example,
            "--listen",
            "127.0.0.1:1",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("error: --listen is not an option of --target envoy-gateway"));
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "-f",
            example,
            "--wasm-url",
            "http://x/y.wasm",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn router_selection() {
    let text = two_routers();
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "-f",
            "-",
            "--wasm-dir",
            "/opt/w",
        ],
        Some(&text),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("exactly one ModelRouter; found 2"));
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "-f",
            "-",
            "--router",
            "second",
            "--wasm-dir",
            "/opt/w",
        ],
        Some(&text),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn bad_options() {
    let compile_example_with = |flag: &str, value: &str| {
        let o = run(
            &[
                "compile",
                "--target",
                "envoy",
                "-f",
                &example(),
                flag,
                value,
            ],
            None,
        );
        assert_eq!(o.status.code(), Some(1), "{flag} {value}");
        stderr(&o)
    };
    assert_eq!(
        compile_example_with("--listen", "localhost"),
        "options: --listen: \"localhost\" must be IP:PORT (e.g. 127.0.0.1:10000)\n"
    );
    assert_eq!(
        compile_example_with("--resolve", "qwen3-8b"),
        "options: --resolve: \"qwen3-8b\" must be NAME=HOST:PORT\n"
    );
    compile_example_with("--max-body-bytes", "0");
    assert!(compile_example_with("--budgets-service", "budgets")
        .starts_with("options: --budgets-service: \"budgets\""));
    // Usage errors: 2.
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "-f",
            &example(),
            "--budgets-image",
            "ghcr.io/example/llmkube-budgets:1",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("error: --budgets-image is not an option of --target envoy"));
    // envoy-gateway takes the budgets flags; giving both ways is a problem (exit 1).
    let eg_example = format!(
        "{}/../envoy-examples/envoy-gateway/router.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let eg = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            "--target",
            "envoy-gateway",
            "--wasm-url",
            "http://x/m.wasm",
            "--wasm-sha256",
            "0000000000000000000000000000000000000000000000000000000000000000",
            "-f",
            eg_example.as_str(),
        ];
        args.extend(extra);
        run(&args, None)
    };
    let o = eg(&["--budgets-service", "llmkube-budgets.llm:8080"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = eg(&[
        "--budgets-service",
        "b:1",
        "--budgets-redis-secret",
        "r",
        "--budgets-image",
        "i",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("options: --budgets-service: give --budgets-service"));
    assert_eq!(
        run(&["compile", "-f", &example()], None).status.code(),
        Some(2)
    );
    assert_eq!(
        run(&["compile", "--target", "nginx", "-f", &example()], None)
            .status
            .code(),
        Some(2)
    );
    assert_eq!(run(&["validate"], None).status.code(), Some(2));
    assert_eq!(run(&["frobnicate", "-f", "x"], None).status.code(), Some(2));
    assert_eq!(
        run(&["validate", "-f", "-", "-f", "-"], Some(""))
            .status
            .code(),
        Some(1)
    );
}

#[test]
fn resolve_and_endpoints_flags() {
    let mut r = router();
    r["spec"]["backends"][1]["resolution"] = json!("endpoint");
    let o = run(
        &[
            "compile",
            "--target",
            "envoy",
            "-f",
            "-",
            "--format",
            "json",
            "--wasm-dir",
            "/opt/w",
            "--resolve",
            "isvc-a=127.0.0.1:9100",
            "--endpoints",
            "isvc-b=127.0.0.1:9200,127.0.0.1:9201",
        ],
        Some(&docs(&[r, secret()])),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let clusters = v["static_resources"]["clusters"].as_array().unwrap();
    assert_eq!(
        clusters[0]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
            ["socket_address"]["port_value"],
        9100
    );
    assert_eq!(
        clusters[1]["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// `compile --target envoy -f <example> EXTRA…`: exit code, stdout, stderr.
fn compile_example_envoy(extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec!["compile", "--target", "envoy", "-f"];
    let ex = example();
    args.push(&ex);
    args.extend_from_slice(extra);
    let o = run(&args, None);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).to_string(),
        stderr(&o),
    )
}

/// `--budgets-fail-open` (a switch, only with `--budgets-service`) and `--budgets-hold-ttl`
/// reach the plugin configuration; without them budgets fail closed with the default TTL.
#[test]
fn budgets_fail_open_and_hold_ttl_flags() {
    let compile = compile_example_envoy;
    let service = ["--budgets-service", "127.0.0.1:8090"];
    let (code, out, err) = compile(
        &[
            &service[..],
            &["--budgets-fail-open", "--budgets-hold-ttl", "30"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(r#""fail_open":true"#), "{out}");
    assert!(out.contains(r#""hold_ttl_s":30,"#), "{out}");
    let (code, out, _) = compile(&service);
    assert_eq!(code, Some(0));
    assert!(!out.contains(r#""fail_open":true"#));
    assert!(out.contains(r#""hold_ttl_s":900,"#));
    let (code, _, err) = compile(&["--budgets-fail-open"]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with("options: --budgets-fail-open: only with --budgets-service"),
        "{err}"
    );
    let (code, _, err) = compile(&["--budgets-hold-ttl", "0"]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with("options: --budgets-hold-ttl: \"0\""),
        "{err}"
    );
}

/// Worker leases are the embedded default, so nothing about them is written;
/// `--budgets-per-request` (a switch, embedded ledgers only) puts `per_request` in the plugin
/// configuration. The old opt-in switch is gone rather than kept as a no-op.
#[test]
fn budgets_per_request_flag() {
    let compile = compile_example_envoy;
    let (code, out, err) = compile(&["--budgets-per-request"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(r#""per_request":true"#), "{out}");
    let (code, out, _) = compile(&[]);
    assert_eq!(code, Some(0));
    assert!(!out.contains("per_request") && !out.contains("worker_leases"));
    let (code, _, err) = compile(&[
        "--budgets-service",
        "127.0.0.1:8090",
        "--budgets-per-request",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with("options: --budgets-per-request: only for embedded ledgers"),
        "{err}"
    );
    let (code, _, err) = compile(&["--budgets-worker-leases"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with(r#"error: unknown argument "--budgets-worker-leases""#),
        "{err}"
    );
}

/// `--budgets-lease-tokens N` / `--budgets-lease-usd AMOUNT` put lease mode in the plugin
/// configuration, only with `--budgets-service`; errors name the flag and the reason.
#[test]
fn budgets_lease_flags() {
    let compile = compile_example_envoy;
    let service = ["--budgets-service", "127.0.0.1:8090"];
    let (code, out, err) = compile(
        &[
            &service[..],
            &[
                "--budgets-lease-tokens",
                "20000",
                "--budgets-lease-usd",
                "0.25",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(r#""lease":{"max_tokens":20000,"max_usd":"0.25","report_ms":100}"#),
        "{out}"
    );
    let (_, out, _) = compile(&service);
    assert!(!out.contains(r#""lease""#), "no lease mode unless asked");
    let (code, out, err) = compile(
        &[
            &service[..],
            &[
                "--budgets-lease-tokens",
                "20000",
                "--budgets-lease-team-slots",
                "16",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(r#""lease":{"max_tokens":20000,"report_ms":100,"team_slots":16}"#),
        "{out}"
    );
    for (args, says) in [
        (
            vec!["--budgets-lease-tokens", "100"],
            "options: --budgets-lease-tokens: only with --budgets-service",
        ),
        (
            vec!["--budgets-lease-usd", "1"],
            "options: --budgets-lease-usd: only with --budgets-service",
        ),
        (
            [&service[..], &["--budgets-lease-tokens", "0"]].concat(),
            "options: --budgets-lease-tokens: \"0\": a whole number of tokens, at least 1",
        ),
        (
            [&service[..], &["--budgets-lease-usd", "0"]].concat(),
            "options: --budgets-lease-usd: \"0\": must be more than 0",
        ),
        (
            [&service[..], &["--budgets-lease-usd", "1.2.3"]].concat(),
            "options: --budgets-lease-usd: \"1.2.3\"",
        ),
        (
            [&service[..], &["--budgets-lease-team-slots", "4"]].concat(),
            "options: --budgets-lease-team-slots: only with --budgets-lease-tokens",
        ),
        (
            [
                &service[..],
                &[
                    "--budgets-lease-tokens",
                    "5",
                    "--budgets-lease-team-slots",
                    "4097",
                ],
            ]
            .concat(),
            "options: --budgets-lease-team-slots: \"4097\": a whole number from 0 to 4096",
        ),
    ] {
        let (code, _, err) = compile(&args);
        assert_eq!(code, Some(1), "{args:?}");
        assert!(err.starts_with(says), "{args:?}: {err}");
    }
    let o = run(
        &[
            "compile",
            "--target",
            "envoy-gateway",
            "-f",
            &example(),
            "--wasm-url",
            "http://x/m.wasm",
            "--budgets-lease-tokens",
            "5",
        ],
        None,
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "a usage error: an envoy-target flag"
    );
    assert!(
        stderr(&o).contains("--budgets-lease-tokens"),
        "{}",
        stderr(&o)
    );
}
