"""The gateway the SDK tests drive: the bundled example (envoy-examples/router.yaml) behind a
real Envoy, with mock vLLM and LiteLLM servers, started by the `sdk-gateway` fixture binary
(testharness/fixtures/src/bin/sdk-gateway.rs), which also injects faults and reads audit lines
on request."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Long enough to see, short enough to wait out: `spec.proxy.quarantineDuration` for these tests.
QUARANTINE_S = 3


def _binary() -> Path:
    """The fixture binary: built once per session (a no-op after `cargo test --no-run`)."""
    given = os.environ.get("LLMKUBE_SDK_GATEWAY_BIN")
    if given:
        return Path(given)
    # No `-p`: features stay unified across the workspace, as the test build has them (a
    # package-only resolution would rebuild wasmtime and cranelift).
    subprocess.run(["cargo", "build", "-q", "--bin", "sdk-gateway"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "sdk-gateway"


class Gateway:
    """One running gateway: `url` (OpenAI-style base URL with /v1), `command` to its harness."""

    def __init__(self, binary: Path, *args: str):
        env = dict(os.environ)
        env.setdefault("ENVOY_BIN", str(ROOT / ".venv" / "bin" / "envoy"))
        self.proc = subprocess.Popen(
            [str(binary), *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"sdk-gateway exited ({self.proc.wait()}) before it was ready")
        hello = json.loads(line)
        self.base = hello["url"]
        self.url = hello["url"] + "/v1"
        self.target = hello["target"]

    def command(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(f"sdk-gateway {cmd}: {reply['error']}")
        return reply

    def audit_of(self, request_id: str, patience: float = 30.0) -> dict:
        """The audit record with this request id (written as the response ends: waited for)."""
        deadline = time.monotonic() + patience
        while True:
            for r in self.command(op="audit")["records"]:
                if r.get("request_id") == request_id:
                    return r
            if time.monotonic() > deadline:
                raise AssertionError(f"no audit record with request_id {request_id!r}")
            time.sleep(0.05)

    def stop(self):
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def binary() -> Path:
    return _binary()


@pytest.fixture(scope="session", params=["envoy", "ext-proc"])
def gateway(request, binary):
    """The example on each gateway target: Envoy's wasm filter, and the same module behind
    Envoy's ext_proc filter in llmkube-ext-proc."""
    args = ["--quarantine", f"{QUARANTINE_S}s"]
    if request.param == "ext-proc":
        args.append("--ext-proc")
    gw = Gateway(binary, *args)
    yield gw
    gw.stop()


@pytest.fixture()
def fresh_gateway(binary):
    """A gateway of its own (Envoy target), for tests that quarantine backends."""
    gw = Gateway(binary, "--quarantine", f"{QUARANTINE_S}s")
    yield gw
    gw.stop()


@pytest.fixture(autouse=True)
def _clear(request):
    """Faults and recorded requests do not outlive the test on the shared gateway."""
    yield
    if "gateway" in request.fixturenames:
        gw = request.getfixturevalue("gateway")
        if gw.proc.poll() is None:
            gw.command(op="clear")
