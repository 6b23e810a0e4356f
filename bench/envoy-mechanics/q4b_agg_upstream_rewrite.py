"""Q4b: ONE upstream wasm filter on the aggregate cluster rewrites the body per attempt using the
selected endpoint's metadata (llmkube.backend). Does attempt 2 see attempt 1's body/header edits?
Also: credential_injector selected per attempt with ExtensionWithMatcher on a header the wasm sets."""
from xp import *

SECRET_FILE = f"{RUN}/secret-b.json"
json.dump({"resources": [{"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
                          "name": "b-key", "generic_secret": {"secret": {"inline_string": "Bearer sk-B-SECRET"}}}]},
          open(SECRET_FILE, "w"))
CRED_B = {"@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
          "overwrite": True,
          "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
              "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
              "credential": {"name": "b-key", "sds_config": {"path_config_source": {"path": SECRET_FILE}}}}}}
# run the credential injector only when the per-attempt wasm marked the attempt as going to backend b
CRED_B_MATCHED = {"name": "cred-b", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher",
    "extension_config": {"name": "envoy.filters.http.credential_injector", "typed_config": CRED_B},
    "xds_matcher": {"matcher_tree": {
        "input": {"name": "h", "typed_config": {"@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                                                "header_name": "x-probe-mark-b"}},
        "exact_match_map": {"map": {"1": {"action": {"name": "skip", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"}}}}}},
        # matcher semantics: a matched SkipFilter skips; so invert: skip when the header is absent
    }}}
# skip the credential injector unless this attempt was marked as going to backend b
CRED_B_MATCHED["typed_config"]["xds_matcher"] = {"matcher_list": {"matchers": [{
    "predicate": {"not_matcher": {"single_predicate": {
        "input": {"name": "h", "typed_config": {"@type": "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
                                                "header_name": "x-probe-mark-b"}},
        "value_match": {"exact": "1"}}}},
    "on_match": {"action": {"name": "skip", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter"}}}}]}}

try:
    mock("a"); mock("b")
    agg = aggregate("agg", ["a", "b"])
    agg["typed_extension_protocol_options"] = upstream_filters([
        wasm_filter(PROBE_WASM, "tag=uagg;mark=1;rewrite_model=@append;fix_cl=1", name="uagg"), CRED_B_MATCHED])
    envoy(bootstrap([dict(route("agg", retry_policy=RETRY), request_headers_to_remove=["authorization"])],
                    [cluster("a"), cluster("b"), agg]), 371)
    for label, hdr in [("a serves", {}), ("a=503 → b", {"x-mode-a": "503"})]:
        reset_hits("a", "b")
        st, h, body, t = req(headers=hdr)
        print(f"[{label}] status={st} served_by={h.get('x-served-by')}")
        for n in ("a", "b"):
            for x in hits(n):
                print(f"   {n} got model={json.loads(x['body'])['model']!r} cl={x['headers'].get('content-length')} len={len(x['body'])}",
                      {k: v for k, v in x["headers"].items() if k.startswith(("x-probe-mark", "authorization"))})
    print("stats:", {k: v for k, v in stats(r"credential_injector|wasm").items() if v != "0"})
finally:
    stop_all()
