"""Q3b: (i) does a mid-stream per_try_idle_timeout eject (default split OD)?
(ii) variant: local-origin ejection off + active TCP health check marks a refused backend down."""
from xp import *
import xp

OD = dict(OUTLIER, max_ejection_time="2s")
HC = [{"timeout": "0.5s", "interval": "1s", "unhealthy_threshold": 1, "healthy_threshold": 1,
       "no_traffic_interval": "1s", "tcp_health_check": {}}]


def burst(n=4, gap=0.1):
    return "".join((req()[1].get("x-served-by") or "-") for _ in range(n) if not time.sleep(gap))


def od():
    return {k.replace("cluster.", ""): v for k, v in stats(r"cluster\.a\.(outlier_detection\.(ejections_active|ejections_enforced_total)|health_check\.(failure|healthy))").items() if v != "0"}


try:
    mock("a"); mock("b")
    envoy(bootstrap([route("agg", retry_policy=dict(RETRY, per_try_timeout="1s", per_try_idle_timeout="1s"))],
                    [cluster("a", outlier_detection=OD), cluster("b", outlier_detection=OD), aggregate("agg", ["a", "b"])]), 341)
    r = stream({"x-mode-a": "silent"})
    print("(i) a=silent with per_try_idle_timeout 1s:", r[0], r[2], r[3], od(), "next:", burst())
    stop_all()

    mock("a"); mock("b")
    od2 = dict(OD, enforcing_consecutive_local_origin_failure=0)
    envoy(bootstrap([route("agg", retry_policy=dict(RETRY, per_try_timeout="1s"))],
                    [cluster("a", outlier_detection=od2, health_checks=HC), cluster("b", outlier_detection=od2, health_checks=HC),
                     aggregate("agg", ["a", "b"])]), 342)
    print("(ii) baseline:", burst(), od())
    for p in list(xp._procs):
        if p.args[2:4] == [str(PORTS["a"]), "a"]:
            stop(p)
    t0 = time.time()
    seq = []
    for i in range(12):
        st, h, body, t = req()
        seq.append(f"{time.time()-t0:.1f}:{h.get('x-served-by')}")
        time.sleep(0.2)
    print("(ii) a stopped at t=0:", " ".join(seq), od())
    lines = access_log()
    print("    attempts per request after stop:", [l.split("attempts=")[1].split()[0] for l in lines[-12:]])
    mock("a"); time.sleep(2.2)
    print("(ii) a restarted +2.2s:", burst(), od())
    print("(ii) a=stall (per-try timeout) then next:", req(headers={"x-mode-a": "stall"})[1].get("x-served-by"), burst(), od())
    print("(ii) a=503 then next:", req(headers={"x-mode-a": "503"})[1].get("x-served-by"), burst(), od())
finally:
    stop_all()
