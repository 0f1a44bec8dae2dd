#!/usr/bin/env python3
"""Can a zoo model's shape learn to copy, and which kind of copying?  A controlled experiment
beside tools/recipe.py: rows of uniformly random tokens in which a span of --span tokens appears
twice, the loss on the second copy only (after its first token), the zoo's optimiser (train.py's
setup) and a constant rate after 100 warm-up steps.  Prints the loss every 100 steps: ln 1024 =
6.93 means nothing is copied, near 0 means the span is found and copied.

    tools/.venv/bin/python tools/induction_check.py --fixed-start --gap 0     # position-anchored
    tools/.venv/bin/python tools/induction_check.py --gap 80                  # content-addressed
    tools/.venv/bin/python tools/induction_check.py --name tiny-hybrid --row 160 --batch 64 \
        --span 24 --min-gap 48 --gap 100                                       # past every window
    tools/.venv/bin/python tools/induction_check.py --name tiny-hybrid --row 160 --batch 64 \
        --span 24 --gap 100 --window 64              # near and far copies mixed, each kind's loss

With --fixed-start the first copy always starts right after BOS and, with --gap 0 (every row the
same gap), the second copy sits at a fixed position too: an attention head that looks a fixed
distance back solves it.  Without it, the span starts anywhere and the gap is drawn from 0..--gap
per row, so only an induction head (find the earlier occurrence of the current token, copy what
followed it) does.  tiny-mdlm gets the same rows with its own loss (train.mdlm_answer_loss: each
token of the second copy masked with probability t and filled in place, weighted by 1/t), so its
ln 1024 also means nothing is copied.  Nothing is saved.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import train as tr  # noqa: E402
import zoo_models as zm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="tiny-mha", choices=zm.ORDER)
    ap.add_argument("--span", type=int, default=16)
    ap.add_argument("--gap", type=int, default=80, help="the largest gap between the copies (tokens)")
    ap.add_argument("--min-gap", type=int, default=0,
                    help="the smallest gap: past a sliding window (span + gap > window), only a global layer can copy")
    ap.add_argument("--fixed-start", action="store_true", help="the first copy right after BOS, every gap --gap")
    ap.add_argument("--warm", type=int, default=0, help="steps at the start with no gap (the span still anywhere)")
    ap.add_argument("--global-layer", type=int, default=None,
                    help="tiny-hybrid: which of its layers is the global one (the zoo's is the last)")
    ap.add_argument("--row", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=None,
                    help="also print the loss of the rows whose copies lie --window or more tokens apart (span + gap: "
                         "past a sliding window of that size) and of the others")
    a = ap.parse_args()
    assert 0 <= a.min_gap <= a.gap, "--min-gap must lie between 0 and --gap"
    assert 2 * a.span + a.gap + 1 <= a.row, "--row must hold BOS, both copies and the gap"
    if a.global_layer is not None:
        family, kw = zm.SPECS[a.name]
        assert a.name == "tiny-hybrid" and 0 <= a.global_layer < 4, "--global-layer is for tiny-hybrid's 4 layers"
        zm.SPECS[a.name] = (family, {**kw, "layer_types": ["full_attention" if i == a.global_layer else
                                                           "sliding_attention" for i in range(4)]})
    model, family, opt = tr.setup(a.name, a.seed, 1, "cpu", a.lr)
    g = torch.Generator().manual_seed(a.seed)
    masking = torch.Generator().manual_seed(a.seed + 1)  # tiny-mdlm's mask draws
    t0 = time.time()
    for step in range(a.steps):
        x = torch.randint(2, zm.VOCAB, (a.batch, a.row + 1), generator=g)
        x[:, 0] = zm.BOS
        mask = torch.zeros(a.batch, a.row)
        far = torch.zeros(a.batch, dtype=torch.bool)
        for r in range(a.batch):
            gap = a.gap if a.fixed_start else 0 if step < a.warm else int(torch.randint(a.min_gap, a.gap + 1, (1,), generator=g))
            first = 1 if a.fixed_start else int(torch.randint(1, a.row + 1 - 2 * a.span - gap, (1,), generator=g))
            second = first + a.span + gap
            far[r] = a.window is not None and a.span + gap >= a.window
            x[r, second:second + a.span] = x[r, first:first + a.span]
            mask[r, second:second + a.span - 1] = 1  # target t + 1 is predicted at position t
        if family == "mdlm":  # the copy's tokens in place: the causal mask shifted by one
            scored = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)
            rows = tr.mdlm_answer_loss(model, x[:, :-1], scored, masking)
        else:
            rows = tr.causal_loss(model, x, mask)  # recipe v2's loss: each row's mean over its scored positions
        loss = rows.mean()
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, (step + 1) / 100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == a.steps - 1:
            split = ""
            if a.window is not None:
                parts = [f"{what} {rows[sel].mean().item():.3f} ({int(sel.sum())} rows)"
                         for what, sel in ((f"apart >= {a.window}", far), ("nearer", ~far)) if sel.any()]
                split = " [" + ", ".join(parts) + "]"
            print(f"step {step} copy loss {loss.item():.3f}{split} elapsed {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
