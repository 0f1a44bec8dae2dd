"""Train one zoo model on the synthetic corpus (CPU by default, deterministic).

train() is the recipe of the committed zoo (below). train_recipe() follows a candidate recipe of
tools/recipe.py (v2, v3: phases of rows scored on what copying predicts, memory games scored on
their answers, many more steps), with checkpoints and resume; tools/probe_curve.py measures it
before the zoo moves to it.

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

import recipe
import zoo_models as zm

CHECKPOINT_EVERY = 250

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


def mdlm_answer_loss(model, x0: torch.Tensor, scored: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The masked-diffusion loss of a recipe row (tools/recipe.py), on what the row scores: each
    scored token is masked with probability t, and each row's loss is the mean over its scored
    tokens of (1/t) * (-log p(x_i | x_t)), returned per row [B]; the step's loss is their mean, as
    the causal models' recipe loss.  `scored` [B, n] marks x0's scored tokens (the recipe's score mask shifted
    by one: a causal model predicts token i + 1 at position i, a diffusion model fills it in place).
    Masking the whole row would spend the loss on random tokens nothing can predict."""
    b, n = x0.shape
    eps = 1e-3
    t = ((1 - eps) * torch.rand(b, 1, generator=gen) + eps).to(x0.device)
    masked = (torch.rand(b, n, generator=gen).to(x0.device) < t) & (scored > 0)
    xt = torch.where(masked, torch.full_like(x0, zm.MASK), x0)
    logits = zm.logits_of(model, xt)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x0.reshape(-1), reduction="none").view(b, n)
    return (ce * masked / t).sum(1) / scored.sum(1).clamp(min=1)


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


def setup(name: str, seed: int, threads: int, device: str, lr: float):
    """The model (seeded, in training mode, with its training-only fast paths) and its AdamW
    (betas 0.9/0.95, weight decay 0.1 on matrices only), deterministic."""
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
    return model, family, optimiser(model, lr)


def optimiser(model, lr: float):
    decay, no_decay = [], []
    seen = set()
    for n_, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def finish(model, family: str):
    """Back to evaluation: the reference attention, the fast paths removed, on the CPU."""
    if family in ("mamba", "lti"):
        import fast_scan
        fast_scan.uninstall(model)
    elif hasattr(model, "config"):
        model.config._attn_implementation = "eager"
    model = model.to("cpu")
    model.eval()
    return model


def train(name: str, tokens: np.ndarray, *, seed: int, token_budget: int, batch: int,
          lr: float, threads: int, device: str = "cpu", log=print) -> tuple[torch.nn.Module, dict]:
    model, family, opt = setup(name, seed, threads, device, lr)
    steps = max(1, token_budget // (batch * zm.CTX))
    warm = max(1, steps // 20)
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
    return finish(model, family), info


def causal_loss(model, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean cross-entropy on its scored positions [rows]; the step's loss is their mean."""
    logits = zm.logits_of(model, x[:, :-1])
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none").view(mask.shape)
    return (ce * mask).sum(1) / mask.sum(1).clamp(min=1)


def train_recipe(name: str, tokens: np.ndarray, encode, *, seed: int, threads: int, device: str = "cpu",
          checkpoint: str | None = None, stop_after: int | None = None, log=print) -> tuple[torch.nn.Module, dict]:
    """Trains `name` through tools/recipe.py's stream and schedule (recipe.NAME; the committed
    zoo is train()'s); `encode` is the tokenizer (text -> ids) the memory games need.  With `checkpoint`, saves there as it goes and resumes from it.  `stop_after`
    ends the run early (for calibration curves)."""
    model, family, opt = setup(name, seed, threads, device, recipe.LR)
    recipe.MODEL = name  # its variant of the recipe, if it has one
    steps = recipe.total_steps() if stop_after is None else min(stop_after, recipe.total_steps())
    stream = recipe.Stream(tokens, encode)
    first, elapsed, losses = 0, 0.0, []
    by_kind: dict[str, list[float]] = {k: [] for k in recipe.KINDS}  # the log's per-kind means
    if checkpoint and os.path.exists(checkpoint):
        state = torch.load(checkpoint, weights_only=False)
        planned = recipe.describe()
        if state.get("phases", planned) != planned:
            raise SystemExit(f"{checkpoint} was saved by another schedule ({state['phases']}); move it away to "
                             f"train {name} with {recipe.label()} from the start")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first, elapsed, losses = state["step"], state["elapsed"], state["losses"]
        log(f"{name}: resumed at step {first} ({elapsed:.0f}s trained)")
    t0 = time.time() - elapsed
    for step in range(first, steps):
        if recipe.restarts(step):  # a phase that fine-tunes what the phases before made
            opt = optimiser(model, recipe.LR)
        x_np, m_np = stream.batch(step)
        x = torch.from_numpy(x_np).to(device)
        mask = torch.from_numpy(m_np).to(device)
        for g in opt.param_groups:
            g["lr"] = recipe.learning_rate(step)
        if family == "mdlm":
            gen = torch.Generator().manual_seed(seed * 1_000_003 + step)  # per step: resumable
            scored = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)
            rows = mdlm_answer_loss(model, x[:, :-1], scored, gen)
        else:
            rows = causal_loss(model, x, mask)
        for kind, r in zip(stream.kinds(step), rows.tolist()):
            by_kind[kind].append(r)
        loss = rows.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        done = step + 1
        if step % 25 == 0 or done == steps:
            el = time.time() - t0
            kinds = " ".join(f"{k} {np.mean(v):.3f}" for k, v in by_kind.items() if v)
            log(f"{name} step {step}/{steps} rows {recipe.row_length(step)} loss {loss.item():.4f} "
                f"({kinds}) lr {recipe.learning_rate(step):.2e} elapsed {el:.0f}s")
            by_kind = {k: [] for k in recipe.KINDS}
        if checkpoint and (done % CHECKPOINT_EVERY == 0 or done == steps):
            os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": done,
                        "elapsed": time.time() - t0, "losses": losses,
                        "phases": recipe.describe()}, checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
    info = {"recipe": recipe.label(), "steps": steps, "phases": recipe.describe(),
            "tokens": recipe.total_tokens(steps),
            "lr": recipe.LR, "seed": seed, "threads": threads, "device": device,
            "train_seconds": round(time.time() - t0, 1), "final_train_loss": float(np.mean(losses[-50:]))}
    return finish(model, family), info
