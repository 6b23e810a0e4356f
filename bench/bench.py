#!/usr/bin/env python3
"""Side-by-side latency benchmark of our proxy-wasm filters against Envoy's native filters.

Driven by bench/run, which makes sure the prerequisites exist. This script:
  1. writes the request bodies (realistic chat-completions JSON, model first / model last),
  2. writes ONE Envoy bootstrap with four listeners sharing one fixed-response upstream,
  3. starts the upstream and Envoy (--concurrency 1, own --base-id), checks that every body gets a
     200 through every listener (and that our filter really routed it) and fails loudly otherwise,
  4. runs wrk (fixed duration, after a warm-up) against each listener, once with 1 connection (no
     queueing: the added p50 is the added service time, the headline for latency and µs/KiB) and
     once with 4 (closed-loop load: throughput), listeners interleaved within each repetition,
     several repetitions,
  5. prints tables and writes bench/results/<result>.json (every run) and <result>.md (its
     tables), <result> naming what the mode measures (RESULT_NAMES).

It measures; it asserts nothing about times.  Python 3.11 stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / "out"
RESULTS = BENCH / "results"
# What each mode measures: the name of its files in bench/results/ (.json raw, .md tables).
RESULT_NAMES = {
    "full": "added-latency-vs-native",
    "quick": "added-latency-vs-native-quick",
    "outside": "generated-bootstrap-cost",
}
WASM_DIR = ROOT / "target" / "wasm32-wasip1" / "release"
UPSTREAM_BIN = BENCH / "target" / "release" / "bench-upstream"
LUA = BENCH / "post.lua"

KIB = 1024
MIB = 1024 * KIB
SIZES = [1 * KIB, 16 * KIB, 256 * KIB, 2 * MIB]
VARIANTS = ["first", "last"]  # where the "model" field sits in the body
PATH = "/v1/chat/completions"

# The filter's own limit and Envoy's buffer limits, consistent with docs/architecture.md:
# per_connection_buffer_limit_bytes = max_body_bytes + 1 MiB, above the largest body (2 MiB).
MAX_BODY_BYTES = 4 * MIB
BUFFER_LIMIT = MAX_BODY_BYTES + MIB

# The model every benchmark body asks for. With the plugin config below it walks all five rules
# without a match and is routed by BackendNameMatch on the display name: the longest decision path.
# It names the external backend, so the chain does what it does for a request bound for a cloud
# provider: the model/rule filter stamps the model span, the per-attempt filter rewrites `model`.
MODEL = "openai/gpt-5"
EXPECTED_BACKEND = "cloud-gpt"
# What a client may send under x-llmkube-backend; our filters must replace it.
SPOOFED_BACKEND = "spoofed-backend"

# A realistic plugin config (router_core::config::PluginConfig), modelled on
# envoy-examples/router.yaml: 4 backends, 5 rules.
MODEL_ROUTER_CONFIG = {
    "router": "llm/llm-router",
    "max_body_bytes": MAX_BODY_BYTES,
    "default_route_strategy": "BackendNameMatch",
    "default_route": "qwen3-8b",
    "sensitive_classifications": ["pii", "phi"],
    "backends": [
        {"name": "qwen3-8b", "tier": "local", "capabilities": ["tools"],
         "model_info": {"context_length": 32768}, "timeout_ms": 60000},
        {"name": "llama-3-70b", "display_name": "meta-llama/Llama-3.3-70B-Instruct",
         "tier": "local", "capabilities": ["tools", "long-context"],
         "model_info": {"context_length": 131072}},
        {"name": "mistral-small", "display_name": "mistralai/Mistral-Small-3.2-24B-Instruct",
         "tier": "local", "capabilities": ["tools"], "model_info": {"context_length": 32768}},
        {"name": "cloud-gpt", "display_name": "openai/gpt-5", "tier": "cloud",
         "capabilities": ["tools", "vision", "long-context"],
         "model_info": {"context_length": 400000}, "external_model": "gpt-5-2025-08-07",
         "timeout_ms": 90000},
    ],
    "rules": [
        {"name": "regulated-data", "data_classification": ["pii", "phi"], "fail_closed": True,
         "backends": ["llama-3-70b", "qwen3-8b"], "timeout_ms": 30000},
        {"name": "qwen-family", "models": ["qwen3-*"], "backends": ["qwen3-8b"]},
        {"name": "research-team", "headers": [{"name": "x-team", "value": "research"}],
         "strategy": "weighted", "backends": ["llama-3-70b", "cloud-gpt"]},
        {"name": "complex-tasks", "task_complexity": "complex",
         "backends": ["llama-3-70b", "cloud-gpt"]},
        {"name": "coders", "models": ["*-coder*", "deepseek-*"],
         "backends": ["mistral-small", "qwen3-8b"]},
    ],
}
BACKENDS = [b["name"] for b in MODEL_ROUTER_CONFIG["backends"]]


@dataclass
class OurFilter:
    """One of our wasm filters as it is placed in a filter chain."""
    name: str           # filter config name
    crate: str          # cargo package, built with --release --target wasm32-wasip1
    wasm: str           # file under target/wasm32-wasip1/release
    root_id: str
    vm_id: str
    config: dict


# ---------------------------------------------------------------------------------------------
# THE FULL CHAIN. Every filter of ours that exists, in the order the example router configures
# them. L4 runs all of these; L3 runs only the model/rule filter. When budgets / endpoint hinting
# land, append them here (and nothing else needs to change).
# ---------------------------------------------------------------------------------------------
MODEL_ROUTER = OurFilter(
    name="llmkube.model-router", crate="llmkube-model-router",
    wasm="llmkube_model_router.wasm", root_id="model-router", vm_id="llmkube",
    config=MODEL_ROUTER_CONFIG)
# The per-attempt upstream filter, on the cluster as the generator places it for a route that can
# reach an external backend. The bench's endpoint is labelled as the external backend cloud-gpt and
# the requests are routed to it, so every L4 request is rewritten (buffer, rewrite `model` from the
# span the model/rule filter stamped, fix content-length).
UPSTREAM = OurFilter(
    name="llmkube.upstream", crate="llmkube-upstream",
    wasm="llmkube_upstream.wasm", root_id="upstream", vm_id="llmkube-upstream",
    config=MODEL_ROUTER_CONFIG)
UPSTREAM_ENDPOINT = {"backend": "cloud-gpt", "tier": "cloud"}
UPSTREAM_MODEL = "gpt-5-2025-08-07"
FULL_CHAIN: list[OurFilter] = [
    MODEL_ROUTER,
]
# Filters of ours that run on the upstream cluster (per attempt) in the full chain.
FULL_CHAIN_UPSTREAM: list[OurFilter] = [
    UPSTREAM,
]


@dataclass
class Listener:
    key: str
    title: str
    kind: str                         # "native" or "ours"
    filters: list = field(default_factory=list)   # http filter dicts, router appended later
    ours: list = field(default_factory=list)      # OurFilter entries used
    port: int = 0
    upstream: list = field(default_factory=list)  # OurFilter entries on its upstream cluster


def buffer_filter() -> dict:
    return {"name": "envoy.filters.http.buffer", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": BUFFER_LIMIT}}


def json_to_metadata_filter() -> dict:
    return {"name": "envoy.filters.http.json_to_metadata", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.json_to_metadata.v3.JsonToMetadata",
        "request_rules": {"rules": [{
            "selectors": [{"key": "model"}],
            "on_present": {"metadata_namespace": "envoy.lb", "key": "model", "type": "STRING"},
        }]}}}


def wasm_filter(f: OurFilter) -> dict:
    return {"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {
            "name": f.name,
            "root_id": f.root_id,
            "allow_on_headers_stop_iteration": True,
            "fail_open": False,
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                              "value": json.dumps(f.config, separators=(",", ":"))},
            "vm_config": {"vm_id": f.vm_id, "runtime": "envoy.wasm.runtime.v8",
                          "code": {"local": {"filename": str(WASM_DIR / f.wasm)}}},
        }}}


# A second build of the model/rule filter (bench/bench.py --compare-wasm PATH) runs as listener L3b
# next to L3 in the same Envoy, so a change can be judged side by side under the same noise.
COMPARE_WASM: Path | None = None


def listeners(with_wasm: bool = True) -> list[Listener]:
    ls = [
        Listener("L1", "native buffer", "native", [buffer_filter()]),
        Listener("L2", "buffer + json_to_metadata", "native",
                 [buffer_filter(), json_to_metadata_filter()]),
    ]
    if with_wasm:
        ls.append(Listener("L3", "model/rule filter (wasm)", "ours",
                           [wasm_filter(MODEL_ROUTER)], [MODEL_ROUTER]))
        ls.append(Listener("L4", "full chain (wasm)", "ours",
                           [wasm_filter(f) for f in FULL_CHAIN],
                           list(FULL_CHAIN) + list(FULL_CHAIN_UPSTREAM),
                           upstream=list(FULL_CHAIN_UPSTREAM)))
        if COMPARE_WASM:
            alt = OurFilter(name="llmkube.model-router-b", crate=MODEL_ROUTER.crate,
                            wasm=str(COMPARE_WASM), root_id=MODEL_ROUTER.root_id,
                            vm_id="llmkube-b", config=MODEL_ROUTER_CONFIG)
            ls.append(Listener("L3b", f"model/rule filter ({COMPARE_WASM.name})", "ours",
                               [wasm_filter(alt)], [alt]))
    return ls


# ---------------------------------------------------------------------------------------------
# Bodies
# ---------------------------------------------------------------------------------------------
SYSTEM = ("You are a careful senior software engineer helping a colleague review a change to a "
          "distributed system. Answer precisely, cite the lines you refer to, and say \"I don't "
          "know\" when unsure. Prefer short code blocks; use \u00e9t\u00e9-style UTF-8 freely.")
WORDS = ("the request router buffers body bytes before it picks a backend while tokens stream "
         "back through envoy so latency matters and every filter adds a little; consider the "
         "queue depth, the p99, retries, timeouts, and what happens when a pod restarts").split()
CODE = ("fn route(req: &Request) -> Result<Backend, Error> {\n    let model = req.model()?;\n"
        "    if model.starts_with(\"qwen3-\") { return Ok(Backend::Local(\"qwen3-8b\")); }\n"
        "    Err(Error::NotFound(format!(\"no route for {model}\")))\n}\n")


def filler(n_chars: int, seed: int) -> str:
    out, i = [], seed
    total = 0
    while total < n_chars:
        if i % 37 == 36:
            piece = "\n```rust\n" + CODE + "```\n"
        elif i % 11 == 10:
            piece = "\n\n"
        else:
            piece = WORDS[(i * 7) % len(WORDS)] + " "
        out.append(piece)
        total += len(piece)
        i += 1
    return "".join(out)[:n_chars]


def make_body(size: int, variant: str) -> bytes:
    """Valid chat-completions JSON of exactly `size` bytes, model first or last."""
    def build(pad: int) -> bytes:
        turns = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Here is the diff and the failing log. " + filler(200, 1)},
            {"role": "assistant", "content": "Which backend did the request hit? " + filler(120, 2)},
            {"role": "user", "content": "Full context follows.\n" + filler(pad, 3)},
        ]
        rest = {"messages": turns, "temperature": 0.2, "max_tokens": 1024,
                "stream": False, "user": "bench-client-7"}
        doc = {"model": MODEL, **rest} if variant == "first" else {**rest, "model": MODEL}
        return json.dumps(doc, ensure_ascii=False, separators=(", ", ": ")).encode()

    base = len(build(0))
    if base > size:
        raise SystemExit(f"body size {size} is smaller than the skeleton ({base})")
    pad = size - base
    for _ in range(10):  # escapes (\n, \") make the encoded length differ from the pad length
        body = build(pad)
        if len(body) == size:
            return body
        pad += size - len(body)
    raise SystemExit(f"could not build an exact {size}-byte body")


def write_bodies(d: Path) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    paths = {}
    for size in SIZES:
        for v in VARIANTS:
            body = make_body(size, v)
            json.loads(body)  # valid JSON
            p = d / f"body-{size}-{v}.json"
            p.write_bytes(body)
            paths[(size, v)] = p
    return paths


# ---------------------------------------------------------------------------------------------
# Bootstrap
# ---------------------------------------------------------------------------------------------
def cluster(name: str, port: int) -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": "127.0.0.1", "port_value": port}}}}]}]}}


def routes_for(l: Listener) -> list:
    if l.kind == "native":
        return [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]
    rs = [{"match": {"prefix": "/", "headers": [{"name": "x-llmkube-backend",
                                                  "string_match": {"exact": b}}]},
           "route": {"cluster": f"{l.key}-attempt" if l.upstream else f"backend-{b}"},
           "request_headers_to_remove": ["authorization"]} for b in BACKENDS]
    rs.append({"match": {"prefix": "/"}, "direct_response": {"status": 404, "body": {
        "inline_string": '{"error":{"message":"no route","type":"invalid_request_error"}}'}}})
    return rs


def bootstrap(ls: list[Listener], admin_port: int, up_port: int) -> dict:
    lis = []
    for l in ls:
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": l.key.lower(),
            "route_config": {"name": f"{l.key}-routes", "virtual_hosts": [
                {"name": "all", "domains": ["*"], "routes": routes_for(l)}]},
            "http_filters": l.filters + [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }
        lis.append({"name": l.key, "per_connection_buffer_limit_bytes": BUFFER_LIMIT,
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": l.port}},
                    "filter_chains": [{"filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": hcm}]}]})
    clusters = [cluster("upstream", up_port)]
    if any(l.kind == "ours" for l in ls):
        clusters += [cluster(f"backend-{b}", up_port) for b in BACKENDS]
    for l in ls:
        if l.upstream:
            c = cluster(f"{l.key}-attempt", up_port)
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["metadata"] = {
                "filter_metadata": {"llmkube": UPSTREAM_ENDPOINT}}
            c["typed_extension_protocol_options"] = {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http_protocol_options": {}},
                    "http_filters": [wasm_filter(f) for f in l.upstream] + [{
                        "name": "envoy.filters.http.upstream_codec", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}}]}}
            clusters.append(c)
    return {"admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                     "port_value": admin_port}}},
            "static_resources": {"listeners": lis, "clusters": clusters}}


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def http_get(port: int, path: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read().decode()


class Envoy:
    def __init__(self, envoy: str, cfg: dict, workdir: Path, tag: str, concurrency: int = 1):
        self.admin = cfg["admin"]["address"]["socket_address"]["port_value"]
        self.cfg_path = workdir / f"envoy-{tag}.json"
        self.cfg_path.write_text(json.dumps(cfg, indent=1))
        self.log_path = workdir / f"envoy-{tag}.log"
        v = subprocess.run([envoy, "--mode", "validate", "-c", str(self.cfg_path)],
                           capture_output=True, text=True)
        if v.returncode != 0:
            raise SystemExit(f"FAIL: envoy rejects {self.cfg_path}:\n{v.stdout}{v.stderr}")
        base_id = 40000 + (os.getpid() % 1000) * 10 + (hash(tag) % 10)
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen(
            [envoy, "-c", str(self.cfg_path), "--concurrency", str(concurrency),
             "--base-id", str(base_id), "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.pid = self._elf_pid()
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.p.poll() is not None:
                raise SystemExit(f"FAIL: envoy exited ({self.p.returncode}); see {self.log_path}:\n"
                                 + self.log_path.read_text()[-3000:])
            try:
                if http_get(self.admin, "/ready", 1).strip() == "LIVE":
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"FAIL: envoy not ready after 30 s; see {self.log_path}")

    def _elf_pid(self) -> int:
        # .venv/bin/envoy is a Python shim that execs the real binary: same pid after exec.
        return self.p.pid

    def stats(self, flt: str) -> dict:
        out = {}
        for line in http_get(self.admin, f"/stats?filter={flt}").splitlines():
            k, _, v = line.partition(": ")
            out[k] = v
        return out

    def memory(self) -> dict:
        try:
            return json.loads(http_get(self.admin, "/memory"))
        except (OSError, ValueError):
            return {}

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


class Upstream:
    def __init__(self):
        self.p = subprocess.Popen([str(UPSTREAM_BIN), "0"], stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            raise SystemExit("FAIL: upstream did not start")
        self.port = int(line[1])

    def stop(self):
        self.p.terminate()
        self.p.wait(5)


# ---------------------------------------------------------------------------------------------
# Verification: every body gets a 200 through every listener, and really went through the filters
# ---------------------------------------------------------------------------------------------
def post(port: int, body: bytes, extra: dict | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    hdrs = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    hdrs.update(extra or {})
    c.request("POST", PATH, body=body, headers=hdrs)
    r = c.getresponse()
    data = r.read()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    c.close()
    return out


def verify(env: Envoy, ls: list[Listener], bodies: dict):
    problems = []
    before = env.stats("json_to_metadata")
    for l in ls:
        for (size, v), path in bodies.items():
            body = path.read_bytes()
            # A client-supplied decision header must not survive our filter.
            status, h, data = post(l.port, body, {"x-llmkube-backend": SPOOFED_BACKEND})
            want_backend = EXPECTED_BACKEND if l.kind == "ours" else SPOOFED_BACKEND
            if l.upstream:
                # The per-attempt filter keeps the router's decision headers away from an
                # external provider (the length check below shows `model` was rewritten).
                want_backend = "-"
            if status != 200:
                problems.append(f"{l.key} {size}B model-{v}: HTTP {status} {data[:200]!r}")
            # The upstream filter rewrites `model` to the provider's name on the way out.
            want_len = len(body) + (len(UPSTREAM_MODEL) - len(MODEL) if l.upstream else 0)
            if status != 200:
                pass
            elif h.get("x-seen-bytes") != str(want_len):
                problems.append(f"{l.key} {size}B model-{v}: upstream saw {h.get('x-seen-bytes')}"
                                f" bytes, sent {len(body)}")
            elif h.get("x-seen-backend") != want_backend:
                problems.append(f"{l.key} {size}B model-{v}: upstream saw backend "
                                f"{h.get('x-seen-backend')!r}, want {want_backend!r}")
    after = env.stats("json_to_metadata")
    n = len(bodies)
    for k, v in after.items():
        if k.endswith("rq.success"):
            got = int(v) - int(before.get(k, 0))
            if got != n:
                problems.append(f"L2: json_to_metadata {k} went up by {got}, want {n}")
            break
    else:
        problems.append(f"L2: no json_to_metadata success counter in stats: {sorted(after)}")
    if problems:
        raise SystemExit("FAIL: requests are not served correctly, not measuring:\n  "
                         + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------
def wrk(wrk_bin: str, port: int, body: Path, seconds: int, conns: int, threads: int,
        pids: dict, header: str = "", reconnect: int = 0) -> dict:
    """One wrk run. `header` "name=value" adds a request header; `reconnect` N > 0 closes the
    connection after every Nth request (post.lua)."""
    with tempfile.NamedTemporaryFile(prefix="wrk-", suffix=".json", dir=OUT, delete=False) as t:
        res_path = Path(t.name)
    env = dict(os.environ, BENCH_BODY=str(body), BENCH_OUT=str(res_path), BENCH_HEADER=header,
               BENCH_RECONNECT=str(reconnect))
    cpu0 = {k: proc_cpu_s(p) for k, p in pids.items()}
    t0 = time.monotonic()
    p = subprocess.Popen([wrk_bin, "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s",
                          "--timeout", "10s", "-s", str(LUA), f"http://127.0.0.1:{port}{PATH}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    cpu = {k: (proc_cpu_s(p_) - cpu0[k]) / wall * 100 for k, p_ in pids.items()}
    cpu["wrk"] = (ru.ru_utime + ru.ru_stime) / wall * 100
    if p.returncode != 0 or not res_path.stat().st_size:
        raise SystemExit(f"FAIL: wrk failed ({p.returncode}):\n{out.decode(errors='replace')}")
    r = json.loads(res_path.read_text())
    res_path.unlink()
    r["cpu_pct"] = {k: round(v, 1) for k, v in cpu.items()}
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def cpu_per_request(r: dict) -> float:
    """Envoy CPU time (µs) per request served in one wrk run."""
    return r["cpu_pct"]["envoy"] / 100 / r["rps"] * 1e6


@contextlib.contextmanager
def serving(envoy: str, ls: list[Listener], tag: str):
    """The bench upstream and one Envoy (--concurrency 1) serving `ls` on fresh ports."""
    for l in ls:
        l.port = free_port()
    up = Upstream()
    env = None
    try:
        env = Envoy(envoy, bootstrap(ls, free_port(), up.port), OUT, tag, 1)
        yield env
    finally:
        if env:
            env.stop()
        up.stop()


def interleaved_cpu(env: Envoy, ls: list[Listener], bodies: dict, reps: int, duration: int,
                    conns: int = 4) -> dict:
    """Envoy CPU per request of every listener on every body ({name: path}), the listeners'
    order rotating so none always runs first: {(listener key, body name): [µs per rep]}."""
    cpu: dict = {}
    for rep in range(reps):
        for bi, (name, body) in enumerate(bodies.items()):
            shift = (rep + bi) % len(ls)
            for l in ls[shift:] + ls[:shift]:
                r = wrk("wrk", l.port, body, duration, conns, 1, {"envoy": env.pid})
                cpu.setdefault((l.key, name), []).append(cpu_per_request(r))
        print(f"  rep {rep + 1}/{reps} done", file=sys.stderr, flush=True)
    return cpu


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------------------------
# Memory probe: idle / after-traffic RSS with and without wasm, 1 and 2 workers
# ---------------------------------------------------------------------------------------------
def memory_probe(envoy: str, up_port: int, bodies: dict, workdir: Path) -> dict:
    out = {}
    for with_wasm in (False, True):
        for conc in (1, 2):
            ls = listeners(with_wasm)
            for l in ls:
                l.port = free_port()
            tag = f"mem-{'wasm' if with_wasm else 'native'}-c{conc}"
            e = Envoy(envoy, bootstrap(ls, free_port(), up_port), workdir, tag, conc)
            try:
                time.sleep(0.5)
                idle = proc_rss_kib(e.pid)
                # A few requests of every size through every listener, several connections so
                # that every worker sees the largest body.
                for _ in range(2 * conc):
                    for l in ls:
                        for (size, v), path in bodies.items():
                            post(l.port, path.read_bytes())
                loaded = proc_rss_kib(e.pid)
                out[tag] = {"rss_idle_kib": idle, "rss_after_traffic_kib": loaded,
                            "wasm_stats": e.stats("wasm") if with_wasm else {}}
            finally:
                e.stop()
    d = {}
    for state in ("rss_idle_kib", "rss_after_traffic_kib"):
        w1 = out["mem-wasm-c1"][state] - out["mem-native-c1"][state]
        w2 = out["mem-wasm-c2"][state] - out["mem-native-c2"][state]
        d[state.replace("rss_", "wasm_").replace("_kib", "")] = {
            "one_worker_kib": w1, "two_workers_kib": w2, "per_extra_worker_kib": w2 - w1}
    return {"probes": out, "wasm_delta": d}


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def sh(*cmd) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return ""


def machine() -> dict:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(int(mem) / MIB, 1),
            "kernel": platform.release(), "loadavg_start": os.getloadavg()}


def main():
    global SIZES, COMPARE_WASM
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, 2 s runs")
    ap.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    ap.add_argument("--duration", type=int, help="seconds per measured run (default 4; quick 2)")
    ap.add_argument("--warmup", type=int, default=1, help="seconds of warm-up before each run")
    ap.add_argument("--conns", default="1,4",
                    help="wrk connection counts, comma-separated (default 1,4). Every cell is "
                         "measured once per count, back to back. The first count is the headline "
                         "for latency and µs/KiB: with 1 connection there is no queueing, so the "
                         "added p50 is the added service time per request. The last is the "
                         "loaded run (throughput, latency under queueing).")
    ap.add_argument("--sizes", help="body sizes in KiB, comma-separated (default 1,16,256,2048)")
    ap.add_argument("--compare-wasm", type=Path,
                    help="another build of llmkube_model_router.wasm, run as listener L3b next "
                         "to L3 (side-by-side A/B in one Envoy)")
    ap.add_argument("--no-memory", action="store_true",
                    help="skip the RSS probe (four extra Envoys); for quick A/B runs")
    ap.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    ap.add_argument("--envoy", default=os.environ.get("ENVOY_BIN")
                    or str(ROOT / ".venv" / "bin" / "envoy"))
    ap.add_argument("--wrk", default=shutil.which("wrk") or "wrk")
    ap.add_argument("--no-doc", action="store_true",
                    help="do not write the tables to bench/results/<result>.md")
    ap.add_argument("--outside", action="store_true",
                    help="measure inside the generated bootstrap (bench/outside.py): L0 buffer, "
                         "L1 + json_to_metadata, L2 the generated chain, one route table; "
                         "1 connection, fresh connections for large bodies, Envoy CPU per request")
    ap.add_argument("--ab", action="store_true",
                    help="with --outside: also the A/B arms (L0 without the route header, the other "
                         "retry_on setting for one-backend routes, keep-alive at every size)")
    ap.add_argument("--perf", action="store_true",
                    help="perf record -g on Envoy while each listener (with --outside: L0, L1, "
                         "L2; else all but json_to_metadata) serves the largest body (model last) "
                         "instead of the timed run; writes bench/results/cpu-profile-{generated-bootstrap,listeners}.json")
    ap.add_argument("--result",
                    help="with --outside: the name of the result files in bench/results/ "
                         "(default generated-bootstrap-cost; -partial with --sizes)")
    ap.add_argument("--list-crates", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--render", choices=["quick", "full", "outside"],
                    help="only re-render the mode's bench/results/<result>.json into its .md, no run")
    a = ap.parse_args()
    if a.render:
        res = json.loads((RESULTS / f"{RESULT_NAMES[a.render]}.json").read_text())
        if a.render == "outside":
            import outside
            md = outside.render(res)
        else:
            SIZES = res["params"]["sizes"]
            ls = [Listener(k, t, "") for k, t in res["listeners"].items()]
            res["summary"] = {"by_conns": {str(c): summarize(
                [r for r in res["runs"] if r["conns"] == c], ls, res["params"]["reps"])
                for c in res["params"]["conns"]}}
            md = render(res)
        print(md)
        if not a.no_doc:
            write_doc(RESULT_NAMES[a.render], md)
        return
    if a.list_crates:
        print("\n".join(sorted({f.crate for f in FULL_CHAIN + FULL_CHAIN_UPSTREAM} | {MODEL_ROUTER.crate})))
        return
    mode = "quick" if a.quick else "full"
    reps = a.reps or (1 if a.quick else 3)
    dur = a.duration or (2 if a.quick else 3)
    conns = [int(c) for c in str(a.conns).split(",") if c.strip()]
    if a.sizes:
        SIZES = [int(k) * KIB for k in a.sizes.split(",")]
    if a.compare_wasm:
        COMPARE_WASM = a.compare_wasm.resolve()
        if not COMPARE_WASM.exists():
            raise SystemExit(f"--compare-wasm: {COMPARE_WASM} does not exist")
    partial = bool(a.sizes or a.compare_wasm or a.no_memory) and not a.outside
    if partial and not a.no_doc:
        print("== partial run (--sizes/--compare-wasm/--no-memory): writes <result>-partial.*")

    OUT.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.timezone.utc)
    mach = machine()
    envoy_version = sh(a.envoy, "--version").split("version:")[-1].strip()
    wrk_version = (subprocess.run([a.wrk, "--version"], capture_output=True, text=True).stdout
                   .splitlines() or [""])[0]
    commit = sh("git", "rev-parse", "--short", "HEAD")
    dirty = bool(sh("git", "status", "--porcelain", "--", "filters", "Cargo.toml", "Cargo.lock"))
    if a.outside:
        import outside
        outside.run(a, started, mach, envoy_version, commit)
        return
    wasm_sizes = {Path(f.wasm).name: (WASM_DIR / f.wasm).stat().st_size
                  for f in FULL_CHAIN + FULL_CHAIN_UPSTREAM}

    bodies = write_bodies(OUT / "bodies")
    up = Upstream()
    env = None
    try:
        print(f"== memory probe (RSS with / without wasm, 1 and 2 workers)", flush=True)
        mem = None if a.no_memory else memory_probe(a.envoy, up.port, bodies, OUT)

        ls = listeners(True)
        for l in ls:
            l.port = free_port()
        env = Envoy(a.envoy, bootstrap(ls, free_port(), up.port), OUT, "bench", 1)
        pids = {"envoy": env.pid, "upstream": up.p.pid}
        rss_start = proc_rss_kib(env.pid)
        print(f"== envoy {envoy_version} pid {env.pid}, upstream :{up.port}; "
              + ", ".join(f"{l.key}=:{l.port}" for l in ls), flush=True)
        verify(env, ls, bodies)
        print(f"== verified: {len(bodies)} bodies x {len(ls)} listeners -> 200 via the upstream, "
              f"our filter stamped x-llmkube-backend={EXPECTED_BACKEND}", flush=True)
        if a.perf:
            import outside
            arms = [{"key": l.key, "port": l.port, "header": ""} for l in ls if l.key != "L2"]
            prof = outside.profile(env, arms, bodies, max(SIZES), dur, a.wrk, reconnects=False)
            (RESULTS / "cpu-profile-listeners.json").write_text(json.dumps(prof, indent=1) + "\n")
            return

        runs = []
        n_cells = reps * len(SIZES) * len(VARIANTS) * len(ls)
        eta = n_cells * (a.warmup + dur * len(conns)) + reps * len(SIZES) * len(conns) * max(1, dur // 2)
        print(f"== {mode}: {reps} reps x {len(SIZES)} sizes x {len(VARIANTS)} variants x "
              f"{len(ls)} listeners = {n_cells} cells, each {a.warmup} s warm-up + {dur} s at "
              f"each of {conns} connections; ~{eta // 60}m{eta % 60:02d}s", flush=True)
        k = 0
        for rep in range(reps):
            for si, size in enumerate(SIZES):
                # Upstream alone (no Envoy): shows it is not the bottleneck.
                for c in conns:
                    r = wrk(a.wrk, up.port, bodies[(size, "first")], max(1, dur // 2), c,
                            a.threads, pids)
                    runs.append({"rep": rep, "size": size, "variant": "first",
                                 "listener": "direct", "conns": c, **r})
                for v in VARIANTS:
                    # Rotate the listener order so no listener always runs first/last.
                    shift = (rep + si + VARIANTS.index(v)) % len(ls)
                    for l in ls[shift:] + ls[:shift]:
                        k += 1
                        body = bodies[(size, v)]
                        wrk(a.wrk, l.port, body, a.warmup, conns[-1], a.threads, pids)
                        for c in conns:
                            r = wrk(a.wrk, l.port, body, dur, c, a.threads, pids)
                            runs.append({"rep": rep, "size": size, "variant": v,
                                         "listener": l.key, "conns": c, **r})
                            lat = r["latency"]
                            errs = sum(r["errors"].values())
                            print(f"  [{k:3d}/{n_cells}] rep {rep} c{c} "
                                  f"{size // KIB:5d} KiB model-{v:5s} {l.key}: p50 "
                                  f"{lat['p50']:7d} µs p99 {lat['p99']:7d} µs {r['rps']:8.0f} "
                                  f"req/s  cpu envoy {r['cpu_pct']['envoy']:5.1f}% up "
                                  f"{r['cpu_pct']['upstream']:5.1f}% wrk "
                                  f"{r['cpu_pct']['wrk']:5.1f}%"
                                  + (f"  ERRORS {r['errors']}" if errs else ""), flush=True)
                            if r["errors"]["status"]:
                                raise SystemExit(f"FAIL: {l.key} answered non-2xx under load: "
                                                 f"{r['errors']}")
        rss_end = proc_rss_kib(env.pid)
        wasm_stats = env.stats("wasm")
        memory = env.memory()
    finally:
        if env:
            env.stop()
        up.stop()

    finished = dt.datetime.now(dt.timezone.utc)
    mach["loadavg_end"] = os.getloadavg()
    summary = {"by_conns": {str(c): summarize([r for r in runs if r["conns"] == c], ls, reps)
                            for c in conns}}
    result = {
        "mode": mode, "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "machine": mach, "envoy_version": envoy_version, "wrk": wrk_version,
        "commit": commit, "filters_dirty": dirty,
        "params": {"reps": reps, "duration_s": dur, "warmup_s": a.warmup, "conns": conns,
                   "wrk_threads": a.threads, "envoy_concurrency": 1, "sizes": SIZES,
                   "variants": VARIANTS, "model": MODEL, "max_body_bytes": MAX_BODY_BYTES,
                   "buffer_limit_bytes": BUFFER_LIMIT, "full_chain": [f.name for f in FULL_CHAIN]},
        "listeners": {l.key: l.title for l in ls},
        "wasm_sizes": wasm_sizes,
        "memory": {"bench_envoy_rss_start_kib": rss_start, "bench_envoy_rss_end_kib": rss_end,
                   "bench_envoy_admin_memory": memory, "bench_envoy_wasm_stats": wasm_stats,
                   **(mem or {})},
        "summary": summary, "runs": runs,
    }
    out_name = RESULT_NAMES[mode] + ("-partial" if partial else "")
    (RESULTS / f"{out_name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result)
    print()
    print(md)
    if not a.no_doc:
        write_doc(out_name, md)
        print(f"\nwrote {RESULTS / (out_name + '.json')} and {RESULTS / (out_name + '.md')}")


def summarize(runs: list, ls: list[Listener], reps: int) -> dict:
    def get(lk, size, v, rep):
        for r in runs:
            if (r["listener"], r["size"], r["variant"], r["rep"]) == (lk, size, v, rep):
                return r
        return None

    cells = []
    for size in SIZES:
        direct = [r for r in runs if r["listener"] == "direct" and r["size"] == size]
        for v in VARIANTS:
            for l in ls:
                rs = [get(l.key, size, v, rep) for rep in range(reps)]
                base = [get("L1", size, v, rep) for rep in range(reps)]
                nat = [get("L2", size, v, rep) for rep in range(reps)]
                p50 = [r["latency"]["p50"] for r in rs]
                added = [r["latency"]["p50"] - b["latency"]["p50"] for r, b in zip(rs, base)]
                added99 = [r["latency"]["p99"] - b["latency"]["p99"] for r, b in zip(rs, base)]
                nat_added = [n["latency"]["p50"] - b["latency"]["p50"] for n, b in zip(nat, base)]
                cell = {
                    "listener": l.key, "size": size, "variant": v,
                    "p50_us": med(p50), "p50_min_us": min(p50), "p50_max_us": max(p50),
                    "p99_us": med([r["latency"]["p99"] for r in rs]),
                    "rps": med([r["rps"] for r in rs]),
                    "added_p50_us": med(added), "added_p99_us": med(added99),
                    "added_p50_by_rep_us": added,
                    "cpu_envoy_pct": med([r["cpu_pct"]["envoy"] for r in rs]),
                    "cpu_upstream_pct": med([r["cpu_pct"]["upstream"] for r in rs]),
                    "cpu_wrk_pct": med([r["cpu_pct"]["wrk"] for r in rs]),
                    # Envoy CPU per request, and paired against L1 like the p50.
                    "cpu_us": med([cpu_per_request(r) for r in rs]),
                    "added_cpu_us": med([cpu_per_request(r) - cpu_per_request(b)
                                         for r, b in zip(rs, base)]),
                    "errors": sum(sum(r["errors"].values()) for r in rs),
                }
                na = med(nat_added)
                cell["ratio_to_L2_added"] = (cell["added_p50_us"] / na) if na > 0 else None
                cells.append(cell)
        cells.append({"listener": "direct", "size": size, "variant": "first",
                      "p50_us": med([r["latency"]["p50"] for r in direct]),
                      "p99_us": med([r["latency"]["p99"] for r in direct]),
                      "rps": med([r["rps"] for r in direct]),
                      "cpu_upstream_pct": med([r["cpu_pct"]["upstream"] for r in direct]),
                      "cpu_wrk_pct": med([r["cpu_pct"]["wrk"] for r in direct])})
    per_listener = {}
    for l in ls[1:]:
        sl = {}
        for v in VARIANTS + ["both"]:
            vs = VARIANTS if v == "both" else [v]
            pts = [(c["size"] / KIB, c["added_p50_us"]) for c in cells
                   if c["listener"] == l.key and c["variant"] in vs]
            sl[v] = slope([x for x, _ in pts], [y for _, y in pts])
        cpu = [(c["size"] / KIB, c["added_cpu_us"]) for c in cells if c["listener"] == l.key]
        per_listener[l.key] = {"us_per_kib": sl,
                               "cpu_us_per_kib": slope([x for x, _ in cpu], [y for _, y in cpu])}
    return {"cells": cells, "per_listener": per_listener}


def fmt_us(x) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"


def size_label(s: int) -> str:
    return f"{s // MIB} MiB" if s >= MIB else f"{s // KIB} KiB"


def by_conns(res: dict) -> list[tuple[int, dict]]:
    """(connections, summary) pairs, headline first; older results had one count only."""
    s, c = res["summary"], res["params"]["conns"]
    if "by_conns" not in s:
        return [(c, s)]
    return [(int(k), v) for k, v in s["by_conns"].items()]


def pooled_table(res: dict, s: dict) -> list[str]:
    p = res["params"]
    L = ["| listener | " + " | ".join(size_label(x) for x in p["sizes"])
         + " | µs per KiB (first / last / both) | ÷ L2 added at "
         + " / ".join(size_label(x) for x in p["sizes"]) + " | Envoy CPU µs/KiB (slope) |",
         "|---|" + "--:|" * len(p["sizes"]) + "--:|--:|--:|"]
    for lk, info in s["per_listener"].items():
        vals, ratios = [], []
        for size in p["sizes"]:
            cs = [c for c in s["cells"] if c["listener"] == lk and c["size"] == size]
            nat = [c for c in s["cells"] if c["listener"] == "L2" and c["size"] == size]
            a = med([c["added_p50_us"] for c in cs])
            na = med([c["added_p50_us"] for c in nat])
            vals.append(fmt_us(a))
            ratios.append("–" if lk == "L2" or na <= 0 else f"{a / na:.2f}×")
        sl = info["us_per_kib"]
        L.append(f"| {lk} {res['listeners'][lk]} | " + " | ".join(vals) + f" | "
                 f"{sl['first']:.3f} / {sl['last']:.3f} / {sl['both']:.3f} | "
                 + " / ".join(ratios) + " | "
                 + (f"{info['cpu_us_per_kib']:.3f}" if "cpu_us_per_kib" in info else "–") + " |")
    return L


def cell_table(res: dict, s: dict) -> list[str]:
    L = ["| size | model | listener | p50 µs | p50 range | p99 µs | req/s | +p50 vs L1 µs "
         "| ÷ L2 added | CPU envoy / upstream / wrk % |",
         "|---|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for c in s["cells"]:
        if c["listener"] == "direct":
            L.append(f"| {size_label(c['size'])} | – | upstream direct (no Envoy) | "
                     f"{fmt_us(c['p50_us'])} | | {fmt_us(c['p99_us'])} | {c['rps']:,.0f} | | | "
                     f"– / {c['cpu_upstream_pct']:.0f} / {c['cpu_wrk_pct']:.0f} |")
            continue
        lk = c["listener"]
        title = res["listeners"][lk]
        added = "" if lk == "L1" else fmt_us(c["added_p50_us"])
        ratio = "" if lk in ("L1", "L2") or c["ratio_to_L2_added"] is None \
            else f"{c['ratio_to_L2_added']:.2f}×"
        L.append(f"| {size_label(c['size'])} | {c['variant']} | {lk} {title} | "
                 f"{fmt_us(c['p50_us'])} | {fmt_us(c['p50_min_us'])}–{fmt_us(c['p50_max_us'])} | "
                 f"{fmt_us(c['p99_us'])} | {c['rps']:,.0f} | {added} | {ratio} | "
                 f"{c['cpu_envoy_pct']:.0f} / {c['cpu_upstream_pct']:.0f} / {c['cpu_wrk_pct']:.0f} |")
    return L


def render(res: dict) -> str:
    p, m = res["params"], res["machine"]
    groups = by_conns(res)
    conns = [c for c, _ in groups]
    L = []
    L.append(f"Run **{res['mode']}** · {res['started']} → {res['finished']} (UTC) · commit "
             f"`{res['commit']}`{' (filters/ had uncommitted changes)' if res['filters_dirty'] else ''}")
    L.append("")
    L.append(f"- machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB, Linux {m['kernel']}; "
             f"load average at start {m['loadavg_start'][0]:.2f}, at end {m['loadavg_end'][0]:.2f}")
    L.append(f"- Envoy `{res['envoy_version']}`, --concurrency 1; load: `{res['wrk']}`, "
             f"{' and '.join(str(c) for c in conns)} connection(s) back to back per cell, "
             f"{p['wrk_threads']} thread, {p['warmup_s']} s warm-up + "
             f"{p['duration_s']} s per measured run, {p['reps']} repetition(s), listeners interleaved")
    L.append(f"- bodies: chat-completions JSON, model `{p['model']}` first or last; plugin "
             f"max_body_bytes {p['max_body_bytes'] // MIB} MiB, buffer limits "
             f"{p['buffer_limit_bytes'] // MIB} MiB; full chain = {', '.join(p['full_chain'])}")
    L.append("- values are medians over repetitions; \"+p50\" is paired per repetition against L1 "
             "(native buffer only) then the median taken; \"÷ L2\" is our added p50 over "
             "json_to_metadata's added p50; p50 range = min–max over repetitions")
    for n, (c, s) in enumerate(groups):
        L.append("")
        what = ("no queueing: added p50 = added service time per request (headline)"
                if c == 1 else "closed loop on one worker: p50 includes queueing, ≈ "
                f"{c}× the service time; req/s is the throughput figure")
        L.append(f"**{c} connection{'s' if c > 1 else ''}** ({what}). Added p50 over L1 (µs), "
                 "both model positions pooled by median, and the slope:")
        L.append("")
        L += pooled_table(res, s)
    for c, s in groups:
        L.append("")
        L.append(f"Every cell, {c} connection{'s' if c > 1 else ''}:")
        L.append("")
        L += cell_table(res, s)
    L.append("")
    mem = res["memory"]
    L.append("Module size and memory:")
    L.append("")
    for w, n in res["wasm_sizes"].items():
        L.append(f"- `{w}`: {n:,} bytes ({n / KIB:.0f} KiB)")
    if "wasm_delta" not in mem:
        L.append("- RSS probe skipped (--no-memory)")
        return "\n".join(L)
    d, pr = mem["wasm_delta"], mem["probes"]

    def vms(tag):
        return pr[tag]["wasm_stats"].get("wasm.wasm_vm_count", "?")
    L.append(f"- Envoy RSS with our wasm filters minus the same bootstrap without them (L1+L2 only), "
             f"idle: {d['wasm_idle']['one_worker_kib'] / KIB:.1f} MiB with 1 worker "
             f"({vms('mem-wasm-c1')} wasm VMs), {d['wasm_idle']['two_workers_kib'] / KIB:.1f} MiB "
             f"with 2 workers ({vms('mem-wasm-c2')} VMs); after bodies up to 2 MiB went through "
             f"every listener: {d['wasm_after_traffic']['one_worker_kib'] / KIB:.1f} MiB / "
             f"{d['wasm_after_traffic']['two_workers_kib'] / KIB:.1f} MiB. The difference 2 workers "
             f"− 1 worker (one more VM) is {d['wasm_idle']['per_extra_worker_kib'] / KIB:+.1f} MiB "
             f"idle / {d['wasm_after_traffic']['per_extra_worker_kib'] / KIB:+.1f} MiB after "
             f"traffic, i.e. within RSS noise (a few MiB): the ~40 MiB is V8 and the compiled "
             f"module, paid once per process, not per worker")
    am = mem.get("bench_envoy_admin_memory") or {}
    L.append(f"- benchmark Envoy (all four listeners) RSS {mem['bench_envoy_rss_start_kib'] / KIB:.1f}"
             f" MiB before load, {mem['bench_envoy_rss_end_kib'] / KIB:.1f} MiB after"
             + (f"; admin /memory allocated {int(am.get('allocated', 0)) / MIB:.1f} MiB, "
                f"heap {int(am.get('heap_size', 0)) / MIB:.1f} MiB" if am else ""))
    ws = {k: v for k, v in mem.get("bench_envoy_wasm_stats", {}).items() if v not in ("0", "")}
    L.append("- Envoy wasm stats (non-zero): " + (", ".join(f"`{k}: {v}`" for k, v in sorted(ws.items()))
                                                  or "none") + " — Envoy exposes no V8 heap gauge")
    return "\n".join(L)


def write_doc(name: str, md: str):
    """The tables of result `name` as bench/results/<name>.md, beside its .json."""
    text = f"# bench/results/{name}.json (generated by bench/run; method: docs/benchmarks.md)\n\n{md}\n"
    (RESULTS / f"{name}.md").write_text(text)


if __name__ == "__main__":
    main()
