//! How a VM is configured: Envoy's `vm_config` and plugin `config`, what the embedder supplies
//! and the bounds on what the VM may hold.

use crate::embedder::{
    Callouts, Clock, DiscardLogs, HttpCallRecord, HttpCallReply, LogSink, SystemClock,
};
use crate::shared::SharedStore;
use crate::types::LogLevel;
use std::collections::HashMap;
use std::sync::Arc;

/// How the VM and plugin are configured, mirroring Envoy's `vm_config` / plugin `config`, plus
/// what the embedder supplies.
#[derive(Clone)]
pub struct VmOptions {
    pub vm_id: String,
    pub root_id: String,
    pub vm_configuration: Vec<u8>,
    pub plugin_configuration: Vec<u8>,
    /// Envoy's `allow_on_headers_stop_iteration` (>= 1.35). Off by default, as in Envoy.
    pub allow_on_headers_stop_iteration: bool,
    /// Properties by path (`["request","path"]`, `["xds","cluster_name"]`, ...). Request/response
    /// properties not set here are derived from the stream's headers. A guest's
    /// `proxy_set_property` adds to them, up to [`MAX_GUEST_PROPERTIES`] entries.
    pub properties: HashMap<Vec<String>, Vec<u8>>,
    /// Answers `proxy_http_call`s; without it calls stay pending until answered or timed out.
    pub callouts: Option<Arc<dyn Callouts>>,
    /// If set, `proxy_http_call` to any other cluster fails with BadArgument, as Envoy does
    /// for unknown clusters.
    pub known_clusters: Option<Vec<String>>,
    /// What `proxy_get_log_level` reports. Envoy's default is Info; tests want everything.
    pub log_level: LogLevel,
    pub log_sink: Arc<dyn LogSink>,
    pub clock: Arc<dyn Clock>,
    /// Share with another VM to model two Envoy workers of the same plugin.
    pub shared: SharedStore,
    /// Environment variables visible through WASI (Envoy's `vm_config.environment_variables`).
    pub environment: Vec<(String, String)>,
    /// Seed of WASI `random_get` (fixed seeds replay identically); `None` seeds from the OS.
    pub random_seed: Option<u64>,
    pub limits: Limits,
}

/// Properties a guest may add with `proxy_set_property` beyond those configured.
pub const MAX_GUEST_PROPERTIES: usize = 1024;

/// Bounds on what one VM may hold, whatever the guest or its traffic does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open HTTP stream contexts; [`crate::Vm::new_http_stream`] refuses more.
    pub max_streams: usize,
    /// Bytes one direction of a stream may hold (the body the filter buffers plus the data held
    /// while it stopped iteration). Beyond it the host answers 413 itself, as Envoy does when a
    /// buffering filter exceeds its buffer limit, and the filter sees no more of the stream.
    pub max_buffered_body: usize,
    /// `proxy_http_call`s waiting for an answer; more fail with InternalFailure.
    pub max_pending_calls: usize,
    /// Distinct metrics a guest may define; more fail with InternalFailure.
    pub max_metrics: usize,
    /// Recent histogram values kept per histogram (count and sum cover all of them).
    pub histogram_samples: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 4096,
            max_buffered_body: 32 << 20,
            max_pending_calls: 1024,
            max_metrics: 1024,
            histogram_samples: 1024,
        }
    }
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            vm_id: String::new(),
            root_id: String::new(),
            vm_configuration: Vec::new(),
            plugin_configuration: Vec::new(),
            allow_on_headers_stop_iteration: false,
            properties: HashMap::new(),
            callouts: None,
            known_clusters: None,
            log_level: LogLevel::Trace,
            log_sink: Arc::new(DiscardLogs),
            clock: Arc::new(SystemClock),
            shared: SharedStore::new(),
            environment: Vec::new(),
            random_seed: None,
            limits: Limits::default(),
        }
    }
}

impl VmOptions {
    pub fn with_plugin_config(mut self, config: impl Into<Vec<u8>>) -> Self {
        self.plugin_configuration = config.into();
        self
    }
    pub fn allow_stop_iteration(mut self, allow: bool) -> Self {
        self.allow_on_headers_stop_iteration = allow;
        self
    }
    pub fn with_property(mut self, path: &[&str], value: impl Into<Vec<u8>>) -> Self {
        self.properties
            .insert(path.iter().map(|s| s.to_string()).collect(), value.into());
        self
    }
    pub fn with_shared(mut self, shared: &SharedStore) -> Self {
        self.shared = shared.clone();
        self
    }
    pub fn with_responder(
        mut self,
        f: impl Fn(&HttpCallRecord) -> Option<HttpCallReply> + Send + Sync + 'static,
    ) -> Self {
        self.callouts = Some(Arc::new(f));
        self
    }
}
