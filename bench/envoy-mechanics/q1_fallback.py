"""Q1: primary-fallback with an aggregate cluster + retry_priority previous_priorities."""
from xp import *

LR = {"mappers": [{
    # Only Envoy's own upstream-failure replies (not direct_response, not wasm local replies):
    "filter": {"response_flag_filter": {"flags": ["UF", "URX", "UH", "UO", "UT", "UC", "UR", "UMSDR"]}},
    "status_code": 502,
    "headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    "body_format_override": {"json_format": {"error": {"message": "all backends failed: %RESPONSE_CODE_DETAILS%",
                                                       "type": "server_error", "param": None, "code": "all_backends_failed"}},
                             "content_type": "application/json"}}]}


def cfg(a_port=None, with_lr=False, with_probe=False):
    routes = [{"match": {"prefix": "/direct"}, "direct_response": {"status": 503, "body": {"inline_string": "{\"error\":{\"code\":\"fail_closed\"}}"}}},
              route("agg", retry_policy=RETRY)]
    clusters = [cluster("a", a_port or PORTS["a"]), cluster("b"), aggregate("agg", ["a", "b"])]
    filters = [wasm_filter(PROBE_WASM, "tag=d;local=502")] if with_probe else []
    return bootstrap(routes, clusters, filters, hcm_extra={"local_reply_config": LR} if with_lr else None)


try:
    mock("a"); mock("b")
    envoy(cfg(), 311)
    print("[plain aggregate a,b; retry 5xx,reset,connect-failure,refused-stream; previous_priorities]")
    for label, h in [("both ok", {}), ("a=503", {"x-mode-a": "503"}), ("a=500", {"x-mode-a": "500"}),
                     ("a=400", {"x-mode-a": "400"}), ("a=429", {"x-mode-a": "429"}),
                     ("a=close(reset)", {"x-mode-a": "close"}), ("a=503,b=500", {"x-mode-a": "503", "x-mode-b": "500"}),
                     ("a=503,b=503 x3", {"x-mode-a": "503", "x-mode-b": "503"})]:
        reset_hits("a", "b")
        show(label, req(headers=h))
        print(f"     hits a={len(hits('a'))} b={len(hits('b'))} attempt-count-at-b={[x['headers'].get('x-envoy-attempt-count') for x in hits('b')]}")
    print("  access log:"); [print("    " + l) for l in access_log()]
    print("  stats:", stats(r"cluster\.(a|b|agg)\.(upstream_rq_retry|upstream_rq_5|upstream_rq_4|retry_or_shadow|upstream_cx_connect_fail|upstream_rq_retry_success)"))
    stop_all()

    print("[a points at a dead port (refused)]")
    mock("b"); envoy(cfg(a_port=PORTS["dead"]), 312)
    show("a refused", req())
    show("a refused, b=500", req(headers={"x-mode-b": "500"}))
    print("  access log:"); [print("    " + l) for l in access_log()]
    stop_all()

    print("[both dead → Envoy local reply; with local_reply_config mapper]")
    envoy(cfg(a_port=PORTS["dead"]) | {}, 313)
    show("both refused, no mapper", req())
    stop_all()
    c = cfg(a_port=PORTS["dead"], with_lr=True)
    c["static_resources"]["clusters"][1] = cluster("b", PORTS["dead"])
    envoy(c, 314)
    show("both refused, mapper", req())
    show("direct_response 503 under mapper", req(path="/direct"))
    stop_all()

    print("[both upstreams answer 5xx: upstream reply passes through; downstream wasm turns it into JSON 502]")
    mock("a"); mock("b")
    envoy(cfg(with_lr=True, with_probe=True), 315)
    show("a=503,b=500 + mapper + wasm", req(headers={"x-mode-a": "503", "x-mode-b": "500"}))
    show("a=400 + wasm", req(headers={"x-mode-a": "400"}))
    show("ok + wasm", req())
    print("  access log:"); [print("    " + l) for l in access_log()]
    stop_all()
    mock("a"); mock("b")
    envoy(cfg(with_lr=False, with_probe=True), 316)
    show("a=503,b=500 wasm only (no mapper)", req(headers={"x-mode-a": "503", "x-mode-b": "500"}))
    print("  access log:"); [print("    " + l) for l in access_log()]
finally:
    stop_all()
