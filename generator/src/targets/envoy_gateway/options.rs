//! The options of `compile --target envoy-gateway`.

use std::path::PathBuf;

use super::budgets;
use crate::ir::CompileOptions;

/// The Gateway listener the policies patch when `--gateway-listener` is not given.
pub const DEFAULT_LISTENER: &str = "http";

/// Where Envoy Gateway fetches the model-router module from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WasmSource {
    /// `--wasm-url`: served over HTTP(S).
    Http(String),
    /// `--wasm-image`: an OCI image.
    Image(String),
}

/// Options of `compile --target envoy-gateway`.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    pub common: CompileOptions,
    pub wasm: WasmSource,
    /// `--wasm-sha256`; otherwise computed from `<wasm_dir>/llmkube_model_router.wasm`.
    pub wasm_sha256: Option<String>,
    pub wasm_dir: PathBuf,
    /// `--gateway-listener`: the Gateway listener (sectionName) serving the router.
    pub listener: String,
    /// `--budgets-service` / `--budgets-redis-secret` + `--budgets-image`: budgets kept by
    /// `llmkube-budgets`; `None`: in each Envoy's shared data.
    pub budgets: Option<budgets::BudgetsService>,
}

impl GatewayOptions {
    pub fn new(wasm: WasmSource) -> Self {
        GatewayOptions {
            common: CompileOptions::default(),
            wasm,
            wasm_sha256: None,
            wasm_dir: crate::targets::module::default_wasm_dir(),
            listener: DEFAULT_LISTENER.to_string(),
            budgets: None,
        }
    }
}
