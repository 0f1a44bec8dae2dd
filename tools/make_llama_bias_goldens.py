#!/usr/bin/env python3
"""Tiny random Llama models with biases, and their goldens, made by transformers' own classes.

transformers' LlamaForCausalLM reads two bias switches from config.json: attention_bias puts a
bias on all four attention projections (q_proj, k_proj, v_proj and o_proj: Qwen2, by contrast,
biases q, k and v only), and mlp_bias one on gate_proj, up_proj and down_proj. Chapter 01 loads
both; this script builds small Llama models of each with random weights (fixed seeds), runs a
random sequence, and records what transformers computes:

  data/golden/llama-random/manifest.json              what each model covers, versions, checks
  data/golden/llama-random/<name>/config.json         save_pretrained's config
  data/golden/llama-random/<name>/model.safetensors   its float32 weights
  data/golden/llama-random/<name>/golden.safetensors  logits at every position, greedy tokens

Weights as golden.randomize_weights draws them, then every bias uniform in [-0.5, 0.5] (signed,
so that no bias reads like a norm weight). The references run with eager attention in float64
throughout (golden.float64_everywhere); logits are stored as float32 rounded from float64, as the
zoo's goldens are, so tests/golden_util.h's bound applies. The manifest also records how far the
logits move when the biases (and o_proj's alone) are zeroed: a golden they do not change would
check nothing.

Run from the repository root:  tools/.venv/bin/python tools/make_llama_bias_goldens.py
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (float64_everywhere, randomize_weights, greedy_reference, write_random_set, ...)

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "llama-random"

TOKENS = 24
GREEDY_TOKENS = 8
MIN_MARGIN = 0.02    # each greedy step's top-two logit gap must exceed this (else the next seed)

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, num_hidden_layers=2, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64,
              bos_token_id=0, eos_token_id=0)

# name -> (what it covers, config fields over COMMON, seed)
MODELS: dict[str, tuple[str, dict, int]] = {
    "llama-attention-bias": ("Llama with attention_bias: biases on q_proj, k_proj, v_proj and o_proj; GQA, untied head",
                             dict(attention_bias=True, mlp_bias=False, tie_word_embeddings=False), 1),
    "llama-all-bias": ("Llama with attention_bias and mlp_bias: the four attention projections and gate_proj, up_proj, "
                       "down_proj biased; tied head",
                       dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True), 2),
}


def build(fields: dict, seed: int):
    import transformers
    cfg = transformers.LlamaConfig(**{**COMMON, **fields})
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    golden.randomize_weights(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith(".bias"):
                p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    return model


def load(folder: pathlib.Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=dtype).eval()


@torch.no_grad()
def logits_with_zeroed(folder: pathlib.Path, ids: list[int], suffixes: tuple[str, ...]) -> torch.Tensor:
    """float32 logits of the saved model with the biases whose names end in `suffixes` set to zero."""
    model = load(folder)
    for name, p in model.named_parameters():
        if name.endswith(suffixes):
            p.zero_()
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


def make(name: str) -> dict:
    covers, fields, seed0 = MODELS[name]
    folder = OUT / name

    def attempt(seed: int):
        shutil.rmtree(folder, ignore_errors=True)
        build(fields, seed).save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        ids = torch.randint(0, COMMON["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        with golden.float64_everywhere():
            return ids, *golden.greedy_reference(load(folder).to(torch.float64), ids, GREEDY_TOKENS)

    seed, (ids, tensors, margin) = golden.first_seed(name, range(seed0 * 100, seed0 * 100 + 50), attempt, MIN_MARGIN)
    with torch.no_grad():
        l32 = load(folder)(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    no_bias = logits_with_zeroed(folder, ids, (".bias",))
    no_o_bias = logits_with_zeroed(folder, ids, ("o_proj.bias",))
    specs = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    want = tensors["logits"]
    return {
        "name": name, "covers": covers, "seed": seed, "ids": ids, "greedy_ids": tensors["greedy_ids"].tolist(),
        "biases": sorted({n.split(".", 3)[-1] for n, _ in load(folder).named_parameters() if n.endswith(".bias")}),
        "checks": {"min_greedy_margin_float64": margin, "max_abs_logit": float(want.abs().max()),
                   "max_abs_logit_diff_float32_run": float((l32.double() - want).abs().max()),
                   "max_abs_logit_diff_without_biases": float((no_bias.double() - want).abs().max()),
                   "max_abs_logit_diff_without_o_proj_bias": float((no_o_bias.double() - want).abs().max())},
        "tensors": specs,
    }


def main() -> None:
    golden.write_random_set(OUT, MODELS, make, lambda models: golden.random_manifest(
        "tiny random LlamaForCausalLM models with attention_bias and mlp_bias, and their float64 goldens "
        "(tools/make_llama_bias_goldens.py)", TOKENS, GREEDY_TOKENS,
        {"biases": "the parameters transformers gives a bias, per layer",
         "max_abs_logit_diff_without_biases": "the same weights with every bias zeroed (float32): a golden the biases "
                                              "did not change would check nothing",
         "max_abs_logit_diff_without_o_proj_bias": "the same with o_proj's bias alone zeroed"},
        models))


if __name__ == "__main__":
    main()
