#!/usr/bin/env bash
# The tour: every chapter executable that exists, in order, with no arguments. Run that way,
# each one works on the bundled default model and prints its headline result in a few lines.
set -uo pipefail
bin=${1:-build/release/bin}
shopt -s nullglob
exes=("$bin"/ch[0-9][0-9]_*)
if [ ${#exes[@]} -eq 0 ]; then
  echo "tour: no chapter executables in $bin yet (the chapters arrive one issue at a time; see README.md)."
  exit 0
fi
status=0
for exe in "${exes[@]}"; do
  name=$(basename "$exe")
  echo
  echo "==== $name ===================================================================="
  if ! "$exe"; then
    echo "tour: $name failed" >&2
    status=1
  fi
done
exit $status
