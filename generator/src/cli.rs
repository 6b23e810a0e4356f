//! The command line. `run` returns the exit status: 0 ok, 1 invalid input (problem lines on
//! stderr, no output file), 2 usage error.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::targets::envoy::{EnvoyOptions, Format};
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
                     [--ca-file PATH] [--format yaml|json]
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
    "--format",
];

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
    let parsed = match parse_args(&args[1..]) {
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
        other => usage(err, &format!("unknown command {other:?}")),
    }
}

fn compile(a: &Args, stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let target = match a.one("--target") {
        Ok(Some(t)) => t,
        Ok(None) => {
            let _ = writeln!(err, "error: --target is required\n{USAGE}");
            return 2;
        }
        Err(m) => {
            let _ = writeln!(err, "error: {m}");
            return 2;
        }
    };
    match target.parse::<Target>() {
        Ok(Target::Envoy) => {}
        Ok(t @ (Target::EnvoyGateway | Target::Agentgateway)) => {
            let _ = writeln!(
                err,
                "options: --target: {t} is not implemented yet (only envoy is)"
            );
            return 1;
        }
        Err(m) => {
            let _ = writeln!(err, "error: {m}");
            return 2;
        }
    }
    let output = match a.one("-o") {
        Ok(o) => o.map(PathBuf::from),
        Err(m) => {
            let _ = writeln!(err, "error: {m}");
            return 2;
        }
    };
    let opts = match envoy_options(a, output.as_deref()) {
        Ok(o) => o,
        Err(problems) => {
            for p in problems {
                let _ = writeln!(err, "{p}");
            }
            return 1;
        }
    };
    let sources = match read_sources(&a.files, stdin) {
        Ok(s) => s,
        Err(p) => {
            let _ = writeln!(err, "{p}");
            return 1;
        }
    };
    let mut diags = Diagnostics::default();
    let result = crate::targets::envoy::compile_envoy_diag(&sources, &opts, &mut diags);
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

fn envoy_options(a: &Args, output: Option<&Path>) -> Result<EnvoyOptions, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut bad = |flag: &str, msg: String| problems.push(Problem::new("options", flag, msg));
    let mut o = EnvoyOptions::default();
    let one = |flag: &str| a.one(flag);
    macro_rules! single {
        ($flag:expr) => {
            match one($flag) {
                Ok(v) => v,
                Err(m) => {
                    bad($flag, m);
                    None
                }
            }
        };
    }
    if let Some(d) = single!("--wasm-dir") {
        o.wasm_dir = PathBuf::from(d);
    }
    for (flag, slot) in [("--listen", &mut o.listen), ("--admin", &mut o.admin)] {
        if let Some(v) = single!(flag) {
            match v.parse() {
                Ok(sa) => *slot = sa,
                Err(_) => bad(
                    flag,
                    format!("{v:?} must be IP:PORT (e.g. 127.0.0.1:10000)"),
                ),
            }
        }
    }
    if let Some(r) = single!("--router") {
        o.common.router = Some(r.to_string());
    }
    if let Some(h) = single!("--model-header") {
        o.common.model_header = Some(h.to_string());
    }
    if let Some(n) = single!("--max-body-bytes") {
        match n.parse::<u64>() {
            Ok(v) if v > 0 => o.common.max_body_bytes = Some(v),
            _ => bad(
                "--max-body-bytes",
                format!("{n:?} must be a positive integer"),
            ),
        }
    }
    if let Some(c) = single!("--ca-file") {
        o.ca_file = c.to_string();
    }
    let format = single!("--format");
    o.format = match format {
        Some("json") => Format::Json,
        Some("yaml") => Format::Yaml,
        Some(f) => {
            bad("--format", format!("{f:?} must be yaml or json"));
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
    for v in a.many("--resolve") {
        match v.split_once('=') {
            Some((name, addr)) if !name.is_empty() => match parse_host_port(addr) {
                Ok(hp) => {
                    o.common.resolve.insert(name.to_string(), hp);
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
                            .common
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
    for eps in o.common.endpoints.values_mut() {
        eps.sort();
        eps.dedup();
    }
    if problems.is_empty() {
        Ok(o)
    } else {
        Err(problems)
    }
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
