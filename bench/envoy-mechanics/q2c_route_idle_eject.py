"""Q2c: does the route idle_timeout (downstream, HCM) cutting a silent stream eject the backend?"""
from xp import *

OD = dict(OUTLIER, max_ejection_time="2s")
try:
    mock("a"); mock("b")
    envoy(bootstrap([route("agg", idle_timeout="1s", retry_policy=dict(RETRY, per_try_timeout="120s"))],
                    [cluster("a", outlier_detection=OD), cluster("b", outlier_detection=OD), aggregate("agg", ["a", "b"])]), 351)
    r = stream({"x-mode-a": "silent"})
    ej = {k: v for k, v in stats(r"cluster\.a\.outlier_detection\.ejections_enforced_total|idle_timeout").items() if v != "0"}
    nxt = "".join(req()[1].get("x-served-by") or "-" for _ in range(3))
    print(f"route idle_timeout 1s, per_try_timeout 120s: status={r[0]} end={r[2]!r} total={r[3]}s stats={ej} next={nxt}")
    print("   ", access_log()[0])
finally:
    stop_all()
