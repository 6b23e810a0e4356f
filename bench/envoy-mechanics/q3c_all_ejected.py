"""Q3c: every backend of an aggregate ejected: panic mode vs healthy_panic_threshold 0."""
from xp import *

OD = dict(OUTLIER, max_ejection_time="10s", base_ejection_time="10s")
try:
    for i, (label, lb) in enumerate([("default panic threshold (50%)", None),
                                     ("healthy_panic_threshold 0 on members", {"healthy_panic_threshold": {"value": 0}})]):
        mock("a"); mock("b")
        extra = {"outlier_detection": OD}
        if lb:
            extra["common_lb_config"] = lb
        envoy(bootstrap([route("agg", retry_policy=RETRY)], [cluster("a", **extra), cluster("b", **extra), aggregate("agg", ["a", "b"])]), 411 + i)
        st, h, _, _ = req(headers={"x-mode-a": "503", "x-mode-b": "503"})
        print(f"[{label}] a=503,b=503 → {st}; ejected:", {k: v for k, v in stats(r"outlier_detection\.ejections_active").items()})
        for _ in range(3):
            st, h, body, t = req()
            print(f"   next: status={st} served_by={h.get('x-served-by')} body={body[:70]!r}")
        for l in access_log()[-3:]: print("    ", l)
        stop_all()
finally:
    stop_all()
