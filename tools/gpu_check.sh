#!/usr/bin/env bash
# The one prepared check for a GPU machine (see docs/gpu.md). In order of value, each step under
# its own time limit and all of them under one deadline: the CUDA tests of every test program
# (stopping at once when they skip for want of a device), the GPU benchmarks, the chapters' GPU
# measurements, compute-sanitizer's memcheck over the CUDA tests, and last the CPU tests. The
# summary prints last; every detail (GoogleTest and Google Benchmark JSON, each step's output)
# goes into one archive, so that the results are a handful of files:
#   $OUT/summary.txt  $OUT/steps.txt  $OUT/machine.txt  $OUT/gpu_check.log  $OUT/results.tar.gz
#   $OUT/gemv.json (the GEMV versions against cuBLAS, tools/gemv_table.py)
#   $OUT/qgemv.json (the quantised GEMV's versions against bf16, tools/gemv_table.py --quant)
#
#   tools/gpu_check.sh              # builds here first (CUDA required; needs the C++ packages)
#   tools/gpu_check.sh --prebuilt   # runs the binaries tools/gpu_pack.sh packed into .gpu/
# Environment: OUT (default build/gpu-check), CUDA_ARCH (default 90, the H100/H200; 80 for an
# A100), BENCH_MIN_TIME (seconds of measured time per benchmark case, default 0.02),
# GPU_CHECK_SECONDS (the deadline, default 480: steps that cannot finish before it are cut short
# or not started, and the results are still written).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))
ARCH=${CUDA_ARCH:-90}
RAW=$(mktemp -d)  # the details, archived at the end
LOG="$OUT/gpu_check.log"
: > "$LOG"
: > "$OUT/steps.txt"
status=0
no_device=0

finish() {
  tar -czf "$OUT/results.tar.gz" -C "$RAW" . 2> /dev/null
  {
    echo "==== summary (full log: gpu_check.log; details: results.tar.gz)"
    cat "$OUT/machine.txt"
    echo "--- steps (rc 124: cut at its time limit)"
    cat "$OUT/steps.txt"
    echo "--- tests"
    for kind in cuda cpu; do
      cat "$RAW"/${kind}_*.gtest.txt 2> /dev/null | awk -v k=$kind '
        /^\[  PASSED  \] [0-9]+ test/ {p += $4} /^\[  SKIPPED \] [0-9]+ test/ {s += $4}
        /^\[  FAILED  \] [A-Za-z]/ && !($4 in seen) {seen[$4]; f++; print "  failed: " $4}
        END {if (p + s + f) printf "%s tests: %d passed, %d skipped, %d failed\n", k, p, s, f}'
    done
    grep -h "ERROR SUMMARY" "$RAW"/memcheck_*.txt 2> /dev/null | sort | uniq -c
    echo "--- benchmarks and measurements"
    grep -hE "^(BM_|Benchmark)" "$RAW"/bench_*.txt 2> /dev/null | cut -c1-200
    if [ -f "$RAW/bench_core.json" ]; then
      echo "--- GEMV versions against cuBLAS (also in gemv.json)"
      python3 "$ROOT/tools/gemv_table.py" "$RAW/bench_core.json" "$OUT/gemv.json" 2>&1
    fi
    if [ -f "$RAW/qgemv.json" ]; then
      echo "--- quantised GEMV versions against bf16 (also in qgemv.json)"
      python3 "$ROOT/tools/gemv_table.py" --quant "$RAW/qgemv.json" "$OUT/qgemv.json" 2>&1
    fi
    echo "--- GPU launches per step (chapters 11 and 12; the batched step's do not grow with the batch)"
    grep -H "launches per step" "$RAW"/ch1[12]_*.txt 2> /dev/null | sed "s|^$RAW/||; s|\.txt:| |"
    for f in "$RAW"/ch*.txt; do [ -f "$f" ] && { echo "# $(basename "$f" .txt)"; tail -25 "$f"; }; done
  } > "$OUT/summary.txt"
  cat "$OUT/summary.txt"
  rm -rf "$RAW"
}

# step NAME LIMIT COMMAND...: runs one step with its output in $RAW/NAME.txt, cut at LIMIT seconds
# or at the deadline, whichever comes first; a step with under 10 s left is not started.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS - 10))
  if [ "$left" -lt 10 ]; then
    echo "$name not-run (deadline)" | tee -a "$OUT/steps.txt"
    status=1
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit}s): $*" >> "$LOG"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" > "$RAW/$name.txt" 2>&1
  local rc=$?
  cat "$RAW/$name.txt" >> "$LOG"
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
  [ $rc -eq 0 ] || status=1
  return $rc
}

{
  if [ "${1:-}" = --prebuilt ]; then
    echo "binaries of commit $(cat .gpu/commit 2> /dev/null || echo unknown) (tools/gpu_pack.sh)"
  else
    echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)" \
      "$(git status --porcelain 2> /dev/null | grep -q . && echo '(with local changes)')"
  fi
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  echo "nvcc: $(nvcc --version 2> /dev/null | tail -1) host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >> "$LOG"

if [ "${1:-}" = --prebuilt ]; then
  # Binaries from tools/gpu_pack.sh: unpack, make their compiled-in source folder (where data/ is
  # read from) point here, and find the CUDA libraries they link.
  [ -f .gpu/pack.tar.xz ] || { echo "gpu_check: no .gpu/pack.tar.xz (run tools/gpu_pack.sh first)" | tee -a "$LOG"; exit 1; }
  BUILD=build/gpu-prebuilt
  rm -rf "$BUILD" && mkdir -p "$BUILD" && tar -xJf .gpu/pack.tar.xz -C "$BUILD"
  src=$(cat "$BUILD/source_dir")
  if [ "$src" != "$ROOT" ] && [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$ROOT" "$src"; fi
  [ "$(cd "$src" 2> /dev/null && pwd -P)" = "$(pwd -P)" ] ||
    echo "gpu_check: warning: the binaries read data from $src, which is not this tree" | tee -a "$LOG"
  libs="$ROOT/$BUILD/lib"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libs="$libs:$d"; done
  for d in $(python3 -c 'import nvidia, sys; print(*nvidia.__path__)' 2> /dev/null); do
    for l in $(find "$d" -maxdepth 4 -name 'libcublas.so.*' -printf '%h\n' 2> /dev/null | sort -u); do libs="$libs:$l"; done
  done
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing=$(ldd "$BUILD"/bin/* | grep "not found" | sort -u)
  [ -z "$missing" ] || { echo "gpu_check: libraries not found: $missing" | tee -a "$LOG"; exit 1; }
else
  BUILD=build/gpu
  prefix=()
  [ -d .deps/root/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
  step configure 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERLAB_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${prefix[@]}" || { tail -30 "$RAW/configure.txt"; finish; exit 1; }
  step build 900 cmake --build "$BUILD" -j "$(nproc)" || { grep -E "error" "$RAW/build.txt" | head -30; finish; exit 1; }
fi
B="$ROOT/$BUILD/bin"
TESTS=("$B"/inferlab_tests "$B"/test_ch*)

# 1. The CUDA tests, every test program's own, four programs at a time. A test that skips for want
# of a device fails the check, and nothing after it runs.
cuda_tests() {  # cuda_tests PROGRAM: its Cuda* tests, output and JSON in $RAW
  local n
  n=$(basename "$1")
  "$1" --gtest_filter='Cuda*' --gtest_output=json:"$RAW/cuda_$n.json" > "$RAW/cuda_$n.gtest.txt" 2>&1
}
export -f cuda_tests
export RAW
step cuda_tests 150 bash -c 'printf "%s\n" "$@" | xargs -P 4 -I{} bash -c "cuda_tests {} || echo FAILED: {}"' _ "${TESTS[@]}"
grep -l "FAILED" "$RAW"/cuda_*.gtest.txt 2> /dev/null | xargs -r -n1 basename | sed 's/^cuda_/failed: /; s/.gtest.txt$//' |
  tee -a "$OUT/steps.txt"
grep -q "FAILED" "$RAW/cuda_tests.txt" && status=1
if grep -qh "no CUDA device available" "$RAW"/cuda_*.gtest.txt 2> /dev/null; then
  echo "cuda_tests: the CUDA tests skipped: $(grep -h -m1 -o 'no CUDA device available.*' "$RAW"/cuda_*.gtest.txt | head -1)" |
    tee -a "$OUT/steps.txt"
  status=1
  no_device=1
fi
ran=$(cat "$RAW"/cuda_*.gtest.txt 2> /dev/null | grep -c "^\[       OK \]")
echo "cuda_tests: $ran tests passed" | tee -a "$OUT/steps.txt"
[ "$ran" -gt 0 ] || { status=1; no_device=1; }
if [ $no_device -eq 1 ]; then finish; exit 1; fi

# 2. The GPU benchmarks (the CPU ones are measured on the development machine), one at a time. A
# kernel of microseconds costs far more wall time than it measures (the host's launch and
# synchronisation), so each case runs for BENCH_MIN_TIME seconds of measured time, not the default
# half second: that is still thousands of launches.
for b in "$B"/bench_*; do
  n=$(basename "$b")
  filter=Cuda
  [ "$n" = bench_quant ] && filter=BM_CudaMatvec  # BM_CudaQgemv is the step after the loop
  step "$n" 120 "$b" --benchmark_filter="$filter" --benchmark_min_time="${BENCH_MIN_TIME:-0.02}" \
    --benchmark_out="$RAW/$n.json" --benchmark_out_format=json --benchmark_counters_tabular=true
done
# The quantised GEMV's versions at the 1B/8B layer shapes against bf16 (tools/gemv_table.py --quant):
# 56 cases, each format and shape quantised once on the CPU for both versions.
[ -x "$B/bench_quant" ] && step qgemv 90 "$B/bench_quant" --benchmark_filter=BM_CudaQgemv \
  --benchmark_out="$RAW/qgemv.json" --benchmark_out_format=json --benchmark_counters_tabular=true

# 3. The chapters' GPU measurements.
# Chapter 10: int4 self-speculation on a random 100M-parameter target, both models on the GPU.
step ch10_self 60 "$B"/ch10_speculative_sampling self --random --device cuda --temperature 1 --gamma 4 \
  --max-new-tokens 96 --json "$RAW/ch10_self.json"
# Chapter 12: the paged kernel against the same kernel over blocks in order and the contiguous op.
step ch12_speed_16k 45 "$B"/ch12_paged_attention speed --device cuda --context 16384 --json "$RAW/ch12_speed_16k.json"
step ch12_speed_64k 45 "$B"/ch12_paged_attention speed --device cuda --context 65536 --json "$RAW/ch12_speed_64k.json"
# Chapter 11: static against continuous batching on one trace (all requests at once, then two
# arrival rates), tiny-mha and the random 100M Llama, at a cap of 32 sequences.
step ch11_trace 60 "$B"/ch11_continuous_batching trace --device cuda --requests 256 --max-running 32 \
  --step-tokens 512 --budget-mib 4096 --json "$RAW/ch11_trace.json"
step ch11_trace_random 60 "$B"/ch11_continuous_batching trace --device cuda --random --requests 256 --rate 0 \
  --prompt-median 64 --max-running 32 --step-tokens 512 --budget-mib 16384 --json "$RAW/ch11_trace_random.json"
step ch12_memory 45 "$B"/ch12_paged_attention memory --device cuda --requests 256 --max-running 64 \
  --step-tokens 512 --budget-mib 16 --json "$RAW/ch12_memory.json"
# Chapters 11 and 12: the engine's kernel launches per step at a cap of 4 sequences and of 32 (64
# for chapter 12). The batched step (each layer: one launch storing every new K and V, one
# attending every sequence, one merging) makes as many at any batch; cache by cache
# (--attend per-sequence) they grow with it.
for cap in 4 32; do
  step ch11_launches_b$cap 45 "$B"/ch11_continuous_batching trace --device cuda --requests 64 --rate 0 \
    --policy continuous --max-running $cap --step-tokens 512 --budget-mib 1024 --json "$RAW/ch11_launches_b$cap.json"
done
step ch11_launches_b32_per_sequence 45 "$B"/ch11_continuous_batching trace --device cuda --requests 64 --rate 0 \
  --policy continuous --max-running 32 --step-tokens 512 --budget-mib 1024 --attend per-sequence \
  --json "$RAW/ch11_launches_b32_per_sequence.json"
step ch12_memory_b4 45 "$B"/ch12_paged_attention memory --device cuda --requests 64 --max-running 4 \
  --step-tokens 512 --budget-mib 16 --json "$RAW/ch12_memory_b4.json"
# Chapter 05: decode at a fixed memory budget for caches, each sharing factor at the batch it fits.
step ch05_throughput 45 "$B"/ch05_cla throughput --device cuda --seq 4096 --memory-mb 2048 --layers 8 \
  --shares 1,2,4 --json "$RAW/ch05_throughput.json"
# Chapter 06: a decode step against position, every layer global against every layer local.
step ch06_speed 45 "$B"/ch06_local_attention speed --device cuda --layers 8 --window 4096 \
  --positions 4096,16384,65536 --json "$RAW/ch06_speed.json"
# Chapter 07: one layer's prefill scan (the chunked kernel against the step loop), and a decode step
# against position for a Mamba beside a transformer of the same size.
step ch07_scan 45 "$B"/ch07_mamba scan --device cuda --tokens 1024,4096,16384 --json "$RAW/ch07_scan.json"
step ch07_speed 45 "$B"/ch07_mamba speed --device cuda --positions 1024,4096,16384,32768 --json "$RAW/ch07_speed.json"
# Chapter 08: diffusion against autoregression, tokens/s and intensity against R.
step ch08_speed 45 "$B"/ch08_diffusion_lm speed --device cuda --gen-length 256 --steps 256,64,16,4 \
  --json "$RAW/ch08_speed.json"

# 4. compute-sanitizer's memcheck over each program's CUDA tests, four at a time (slow: a program
# cut at the limit is reported, not failed).
if command -v compute-sanitizer > /dev/null; then
  memcheck() {
    local n
    n=$(basename "$1")
    # compute-sanitizer fails a program that never calls CUDA: skip those with no CUDA tests
    "$1" --gtest_list_tests --gtest_filter='Cuda*' | grep -q '^  ' || { echo "memcheck $n: no CUDA tests"; return; }
    timeout -k 5 "$2" compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
      "$1" --gtest_filter='Cuda*' > "$RAW/memcheck_$n.txt" 2>&1
    echo "memcheck $n rc=$?"
  }
  export -f memcheck
  left=$((DEADLINE - SECONDS - 25))
  [ "$left" -gt 150 ] && left=150
  step memcheck $((left + 10)) bash -c 'printf "%s\n" "${@:2}" | xargs -P 4 -I{} bash -c "memcheck {} $1"' _ "$left" "${TESTS[@]}"
  grep -q "rc=9" "$RAW/memcheck.txt" && status=1
else
  echo "memcheck not-run (no compute-sanitizer)" | tee -a "$OUT/steps.txt"
fi

# 5. The CPU tests on this host, every program in parallel (CI runs them too; here they meet another
# CPU and the non-Cuda tests that use the device when it is there).
cpu_tests() {
  local n
  n=$(basename "$1")
  "$1" --gtest_filter='-Cuda*' --gtest_brief=1 > "$RAW/cpu_$n.gtest.txt" 2>&1 || echo "FAILED: $n"
}
export -f cpu_tests
step cpu_tests 150 bash -c 'printf "%s\n" "$@" | xargs -P 16 -I{} bash -c "cpu_tests {}"' _ "${TESTS[@]}"
grep -q "FAILED" "$RAW/cpu_tests.txt" && status=1

finish
exit $status
