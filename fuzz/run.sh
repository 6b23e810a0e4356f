#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZ_SECONDS each, default 60) and prints the
# executions each one ran. A crash fails the run; its reproducer is copied to
# fuzz/regressions/<target>/ so it can be committed and replayed by `cargo test`
# (filters/core/tests/fuzz_corpus.rs).
#
# Targets run FUZZ_JOBS at a time (default: the machine's CPUs). Each is one single-threaded
# libFuzzer process, so on a machine doing nothing else one target per core gets the same
# FUZZ_SECONDS of a whole core as it would alone, in 1/FUZZ_JOBS of the wall time. Every target is
# built first, in one `cargo fuzz build`, so no compile competes with a run. FUZZ_JOBS=1 runs them
# one after another.
#
# cargo-fuzz needs -Z flags; this machine has only the stable toolchain, whose sanitizer
# runtimes are present, so RUSTC_BOOTSTRAP=1 lets stable accept them.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"scan_body route_request glob plugin_config header_pairs usage_stream"}
jobs=${FUZZ_JOBS:-$(nproc)}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for t in $targets; do
  # The same build `cargo fuzz run` makes (it finds it done); the dependencies build once.
  if ! cargo fuzz build "$t" >"$logs/build" 2>&1; then
    echo "fuzz $t: build failed"
    tail -40 "$logs/build"
    exit 1
  fi
done

# One target: its libFuzzer output in $logs/<t>, and "ok" or "crash" in $logs/<t>.status.
fuzz_one() {
  local t=$1 work
  mkdir -p "corpus/$t"
  # Work on a copy so the committed seed corpus stays small and reviewable.
  work=$(mktemp -d)
  cp -r "corpus/$t/." "$work/"
  if cargo fuzz run "$t" "$work" -- -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 >"$logs/$t" 2>&1; then
    echo ok >"$logs/$t.status"
  else
    echo crash >"$logs/$t.status"
  fi
  rm -rf "$work"
}

running=0
for t in $targets; do
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

status=0
for t in $targets; do
  if [ "$(cat "$logs/$t.status" 2>/dev/null)" = ok ]; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$logs/$t" | awk '{print $2}')
    echo "fuzz $t: ${execs:-?} executions in ${seconds}s, 0 crashes"
  else
    status=1
    echo "fuzz $t: CRASH"
    tail -40 "$logs/$t" 2>/dev/null || echo "(no output: the run did not start)"
    mkdir -p "regressions/$t"
    find "artifacts/$t" -type f -exec cp {} "regressions/$t/" \; 2>/dev/null || true
  fi
done
exit $status
