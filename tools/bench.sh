#!/usr/bin/env bash
# Runs every benchmark program in the build's bin folder, printing their tables and writing
# JSON next to them in build/bench-results/. Numbers, not pass/fail.
set -euo pipefail
# Waiting threads sleep instead of spinning, so that figures hold on a busy machine (the chapter
# executables do the same themselves: common/cli.h, wait_passively). A policy you set is kept.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
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
