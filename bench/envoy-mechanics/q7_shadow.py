"""Q7: request_mirror_policies to a dedicated shadow cluster: marking, fire-and-forget, concurrency cap."""
import threading
import sys
from xp import *

CB = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"max_requests": 4, "max_pending_requests": 4, "max_connections": 4, "max_retries": 0}
print("shadow-c circuit_breakers:", CB)

HM_SHADOW = {"name": "envoy.filters.http.header_mutation", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
    "mutations": {"request_mutations": [{"append": {"header": {"key": "x-llmkube-shadow-upstream-filter", "value": "true"},
                                                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}}}


def cfg():
    shadow = cluster("shadow-c", PORTS["c"],
        circuit_breakers={"thresholds": [CB]},
        typed_extension_protocol_options=upstream_filters([HM_SHADOW]))
    mirror = [{"cluster": "shadow-c",
               "request_headers_mutations": [{"append": {"header": {"key": "x-llmkube-shadow", "value": "true"},
                                                         "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}}]}]
    return bootstrap([route("agg", retry_policy=RETRY, request_mirror_policies=mirror)],
                     [cluster("a"), cluster("b"), aggregate("agg", ["a", "b"]), shadow])


try:
    mock("a"); mock("b"); mock("c")
    envoy(cfg(), 391)
    st, h, body, t = req(headers={"x-mode-a": "ok"}); time.sleep(0.3)
    x = hits("c")[-1]
    print(f"basic: client status={st} t={t}s served_by={h.get('x-served-by')}; shadow got host={x['headers'].get('host')!r} "
          f"x-llmkube-shadow={x['headers'].get('x-llmkube-shadow')!r} via-upstream-filter={x['headers'].get('x-llmkube-shadow-upstream-filter')!r} "
          f"body_model={json.loads(x['body'])['model']!r}; primary a saw x-llmkube-shadow={hits('a')[-1]['headers'].get('x-llmkube-shadow')!r}")
    st, h, body, t = req(headers={"x-mode-c": "slow"})
    print(f"shadow slow (800ms): client t={t}s status={st}")
    st, h, body, t = req(headers={"x-mode-c": "500"})
    print(f"shadow 500: client status={st} served_by={h.get('x-served-by')}")
    st, h, body, t = req(headers={"x-mode-a": "503"}); time.sleep(0.3)
    print(f"a=503 → b: served_by={h.get('x-served-by')}; shadow copies for this request: "
          f"{sum(1 for y in hits('c') if y['headers'].get('x-mode-a') == '503')} (mirror is per request, not per attempt)")
    reset_hits("c")
    # 10 concurrent client requests, shadow slow: at most 4 in flight to shadow-c
    res = []
    ths = [threading.Thread(target=lambda: res.append(req(headers={"x-mode-c": "slow"}))) for _ in range(10)]
    t0 = time.time(); [t.start() for t in ths]; [t.join() for t in ths]
    print(f"10 concurrent, shadow slow: client statuses={sorted(r[0] for r in res)} max client t={max(r[3] for r in res)}s wall={time.time()-t0:.2f}s")
    time.sleep(1.5)
    print(f"   shadow-c received {len(hits('c'))} of 10")
    print("   stats:", {k: v for k, v in stats(r"cluster\.shadow-c\.(upstream_rq_total|upstream_rq_pending_overflow|upstream_rq_overflow|upstream_cx_overflow|upstream_rq_5xx|upstream_rq_active|upstream_rq_pending_total)|shadow|mirror").items() if v != "0"})
finally:
    stop_all()
