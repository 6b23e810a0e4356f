#!/usr/bin/env bash
# The local example: agentgateway in front of llmkube-ext-proc (the model-router filter on
# wasmtime) and three mock engines. Builds the filters, the server and the generator, compiles
# agentgateway-examples/router.yaml with --target agentgateway, starts everything on loopback,
# waits until each component says it is ready, sends a few requests and prints which engine
# served each. Needs AGENTGATEWAY_BIN. LLMKUBE_EXT_PROC_BIN / LLMKUBE_GEN_BIN use binaries built
# already (CI passes its debug builds) instead of release builds.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${AGENTGATEWAY_BIN:-}" ] || [ ! -x "${AGENTGATEWAY_BIN}" ]; then
  cat <<'MSG'
AGENTGATEWAY_BIN is not set (or not executable): this example needs an agentgateway v1.3.x binary.
agentgateway is not published on crates.io, npm, PyPI or Debian; build release v1.3.1 from source
(github.com/agentgateway/agentgateway, tag v1.3.1; see docs/agentgateway.md, "Getting an
agentgateway binary"), then: AGENTGATEWAY_BIN=/path/to/agentgateway agentgateway-examples/run.sh
MSG
  exit 0
fi
rustup target add wasm32-wasip1 >/dev/null 2>&1 || true
cargo build -q --release --target wasm32-wasip1 -p llmkube-model-router
ext_proc_bin=${LLMKUBE_EXT_PROC_BIN:-}
gen_bin=${LLMKUBE_GEN_BIN:-}
release=()
[ -n "$ext_proc_bin" ] || { release+=(-p llmkube-ext-proc); ext_proc_bin=target/release/llmkube-ext-proc; }
[ -n "$gen_bin" ] || { release+=(-p llmkube-gen); gen_bin=target/release/llmkube-gen; }
[ ${#release[@]} = 0 ] || cargo build -q --release "${release[@]}"

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

# Waits until `probe` (a command) succeeds, up to 60 s; gives up at once when the component's
# process is gone. Prints the component's log when it never becomes ready.
wait_ready() { # name pid log probe...
  local name=$1 pid=$2 log=$3; shift 3
  local deadline=$((SECONDS + 60))
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited before it was ready:"; tail -20 "$log"; exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "$name was not ready after 60 s:"; tail -20 "$log"; exit 1
    fi
    sleep 0.1
  done
  echo "ready: $name"
}

# LiteLLM's in-cluster URL becomes a local mock for this run.
sed 's#http://litellm.llm.svc:4000#http://127.0.0.1:18003#' agentgateway-examples/router.yaml >"$work/router.yaml"
"$gen_bin" compile --target agentgateway -f "$work/router.yaml" -o "$work/out" \
  --listen 127.0.0.1:14000 --ext-proc 127.0.0.1:19997 --max-body-bytes 65536 \
  --resolve qwen3-8b=127.0.0.1:18001 --resolve llama-3-70b=127.0.0.1:18002

# Mock engines: each answers GET /health once it listens.
for engine in qwen3-8b:18001 llama-3-70b:18002 litellm:18003; do
  name=${engine%%:*} port=${engine##*:}
  python3 agentgateway-examples/mock_engine.py "$name" "$port" >"$work/$name.log" 2>&1 & pids+=($!)
  wait_ready "mock engine $name" "$!" "$work/$name.log" curl -sf "http://127.0.0.1:$port/health"
done
# llmkube-ext-proc logs one line once its listener is bound and the module instantiated.
"$ext_proc_bin" --listen 127.0.0.1:19997 --config "$work/out/ext-proc.yaml" >"$work/ext-proc.log" 2>&1 & pids+=($!)
wait_ready llmkube-ext-proc "$!" "$work/ext-proc.log" grep -q 'llmkube-ext-proc: ready on' "$work/ext-proc.log"
# agentgateway's readiness endpoint answers 200 once its config is loaded and its binds listen;
# its admin, stats and readiness servers stay on loopback (the defaults bind every address).
ADMIN_ADDR=127.0.0.1:14900 STATS_ADDR=127.0.0.1:14901 READINESS_ADDR=127.0.0.1:14902 \
  "$AGENTGATEWAY_BIN" -f "$work/out/agentgateway.yaml" >"$work/agentgateway.log" 2>&1 & pids+=($!)
wait_ready agentgateway "$!" "$work/agentgateway.log" curl -sf http://127.0.0.1:14902/healthz/ready

fail=0
ask() { # expected substring, model, extra curl args...
  local want=$1 model=$2; shift 2
  local out
  out=$(curl -s -w ' HTTP %{http_code}' http://127.0.0.1:14000/v1/chat/completions \
    -H 'content-type: application/json' "$@" \
    -d "{\"model\":\"$model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}")
  printf '%-70s %s\n' "model=$model $*" "$out"
  case "$out" in *"$want"*) ;; *) echo "  expected: $want"; fail=1 ;; esac
}
ask 'served by qwen3-8b' qwen3-8b
ask 'HTTP 200' llama-3-70b
# Sensitive: never the cloud proxy, whatever the model asks for.
ask 'served by llama-3-70b' gpt-5 -H 'x-llmkube-classification: pii'
# A client cannot pick the route: the filter overwrites x-llmkube-route before routing.
ask 'served by llama-3-70b' qwen3-8b -H 'x-llmkube-route: complex-tasks/cloud-gpt' -H 'x-llmkube-classification: pii'
out=$(curl -s -w ' HTTP %{http_code}' http://127.0.0.1:14000/v1/chat/completions -d 'not json')
echo "not json: $out"
case "$out" in *"HTTP 400"*) ;; *) echo "  expected: HTTP 400"; fail=1 ;; esac
if [ "$fail" != 0 ]; then
  echo "--- ext-proc log"; tail -20 "$work/ext-proc.log"
  echo "--- agentgateway log"; tail -20 "$work/agentgateway.log"
fi
exit "$fail"
