//! Filter entries of the bootstrap: the wasm filters and the per-attempt upstream chain.

use std::path::Path;
use std::time::Duration;

use router_core::headers::ATTEMPT_BACKEND_HEADER;
use serde_json::{json, Value};

use super::names::secret_name;
use crate::duration::envoy_duration;
use crate::ir::Backend;
use crate::targets::xds::typed;

pub(super) fn dur_ms(ms: u64) -> String {
    envoy_duration(Duration::from_millis(ms))
}

/// The wasm filter entry (downstream model-router or upstream), same plugin config JSON.
pub(super) fn wasm_filter(
    name: &str,
    root_id: &str,
    vm_id: &str,
    file: &Path,
    plugin_json: &str,
) -> Value {
    let mut tc = typed("envoy.extensions.filters.http.wasm.v3.Wasm");
    tc["config"] = json!({
        "name": name,
        "root_id": root_id,
        "allow_on_headers_stop_iteration": true,
        "fail_open": false,
        "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": plugin_json},
        "vm_config": {
            "vm_id": vm_id,
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": file.to_string_lossy()}},
        },
    });
    json!({"name": "envoy.filters.http.wasm", "typed_config": tc})
}

/// The upstream HTTP filter chain of a cluster that can send to an external backend: the upstream
/// wasm (per-attempt guard, model rewrite, `x-llmkube-attempt-backend`), one credential injector
/// per external backend with a credential (runs only when the attempt goes to that backend), the
/// removal of the marker header, the codec.
pub(super) fn upstream_chain(externals: &[&Backend], wasm: &Path, plugin_json: &str) -> Value {
    let mut filters = vec![wasm_filter(
        "llmkube-upstream",
        "upstream",
        "llmkube-upstream",
        wasm,
        plugin_json,
    )];
    for b in externals {
        let Some(cred) = b.external().and_then(|e| e.credential.as_ref()) else {
            continue;
        };
        let name = b.name.as_str();
        let mut generic = typed("envoy.extensions.http.injected_credentials.generic.v3.Generic");
        generic["credential"] = json!({"name": secret_name(name)});
        generic["header"] = json!(cred.header);
        let mut injector =
            typed("envoy.extensions.filters.http.credential_injector.v3.CredentialInjector");
        injector["overwrite"] = json!(true);
        injector["credential"] =
            json!({"name": "envoy.http.injected_credentials.generic", "typed_config": generic});
        let mut input = typed("envoy.type.matcher.v3.HttpRequestHeaderMatchInput");
        input["header_name"] = json!(ATTEMPT_BACKEND_HEADER);
        let mut wrapped = typed("envoy.extensions.common.matching.v3.ExtensionWithMatcher");
        wrapped["extension_config"] =
            json!({"name": "envoy.filters.http.credential_injector", "typed_config": injector});
        wrapped["xds_matcher"] = json!({"matcher_list": {"matchers": [{
            "predicate": {"not_matcher": {"single_predicate": {
                "input": {"name": "attempt-backend", "typed_config": input},
                "value_match": {"exact": name},
            }}},
            "on_match": {"action": {"name": "skip", "typed_config": typed("envoy.extensions.filters.common.matcher.action.v3.SkipFilter")}},
        }]}});
        filters.push(json!({"name": secret_name(name), "typed_config": wrapped}));
    }
    let mut hm = typed("envoy.extensions.filters.http.header_mutation.v3.HeaderMutation");
    hm["mutations"] = json!({"request_mutations": [{"remove": ATTEMPT_BACKEND_HEADER}]});
    filters.push(json!({"name": "envoy.filters.http.header_mutation", "typed_config": hm}));
    filters.push(json!({"name": "envoy.filters.http.upstream_codec", "typed_config": typed("envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec")}));
    let mut opts = typed("envoy.extensions.upstreams.http.v3.HttpProtocolOptions");
    opts["explicit_http_config"] = json!({"http_protocol_options": {}});
    opts["http_filters"] = Value::Array(filters);
    json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts})
}
