#!/usr/bin/env bash
# Prints the workspace's wasm filter packages (members with crate-type "cdylib"), one per line.
# scripts/setup.sh builds them for wasm32-wasip1; .ci/run leaves them out of the native tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
members = set(m["workspace_members"])
for p in sorted(m["packages"], key=lambda p: p["name"]):
    if p["id"] in members and any("cdylib" in t["crate_types"] for t in p["targets"]):
        print(p["name"])
'
