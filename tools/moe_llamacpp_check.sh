#!/usr/bin/env bash
# llama.cpp against chapter 09's GGUF export of mixture-of-experts models: a random Mixtral and a
# random Qwen2-MoE made by transformers (tiny-mha's tokenizer, so that the GGUF carries one),
# exported by `ch09_quantization export --format f32`, generated greedily by llama.cpp's
# llama-simple from the GGUF and by ch01_naive_decode from the folder. Prints both texts; exits 1
# when they differ.
#
# Then DeepSeek (deepseek2): the four random DeepSeek-V2/V3 MoE models of data/golden/moe-random
# in the GGUF layout tools/make_moe_gguf.py writes (chapter 04 reads those files), run by
# llama.cpp on the goldens' token ids (tools/llamacpp_logits.cpp against libllama: they have no
# tokenizer to give a text prompt with), against transformers' float64 logits and greedy tokens.
# Prints per model the largest logit difference and whether the greedy tokens agree; reports, and
# does not fail on, the models where llama.cpp computes another routing than the model's. Last,
# the zoo's trained tiny-mla as deepseek2 with its tokenizer: the greedy text of llama.cpp and of
# ch04_mla from the file, and of ch04_mla from the folder, which must agree.
#
#   tools/moe_llamacpp_check.sh [BUILD_BIN]      (BUILD_BIN: build/release/bin)
# LLAMA_SIMPLE=path/to/llama-simple uses that build instead of tools/llamacpp_common.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/release/bin}
python=${PYTHON:-tools/.venv/bin/python}
if [ -z "${LLAMA_SIMPLE:-}" ]; then
  source tools/llamacpp_common.sh
  llamacpp_build
  LLAMA_SIMPLE=$LLAMACPP_BIN/llama-simple
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - "$work" << 'PY'
import json, shutil, sys
import torch, transformers
sys.path.insert(0, "tools")
import golden
out, zoo = sys.argv[1], "data/models/tiny-mha"
V = json.load(open(f"{zoo}/config.json"))["vocab_size"]
common = dict(vocab_size=V, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, num_experts_per_tok=2, max_position_embeddings=128)
for name, cls, cfg in [("mixtral", transformers.MixtralForCausalLM, transformers.MixtralConfig(**common, num_local_experts=4)),
                       ("qwen2moe", transformers.Qwen2MoeForCausalLM, transformers.Qwen2MoeConfig(
                           **common, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64))]:
    torch.manual_seed(1)
    model = cls(cfg).eval()
    golden.randomize_weights(model, 1)
    model.save_pretrained(f"{out}/{name}", safe_serialization=True)
    shutil.copy(f"{zoo}/tokenizer.json", f"{out}/{name}")
PY
status=0
for n in mixtral qwen2moe; do
  "$bin/ch09_quantization" export --model "$work/$n" --format f32 "$work/$n.gguf" > /dev/null 2>&1
  # The text line of each, control characters and bytes above 127 left out: a random model emits
  # pieces of characters, which we print as U+FFFD and llama-simple as the raw bytes.
  ours=$("$bin/ch01_naive_decode" --model "$work/$n" --prompt "Once upon a time" --max-new-tokens 12 2> /dev/null |
    sed -n 4p | LC_ALL=C tr -d '\000-\010\013-\037\200-\377')
  theirs=$("$LLAMA_SIMPLE" -m "$work/$n.gguf" -n 12 "Once upon a time" 2> /dev/null | head -1 |
    sed 's/^<|endoftext|>//' | LC_ALL=C tr -d '\000-\010\013-\037\200-\377')
  printf '%-9s ch01 (folder):     %s\n%-9s llama.cpp (GGUF): %s\n' "$n" "$ours" "" "$theirs"
  [ "$ours" = "$theirs" ] || { echo "$n: the texts differ" >&2; status=1; }
done

[ -n "${LLAMACPP_TREE:-}" ] || LLAMACPP_TREE=$(dirname "$(dirname "$(dirname "$LLAMA_SIMPLE")")")
"${CXX:-c++}" -O2 -std=c++17 tools/llamacpp_logits.cpp -I "$LLAMACPP_TREE/include" -I "$LLAMACPP_TREE/ggml/include" \
  -L "$(dirname "$LLAMA_SIMPLE")" -lllama -Wl,-rpath,"$(dirname "$LLAMA_SIMPLE")" -o "$work/llamacpp_logits"
"$python" - "$work" << 'PY' || status=1
import json, pathlib, subprocess, sys
import numpy as np
from safetensors.numpy import load_file
sys.path.insert(0, "tools")
from make_moe_gguf import ROOT, write_deepseek
work = pathlib.Path(sys.argv[1])
# llama.cpp's build_moe_ffn ranks expert groups by the sum of their two best scores for every
# deepseek2 file (DeepSeek-V3's noaux_tc); DeepSeek-V2's group_limited_greedy ranks them by the
# best one, so its routing, and then its logits, differ where the two rules pick other groups.
known = {"deepseek-v2-group": "llama.cpp ranks V2's expert groups by their top-2 sum, the model by its best score"}
failed = False
for name in ("deepseek-v2-greedy", "deepseek-v2-group", "deepseek-v3-noaux", "deepseek-v3-shared"):
    gguf_path = work / f"{name}.gguf"
    write_deepseek(ROOT / name, out=gguf_path, for_llamacpp=True)
    cfg = json.loads((ROOT / name / "config.json").read_text())
    gold = load_file(str(ROOT / name / "golden.safetensors"))
    ids, greedy = gold["input_ids"].tolist(), gold["greedy_ids"].tolist()
    run = subprocess.run([str(work / "llamacpp_logits"), str(gguf_path), ",".join(map(str, ids)), str(len(greedy))],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(f"{name:20s} llama.cpp did not run it: {run.stderr.strip()}")
        failed = True
        continue
    out = json.loads(run.stdout)
    diff = float(np.abs(np.array(out["logits"]) - gold["logits"]).max())
    # tests/golden_util.h's golden_bound: float32 against the float64 reference.
    P, K, u = 6 * cfg["num_hidden_layers"] + 2, max(cfg["hidden_size"], cfg["intermediate_size"],
                                                     cfg["max_position_embeddings"]), 2.0 ** -24
    scale = float(np.abs(gold["logits"]).max())
    bound = P * (K * u / (1 - K * u)) * 4 * scale + u * scale
    same = out["greedy"] == greedy
    print(f"{name:20s} max |logit - transformers'| {diff:.3g} (float32 bound {bound:.3g}); greedy tokens "
          f"{'the same' if same else 'differ: ' + str(out['greedy']) + ' against ' + str(greedy)}"
          + (f"\n{'':20s} ({known[name]})" if name in known and diff > bound else ""))
    failed |= name not in known and (diff > bound or not same)
sys.exit(1 if failed else 0)
PY

# A trained DeepSeek-V3 with text: the zoo's tiny-mla (MLA, rope_interleave false) as deepseek2
# with the zoo's tokenizer (copied from the Mixtral export above, which carries tiny-mha's), the
# greedy text of llama.cpp's llama-simple and of ch04_mla from the file, and ch04_mla's from the
# folder.
"$python" - "$work" << 'PY'
import pathlib, sys
sys.path.insert(0, "tools")
from make_moe_gguf import write_deepseek
work, model = pathlib.Path(sys.argv[1]), pathlib.Path("data/models/tiny-mla")
write_deepseek(model, out=work / "tiny-mla.gguf", tokenizer_from=work / "mixtral.gguf")
write_deepseek(model, out=work / "tiny-mla-llamacpp.gguf", tokenizer_from=work / "mixtral.gguf", for_llamacpp=True)
PY
text() { "$bin/ch04_mla" generate --model "$1" --prompt "Once upon a time" --max-new-tokens 24 2> /dev/null | sed -n 3p; }
folder=$(text data/models/tiny-mla)
ours=$(text "$work/tiny-mla.gguf")
theirs=$("$LLAMA_SIMPLE" -m "$work/tiny-mla-llamacpp.gguf" -n 24 "Once upon a time" 2> /dev/null | head -1 | sed 's/^<|endoftext|>//')
printf 'tiny-mla  ch04 (folder):     %s\n          ch04 (GGUF):       %s\n          llama.cpp (GGUF):  %s\n' \
  "$folder" "$ours" "$theirs"
[ "$folder" = "$ours" ] && [ "$ours" = "$theirs" ] || { echo "tiny-mla: the texts differ" >&2; status=1; }
exit $status
