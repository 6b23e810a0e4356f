"""Q8: weighted choice. (A) route weighted_clusters; (B) one cluster, one endpoint per backend with
load_balancing_weight; (C) filter-chosen order → one aggregate cluster per order."""
import collections
import xp
from xp import *

OD = dict(OUTLIER, max_ejection_time="10s", base_ejection_time="10s")


def dist(n=40, h=None):
    c = collections.Counter()
    for _ in range(n):
        st, hh, body, t = req(headers=h)
        c[f"{st}:{hh.get('x-served-by') or '-'}"] += 1
    return dict(c)


def kill(name):
    for p in list(xp._procs):
        if p.args[2:4] == [str(PORTS[name]), name]:
            stop(p)


try:
    mock("a"); mock("b")
    wc = {"weighted_clusters": {"clusters": [{"name": "a", "weight": 3}, {"name": "b", "weight": 1}]},
          "timeout": "0s", "retry_policy": dict(RETRY)}
    envoy(bootstrap([{"match": {"prefix": "/"}, "route": wc}],
                    [cluster("a", outlier_detection=OD), cluster("b", outlier_detection=OD)]), 401)
    print("(A) weighted_clusters a:3 b:1 →", dist())
    kill("a")
    print("(A) a stopped →", dist(20))
    print("    ", {k: v for k, v in stats(r"cluster\.a\.(upstream_cx_none_healthy|outlier_detection\.ejections_active|upstream_rq_retry$)").items()})
    stop_all()

    mock("a"); mock("b")
    wx = cluster("wx", PORTS["a"], outlier_detection=OD)
    wx["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": PORTS[n]}}},
         "load_balancing_weight": w, "metadata": {"filter_metadata": {"llmkube": {"backend": n}}}} for n, w in (("a", 3), ("b", 1))]
    envoy(bootstrap([route("wx", retry_policy=dict(RETRY))], [wx]), 402)
    print("(B) one cluster, endpoints a(w3) b(w1) →", dist())
    print("(B) one request a=503:", req(headers={"x-mode-a": "503"})[1].get("x-served-by"), "then →", dist(20))
    stop_all()

    mock("a"); mock("b")
    routes = [{"match": {"prefix": "/", "headers": [{"name": "x-llmkube-order", "string_match": {"exact": o}}]},
               "route": {"cluster": "agg-" + o.replace(",", ""), "timeout": "0s", "retry_policy": dict(RETRY)}} for o in ("a,b", "b,a")]
    envoy(bootstrap(routes, [cluster("a", outlier_detection=OD), cluster("b", outlier_detection=OD),
                             aggregate("agg-ab", ["a", "b"]), aggregate("agg-ba", ["b", "a"])]), 403)
    print("(C) order a,b →", dist(5, {"x-llmkube-order": "a,b"}), "order b,a →", dist(5, {"x-llmkube-order": "b,a"}))
    req(headers={"x-llmkube-order": "a,b", "x-mode-a": "503"})
    print("(C) after a=503 (a ejected): order a,b →", dist(5, {"x-llmkube-order": "a,b"}), "order b,a →", dist(5, {"x-llmkube-order": "b,a"}))
finally:
    stop_all()
