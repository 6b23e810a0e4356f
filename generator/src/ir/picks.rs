//! Backends whose pods the filter picks (`resolution: endpoint` with `balancing.mode:
//! LoadAware`), and the plugin config that carries their pods and balancing. Every target
//! renders them: the Envoy targets as `ORIGINAL_DST` clusters, agentgateway through
//! `llmkube-ext-proc`.

use router_core::pick::wire::{PickConfig, PrefixWire, SessionWire, DEFAULT_SCRAPE_MS};

use super::callout_clusters::backend_cluster;
use super::{BackendKind, Ir};
use crate::duration::parse_duration;
use crate::model::{BalancingMode, Resolution};

/// Whether the filter picks backend `i`'s pods.
pub fn is_picked(ir: &Ir, i: usize) -> bool {
    let endpoint = matches!(
        ir.backends[i].kind,
        BackendKind::Service {
            resolution: Resolution::Endpoint,
            ..
        }
    );
    let load_aware = ir.router.spec.backends[i]
        .balancing
        .as_ref()
        .is_some_and(|b| b.mode == Some(BalancingMode::LoadAware));
    endpoint && load_aware
}

/// The plugin config with each picked backend's pods and balancing.
pub fn plugin_json(ir: &Ir) -> String {
    let plugin = plugin_with_picks(ir, &|b| backend_cluster(b));
    serde_json::to_string(&plugin).unwrap_or_else(|_| ir.plugin_json.clone())
}

/// The plugin config with each picked backend's pods and balancing; a vLLM backend's metrics
/// are scraped through `cluster(backend name)`, its `ORIGINAL_DST` cluster.
pub fn plugin_with_picks(
    ir: &Ir,
    cluster: &dyn Fn(&str) -> String,
) -> router_core::config::PluginConfig {
    let mut plugin = ir.plugin.clone();
    for (i, b) in ir.backends.iter().enumerate() {
        if !is_picked(ir, i) {
            continue;
        }
        let Some(bal) = ir.router.spec.backends[i].balancing.as_ref() else {
            continue;
        };
        let vllm = b.vllm;
        plugin.backends[i].pick = Some(PickConfig {
            endpoints: b
                .endpoints
                .iter()
                .map(|(h, p)| format!("{h}:{p}"))
                .collect(),
            mode: router_core::pick::Mode::LoadAware,
            prefix_affinity: bal.prefix_affinity.as_ref().map(|p| PrefixWire {
                block_bytes: p.block_bytes.and_then(|v| u64::try_from(v).ok()),
                max_blocks_per_endpoint: p
                    .max_blocks_per_endpoint
                    .and_then(|v| u64::try_from(v).ok()),
            }),
            session_affinity: bal.session_affinity.as_ref().map(|s| SessionWire {
                headers: s.headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
                idle_ms: s
                    .idle_timeout
                    .as_deref()
                    .and_then(|t| parse_duration(t).ok())
                    .map(|d| d.as_millis().min(u64::MAX as u128) as u64),
            }),
            scrape_cluster: vllm.then(|| cluster(&b.name)),
            scrape_ms: vllm.then_some(DEFAULT_SCRAPE_MS),
            // No CRD field: the defaults (tests and experiments set it in the plugin config).
            bounds: None,
        });
    }
    plugin
}
