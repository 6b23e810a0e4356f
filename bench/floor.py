#!/usr/bin/env python3
"""What any routing wasm filter costs Envoy per request before it does any work.

Side by side in one Envoy (--concurrency 1), 1 KiB POST, 4 connections, listeners interleaved,
several repetitions; every listener starts with Envoy's native buffer filter (as the
json_to_metadata listener of bench/run does), then:
  buffer   nothing more
  jtm      json_to_metadata extracting `model` (the native reference)
  pass     bench/hostcall-cost doing nothing (every callback returns at once)
  pause    same, but holding the headers until the end of the body, as a filter that routes on
           the body must
  mark     pause, then set a request header no route looks at from the body phase
  route    pause, then set x-llmkube-backend from the body phase: Envoy re-selects the route and
           the request goes to the backend cluster, as after the model/rule filter
  ours     the model/rule filter (bench/bench.py's MODEL_ROUTER)
Prints Envoy CPU per request (median) and each listener's increment over the one before it.

    python3 bench/floor.py [--reps 8] [--wasm PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402
import hostcalls as H  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--duration", type=int, default=2, help="seconds per wrk run (default 2)")
    ap.add_argument("--wasm", help="model/rule filter build (default: the release build)")
    ap.add_argument("--envoy", default=str(B.ROOT / ".venv" / "bin" / "envoy"))
    a = ap.parse_args()
    ours = B.MODEL_ROUTER
    if a.wasm:
        ours = B.OurFilter(**{**ours.__dict__, "wasm": str(Path(a.wasm).resolve())})
    buf = B.buffer_filter()

    def cost(mode: str) -> dict:
        return H.cost_filter(H.COST_WASM, f"none:0:{mode}", "floor")

    ls = [B.Listener("buffer", "native buffer", "native", [buf]),
          B.Listener("jtm", "+ json_to_metadata", "native", [buf, B.json_to_metadata_filter()]),
          B.Listener("pass", "+ wasm filter, no work", "native", [buf, cost("pass")]),
          B.Listener("pause", "+ holds headers to end of body", "native", [buf, cost("pause")]),
          B.Listener("mark", "+ sets a header from the body phase", "native", [buf, cost("mark")]),
          B.Listener("route", "+ that header routes to the backend", "ours", [buf, cost("route")],
                     [ours]),
          B.Listener("ours", "model/rule filter", "ours", [buf, B.wasm_filter(ours)], [ours])]
    body = B.write_bodies(B.OUT / "bodies")[(1024, "first")]
    with B.serving(a.envoy, ls, "floor") as env:
        for l in ls:
            st, h, data = B.post(l.port, body.read_bytes())
            want = B.EXPECTED_BACKEND if l.kind == "ours" else "-"
            if st != 200 or h.get("x-seen-backend") != want:
                raise SystemExit(f"FAIL: {l.key}: {st} backend {h.get('x-seen-backend')!r}, "
                                 f"want 200 and {want!r}: {data[:200]!r}")
        cpu = {k: v for (k, _), v in B.interleaved_cpu(env, ls, {"1k": body}, a.reps,
                                                        a.duration).items()}
    m = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"Envoy CPU per request, µs (median of {a.reps}; 1 KiB POST; 4 connections):")
    print("| listener | µs | over buffer | step |")
    print("|---|--:|--:|--:|")
    prev = None
    for l in ls:
        step = "" if prev is None or l.key == "jtm" else f"{m[l.key] - m[prev]:+.1f}"
        print(f"| {l.key}: {l.title} | {m[l.key]:.1f} | {m[l.key] - m['buffer']:+.1f} | {step} |")
        if l.key != "jtm":
            prev = l.key
    out = B.RESULTS / "wasm-filter-floor.json"
    out.write_text(json.dumps({"reps": a.reps, "wasm": ours.wasm, "cpu_us_per_request": cpu},
                              indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
