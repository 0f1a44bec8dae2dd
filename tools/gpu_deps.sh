#!/usr/bin/env bash
# Fills .deps/ (ignored by git) with the C++ dependencies, copied from this machine's Debian
# packages, so that a bare GPU machine (CUDA toolkit, cmake, ninja; no package access) can
# build InferLab: headers, CMake package files, static libraries, and the few shared ones
# (Google Benchmark, PCRE2, utf8proc) with their run-time files. Paths keep their layout under
# .deps/root/usr, so the packages' relocatable CMake files work from there.
#   tools/gpu_deps.sh            # then copy the tree with .deps to the GPU machine (see docs/gpu.md)
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(libeigen3-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
          libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2)
rm -rf .deps
mkdir -p .deps/root
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" ||
    { echo "gpu_deps: package $p is not installed here (run tools/setup.sh as root first)" >&2; exit 1; }
  dpkg -L "$p" | while read -r f; do
    case "$f" in /usr/share/doc/* | /usr/share/man/* | /usr/share/lintian/*) continue ;; esac
    [ -f "$f" ] || continue  # regular files and links to them; folders come with their files
    mkdir -p ".deps/root$(dirname "$f")"
    cp -L "$f" ".deps/root$f"  # links become files: the device tool carries links only as links
  done
done
du -sh .deps | awk '{print "gpu_deps: .deps holds " $1}'
