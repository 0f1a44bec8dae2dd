#!/usr/bin/env bash
# Makes sure the distribution packages InferLab builds with are installed (Debian/Ubuntu).
# As root it installs what is missing with apt; otherwise it prints the one apt line to run.
set -euo pipefail
PACKAGES=(cmake ninja-build g++ pkg-config libeigen3-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
          libbenchmark-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev doxygen ccache clang-format)
# tools/fuzz.sh also needs clang with libFuzzer, and the OpenMP runtime clang links.
[ "${1:-}" = "--fuzz" ] && PACKAGES+=(clang libomp-dev)
if ! command -v dpkg-query > /dev/null; then
  echo "setup: not a Debian/Ubuntu system; install the equivalents of: ${PACKAGES[*]}" >&2
  exit 0
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
else
  echo "setup: missing packages. Run:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
