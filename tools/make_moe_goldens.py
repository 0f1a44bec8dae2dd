#!/usr/bin/env python3
"""Tiny random mixture-of-experts models and their goldens, made by transformers' own classes.

Each model has E >= 4 routed experts of which every token runs k >= 2, and covers one way of
choosing and weighting them (common/moe.h):

  DeepSeek-V2   softmax scores, topk_method greedy and group_limited_greedy, routed_scaling_factor,
                shared experts, first_k_dense_replace (chapter 04)
  DeepSeek-V3   sigmoid scores, e_score_correction_bias for the choice only, noaux_tc group routing
                (groups ranked by their top-2 sum), norm_topk_prob, shared experts (chapter 04)
  Mixtral       softmax top-k renormalised, every layer (chapters 01/02)
  Qwen2-MoE     softmax top-k, a shared expert behind a sigmoid gate, decoder_sparse_step and
                mlp_only_layers (dense layers between MoE ones), q/k/v biases (chapters 01/02)

  data/golden/moe-random/manifest.json              what each model covers, versions, checks
  data/golden/moe-random/<name>/config.json         save_pretrained's config
  data/golden/moe-random/<name>/model.safetensors   its float32 weights
  data/golden/moe-random/<name>/golden.safetensors  logits at every position, greedy tokens

Weights as golden.randomize_weights draws them; DeepSeek-V3's e_score_correction_bias (a buffer,
zero after init) uniform in [-0.1, 0.1] so that it changes choices. The references run with eager
attention in float64 throughout (golden.float64_everywhere, and the routers' own float32
casts redirected too); logits are stored as float32
rounded from float64, so tests/golden_util.h's bound applies. A seed is kept only when every
greedy step's top-two logit gap exceeds MIN_MARGIN and every routing decision of the prompt and
its greedy continuation (the k-th against the (k+1)-th choice score, and the kept groups
against the next) is separated by more than MIN_ROUTE_MARGIN: float32 rounding in the chapter
cannot then pick another expert or token than float64 did.

Run from the repository root:  tools/.venv/bin/python tools/make_moe_goldens.py
(then tools/make_moe_gguf.py, whose GGUF files live in the same folders, which this script remakes)
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402  (float64_everywhere, randomize_weights, greedy_reference, write_random_set, ...)

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "moe-random"

TOKENS = 16
GREEDY_TOKENS = 8
MIN_MARGIN = 0.02         # greedy steps' top-two logit gap
MIN_ROUTE_MARGIN = 1e-4   # routing decisions' score gap (float32 logits are off by ~1e-6)

SMALL = dict(vocab_size=64, hidden_size=32, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0,
             max_position_embeddings=64, tie_word_embeddings=False)
MLA = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
           qk_rope_head_dim=8, v_head_dim=8, intermediate_size=48, moe_intermediate_size=12, attention_bias=False)
LLAMA = dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0)

# What each model's distinctive routing rule is worth: the config change that switches it off, whose
# float32 logits the manifest compares with the golden's (a golden the rule did not move would check
# nothing). "zero_score_bias" zeroes DeepSeek-V3's e_score_correction_bias instead.
SWITCH_OFF = {"deepseek-v2-greedy": {"routed_scaling_factor": 1.0},
              "deepseek-v2-group": {"topk_method": "greedy"},
              "deepseek-v3-noaux": "zero_score_bias",
              "deepseek-v3-shared": {"norm_topk_prob": True},
              "mixtral": {"num_experts_per_tok": 1},
              "qwen2-moe": {"norm_topk_prob": True}}

# name -> (class, what it covers, config fields over SMALL, seed)
MODELS: dict[str, tuple[str, str, dict, int]] = {
    "deepseek-v2-greedy": (
        "DeepseekV2ForCausalLM", "softmax scores, topk_method greedy, E=8 k=2, 2 shared experts, "
        "routed_scaling_factor 1.5, first_k_dense_replace 1 (layer 0 dense)",
        dict(**MLA, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
             n_shared_experts=2, topk_method="greedy", n_group=None, topk_group=None, norm_topk_prob=False,
             routed_scaling_factor=1.5), 1),
    "deepseek-v2-group": (
        "DeepseekV2ForCausalLM", "softmax scores, topk_method group_limited_greedy (n_group 4, topk_group 2: groups "
        "ranked by their best score), E=8 k=3, 1 shared expert, every layer MoE",
        dict(**MLA, num_hidden_layers=2, first_k_dense_replace=0, n_routed_experts=8, num_experts_per_tok=3,
             n_shared_experts=1, topk_method="group_limited_greedy", n_group=4, topk_group=2, norm_topk_prob=False,
             routed_scaling_factor=1.0), 2),
    "deepseek-v3-noaux": (
        "DeepseekV3ForCausalLM", "sigmoid scores, e_score_correction_bias for the choice, noaux_tc (n_group 4, "
        "topk_group 2: groups ranked by their top-2 biased sum), norm_topk_prob, routed_scaling_factor 2.5, "
        "E=8 k=2, 1 shared expert, first_k_dense_replace 1",
        dict(**MLA, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
             n_shared_experts=1, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
             rope_interleave=True), 3),
    "deepseek-v3-shared": (
        "DeepseekV3ForCausalLM", "sigmoid scores without renormalising (norm_topk_prob false), one group, "
        "E=6 k=2, 2 shared experts, every layer MoE, tied head",
        dict(**{**MLA, "moe_intermediate_size": 8}, num_hidden_layers=2, first_k_dense_replace=0,
             n_routed_experts=6, num_experts_per_tok=2, n_shared_experts=2, n_group=1, topk_group=1,
             norm_topk_prob=False, routed_scaling_factor=1.0, rope_interleave=False,
             tie_word_embeddings=True), 4),
    "mixtral": (
        "MixtralForCausalLM", "softmax top-k renormalised, E=4 k=2, every layer, GQA",
        dict(**LLAMA, head_dim=8, intermediate_size=24, num_hidden_layers=2, num_local_experts=4,
             num_experts_per_tok=2, sliding_window=None), 5),
    "qwen2-moe": (
        "Qwen2MoeForCausalLM", "softmax top-k not renormalised, E=6 k=2, a shared expert behind a sigmoid gate, "
        "mlp_only_layers [1] (layer 1 dense between MoE layers 0 and 2), q/k/v biases",
        dict(**LLAMA, intermediate_size=40, moe_intermediate_size=16, shared_expert_intermediate_size=24,
             num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
             decoder_sparse_step=1, mlp_only_layers=[1], use_sliding_window=False), 6),
}


@contextlib.contextmanager
def float64_routers():
    """golden.float64_everywhere plus the two float32 casts the routers make that it leaves:
    DeepSeek's gates call hidden_states.type(torch.float32) and DeepseekV2's scores
    logits.softmax(dim=-1, dtype=torch.float32)."""
    orig_type, orig_softmax = torch.Tensor.type, torch.Tensor.softmax

    def type64(self, *args, **kw):
        if args and args[0] is torch.float32:
            args = (torch.float64, *args[1:])
        return orig_type(self, *args, **kw)

    def softmax64(self, *args, **kw):
        if kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return orig_softmax(self, *args, **kw)

    torch.Tensor.type, torch.Tensor.softmax = type64, softmax64
    try:
        with golden.float64_everywhere():
            yield
    finally:
        torch.Tensor.type, torch.Tensor.softmax = orig_type, orig_softmax


def build(cls: str, fields: dict, seed: int):
    import transformers
    cfg_cls = {"DeepseekV2ForCausalLM": transformers.DeepseekV2Config,
               "DeepseekV3ForCausalLM": transformers.DeepseekV3Config,
               "MixtralForCausalLM": transformers.MixtralConfig,
               "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig}[cls]
    cfg = cfg_cls(**{**SMALL, **fields})
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg).eval()
    golden.randomize_weights(model, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.rand(b.shape, generator=gen) - 0.1)
    return model


def load(folder: pathlib.Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=dtype).eval()


@torch.no_grad()
def switched_off_diff(name: str, folder: pathlib.Path, ids: list[int], want: torch.Tensor) -> dict:
    """float32 logits of the saved model with its routing rule switched off (SWITCH_OFF), against
    the golden's."""
    from transformers import AutoModelForCausalLM
    change = SWITCH_OFF[name]
    kw = {} if change == "zero_score_bias" else change
    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager", dtype=torch.float32,
                                                 **kw).eval()
    if change == "zero_score_bias":
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.zero_()
    got = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    return {"change": change, "max_abs_logit_diff": float((got.double() - want).abs().max())}


def gates(model):
    """Every router of the model: (module, config) for each MoE layer's gate."""
    out = []
    for layer in model.model.layers:
        block = getattr(layer, "block_sparse_moe", None) or layer.mlp
        if hasattr(block, "gate"):
            out.append(block.gate)
    return out


def route_margin(cfg, cls: str, gate, h: torch.Tensor) -> float:
    """The smallest score gap any routing decision of the rows of h made: the k-th chosen expert
    against the best one left out, and (grouped routing) the last kept group against the next."""
    w = gate.weight.double()
    logits = h.double().reshape(-1, w.shape[1]) @ w.T
    E = w.shape[0]
    if cls == "DeepseekV3ForCausalLM":
        choice = logits.sigmoid() + gate.e_score_correction_bias.double()
        groups, keep, score = cfg.n_group, cfg.topk_group, "top2"
    else:
        choice = logits.softmax(-1)
        grouped = cls == "DeepseekV2ForCausalLM" and cfg.topk_method == "group_limited_greedy"
        groups, keep, score = (cfg.n_group, cfg.topk_group, "max") if grouped else (1, 1, None)
    k = cfg.num_experts_per_tok
    margin = float("inf")
    if groups > 1:
        g = choice.view(-1, groups, E // groups)
        gs = g.max(-1).values if score == "max" else g.topk(2, dim=-1).values.sum(-1)
        s = gs.sort(-1, descending=True).values
        if keep < groups:
            margin = min(margin, float((s[:, keep - 1] - s[:, keep]).min()))
        kept = torch.zeros_like(gs).scatter_(1, gs.topk(keep, dim=-1).indices, 1)
        choice = choice.masked_fill(~kept.repeat_interleave(E // groups, dim=1).bool(), 0.0)
    s = choice.sort(-1, descending=True).values
    return min(margin, float((s[:, k - 1] - s[:, k]).min()))


def make(name: str) -> dict:
    cls, covers, fields, seed0 = MODELS[name]
    folder = OUT / name

    def attempt(seed: int):
        shutil.rmtree(folder, ignore_errors=True)
        build(cls, fields, seed).save_pretrained(str(folder), safe_serialization=True)
        (folder / "generation_config.json").unlink(missing_ok=True)
        ids = torch.randint(0, SMALL["vocab_size"], (TOKENS,), generator=torch.Generator().manual_seed(seed)).tolist()
        with float64_routers():
            model = load(folder).to(torch.float64)
            tensors, margin = golden.greedy_reference(model, ids, GREEDY_TOKENS)
            seen = []
            hooks = [g.register_forward_pre_hook(lambda mod, args: seen.append((mod, args[0].detach()))) for g in gates(model)]
            with torch.no_grad():
                model(input_ids=torch.tensor([ids + tensors["greedy_ids"].tolist()[:-1]]), use_cache=False)
            for hk in hooks:
                hk.remove()
            rmargin = min(route_margin(model.config, cls, g, h) for g, h in seen)
        # One number for golden.first_seed: both margins relative to their thresholds.
        return ids, tensors, margin, rmargin, min(margin / MIN_MARGIN, rmargin / MIN_ROUTE_MARGIN)

    seed, (ids, tensors, margin, rmargin, _) = golden.first_seed(name, range(seed0 * 100, seed0 * 100 + 50), attempt, 1.0)
    model32 = load(folder)
    with torch.no_grad():
        l32 = model32(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    specs = golden.save_rounded(tensors, str(folder / "golden.safetensors"), name)
    want = tensors["logits"]
    cfg = model32.config
    return {
        "name": name, "class": cls, "covers": covers, "seed": seed, "ids": ids,
        "greedy_ids": tensors["greedy_ids"].tolist(), "moe_layers": len(gates(model32)),
        "checks": {"min_greedy_margin_float64": margin, "min_routing_margin_float64": rmargin,
                   "max_abs_logit": float(want.abs().max()),
                   "max_abs_logit_diff_float32_run": float((l32.double() - want).abs().max()),
                   "switched_off": switched_off_diff(name, folder, ids, want),
                   "experts": getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None)
                   or cfg.num_experts, "experts_per_token": cfg.num_experts_per_tok},
        "tensors": specs,
    }


def main() -> None:
    golden.write_random_set(OUT, MODELS, make, lambda models: golden.random_manifest(
        "tiny random mixture-of-experts models (DeepseekV2/V3, Mixtral, Qwen2-MoE) and their float64 goldens "
        "(tools/make_moe_goldens.py)", TOKENS, GREEDY_TOKENS,
        {"moe_layers": "how many of the model's layers are MoE layers",
         "switched_off": "the model's routing rule switched off (tools/make_moe_goldens.py SWITCH_OFF), and how far "
                         "its float32 logits then are from the golden's",
         "min_routing_margin_float64": "the smallest score gap of any routing decision (k-th chosen expert against "
                                       "the best one left out; last kept group against the next) over the prompt "
                                       "and its greedy continuation",
         "seed": f"the first seed from the listed one with greedy margins above {MIN_MARGIN} and routing margins "
                 f"above {MIN_ROUTE_MARGIN}"},
        models))


if __name__ == "__main__":
    main()
