#!/usr/bin/env python3
"""A trained Llama folder widened to whole 256-value super-blocks without changing what it computes,
so that llama.cpp's llama-quantize writes the 256-value types (IQ4_XS, the k-quants) for every
projection of a model whose next token is clear (a random model's logits are nearly flat, and
near-ties fall either way between two programs that round differently).

Each width goes up to the next multiple of 256 with zeros: the hidden size (embedding columns,
projection inputs and outputs, norm weights), the MLP width (gate and up rows, down columns), and
the heads (extra heads whose q, k and v rows and o columns are zero; head_dim is kept, so the
attention scale is too). The residual stream's extra entries stay 0, and each extra MLP unit gives
silu(0)·0 = 0. RMSNorm averages over the wider width, so its weights are scaled by sqrt(D / D') and
its epsilon by D / D': rms' = rms · sqrt(D / D'), and x / rms' · w' = x / rms · w. An extra head
scores every position 0 and averages zero values. The logits are the model's own, up to float32
rounding.

    tools/.venv/bin/python tools/widen_llama.py [IN_DIR] OUT_DIR     (IN_DIR: data/models/tiny-mha)
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def up(n: int) -> int:
    return (n + 255) // 256 * 256


def pad(t: torch.Tensor, shape) -> torch.Tensor:
    out = torch.zeros(shape, dtype=t.dtype)
    out[tuple(slice(0, s) for s in t.shape)] = t
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+", help="[IN_DIR] OUT_DIR")
    a = ap.parse_args()
    if len(a.dirs) > 2:
        ap.error("give at most IN_DIR and OUT_DIR")
    src = a.dirs[0] if len(a.dirs) == 2 else os.path.join(ROOT, "data", "models", "tiny-mha")
    out = a.dirs[-1]
    cfg = json.load(open(os.path.join(src, "config.json")))
    if cfg.get("model_type") != "llama" or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        sys.exit(f"widen_llama: {src} is not a Llama without biases")
    D, F, H, KV = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or D // H
    if H != KV:
        sys.exit(f"widen_llama: {src} groups its KV heads ({H} heads, {KV} KV heads); only MHA is widened")
    D2, F2 = up(D), up(F)
    H2 = up(H * hd) // hd
    if H2 * hd != up(H * hd):
        sys.exit(f"widen_llama: head_dim {hd} does not divide {up(H * hd)}")
    w = load_file(os.path.join(src, "model.safetensors"))
    norm = math.sqrt(D / D2)
    o = {}
    for k, t in w.items():
        if k.endswith("norm.weight"):
            o[k] = pad(t * norm, (D2,))
        elif k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
            o[k] = pad(t, (H2 * hd, D2))
        elif k.endswith("o_proj.weight"):
            o[k] = pad(t, (D2, H2 * hd))
        elif k.endswith(("gate_proj.weight", "up_proj.weight")):
            o[k] = pad(t, (F2, D2))
        elif k.endswith("down_proj.weight"):
            o[k] = pad(t, (D2, F2))
        elif k in ("model.embed_tokens.weight", "lm_head.weight"):
            o[k] = pad(t, (t.shape[0], D2))
        else:
            sys.exit(f"widen_llama: {src}: tensor {k} is not part of a Llama")
    cfg.update(hidden_size=D2, intermediate_size=F2, num_attention_heads=H2, num_key_value_heads=H2, head_dim=hd,
               rms_norm_eps=cfg["rms_norm_eps"] * D / D2)
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in o.items()}, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(out, f))
    print(f"wrote {out}: hidden {D} -> {D2}, MLP {F} -> {F2}, heads {H} -> {H2} of {hd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
