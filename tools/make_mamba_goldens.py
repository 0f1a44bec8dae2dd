#!/usr/bin/env python3
"""Tiny random Mamba models and their goldens, made by transformers' own MambaForCausalLM.

tiny-mamba (the zoo's trained model) has one shape: N = 16 states, K = 4 taps, dt rank 8.
Chapter 07 reads any MambaConfig, so this script builds small models of other shapes with random
weights (fixed seeds) and records what transformers computes for a sequence of 40 tokens:

  data/golden/mamba-random/manifest.json              what each model covers, versions, checks
  data/golden/mamba-random/<name>/config.json         save_pretrained's config
  data/golden/mamba-random/<name>/model.safetensors   its float32 weights
  data/golden/mamba-random/<name>/golden.safetensors  logits at every position, the conv and
                                                      SSM states after the sequence, greedy tokens

The shapes cover state sizes 4, 8, 24 and 64 (the GPU kernels step their lanes past 16), conv
widths 2 to 5, dt ranks given and "auto", expand 1.5 with no intermediate_size (transformers then
takes int(expand * hidden_size); a config's intermediate_size, when present, wins), biases on
in_proj/out_proj, no conv bias, an untied head.

The references run in float64 throughout (golden.float64_everywhere; transformers' sequential
"slow" path, as there are no CUDA kernels here); logits and states are stored as float32 rounded
from float64, as the zoo's goldens are, so tests/golden_util.h's bound applies.

Run from the repository root:  tools/.venv/bin/python tools/make_mamba_goldens.py
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (float64_everywhere, randomize_weights, save_rounded, versions)

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "mamba-random"

TOKENS = 40
GREEDY_TOKENS = 8
MIN_MARGIN = 0.02    # each greedy step's top-two logit gap must exceed this (else the next seed)

COMMON = dict(vocab_size=64, layer_norm_epsilon=1e-5, bos_token_id=0, eos_token_id=0, pad_token_id=0)

# name -> (what it covers, MambaConfig fields over COMMON, seed)
MODELS: dict[str, tuple[str, dict, int]] = {
    "n4-k2-r3": ("N = 4, K = 2, dt rank 3, tied head",
                 dict(hidden_size=16, state_size=4, conv_kernel=2, time_step_rank=3, num_hidden_layers=2), 1),
    "n24-k5-auto-bias": ("N = 24, K = 5, time_step_rank auto (ceil(40 / 16) = 3), in/out_proj biases, no conv "
                         "bias, untied head",
                         dict(hidden_size=40, state_size=24, conv_kernel=5, time_step_rank="auto",
                              num_hidden_layers=2, use_bias=True, use_conv_bias=False, tie_word_embeddings=False), 2),
    "expand1.5-n8": ("expand 1.5 and no intermediate_size (E = int(1.5 * 20) = 30), N = 8, K = 4, dt rank 2, "
                     "3 layers",
                     dict(hidden_size=20, expand=1.5, state_size=8, conv_kernel=4,
                          time_step_rank=2, num_hidden_layers=3), 3),
    "n64-k3-r1": ("N = 64 (the GPU kernels' largest), K = 3, dt rank 1, one layer",
                  dict(hidden_size=16, state_size=64, conv_kernel=3, time_step_rank=1, num_hidden_layers=1), 4),
}


def build(fields: dict, seed: int):
    from transformers import MambaConfig, MambaForCausalLM
    cfg = MambaConfig(**{**COMMON, **fields})
    torch.manual_seed(seed)
    model = MambaForCausalLM(cfg).eval()
    golden.randomize_weights(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # Mamba's own ranges where a random draw would not be a Mamba
        for layer in model.backbone.layers:
            mx = layer.mixer
            n = mx.A_log.shape[1]
            mx.A_log.copy_(torch.log(1 + (n - 1) * torch.rand(mx.A_log.shape, generator=gen)))  # A in -[1, N]
            step = torch.exp(math.log(0.01) + (math.log(1.0) - math.log(0.01)) * torch.rand(mx.dt_proj.bias.shape,
                                                                                              generator=gen))
            mx.dt_proj.bias.copy_(step + torch.log(-torch.expm1(-step)))  # softplus(bias) in [0.01, 1]
            mx.D.copy_(2 * torch.rand(mx.D.shape, generator=gen) - 1)
    return model


def load64(folder: pathlib.Path):
    from transformers import MambaForCausalLM
    return MambaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval().to(torch.float64)


@torch.no_grad()
def reference(model, ids: list[int]) -> tuple[dict[str, torch.Tensor], float]:
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    tensors = {"input_ids": torch.tensor(ids, dtype=torch.int64), "logits": out.logits[0].clone(),
               "last_logits_f64": out.logits[0, -1].clone()}
    for i in range(model.config.num_hidden_layers):
        tensors[f"layer{i}.conv_state"] = out.cache_params.conv_states[i][0].clone()  # [E, K], newest last
        tensors[f"layer{i}.ssm_state"] = out.cache_params.ssm_states[i][0].clone()    # [E, N]
    seq, margin = list(ids), float("inf")
    for _ in range(GREEDY_TOKENS):  # recomputed from scratch each step: no cache of transformers' involved
        top = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    tensors["greedy_ids"] = torch.tensor(seq[len(ids):], dtype=torch.int64)
    return tensors, margin


def make(name: str) -> dict:
    covers, fields, seed0 = MODELS[name]
    folder = OUT / name

    def attempt(seed: int):
        shutil.rmtree(folder, ignore_errors=True)
        build(fields, seed).save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        ids = torch.randint(0, COMMON["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        with golden.float64_everywhere():
            return ids, *reference(load64(folder), ids)

    seed, (ids, tensors, margin) = golden.first_seed(name, range(seed0 * 100, seed0 * 100 + 50), attempt, MIN_MARGIN)
    from transformers import MambaForCausalLM
    m32 = MambaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        l32 = m32(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    table = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    cfg = json.loads((folder / "config.json").read_text())
    return {"covers": covers, "seed": seed, "tokens": TOKENS, "greedy_margin": margin,
            "config": {k: cfg[k] for k in ("hidden_size", "intermediate_size", "state_size", "conv_kernel",
                                            "time_step_rank", "num_hidden_layers", "use_bias", "use_conv_bias",
                                            "tie_word_embeddings", "expand") if k in cfg},
            "float32_vs_float64_max_abs": float((l32.double() - tensors["logits"]).abs().max()),
            "tensors": table}


def main() -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    models = {name: make(name) for name in MODELS}
    manifest = {"reference": "transformers.MambaForCausalLM (sequential path)", "versions": golden._versions(),
                "compute_dtype": "float64", "storage": "float32 rounded from float64; ids int64",
                "checks": {"float32_vs_float64_max_abs": "transformers' own float32 logits against its float64 ones"},
                "models": models}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for name, m in models.items():
        print(f"{name}: seed {m['seed']}, margin {m['greedy_margin']:.3f}, f32 vs f64 {m['float32_vs_float64_max_abs']:.2e}")


if __name__ == "__main__":
    main()
