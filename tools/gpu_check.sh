#!/usr/bin/env bash
# The one prepared check for a GPU machine (see docs/gpu.md): build with the CUDA backend
# required, run every CUDA test and then the whole suite, run the benchmarks, and write a log
# plus JSON under $OUT (or build/gpu-check when OUT is unset). The summary table prints last.
#
# On a bare machine, first fill .deps/ here with tools/gpu_deps.sh and carry it along.
# Fits in about 8 minutes on one H200 with 16 cores (most of it the first build).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
BUILD=build/gpu
ARCH=${CUDA_ARCH:-90}  # the H200/H100; sm_80 for an A100
prefix=()
[ -d .deps/root/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/root/usr")
status=0
step() {  # step NAME COMMAND...: runs and logs one step, remembering failures
  local name=$1
  shift
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$(date +%s)
  "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
  [ $rc -eq 0 ] || status=1
  return $rc
}
: > "$LOG"
: > "$OUT/steps.txt"
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvcc --version | tail -1
} | tee -a "$LOG" > "$OUT/machine.txt"

step configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DINFERLAB_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${prefix[@]}" || { tail -30 "$LOG"; exit 1; }
step build cmake --build "$BUILD" -j "$(nproc)" || { grep -E "error" "$LOG" | head -30; exit 1; }
for t in "$BUILD"/bin/inferlab_tests "$BUILD"/bin/test_ch*; do  # the CUDA tests first, each binary's own
  step "cuda_$(basename "$t")" "$t" --gtest_filter='Cuda*' --gtest_output=json:"$OUT/cuda_$(basename "$t").json"
done
step all_tests ctest --test-dir "$BUILD" --output-on-failure -j 8
for b in "$BUILD"/bin/bench_*; do
  name=$(basename "$b")
  # The GPU benchmarks only: the CPU ones are measured on the development machine.
  step "$name" "$b" --benchmark_filter=Cuda --benchmark_out="$OUT/$name.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true
done
# Chapter 05: decode at a fixed memory budget for caches, each sharing factor at the batch it fits.
step ch05_throughput "$BUILD"/bin/ch05_cla throughput --device cuda --seq 4096 --memory-mb 2048 --layers 8 \
  --shares 1,2,4 --json "$OUT/ch05_throughput.json"
# Chapter 06: a decode step against position, every layer global against every layer local.
step ch06_speed "$BUILD"/bin/ch06_local_attention speed --device cuda --layers 8 --window 4096 \
  --positions 4096,16384,65536 --json "$OUT/ch06_speed.json"
# Chapter 07: one layer's prefill scan (the chunked kernel against the step loop), and a decode step
# against position for a Mamba beside a transformer of the same size.
step ch07_scan "$BUILD"/bin/ch07_mamba scan --device cuda --tokens 1024,4096,16384 --json "$OUT/ch07_scan.json"
step ch07_speed "$BUILD"/bin/ch07_mamba speed --device cuda --positions 1024,4096,16384,32768 --json "$OUT/ch07_speed.json"
# Chapter 08: diffusion against autoregression, tokens/s and intensity against R.
step ch08_speed "$BUILD"/bin/ch08_diffusion_lm speed --device cuda --gen-length 256 --steps 256,64,16,4 \
  --json "$OUT/ch08_speed.json"
# Chapter 10: int4 self-speculation on a random 100M-parameter target, both models on the GPU.
step ch10_self "$BUILD"/bin/ch10_speculative_sampling self --random --device cuda --temperature 1 --gamma 4 \
  --max-new-tokens 96 --json "$OUT/ch10_self.json"
# Chapter 11: static against continuous batching on one trace (all requests at once, then two
# arrival rates), tiny-mha and the random 100M Llama, at a cap of 32 sequences.
step ch11_trace "$BUILD"/bin/ch11_continuous_batching trace --device cuda --requests 256 --max-running 32 \
  --step-tokens 512 --budget-mib 4096 --json "$OUT/ch11_trace.json"
step ch11_trace_random "$BUILD"/bin/ch11_continuous_batching trace --device cuda --random --requests 256 --rate 0 \
  --prompt-median 64 --max-running 32 --step-tokens 512 --budget-mib 16384 --json "$OUT/ch11_trace_random.json"
# Chapter 12: the paged kernel against the same kernel over blocks in order and the contiguous op
# at 16K and 64K positions; chapter 11's trace on contiguous and paged caches on the GPU.
step ch12_speed "$BUILD"/bin/ch12_paged_attention speed --device cuda --context 16384 --json "$OUT/ch12_speed_16k.json"
step ch12_speed_64k "$BUILD"/bin/ch12_paged_attention speed --device cuda --context 65536 --json "$OUT/ch12_speed_64k.json"
step ch12_memory "$BUILD"/bin/ch12_paged_attention memory --device cuda --requests 256 --max-running 64 \
  --step-tokens 512 --budget-mib 16 --json "$OUT/ch12_memory.json"

echo
echo "==== summary (full log: $LOG)"
cat "$OUT/machine.txt"
cat "$OUT/steps.txt"
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$LOG" | sort | uniq -c | head -20
grep -E "tests passed|tests failed" "$LOG" | tail -2
# The benchmark tables (name, time, counters).
grep -E "^(BM_|-{10}|Benchmark)" "$LOG" | cut -c1-160
exit $status
