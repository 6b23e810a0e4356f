"""Q4d: is an upstream-filter local reply (503) for attempt 1 retried on the next backend?"""
from xp import *

try:
    mock("a"); mock("b")
    agg = aggregate("agg", ["a", "b"])
    agg["typed_extension_protocol_options"] = upstream_filters([wasm_filter(PROBE_WASM, "tag=uagg;deny_backend=a", name="uagg")])
    od = dict(OUTLIER, max_ejection_time="10s", base_ejection_time="10s")
    envoy(bootstrap([route("agg", retry_policy=RETRY)], [cluster("a", outlier_detection=od), cluster("b", outlier_detection=od), agg]), 441)
    for i in range(3):
        reset_hits("a", "b")
        st, h, body, t = req()
        print(f"attempt to a denied by upstream filter: status={st} served_by={h.get('x-served-by')} denied={h.get('x-probe-denied')} hits a={len(hits('a'))} b={len(hits('b'))}")
    print("   stats:", {k: v for k, v in stats(r"cluster\.(agg|a|b)\.(upstream_rq_retry$|outlier_detection\.ejections_active|upstream_rq_5)").items() if v != "0"})
    for l in access_log(): print("   ", l)
finally:
    stop_all()
