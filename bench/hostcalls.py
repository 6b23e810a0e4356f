#!/usr/bin/env python3
"""Prices host interactions of a proxy-wasm filter in Envoy's V8 (where the fixed cost is).

Runs, in one Envoy (--concurrency 1) side by side, listeners whose only filter is
bench/hostcall-cost repeating one hostcall N times per request, plus a listener without filters
and one with the module stripped of the per-request callback exports it does not need. Load:
wrk, 4 connections, 1 KiB POST, listeners interleaved, several repetitions. Prints Envoy CPU per
request (median over repetitions) and the price of one call = (op listener - none listener) / N.

    cargo build --release --target wasm32-wasip1 --manifest-path bench/hostcall-cost/Cargo.toml \\
        --target-dir bench/target
    python3 bench/hostcalls.py [--reps 5] [--n 200] [--duration 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench as B  # noqa: E402
import wasm_exports  # noqa: E402

COST_WASM = B.BENCH / "target" / "wasm32-wasip1" / "release" / "hostcall_cost.wasm"
OPS = ["time", "header", "pairs", "property", "set", "remove", "add", "metric", "log"]
# Callbacks Envoy makes per request only when the module exports them.
PER_REQUEST_EXPORTS = ["proxy_on_request_body", "proxy_on_request_trailers",
                       "proxy_on_response_headers", "proxy_on_response_body",
                       "proxy_on_response_trailers", "proxy_on_log", "proxy_on_done"]


def cost_filter(wasm: Path, cfg: str, vm: str) -> dict:
    return {"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": f"cost-{cfg}", "root_id": "", "allow_on_headers_stop_iteration": True,
                   "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                     "value": cfg},
                   "vm_config": {"vm_id": vm, "runtime": "envoy.wasm.runtime.v8",
                                 "code": {"local": {"filename": str(wasm)}}}}}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=200, help="calls per request (default 200)")
    ap.add_argument("--duration", type=int, default=2, help="seconds per wrk run (default 2)")
    ap.add_argument("--per-export", action="store_true",
                    help="also one listener per export, the module without just that export")
    ap.add_argument("--ops", default=",".join(OPS), help="hostcalls to price (default: all)")
    ap.add_argument("--envoy", default=str(B.ROOT / ".venv" / "bin" / "envoy"))
    a = ap.parse_args()
    B.OUT.mkdir(parents=True, exist_ok=True)
    stripped = B.OUT / "hostcall_cost.stripped.wasm"
    wasm_exports.drop(COST_WASM, stripped, PER_REQUEST_EXPORTS)
    body = B.write_bodies(B.OUT / "bodies")[(1024, "first")]

    plain = {"route": {"cluster": "upstream"}, "match": {"prefix": "/"}}
    ls = [B.Listener("base", "no filter", "native", []),
          B.Listener("none", "module, no calls", "native", [cost_filter(COST_WASM, "none:0", "c")]),
          B.Listener("stripped", "module without per-request exports", "native",
                     [cost_filter(stripped, "none:0", "s")])]
    ops = [o for o in a.ops.split(",") if o]
    ls += [B.Listener(op, f"{op} x{a.n}", "native", [cost_filter(COST_WASM, f"{op}:{a.n}", "c")])
           for op in ops]
    if a.per_export:
        for i, name in enumerate(PER_REQUEST_EXPORTS):
            one = B.OUT / f"hostcall_cost.no-{name}.wasm"
            wasm_exports.drop(COST_WASM, one, [name])
            ls.append(B.Listener(f"-{name}", f"without {name}", "native",
                                 [cost_filter(one, "none:0", f"e{i}")]))
    with B.serving(a.envoy, ls, "hostcalls") as env:
        for l in ls:
            st, _, data = B.post(l.port, body.read_bytes())
            if st != 200:
                raise SystemExit(f"FAIL: {l.key} answered {st}: {data[:200]!r}")
        cpu = {k: v for (k, _), v in B.interleaved_cpu(env, ls, {"1k": body}, a.reps,
                                                        a.duration).items()}
    m = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"Envoy CPU per request (µs, median of {a.reps}), 1 KiB POST, 4 connections:")
    print(f"  no filter                           {m['base']:8.1f}")
    print(f"  wasm module, no calls               {m['none']:8.1f}   (+{m['none'] - m['base']:.1f})")
    print(f"  same, per-request exports removed   {m['stripped']:8.1f}   (+{m['stripped'] - m['base']:.1f})")
    print(f"price of one call (µs) = (listener - 'no calls') / {a.n}:")
    for op in ops:
        print(f"  {op:10s} {(m[op] - m['none']) / a.n:7.3f}   ({m[op]:8.1f} per request)")
    if a.per_export:
        print("one export removed (µs saved per request vs 'no calls'):")
        for name in PER_REQUEST_EXPORTS:
            print(f"  {name:28s} {m['none'] - m['-' + name]:7.1f}")
    out = B.RESULTS / "hostcall-prices.json"
    out.write_text(json.dumps({"n": a.n, "reps": a.reps, "cpu_us_per_request": cpu}, indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
