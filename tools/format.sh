#!/usr/bin/env bash
# The project's C++ and CUDA files (.cpp .h .cu .cuh) in the style of the root .clang-format.
#   tools/format.sh                 reformat them in place
#   tools/format.sh --check         change nothing: list the files that differ, with how many of
#                                   their lines would change, and exit 1 if there is any
#   tools/format.sh [--check] FILE...   the same for these files only
# The style is written for clang-format 14 (Debian 12's); another version may format a few
# constructs differently, so --check says which version it ran. CLANG_FORMAT names another binary.
set -euo pipefail
cd "$(dirname "$0")/.."

clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" > /dev/null; then
  echo "format.sh: $clang_format not found (apt-get install clang-format)" >&2
  exit 2
fi
check=0
if [ "${1:-}" = "--check" ]; then
  check=1
  shift
fi
case "${1:-}" in -*) echo "usage: tools/format.sh [--check] [FILE...]" >&2; exit 2 ;; esac

if [ $# -gt 0 ]; then
  files=("$@")
elif git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.cpp' '*.h' '*.cu' '*.cuh')
else  # a copy of the tree without git (the labs' student tree)
  mapfile -t files < <(find common chapters tests -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
fi

if [ $check -eq 0 ]; then
  "$clang_format" -i --style=file "${files[@]}"
  exit 0
fi

differ=0
lines=0
for f in "${files[@]}"; do
  if ! "$clang_format" --style=file "$f" | cmp -s "$f" -; then
    n=$("$clang_format" --style=file "$f" | diff "$f" - | grep -c '^<' || true)  # the file's lines that change
    echo "$f: $n lines"
    differ=$((differ + 1))
    lines=$((lines + n))
  fi
done
version=$("$clang_format" --version | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p')
if [ $differ -gt 0 ]; then
  echo "format.sh: $differ of ${#files[@]} files differ from .clang-format ($lines lines, clang-format $version);" \
    "tools/format.sh reformats them" >&2
  exit 1
fi
echo "format.sh: all ${#files[@]} files match .clang-format (clang-format $version)"
