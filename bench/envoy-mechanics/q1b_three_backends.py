"""Q1b: three backends in an aggregate, num_retries 2: does each retry move one priority further?"""
from xp import *

try:
    mock("a"); mock("b"); mock("c")
    envoy(bootstrap([route("agg", retry_policy=dict(RETRY, num_retries=2))],
                    [cluster("a"), cluster("b"), cluster("c"), aggregate("agg", ["a", "b", "c"])]), 451)
    for label, h in [("a=503", {"x-mode-a": "503"}), ("a=503,b=503", {"x-mode-a": "503", "x-mode-b": "503"}),
                     ("a=503,b=400", {"x-mode-a": "503", "x-mode-b": "400"}), ("all 503", {"x-mode-a": "503", "x-mode-b": "503", "x-mode-c": "503"})]:
        reset_hits("a", "b", "c")
        st, hh, body, t = req(headers=h)
        print(f"{label}: status={st} served_by={hh.get('x-served-by')} hits a={len(hits('a'))} b={len(hits('b'))} c={len(hits('c'))}")
finally:
    stop_all()
