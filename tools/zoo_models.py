"""The zoo's model definitions: one entry per model, a builder, save and load.

Every model shares the tokenizer (vocab 1024), the context length (512), the
training recipe and the token budget (see train.py); sizes are close so that
quality differences belong to the technique.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

VOCAB = 1024
CTX = 512
BOS = 0
MASK = 1

_LLAMA_COMMON = dict(
    vocab_size=VOCAB, hidden_size=128, intermediate_size=320, num_hidden_layers=4,
    num_attention_heads=8, head_dim=16, max_position_embeddings=CTX, rms_norm_eps=1e-5,
    rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
    bos_token_id=BOS, eos_token_id=BOS, hidden_act="silu", initializer_range=0.02,
)

SWA_WINDOW = 64

# name -> (family, kwargs)
SPECS: dict[str, tuple[str, dict]] = {
    "tiny-mha": ("llama", dict(num_key_value_heads=8)),
    "tiny-gqa": ("llama", dict(num_key_value_heads=2)),
    "tiny-mqa": ("llama", dict(num_key_value_heads=1)),
    "tiny-mla": ("deepseek_v3", dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                     v_head_dim=16)),
    "tiny-cla": ("cla", dict(num_key_value_heads=8, kv_share_factor=2)),
    "tiny-swa": ("ministral", dict(num_key_value_heads=8, sliding_window=SWA_WINDOW,
                                   layer_types=["sliding_attention"] * 4)),
    "tiny-hybrid": ("ministral", dict(num_key_value_heads=8, sliding_window=SWA_WINDOW,
                                      layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    "tiny-mamba": ("mamba", dict(num_hidden_layers=6)),
    "tiny-lti": ("lti", dict(num_hidden_layers=6)),
    "tiny-mdlm": ("mdlm", dict(num_key_value_heads=8)),
    "tiny-draft": ("llama", dict(num_key_value_heads=4, hidden_size=64, intermediate_size=192,
                                 num_hidden_layers=2, num_attention_heads=4)),
}

ORDER = list(SPECS)

ARCH_NAMES = {
    "cla": "InferLabCLAForCausalLM",
    "mdlm": "InferLabMDLMForMaskedDiffusion",
    "lti": "InferLabLTIMambaForCausalLM",
}


def _mamba_config(kw: dict):
    from transformers import MambaConfig
    return MambaConfig(
        vocab_size=VOCAB, hidden_size=128, state_size=16, num_hidden_layers=kw["num_hidden_layers"],
        expand=2, conv_kernel=4, time_step_rank=8, use_bias=False, use_conv_bias=True,
        hidden_act="silu", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        residual_in_fp32=True, bos_token_id=BOS, eos_token_id=BOS, pad_token_id=BOS,
        use_mambapy=False,
    )


def hf_config(name: str):
    family, kw = SPECS[name]
    if family == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(**{**_LLAMA_COMMON, **kw})
    if family == "ministral":
        from transformers import MinistralConfig
        return MinistralConfig(**{**_LLAMA_COMMON, **kw})
    if family == "deepseek_v3":
        from transformers import DeepseekV3Config
        c = dict(_LLAMA_COMMON)
        c.pop("head_dim"); c.pop("mlp_bias")
        return DeepseekV3Config(
            **c, num_key_value_heads=8, q_lora_rank=None, **kw,
            # dense MLP in every layer: the MoE layers start after all layers
            first_k_dense_replace=4, n_routed_experts=1, n_shared_experts=1,
            num_experts_per_tok=1, moe_intermediate_size=32, n_group=1, topk_group=1,
            rope_interleave=False, rope_scaling=None,
        )
    if family in ("mamba", "lti"):
        return _mamba_config(kw)
    raise ValueError(family)


def ref_config(name: str):
    from ref_transformer import RefConfig
    family, kw = SPECS[name]
    base = {k: v for k, v in _LLAMA_COMMON.items() if k in RefConfig.__dataclass_fields__}
    base.update(kw)
    if family == "mdlm":
        base.update(causal=False, mask_token_id=MASK)
    return RefConfig(**base)


def build(name: str, seed: int):
    """A freshly initialised model (deterministic given the seed)."""
    torch.manual_seed(seed)
    family, _ = SPECS[name]
    if family in ("cla", "mdlm"):
        from ref_transformer import RefTransformer
        return RefTransformer(ref_config(name))
    cfg = hf_config(name)
    cfg._attn_implementation = "eager"
    if family == "lti":
        from ref_lti_mamba import build_lti
        return build_lti(cfg)
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids) if not hasattr(model, "config") else model(input_ids=ids, use_cache=False)
    return out if isinstance(out, torch.Tensor) else out.logits


def param_count(model) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def save(name: str, model, out_dir: str, tokenizer_path: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    family, _ = SPECS[name]
    model = model.float()
    if family in ("cla", "mdlm"):
        cfg = ref_config(name).to_dict()
        cfg = {"architectures": [ARCH_NAMES[family]], "model_type": f"inferlab_{family}",
               **cfg, "torch_dtype": "float32"}
        if family == "cla":
            cfg["kv_producer_layers"] = [i for i in range(cfg["num_hidden_layers"])
                                         if i % cfg["kv_share_factor"] == 0]
        save_file(model.state_dict_for_save(), os.path.join(out_dir, "model.safetensors"),
                  metadata={"format": "pt"})
        _write_json(os.path.join(out_dir, "config.json"), cfg)
    elif family == "lti":
        cfg = model.config.to_dict()
        for k in ("transformers_version", "_name_or_path", "use_mambapy", "use_cache",
                  "time_step_rank", "time_step_scale", "time_step_min", "time_step_max",
                  "time_step_init_scheme", "time_step_floor", "rescale_prenorm_residual",
                  "_attn_implementation_autoset", "architectures", "model_type"):
            cfg.pop(k, None)
        cfg = {"architectures": [ARCH_NAMES[family]], "model_type": "inferlab_lti_mamba",
               "intermediate_size": model.config.intermediate_size, **cfg,
               "torch_dtype": "float32"}
        sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()
              if k != "lm_head.weight"}
        save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        _write_json(os.path.join(out_dir, "config.json"), cfg)
    else:
        model.save_pretrained(out_dir, safe_serialization=True)
    with open(tokenizer_path, "rb") as f:
        tok = f.read()
    with open(os.path.join(out_dir, "tokenizer.json"), "wb") as f:
        f.write(tok)


def load(name: str, model_dir: str, dtype=torch.float32):
    family, _ = SPECS[name]
    if family in ("cla", "mdlm", "lti"):
        model = build(name, seed=0)
        sd = load_file(os.path.join(model_dir, "model.safetensors"))
        if family == "lti":
            sd = dict(sd)
            sd["lm_head.weight"] = sd["backbone.embeddings.weight"]
            model.load_state_dict(sd, strict=True)
            model.tie_weights()
        else:
            model.load_saved(sd)
    else:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                     torch_dtype=torch.float32)
    model.eval()
    return model.to(dtype)


def _write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
