#!/usr/bin/env bash
# llama.cpp against chapter 09's GGUF export of mixture-of-experts models: a random Mixtral and a
# random Qwen2-MoE made by transformers (tiny-mha's tokenizer, so that the GGUF carries one),
# exported by `ch09_quantization export --format f32`, generated greedily by llama.cpp's
# llama-simple from the GGUF and by ch01_naive_decode from the folder. Prints both texts; exits 1
# when they differ.
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
exit $status
