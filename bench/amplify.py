#!/usr/bin/env python3
"""Per-instance cost of a filter, measured by repetition.

The added latency of one filter at 1 KiB is a few tens of µs, inside the run-to-run noise of this
machine. So each filter also runs K times in one chain: (CPU per request with K copies - with one
copy) / (K - 1) is the cost of one instance, with the noise divided by K - 1. Listeners, side by
side in one Envoy (--concurrency 1), interleaved, several repetitions, 4 connections:
  buffer            native buffer alone
  jtm x1, jtm xK    buffer + json_to_metadata (model), once / K times
  ours x1, ours xK  buffer + our model/rule filter, once / K times (each copy re-decides: it strips
                    the decision headers the copy before it stamped, as it strips a client's)

    bench/run --no-doc --reps 1 --duration 1 --sizes 1   # once, to build everything
    python3 bench/amplify.py [--k 8] [--reps 5] [--sizes 1,16] [--wasm PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=8, help="copies in the amplified chains (default 8)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--duration", type=int, default=2, help="seconds per wrk run (default 2)")
    ap.add_argument("--sizes", default="1,16", help="body sizes in KiB (default 1,16)")
    ap.add_argument("--wasm", help="model/rule filter build to measure (default: the release build)")
    ap.add_argument("--compare", metavar="PATH",
                    help="another build of the model/rule filter, as listeners b x1 / b xK")
    ap.add_argument("--minimal", action="store_true",
                    help="also bench/hostcall-cost doing nothing, x1 and xK: the floor of any wasm filter")
    ap.add_argument("--envoy", default=str(B.ROOT / ".venv" / "bin" / "envoy"))
    a = ap.parse_args()
    ours = B.MODEL_ROUTER
    if a.wasm:
        ours = B.OurFilter(**{**ours.__dict__, "wasm": str(Path(a.wasm).resolve())})
    buf, jtm, wasm = B.buffer_filter(), B.json_to_metadata_filter(), B.wasm_filter(ours)
    ls = [B.Listener("buffer", "native buffer", "native", [buf]),
          B.Listener("jtm1", "json_to_metadata x1", "native", [buf, jtm]),
          B.Listener("jtmK", f"json_to_metadata x{a.k}", "native", [buf] + [jtm] * a.k),
          B.Listener("ours1", "model/rule x1", "ours", [buf, wasm], [ours]),
          B.Listener("oursK", f"model/rule x{a.k}", "ours", [buf] + [wasm] * a.k, [ours])]
    if a.compare:
        other = B.OurFilter(**{**B.MODEL_ROUTER.__dict__, "wasm": str(Path(a.compare).resolve()),
                               "vm_id": "llmkube-b", "name": "llmkube.model-router-b"})
        wb = B.wasm_filter(other)
        ls += [B.Listener("b1", "other build x1", "ours", [buf, wb], [other]),
               B.Listener("bK", f"other build x{a.k}", "ours", [buf] + [wb] * a.k, [other])]
    if a.minimal:
        import hostcalls
        nop = hostcalls.cost_filter(hostcalls.COST_WASM, "none:0", "nop")
        ls += [B.Listener("min1", "minimal wasm x1", "native", [buf, nop]),
               B.Listener("minK", f"minimal wasm x{a.k}", "native", [buf] + [nop] * a.k)]
    all_bodies = B.write_bodies(B.OUT / "bodies")
    sizes = [int(s) * B.KIB for s in a.sizes.split(",")]
    bodies = {s: all_bodies[(s, "first")] for s in sizes}
    with B.serving(a.envoy, ls, "amplify") as env:
        for l in ls:
            for s in sizes:
                st, h, data = B.post(l.port, bodies[s].read_bytes())
                if st != 200:
                    raise SystemExit(f"FAIL: {l.key} answered {st}: {data[:200]!r}")
        cpu = B.interleaved_cpu(env, ls, bodies, a.reps, a.duration)
    m = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"Envoy CPU per request, µs (median of {a.reps}; 4 connections; K = {a.k}):")
    print("| size | buffer | jtm x1 | jtm xK | ours x1 | ours xK | one jtm | one ours | ours / jtm |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for s in sizes:
        one_j = (m[("jtmK", s)] - m[("jtm1", s)]) / (a.k - 1)
        one_o = (m[("oursK", s)] - m[("ours1", s)]) / (a.k - 1)
        print(f"| {s // B.KIB} KiB | {m[('buffer', s)]:.0f} | {m[('jtm1', s)]:.0f} | "
              f"{m[('jtmK', s)]:.0f} | {m[('ours1', s)]:.0f} | {m[('oursK', s)]:.0f} | "
              f"{one_j:.1f} | {one_o:.1f} | {one_o / one_j:.2f} |")
    if a.compare:
        for s in sizes:
            one_b = (m[("bK", s)] - m[("b1", s)]) / (a.k - 1)
            print(f"other build ({a.compare}), {s // B.KIB} KiB: x1 {m[('b1', s)]:.0f}, "
                  f"x{a.k} {m[('bK', s)]:.0f}, one instance {one_b:.1f} µs")
    if a.minimal:
        for s in sizes:
            one_m = (m[("minK", s)] - m[("min1", s)]) / (a.k - 1)
            print(f"minimal wasm filter, {s // B.KIB} KiB: x1 {m[('min1', s)]:.0f}, "
                  f"x{a.k} {m[('minK', s)]:.0f}, one instance {one_m:.1f} µs")
    out = B.RESULTS / "one-instance-cost-amplified.json"
    out.write_text(json.dumps({"k": a.k, "reps": a.reps, "wasm": ours.wasm,
                               "cpu_us_per_request": {f"{k}@{s}": v for (k, s), v in cpu.items()}},
                              indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
