#!/usr/bin/env bash
# InferLab beside llama.cpp: decode tokens/s of the same GGUF files on this machine, with the same
# thread count, the two programs alternating round by round.
#
#   tools/llamacpp_bench.sh [--threads N] [--rounds R] [--tokens T] [--model HF_FOLDER] [--types "Q8_0 ..."] [--out DIR]
#
# 1. llama.cpp from a source distribution on PyPI: the tree vendored in llama-cpp-python's sdist
#    (pinned version and sha256 in tools/llamacpp_common.sh), built once into tools/.work/llama.cpp
#    (llama-bench, llama-quantize, llama-simple and llama-server, CPU only).
# 2. The model: --model (a Llama Hugging Face folder) or, by default, a random 100M-parameter
#    Llama (tools/random_llama.py), memory-bound on a CPU.
# 3. The files: InferLab's `ch09_quantization export --format f32` writes the F32 GGUF, and
#    llama.cpp's own llama-quantize makes Q8_0, Q4_0 and Q4_K_M from it (or the --types given),
#    so both programs read files that llama.cpp made.
# 4. Per round and file: llama-bench -p 0 -n T -r 3 (its decode test: the mean of 3 repetitions,
#    its avg_ts) and `ch09_quantization run FILE --max-new-tokens T`
#    (1 / its time per output token), each with N threads.
# Writes DIR/llamacpp.md (the ratio table) and DIR/llamacpp.json; numbers, not pass/fail.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=2 ROUNDS=3 TOKENS=64 MODEL="" OUT=build/llamacpp-bench TYPES="Q8_0 Q4_0 Q4_K_M"
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
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

# 1. llama.cpp
llamacpp_build

# 2. and 3. the files
[ -n "$MODEL" ] || MODEL=$(llamacpp_random_model "$PY")
# shellcheck disable=SC2086 # TYPES is a list of words
llamacpp_gguf_files "$MODEL" "$BIN/ch09_quantization" "$THREADS" $TYPES
FILES=("${GGUF_FILES[@]}")

# 4. alternating rounds (none: only build llama.cpp and make the files)
[ "$ROUNDS" -gt 0 ] || { echo "llamacpp_bench: llama.cpp built and the files made in $LLAMACPP_WORK; no rounds asked for"; exit 0; }
results=$OUT/llamacpp.jsonl
: > "$results"
for r in $(seq 1 "$ROUNDS"); do
  for f in "${FILES[@]}"; do
    ll=$("$LLAMACPP_BIN/llama-bench" -m "$f" -p 0 -n "$TOKENS" -t "$THREADS" -r 3 -o json 2> /dev/null |
         "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
    OMP_NUM_THREADS=$THREADS "$BIN/ch09_quantization" run "$f" --max-new-tokens "$TOKENS" --temperature 0 \
      --json "$OUT/inferlab.json" > /dev/null 2>&1
    il=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(1/d["tpot_s"], d["achieved_bytes_per_s"], d["read_ceiling"]["bytes_per_s"], d["step_weight_bytes"])' "$OUT/inferlab.json")
    echo "{\"round\": $r, \"file\": \"$(basename "$f")\", \"llamacpp_tps\": $ll, \"inferlab\": \"$il\"}" >> "$results"
    echo "round $r $(basename "$f"): llama.cpp $ll tok/s, InferLab $il" >&2
  done
done

"$PY" - "$results" "$OUT" "$THREADS" "$TOKENS" "$LLAMACPP_COMMIT" <<'PY'
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
