#!/usr/bin/env python3
"""GGUF files of the random Mixtral and Qwen2-MoE models of data/golden/moe-random, written with
the `gguf` package (llama.cpp's own Python library) in the layout llama.cpp's converter gives
them (its tree: conversion/llama.py LlamaModel for Mixtral, conversion/qwen.py Qwen2MoeModel):

  - Mixtral as architecture `llama` with `llama.expert_count` / `llama.expert_used_count`; q and k
    rows permuted to llama.cpp's adjacent-pair RoPE order (LlamaModel.permute); each layer's
    experts stacked: ffn_gate_exps (w1), ffn_up_exps (w3), ffn_down_exps (w2), [E, F, D] / [E, D, F]
    outermost first; the router ffn_gate_inp in F32.
  - Qwen2-MoE as `qwen2moe`: q/k/v biases, rows as trained, the shared expert ffn_*_shexp and its
    gate ffn_gate_inp_shexp ([1, D] as the converter writes it, unsqueezed), the experts'
    widths in qwen2moe.expert_feed_forward_length and expert_shared_feed_forward_length; the
    layer listed in mlp_only_layers keeps dense ffn_gate / ffn_up / ffn_down tensors.

  data/golden/moe-random/<name>/model.gguf       every matrix F32
  data/golden/moe-random/<name>/model-q8_0.gguf  (Mixtral) the experts and attention in Q8_0,
                                                 quantised by gguf.quants as the converter's
                                                 --outtype q8_0 does (F16 where a row is not a
                                                 whole number of 32-value blocks: ffn_down_exps)

The random models have no tokenizer, so llama.cpp's converter itself (which needs one) is not
run; the layout above is its. Chapter 09's tests load these and compare with the Hugging Face
path and transformers' goldens.

Run from the repository root:  tools/.venv/bin/python tools/make_moe_gguf.py
"""
from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
from safetensors.numpy import load_file

ROOT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "moe-random"


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: a head's two halves interleaved into adjacent pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(name: str, arch: str, q8: bool = False) -> None:
    folder = ROOT / name
    cfg = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    out = folder / ("model-q8_0.gguf" if q8 else "model.gguf")
    w = gguf.GGUFWriter(str(out), arch)
    L, D, H = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or D // H
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    if arch == "llama" and "head_dim" in cfg:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    experts = cfg.get("num_local_experts") or cfg["num_experts"]
    w.add_expert_count(experts)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch == "qwen2moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def add(gname: str, a: np.ndarray, quantize: bool = False) -> None:
        a = np.ascontiguousarray(a.astype(np.float32))
        if quantize and q8 and a.shape[-1] % 32 == 0:
            w.add_tensor(gname, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif quantize and q8:  # rows not a whole number of blocks: F16, as the converter falls back
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, a)

    add("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"]
        if arch == "llama":
            q, k = permute(q, H, H), permute(k, H, KV)
        add(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        add(b + "attn_q.weight", q, True)
        add(b + "attn_k.weight", k, True)
        add(b + "attn_v.weight", t[p + "self_attn.v_proj.weight"], True)
        add(b + "attn_output.weight", t[p + "self_attn.o_proj.weight"], True)
        if arch == "qwen2moe":
            for n in ("q", "k", "v"):
                add(b + f"attn_{n}.bias", t[p + f"self_attn.{n}_proj.bias"])
        add(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        moe = p + ("block_sparse_moe." if arch == "llama" else "mlp.")
        if moe + "gate.weight" not in t:  # a dense layer (Qwen2-MoE's mlp_only_layers)
            for n in ("gate", "up", "down"):
                add(b + f"ffn_{n}.weight", t[p + f"mlp.{n}_proj.weight"], True)
            continue
        add(b + "ffn_gate_inp.weight", t[moe + "gate.weight"])
        names = {"gate": "w1", "up": "w3", "down": "w2"} if arch == "llama" else \
            {n: f"{n}_proj" for n in ("gate", "up", "down")}
        for n, hf in names.items():
            add(b + f"ffn_{n}_exps.weight",
                np.stack([t[moe + f"experts.{e}.{hf}.weight"] for e in range(experts)]), True)
        if arch == "qwen2moe":
            for n in ("gate", "up", "down"):
                add(b + f"ffn_{n}_shexp.weight", t[moe + f"shared_expert.{n}_proj.weight"], True)
            add(b + "ffn_gate_inp_shexp.weight", t[moe + "shared_expert_gate.weight"])
    add("output_norm.weight", t["model.norm.weight"])
    if not cfg.get("tie_word_embeddings", False):
        add("output.weight", t["lm_head.weight"], True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", out)


def main() -> None:
    write("mixtral", "llama")
    write("mixtral", "llama", q8=True)
    write("qwen2-moe", "qwen2moe")


if __name__ == "__main__":
    main()
