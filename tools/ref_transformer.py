"""InferLab's own small PyTorch reference transformer, for the two zoo models that
have no transformers class:

* tiny-cla  (InferLabCLAForCausalLM): Llama block with cross-layer KV sharing
  (Brandon et al. 2024, "Reducing Transformer Key-Value Cache Size with
  Cross-Layer Attention").  With sharing factor s, layer i computes its own K
  and V only when i % s == 0; layers i+1..i+s-1 reuse exactly those K and V
  (already rotated) and have no k_proj / v_proj weights.
* tiny-mdlm (InferLabMDLMForMaskedDiffusion): the same Llama block with no
  causal mask (every position sees every position), trained with the masked
  diffusion objective (see train.py).

Parameter names follow transformers' Llama so that the safetensors files read
the same way as tiny-mha's.  With kv_share_factor=1 and causal=True the module
computes exactly LlamaForCausalLM (golden.py checks that on tiny-mha).
Conventions: RMSNorm y = x / sqrt(mean(x^2) + eps) * w; RoPE in the "rotate
half" layout (pair dimension j with j + head_dim/2), inv_freq[j] =
theta^(-2j/head_dim); SwiGLU MLP down(silu(gate(x)) * up(x)).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class RefConfig:
    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 320
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = True
    kv_share_factor: int = 1      # CLA sharing factor (1 = no sharing)
    causal: bool = True
    bos_token_id: int = 0
    eos_token_id: int = 0
    mask_token_id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(cfg: RefConfig, n: int, dtype, device=None):
    j = torch.arange(0, cfg.head_dim, 2, dtype=torch.float64, device=device)
    inv_freq = 1.0 / (cfg.rope_theta ** (j / cfg.head_dim))
    ang = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: RefConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.owns_kv = layer % cfg.kv_share_factor == 0
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_attention_heads * hd, bias=False)
        if self.owns_kv:
            self.k_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
            self.v_proj = nn.Linear(d, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, d, bias=False)

    def forward(self, x, cos, sin, shared_kv, attn_mask):
        b, t, _ = x.shape
        cfg = self.cfg
        q = self.q_proj(x).view(b, t, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        if self.owns_kv:
            k = self.k_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
            k = k * cos + rotate_half(k) * sin
            kv = (k, v)
        else:
            kv = shared_kv
        k, v = kv
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if self.training:  # fused kernel for speed; same math
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        else:
            s = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)
            if attn_mask is not None:
                s = s.masked_fill(~attn_mask, float("-inf"))
            p = torch.softmax(s, dim=-1)
            o = p @ v
        o = o.transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(o), kv


class MLP(nn.Module):
    def __init__(self, cfg: RefConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: RefConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, shared_kv, attn_mask):
        a, kv = self.self_attn(self.input_layernorm(x), cos, sin, shared_kv, attn_mask)
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, kv


class Body(nn.Module):
    def __init__(self, cfg: RefConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class RefTransformer(nn.Module):
    """forward(ids) -> logits [B, T, V]; with return_kv=True also the list of
    per-layer (K, V) actually used (K after RoPE), [B, n_kv, T, head_dim]."""

    def __init__(self, cfg: RefConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, return_kv: bool = False):
        t = ids.shape[1]
        x = self.model.embed_tokens(ids)
        cos, sin = rope_tables(self.cfg, t, x.dtype, x.device)
        mask = None
        if self.cfg.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        kvs, kv = [], None
        for layer in self.model.layers:
            x, kv = layer(x, cos, sin, kv, mask)
            kvs.append(kv)
        logits = self.lm_head(self.model.norm(x))
        return (logits, kvs) if return_kv else logits

    def state_dict_for_save(self) -> dict:
        sd = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        if self.cfg.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd

    def load_saved(self, sd: dict) -> None:
        if self.cfg.tie_word_embeddings:
            sd = dict(sd)
            sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        self.load_state_dict(sd, strict=True)
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
