#!/usr/bin/env bash
# GGUF files as llama.cpp's own llama-quantize makes them, run by `ch09_quantization run FILE`
# alone (greedy, the file's own tokenizer), and checked two ways:
#  - tools/gguf_reference.py: float64 over the gguf package's dequantised weights, with x rounded
#    through q8_0 blocks as the products do, teacher-forced on InferLab's tokens. For a token that
#    is not the reference's argmax it gives the gap between the two logits in units of σ, the RMS
#    change that moving the activations by up to 8 float32 ulps makes to that gap (--sensitivity):
#    the rounding of x to q8_0 is a step function, so float32-sized differences break near-ties;
#    and the same gap in a float32 twin of the reference (negative: it also prefers InferLab's token);
#  - llama.cpp's greedy text on the same file and prompt (llama-simple): where it is not ours, the
#    step where it parts and the float64 reference's top-two margin there, and llama.cpp's tokens
#    (ours while its text follows ours, then the rest of its text tokenized again) teacher-forced
#    through the same reference: how many are its argmax, and how far below it the others are
#    (past the step where they part, a random model's text, runs of one letter and pieces of UTF-8
#    characters, need not tokenize back to llama.cpp's tokens: read that column for trained models).
#
#   tools/gguf_check.sh [--model HF_FOLDER | --model random | --model wide] [--tokens N] [--types "F16 Q8_0 ..."] [--out DIR]
#
# --model defaults to the bundled tiny-mha: trained, but its rows of 128 are not whole 256-value
# super-blocks, so llama-quantize writes Q4_0, Q5_0, Q5_1, Q8_0 or IQ4_NL where a k-quant or
# IQ4_XS was asked for. `--model random` takes tools/llamacpp_bench.sh's random 100M-parameter
# Llama (rows of 1024 and 2816), whose Q2_K … Q6_K and IQ4_XS files hold those types themselves;
# its logits are nearly flat. `--model wide` takes tiny-mha widened with zeros to rows of 256 and
# 512 (tools/widen_llama.py: the same function), trained and in whole super-blocks. Needs tools/.venv and a release
# build; builds llama.cpp through tools/llamacpp_bench.sh --rounds 0 the first time.
# Writes DIR/gguf_check.md (the table) and the JSON of every run and check beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=data/models/tiny-mha TOKENS=64 OUT=build/gguf-check
TYPES="F16 Q8_0 Q6_K Q5_K_M Q5_1 Q5_0 Q4_K_M Q4_1 Q4_0 IQ4_NL IQ4_XS Q3_K_M Q2_K"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --types) TYPES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "gguf_check: unknown option '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
WORK=tools/.work/llama.cpp
PY=tools/.venv/bin/python
BIN=build/release/bin
[ -x "$BIN/ch09_quantization" ] || { echo "gguf_check: build InferLab first (make build)" >&2; exit 1; }
[ -x "$PY" ] || { echo "gguf_check: set up tools/.venv first (tools/README.md)" >&2; exit 1; }
if [ "$MODEL" = random ]; then
  tools/llamacpp_bench.sh --rounds 0 > /dev/null
  MODEL=$WORK/random-100m
elif [ "$MODEL" = wide ]; then
  MODEL=$WORK/tiny-mha-wide
  [ -f "$MODEL/model.safetensors" ] || "$PY" tools/widen_llama.py "$MODEL" >&2
  tools/llamacpp_bench.sh --rounds 0 --model "$MODEL" > /dev/null
else
  tools/llamacpp_bench.sh --rounds 0 --model "$MODEL" > /dev/null
fi
LLB=$(ls -d $WORK/llama_cpp_python-*/vendor/llama.cpp/build/bin | head -1)
NAME=$(basename "$MODEL")
F32=$WORK/$NAME-f32.gguf
mkdir -p "$OUT"
PROMPT="Once upon a time"
table="| file | tokens | the float64 reference's argmax | where not: the reference's logit gap (in σ of its change under 8 ulps; the float32 twin's gap) | llama.cpp's text | llama.cpp's tokens: the reference's argmax |"$'\n'"|---|---|---|---|---|---|"
for t in $TYPES; do
  f=$WORK/$NAME-$t.gguf
  [ -f "$f" ] || "$LLB/llama-quantize" "$F32" "$f" "$t" 2 > "$OUT/quantize-$t.log" 2>&1
  "$BIN/ch09_quantization" run "$f" --prompt "$PROMPT" --temperature 0 --max-new-tokens "$TOKENS" \
    --json "$OUT/run-$t.json" > /dev/null 2>&1
  "$PY" tools/gguf_reference.py "$f" "$OUT/run-$t.json" --round-x --sensitivity --twin32 --json "$OUT/ref-$t.json" \
    > "$OUT/ref-$t.txt" || true
  n=$("$PY" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["generated"]))' "$OUT/run-$t.json")
  "$LLB/llama-simple" -m "$f" -n "$n" "$PROMPT" > "$OUT/llama-$t.txt" 2> /dev/null
  "$PY" - "$OUT/run-$t.json" "$OUT/llama-$t.txt" "$PROMPT" "$MODEL/tokenizer.json" "$OUT/llama-$t.json" <<'PY'
import json, sys
from tokenizers import Tokenizer
run, ll, prompt, tok, out = sys.argv[1:]
run = json.load(open(run))
text = open(ll, "rb").read().decode("utf-8", "replace")
text = text[text.find(prompt) + len(prompt):].rstrip("\n")
# Our tokens as far as llama.cpp's text follows them (where the texts agree, the same tokens), then
# the rest of its text tokenized again: a random model's text (runs of one letter, parts of UTF-8
# characters) need not tokenize back to the tokens that wrote it.
t, g = Tokenizer.from_file(tok), run["generated"]
k = next((i for i in range(len(g)) if not text.startswith(t.decode(g[:i + 1]))), len(g))
rest = text[len(t.decode(g[:k])):] if k else text
ids = (g[:k] + t.encode(rest, add_special_tokens=False).ids)[:len(g)]
json.dump({"prompt_tokens": run["prompt_tokens"], "generated": ids}, open(out, "w"))
PY
  "$PY" tools/gguf_reference.py "$f" "$OUT/llama-$t.json" --round-x --json "$OUT/ref-llama-$t.json" > /dev/null || true
  row=$("$PY" - "$f" "$OUT/run-$t.json" "$OUT/ref-$t.json" "$OUT/llama-$t.txt" "$PROMPT" "$MODEL/tokenizer.json" \
    "$OUT/ref-llama-$t.json" <<'PY'
import json, os, sys
from tokenizers import Tokenizer
f, run, ref, ll, prompt, tok, lref = sys.argv[1:]
run, ref, lref = json.load(open(run)), json.load(open(ref)), json.load(open(lref))
text = open(ll, "rb").read().decode("utf-8", "replace")
text = text[text.find(prompt) + len(prompt):].rstrip("\n")
diff = [s for s in ref["steps"] if s["inferlab"] != s["reference"]]
tie = "; ".join(f"{s['gap']:.2g} ({s['gap'] / s['gap_sigma']:.1f} σ, float32 twin {s['twin32_gap']:.2g})" for s in diff) or "none"
same = "the same"
if text != run["text"]:
    # The first of our tokens whose text llama.cpp's does not continue with, and the reference's
    # top-two margin there (teacher-forced on our tokens, which are llama.cpp's up to that step).
    t = Tokenizer.from_file(tok) if os.path.exists(tok) else None
    g = run["generated"]
    k = next((i for i in range(len(g)) if t and not text.startswith(t.decode(g[:i + 1]))), None)
    s = ref["steps"][k] if k is not None else None
    same = f"parts at step {k}: the reference's top two {s['margin']:.2g} apart (of {s['logit_range']:.2g})" if s else "differs"
ldiff = ", ".join(f"{s['gap']:.2g}" for s in lref["steps"] if s["inferlab"] != s["reference"])
ltok = f"{lref['agree']} of {lref['tokens']}" + (f"; the others {ldiff} below it" if ldiff else "")
print(f"| {os.path.basename(f)} | {ref['tokens']} | {ref['agree']} of {ref['tokens']} | {tie} | {same} | {ltok} |")
PY
)
  table+=$'\n'"$row"
  echo "$row" >&2
done
printf '%s\n' "prompt \"$PROMPT\", greedy, $TOKENS new tokens at most; $NAME" "" "$table" > "$OUT/gguf_check.md"
cat "$OUT/gguf_check.md"
