//! The `env.proxy_*` hostcalls (proxy-wasm ABI 0.2.1), with Envoy's answers: one module per
//! family of hostcalls, each registering its own.
//!
//! Any guest input problem (bad pointer, bad enum) becomes a status code, never a host panic.

mod buffers;
mod context;
pub(crate) mod grpc;
mod guest_metrics;
pub(crate) mod header_maps;
pub(crate) mod http_call;
mod plugin_env;
mod properties;
mod shared_data;
mod stream;

use crate::state::HostState;
use wasmtime::Linker;

pub(crate) fn add_to_linker(l: &mut Linker<HostState>) -> anyhow::Result<()> {
    plugin_env::add_to_linker(l)?;
    buffers::add_to_linker(l)?;
    header_maps::add_to_linker(l)?;
    properties::add_to_linker(l)?;
    shared_data::add_to_linker(l)?;
    stream::add_to_linker(l)?;
    http_call::add_to_linker(l)?;
    grpc::add_to_linker(l)?;
    context::add_to_linker(l)?;
    guest_metrics::add_to_linker(l)
}
