#!/usr/bin/env bash
# Builds the playground into target/playground/site (a static folder: serve it with any file
# server, e.g. `python3 -m http.server -d target/playground/site 8080`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="$ROOT/target/playground/site"
# A cdylib only for this build: as a workspace member the crate stays an rlib, so the filter
# build (scripts/wasm-crates.sh) never takes it for a wasip1 module.
cargo rustc --release -p llmkube-playground --target wasm32-unknown-unknown --crate-type cdylib
rm -rf "$OUT"
mkdir -p "$OUT"
wasm-bindgen --target web --no-typescript --out-dir "$OUT/pkg" \
  "$ROOT/target/wasm32-unknown-unknown/release/llmkube_playground.wasm"
cp playground/web/index.html playground/web/app.js playground/web/style.css playground/web/example.yaml "$OUT/"
echo "playground built in $OUT"
