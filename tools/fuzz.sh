#!/usr/bin/env bash
# Fuzzes every reader with libFuzzer under ASan + UBSan: builds the fuzz preset (clang), writes
# the seed corpora from the bundled data (fuzz_seeds), runs each target for SECONDS (default 60)
# and prints one table row per target: executions, their rate, new coverage, and findings.
#   tools/fuzz.sh [SECONDS] [TARGET...]
#   tools/fuzz.sh --smoke        a fixed 2000 mutations per target from the seeds alone, with a
#                                fixed random seed: the same inputs on every run (CI runs this)
# FUZZ_RUNS=N stops a target after N executions if that comes before SECONDS; FUZZ_NO_BUILD=1
# skips the build (for several runs of the script side by side).
# Findings (crash, leak, sanitizer report, timeout, an exception other than inferlab::Error)
# are saved by libFuzzer as build/fuzz/findings/<target>/crash-* and make the script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0
if [ "${1:-}" = "--smoke" ]; then smoke=1; shift; set -- 0 "$@"; fi
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] ||
  targets=(safetensors config tokenizer_json llama2c llama2c_tokenizer gguf cli gguf_tokenizer quant_blocks hf_config openai http)
if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  tools/setup.sh --fuzz
  cmake --preset fuzz > build-fuzz-configure.log 2>&1 || { cat build-fuzz-configure.log; exit 1; }
  rm -f build-fuzz-configure.log
  cmake --build --preset fuzz --target fuzz_seeds $(printf 'fuzz_%s ' "${targets[@]}")
fi
out=build/fuzz
build/fuzz/bin/fuzz_seeds "$out/seeds" data ../shared > /dev/null
declare -A max_len=([safetensors]=16384 [config]=4096 [tokenizer_json]=65536 [llama2c]=65536
                    [llama2c_tokenizer]=8192 [gguf]=131072 [cli]=512 [gguf_tokenizer]=4096 [quant_blocks]=4096
                    [hf_config]=8192 [openai]=4096 [http]=8192)
# libFuzzer dictionaries (tests/fuzz/<target>.dict) where a target has one.
dict_for() { [ -f "tests/fuzz/$1.dict" ] && echo "-dict=tests/fuzz/$1.dict" || true; }
status=0
echo "| target | seconds | executions | per second | coverage (edges) | findings |"
echo "|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
  mkdir -p "$out/corpus/$t" "$out/findings/$t" "$out/logs"
  log="$out/logs/$t.log"
  if [ $smoke = 1 ]; then  # no corpus folder: the seeds only, so every run sees the same inputs
    budget=(-runs=2000 -seed=1 "$out/seeds/$t")
  else
    budget=(-max_total_time="$seconds" "$out/corpus/$t" "$out/seeds/$t")
    [ -z "${FUZZ_RUNS:-}" ] || budget+=(-runs="$FUZZ_RUNS")
  fi
  start=$(date +%s)
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$out/bin/fuzz_$t" "${budget[@]}" $(dict_for "$t") -max_len="${max_len[$t]}" -timeout=10 -rss_limit_mb=2048 \
       -print_final_stats=1 -artifact_prefix="$out/findings/$t/" > "$log" 2>&1; then
    found=0
  else
    found=$(find "$out/findings/$t" -type f | wc -l)
    [ "$found" -gt 0 ] || found="exit status, see $log"
    status=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  took=$(( $(date +%s) - start ))
  [ $took -gt 0 ] || took=1
  echo "| $t | $took | ${execs:-?} | $(( ${execs:-0} / took )) | ${cov:-?} | $found |"
done
exit $status
