//! The server's configuration file (YAML or JSON): which filter module, pinned by sha256, with
//! the plugin config the Envoy target embeds, and the server's bounds.

use anyhow::{anyhow, bail, Context as _};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    module: ModuleRef,
    root_id: String,
    #[serde(default)]
    vm_id: String,
    /// The plugin configuration: a JSON object, or the JSON text itself.
    plugin_config: serde_json::Value,
    #[serde(default)]
    instances: Option<usize>,
    #[serde(default)]
    max_streams: Option<usize>,
    #[serde(default)]
    log_level: Option<String>,
    /// Upstreams the module may call out to (`dispatch_http_call`), by cluster name.
    #[serde(default)]
    clusters: BTreeMap<String, ClusterFile>,
    /// Callouts waiting for an answer, per instance.
    #[serde(default)]
    max_calls_in_flight: Option<usize>,
    /// Bytes of one callout answer (head and body); a longer one fails the call.
    #[serde(default)]
    max_callout_response_bytes: Option<usize>,
    /// `HOST:PORT` of the Prometheus endpoint (`--metrics` overrides it).
    #[serde(default)]
    metrics: Option<String>,
    /// `HOST:PORT` of the no-backend listener (`sink.rs`): every HTTP request there is answered
    /// 503, never forwarded.
    #[serde(default)]
    no_backend_listen: Option<String>,
    /// Answer as an Inference Extension endpoint picker (see `epp.rs`).
    #[serde(default)]
    endpoint_picker: Option<crate::epp::SettingsFile>,
    /// Deadline for the next message while a request is incomplete.
    #[serde(default)]
    stream_idle_timeout_ms: Option<u64>,
    /// Deadline for a whole request, from its stream's start to its decision.
    #[serde(default)]
    request_timeout_ms: Option<u64>,
    /// Streams whose request is incomplete; the other slots stay for complete ones.
    #[serde(default)]
    max_uploading_streams: Option<usize>,
    /// Request bytes held across all streams.
    #[serde(default)]
    memory_budget_bytes: Option<usize>,
    /// How long SIGTERM waits for the streams in flight.
    #[serde(default)]
    drain_timeout_ms: Option<u64>,
    /// The gateway's limit on request headers (Envoy's `max_request_headers_count`).
    #[serde(default)]
    max_request_headers: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    /// `HOST:PORT`, plain HTTP/1.1 (or HTTP/2 for `kind: grpc`).
    address: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
    /// `http` (the default: `dispatch_http_call`) or `grpc` (`dispatch_grpc_call`).
    #[serde(default)]
    kind: ClusterKind,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum ClusterKind {
    #[default]
    Http,
    Grpc,
}

/// A callout upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub address: String,
    /// An upper bound on every call's timeout (the module's own may be shorter).
    pub timeout: Duration,
    /// Takes gRPC calls (`kind: grpc`) instead of http calls.
    pub grpc: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModuleRef {
    /// Relative paths are taken from the config file's directory.
    path: PathBuf,
    sha256: String,
}

/// Deadlines of the request side of a stream (the response side is the gateway's: its route
/// timeout bounds the upstream, and it ends the stream).
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// For the next message while the request is incomplete.
    pub idle: Duration,
    /// For the whole request, from the stream's start to its decision.
    pub request: Duration,
}

/// A checked configuration, with the module's bytes already read and verified.
#[derive(Debug)]
pub struct Config {
    pub module_path: PathBuf,
    pub wasm: Vec<u8>,
    pub root_id: String,
    pub vm_id: String,
    pub plugin_config: Vec<u8>,
    /// The filter's own body limit (`max_body_bytes` of the plugin config): per-stream memory.
    pub max_body_bytes: usize,
    pub instances: usize,
    pub max_streams: usize,
    pub log_level: llmkube_wasm_runtime::LogLevel,
    pub clusters: BTreeMap<String, Cluster>,
    pub max_calls_in_flight: usize,
    pub max_callout_response_bytes: usize,
    pub metrics: Option<SocketAddr>,
    pub no_backend_listen: Option<SocketAddr>,
    pub endpoint_picker: Option<crate::epp::Settings>,
    pub deadlines: Deadlines,
    pub max_uploading_streams: usize,
    pub memory_budget_bytes: usize,
    pub drain_timeout: Duration,
    pub max_request_headers: usize,
}

/// A callout's timeout when its cluster names none.
const DEFAULT_CALLOUT_TIMEOUT_MS: u64 = 5_000;
const DEFAULT_MAX_CALLS_IN_FLIGHT: usize = 256;
const DEFAULT_MAX_CALLOUT_RESPONSE_BYTES: usize = 1 << 20;

pub const DEFAULT_STREAM_IDLE_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 25_000;

/// What the Envoy target's plugin config says when it says nothing (8 MiB).
const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// The per-attempt module runs once per upstream attempt, after the gateway chose the backend.
/// ext_proc sees the downstream request once, before routing, so the module's model rewrite and
/// credential guard would run for the first choice only, not for a fallback: refuse it rather
/// than serve that weaker guarantee.
const PER_ATTEMPT_ROOT_ID: &str = "upstream";

pub fn load(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config {}", path.display()))?;
    let file: File = serde_norway::from_str(&text)
        .with_context(|| format!("config {}: not the expected YAML/JSON", path.display()))?;
    let (module_path, wasm) = pinned_module(&file, path.parent().unwrap_or(Path::new(".")))?;
    let (plugin_config, max_body_bytes) = plugin_config(&file.plugin_config)?;
    let instances = file
        .instances
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().max(2)));
    if instances == 0 || instances > 256 {
        bail!("instances: {instances} is not between 1 and 256");
    }
    let max_streams = file.max_streams.unwrap_or(1024);
    if max_streams == 0 {
        bail!("max_streams: must be at least 1");
    }
    let log_level = parse_level(file.log_level.as_deref().unwrap_or("info"))?;
    let clusters = clusters(file.clusters)?;
    let max_calls_in_flight = file
        .max_calls_in_flight
        .unwrap_or(DEFAULT_MAX_CALLS_IN_FLIGHT);
    if max_calls_in_flight == 0 {
        bail!("max_calls_in_flight: must be at least 1");
    }
    let max_callout_response_bytes = file
        .max_callout_response_bytes
        .unwrap_or(DEFAULT_MAX_CALLOUT_RESPONSE_BYTES);
    let deadlines = Deadlines {
        idle: millis(
            "stream_idle_timeout_ms",
            file.stream_idle_timeout_ms,
            DEFAULT_STREAM_IDLE_TIMEOUT_MS,
        )?,
        request: millis(
            "request_timeout_ms",
            file.request_timeout_ms,
            DEFAULT_REQUEST_TIMEOUT_MS,
        )?,
    };
    let drain_timeout = millis(
        "drain_timeout_ms",
        file.drain_timeout_ms,
        DEFAULT_DRAIN_TIMEOUT_MS,
    )?;
    // A quarter of the slots stay for streams whose request is complete.
    let max_uploading_streams = file
        .max_uploading_streams
        .unwrap_or((max_streams - max_streams / 4).max(1));
    if max_uploading_streams == 0 || max_uploading_streams > max_streams {
        bail!("max_uploading_streams: {max_uploading_streams} is not between 1 and max_streams ({max_streams})");
    }
    let memory_budget_bytes = file
        .memory_budget_bytes
        .unwrap_or_else(crate::admission::default_memory_budget);
    if memory_budget_bytes <= max_body_bytes {
        bail!(
            "memory_budget_bytes: {memory_budget_bytes} cannot hold one request of plugin_config.max_body_bytes ({max_body_bytes}) and a byte"
        );
    }
    let metrics = socket("metrics", file.metrics.as_deref())?;
    let no_backend_listen = socket("no_backend_listen", file.no_backend_listen.as_deref())?;
    Ok(Config {
        module_path,
        wasm,
        root_id: file.root_id,
        vm_id: file.vm_id,
        plugin_config,
        max_body_bytes,
        instances,
        max_streams,
        log_level,
        clusters,
        max_calls_in_flight,
        max_callout_response_bytes,
        metrics,
        no_backend_listen,
        endpoint_picker: file.endpoint_picker.map(crate::epp::SettingsFile::settings),
        deadlines,
        max_uploading_streams,
        memory_budget_bytes,
        drain_timeout,
        max_request_headers: file.max_request_headers.unwrap_or(100),
    })
}

/// The module `file` names (relative to the config's folder `base`), checked against the
/// sha256 the config pins; the per-attempt module is refused.
fn pinned_module(file: &File, base: &Path) -> anyhow::Result<(PathBuf, Vec<u8>)> {
    let module_path = base.join(&file.module.path);
    let wasm = std::fs::read(&module_path)
        .with_context(|| format!("module.path: reading {}", module_path.display()))?;
    let actual = hex(&Sha256::digest(&wasm));
    let expected = file.module.sha256.trim().to_ascii_lowercase();
    if actual != expected {
        bail!(
            "module.sha256: {} has sha256 {actual}, the config pins {expected}",
            module_path.display()
        );
    }
    if file.root_id == PER_ATTEMPT_ROOT_ID {
        bail!(
            "root_id: the per-attempt module (root_id {PER_ATTEMPT_ROOT_ID}) cannot run behind ext_proc: \
             ext_proc sees a request once, before routing, not once per upstream attempt, so a \
             fallback attempt would get neither its model rewrite nor its credential guard; run it \
             in the gateway's per-attempt filters instead"
        );
    }
    Ok((module_path, wasm))
}

/// The plugin configuration's bytes as the module receives them, and its request body limit.
fn plugin_config(value: &serde_json::Value) -> anyhow::Result<(Vec<u8>, usize)> {
    let bytes = match value {
        serde_json::Value::String(s) => s.clone().into_bytes(),
        other => serde_json::to_vec(other)?,
    };
    let parsed: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| anyhow!("plugin_config: not JSON: {e}"))?;
    let max_body_bytes = match parsed.get("max_body_bytes") {
        None => DEFAULT_MAX_BODY_BYTES,
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| anyhow!("plugin_config.max_body_bytes: not a byte count"))?,
    };
    Ok((bytes, max_body_bytes))
}

/// The callout clusters, each address `HOST:PORT` and each timeout at least 1 ms.
fn clusters(files: BTreeMap<String, ClusterFile>) -> anyhow::Result<BTreeMap<String, Cluster>> {
    let mut clusters = BTreeMap::new();
    for (name, c) in files {
        if c.address.parse::<SocketAddr>().is_err() && !c.address.contains(':') {
            bail!("clusters.{name}.address: {:?} is not HOST:PORT", c.address);
        }
        let timeout = millis(
            &format!("clusters.{name}.timeout_ms"),
            c.timeout_ms,
            DEFAULT_CALLOUT_TIMEOUT_MS,
        )?;
        clusters.insert(
            name,
            Cluster {
                address: c.address,
                timeout,
                grpc: c.kind == ClusterKind::Grpc,
            },
        );
    }
    Ok(clusters)
}

/// A duration field in milliseconds, `default` when absent; 0 is refused.
fn millis(field: &str, v: Option<u64>, default: u64) -> anyhow::Result<Duration> {
    let ms = v.unwrap_or(default);
    if ms == 0 {
        bail!("{field}: must be at least 1");
    }
    Ok(Duration::from_millis(ms))
}

/// A listen address field, when given.
fn socket(field: &str, v: Option<&str>) -> anyhow::Result<Option<SocketAddr>> {
    v.map(|m| {
        m.parse::<SocketAddr>()
            .map_err(|e| anyhow!("{field}: {m:?} is not HOST:PORT ({e})"))
    })
    .transpose()
}

fn parse_level(s: &str) -> anyhow::Result<llmkube_wasm_runtime::LogLevel> {
    use llmkube_wasm_runtime::LogLevel::*;
    Ok(match s {
        "trace" => Trace,
        "debug" => Debug,
        "info" => Info,
        "warn" | "warning" => Warn,
        "error" => Error,
        "critical" => Critical,
        other => {
            bail!("log_level: {other:?} is not one of trace, debug, info, warn, error, critical")
        }
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ext-proc-config-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const WAT: &str = "(module)";

    #[test]
    fn a_module_whose_digest_differs_is_refused_naming_both() {
        let d = tmp();
        write(&d, "m.wat", WAT);
        let cfg = write(
            &d,
            "c.yaml",
            "module: {path: m.wat, sha256: 00}\nroot_id: model-router\nplugin_config: {}\n",
        );
        let err = format!("{:#}", load(&cfg).unwrap_err());
        assert!(
            err.contains("module.sha256") && err.contains(&hex(&Sha256::digest(WAT))),
            "{err}"
        );
    }

    #[test]
    fn json_config_loads_with_the_filter_body_limit() {
        let d = tmp();
        write(&d, "m.wat", WAT);
        let sha = hex(&Sha256::digest(WAT));
        let cfg = write(
            &d,
            "c.json",
            &format!(
                r#"{{"module": {{"path": "m.wat", "sha256": "{sha}"}}, "root_id": "model-router",
                    "plugin_config": "{{\"max_body_bytes\": 4096}}", "instances": 2}}"#
            ),
        );
        let c = load(&cfg).unwrap();
        assert_eq!(
            (c.max_body_bytes, c.instances, c.max_streams),
            (4096, 2, 1024)
        );
        assert_eq!(c.plugin_config, br#"{"max_body_bytes": 4096}"#);
    }

    #[test]
    fn clusters_and_the_metrics_port_are_read_with_their_bounds() {
        let d = tmp();
        write(&d, "m.wat", WAT);
        let sha = hex(&Sha256::digest(WAT));
        let cfg = write(
            &d,
            "k.yaml",
            &format!(
                "module: {{path: m.wat, sha256: {sha}}}\nroot_id: r\nplugin_config: {{}}\n\
                 clusters: {{budgets: {{address: '127.0.0.1:9000', timeout_ms: 250}}, vllm: {{address: 'vllm:8000'}}}}\n\
                 max_calls_in_flight: 8\nmetrics: '127.0.0.1:9100'\n"
            ),
        );
        let c = load(&cfg).unwrap();
        assert_eq!(
            c.clusters["budgets"],
            Cluster {
                address: "127.0.0.1:9000".into(),
                timeout: Duration::from_millis(250),
                grpc: false,
            }
        );
        assert_eq!(c.clusters["vllm"].timeout, Duration::from_secs(5));
        assert_eq!(c.max_calls_in_flight, 8);
        assert_eq!(c.metrics, Some("127.0.0.1:9100".parse().unwrap()));
        let bad = write(
            &d,
            "b.yaml",
            &format!(
                "module: {{path: m.wat, sha256: {sha}}}\nroot_id: r\nplugin_config: {{}}\n\
                 clusters: {{x: {{address: nowhere}}}}\n"
            ),
        );
        let err = format!("{:#}", load(&bad).unwrap_err());
        assert!(err.contains("clusters.x.address"), "{err}");
    }

    #[test]
    fn the_per_attempt_module_is_refused_with_the_reason() {
        let d = tmp();
        write(&d, "m.wat", WAT);
        let sha = hex(&Sha256::digest(WAT));
        let cfg = write(
            &d,
            "c.yaml",
            &format!(
                "module: {{path: m.wat, sha256: {sha}}}\nroot_id: upstream\nplugin_config: {{}}\n"
            ),
        );
        let err = format!("{:#}", load(&cfg).unwrap_err());
        assert!(err.contains("per upstream attempt"), "{err}");
    }
}
