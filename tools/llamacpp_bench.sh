#!/usr/bin/env bash
# InferLab beside llama.cpp: decode tokens/s of the same GGUF files on this machine, with the same
# thread count, the two programs alternating round by round.
#
#   tools/llamacpp_bench.sh [--threads "1 2"] [--rounds R] [--tokens T]
#                           [--model HF_FOLDER | --shape 100m|135m | --files DIR]
#                           [--types "Q8_0 ..."] [--out DIR]
#
# 1. llama.cpp from a source distribution on PyPI: the tree vendored in llama-cpp-python's sdist
#    (pinned version and sha256 in tools/llamacpp_common.sh), built once into tools/.work/llama.cpp
#    (llama-bench, llama-quantize, llama-simple and llama-server, CPU only).
# 2. The model: --model (a Llama Hugging Face folder) or a random Llama of --shape
#    (tools/random_llama.py): 100m (the default; D 1024, memory-bound on a CPU) or 135m (D 576 and
#    30 layers, the small real models' shape, whose rows are not whole 256-value super-blocks).
# 3. The files: InferLab's `ch09_quantization export --format f32` writes the F32 GGUF, and
#    llama.cpp's own llama-quantize makes Q8_0, Q4_0 and Q4_K_M from it (or the --types given),
#    so both programs read files that llama.cpp made. Or --files DIR: every *.gguf in DIR as it
#    is (for instance llama-quantize's files of a model you brought; 2 and 3 are skipped).
# 4. Per round, thread count and file: llama-bench -p 0 -n T -r 3 (its decode test: the mean of 3
#    repetitions, its avg_ts) and `ch09_quantization run FILE --max-new-tokens T`
#    (1 / its time per output token), each with that many threads (--threads: a list, default 2).
# Writes DIR/llamacpp.md (a ratio table per thread count, each ratio the median of the rounds
# with their range) and DIR/llamacpp.json; numbers, not pass/fail. InferLab's GB/s column: for
# weights beyond the last-level cache, its median step against the median of the streaming sums
# `run` takes in turns with the steps; else its mean step against the best of 5 sums in cache.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 ROUNDS=3 TOKENS=64 MODEL="" SHAPE=100m FILES_DIR="" OUT=build/llamacpp-bench TYPES="Q8_0 Q4_0 Q4_K_M"
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --shape) SHAPE=$2; shift 2 ;;
    --files) FILES_DIR=$2; shift 2 ;;
    --types) TYPES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "llamacpp_bench: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
PY=tools/.venv/bin/python
BIN=build/release/bin
[ -x "$BIN/ch09_quantization" ] || { echo "llamacpp_bench: build InferLab first (make build)" >&2; exit 1; }
[ -x "$PY" ] || { echo "llamacpp_bench: set up tools/.venv first (tools/README.md)" >&2; exit 1; }
mkdir -p "$OUT"
. tools/llamacpp_common.sh
# llama.cpp times itself on the wall clock; so does InferLab here (on one thread it would count its
# CPU time otherwise, common/metrics.h).
export INFERLAB_CLOCK=wall

# 1. llama.cpp
llamacpp_build

# 2. and 3. the files
if [ -n "$FILES_DIR" ]; then
  shopt -s nullglob
  FILES=("$FILES_DIR"/*.gguf)
  [ ${#FILES[@]} -gt 0 ] || { echo "llamacpp_bench: no .gguf files in $FILES_DIR" >&2; exit 1; }
else
  [ -n "$MODEL" ] || MODEL=$(llamacpp_random_model "$PY" "$SHAPE")
  # shellcheck disable=SC2086 # TYPES is a list of words
  llamacpp_gguf_files "$MODEL" "$BIN/ch09_quantization" "${THREADS%% *}" $TYPES
  FILES=("${GGUF_FILES[@]}")
fi

# 4. alternating rounds (none: only build llama.cpp and make the files)
[ "$ROUNDS" -gt 0 ] || { echo "llamacpp_bench: llama.cpp built and the files made in $LLAMACPP_WORK; no rounds asked for"; exit 0; }
results=$OUT/llamacpp.jsonl
: > "$results"
for r in $(seq 1 "$ROUNDS"); do
  for t in $THREADS; do
    for f in "${FILES[@]}"; do
      ll=$("$LLAMACPP_BIN/llama-bench" -m "$f" -p 0 -n "$TOKENS" -t "$t" -r 3 -o json 2> /dev/null |
           "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
      OMP_NUM_THREADS=$t "$BIN/ch09_quantization" run "$f" --max-new-tokens "$TOKENS" --temperature 0 \
        --json "$OUT/inferlab.json" > /dev/null 2>&1 ||
        { echo "llamacpp_bench: ch09_quantization run $f failed" >&2; exit 1; }
      il=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); t = d["ceiling_in_turns"]; c = d["read_ceiling"]; print(1/d["tpot_s"], d["step_bytes_per_s"]["median"] if t else d["achieved_bytes_per_s"], c["spread"]["median"] if t else c["bytes_per_s"], d["step_weight_bytes"])' "$OUT/inferlab.json")
      echo "{\"round\": $r, \"threads\": $t, \"file\": \"$(basename "$f")\", \"llamacpp_tps\": $ll, \"inferlab\": \"$il\"}" >> "$results"
      echo "round $r, $t thread(s), $(basename "$f"): llama.cpp $ll tok/s, InferLab $il" >&2
    done
  done
done

"$PY" - "$results" "$OUT" "$TOKENS" "$LLAMACPP_COMMIT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out, tokens, commit = sys.argv[2], sys.argv[3], sys.argv[4]
text, summary = [], []
for threads in dict.fromkeys(r["threads"] for r in rows):
    table = [f"{threads} thread(s):", "",
             "| file | llama.cpp tok/s | InferLab tok/s | InferLab / llama.cpp (median, range) | InferLab GB/s (of the read ceiling) |",
             "|---|---|---|---|---|"]
    for f in dict.fromkeys(r["file"] for r in rows):
        rs = [r for r in rows if r["file"] == f and r["threads"] == threads]
        ll = [r["llamacpp_tps"] for r in rs]
        il = [[float(v) for v in r["inferlab"].split()] for r in rs]
        ratios = [i[0] / l for i, l in zip(il, ll)]
        gbs = statistics.median(i[1] for i in il) / 1e9
        ceil = statistics.median(i[2] for i in il) / 1e9
        table.append(f"| {f} | {statistics.median(ll):.1f} | {statistics.median(i[0] for i in il):.1f} | "
                     f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | {gbs:.1f} ({100 * gbs / ceil:.0f}% of {ceil:.1f}) |")
        summary.append({"file": f, "threads": threads, "llamacpp_tps": ll, "inferlab_tps": [i[0] for i in il], "ratios": ratios})
    text.append("\n".join(table))
rounds = max(r["round"] for r in rows)
head = f"{rounds} alternating rounds, {tokens} decode tokens; llama.cpp: {commit}"
open(f"{out}/llamacpp.md", "w").write(head + "\n\n" + "\n\n".join(text) + "\n")
json.dump({"tokens": int(tokens), "rounds": rounds, "llama_cpp": commit, "files": summary}, open(f"{out}/llamacpp.json", "w"), indent=2)
print(head); print("\n\n".join(text))
PY
