"""Q9: a downstream (main chain) wasm filter replaces the request body: is content-length fixed?"""
from xp import *

try:
    mock("a")
    for i, (label, extra) in enumerate([("set_buffer only", ""), ("drop content-length in headers", ";drop_cl=1"),
                                        ("pause headers + set content-length at body end", ";fix_cl=1")]):
        envoy(bootstrap([route("a")], [cluster("a")],
                        [wasm_filter(PROBE_WASM, "tag=d;rewrite_model=gpt-4o-cloud-longer" + extra, name="d")]), 381 + i)
        reset_hits("a")
        st, h, body, t = req(body={"model": "m", "messages": [{"role": "user", "content": "x" * 100}]})
        x = hits("a")[-1] if hits("a") else None
        if x:
            try:
                m = json.loads(x["body"])["model"]
            except ValueError:
                m = "INVALID JSON (truncated): ..." + x["body"][-20:]
            print(f"{label}: status={st} upstream cl={x['headers'].get('content-length')} te={x['headers'].get('transfer-encoding')} len={len(x['body'])} model={m!r}")
        else:
            print(f"{label}: status={st} body={body[:100]!r} (upstream got nothing)")
        stop_all(); mock("a")
finally:
    stop_all()
