#!/usr/bin/env bash
# Runs every benchmark program in the build's bin folder, printing their tables and writing
# JSON next to them in build/bench-results/. Numbers, not pass/fail.
set -euo pipefail
# Waiting threads spin for some tens of microseconds, then sleep, so that figures hold on a busy
# machine and the next parallel region does not wait for a wake-up (the chapter executables do the
# same themselves: common/cli.h, wait_passively). A policy or spin count you set is kept.
[ -n "${OMP_WAIT_POLICY:-}" ] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}
bin=${1:-build/release/bin}
out=${2:-build/bench-results}
mkdir -p "$out"
shopt -s nullglob
for exe in "$bin"/bench_*; do
  name=$(basename "$exe")
  echo "==== $name"
  "$exe" --benchmark_out="$out/$name.json" --benchmark_out_format=json --benchmark_counters_tabular=true
done
echo "JSON results in $out/"
