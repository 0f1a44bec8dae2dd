#!/usr/bin/env bash
# Makes sure the distribution packages InferLab builds with are installed (Debian/Ubuntu).
# As root it installs what is missing with apt; otherwise it prints the one apt line to run.
# Then it makes the small Python venv of the server's client tests (tests/serve), when PyPI can be reached.
set -euo pipefail
PACKAGES=(cmake ninja-build g++ pkg-config libeigen3-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
          libbenchmark-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev doxygen ccache clang-format
          python3 python3-venv curl)
# The serving page's browser test (tests/serve/test_browser_page.py): headless Chromium driven by Selenium.
PACKAGES+=(chromium chromium-driver python3-selenium)
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
if [ ${#missing[@]} -gt 0 ]; then
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
fi

# The client tests' venv: only the last section of tools/requirements.txt (the openai package and what
# it pulls in; the whole file would bring torch). Made again only when that section changes; without
# pip or PyPI it is left out, and the tests that need it skip.
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/tools/.venv-clients"
wanted="$(sed -n '/^# --- client tests/,$p' "$root/tools/requirements.txt" | grep -v '^#')"
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/requirements.txt" 2> /dev/null)" = "$wanted" ]; then
  exit 0
fi
rm -rf "$venv"
if ! python3 -m venv "$venv" > /dev/null 2>&1; then
  rm -rf "$venv"
  echo "setup: no client test venv (python3 -m venv failed); the tests labelled serve that need openai will skip"
  exit 0
fi
echo "$wanted" > "$venv/requirements.in"
if ! "$venv/bin/pip" install -q --timeout 30 --retries 1 -r "$venv/requirements.in" > "$venv/pip.log" 2>&1; then
  tail -n 3 "$venv/pip.log" >&2
  rm -rf "$venv"
  echo "setup: no client test venv (pip could not install tools/requirements.txt's client section; is PyPI reachable?);" \
       "the tests labelled serve that need openai will skip"
  exit 0
fi
mv "$venv/requirements.in" "$venv/requirements.txt"
echo "setup: made tools/.venv-clients (openai client tests)"
