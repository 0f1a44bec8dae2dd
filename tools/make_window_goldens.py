#!/usr/bin/env python3
"""Tiny random sliding-window models and their goldens, made by transformers' own classes.

tiny-swa and tiny-hybrid (the zoo's trained models) are Ministral folders with one window (64)
and one layer pattern each.  Chapter 06 also reads Mistral and Qwen2 configs, whose windows
transformers interprets differently (Mistral: every layer, null for none, layer_types ignored;
Qwen2: only with use_sliding_window, then the layers from max_window_layers on), so this script
builds small models of each with random weights (fixed seeds), runs a sequence several windows
long, and records what transformers computes:

  data/golden/window-random/manifest.json              what each model covers, versions, checks
  data/golden/window-random/<name>/config.json         save_pretrained's config
  data/golden/window-random/<name>/model.safetensors   its float32 weights
  data/golden/window-random/<name>/golden.safetensors  logits at every position, greedy tokens

The references run with eager attention in float64 throughout (golden.float64_everywhere);
logits are stored as float32 rounded from float64, as the zoo's goldens are, so
tests/golden_util.h's bound applies.

Run from the repository root:  tools/.venv/bin/python tools/make_window_goldens.py
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (float64_everywhere, randomize_weights, greedy_reference, write_random_set, ...)

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "window-random"

TOKENS = 40          # several windows long: the ring wraps many times
GREEDY_TOKENS = 8
MIN_MARGIN = 0.02    # each greedy step's top-two logit gap must exceed this (else the next seed)

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128, bos_token_id=0,
              eos_token_id=0)

# name -> (class, what it covers, config fields over COMMON, the layers' windows chapter 06 must read, seed)
MODELS: dict[str, tuple[str, str, dict, list[int], int]] = {
    "mistral-w7": ("MistralForCausalLM", "Mistral: one window (7) for every layer, untied head",
                   dict(num_hidden_layers=3, sliding_window=7, tie_word_embeddings=False), [7, 7, 7], 1),
    "mistral-null": ("MistralForCausalLM", "Mistral with sliding_window null (v0.2 and later): every layer global",
                     dict(num_hidden_layers=2, sliding_window=None, tie_word_embeddings=False), [0, 0], 2),
    "ministral-hybrid": ("MinistralForCausalLM", "Ministral layer_types: sliding, full, sliding (window 5), tied head",
                         dict(num_hidden_layers=3, sliding_window=5,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              tie_word_embeddings=True), [5, 0, 5], 3),
    "qwen2-window": ("Qwen2ForCausalLM", "Qwen2 use_sliding_window with max_window_layers 1: layer 0 full, layers 1-2 "
                     "window 6; q/k/v biases",
                     dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=6, max_window_layers=1,
                          tie_word_embeddings=False), [0, 6, 6], 4),
    "qwen2-unused": ("Qwen2ForCausalLM", "Qwen2 with a sliding_window but use_sliding_window false: every layer global",
                     dict(num_hidden_layers=2, use_sliding_window=False, sliding_window=4, max_window_layers=0,
                          tie_word_embeddings=True), [0, 0], 5),
}


def build(cls: str, fields: dict, seed: int):
    import transformers
    cfg = getattr(transformers, cls.replace("ForCausalLM", "Config"))(**{**COMMON, **fields})
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval()
    golden.randomize_weights(model, seed)
    return model


def load64(folder: pathlib.Path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32)
    return model.eval().to(torch.float64)


def make(name: str) -> dict:
    cls, covers, fields, windows, seed0 = MODELS[name]
    folder = OUT / name

    def attempt(seed: int):
        shutil.rmtree(folder, ignore_errors=True)
        build(cls, fields, seed).save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        if cls == "Qwen2ForCausalLM":  # as Qwen2's own configs are: the layer types follow from max_window_layers
            cfg = json.loads((folder / "config.json").read_text())
            cfg.pop("layer_types", None)
            (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        ids = torch.randint(0, COMMON["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        with golden.float64_everywhere():
            return ids, *golden.greedy_reference(load64(folder), ids, GREEDY_TOKENS)

    seed, (ids, tensors, margin) = golden.first_seed(name, range(seed0 * 100, seed0 * 100 + 50), attempt, MIN_MARGIN)
    from transformers import AutoModelForCausalLM
    m32 = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        l32 = m32(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        # The same model with every window out of reach: how much the windows change the logits here.
        from transformers import AutoConfig
        cfg = AutoConfig.from_pretrained(str(folder))
        if cfg.sliding_window is not None:
            cfg.sliding_window = 1 << 20  # longer than any sequence: no window (Ministral's mask needs one set)
        dense = AutoModelForCausalLM.from_pretrained(str(folder), config=cfg, attn_implementation="eager",
                                                     dtype=torch.float32).eval()
        ld = dense(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    specs = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    return {
        "name": name, "class": cls, "covers": covers, "seed": seed, "ids": ids, "windows": windows,
        "greedy_ids": tensors["greedy_ids"].tolist(),
        "checks": {"min_greedy_margin_float64": margin, "max_abs_logit": float(tensors["logits"].abs().max()),
                   "max_abs_logit_diff_float32_run": float((l32.double() - tensors["logits"]).abs().max()),
                   "max_abs_logit_diff_without_windows": float((ld.double() - tensors["logits"]).abs().max())},
        "tensors": specs,
    }


def main() -> None:
    golden.write_random_set(OUT, MODELS, make, lambda models: golden.random_manifest(
        "tiny random Mistral, Ministral and Qwen2 models with sliding windows, and their float64 goldens "
        "(tools/make_window_goldens.py)", TOKENS, GREEDY_TOKENS,
        {"windows": "per layer, the window transformers applies (0: global), as chapter 06 must read it",
         "max_abs_logit_diff_without_windows": "the same weights with a window longer than the "
                                               "sequence: a golden the windows do not change would check nothing"},
        models))


if __name__ == "__main__":
    main()
