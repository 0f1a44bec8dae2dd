#!/usr/bin/env bash
# The tour: every chapter executable that exists, in order, with no arguments. Run that way,
# each one works on the bundled default model and prints its headline result in a few lines.
# The one exception is chapter 13's server, which run bare serves until it is stopped: the tour
# runs `ch13_serve demo` (it serves on a loopback port, drives itself with clients, and stops).
# Each sets OpenMP's waiting threads to sleep after a short spin (common/cli.h, wait_passively), so
# its figures hold when other jobs share the machine; the tour says how long each took.
set -uo pipefail
bin=${1:-build/release/bin}
shopt -s nullglob
exes=("$bin"/ch[0-9][0-9]_*)
if [ ${#exes[@]} -eq 0 ]; then
  echo "tour: no chapter executables in $bin yet (the chapters arrive one issue at a time; see README.md)."
  exit 0
fi
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
status=0
tour_start=$(date +%s.%N)
for exe in "${exes[@]}"; do
  name=$(basename "$exe")
  echo
  echo "==== $name ===================================================================="
  start=$(date +%s.%N)
  args=()
  [ "$name" = ch13_serve ] && args=(demo)
  if ! "$exe" "${args[@]}"; then
    echo "tour: $name failed" >&2
    status=1
  fi
  echo "($name: $(since "$start") s)"
done
echo
echo "tour: ${#exes[@]} chapters in $(since "$tour_start") s"
exit $status
