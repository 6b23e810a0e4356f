"""Q4c: (i) an upstream wasm filter on the aggregate answers a local 503 for an attempt whose endpoint
is a given backend (per-attempt fail-closed guard): what does the client see, is it retried, does it
eject? (ii) a credential from an Envoy process env var via vm_config.environment_variables."""
import os
from xp import *

os.environ["XP_PROVIDER_KEY"] = "Bearer sk-FROM-ENV"   # inherited by the Envoy process
try:
    mock("a"); mock("b")
    agg = aggregate("agg", ["a", "b"])
    w = wasm_filter(PROBE_WASM, "tag=uagg;deny_backend=b;env_header=authorization:XP_PROVIDER_KEY", name="uagg")
    w["typed_config"]["config"]["vm_config"]["environment_variables"] = {"host_env_keys": ["XP_PROVIDER_KEY"]}
    agg["typed_extension_protocol_options"] = upstream_filters([w])
    od = dict(OUTLIER, max_ejection_time="10s", base_ejection_time="10s")
    envoy(bootstrap([route("agg", retry_policy=RETRY)], [cluster("a", outlier_detection=od), cluster("b", outlier_detection=od), agg]), 431)
    st, h, body, t = req()
    print(f"a serves: status={st} served_by={h.get('x-served-by')} a saw authorization={hits('a')[-1]['headers'].get('authorization')!r}")
    reset_hits("a", "b")
    st, h, body, t = req(headers={"x-mode-a": "503"})
    print(f"a=503 → next attempt is b, denied upstream: status={st} body={body[:120]!r} denied-hdr={h.get('x-probe-denied')} b hits={len(hits('b'))} t={t}")
    print("   stats:", {k: v for k, v in stats(r"cluster\.(agg|a|b)\.(upstream_rq_retry$|outlier_detection\.ejections_active|upstream_rq_5)").items() if v != "0"})
    for l in access_log()[-1:]: print("   ", l)
    dump = urllib.request.urlopen(f"http://127.0.0.1:{ADMIN}/config_dump", timeout=5).read().decode()
    print("config_dump contains sk-FROM-ENV:", "sk-FROM-ENV" in dump, "| contains key name XP_PROVIDER_KEY:", "XP_PROVIDER_KEY" in dump)
finally:
    stop_all()
