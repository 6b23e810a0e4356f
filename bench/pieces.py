"""How many body callbacks a request gets, and how big the body is at each, in the outside bootstrap.

    python3 bench/pieces.py [--sizes 256,2048] [--seconds 1]

Puts bench/hostcall-cost in `trace` mode (it pauses like a routing filter and logs, per body
callback, the time since the headers and the buffered size) in front of the generated chain of
listener L2 (bench/outside.py), runs wrk as bench/run --outside does (1 connection, a fresh one
every 20 requests for bodies >= 256 KiB), and prints callbacks per request. Each callback is one
entry into V8 plus the hostcalls the filter makes there: this says whether per-piece work can be
a per-KiB cost. Needs what bench/run builds (the release wasm, llmkube-gen, the upstream, the
hostcall-cost filter).
"""

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402
import hostcalls as H  # noqa: E402
import outside as O  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="256,2048", help="body sizes in KiB (default 256,2048)")
    ap.add_argument("--seconds", type=int, default=1, help="wrk seconds per body (default 1)")
    ap.add_argument("--envoy", default=os.environ.get("ENVOY_BIN")
                    or str(B.ROOT / ".venv" / "bin" / "envoy"))
    a = ap.parse_args()
    B.OUT.mkdir(parents=True, exist_ok=True)
    gen = O.generate(B.OUT)
    bs = O.bodies(B.OUT / "bodies", [int(k) * B.KIB for k in a.sizes.split(",")])
    up = B.Upstream()
    cfg, arms = O.build(gen, up.port, False)
    for l in cfg["static_resources"]["listeners"]:
        if l["name"] == "L2":
            O.hcm_of(l)["http_filters"].insert(0, H.cost_filter(H.COST_WASM, "none:0:trace", "trace"))
    env = B.Envoy(a.envoy, cfg, B.OUT, "pieces", 1)
    try:
        arm = next(x for x in arms if x["key"] == "L2")
        for (size, v), path in bs.items():
            n0 = len(env.log_path.read_text().splitlines())
            rc = O.RECONNECT_EVERY if size >= O.RECONNECT_FROM else 0
            B.wrk("wrk", arm["port"], path, a.seconds, 1, 1, {"envoy": env.pid}, reconnect=rc)
            time.sleep(0.3)
            per, cur = [], []
            for line in env.log_path.read_text().splitlines()[n0:]:
                m = re.search(r"body \+(\d+) µs size=(\d+) eos=(\w+)", line)
                if m:
                    cur.append((int(m[1]), int(m[2])))
                    if m[3] == "true":
                        per.append(cur)
                        cur = []
            if not per:
                print(f"{B.size_label(size)} model-{v}: no traced request")
                continue
            n = [len(p) for p in per]
            print(f"{B.size_label(size)} model-{v}: {len(per)} requests, body callbacks per request "
                  f"median {statistics.median(n)}, min {min(n)}, max {max(n)}; last request "
                  f"(µs after headers, KiB buffered): "
                  + ", ".join(f"+{t} {s / B.KIB:.0f}" for t, s in per[-1]))
    finally:
        env.stop()
        up.stop()


if __name__ == "__main__":
    main()
