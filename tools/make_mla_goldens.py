#!/usr/bin/env python3
"""Tiny random MLA models and their goldens, made by transformers' own classes.

tiny-mla (the zoo's trained model) has one shape: q_lora_rank null, half-split RoPE, no
rope_scaling, DeepseekV3.  Chapter 04's golden tests also need the shapes it lacks, so this
script builds several small DeepseekV3ForCausalLM / DeepseekV2ForCausalLM models with random
weights (fixed seeds) and records what transformers computes for them:

  data/golden/mla-random/manifest.json              what each model covers, versions, checks
  data/golden/mla-random/<name>/config.json         save_pretrained's config
  data/golden/mla-random/<name>/model.safetensors   its float32 weights
  data/golden/mla-random/<name>/golden.safetensors  logits, greedy tokens, latent cache rows

Every layer is dense (first_k_dense_replace = num_hidden_layers).  The references run with
eager attention in float64 throughout (golden.float64_everywhere redirects transformers' own
float32 casts); logits and cache rows are stored as float32 rounded from float64, as the zoo's
goldens are, so tests/golden_util.h's bound applies.

Run from the repository root:  tools/.venv/bin/python tools/make_mla_goldens.py
(then tools/make_moe_gguf.py, which writes model.gguf into two of these folders, remade here)
Deterministic for the versions pinned in tools/requirements.txt (one thread).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (float64_everywhere, the latent-cache hooks, greedy decoding)

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "mla-random"

TOKENS = 16          # the fixed token sequence (random ids, seeded per model)
GREEDY_TOKENS = 8    # greedy continuation
MIN_MARGIN = 0.02    # each greedy step's top-two logit gap must exceed this (else the next seed)

# Shared by every model: small enough that ten models stay far below 1 MB.
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, attention_bias=False,
              first_k_dense_replace=2, n_routed_experts=1, n_shared_experts=1, num_experts_per_tok=1,
              moe_intermediate_size=8, n_group=1, topk_group=1)

# name -> (class, what it covers, config fields over COMMON, seed)
MODELS: dict[str, tuple[str, str, dict, int]] = {
    "v3-qdirect-halfsplit": (
        "DeepseekV3ForCausalLM", "q_lora_rank null, rope_interleave false (half-split pairs), tied head",
        dict(num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
             v_head_dim=8, rope_interleave=False, tie_word_embeddings=True, max_position_embeddings=64),
        101),
    "v3-qlora-interleave": (
        "DeepseekV3ForCausalLM", "q_lora_rank set, rope_interleave true (adjacent pairs), dv != dn, untied head",
        dict(num_attention_heads=3, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=12, qk_rope_head_dim=4,
             v_head_dim=6, rope_interleave=True, tie_word_embeddings=False, max_position_embeddings=64),
        202),
    "v3-yarn-deepseek": (
        "DeepseekV3ForCausalLM", "YaRN with DeepSeek-V3's fields (beta 32/1, mscale = mscale_all_dim = 1: "
        "cos/sin factor 1, softmax mscale^2 > 1), q_lora_rank set, rope_interleave true",
        dict(num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=16,
             v_head_dim=8, rope_interleave=True, tie_word_embeddings=True, rope_theta=10000.0,
             max_position_embeddings=512,
             rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
        303),
    "v3-yarn-mscale": (
        "DeepseekV3ForCausalLM", "YaRN with mscale != mscale_all_dim (cos/sin factor and softmax mscale both "
        "!= 1), truncate false (fractional ramp ends), q_lora_rank null, rope_interleave false",
        dict(num_attention_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=6, qk_rope_head_dim=16,
             v_head_dim=10, rope_interleave=False, tie_word_embeddings=True, rope_theta=100.0,
             max_position_embeddings=256,
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                           "beta_fast": 4.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5,
                           "truncate": False}),
        404),
    "v2-qlora": (
        "DeepseekV2ForCausalLM", "DeepseekV2 (complex-multiplication RoPE on adjacent pairs), q_lora_rank set, "
        "dv != dn, untied head",
        dict(num_attention_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
             v_head_dim=4, tie_word_embeddings=False, max_position_embeddings=64),
        505),
    "v2-yarn": (
        "DeepseekV2ForCausalLM", "DeepseekV2 with YaRN without mscale fields (cos/sin factor 1 + 0.1 ln 8), "
        "q_lora_rank null",
        dict(num_attention_heads=2, q_lora_rank=None, kv_lora_rank=12, qk_nope_head_dim=10, qk_rope_head_dim=8,
             v_head_dim=12, tie_word_embeddings=True, rope_theta=500.0, max_position_embeddings=256,
             rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                           "beta_fast": 8.0, "beta_slow": 1.0}),
        606),
}


def build(cls: str, fields: dict, seed: int):
    """A float32 model whose weights are drawn from `seed` (golden.randomize_weights)."""
    import transformers
    cfg_cls = {"DeepseekV3ForCausalLM": transformers.DeepseekV3Config,
               "DeepseekV2ForCausalLM": transformers.DeepseekV2Config}[cls]
    # MLA has no KV heads of its own; transformers' eager attention repeats k for
    # num_attention_heads / num_key_value_heads groups, so the two must be equal.
    cfg = cfg_cls(**{**COMMON, **fields, "num_key_value_heads": fields["num_attention_heads"]})
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval()
    golden.randomize_weights(model, seed)
    return model


def load64(folder: pathlib.Path):
    """The saved model, read back and run in float64 (call inside golden.float64_everywhere, so
    the RoPE tables are computed in float64 too)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", torch_dtype=torch.float32)
    model = model.eval().to(torch.float64)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float64
    return model


@torch.no_grad()
def reference(model, ids: list[int]) -> dict[str, torch.Tensor]:
    """Logits at every position, the latent cache rows after prefill, and the greedy continuation."""
    cfg = model.config
    store, hooks = golden._capture_mla(model)
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    for h in hooks:
        h.remove()
    t = {"input_ids": torch.tensor(ids, dtype=torch.int64), "logits": out.logits[0].clone(),
         "last_logits_f64": out.logits[0, -1].clone(), "rope.inv_freq_f64": model.model.rotary_emb.inv_freq.clone()}
    for i in range(cfg.num_hidden_layers):
        k, _ = golden._hf_kv(out.past_key_values, i)
        t[f"layer{i}.c_kv"] = store[i][0].clone()
        t[f"layer{i}.k_rope"] = k[0, 0, :, cfg.qk_nope_head_dim:].clone()
    t["greedy_ids"] = torch.tensor(golden._greedy(model, ids, GREEDY_TOKENS), dtype=torch.int64)
    return t


@torch.no_grad()
def greedy_margin(model, ids: list[int], greedy: list[int]) -> float:
    """The smallest gap between the chosen and the runner-up logit over the greedy steps."""
    logits = model(input_ids=torch.tensor([ids + greedy[:-1]]), use_cache=False).logits[0, len(ids) - 1:]
    top = logits.topk(2, dim=-1)
    assert top.indices[:, 0].tolist() == greedy
    return float((top.values[:, 0] - top.values[:, 1]).min())


def make(name: str) -> dict:
    cls, covers, fields, seed0 = MODELS[name]
    folder = OUT / name
    for seed in range(seed0, seed0 + 50):
        shutil.rmtree(folder, ignore_errors=True)
        build(cls, fields, seed).save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        ids = torch.randint(0, COMMON["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        with golden.float64_everywhere():
            model = load64(folder)
            tensors = reference(model, ids)
            margin = greedy_margin(model, ids, tensors["greedy_ids"].tolist())
            attn = model.model.layers[0].self_attn
            numbers = {"rope_attention_scaling": float(model.model.rotary_emb.attention_scaling),
                       "softmax_scale": float(attn.scaling)}
        if margin > MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no seed in {seed0}..{seed0 + 49} gives greedy margins above {MIN_MARGIN}")
    # The same class in plain float32, for the record (how far transformers' own float32 run is).
    from transformers import AutoModelForCausalLM
    m32 = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", torch_dtype=torch.float32)
    with torch.no_grad():
        l32 = m32.eval()(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    specs = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    return {
        "name": name, "class": cls, "covers": covers, "seed": seed, "ids": ids,
        "greedy_ids": tensors["greedy_ids"].tolist(),
        "transformers_numbers": numbers,
        "checks": {"min_greedy_margin_float64": margin,
                   "max_abs_logit": float(tensors["logits"].abs().max()),
                   "max_abs_logit_diff_float32_run": float((l32.double() - tensors["logits"]).abs().max())},
        "tensors": specs,
    }


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    models = [make(name) for name in MODELS]
    manifest = {
        "made_by": "tools/make_mla_goldens.py",
        "versions": golden._versions(),
        "compute_dtype": "float64",
        "storage": {"logits, layerL.c_kv, layerL.k_rope": "float32 (rounded from float64)",
                    "last_logits_f64, rope.inv_freq_f64": "float64", "input_ids, greedy_ids": "int64"},
        "attn_implementation": "eager",
        "threads": 1,
        "greedy": {"new_tokens": GREEDY_TOKENS, "rule": "argmax of the last position's logits, appended, "
                   "repeated (a full forward pass each step); no stop token"},
        "meaning": {
            "input_ids": f"[{TOKENS}] the fixed token sequence (uniform random ids, torch.Generator seeded with the seed)",
            "logits": f"[{TOKENS}, vocab] logits at every position of input_ids",
            "last_logits_f64": "[vocab] logits at the last position, float64",
            "greedy_ids": f"[{GREEDY_TOKENS}] greedy continuation of input_ids (new tokens only)",
            "layerL.c_kv": "[T, kv_lora_rank] latent cache: kv_a_layernorm of the first kv_lora_rank outputs of "
                           "kv_a_proj_with_mqa (a forward hook)",
            "layerL.k_rope": "[T, qk_rope_head_dim] the decoupled RoPE key after RoPE (and YaRN's cos/sin factor), as "
                             "transformers' cache holds it: for DeepseekV3 with rope_interleave true its dims are "
                             "de-interleaved (the even ones, then the odd ones); for DeepseekV2 and half-split, "
                             "in place",
            "rope.inv_freq_f64": "[qk_rope_head_dim / 2] the model's rotary_emb.inv_freq (YaRN's when rope_scaling is set)",
            "transformers_numbers": "rotary_emb.attention_scaling (YaRN's factor on cos and sin) and "
                                    "self_attn.scaling (the softmax scale) of layer 0",
            "seed": "the weights' seed: the first from the listed one whose greedy steps all have a top-two gap "
                    f"above {MIN_MARGIN}",
        },
        "models": models,
    }
    with open(OUT / "manifest.json", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
