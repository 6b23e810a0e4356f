"""Shared helpers for the Envoy mechanics experiments: mocks, Envoy launcher, config builders,
HTTP client helpers. Loopback only, ports 23000-23099, Envoy --base-id 311+.
Run an experiment: python3 bench/envoy-mechanics/q1_fallback.py  (each script prints its observations)."""
import http.client, json, os, re, signal, subprocess, sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENVOY = os.environ.get("ENVOY", os.path.join(ROOT, ".venv/bin/envoy"))
PROBE_WASM = os.environ.get("PROBE_WASM", "/tmp/xp-target/wasm32-wasip1/release/xp_probe.wasm")
ROUTER_WASM = os.path.join(ROOT, "target/wasm32-wasip1/release/llmkube_model_router.wasm")
RUN = os.environ.get("XP_RUN", "/tmp/xp-run")
os.makedirs(RUN, exist_ok=True)
LISTEN, ADMIN = 23000, 23001
PORTS = {"a": 23011, "b": 23012, "c": 23013, "dead": 23019}  # nothing ever listens on 23019
ACCESS_FMT = ("code=%RESPONSE_CODE% flags=%RESPONSE_FLAGS% ucluster=%UPSTREAM_CLUSTER% "
              "uclusterraw=%UPSTREAM_CLUSTER_RAW% uhost=%UPSTREAM_HOST% "
              "attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% dur=%DURATION% "
              "details=%RESPONSE_CODE_DETAILS% auth=%REQ(authorization)% "
              "hostmd=%UPSTREAM_METADATA(llmkube:backend)%\n")

_procs = []


def mock(name, default_mode="ok", port=None):
    port = port or PORTS[name]
    log = f"{RUN}/mock-{name}.log"
    open(log, "w").close()
    p = subprocess.Popen([sys.executable, f"{HERE}/mock.py", str(port), name, log, default_mode],
                         start_new_session=True)
    _procs.append(p)
    for _ in range(50):
        try:
            socket_ok = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            socket_ok.connect(); socket_ok.close(); break
        except OSError:
            time.sleep(0.1)
    return log


def hits(name):
    try:
        return [json.loads(l) for l in open(f"{RUN}/mock-{name}.log")]
    except FileNotFoundError:
        return []


def reset_hits(*names):
    for n in names:
        open(f"{RUN}/mock-{n}.log", "w").close()


def envoy(cfg, base_id, concurrency=1, name="envoy"):
    path = f"{RUN}/{name}.json"
    json.dump(cfg, open(path, "w"), indent=1)
    log = f"{RUN}/{name}.log"
    open(log, "w").close()
    p = subprocess.Popen([ENVOY, "-c", path, "--base-id", str(base_id), "--concurrency", str(concurrency),
                          "-l", os.environ.get("XP_LOG", "warning"), "--log-path", log,
                          "--disable-hot-restart", "--file-flush-interval-msec", "200"],
                         start_new_session=True)
    _procs.append(p)
    t0 = time.time()
    while time.time() - t0 < 60:
        if p.poll() is not None:
            raise SystemExit(f"envoy exited rc={p.returncode}; see {log}\n" + open(log).read()[-3000:])
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/ready", timeout=1).status == 200:
                return p
        except Exception:
            time.sleep(0.2)
    raise SystemExit("envoy not ready")


def stop_all():
    for p in reversed(_procs):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for p in _procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    _procs.clear()


def stop(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=5)
    if p in _procs:
        _procs.remove(p)


def req(body=None, headers=None, path="/v1/chat/completions", timeout=15, port=LISTEN):
    body = body if body is not None else {"model": "m-local", "messages": [{"role": "user", "content": "hi"}]}
    data = json.dumps(body).encode() if not isinstance(body, (bytes, str)) else (body.encode() if isinstance(body, str) else body)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"content-type": "application/json", "connection": "close"}
    h.update(headers or {})
    t0 = time.time()
    try:
        c.request("POST", path, body=data, headers=h)
        r = c.getresponse()
        out = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, out.decode("utf-8", "replace"), round(time.time() - t0, 3)
    except Exception as e:
        return None, {}, f"EXC {type(e).__name__}: {e}", round(time.time() - t0, 3)
    finally:
        c.close()


def stream(headers=None, timeout=15, body=None):
    """POST and read the body incrementally; returns (status, [(t, bytes)], end_reason, total_t)."""
    body = body or {"model": "m-local", "stream": True, "messages": []}
    c = http.client.HTTPConnection("127.0.0.1", LISTEN, timeout=timeout)
    h = {"content-type": "application/json", "connection": "close"}
    h.update(headers or {})
    t0 = time.time()
    chunks, status, end = [], None, "complete"
    try:
        c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(), headers=h)
        r = c.getresponse()
        status = r.status
        chunks.append((round(time.time() - t0, 2), b"<headers>"))
        while True:
            d = r.read1(65536) if hasattr(r, "read1") else r.read(64)
            if not d:
                break
            chunks.append((round(time.time() - t0, 2), d))
    except Exception as e:
        end = f"{type(e).__name__}: {e}"
    finally:
        c.close()
    return status, chunks, end, round(time.time() - t0, 2)


def stats(pattern):
    txt = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/stats", timeout=5).read().decode()
    out = {}
    for line in txt.splitlines():
        if re.search(pattern, line):
            k, _, v = line.partition(": ")
            out[k] = v
    return out


def access_log(name="access"):
    time.sleep(0.5)  # envoy runs with --file-flush-interval-msec 200
    try:
        return open(f"{RUN}/{name}.log").read().splitlines()
    except FileNotFoundError:
        return []


# ---------------- config builders ----------------

def cluster(name, port=None, **extra):
    port = port or PORTS[name]
    c = {"name": name, "type": "STATIC", "connect_timeout": "0.5s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{
             "endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}},
             "metadata": {"filter_metadata": {"llmkube": {"backend": name}}}}]}]}}
    c.update(extra)
    return c


def aggregate(name, members):
    return {"name": name, "connect_timeout": "0.5s", "lb_policy": "CLUSTER_PROVIDED",
            "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
                "clusters": members}}}


RETRY = {"retry_on": "5xx,reset,connect-failure,refused-stream", "num_retries": 1,
         "retry_priority": {"name": "envoy.retry_priorities.previous_priorities", "typed_config": {
             "@type": "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
             "update_frequency": 1}},
         "retry_host_predicate": [{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {
             "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"}}],
         "host_selection_retry_max_attempts": 3}

OUTLIER = {"consecutive_5xx": 1, "interval": "0.5s", "base_ejection_time": "2s", "max_ejection_percent": 100,
           "enforcing_consecutive_5xx": 100, "split_external_local_origin_errors": True,
           "consecutive_local_origin_failure": 1, "enforcing_consecutive_local_origin_failure": 100,
           "consecutive_gateway_failure": 1000, "enforcing_consecutive_gateway_failure": 0,
           "enforcing_success_rate": 0, "enforcing_local_origin_success_rate": 0}


def wasm_filter(wasm, config, name="probe", root_id="", vm_id=None):
    return {"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": name, "root_id": root_id, "allow_on_headers_stop_iteration": True, "fail_open": False,
                   "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": config},
                   "vm_config": {"vm_id": vm_id or name, "runtime": "envoy.wasm.runtime.v8",
                                 "code": {"local": {"filename": wasm}}}}}}


ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
UPSTREAM_CODEC = {"name": "envoy.filters.http.upstream_codec", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec"}}


def upstream_filters(filters):
    """typed_extension_protocol_options that install an upstream HTTP filter chain on a cluster."""
    return {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http_protocol_options": {}},
        "http_filters": filters + [UPSTREAM_CODEC]}}


def bootstrap(routes, clusters, http_filters=(), hcm_extra=None, access="access", extra=None):
    hcm = {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
           "stat_prefix": "h",
           "access_log": [{"name": "envoy.access_loggers.file", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
               "path": f"{RUN}/{access}.log", "log_format": {"text_format_source": {"inline_string": ACCESS_FMT}}}}],
           "route_config": {"name": "rc", "virtual_hosts": [{"name": "v", "domains": ["*"], "routes": routes}]},
           "http_filters": list(http_filters) + [ROUTER]}
    hcm.update(hcm_extra or {})
    open(f"{RUN}/{access}.log", "w").close()
    b = {"node": {"id": "xp", "cluster": "xp"}, "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ADMIN}}},
         "static_resources": {"listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": LISTEN}},
                                             "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                                             "typed_config": hcm}]}]}],
                              "clusters": clusters}}
    b.update(extra or {})
    return b


def route(cluster_name, **extra):
    r = {"match": {"prefix": "/"}, "route": {"cluster": cluster_name, "timeout": "0s"}}
    r["route"].update(extra)
    return r


def show(label, res):
    st, h, body, t = res
    print(f"  {label}: status={st} t={t}s served_by={h.get('x-served-by')} body={body[:160]!r}")
