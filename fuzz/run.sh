#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZ_SECONDS each, default 60) and prints the
# executions each one ran. A crash fails the run; its reproducer is copied to
# fuzz/regressions/<target>/ so it can be committed and replayed by `cargo test`
# (filters/core/tests/fuzz_corpus.rs).
#
# cargo-fuzz needs -Z flags; this machine has only the stable toolchain, whose sanitizer
# runtimes are present, so RUSTC_BOOTSTRAP=1 lets stable accept them.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"scan_body route_request glob plugin_config header_pairs usage_stream"}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
status=0
for t in $targets; do
  mkdir -p "corpus/$t"
  # Work on a copy so the committed seed corpus stays small and reviewable.
  work=$(mktemp -d)
  cp -r "corpus/$t/." "$work/"
  log=$(mktemp)
  if cargo fuzz run "$t" "$work" -- -max_total_time="$seconds" -max_len=65536 -print_final_stats=1 >"$log" 2>&1; then
    execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "fuzz $t: ${execs:-?} executions in ${seconds}s, 0 crashes"
  else
    status=1
    echo "fuzz $t: CRASH"
    tail -40 "$log"
    mkdir -p "regressions/$t"
    find "artifacts/$t" -type f -exec cp {} "regressions/$t/" \; 2>/dev/null || true
  fi
  rm -rf "$work" "$log"
done
exit $status
