"""Q2: per_try_timeout vs streaming bodies, idle timeouts, timeout retries."""
from xp import *


def cfg(**route_extra):
    retry = dict(RETRY)
    retry.update(route_extra.pop("retry_extra", {}))
    return bootstrap([route("agg", retry_policy=retry, **route_extra)],
                     [cluster("a"), cluster("b"), aggregate("agg", ["a", "b"])])


def summarize(res):
    st, chunks, end, tt = res
    data = [c for c in chunks if c[1] != b"<headers>"]
    fb = any(b'"from":"b"' in c[1] or b'"served_by": "b"' in c[1] for c in data)
    return f"status={st} total={tt}s chunks={len(data)} first_t={chunks[0][0] if chunks else None} last_t={data[-1][0] if data else None} end={end!r} from_b={fb}"


try:
    mock("a"); mock("b")
    cases = [
        ("A per_try_timeout=1s, route timeout=0s", 321, dict(retry_extra={"per_try_timeout": "1s"})),
        ("B route timeout=2s (no per-try)", 322, dict(timeout="2s")),
        ("C per_try_idle_timeout=1s", 323, dict(retry_extra={"per_try_idle_timeout": "1s"})),
        ("D route idle_timeout=1s", 324, dict(idle_timeout="1s")),
    ]
    for label, base, extra in cases:
        print(f"[{label}]")
        envoy(cfg(**extra), base)
        reset_hits("a", "b")
        print("  a=sse (3s stream, chunk/300ms):", summarize(stream({"x-mode-a": "sse"})))
        print("  a=silent (headers+1 chunk, 5s silence):", summarize(stream({"x-mode-a": "silent"})))
        print("  a=stall 3s before headers:", summarize(stream({"x-mode-a": "stall"})))
        print(f"  hits a={len(hits('a'))} b={len(hits('b'))}")
        for l in access_log(): print("    " + l)
        print("  stats:", {k: v for k, v in stats(r"cluster\.(agg|a|b)\.(upstream_rq_per_try_timeout|upstream_rq_timeout|upstream_rq_per_try_idle_timeout|upstream_rq_retry$|upstream_rq_rx_reset|upstream_rq_tx_reset)|downstream_rq_idle_timeout").items() if v != "0"})
        stop_all(); mock("a"); mock("b")
finally:
    stop_all()
