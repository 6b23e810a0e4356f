"""Q4/Q5/Q6: upstream HTTP filters (wasm, header_mutation, credential_injector) on backend clusters
under an aggregate; which cluster/host the filters see; secrets in config_dump and access logs."""
import sys
from xp import *

SECRET_FILE = f"{RUN}/secret-openai.json"
json.dump({"resources": [{"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
                          "name": "openai-key",
                          "generic_secret": {"secret": {"inline_string": "Bearer sk-SECRET-from-sds-file"}}}]},
          open(SECRET_FILE, "w"))

HEADER_MUTATION = {"name": "envoy.filters.http.header_mutation", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
    "mutations": {"request_mutations": [
        {"remove": "authorization"},
        {"append": {"header": {"key": "anthropic-version", "value": "2023-06-01"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}}}
CRED = {"name": "envoy.filters.http.credential_injector", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
    "overwrite": True,
    "credential": {"name": "envoy.http.injected_credentials.generic", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
        "credential": {"name": "openai-key", "sds_config": {"path_config_source": {"path": SECRET_FILE}}},
        "header": "authorization"}}}}
CRED_STATIC = json.loads(json.dumps(CRED))
CRED_STATIC["typed_config"]["credential"]["typed_config"]["credential"] = {"name": "static-key"}
CRED_STATIC["typed_config"]["credential"]["typed_config"]["header"] = "x-api-key"

variant = sys.argv[1] if len(sys.argv) > 1 else "main"
B_EXTRA = {"direct-drop": ";drop_cl=1", "direct-fix": ";fix_cl=1"}.get(variant, "")


def cfg():
    a = cluster("a", typed_extension_protocol_options=upstream_filters([HEADER_MUTATION, CRED, CRED_STATIC]))
    b = cluster("b", typed_extension_protocol_options=upstream_filters([
        wasm_filter(PROBE_WASM, "tag=ub;props=1;rewrite_model=gpt-4o-cloud;set_req=authorization:Bearer sk-from-wasm" + B_EXTRA, name="ub")]))
    agg = aggregate("agg", ["a", "b"])
    if variant == "agg-upstream":
        agg["typed_extension_protocol_options"] = upstream_filters([wasm_filter(PROBE_WASM, "tag=uagg;props=1", name="uagg")])
    routes = [dict(route("agg", retry_policy=RETRY), request_headers_to_remove=["authorization"])]
    if variant.startswith("direct"):   # no aggregate: route straight to a (or to b when a answered 503 → retried on b? no: same cluster)
        routes = [dict(route("a"), match={"prefix": "/", "headers": [{"name": "x-direct", "string_match": {"exact": "a"}}]},
                       request_headers_to_remove=["authorization"]),
                  dict(route("b"), request_headers_to_remove=["authorization"])]
    extra = {"static_resources": None}
    b_ = bootstrap(routes, [a, b, agg], [wasm_filter(PROBE_WASM, "tag=d;props=1", name="d")])
    b_["static_resources"]["secrets"] = [{"name": "static-key", "generic_secret": {"secret": {"inline_string": "sk-ant-STATIC-inline"}}}]
    return b_


def upstream_view(name):
    h = hits(name)[-1]
    try:
        model = json.loads(h["body"]).get("model")
    except ValueError:
        model = "INVALID JSON: " + h["body"][:40] + "..." + h["body"][-12:]
    return {"model_in_body": model, "content-length": h["headers"].get("content-length"),
            "transfer-encoding": h["headers"].get("transfer-encoding"),
            "body_len": len(h["body"]),
            **{k: v for k, v in h["headers"].items() if k.startswith(("x-probe-u", "authorization", "x-api-key", "anthropic-version"))}}


try:
    mock("a"); mock("b")
    envoy(cfg(), {"main": 361, "agg-upstream": 362, "direct": 363, "direct-drop": 364, "direct-fix": 365}[variant])
    cases = [("a serves", {}), ("a=503 → b serves", {"x-mode-a": "503"})]
    if variant.startswith("direct"):
        cases = [("route→a directly", {"x-direct": "a"}), ("route→b directly", {})]
    for label, hdr in cases:
        reset_hits("a", "b")
        st, h, body, t = req(headers=dict(hdr, authorization="Bearer CLIENT-TOKEN"),
                             body={"model": "m-local", "messages": [{"role": "user", "content": "hi " * 50}]})
        print(f"[{label}] status={st} served_by={h.get('x-served-by')}")
        for n in ("a", "b"):
            if hits(n):
                print(f"   {n} received:", json.dumps(upstream_view(n), indent=None))
        print("   response headers:", {k: v for k, v in h.items() if k.startswith("x-probe")})
    dump = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/config_dump?include_eds", timeout=5).read().decode()
    print("config_dump contains sk-SECRET:", "sk-SECRET" in dump, "| sk-ant-STATIC:", "sk-ant-STATIC" in dump,
          "| sk-from-wasm (wasm plugin config):", "sk-from-wasm" in dump, "| [redacted] count:", dump.count("[redacted]"))
    print("stats credential_injector:", {k: v for k, v in stats(r"credential_injector").items()})
    for l in access_log(): print("   ", l)
finally:
    stop_all()
