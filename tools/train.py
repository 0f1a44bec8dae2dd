"""Train one zoo model on the synthetic corpus (CPU by default, deterministic).

Recipe shared by every model: AdamW (betas 0.9/0.95, weight decay 0.1 on
matrices), linear warm-up then cosine decay to 10% of the peak rate, gradient
clipping at 1.0, sequences of 512 tokens cut from the packed token stream,
the same order of sequences for every model (it depends on the data seed only).

Causal models minimise next-token cross-entropy.  tiny-mdlm minimises the
masked-diffusion (LLaDA / MDLM) loss: for each sequence draw t ~ U(0, 1),
replace every token by <|mask|> with probability t, and score the masked
positions with weight 1/t:  L = E_t [ (1/t) * sum_{masked i} -log p(x_i | x_t) ] / 512.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import zoo_models as zm

DATA_SEED = 1234


def batches(tokens: np.ndarray, batch: int, steps: int, seq: int = zm.CTX):
    """Deterministic stream of [batch, seq+1] windows (non-overlapping chunks in a
    seeded random order, reshuffled each epoch)."""
    n_chunks = (len(tokens) - 1) // seq
    rng = np.random.default_rng(DATA_SEED)
    order = rng.permutation(n_chunks)
    pos = 0
    for _ in range(steps):
        if pos + batch > n_chunks:
            order = rng.permutation(n_chunks)
            pos = 0
        idx = order[pos:pos + batch]
        pos += batch
        x = np.stack([tokens[i * seq:i * seq + seq + 1] for i in idx]).astype(np.int64)
        yield torch.from_numpy(x)


def mdlm_loss(model, x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    b, n = x0.shape
    eps = 1e-3
    t = ((1 - eps) * torch.rand(b, 1, generator=gen) + eps).to(x0.device)
    masked = torch.rand(b, n, generator=gen).to(x0.device) < t
    xt = torch.where(masked, torch.full_like(x0, zm.MASK), x0)
    logits = zm.logits_of(model, xt)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x0.reshape(-1), reduction="none")
    ce = ce.view(b, n) * masked / t
    return ce.sum() / (b * n)


def train(name: str, tokens: np.ndarray, *, seed: int, token_budget: int, batch: int,
          lr: float, threads: int, device: str = "cpu", log=print) -> tuple[torch.nn.Module, dict]:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    model = zm.build(name, seed).to(device)
    model.train()
    family = zm.SPECS[name][0]
    if family in ("mamba", "lti"):
        import fast_scan
        fast_scan.install(model)
    elif hasattr(model, "config"):
        model.config._attn_implementation = "sdpa"  # fused attention while training
    steps = max(1, token_budget // (batch * zm.CTX))
    warm = max(1, steps // 20)
    decay, no_decay = [], []
    seen = set()
    for n_, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(seed + 17)
    t0 = time.time()
    losses = []
    for step, xb in enumerate(batches(tokens, batch, steps)):
        xb = xb.to(device)
        cur = lr * (step + 1) / warm if step < warm else \
            lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))
        for g in opt.param_groups:
            g["lr"] = cur
        if family == "mdlm":
            loss = mdlm_loss(model, xb[:, :-1], gen)
        else:
            logits = zm.logits_of(model, xb[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            el = time.time() - t0
            log(f"{name} step {step}/{steps} loss {loss.item():.4f} lr {cur:.2e} "
                f"{(step + 1) * batch * zm.CTX / max(el, 1e-9):.0f} tok/s elapsed {el:.0f}s")
    info = {"steps": steps, "batch": batch, "seq_len": zm.CTX, "tokens": steps * batch * zm.CTX,
            "lr": lr, "seed": seed, "threads": threads, "device": device, "train_seconds": round(time.time() - t0, 1),
            "final_train_loss": float(np.mean(losses[-20:]))}
    if family in ("mamba", "lti"):
        fast_scan.uninstall(model)
    elif hasattr(model, "config"):
        model.config._attn_implementation = "eager"
    model = model.to("cpu")
    model.eval()
    return model, info
