"""Q3: passive health (outlier_detection) per backend cluster under an aggregate; --concurrency 2."""
import sys
from xp import *
import xp

OD = dict(OUTLIER, max_ejection_time="2s")
if len(sys.argv) > 1 and sys.argv[1] == "no-local":      # variant: local-origin errors never eject
    OD["enforcing_consecutive_local_origin_failure"] = 0


def cfg():
    return bootstrap([route("agg", retry_policy=dict(RETRY, per_try_timeout="1s"))],
                     [cluster("a", outlier_detection=OD), cluster("b", outlier_detection=OD), aggregate("agg", ["a", "b"])])


def burst(n=8, gap=0.1, h=None):
    out = []
    for _ in range(n):
        out.append(req(headers=h)[1].get("x-served-by") or "-")
        time.sleep(gap)
    return "".join(out)


def od():
    return {k.replace("cluster.", ""): v for k, v in stats(r"cluster\.(a|b)\.outlier_detection\.(ejections_active|ejections_enforced_total|ejections_enforced_consecutive_5xx|ejections_enforced_consecutive_local_origin_failure)").items() if v != "0"}


t0 = time.time()
ts = lambda: f"t={time.time() - t0:5.2f}s"
try:
    pa = None
    mock("a"); mock("b")
    envoy(cfg(), 331, concurrency=2)
    print(f"{ts()} baseline:", burst(4))
    print(f"{ts()} one request with a=503:", req(headers={"x-mode-a": "503"})[1].get("x-served-by"), od())
    print(f"{ts()} next 8 (a healthy again, 100ms apart):", burst(8))
    time.sleep(1.0)
    print(f"{ts()} after base_ejection_time:", burst(4), od())
    print("  workers:", stats(r"listener\.127\.0\.0\.1_23000\.worker_\d+\.downstream_cx_total"))
    time.sleep(2.5)
    print(f"{ts()} one request a=stall (per_try_timeout 1s fires):", req(headers={"x-mode-a": "stall"})[1].get("x-served-by"), od())
    print(f"{ts()} next 4:", burst(4))
    time.sleep(2.5)
    print(f"{ts()} client cancels after 0.3s while a stalls:", req(headers={"x-mode-a": "stall"}, timeout=0.3)[2][:40])
    time.sleep(0.1)
    print(f"{ts()} next 4:", burst(4), od())
    time.sleep(2.5)
    print(f"{ts()} a=close (reset before headers):", req(headers={"x-mode-a": "close"})[1].get("x-served-by"), od())
    print(f"{ts()} next 4:", burst(4))
    time.sleep(2.5)
    # refused: stop mock a
    for p in list(xp._procs):
        if p.args[2:4] == [str(PORTS["a"]), "a"]:
            stop(p)
    print(f"{ts()} a stopped; request:", req()[1].get("x-served-by"), od())
    print(f"{ts()} next 4:", burst(4))
    mock("a")
    time.sleep(2.6)
    print(f"{ts()} a restarted, after ejection:", burst(4), od())
    print(f"{ts()} re-eject twice: a=503 then wait 2.6s then a=503 then probe at 2.6s")
    req(headers={"x-mode-a": "503"}); time.sleep(2.6); req(headers={"x-mode-a": "503"}); time.sleep(2.6)
    print(f"{ts()}   after 2nd ejection + 2.6s:", burst(4), "(max_ejection_time 2s caps the back-off)")
    for l in access_log()[-12:]: print("    " + l)
finally:
    stop_all()
