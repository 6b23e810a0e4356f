"""Q2b: per_try_idle_timeout on a silent stream, alone vs together with per_try_timeout, with outlier detection."""
from xp import *

OD = dict(OUTLIER, max_ejection_time="2s")
try:
    for i, (label, rp) in enumerate([("idle only", {"per_try_idle_timeout": "1s"}),
                                     ("idle + per_try_timeout 1s", {"per_try_idle_timeout": "1s", "per_try_timeout": "1s"}),
                                     ("idle + per_try_timeout 10s", {"per_try_idle_timeout": "1s", "per_try_timeout": "10s"}),
                                     ("idle 2s + per_try_timeout 1s", {"per_try_idle_timeout": "2s", "per_try_timeout": "1s"}),
                                     ("idle 1s + per_try_timeout 2s", {"per_try_idle_timeout": "1s", "per_try_timeout": "2s"})]):
        mock("a"); mock("b")
        envoy(bootstrap([route("agg", retry_policy=dict(RETRY, **rp))],
                        [cluster("a", outlier_detection=OD), cluster("b", outlier_detection=OD), aggregate("agg", ["a", "b"])]), 345 + i)
        r = stream({"x-mode-a": "silent"})
        ej = {k: v for k, v in stats(r"cluster\.a\.outlier_detection\.ejections_enforced_total|per_try_idle").items() if v != "0"}
        nxt = "".join(req()[1].get("x-served-by") or "-" for _ in range(3))
        print(f"{label}: status={r[0]} end={r[2]!r} total={r[3]}s stats={ej} next={nxt}")
        print("   ", access_log()[0])
        stop_all()
finally:
    stop_all()
