#!/usr/bin/env python3
"""Tiny random cross-layer-attention models and their float64 goldens.

tiny-cla (the zoo's trained model) has one shape: 4 layers, s = 2, 8 KV heads, a tied head.
Chapter 05's golden tests also need the shapes it lacks: a sharing factor that does not divide
the number of layers (a last group shorter than s), s = 3, GQA and MQA storage layers, an untied
head.  No transformers class computes cross-layer attention, so the oracle is
tools/ref_transformer.py, written from Brandon et al. (2024) and checked against
transformers.LlamaForCausalLM with sharing switched off (golden.py), run in float64:

  data/golden/cla-random/manifest.json              what each model covers, versions, checks
  data/golden/cla-random/<name>/config.json         the InferLabCLAForCausalLM config
  data/golden/cla-random/<name>/model.safetensors   its float32 weights
  data/golden/cla-random/<name>/golden.safetensors  logits, greedy tokens, the storage layers' K and V

Logits and K/V are stored as float32 rounded from float64, as the zoo's goldens are, so
tests/golden_util.h's bound applies.

Run from the repository root:  tools/.venv/bin/python tools/make_cla_goldens.py
Deterministic for the versions pinned in tools/requirements.txt (one thread).
"""
from __future__ import annotations

import copy
import json
import math
import os
import pathlib
import shutil
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (randomize_weights)
from ref_transformer import RefConfig, RefTransformer  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "cla-random"

TOKENS = 16          # the fixed token sequence (random ids, seeded per model)
GREEDY_TOKENS = 8    # greedy continuation
MIN_MARGIN = 0.02    # each greedy step's top-two logit gap must exceed this (else the next seed)

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, head_dim=8, rms_norm_eps=1e-5,
              rope_theta=10000.0, max_position_embeddings=64, causal=True, bos_token_id=0, eos_token_id=0)

# name -> (what it covers, fields over COMMON, seed)
MODELS: dict[str, tuple[str, dict, int]] = {
    "L4-s2-mha": ("s = 2 dividing L = 4, MHA storage layers (K = N = 4), tied head",
                  dict(num_hidden_layers=4, kv_share_factor=2, num_attention_heads=4, num_key_value_heads=4,
                       tie_word_embeddings=True), 11),
    "L4-s3-gqa": ("s = 3 not dividing L = 4 (groups 0-2 and 3), GQA (N = 4, K = 2), tied head",
                  dict(num_hidden_layers=4, kv_share_factor=3, num_attention_heads=4, num_key_value_heads=2,
                       tie_word_embeddings=True), 22),
    "L5-s2-mqa": ("s = 2 not dividing L = 5 (a last group of one), MQA (N = 4, K = 1), untied head",
                  dict(num_hidden_layers=5, kv_share_factor=2, num_attention_heads=4, num_key_value_heads=1,
                       tie_word_embeddings=False), 33),
    "L7-s3-gqa": ("s = 3, L = 7 (groups 0-2, 3-5, 6), GQA (N = 6, K = 3), untied head",
                  dict(num_hidden_layers=7, kv_share_factor=3, num_attention_heads=6, num_key_value_heads=3,
                       tie_word_embeddings=False), 44),
}


def config_json(cfg: RefConfig) -> dict:
    """The config.json of an InferLabCLAForCausalLM, as the zoo writes tiny-cla's."""
    d = cfg.to_dict()
    s, n = cfg.kv_share_factor, cfg.num_hidden_layers
    return {"architectures": ["InferLabCLAForCausalLM"], "model_type": "inferlab_cla", **d,
            "torch_dtype": "float32", "kv_producer_layers": [i for i in range(n) if i % s == 0]}


def build(fields: dict, seed: int) -> RefTransformer:
    """A float32 model whose weights are drawn from `seed` (golden.randomize_weights)."""
    torch.manual_seed(seed)
    model = RefTransformer(RefConfig(**{**COMMON, **fields})).eval()
    golden.randomize_weights(model, seed)
    return model


@torch.no_grad()
def greedy(model: RefTransformer, ids: list[int], n: int) -> tuple[list[int], float]:
    """The greedy continuation (every step recomputed from scratch) and its smallest top-two gap."""
    seq, margin = list(ids), math.inf
    for _ in range(n):
        top = model(torch.tensor([seq]))[0, -1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    return seq[len(ids):], margin


@torch.no_grad()
def reference(model: RefTransformer, ids: list[int]) -> tuple[dict[str, torch.Tensor], float]:
    cfg = model.cfg
    logits, kvs = model(torch.tensor([ids]), return_kv=True)
    t = {"input_ids": torch.tensor(ids, dtype=torch.int64), "logits": logits[0].clone(),
         "last_logits_f64": logits[0, -1].clone()}
    for i in range(0, cfg.num_hidden_layers, cfg.kv_share_factor):
        k, v = kvs[i]
        t[f"layer{i}.k"] = k[0].clone()  # [K, T, H], after RoPE
        t[f"layer{i}.v"] = v[0].clone()
    g, margin = greedy(model, ids, GREEDY_TOKENS)
    t["greedy_ids"] = torch.tensor(g, dtype=torch.int64)
    return t, margin


def make(name: str) -> dict:
    covers, fields, seed0 = MODELS[name]
    folder = OUT / name
    for seed in range(seed0, seed0 + 50):
        model = build(fields, seed)
        ids = torch.randint(0, COMMON["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        m64 = copy.deepcopy(model).double()  # the same float32 weights, run in float64
        tensors, margin = reference(m64, ids)
        if margin > MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed in {seed0}..{seed0 + 49} gives greedy margins above {MIN_MARGIN}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config_json(model.cfg), indent=2) + "\n")
    save_file(model.state_dict_for_save(), str(folder / "model.safetensors"), metadata={"format": "pt"})
    with torch.no_grad():
        l32 = model(torch.tensor([ids]))[0]
    specs = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    return {
        "name": name, "covers": covers, "seed": seed, "ids": ids, "greedy_ids": tensors["greedy_ids"].tolist(),
        "kv_producer_layers": config_json(model.cfg)["kv_producer_layers"],
        "checks": {"min_greedy_margin_float64": margin, "max_abs_logit": float(tensors["logits"].abs().max()),
                   "max_abs_logit_diff_float32_run": float((l32.double() - tensors["logits"]).abs().max())},
        "tensors": specs,
    }


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    models = [make(name) for name in MODELS]
    manifest = {
        "what": "tiny random InferLabCLAForCausalLM models and their float64 goldens (tools/make_cla_goldens.py)",
        "reference": "tools/ref_transformer.py RefTransformer, float64, eager attention",
        "compute_dtype": "float64",
        "versions": {"torch": torch.__version__},
        "tokens": TOKENS, "greedy_tokens": GREEDY_TOKENS,
        "storage": {"logits, layerL.k, layerL.v": "float32 (rounded from float64)", "last_logits_f64": "float64",
                    "input_ids, greedy_ids": "int64"},
        "meaning": {"logits": "[T, vocab] at every position", "layerL.k / .v":
                    "[n_kv_heads, T, head_dim] after prefill, for the layers that store (L % kv_share_factor == 0); "
                    "k after RoPE",
                    "greedy_ids": "argmax continuation, each step recomputed from scratch, no stop token"},
        "models": models,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {len(models)} models to {OUT}")


if __name__ == "__main__":
    main()
