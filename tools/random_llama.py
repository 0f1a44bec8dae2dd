#!/usr/bin/env python3
"""A random Llama as a Hugging Face folder, big enough that its decode step is memory-bound on a
CPU (the shape chapter 01's memory_bound_shape gives: D 1024, 8 layers, F 2816, 16 heads of 64,
about 100M parameters, 411 MB in f32), with tiny-mha's tokenizer (1024 rows for its 988 tokens).
Speed comparisons need only its shape; its text is noise.

    tools/.venv/bin/python tools/random_llama.py OUT_DIR [--seed 0]
"""
import argparse
import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, head_dim=64, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                      torch_dtype="float32")
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(a.out, safe_serialization=True)
    shutil.copy(os.path.join(ROOT, "data", "models", "tiny-mha", "tokenizer.json"), os.path.join(a.out, "tokenizer.json"))
    print(f"wrote {a.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
