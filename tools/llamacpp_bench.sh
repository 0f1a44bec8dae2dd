#!/usr/bin/env bash
# InferLab beside llama.cpp: decode tokens/s of the same GGUF files on this machine, with the same
# thread count, the two programs alternating round by round.
#
#   tools/llamacpp_bench.sh [--threads N] [--rounds R] [--tokens T] [--model HF_FOLDER] [--out DIR]
#
# 1. llama.cpp from a source distribution on PyPI: the tree vendored in llama-cpp-python's sdist
#    (pinned version and sha256 below), built once into tools/.work/llama.cpp (llama-bench,
#    llama-quantize and llama-simple, CPU only).
# 2. The model: --model (a Llama Hugging Face folder) or, by default, a random 100M-parameter
#    Llama (tools/random_llama.py), memory-bound on a CPU.
# 3. The files: InferLab's `ch09_quantization export --format f32` writes the F32 GGUF, and
#    llama.cpp's own llama-quantize makes Q8_0, Q4_0 and Q4_K_M from it, so both programs read
#    files that llama.cpp made.
# 4. Per round and file: llama-bench -p 0 -n T -r 3 (its decode test: the mean of 3 repetitions,
#    its avg_ts) and `ch09_quantization run FILE --max-new-tokens T`
#    (1 / its time per output token), each with N threads.
# Writes DIR/llamacpp.md (the ratio table) and DIR/llamacpp.json; numbers, not pass/fail.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 ROUNDS=3 TOKENS=64 MODEL="" OUT=build/llamacpp-bench
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "llamacpp_bench: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz
WORK=tools/.work/llama.cpp
PY=tools/.venv/bin/python
BIN=build/release/bin
[ -x "$BIN/ch09_quantization" ] || { echo "llamacpp_bench: build InferLab first (make build)" >&2; exit 1; }
[ -x "$PY" ] || { echo "llamacpp_bench: set up tools/.venv first (tools/README.md)" >&2; exit 1; }
mkdir -p "$WORK" "$OUT"

# 1. llama.cpp
LL=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
if [ ! -x "$LL/build/bin/llama-bench" ] || [ ! -x "$LL/build/bin/llama-quantize" ] || [ ! -x "$LL/build/bin/llama-simple" ]; then
  if [ ! -f "$WORK/sdist.tar.gz" ]; then
    curl -sSfL -o "$WORK/sdist.part" "$URL"
    echo "$SHA256  $WORK/sdist.part" | sha256sum -c --quiet
    mv "$WORK/sdist.part" "$WORK/sdist.tar.gz"
  fi
  tar xzf "$WORK/sdist.tar.gz" -C "$WORK"
  cmake -S "$LL" -B "$LL/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF > "$WORK/configure.log"
  cmake --build "$LL/build" -j "$(nproc)" --target llama-bench llama-quantize llama-simple > "$WORK/build.log"
fi
LLAMA_COMMIT=$(grep -m1 -o 'LLAMA_BUILD_COMMIT[^)]*' "$LL/build/common/build-info.cpp" 2> /dev/null || echo "vendored in llama-cpp-python $VERSION")

# 2. and 3. the files
if [ -z "$MODEL" ]; then
  MODEL=$WORK/random-100m
  [ -f "$MODEL/model.safetensors" ] || "$PY" tools/random_llama.py "$MODEL"
fi
NAME=$(basename "$MODEL")
F32=$WORK/$NAME-f32.gguf
[ -f "$F32" ] || "$BIN/ch09_quantization" export --model "$MODEL" --format f32 "$F32"
FILES=("$F32")
for q in Q8_0 Q4_0 Q4_K_M; do
  f=$WORK/$NAME-$q.gguf
  [ -f "$f" ] || "$LL/build/bin/llama-quantize" "$F32" "$f" "$q" "$THREADS" > "$WORK/quantize-$q.log" 2>&1
  FILES+=("$f")
done

# 4. alternating rounds (none: only build llama.cpp and make the files)
[ "$ROUNDS" -gt 0 ] || { echo "llamacpp_bench: llama.cpp built and the files made in $WORK; no rounds asked for"; exit 0; }
results=$OUT/llamacpp.jsonl
: > "$results"
for r in $(seq 1 "$ROUNDS"); do
  for f in "${FILES[@]}"; do
    ll=$("$LL/build/bin/llama-bench" -m "$f" -p 0 -n "$TOKENS" -t "$THREADS" -r 3 -o json 2> /dev/null |
         "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
    OMP_NUM_THREADS=$THREADS "$BIN/ch09_quantization" run "$f" --max-new-tokens "$TOKENS" --temperature 0 \
      --json "$OUT/inferlab.json" > /dev/null 2>&1
    il=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(1/d["tpot_s"], d["achieved_bytes_per_s"], d["ceiling"]["bytes_per_s"], d["step_weight_bytes"])' "$OUT/inferlab.json")
    echo "{\"round\": $r, \"file\": \"$(basename "$f")\", \"llamacpp_tps\": $ll, \"inferlab\": \"$il\"}" >> "$results"
    echo "round $r $(basename "$f"): llama.cpp $ll tok/s, InferLab $il" >&2
  done
done

"$PY" - "$results" "$OUT" "$THREADS" "$TOKENS" "$LLAMA_COMMIT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out, threads, tokens, commit = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
table = ["| file | llama.cpp tok/s | InferLab tok/s | InferLab / llama.cpp (median, range) | InferLab GB/s (of the read ceiling) |",
         "|---|---|---|---|---|"]
summary = []
for f in dict.fromkeys(r["file"] for r in rows):
    rs = [r for r in rows if r["file"] == f]
    ll = [r["llamacpp_tps"] for r in rs]
    il = [[float(v) for v in r["inferlab"].split()] for r in rs]
    ratios = [i[0] / l for i, l in zip(il, ll)]
    gbs = statistics.median(i[1] for i in il) / 1e9
    ceil = statistics.median(i[2] for i in il) / 1e9
    table.append(f"| {f} | {statistics.median(ll):.1f} | {statistics.median(i[0] for i in il):.1f} | "
                 f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {gbs:.1f} ({100 * gbs / ceil:.0f}% of {ceil:.1f}) |")
    summary.append({"file": f, "llamacpp_tps": ll, "inferlab_tps": [i[0] for i in il], "ratios": ratios})
head = f"{len(rows) // len(summary)} alternating rounds, {threads} threads each, {tokens} decode tokens; llama.cpp: {commit}"
open(f"{out}/llamacpp.md", "w").write(head + "\n\n" + "\n".join(table) + "\n")
json.dump({"threads": int(threads), "tokens": int(tokens), "llama_cpp": commit, "files": summary}, open(f"{out}/llamacpp.json", "w"), indent=2)
print(head); print("\n".join(table))
PY
