"""Q2d: can a request header (x-envoy-upstream-rq-per-try-timeout-ms) set the per-try timeout?
(If yes, a client can too unless the filter strips/overwrites it.)"""
from xp import *

try:
    mock("a"); mock("b")
    for i, (label, hx) in enumerate([("default HCM", {}), ("HCM use_remote_address=true", {"use_remote_address": True})]):
        envoy(bootstrap([route("agg", retry_policy=dict(RETRY, per_try_timeout="10s"))],
                        [cluster("a"), cluster("b"), aggregate("agg", ["a", "b"])], hcm_extra=hx), 421 + i)
        st, h, body, t = req(headers={"x-mode-a": "stall", "x-stall-ms": "2500", "x-envoy-upstream-rq-per-try-timeout-ms": "500"})
        print(f"[{label}] per_try_timeout 10s, header says 500ms, a stalls 2.5s: status={st} served_by={h.get('x-served-by')} t={t}s")
        stop_all(); mock("a"); mock("b")
finally:
    stop_all()
