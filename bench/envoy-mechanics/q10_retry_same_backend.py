"""Q10: aggregate [a, b], a ejected by outlier detection, b answers 503: is the retry sent to b again
(the only host left), or does the request end with b's 503? Counts b's hits per request."""
from xp import *

OD = dict(OUTLIER, base_ejection_time="30s", max_ejection_time="30s", interval="0.5s")
try:
    mock("a"); mock("b")
    rp = dict(RETRY, num_retries=1)
    cl = [cluster(n, outlier_detection=OD, common_lb_config={"healthy_panic_threshold": {"value": 0}}) for n in ("a", "b")]
    envoy(bootstrap([route("agg", retry_policy=rp)], cl + [aggregate("agg", ["a", "b"])]), 461)
    st, h, body, t = req(headers={"x-mode-a": "503"})
    print(f"eject a: status={st} served_by={h.get('x-served-by')}")
    time.sleep(1.2)
    print("  a ejected:", stats(r"cluster\.a\.outlier_detection\.ejections_active"))
    for i in range(8):
        reset_hits("a", "b")
        st, h, body, t = req(headers={"x-mode-b": "503"})
        print(f"b 503 #{i}: status={st} a_hits={len(hits('a'))} b_hits={len(hits('b'))} body={body[:60]!r}")
    for l in access_log()[-3:]: print("   ", l)
finally:
    stop_all()
