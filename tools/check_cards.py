#!/usr/bin/env python3
"""Check that the model cards' forward-pass notes are enough: recompute every
zoo model's logits from model.safetensors + config.json alone, with plain
float64 tensor code written from the cards (no transformers, no tools/ref_*),
and compare them with data/golden/<model>/ (logits and caches / states).

    tools/.venv/bin/python tools/check_cards.py [NAME...]
"""
from __future__ import annotations

import json
import math
import os
import sys

import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
D = torch.float64


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=D) / d)
    a = pos[:, None].to(D) * inv[None]
    cos, sin = torch.cat([a.cos(), a.cos()], -1), torch.cat([a.sin(), a.sin()], -1)
    h = d // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def attend(q, k, v, mask, scale):
    # q [H, T, d], k/v [Hkv, T, d]
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ v


def mask_for(t, kind, window=None):
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None]
    if kind == "none":
        return torch.ones(t, t, dtype=torch.bool)
    m = j <= i
    if kind == "sliding":
        m &= j > i - window
    return m


def llama_like(w, c, ids, family):
    t = len(ids)
    pos = torch.arange(t)
    x = w["model.embed_tokens.weight"][ids]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // H
    eps = c["rms_norm_eps"]
    caches, shared = {}, None
    for L in range(c["num_hidden_layers"]):
        p = f"model.layers.{L}."
        n = rms(x, w[p + "input_layernorm.weight"], eps)
        if family == "mla":
            dn, dr, dv, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
            q = (n @ w[p + "self_attn.q_proj.weight"].T).view(t, H, dn + dr).transpose(0, 1)
            a = n @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
            ckv = rms(a[:, :r], w[p + "self_attn.kv_a_layernorm.weight"], 1e-6)  # class default eps
            kr = rope(a[:, r:], pos, c["rope_theta"])
            kv = (ckv @ w[p + "self_attn.kv_b_proj.weight"].T).view(t, H, dn + dv).transpose(0, 1)
            k = torch.cat([kv[..., :dn], kr[None].expand(H, t, dr)], -1)
            v = kv[..., dn:]
            q = torch.cat([q[..., :dn], rope(q[..., dn:], pos, c["rope_theta"])], -1)
            o = attend(q, k, v, mask_for(t, "causal"), 1 / math.sqrt(dn + dr))
            caches[f"layer{L}.c_kv"], caches[f"layer{L}.k_rope"] = ckv, kr
        else:
            q = rope((n @ w[p + "self_attn.q_proj.weight"].T).view(t, H, hd).transpose(0, 1), pos, c["rope_theta"])
            if p + "self_attn.k_proj.weight" in w:
                k = rope((n @ w[p + "self_attn.k_proj.weight"].T).view(t, Hkv, hd).transpose(0, 1), pos, c["rope_theta"])
                v = (n @ w[p + "self_attn.v_proj.weight"].T).view(t, Hkv, hd).transpose(0, 1)
                shared = (k, v)
                caches[f"layer{L}.k"], caches[f"layer{L}.v"] = k, v
            else:                                   # CLA consumer layer
                k, v = shared
            kind = "causal"
            if family == "mdlm":
                kind = "none"
            elif "layer_types" in c and c["layer_types"][L] == "sliding_attention":
                kind = "sliding"
            o = attend(q, k, v, mask_for(t, kind, c.get("sliding_window")), 1 / math.sqrt(hd))
        x = x + o.transpose(0, 1).reshape(t, -1) @ w[p + "self_attn.o_proj.weight"].T
        n = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g = n @ w[p + "mlp.gate_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * (n @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"], eps) @ w["model.embed_tokens.weight"].T, caches


def mamba_like(w, c, ids, lti):
    x = w["backbone.embeddings.weight"][ids]
    E, N, K = c["intermediate_size"], c["state_size"], c["conv_kernel"]
    eps = c["layer_norm_epsilon"]
    t = len(ids)
    states = {}
    for L in range(c["num_hidden_layers"]):
        p = f"backbone.layers.{L}."
        m = p + "mixer."
        n = rms(x, w[p + "norm.weight"], eps)
        proj = n @ w[m + "in_proj.weight"].T
        u_in, z = proj[:, :E], proj[:, E:]
        pad = torch.cat([torch.zeros(K - 1, E, dtype=D), u_in], 0)
        cw = w[m + "conv1d.weight"][:, 0, :]          # [E, K]
        xc = w[m + "conv1d.bias"] + sum(cw[:, k] * pad[k:k + t] for k in range(K))
        u = torch.nn.functional.silu(xc)
        A = -torch.exp(w[m + "A_log"])
        h = torch.zeros(E, N, dtype=D)
        ys = []
        for i in range(t):
            if lti:
                dt = torch.nn.functional.softplus(w[m + "dt"])
                B, C = w[m + "B"], w[m + "C"]
            else:
                s = u[i] @ w[m + "x_proj.weight"].T
                R = s.shape[0] - 2 * N
                dt = torch.nn.functional.softplus(s[:R] @ w[m + "dt_proj.weight"].T + w[m + "dt_proj.bias"])
                B, C = s[R:R + N][None], s[R + N:][None]
            h = torch.exp(dt[:, None] * A) * h + dt[:, None] * B * u[i][:, None]
            ys.append((h * C).sum(-1) + w[m + "D"] * u[i])
        y = torch.stack(ys) * torch.nn.functional.silu(z)
        x = x + y @ w[m + "out_proj.weight"].T
        states[f"layer{L}.ssm_state"] = h
        states[f"layer{L}.conv_state"] = pad[-K:].T if t >= K - 1 else None
    return rms(x, w["backbone.norm_f.weight"], eps) @ w["backbone.embeddings.weight"].T, states


def _f32_error(ours: torch.Tensor, stored: torch.Tensor) -> float:
    """The largest |ours - stored| over the rounding bound of float32, 2^-24 |ours|: the golden
    stores float64 results rounded to float32, so a faithful re-implementation stays below 1
    whatever the values' size (Mamba's states reach 10^4, the logits 10).  Below 2^-126 float32
    is subnormal, with a fixed spacing of 2^-149, so there the bound is half of that, 2^-150."""
    bound = (ours.abs() * 2.0 ** -24).clamp_min(2.0 ** -150)
    return ((ours - stored.to(D)).abs() / bound).max().item()


def check(name: str) -> bool:
    mdir = os.path.join(ROOT, "data", "models", name)
    gdir = os.path.join(ROOT, "data", "golden", name)
    c = json.load(open(os.path.join(mdir, "config.json")))
    w = {k: v.to(D) for k, v in load_file(os.path.join(mdir, "model.safetensors")).items()}
    g = load_file(os.path.join(gdir, "golden.safetensors"))
    arch = c["architectures"][0]
    worst, f64 = 0.0, 0.0
    for p in range(3):
        pre = f"prompt{p}."
        key = pre + ("masked_input_ids" if arch.startswith("InferLabMDLM") else "input_ids")
        ids = g[key].tolist()
        if "Mamba" in arch:
            logits, st = mamba_like(w, c, ids, lti="LTI" in arch)
        else:
            fam = {"DeepseekV3ForCausalLM": "mla", "InferLabMDLMForMaskedDiffusion": "mdlm"}.get(arch, "llama")
            logits, st = llama_like(w, c, ids, fam)
        diffs = {"logits": _f32_error(logits, g[pre + "logits"])}
        for k, v in st.items():
            if v is None or pre + k not in g:
                continue
            diffs[k] = _f32_error(v.reshape(g[pre + k].shape), g[pre + k])
        worst = max(worst, max(diffs.values()))
        f64 = max(f64, (logits[-1] - g[pre + "last_logits_f64"]).abs().max().item())
    if "long.input_ids" in g:                      # longer than the sliding window
        ids = g["long.input_ids"].tolist()
        logits, _ = llama_like(w, c, ids, "llama")
        n = g["long.logits_tail"].shape[0]
        worst = max(worst, _f32_error(logits[-n:], g["long.logits_tail"]))
        f64 = max(f64, (logits[-1] - g["long.last_logits_f64"]).abs().max().item())
    # float64 values rounded to float32 are within half an ulp, 2^-24 |v|; 1.001 leaves room for
    # the two float64 computations' own differences (about 1e-14 relative)
    ok = worst <= 1.001 and f64 < 1e-9
    print(f"{name}: largest difference to the golden: float32-stored logits and caches "
          f"{worst:.3f} of float32's rounding bound (2^-24 |value|), "
          f"float64 last logits {f64:.1e} {'OK' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    names = sys.argv[1:] or sorted(os.listdir(os.path.join(ROOT, "data", "golden")))
    names = [n for n in names if n.startswith("tiny-")]
    return 0 if all([check(n) for n in names]) else 1


if __name__ == "__main__":
    sys.exit(main())
