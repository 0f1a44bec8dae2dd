#!/usr/bin/env python3
"""Tiny random Qwen3, Gemma 2 and Gemma 3 (text) models and their goldens, made by transformers' own classes.

(Also a Llama with Llama 3.2's kind of file, tied head and llama3 RoPE scaling, for its GGUF.)

Qwen3 is a Llama-family decoder with one more piece (an RMSNorm over head_dim of every query and
key head, before RoPE): chapters 01 and 02 run it. Gemma 2 and Gemma 3 interleave sliding-window
and global layers, so chapter 06 runs them, with what else their layers do: norms after attention
and MLP as well as before, RMSNorm as (1 + w), GeGLU with the tanh GELU, embeddings times √D, an
attention scale of query_pre_attn_scalar^-0.5, soft-capping of attention scores and logits
(Gemma 2), per-head q/k norms and a RoPE base of its own for the local layers (Gemma 3). This
script builds small models of each with random weights (fixed seeds), runs a random sequence
several windows long, and records what transformers computes:

  data/golden/family-random/manifest.json              what each model covers, versions, checks
  data/golden/family-random/<name>/config.json         save_pretrained's config
  data/golden/family-random/<name>/model.safetensors   its float32 weights
  data/golden/family-random/<name>/golden.safetensors  logits at every position, greedy tokens
  data/golden/family-random/<name>/model.gguf          the same weights as llama.cpp's converter
                                                       writes them (the models in GGUF below)

Weights as golden.randomize_weights draws them; Gemma's norm weights then have 1 subtracted (its
RMSNorm multiplies by 1 + w, so they scale by 0.75 .. 1.25 as the other families' do). The soft
caps and query_pre_attn_scalar are set small enough to change the logits, and the manifest
records by how much (a golden they do not change would check nothing). The references run with
eager attention in float64 throughout (golden.float64_everywhere); logits are stored as float32
rounded from float64, so tests/golden_util.h's bound applies.

Run from the repository root:  tools/.venv/bin/python tools/make_family_goldens.py
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

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "family-random"

TOKENS = 40          # several windows long: the local layers' rings wrap many times
GREEDY_TOKENS = 8
MIN_MARGIN = 0.02    # each greedy step's top-two logit gap must exceed this (else the next seed)

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
              head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=128, bos_token_id=0,
              eos_token_id=0)

# name -> (class, chapter, what it covers, config fields over COMMON, per-layer windows (0: global), seed)
MODELS: dict[str, tuple[str, str, str, dict, list[int], int]] = {
    "qwen3-gqa": ("Qwen3ForCausalLM", "01", "Qwen3: q_norm and k_norm per head before RoPE, GQA, untied head",
                  dict(num_hidden_layers=2, tie_word_embeddings=False), [0, 0], 1),
    "qwen3-tied": ("Qwen3ForCausalLM", "01", "Qwen3 with a tied head (as its small checkpoints are) and MHA",
                   dict(num_hidden_layers=2, num_key_value_heads=4, tie_word_embeddings=True), [0, 0], 2),
    "llama32-tied": ("LlamaForCausalLM", "01",
                     "Llama 3.2's shape of file: a tied head (no lm_head tensor) and llama3 rope_scaling (factor 4, "
                     "original context 16, so that every band of the scaling is used), GQA; also written as model.gguf "
                     "with llama.cpp's rope_freqs.weight",
                     dict(num_hidden_layers=2, tie_word_embeddings=True,
                          rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), [0, 0], 7),
    "gemma2-alternating": ("Gemma2ForCausalLM", "06",
                           "Gemma 2: local (window 5) and global layers alternating, attention and final "
                           "soft-capping (3 and 4), query_pre_attn_scalar 20, post-block norms, GeGLU, √D embedding, "
                           "tied head",
                           dict(num_hidden_layers=4, sliding_window=5, attn_logit_softcapping=3.0,
                                final_logit_softcapping=4.0, query_pre_attn_scalar=20), [5, 0, 5, 0], 3),
    "gemma3-pattern": ("Gemma3ForCausalLM", "06",
                       "Gemma 3: two local layers (window 6) to one global, from sliding_window_pattern 3 alone "
                       "(layer_types removed); local RoPE base 100, global base 10000 with linear rope_scaling 2; "
                       "q/k norms, query_pre_attn_scalar 12, untied head",
                       dict(num_hidden_layers=6, sliding_window=6, sliding_window_pattern=3, rope_local_base_freq=100.0,
                            rope_scaling={"rope_type": "linear", "factor": 2.0}, query_pre_attn_scalar=12,
                            tie_word_embeddings=False), [6, 6, 0, 6, 6, 0], 4),
    # What a GGUF can say: llama.cpp's gemma2 and gemma3 carry no query_pre_attn_scalar (it takes
    # 1/sqrt(head_dim), or 1/sqrt(D / heads) for the 27B models), so these use Gemma's usual value.
    "gemma2-gguf": ("Gemma2ForCausalLM", "06",
                    "Gemma 2 as llama.cpp's gemma2 runs it: query_pre_attn_scalar = head_dim, soft caps 3 and 4, "
                    "window 5 alternating; also written as model.gguf",
                    dict(num_hidden_layers=4, sliding_window=5, attn_logit_softcapping=3.0,
                         final_logit_softcapping=4.0, query_pre_attn_scalar=8), [5, 0, 5, 0], 5),
    "gemma3-gguf": ("Gemma3ForCausalLM", "06",
                    "Gemma 3 as llama.cpp's gemma3 runs it: query_pre_attn_scalar = head_dim, pattern 3, window 6, "
                    "local RoPE base 100, linear rope_scaling 2 on the global layers, untied; also written as "
                    "model.gguf",
                    dict(num_hidden_layers=6, sliding_window=6, sliding_window_pattern=3, rope_local_base_freq=100.0,
                         rope_scaling={"rope_type": "linear", "factor": 2.0}, query_pre_attn_scalar=8,
                         tie_word_embeddings=False), [6, 6, 0, 6, 6, 0], 6),
}

# The models also written as GGUF (write_gguf), and llama.cpp's architecture for each class.
GGUF = {"qwen3-gqa", "qwen3-tied", "llama32-tied", "gemma2-gguf", "gemma3-gguf"}
GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3"}


def llama3_rope_factors(cfg: dict) -> torch.Tensor:
    """llama.cpp's rope_freqs.weight for a llama3 rope_scaling (conversion/llama.py): per pair, the
    factor its frequency is divided by."""
    import math
    r, dim = cfg["rope_scaling"], cfg["head_dim"]
    freqs = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    lo, hi, old = r["low_freq_factor"], r["high_freq_factor"], r["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1)
        elif wavelen > old / lo:
            out.append(r["factor"])
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / r["factor"] + smooth))
    return torch.tensor(out, dtype=torch.float32)


def write_gguf(folder: pathlib.Path, cls: str) -> None:
    """The saved model as llama.cpp's converter (convert_hf_to_gguf.py: conversion/qwen.py and
    gemma.py) writes it, with the gguf package: its metadata keys, tensor names, Gemma's norm
    weights with 1 added, Gemma 2's lm_head left out (tied), float32 tensors. No tokenizer: the
    tests compare logits of token ids."""
    import gguf
    from safetensors.torch import load_file
    cfg = json.loads((folder / "config.json").read_text())
    arch = GGUF_ARCH[cls]
    L = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(str(folder / "model.gguf"), arch)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch != "gemma2":  # the converter's gemma2 leaves the base (10000) to llama.cpp
        w.add_rope_freq_base(cfg["rope_theta"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    if arch.startswith("gemma"):
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma3":
        w.add_sliding_window_pattern(cfg["sliding_window_pattern"])
        w.add_rope_freq_base_swa(cfg["rope_local_base_freq"])
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if arch == "llama":
        w.add_rope_dimension_count(cfg["head_dim"])
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg).numpy())
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), L)
    for name, t in sorted(load_file(str(folder / "model.safetensors")).items()):
        if arch == "gemma2" and name == "lm_head.weight":
            continue
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):  # llama.cpp's adjacent-pair order
            heads = cfg["num_attention_heads"] if name.endswith("q_proj.weight") else cfg["num_key_value_heads"]
            t = t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1
        out = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert out is not None, f"{name}: no GGUF name for {arch}"
        w.add_tensor(out, t.to(torch.float32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def config_class(cls: str):
    import transformers
    return transformers.Gemma3TextConfig if cls == "Gemma3ForCausalLM" else getattr(
        transformers, cls.replace("ForCausalLM", "Config"))


def build(cls: str, fields: dict, seed: int):
    import transformers
    cfg = config_class(cls)(**{**COMMON, **fields})
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval()
    golden.randomize_weights(model, seed)
    if cls.startswith("Gemma"):  # Gemma's norms multiply by 1 + w
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight"):
                    p.sub_(1.0)
    return model


def load(folder: pathlib.Path, config=None):
    from transformers import AutoModelForCausalLM
    kw = {"config": config} if config is not None else {}
    return AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32,
                                                **kw).eval()


@torch.no_grad()
def logits_with(folder: pathlib.Path, ids: list[int], **changes) -> torch.Tensor:
    """float32 logits of the saved model with config fields changed (a cap removed, the scale reset)."""
    from transformers import AutoConfig
    cfg = AutoConfig.from_pretrained(str(folder))
    for k, v in changes.items():
        setattr(cfg, k, v)
    return load(folder, cfg)(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()


def make(name: str) -> dict:
    cls, chapter, covers, fields, windows, seed0 = MODELS[name]
    folder = OUT / name

    def attempt(seed: int):
        shutil.rmtree(folder, ignore_errors=True)
        build(cls, fields, seed).save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        cfg = json.loads((folder / "config.json").read_text())
        if cls == "Gemma3ForCausalLM":  # as Gemma 3's own configs are: the pattern says which layers are local
            cfg.pop("layer_types", None)
            cfg.pop("_sliding_window_pattern", None)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        ids = torch.randint(0, COMMON["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        with golden.float64_everywhere():
            model = load(folder).to(torch.float64)
            return ids, *golden.greedy_reference(model, ids, GREEDY_TOKENS)

    seed, (ids, tensors, margin) = golden.first_seed(name, range(seed0 * 100, seed0 * 100 + 50), attempt, MIN_MARGIN)
    want = tensors["logits"]
    checks = {"min_greedy_margin_float64": margin, "max_abs_logit": float(want.abs().max()),
              "max_abs_logit_diff_float32_run": float((logits_with(folder, ids) - want).abs().max())}

    def moved(**changes) -> float:
        return float((logits_with(folder, ids, **changes) - want).abs().max())

    if cls == "LlamaForCausalLM":
        checks["max_abs_logit_diff_without_rope_scaling"] = moved(rope_scaling=None)
    if cls.startswith("Gemma"):
        checks["max_abs_logit_diff_without_windows"] = moved(sliding_window=1 << 20)
        if fields["query_pre_attn_scalar"] != COMMON["head_dim"]:
            checks["max_abs_logit_diff_with_scale_head_dim"] = moved(query_pre_attn_scalar=COMMON["head_dim"])
    if cls == "Gemma2ForCausalLM":
        checks["max_abs_logit_diff_without_attn_softcap"] = moved(attn_logit_softcapping=None)
        checks["max_abs_logit_diff_without_final_softcap"] = moved(final_logit_softcapping=None)
    if cls == "Gemma3ForCausalLM":
        checks["max_abs_logit_diff_with_global_rope_base"] = moved(rope_local_base_freq=COMMON["rope_theta"])
    if name in GGUF:
        write_gguf(folder, cls)
    specs = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    return {"name": name, "class": cls, "chapter": chapter, "covers": covers, "seed": seed, "ids": ids,
            "gguf": name in GGUF,
            "windows": windows, "greedy_ids": tensors["greedy_ids"].tolist(), "checks": checks, "tensors": specs}


def main() -> None:
    golden.write_random_set(OUT, MODELS, make, lambda models: golden.random_manifest(
        "tiny random Qwen3, Gemma 2 and Gemma 3 (text) models and their float64 goldens "
        "(tools/make_family_goldens.py)", TOKENS, GREEDY_TOKENS,
        {"chapter": "the chapter that runs the model (01 and 02: Qwen3; 06: Gemma, for its local layers)",
         "windows": "per layer, the window transformers applies (0: global), as chapter 06 must read it",
         "max_abs_logit_diff_*": "the same weights with one feature changed or removed: how much the golden "
                                 "checks it (a golden the feature does not move would check nothing)"},
        models))


if __name__ == "__main__":
    main()
