#!/usr/bin/env bash
# Runs every benchmark program in the build's bin folder, printing their tables and writing
# JSON next to them in build/bench-results/. Numbers, not pass/fail.
set -euo pipefail
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
