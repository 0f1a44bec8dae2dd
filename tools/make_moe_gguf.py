#!/usr/bin/env python3
"""GGUF files of the random Mixtral, Qwen2-MoE and DeepSeek-V2/V3 models of data/golden/moe-random
(and two of the dense MLA models of data/golden/mla-random), written with the `gguf` package
(llama.cpp's own Python library) in the layout llama.cpp's converter gives them (its tree:
conversion/llama.py LlamaModel for Mixtral, conversion/qwen.py Qwen2MoeModel,
conversion/deepseek.py DeepseekV2Model for DeepSeek):

  - Mixtral as architecture `llama` with `llama.expert_count` / `llama.expert_used_count`; q and k
    rows permuted to llama.cpp's adjacent-pair RoPE order (LlamaModel.permute); each layer's
    experts stacked: ffn_gate_exps (w1), ffn_up_exps (w3), ffn_down_exps (w2), [E, F, D] / [E, D, F]
    outermost first; the router ffn_gate_inp in F32.
  - Qwen2-MoE as `qwen2moe`: q/k/v biases, rows as trained, the shared expert ffn_*_shexp and its
    gate ffn_gate_inp_shexp ([1, D] as the converter writes it, unsqueezed), the experts'
    widths in qwen2moe.expert_feed_forward_length and expert_shared_feed_forward_length; the
    layer listed in mlp_only_layers keeps dense ffn_gate / ffn_up / ffn_down tensors.
  - DeepSeek-V2/V3 as `deepseek2` (DeepseekV2Model): head_count_kv 1 (MLA as one latent KV
    head), key_length / value_length r + dr and r, key_length_mla / value_length_mla dn + dr and
    dv; kv_b_proj split per head into attn_k_b [N, r, dn] (W_UK transposed) and attn_v_b
    [N, dv, r]; q_proj or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa,
    kv_a_layernorm as attn_q or attn_q_a / attn_q_a_norm / attn_q_b, attn_kv_a_mqa,
    attn_kv_a_norm; the dense layers before first_k_dense_replace as ffn_gate / ffn_up /
    ffn_down, the others' router ffn_gate_inp, V3's e_score_correction_bias as exp_probs_b.bias,
    the experts stacked and the shared experts as ffn_*_shexp; the MoE keys
    leading_dense_block_count, expert_count, expert_used_count, expert_feed_forward_length,
    expert_shared_count, expert_weights_scale (routed_scaling_factor), expert_weights_norm (only
    when norm_topk_prob is true), expert_group_count / expert_group_used_count (n_group /
    topk_group when set); YaRN as rope.scaling.* with yarn_log_multiplier = 0.1 · mscale_all_dim.
    Two departures, both where these configs lack what a DeepSeek checkpoint has, each so that
    the file means the model transformers ran:
      * expert_gating_func: the converter writes it from the config's scoring_func, which
        DeepSeek's own configs carry and transformers' do not; here it is transformers' rule for
        the class (V2 softmax, V3 sigmoid), as the configs have no scoring_func.
      * RoPE pairing: llama.cpp's deepseek2 rotates adjacent pairs (2j, 2j + 1), the layout of
        DeepSeek's checkpoints (rope_interleave true, and V2's complex rotation). The converter
        ignores rope_interleave; for a config with rope_interleave false (transformers pairs j with
        j + dr/2) the q_pe rows of each head and the k_pe rows of kv_a_proj_with_mqa are reordered
        to adjacent pairs here, as LlamaModel.permute does for Llama's q and k.

  data/golden/<set>/<name>/model.gguf       every matrix F32
  data/golden/<set>/<name>/model-q8_0.gguf  (Mixtral, deepseek-v3-noaux) quantised by gguf.quants
                                            as the converter's --outtype q8_0 does: Mixtral's
                                            experts and attention; for DeepSeek every 2-D or
                                            3-D .weight but the router, norms and biases (the
                                            embedding and head too); F16 where a row is not a
                                            whole number of 32-value blocks (ffn_down_exps,
                                            attn_k_b, attn_v_b)

The random models have no tokenizer, so llama.cpp's converter itself (which needs one) is not
run; the layout above is its. Chapter 09's tests (Mixtral, Qwen2-MoE) and chapter 04's
(DeepSeek) load these and compare with the Hugging Face path and transformers' goldens.

Run from the repository root:  tools/.venv/bin/python tools/make_moe_gguf.py
"""
from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
from safetensors.numpy import load_file

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden"
ROOT = GOLDEN / "moe-random"


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


def to_adjacent_pairs(w: np.ndarray, period: int, begin: int, dr: int) -> np.ndarray:
    """Rows [begin, begin + dr) of every block of `period` rows from the half-split RoPE order
    (pair j = rows j and j + dr/2) to adjacent pairs (rows 2j and 2j + 1)."""
    w = w.reshape(-1, period, w.shape[-1]).copy()
    part = w[:, begin:begin + dr]
    w[:, begin:begin + dr] = part.reshape(-1, 2, dr // 2, w.shape[-1]).swapaxes(1, 2).reshape(part.shape)
    return w.reshape(-1, w.shape[-1])


def write_deepseek(folder: pathlib.Path, q8: bool = False, out: pathlib.Path | None = None,
                   for_llamacpp: bool = False, tokenizer_from: pathlib.Path | None = None) -> None:
    """`for_llamacpp`: the copy tools/moe_llamacpp_check.sh gives llama.cpp, with what it needs to
    load a file that the converter would not give it: attention.q_lora_rank = 0 when the query is
    direct (llama.cpp requires the key unless the layer count is a V2-Lite's), no
    expert_group_count when it is not below expert_count (a dense config's 1 of 1, which llama.cpp
    stops at with an assertion), and, without
    `tokenizer_from`, a placeholder vocabulary of the model's size (llama.cpp loads no model
    without tokenizer.ggml.*). `tokenizer_from`: a GGUF whose tokenizer.ggml.* keys are copied
    (ch09_quantization export writes the zoo tokenizer's)."""
    cfg = json.loads((folder / "config.json").read_text())
    t = load_file(str(folder / "model.safetensors"))
    v3 = cfg["architectures"][0] == "DeepseekV3ForCausalLM"
    out = out or folder / ("model-q8_0.gguf" if q8 else "model.gguf")
    w = gguf.GGUFWriter(str(out), "deepseek2")
    L, D, N = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    r, dn, dr, dv = cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    rq = cfg.get("q_lora_rank")
    first_dense = cfg.get("first_k_dense_replace") or 0
    # TextModel.set_gguf_parameters
    w.add_name(folder.name)
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(N)
    w.add_head_count_kv(1)  # DeepseekV2Model: "MLA converts into MQA"
    rope = cfg.get("rope_scaling")
    if rope is not None:
        assert rope["rope_type"] == "yarn", rope
        # llama.cpp's deepseek2 takes mscale = mscale_all_dim (cos and sin unscaled): a config
        # where they differ has no GGUF form.
        assert rope.get("mscale", 0) == rope.get("mscale_all_dim", 0) != 0, rope
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if "beta_fast" in rope:
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if "beta_slow" in rope:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    # Written whenever the config has them, dense models (n_routed_experts 1) included.
    if cfg.get("n_routed_experts") is not None:
        w.add_expert_count(cfg["n_routed_experts"])
    if cfg.get("num_experts_per_tok") is not None:
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    # (llama.cpp asserts fewer groups than experts: not so in a dense config's n_group 1 of 1 expert)
    if cfg.get("n_group") is not None and not (for_llamacpp and cfg["n_group"] >= (cfg.get("n_routed_experts") or 0)):
        w.add_expert_group_count(cfg["n_group"])
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(cfg["topk_group"])
    # The configs carry no scoring_func (DeepSeek's own do): transformers' rule for the class.
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if q8 else gguf.LlamaFileType.ALL_F32)
    # DeepseekV2Model.set_gguf_parameters
    w.add_leading_dense_block_count(first_dense)
    w.add_vocab_size(cfg["vocab_size"])
    if rq is not None:
        w.add_q_lora_rank(rq)
    w.add_kv_lora_rank(r)
    w.add_key_length(r + dr)
    w.add_value_length(r)
    w.add_key_length_mla(dn + dr)
    w.add_value_length_mla(dv)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg.get("n_shared_experts") or 0)
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(dr)
    if rope is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if tokenizer_from is not None:
        for key, field in gguf.GGUFReader(str(tokenizer_from)).fields.items():
            if key.startswith("tokenizer.") and key not in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
                w.add_key_value(key, field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    elif for_llamacpp:
        V = cfg["vocab_size"]
        w.add_tokenizer_model("llama")
        w.add_token_list([f"<t{i}>" for i in range(V)])
        w.add_token_scores([0.0] * V)
        w.add_token_types([gguf.TokenType.NORMAL] * V)
    if for_llamacpp and rq is None:
        w.add_q_lora_rank(0)

    def add(gname: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a.astype(np.float32))
        # The converter's rule: vectors, norms, the router and non-.weight tensors stay F32.
        keep = a.ndim <= 1 or gname.endswith("_norm.weight") or ".ffn_gate_inp." in gname or \
            not gname.endswith(".weight")
        if q8 and not keep and a.shape[-1] % 32 == 0:
            w.add_tensor(gname, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif q8 and not keep:  # QuantError in the converter: "falling back to F16"
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, a)

    # rope_interleave false: q_pe and k_pe rows to llama.cpp's adjacent pairs (see above).
    half_split = v3 and not cfg.get("rope_interleave", True)

    def q_rows(a: np.ndarray) -> np.ndarray:
        return to_adjacent_pairs(a, dn + dr, dn, dr) if half_split else a

    add("token_embd.weight", t["model.embed_tokens.weight"])
    for i in range(L):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a = p + "self_attn."
        add(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        if rq is None:
            add(b + "attn_q.weight", q_rows(t[a + "q_proj.weight"]))
        else:
            add(b + "attn_q_a.weight", t[a + "q_a_proj.weight"])
            add(b + "attn_q_a_norm.weight", t[a + "q_a_layernorm.weight"])
            add(b + "attn_q_b.weight", q_rows(t[a + "q_b_proj.weight"]))
        kv_a = t[a + "kv_a_proj_with_mqa.weight"]
        add(b + "attn_kv_a_mqa.weight", to_adjacent_pairs(kv_a, r + dr, r, dr) if half_split else kv_a)
        add(b + "attn_kv_a_norm.weight", t[a + "kv_a_layernorm.weight"])
        # DeepseekV2Model.modify_tensors: kv_b_proj [N·(dn + dv), r] split per head, k_b transposed.
        kv_b = t[a + "kv_b_proj.weight"].reshape(N, dn + dv, r)
        add(b + "attn_k_b.weight", kv_b[:, :dn].transpose(0, 2, 1))
        add(b + "attn_v_b.weight", kv_b[:, dn:])
        add(b + "attn_output.weight", t[a + "o_proj.weight"])
        add(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        if i < first_dense:
            for n in ("gate", "up", "down"):
                add(b + f"ffn_{n}.weight", t[p + f"mlp.{n}_proj.weight"])
            continue
        add(b + "ffn_gate_inp.weight", t[p + "mlp.gate.weight"])
        if v3:
            add(b + "exp_probs_b.bias", t[p + "mlp.gate.e_score_correction_bias"])
        for n in ("gate", "up", "down"):
            add(b + f"ffn_{n}_exps.weight",
                np.stack([t[p + f"mlp.experts.{e}.{n}_proj.weight"] for e in range(cfg["n_routed_experts"])]))
            if cfg.get("n_shared_experts"):
                add(b + f"ffn_{n}_shexp.weight", t[p + f"mlp.shared_experts.{n}_proj.weight"])
    add("output_norm.weight", t["model.norm.weight"])
    if not cfg.get("tie_word_embeddings", False):
        add("output.weight", t["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", out)


def main() -> None:
    write("mixtral", "llama")
    write("mixtral", "llama", q8=True)
    write("qwen2-moe", "qwen2moe")
    for name in ("deepseek-v2-greedy", "deepseek-v2-group", "deepseek-v3-noaux", "deepseek-v3-shared"):
        write_deepseek(ROOT / name)
    write_deepseek(ROOT / "deepseek-v3-noaux", q8=True)
    # Dense MLA: the low-rank query (attn_q_a, attn_q_b) and DeepSeek-V3's YaRN fields.
    for name in ("v3-qlora-interleave", "v3-yarn-deepseek"):
        write_deepseek(GOLDEN / "mla-random" / name)


if __name__ == "__main__":
    main()
