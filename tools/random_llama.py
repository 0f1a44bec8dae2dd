#!/usr/bin/env python3
"""A random Llama as a Hugging Face folder, big enough that its decode step is memory-bound on a
CPU, with tiny-mha's tokenizer (its 988 tokens; the embedding has more rows). Speed comparisons
need only its shape; its text is noise. Two shapes:

  100m  chapter 01's memory_bound_shape: D 1024, 8 layers, F 2816, 16 heads of 64, 1024 rows of
        vocabulary, about 100M parameters (411 MB in f32)
  135m  the small real models' shape (SmolLM-135M): D 576, 30 layers, F 1536, 9 query and 3 KV
        heads of 64, 49152 rows of vocabulary tied to the output, about 135M parameters. A 576-wide
        row is not a whole number of 256-value super-blocks, so llama-quantize falls back to other
        types for most of a K-quant file, as it does for the real model.

    tools/.venv/bin/python tools/random_llama.py OUT_DIR [--seed 0] [--shape 100m|135m]
"""
import argparse
import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    "100m": dict(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                 num_key_value_heads=16, head_dim=64, tie_word_embeddings=False),
    "135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, head_dim=64, tie_word_embeddings=True),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="100m")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(**SHAPES[a.shape], max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                      bos_token_id=0, eos_token_id=0, torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    shutil.copy(os.path.join(ROOT, "data", "models", "tiny-mha", "tokenizer.json"), os.path.join(a.out, "tokenizer.json"))
    print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
