#!/usr/bin/env bash
# Builds the playground and tests it in headless Chromium (Debian's /usr/bin/chromium, driven by
# playwright-core); the screenshot lands in target/playground/screenshot.png.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Its tools (wasm-bindgen-cli, chromium, the browser test's npm packages) are installed here only.
bash scripts/setup.sh --playground
bash playground/build.sh
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server --bind 127.0.0.1 --directory target/playground/site "$PORT" >/dev/null 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
# Up to 30 s for the file server: a loaded CI machine can be slow to start python.
up=0
for _ in $(seq 300); do
    if curl -fs "http://127.0.0.1:$PORT/" >/dev/null 2>&1; then
        up=1
        break
    fi
    sleep 0.1
done
[ "$up" = 1 ] || { echo "playground: the file server on port $PORT did not answer" >&2; exit 1; }
node playground/browser-test/test.mjs "http://127.0.0.1:$PORT/" "$ROOT/target/playground"
