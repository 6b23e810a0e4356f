//! The command line. `run` returns the exit status: 0 ok, 1 invalid input (problem lines on
//! stderr, no output file), 2 usage error.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::ir::CompileOptions;
use crate::targets::agentgateway::{AgentgatewayOptions, Failover};
use crate::targets::envoy::{EnvoyOptions, Format};
use crate::targets::envoy_gateway::{GatewayOptions, WasmSource};
use crate::targets::Target;
use crate::url::parse_host_port;
use crate::{read_sources, validate_sources, Diagnostics, Problem};

pub const USAGE: &str = "\
usage:
  llmkube-gen validate -f FILE [-f FILE...]
  llmkube-gen compile --target envoy|envoy-gateway|agentgateway -f FILE [-f FILE...] [-o OUT]
      envoy options: [--wasm-dir DIR] [--listen ADDR:PORT] [--admin ADDR:PORT]
                     [--resolve NAME=HOST:PORT]... [--endpoints NAME=IP:PORT,...]...
                     [--router NAME] [--model-header NAME] [--max-body-bytes N]
                     [--ca-file PATH] [--jwks-file FILE] [--format yaml|json]
                     [--budgets-service HOST:PORT [--budgets-fail-open]]
                     [--budgets-hold-ttl SECONDS] [--budgets-per-request]
                     [--budgets-lease-tokens N] [--budgets-lease-usd AMOUNT]
                     [--budgets-lease-team-slots N]
      envoy-gateway options: --wasm-url URL | --wasm-image REF [--wasm-sha256 HEX]
                     [--wasm-dir DIR] [--gateway-listener NAME] [--resolve ...] [--endpoints ...]
                     [--router NAME] [--model-header NAME] [--max-body-bytes N]
                     [--budgets-service HOST:PORT |
                      --budgets-redis-secret NAME[/KEY] --budgets-image REF]
      agentgateway options: -o DIR [--listen ADDR:PORT] [--ext-proc HOST:PORT]
                     [--ext-proc-image REF] [--wasm-dir DIR] [--wasm-sha256 HEX]
                     [--resolve ...] [--router NAME] [--model-header NAME] [--max-body-bytes N]
                     [--budgets-service HOST:PORT] [--failover-within-replay-limit]
  llmkube-gen explain -f FILE [-f FILE...] --body FILE|- [--header NAME=VALUE]... [--path PATH]
      [--quarantined BACKEND]... [--router NAME] [--model-header NAME] [--max-body-bytes N] [--json]
  -f - reads stdin. Problems are printed to stderr as `<Kind>/<name>: <field.path>: <why>`.";

struct Args {
    files: Vec<String>,
    opts: BTreeMap<&'static str, Vec<String>>,
}

const VALUE_FLAGS: &[&str] = &[
    "-f",
    "-o",
    "--target",
    "--wasm-dir",
    "--listen",
    "--admin",
    "--resolve",
    "--endpoints",
    "--router",
    "--model-header",
    "--max-body-bytes",
    "--ca-file",
    "--jwks-file",
    "--format",
    "--wasm-url",
    "--wasm-image",
    "--wasm-sha256",
    "--gateway-listener",
    "--ext-proc",
    "--ext-proc-image",
    "--budgets-service",
    "--budgets-redis-secret",
    "--budgets-image",
    "--budgets-hold-ttl",
    "--budgets-lease-tokens",
    "--budgets-lease-usd",
    "--budgets-lease-team-slots",
    "--body",
    "--header",
    "--path",
    "--quarantined",
];

/// Flags without a value.
const SWITCH_FLAGS: &[&str] = &[
    "--budgets-fail-open",
    "--budgets-per-request",
    "--failover-within-replay-limit",
];

/// Flags only `explain` takes.
const EXPLAIN_FLAGS: &[&str] = &["--body", "--header", "--path", "--quarantined"];

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        files: Vec::new(),
        opts: BTreeMap::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let flag = if flag == "--file" || flag == "--filename" {
            "-f"
        } else if flag == "--output" {
            "-o"
        } else {
            flag
        };
        if let Some(&switch) = SWITCH_FLAGS.iter().find(|f| **f == arg.as_str()) {
            a.opts.entry(switch).or_default().push(String::new());
            i += 1;
            continue;
        }
        let Some(&known) = VALUE_FLAGS.iter().find(|f| **f == flag) else {
            return Err(format!("unknown argument {arg:?}"));
        };
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                args.get(i)
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))?
            }
        };
        if known == "-f" {
            a.files.push(value);
        } else {
            a.opts.entry(known).or_default().push(value);
        }
        i += 1;
    }
    Ok(a)
}

impl Args {
    fn one(&self, flag: &str) -> Result<Option<&str>, String> {
        match self.opts.get(flag).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([v]) => Ok(Some(v)),
            Some(_) => Err(format!("{flag} given more than once")),
        }
    }
    fn many(&self, flag: &str) -> &[String] {
        self.opts.get(flag).map(Vec::as_slice).unwrap_or(&[])
    }
}

fn print_diags(diags: &Diagnostics, err: &mut dyn Write) {
    for w in &diags.warnings {
        let _ = writeln!(err, "warning: {w}");
    }
    for e in &diags.errors {
        let _ = writeln!(err, "{e}");
    }
}

/// Runs the CLI with `args` (without the program name).
pub fn run(args: &[String], stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let usage = |err: &mut dyn Write, msg: &str| {
        let _ = writeln!(err, "error: {msg}\n{USAGE}");
        2
    };
    let Some(cmd) = args.first() else {
        return usage(err, "missing command");
    };
    if cmd == "-h" || cmd == "--help" || cmd == "help" {
        let _ = writeln!(out, "{USAGE}");
        return 0;
    }
    // `--json` is the one flag without a value (explain's).
    let json = cmd == "explain" && args[1..].iter().any(|a| a == "--json");
    let rest: Vec<String> = args[1..]
        .iter()
        .filter(|a| !(json && *a == "--json"))
        .cloned()
        .collect();
    let parsed = match parse_args(&rest) {
        Ok(a) => a,
        Err(m) => return usage(err, &m),
    };
    if parsed.files.is_empty() {
        return usage(err, "at least one -f FILE is required");
    }
    match cmd.as_str() {
        "validate" => {
            if let Some(k) = parsed.opts.keys().next() {
                return usage(err, &format!("{k} is not an option of validate"));
            }
            let sources = match read_sources(&parsed.files, stdin) {
                Ok(s) => s,
                Err(p) => {
                    let _ = writeln!(err, "{p}");
                    return 1;
                }
            };
            let diags = validate_sources(&sources);
            print_diags(&diags, err);
            if diags.errors.is_empty() {
                let _ = writeln!(out, "valid");
                0
            } else {
                1
            }
        }
        "compile" => compile(&parsed, stdin, out, err),
        "explain" => explain(&parsed, json, stdin, out, err),
        other => usage(err, &format!("unknown command {other:?}")),
    }
}

/// Flags only some targets take; a flag of another target is a usage error.
const TARGET_FLAGS: &[(Target, &[&str])] = &[
    (
        Target::Envoy,
        &[
            "--listen",
            "--admin",
            "--ca-file",
            "--jwks-file",
            "--format",
            "--budgets-service",
            "--budgets-fail-open",
            "--budgets-hold-ttl",
            "--budgets-per-request",
            "--budgets-lease-tokens",
            "--budgets-lease-usd",
            "--budgets-lease-team-slots",
        ],
    ),
    (
        Target::EnvoyGateway,
        &[
            "--wasm-url",
            "--wasm-image",
            "--wasm-sha256",
            "--gateway-listener",
            "--budgets-service",
            "--budgets-redis-secret",
            "--budgets-image",
        ],
    ),
    (
        Target::Agentgateway,
        &[
            "--listen",
            "--ext-proc",
            "--ext-proc-image",
            "--wasm-sha256",
            "--budgets-service",
            "--failover-within-replay-limit",
        ],
    ),
];

fn compile(a: &Args, stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let usage = |err: &mut dyn Write, m: &str| {
        let _ = writeln!(err, "error: {m}\n{USAGE}");
        2
    };
    let target = match a.one("--target") {
        Ok(Some(t)) => t,
        Ok(None) => return usage(err, "--target is required"),
        Err(m) => return usage(err, &m),
    };
    let target = match target.parse::<Target>() {
        Ok(t) => t,
        Err(m) => return usage(err, &m),
    };
    if let Some(f) = EXPLAIN_FLAGS.iter().find(|f| a.opts.contains_key(**f)) {
        return usage(err, &format!("{f} is an option of explain, not compile"));
    }
    let allowed = |f: &str| {
        TARGET_FLAGS
            .iter()
            .any(|(t, flags)| *t == target && flags.contains(&f))
    };
    for (_, flags) in TARGET_FLAGS {
        if let Some(f) = flags
            .iter()
            .find(|f| !allowed(f) && a.opts.contains_key(**f))
        {
            return usage(err, &format!("{f} is not an option of --target {target}"));
        }
    }
    let output = match a.one("-o") {
        Ok(o) => o.map(PathBuf::from),
        Err(m) => return usage(err, &m),
    };
    let mut problems = Vec::new();
    let common = common_options(a, &mut problems);
    if target == Target::Agentgateway && output.is_none() {
        return usage(
            err,
            "--target agentgateway writes three files: -o DIR is required",
        );
    }
    let compiled = match target {
        Target::Envoy => envoy_options(a, common, output.as_deref(), &mut problems),
        Target::EnvoyGateway => gateway_options(a, common, &mut problems),
        Target::Agentgateway => agentgateway_options(a, common, &mut problems),
    };
    let Some(sources) = sources_unless(problems, &a.files, stdin, err) else {
        return 1;
    };
    let mut diags = Diagnostics::default();
    let result = match &compiled {
        Compile::Envoy(o) => crate::targets::envoy::compile_envoy_diag(&sources, o, &mut diags),
        Compile::EnvoyGateway(o) => {
            crate::targets::envoy_gateway::compile_envoy_gateway_diag(&sources, o, &mut diags)
        }
        Compile::Agentgateway(o) => {
            let files =
                crate::targets::agentgateway::compile_agentgateway_diag(&sources, o, &mut diags);
            print_diags(&diags, err);
            let Some(files) = files.filter(|_| diags.errors.is_empty()) else {
                return 1;
            };
            return write_dir(output.as_deref().unwrap_or(Path::new(".")), &files, err);
        }
        Compile::Invalid => None,
    };
    print_diags(&diags, err);
    let Some(text) = result.filter(|_| diags.errors.is_empty()) else {
        return 1;
    };
    match output {
        None => {
            let _ = out.write_all(text.as_bytes());
            0
        }
        Some(path) => match write_atomically(&path, text.as_bytes()) {
            Ok(()) => 0,
            Err(e) => {
                let _ = writeln!(err, "{}: cannot write: {e}", path.display());
                1
            }
        },
    }
}

const COMPILE_ONLY: &[&str] = &[
    "-o",
    "--target",
    "--wasm-dir",
    "--listen",
    "--admin",
    "--resolve",
    "--endpoints",
    "--ca-file",
    "--jwks-file",
    "--format",
    "--wasm-url",
    "--wasm-image",
    "--wasm-sha256",
    "--gateway-listener",
];

fn explain(
    a: &Args,
    json: bool,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let usage = |err: &mut dyn Write, m: &str| {
        let _ = writeln!(err, "error: {m}\n{USAGE}");
        2
    };
    if let Some(f) = COMPILE_ONLY.iter().find(|f| a.opts.contains_key(**f)) {
        return usage(err, &format!("{f} is not an option of explain"));
    }
    let body_from = match a.one("--body") {
        Ok(Some(b)) => b,
        Ok(None) => return usage(err, "--body FILE|- is required"),
        Err(m) => return usage(err, &m),
    };
    let mut problems = Vec::new();
    let opts = common_options(a, &mut problems);
    let mut request = crate::explain::Request::post(Vec::new());
    if let Some(p) = single(a, "--path", &mut problems) {
        request.path = p.to_string();
    }
    for h in a.many("--header") {
        match h.split_once('=') {
            Some((n, v)) if router_core::headers::is_token(n) => {
                request.headers.push((n.to_string(), v.to_string()))
            }
            _ => problems.push(Problem::new(
                "options",
                "--header",
                format!("{h:?} must be NAME=VALUE with a valid header name"),
            )),
        }
    }
    request.quarantined = a.many("--quarantined").to_vec();
    if body_from == "-" && a.files.iter().any(|f| f == "-") {
        problems.push(Problem::new(
            "options",
            "--body",
            "stdin (-) can be read only once",
        ));
    }
    let Some(sources) = sources_unless(problems, &a.files, stdin, err) else {
        return 1;
    };
    let read = if body_from == "-" {
        let mut b = Vec::new();
        stdin.read_to_end(&mut b).map(|_| b)
    } else {
        std::fs::read(body_from)
    };
    request.body = match read {
        Ok(b) => b,
        Err(e) => {
            let _ = writeln!(err, "{body_from}: cannot read: {e}");
            return 1;
        }
    };
    match crate::explain::explain_sources(&sources, &opts, &request) {
        Ok((ex, warnings)) => {
            for w in &warnings {
                let _ = writeln!(err, "warning: {w}");
            }
            let text = if json {
                serde_json::to_string_pretty(&ex).unwrap_or_default() + "\n"
            } else {
                crate::explain::render_text(&ex)
            };
            let _ = out.write_all(text.as_bytes());
            0
        }
        Err(diags) => {
            print_diags(&diags, err);
            1
        }
    }
}

/// Prints the option problems, if any (the command then exits 1), else reads the `-f` sources
/// (printing why one cannot be read).
fn sources_unless(
    problems: Vec<Problem>,
    files: &[String],
    stdin: &mut dyn Read,
    err: &mut dyn Write,
) -> Option<Vec<crate::Source>> {
    if !problems.is_empty() {
        for p in problems {
            let _ = writeln!(err, "{p}");
        }
        return None;
    }
    read_sources(files, stdin)
        .map_err(|p| {
            let _ = writeln!(err, "{p}");
        })
        .ok()
}

/// A target's options, once parsed.
enum Compile {
    Envoy(EnvoyOptions),
    EnvoyGateway(GatewayOptions),
    Agentgateway(AgentgatewayOptions),
    /// Some option was invalid (the problems say which).
    Invalid,
}

/// Reads a flag given at most once; a repeated flag is a problem.
fn single<'a>(a: &'a Args, flag: &str, problems: &mut Vec<Problem>) -> Option<&'a str> {
    a.one(flag).unwrap_or_else(|m| {
        problems.push(Problem::new("options", flag, m));
        None
    })
}

/// The options every target takes.
fn common_options(a: &Args, problems: &mut Vec<Problem>) -> CompileOptions {
    let mut o = CompileOptions {
        router: single(a, "--router", problems).map(str::to_string),
        model_header: single(a, "--model-header", problems).map(str::to_string),
        ..Default::default()
    };
    if let Some(n) = single(a, "--max-body-bytes", problems) {
        match n.parse::<u64>() {
            Ok(v) if v > 0 => o.max_body_bytes = Some(v),
            _ => problems.push(Problem::new(
                "options",
                "--max-body-bytes",
                format!("{n:?} must be a positive integer"),
            )),
        }
    }
    let mut bad = |flag: &str, msg: String| problems.push(Problem::new("options", flag, msg));
    for v in a.many("--resolve") {
        match v.split_once('=') {
            Some((name, addr)) if !name.is_empty() => match parse_host_port(addr) {
                Ok(hp) => {
                    o.resolve.insert(name.to_string(), hp);
                }
                Err(e) => bad("--resolve", format!("{v:?}: {e}")),
            },
            _ => bad("--resolve", format!("{v:?} must be NAME=HOST:PORT")),
        }
    }
    for v in a.many("--endpoints") {
        match v.split_once('=') {
            Some((name, list)) if !name.is_empty() && !list.is_empty() => {
                for item in list.split(',') {
                    match item.parse::<std::net::SocketAddr>() {
                        Ok(sa) => o
                            .endpoints
                            .entry(name.to_string())
                            .or_default()
                            .push((sa.ip().to_string(), sa.port())),
                        Err(_) => bad("--endpoints", format!("{item:?} must be IP:PORT")),
                    }
                }
            }
            _ => bad("--endpoints", format!("{v:?} must be NAME=IP:PORT,...")),
        }
    }
    for eps in o.endpoints.values_mut() {
        eps.sort();
        eps.dedup();
    }
    o
}

/// `--budgets-fail-open`, `--budgets-hold-ttl SECONDS` and `--budgets-per-request` (envoy
/// target).
fn budgets_flags(a: &Args, o: &mut EnvoyOptions, problems: &mut Vec<Problem>) {
    if a.opts.contains_key("--budgets-per-request") {
        if o.budgets_service.is_some() {
            problems.push(Problem::new(
                "options",
                "--budgets-per-request",
                "only for embedded ledgers (with --budgets-service, admission is per request unless --budgets-lease-tokens)"
                    .to_string(),
            ));
        }
        o.budgets_per_request = true;
    }
    if a.opts.contains_key("--budgets-fail-open") {
        if o.budgets_service.is_none() {
            problems.push(Problem::new(
                "options",
                "--budgets-fail-open",
                "only with --budgets-service (embedded ledgers are never unreachable)".to_string(),
            ));
        }
        o.budgets_fail_open = true;
    }
    if let Some(t) = single(a, "--budgets-hold-ttl", problems) {
        match t.parse::<u64>() {
            Ok(s) if (1..=router_core::budget::protocol::MAX_TTL_S).contains(&s) => {
                o.budgets_hold_ttl_s = Some(s)
            }
            _ => problems.push(Problem::new(
                "options",
                "--budgets-hold-ttl",
                format!(
                    "{t:?}: seconds from 1 to {} (how long a reservation outlives a request that never ends)",
                    router_core::budget::protocol::MAX_TTL_S
                ),
            )),
        }
    }
}

/// `--budgets-lease-tokens N` and `--budgets-lease-usd AMOUNT` (envoy target, only with
/// `--budgets-service`): lease mode, the most one lease takes of a budget's tokens / USD.
fn lease_flags(a: &Args, o: &mut EnvoyOptions, problems: &mut Vec<Problem>) {
    let tokens = single(a, "--budgets-lease-tokens", problems);
    let usd = single(a, "--budgets-lease-usd", problems);
    let slots = single(a, "--budgets-lease-team-slots", problems);
    if tokens.is_none() && usd.is_none() {
        if slots.is_some() {
            problems.push(Problem::new(
                "options",
                "--budgets-lease-team-slots",
                "only with --budgets-lease-tokens or --budgets-lease-usd (lease mode)".to_string(),
            ));
        }
        return;
    }
    let mut lease = router_core::budget::shared_lease::LeaseConfig {
        max_tokens: None,
        max_usd: None,
        report_ms: router_core::budget::shared_lease::DEFAULT_REPORT_MS,
        team_slots: router_core::budget::lease_slots::DEFAULT_TEAM_SLOTS,
        unsafe_lease_unheld: false,
    };
    let mut ok = true;
    for (flag, given) in [
        ("--budgets-lease-tokens", &tokens),
        ("--budgets-lease-usd", &usd),
    ] {
        if given.is_some() && o.budgets_service.is_none() {
            problems.push(Problem::new(
                "options",
                flag,
                "only with --budgets-service (leases are taken from the shared ledger)".to_string(),
            ));
            ok = false;
        }
    }
    if let Some(t) = tokens {
        match t.parse::<u64>() {
            Ok(n) if n >= 1 => lease.max_tokens = Some(n),
            _ => {
                problems.push(Problem::new(
                    "options",
                    "--budgets-lease-tokens",
                    format!(
                        "{t:?}: a whole number of tokens, at least 1 (the most one lease takes)"
                    ),
                ));
                ok = false;
            }
        }
    }
    if let Some(u) = usd {
        let why = match router_core::budget::money::parse_usd(u) {
            Ok(p) if p > 0 => None,
            Ok(_) => Some("must be more than 0 (the most USD one lease takes)".to_string()),
            Err(why) => Some(why.to_string()),
        };
        match why {
            None => lease.max_usd = Some(u.to_string()),
            Some(why) => {
                problems.push(Problem::new(
                    "options",
                    "--budgets-lease-usd",
                    format!("{u:?}: {why}"),
                ));
                ok = false;
            }
        }
    }
    if let Some(n) = slots {
        let max = router_core::budget::lease_config::MAX_TEAM_SLOTS;
        match n.parse::<usize>() {
            Ok(n) if n <= max => lease.team_slots = n,
            _ => {
                problems.push(Problem::new(
                    "options",
                    "--budgets-lease-team-slots",
                    format!("{n:?}: a whole number from 0 to {max} (team leases kept per team budget; 0: team budgets reserve per request)"),
                ));
                ok = false;
            }
        }
    }
    if ok {
        o.budgets_lease = Some(lease);
    }
}

fn envoy_options(
    a: &Args,
    common: CompileOptions,
    output: Option<&Path>,
    problems: &mut Vec<Problem>,
) -> Compile {
    let mut o = EnvoyOptions::with_common(common);
    let before = problems.len();
    if let Some(d) = single(a, "--wasm-dir", problems) {
        o.wasm_dir = PathBuf::from(d);
    }
    for (flag, slot) in [("--listen", &mut o.listen), ("--admin", &mut o.admin)] {
        if let Some(v) = single(a, flag, problems) {
            match v.parse() {
                Ok(sa) => *slot = sa,
                Err(_) => problems.push(Problem::new(
                    "options",
                    flag,
                    format!("{v:?} must be IP:PORT (e.g. 127.0.0.1:10000)"),
                )),
            }
        }
    }
    if let Some(c) = single(a, "--ca-file", problems) {
        o.ca_file = c.to_string();
    }
    if let Some(f) = single(a, "--jwks-file", problems) {
        o.jwks_file = Some(super::targets::envoy::absolute(PathBuf::from(f)));
    }
    o.budgets_service = budgets_service(a, problems);
    budgets_flags(a, &mut o, problems);
    lease_flags(a, &mut o, problems);
    o.format = match single(a, "--format", problems) {
        Some("json") => Format::Json,
        Some("yaml") => Format::Yaml,
        Some(f) => {
            problems.push(Problem::new(
                "options",
                "--format",
                format!("{f:?} must be yaml or json"),
            ));
            Format::Yaml
        }
        None if output
            .and_then(|p| p.extension())
            .is_some_and(|e| e == "json") =>
        {
            Format::Json
        }
        None => Format::Yaml,
    };
    if problems.len() > before {
        return Compile::Invalid;
    }
    Compile::Envoy(o)
}

fn gateway_options(a: &Args, common: CompileOptions, problems: &mut Vec<Problem>) -> Compile {
    let url = single(a, "--wasm-url", problems);
    let image = single(a, "--wasm-image", problems);
    let wasm = match (url, image) {
        (Some(u), None) => WasmSource::Http(u.to_string()),
        (None, Some(i)) => WasmSource::Image(i.to_string()),
        (Some(_), Some(_)) => {
            problems.push(Problem::new(
                "options",
                "--wasm-url",
                "give --wasm-url or --wasm-image, not both",
            ));
            return Compile::Invalid;
        }
        (None, None) => {
            problems.push(Problem::new(
                "options",
                "--wasm-url",
                "the envoy-gateway target needs --wasm-url URL or --wasm-image REF (where Envoy Gateway fetches the model-router module)",
            ));
            return Compile::Invalid;
        }
    };
    let mut o = GatewayOptions::new(wasm);
    o.common = common;
    o.wasm_sha256 = single(a, "--wasm-sha256", problems).map(str::to_string);
    if let Some(d) = single(a, "--wasm-dir", problems) {
        o.wasm_dir = PathBuf::from(d);
    }
    if let Some(l) = single(a, "--gateway-listener", problems) {
        o.listener = l.to_string();
    }
    match crate::targets::envoy_gateway::budgets::from_flags(
        single(a, "--budgets-service", problems),
        single(a, "--budgets-redis-secret", problems),
        single(a, "--budgets-image", problems),
    ) {
        Ok(b) => o.budgets = b,
        Err(p) => {
            problems.push(p);
            return Compile::Invalid;
        }
    }
    Compile::EnvoyGateway(o)
}

fn agentgateway_options(a: &Args, common: CompileOptions, problems: &mut Vec<Problem>) -> Compile {
    let mut o = AgentgatewayOptions {
        common,
        ..Default::default()
    };
    if let Some(l) = single(a, "--listen", problems) {
        match l.parse() {
            Ok(sa) => o.listen = sa,
            Err(_) => problems.push(Problem::new(
                "options",
                "--listen",
                format!("{l:?} must be ADDR:PORT"),
            )),
        }
    }
    if let Some(e) = single(a, "--ext-proc", problems) {
        match parse_host_port(e) {
            Ok(hp) => o.ext_proc = hp,
            Err(why) => problems.push(Problem::new(
                "options",
                "--ext-proc",
                format!("{e:?}: {why}"),
            )),
        }
    }
    if let Some(i) = single(a, "--ext-proc-image", problems) {
        o.image = i.to_string();
    }
    if let Some(d) = single(a, "--wasm-dir", problems) {
        o.wasm_dir = PathBuf::from(d);
    }
    o.wasm_sha256 = single(a, "--wasm-sha256", problems).map(str::to_string);
    o.budgets_service = budgets_service(a, problems);
    if a.opts.contains_key("--failover-within-replay-limit") {
        o.failover = Failover::WithinReplayLimit;
    }
    Compile::Agentgateway(o)
}

/// `--budgets-service HOST:PORT`: where `llmkube-budgets` listens.
fn budgets_service(a: &Args, problems: &mut Vec<Problem>) -> Option<(String, u16)> {
    let s = single(a, "--budgets-service", problems)?;
    match parse_host_port(s) {
        Ok(hp) => Some(hp),
        Err(why) => {
            problems.push(Problem::new(
                "options",
                "--budgets-service",
                format!("{s:?}: {why} (where llmkube-budgets listens)"),
            ));
            None
        }
    }
}

/// Writes the files into `dir` (created if missing), each atomically; nothing is written when
/// the directory cannot be created.
fn write_dir(dir: &Path, files: &[(&str, String)], err: &mut dyn Write) -> i32 {
    if let Err(e) = std::fs::create_dir_all(dir) {
        let _ = writeln!(err, "{}: cannot create: {e}", dir.display());
        return 1;
    }
    for (name, text) in files {
        let path = dir.join(name);
        if let Err(e) = write_atomically(&path, text.as_bytes()) {
            let _ = writeln!(err, "{}: cannot write: {e}", path.display());
            return 1;
        }
    }
    0
}

/// Writes `bytes` to a temporary file next to `path` (mode 0600: the bootstrap can hold provider
/// credentials) and renames it over `path`, so a failed run never leaves a partial file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
