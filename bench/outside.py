"""`bench/run --outside`: the filter measured inside the generated bootstrap.

The default method of bench/run builds its own minimal route table (one plain route per
listener). This one starts from what `llmkube-gen compile --target envoy` makes of
envoy-examples/router.yaml, so every request meets the generated route table and clusters:
  - one Envoy, --concurrency 1, every cluster of the generated bootstrap pointed at the bench
    upstream (addresses, DNS types made STATIC, TLS dropped; health checks, outlier detection,
    upstream chains and the internal attempt listeners stay as generated);
  - listeners sharing the generated listener's HTTP connection manager, differing only in HTTP
    filters: L0 native buffer, L1 buffer + json_to_metadata (top-level `model`), LF the floor
    (bench/floor-filter: a proxy-wasm filter that takes the whole body into wasm memory and does
    nothing else, in the same wasm runtime as the generated chain), L2 the generated listener's
    own filter chain;
  - L0, L1 and LF requests carry `x-llmkube-route` naming the route L2's filter picks, so all take
    the same route (same retry policy, same cluster); without it they would fall to the catch-all
    404 and never send the body upstream (arm L0-404 measures that);
  - 1 connection; bodies of 256 KiB and more on a fresh connection every 20 requests;
  - Envoy CPU per request (utime + stime of the Envoy process over each run / requests) next to p50;
  - A/B arms in the same Envoy (with --ab): L0-404 (no route header), and L0 / L2 on the route table
    with the other retry setting for routes that never retry: without `retry_on` (L0-nr, L2-nr) if
    the generated table has it there, else with it (L0-rb, L2-rb). With any `retry_on` Envoy's
    router keeps a copy of the body for a retry. L0-ka / L2-ka: keep-alive at every size.
With --compare-wasm PATH: arm L2b, the generated chain with that build of the model/rule filter
(its own VM), next to L2 in the same Envoy (a before → after of a filter change).
With --perf: `perf record -g` on Envoy per arm instead of the timed run.
Results: bench/results/generated-bootstrap-cost.json and .md (method: docs/benchmarks.md).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import subprocess
from pathlib import Path

import bench as B

ROUTER_YAML = B.ROOT / "envoy-examples" / "router.yaml"
GEN_BIN = B.ROOT / "target" / "debug" / "llmkube-gen"
# A local backend of router.yaml, by display name: the route L2's filter stamps for these bodies.
MODEL = "meta-llama/Llama-3.3-70B-Instruct"
ROUTE_KEY = "~/llama-3-70b"
BACKEND = "llama-3-70b"
RECONNECT_FROM = 256 * B.KIB
RECONNECT_EVERY = 20
ROUTE_HEADER = "x-llmkube-route"
# The generator's failover retry conditions (generator/src/targets/envoy/mod.rs RETRY_ON).
RETRY_ON = "5xx,reset,connect-failure,refused-stream"
# The floor arm's module (bench/run builds it: bench/floor-filter, own target dir).
FLOOR_WASM = B.BENCH / "target" / "wasm32-wasip1" / "release" / "floor_filter.wasm"


def generate(workdir: Path) -> dict:
    out = workdir / "generated.json"
    r = subprocess.run([str(GEN_BIN), "compile", "--target", "envoy", "-f", str(ROUTER_YAML),
                        "--format", "json", "--wasm-dir", str(B.WASM_DIR), "-o", str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: llmkube-gen: {r.stderr}")
    return json.loads(out.read_text())


def point_at(cfg: dict, up_port: int) -> None:
    """Every socket endpoint of every cluster → the bench upstream (internal ones stay)."""
    for c in cfg["static_resources"]["clusters"]:
        la = c.get("load_assignment")
        if not la:
            continue
        for group in la.get("endpoints", []):
            for ep in group.get("lb_endpoints", []):
                sa = ep.get("endpoint", {}).get("address", {}).get("socket_address")
                if sa:
                    sa["address"], sa["port_value"] = "127.0.0.1", up_port
        if c.get("type") in ("STRICT_DNS", "LOGICAL_DNS"):
            c["type"] = "STATIC"
            c.pop("dns_lookup_family", None)
        ts = c.get("transport_socket", {})
        if "tls" in ts.get("name", ""):
            del c["transport_socket"]


def main_listener(cfg: dict) -> dict:
    return next(l for l in cfg["static_resources"]["listeners"] if "address" in l)


def hcm_of(listener: dict) -> dict:
    return listener["filter_chains"][0]["filters"][0]["typed_config"]


def with_retry_buffering(route_config: dict) -> dict:
    """The route table with `retry_on` on every route, as the generator emitted it before it
    left it off the routes that never retry: Envoy's router then keeps a copy of the request body
    for a possible retry even with num_retries 0."""
    rc = copy.deepcopy(route_config)
    for vh in rc["virtual_hosts"]:
        for r in vh["routes"]:
            if "route" in r:
                r["route"].setdefault("retry_policy", {}).setdefault("retry_on", RETRY_ON)
    return rc


def never_retrying_unbuffered(route_config: dict) -> dict:
    """The route table with `retry_on` dropped where no retry can happen (num_retries 0, no
    mirror): Envoy's router keeps a copy of the request body for a possible retry whenever the
    route's retry policy has a `retry_on` condition, even with num_retries 0."""
    rc = copy.deepcopy(route_config)
    for vh in rc["virtual_hosts"]:
        for r in vh["routes"]:
            act = r.get("route", {})
            rp = act.get("retry_policy")
            if rp and not rp.get("num_retries") and not act.get("request_mirror_policies"):
                rp.pop("retry_on", None)
    return rc


def routes_buffer_for_retry(route_config: dict) -> bool:
    """Whether some route that never retries still has a retry condition (see above)."""
    return any(r.get("route", {}).get("retry_policy", {}).get("retry_on")
               and not r["route"]["retry_policy"].get("num_retries")
               for vh in route_config["virtual_hosts"] for r in vh["routes"])


def with_wasm(filters: list[dict], wasm: Path) -> list[dict]:
    """The chain with the model/rule filter's module replaced by `wasm` (own VM: --compare-wasm)."""
    out = copy.deepcopy(filters)
    for f in out:
        vm = f.get("typed_config", {}).get("config", {}).get("vm_config", {})
        local = vm.get("code", {}).get("local", {})
        if local.get("filename", "").endswith("llmkube_model_router.wasm"):
            local["filename"] = str(wasm)
            vm["vm_id"] = vm.get("vm_id", "") + "-b"
    return out


def floor_filter(filters: list[dict]) -> dict:
    """The generated chain's wasm filter (same runtime, same settings) running the floor module:
    own VM, no plugin configuration."""
    own = next(f for f in filters if f.get("typed_config", {}).get("config", {}).get("vm_config"))
    f = copy.deepcopy(own)
    cfg = f["typed_config"]["config"]
    cfg["name"] = "floor"
    cfg.pop("configuration", None)
    cfg["vm_config"]["vm_id"] = "floor"
    cfg["vm_config"].pop("configuration", None)
    cfg["vm_config"]["code"] = {"local": {"filename": str(FLOOR_WASM)}}
    return f


def build(gen: dict, up_port: int, ab: bool,
          compare: Path | None = None) -> tuple[dict, list[dict]]:
    """The bootstrap and its arms: {key, title, port, header (sent by the client)}."""
    cfg = copy.deepcopy(gen)
    point_at(cfg, up_port)
    sr = cfg["static_resources"]
    tmpl = main_listener(cfg)
    sr["listeners"].remove(tmpl)
    hcm = hcm_of(tmpl)
    limit = tmpl.get("per_connection_buffer_limit_bytes", B.BUFFER_LIMIT)
    buf = B.buffer_filter()
    buf["typed_config"]["max_request_bytes"] = limit
    router = hcm["http_filters"][-1]
    own = hcm["http_filters"]
    routes = hcm["route_config"]
    variants = [
        ("L0", "native buffer", [buf, router], routes, ROUTE_KEY),
        ("L1", "buffer + json_to_metadata", [buf, B.json_to_metadata_filter(), router], routes,
         ROUTE_KEY),
        ("LF", "floor: a wasm filter that only takes the body", [floor_filter(own), router],
         routes, ROUTE_KEY),
        ("L2", "generated filter chain", own, routes, ""),
    ]
    if compare:
        variants.append(("L2b", f"generated filter chain, {compare.name}",
                         with_wasm(own, compare), routes, ""))
    if ab:
        variants.append(
            ("L0-404", "native buffer, no route header (catch-all 404)", [buf, router], routes, ""))
        if routes_buffer_for_retry(routes):
            nr = never_retrying_unbuffered(routes)
            variants += [
                ("L0-nr", "native buffer, no retry_on on routes that never retry", [buf, router],
                 nr, ROUTE_KEY),
                ("L2-nr", "generated chain, no retry_on on routes that never retry", own, nr, ""),
            ]
        else:
            rb = with_retry_buffering(routes)
            variants += [
                ("L0-rb", "native buffer, retry_on on every route", [buf, router], rb, ROUTE_KEY),
                ("L2-rb", "generated chain, retry_on on every route", own, rb, ""),
            ]
    if ab:
        # Same as L0 / L2 but keep-alive for every size: what the fresh connections cost.
        variants += [(k + "-ka", t + ", no reconnects", f, rc, h)
                     for k, t, f, rc, h in variants[:4] if k not in ("L1", "LF")]
    arms = []
    for key, title, filters, rc, header in variants:
        port = B.free_port()
        l = copy.deepcopy(tmpl)
        l["name"] = key
        l["address"]["socket_address"].update({"address": "127.0.0.1", "port_value": port})
        h = hcm_of(l)
        h["stat_prefix"] = key.lower()
        h["http_filters"] = copy.deepcopy(filters)
        h["route_config"] = copy.deepcopy(rc)
        h["route_config"]["name"] = f"{key}-routes"
        sr["listeners"].append(l)
        arms.append({"key": key, "title": title, "port": port,
                     "header": f"{ROUTE_HEADER}={header}" if header else "",
                     "reconnects": not key.endswith("-ka")})
    cfg["admin"] = {"address": {"socket_address": {"address": "127.0.0.1",
                                                   "port_value": B.free_port()}}}
    return cfg, arms


def bodies(d: Path, sizes: list[int]) -> dict:
    B.MODEL = MODEL
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for size in sizes:
        for v in B.VARIANTS:
            p = d / f"outside-{size}-{v}.json"
            p.write_bytes(B.make_body(size, v))
            out[(size, v)] = p
    return out


def verify(arms: list[dict], bs: dict) -> None:
    problems = []
    for a in arms:
        for (size, v), path in bs.items():
            body = path.read_bytes()
            extra = dict([a["header"].split("=", 1)]) if a["header"] else {}
            status, h, data = B.post(a["port"], body, extra)
            want = 404 if a["key"] == "L0-404" else 200
            if status != want:
                problems.append(f"{a['key']} {size}B model-{v}: HTTP {status}, want {want}: "
                                f"{data[:200]!r}")
            elif want == 200 and h.get("x-seen-bytes") != str(len(body)):
                problems.append(f"{a['key']} {size}B model-{v}: upstream saw "
                                f"{h.get('x-seen-bytes')} bytes, sent {len(body)}")
            elif a["key"].startswith("L2") and h.get("x-seen-backend") != BACKEND:
                problems.append(f"{a['key']} {size}B model-{v}: backend "
                                f"{h.get('x-seen-backend')!r}, want {BACKEND!r}")
    if problems:
        raise SystemExit("FAIL: requests are not served correctly, not measuring:\n  "
                         + "\n  ".join(problems))


def profile(env, arms: list[dict], bs: dict, size: int, seconds: int, wrk_bin: str,
            reconnects: bool = True) -> dict:
    """`perf record -g` on the Envoy process while each arm serves the `size` model-last body:
    the top symbols by self time. V8's JIT code has no perf map (Envoy passes V8 no flags), so
    the filter's own wasm code shows up as `[unknown]` / anonymous memory."""
    out = {}
    path = bs[(size, "last")]
    for arm in arms:
        data = B.OUT / f"perf-{arm['key']}.data"
        rec = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "999", "-p", str(env.pid),
                                "-o", str(data), "--", "sleep", str(seconds)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = B.wrk(wrk_bin, arm["port"], path, seconds, 1, 1, {"envoy": env.pid},
                  header=arm["header"],
                  reconnect=RECONNECT_EVERY if reconnects and size >= RECONNECT_FROM else 0)
        rec.wait()
        def report(sort: str) -> list[str]:
            rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--stdio",
                                  "--sort", sort, "--percent-limit", "1.5", "-g", "none"],
                                 capture_output=True, text=True).stdout
            return [l.strip() for l in rep.splitlines() if l.strip() and not l.startswith("#")]
        dso, top = report("dso"), report("dso,sym")
        out[arm["key"]] = {"requests": r["requests"], "cpu_us_per_request": B.cpu_per_request(r),
                           "by_dso": dso, "top": top[:25]}
        print(f"== perf {arm['key']} {size // B.KIB} KiB model-last: "
              f"{B.cpu_per_request(r):.0f} µs CPU/request", flush=True)
        for row in dso + top[:8]:
            print("   ", row, flush=True)
    return out


def run(a, started: dt.datetime, mach: dict, envoy_version: str, commit: str) -> None:
    # This module sees `bench` as imported, not bench.py's __main__ globals.
    sizes = [int(k) * B.KIB for k in a.sizes.split(",")] if a.sizes else B.SIZES
    gen = generate(B.OUT)
    bs = bodies(B.OUT / "bodies", sizes)
    up = B.Upstream()
    env = None
    runs = []
    try:
        compare = a.compare_wasm.resolve() if a.compare_wasm else None
        cfg, arms = build(gen, up.port, a.ab, compare)
        env = B.Envoy(a.envoy, cfg, B.OUT, "outside", 1)
        verify(arms, bs)
        print(f"== outside method: envoy pid {env.pid}; "
              + ", ".join(f"{x['key']}=:{x['port']}" for x in arms), flush=True)
        reps, dur = a.reps or 3, a.duration or 3
        if a.perf:
            keys = ("L0", "L0-rb", "L0-nr", "L2", "L2-rb", "L2-nr") if a.ab else ("L0", "L1", "LF", "L2", "L2b")
            prof = profile(env, [x for x in arms if x["key"] in keys], bs, max(sizes), dur, a.wrk)
            (B.RESULTS / "cpu-profile-generated-bootstrap.json").write_text(json.dumps(prof, indent=1) + "\n")
            return
        n = reps * len(bs) * len(arms)
        k = 0
        for rep in range(reps):
            for bi, ((size, v), path) in enumerate(bs.items()):
                shift = (rep + bi) % len(arms)
                for arm in arms[shift:] + arms[:shift]:
                    k += 1
                    rc = RECONNECT_EVERY if size >= RECONNECT_FROM and arm["reconnects"] else 0
                    kw = dict(header=arm["header"], reconnect=rc)
                    B.wrk(a.wrk, arm["port"], path, a.warmup, 1, 1, {"envoy": env.pid}, **kw)
                    r = B.wrk(a.wrk, arm["port"], path, dur, 1, 1, {"envoy": env.pid}, **kw)
                    if r["errors"]["status"] and arm["key"] != "L0-404":
                        raise SystemExit(f"FAIL: {arm['key']} answered non-2xx: {r['errors']}")
                    cpu = B.cpu_per_request(r)
                    runs.append({"rep": rep, "size": size, "variant": v, "listener": arm["key"],
                                 "reconnect_every": rc, "cpu_us_per_request": cpu, **r})
                    print(f"  [{k:3d}/{n}] rep {rep} {size // B.KIB:5d} KiB model-{v:5s} "
                          f"{arm['key']:7s} p50 {r['latency']['p50']:7d} µs  cpu/req "
                          f"{cpu:8.1f} µs  {r['rps']:7.0f} req/s", flush=True)
        stats = env.stats("retry|rq_total|json_to_metadata")
    finally:
        if env:
            env.stop()
        up.stop()
    result = {
        "mode": "outside", "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": mach, "envoy_version": envoy_version, "commit": commit,
        "params": {"reps": reps, "duration_s": dur, "warmup_s": a.warmup, "conns": 1,
                   "sizes": sizes, "variants": B.VARIANTS, "model": MODEL, "route": ROUTE_KEY,
                   "reconnect_every": RECONNECT_EVERY, "reconnect_from": RECONNECT_FROM,
                   "router_yaml": str(ROUTER_YAML.relative_to(B.ROOT))},
        "arms": {x["key"]: x["title"] for x in arms},
        "summary": summarize(runs, arms, sizes, reps), "envoy_stats": stats, "runs": runs,
    }
    # L2b (--compare-wasm) is one more arm of a full run: the before of a change, side by side.
    partial = bool(a.sizes) and not a.result
    name = a.result or (B.RESULT_NAMES["outside"] + ("-partial" if partial else ""))
    (B.RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result)
    print()
    print(md)
    if not a.no_doc and not partial:
        B.write_doc(name, md)


def summarize(runs: list, arms: list[dict], sizes: list[int], reps: int) -> list[dict]:
    def get(key, size, v, rep):
        return next(r for r in runs if (r["listener"], r["size"], r["variant"], r["rep"])
                    == (key, size, v, rep))

    keys = {a["key"] for a in arms}
    cells = []
    for size in sizes:
        for v in B.VARIANTS:
            for arm in arms:
                rs = [get(arm["key"], size, v, rep) for rep in range(reps)]
                cell = {"listener": arm["key"], "size": size, "variant": v,
                        "p50_us": B.med([r["latency"]["p50"] for r in rs]),
                        "cpu_us": B.med([r["cpu_us_per_request"] for r in rs])}
                # Added over L0 (native buffer) and, with the floor arm, over LF; each paired
                # per rep (the same rep's runs), then the median and the range over reps.
                for name, base_key in (("added", "L0"), ("over_floor", "LF")):
                    if base_key not in keys:
                        continue
                    base = [get(base_key, size, v, rep) for rep in range(reps)]
                    dp = [r["latency"]["p50"] - b["latency"]["p50"] for r, b in zip(rs, base)]
                    dc = [r["cpu_us_per_request"] - b["cpu_us_per_request"]
                          for r, b in zip(rs, base)]
                    cell.update({f"{name}_p50_us": B.med(dp), f"{name}_cpu_us": B.med(dc),
                                 f"{name}_p50_range": [min(dp), max(dp)],
                                 f"{name}_cpu_range": [min(dc), max(dc)]})
                cells.append(cell)
    return cells


def paired(res: dict, size: int, v: str) -> float:
    """Median over reps of L2 − L2b CPU per request (the same rep's runs)."""
    by = {(r["listener"], r["rep"]): r["cpu_us_per_request"] for r in res["runs"]
          if r["size"] == size and r["variant"] == v}
    return B.med([by[("L2", k)] - by[("L2b", k)] for k in range(res["params"]["reps"])])


def floor_table(res: dict, cell) -> list[str]:
    """The chain (and the other build, L2b) over native buffer and over the floor arm LF:
    medians over reps of paired differences, [min – max] over reps."""
    if "LF" not in res["arms"]:
        return []
    p = res["params"]
    ours = [k for k in ("L2b", "L2") if k in res["arms"]]
    names = {"L2": "L2 (this build)", "L2b": f"L2b ({res['arms']['L2b']})"} \
        if "L2b" in ours else {"L2": "L2 the generated chain"}

    def rng(c, what):
        lo, hi = c[f"{what}_range"]
        return f"{B.fmt_us(c[what + '_us'])} [{B.fmt_us(lo)} – {B.fmt_us(hi)}]"
    L = ["Added cost over native buffer (L0) and over the floor (LF, a wasm filter that only "
         "takes the body), µs: median over reps of the paired difference [min – max over reps]; "
         "p50 latency first, Envoy CPU per request second:", "",
         "| body | model | json_to_metadata over L0, p50 / CPU | floor over L0, p50 / CPU | "
         + " | ".join(f"{names[k]} over L0, p50 / CPU | {names[k]} over floor, p50 / CPU"
                      for k in ours) + " |",
         "|---|---|--:|--:|" + "--:|--:|" * len(ours)]
    for size in p["sizes"]:
        for v in p["variants"]:
            j, f = cell("L1", size, v), cell("LF", size, v)
            row = [f"{B.fmt_us(j['added_p50_us'])} / {B.fmt_us(j['added_cpu_us'])}",
                   f"{B.fmt_us(f['added_p50_us'])} / {B.fmt_us(f['added_cpu_us'])}"]
            for k in ours:
                o = cell(k, size, v)
                row += [f"{B.fmt_us(o['added_p50_us'])} / {B.fmt_us(o['added_cpu_us'])}",
                        f"{rng(o, 'over_floor_p50')} / {rng(o, 'over_floor_cpu')}"]
            L.append(f"| {B.size_label(size)} | {v} | " + " | ".join(row) + " |")
    big = [s for s in p["sizes"] if s > 16 * B.KIB]
    if big:
        L.append("")
        for k in ours:
            for v in p["variants"]:
                for what, label in (("over_floor_p50_us", "p50"), ("over_floor_cpu_us", "CPU")):
                    xs = [s / B.KIB for s in p["sizes"]]
                    ys = [cell(k, s, v)[what] for s in p["sizes"]]
                    L.append(f"- {names[k]}, model {v}: slope over the floor ({label}) "
                             f"{B.slope(xs, ys):.3f} µs/KiB over {B.size_label(min(p['sizes']))}"
                             f" – {B.size_label(max(p['sizes']))}")
    return L + [""]


def render(res: dict) -> str:
    p = res["params"]
    cells = res["summary"]

    def cell(key, size, v):
        return next(c for c in cells if (c["listener"], c["size"], c["variant"]) == (key, size, v))

    L = [f"Run **outside** · {res['started']} → {res['finished']} (UTC) · commit `{res['commit']}`",
         "",
         f"- method: one Envoy `{res['envoy_version']}`, --concurrency 1, the bootstrap "
         f"`llmkube-gen` makes of `{p['router_yaml']}` with every cluster pointed at the bench "
         f"upstream; listeners share its HTTP connection manager and route table and differ only "
         f"in HTTP filters; L0/L1 requests carry `x-llmkube-route: {p['route']}` (the route L2's "
         f"filter picks); model `{p['model']}` first or last; wrk 1 connection, bodies ≥ "
         f"{p['reconnect_from'] // B.KIB} KiB on a fresh connection every {p['reconnect_every']} "
         f"requests; {p['reps']} interleaved reps × ({p['warmup_s']} s warm-up + "
         f"{p['duration_s']} s), medians; added values paired per rep against L0",
         f"- machine: {res['machine']['cpu']}, {res['machine']['cores']} cores; load average at "
         f"start {res['machine']['loadavg_start'][0]:.2f}",
         "",
         *floor_table(res, cell),
         "| body | model | json_to_metadata +p50 / +CPU µs | ours +p50 / +CPU µs | ratio p50 / CPU "
         "| ours ÷ KiB, p50 / CPU | ours marginal µs/KiB over 1 KiB, p50 / CPU |",
         "|---|---|--:|--:|--:|--:|--:|"]
    small = min(p["sizes"])
    for size in p["sizes"]:
        for v in p["variants"]:
            j, o = cell("L1", size, v), cell("L2", size, v)

            def ratio(x, y):
                return f"{x / y:.2f}" if y > 0 else "–"
            kib = size / B.KIB
            per = "—" if size < 16 * B.KIB else \
                f"{o['added_p50_us'] / kib:.2f} / {o['added_cpu_us'] / kib:.2f}"
            if size == small:
                marg = "—"
            else:
                s0, dk = cell("L2", small, v), kib - small / B.KIB
                marg = (f"{(o['added_p50_us'] - s0['added_p50_us']) / dk:.2f} / "
                        f"{(o['added_cpu_us'] - s0['added_cpu_us']) / dk:.2f}")
            L.append(f"| {B.size_label(size)} | {v} | {B.fmt_us(j['added_p50_us'])} / "
                     f"{B.fmt_us(j['added_cpu_us'])} | {B.fmt_us(o['added_p50_us'])} / "
                     f"{B.fmt_us(o['added_cpu_us'])} | {ratio(o['added_p50_us'], j['added_p50_us'])}"
                     f" / {ratio(o['added_cpu_us'], j['added_cpu_us'])} | {per} | {marg} |")
    big = [s for s in p["sizes"] if s >= 256 * B.KIB]
    if len(big) >= 2:
        for what in ("added_p50_us", "added_cpu_us"):
            pts = [(s / B.KIB, cell("L2", s, v)[what]) for s in p["sizes"] for v in p["variants"]]
            L.append("")
            L.append(f"Slope of ours over all sizes ({'p50' if 'p50' in what else 'CPU'}): "
                     f"{B.slope([x for x, _ in pts], [y for _, y in pts]):.3f} µs/KiB; "
                     "json_to_metadata: "
                     f"{B.slope([s / B.KIB for s in p['sizes'] for _ in p['variants']], [cell('L1', s, v)[what] for s in p['sizes'] for v in p['variants']]):.3f} µs/KiB")
    if "L2b" in res["arms"] and len(big) >= 2:
        L += ["", f"The other build (L2b, {res['arms']['L2b']}) in the same run, added over L0 "
              "(p50 / CPU µs), and its slopes:", "",
              "| body | model | L2b | L2 (this build) | L2 − L2b, paired per rep, CPU µs |",
              "|---|---|--:|--:|--:|"]
        for size in p["sizes"]:
            for v in p["variants"]:
                o, b = cell("L2", size, v), cell("L2b", size, v)
                L.append(f"| {B.size_label(size)} | {v} | {B.fmt_us(b['added_p50_us'])} / "
                         f"{B.fmt_us(b['added_cpu_us'])} | {B.fmt_us(o['added_p50_us'])} / "
                         f"{B.fmt_us(o['added_cpu_us'])} | {B.fmt_us(paired(res, size, v))} |")
        for what in ("added_p50_us", "added_cpu_us"):
            pts = [(s / B.KIB, cell("L2b", s, v)[what]) for s in p["sizes"] for v in p["variants"]]
            L.append("")
            L.append(f"Slope of L2b over all sizes ({'p50' if 'p50' in what else 'CPU'}): "
                     f"{B.slope([x for x, _ in pts], [y for _, y in pts]):.3f} µs/KiB")
    if "L0-404" in res["arms"]:
        L += ["", "Ours over L0-404, the baseline of a run whose L0/L1 requests carry no "
              "`x-llmkube-route` (they get the catch-all 404 and never send the body upstream; "
              "L2's requests do):", "",
              "| body | model | ours over L0-404 p50 / CPU µs | ÷ KiB p50 / CPU | of which "
              "forwarding the body (L0 − L0-404) p50 / CPU µs |", "|---|---|--:|--:|--:|"]
        for size in p["sizes"]:
            for v in p["variants"]:
                o, z, b0 = cell("L2", size, v), cell("L0-404", size, v), cell("L0", size, v)
                dp, dc = o["p50_us"] - z["p50_us"], o["cpu_us"] - z["cpu_us"]
                kib = size / B.KIB
                L.append(f"| {B.size_label(size)} | {v} | {B.fmt_us(dp)} / {B.fmt_us(dc)} | "
                         + ("—" if size < 16 * B.KIB else f"{dp / kib:.2f} / {dc / kib:.2f}")
                         + f" | {B.fmt_us(-z['added_p50_us'])} / {B.fmt_us(-z['added_cpu_us'])} |")
    L += ["", "Every arm (p50 µs / Envoy CPU µs per request; added over L0 in brackets):", "",
          "| body | model | " + " | ".join(f"{k} {t}" for k, t in res["arms"].items()) + " |",
          "|---|---|" + "--:|" * len(res["arms"])]
    for size in p["sizes"]:
        for v in p["variants"]:
            row = []
            for k in res["arms"]:
                c = cell(k, size, v)
                row.append(f"{B.fmt_us(c['p50_us'])} / {B.fmt_us(c['cpu_us'])}"
                           + ("" if k == "L0" else
                              f" [{B.fmt_us(c['added_p50_us'])} / {B.fmt_us(c['added_cpu_us'])}]"))
            L.append(f"| {B.size_label(size)} | {v} | " + " | ".join(row) + " |")
    return "\n".join(L)
