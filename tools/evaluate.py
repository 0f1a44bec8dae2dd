"""Validation loss / perplexity and probe accuracies for one zoo model.

* Validation: the held-out split (data/corpus/val.txt, tokenized with a BOS
  before each document, packed) cut into non-overlapping 512-token windows;
  mean next-token cross-entropy in nats, perplexity = exp(loss).  For tiny-mdlm
  the number is the masked-diffusion ELBO (an upper bound on the NLL) estimated
  with 8 stratified mask rates t = (k + 0.5) / 8 and seeded masks.
* Probes (data/corpus/probes.jsonl): a probe counts as correct when greedy
  decoding after the prompt reproduces every answer token exactly (checked
  teacher-forced: argmax at each answer position equals the answer token,
  which is the same thing).  tiny-mdlm instead gets the prompt followed by as
  many <|mask|> tokens as the answer has and must fill them all in one step.
  We also count how often the first predicted token is the distractor's (the
  same kind of fact about another character).
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

import zoo_models as zm


@torch.no_grad()
def val_loss(name: str, model, val_tokens: np.ndarray) -> float:
    seq = zm.CTX
    n = (len(val_tokens) - 1) // seq
    family = zm.SPECS[name][0]
    total, count = 0.0, 0
    gen = torch.Generator().manual_seed(4321)
    for i in range(0, n, 4):
        idx = range(i, min(n, i + 4))
        x = torch.from_numpy(np.stack([val_tokens[j * seq:j * seq + seq + 1] for j in idx]).astype(np.int64))
        if family == "mdlm":
            x0 = x[:, :-1]
            for k in range(8):
                t = (k + 0.5) / 8
                masked = torch.rand(x0.shape, generator=gen) < t
                xt = torch.where(masked, torch.full_like(x0, zm.MASK), x0)
                ce = F.cross_entropy(zm.logits_of(model, xt).transpose(1, 2), x0, reduction="none")
                total += float((ce * masked).sum() / t) / 8
            count += x0.numel()
        else:
            logits = zm.logits_of(model, x[:, :-1])
            total += float(F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="sum"))
            count += x[:, 1:].numel()
    return total / count


@torch.no_grad()
def probe_accuracy(name: str, model, probes: list[dict], tok) -> dict:
    family = zm.SPECS[name][0]
    items = []
    for p in probes:
        pids = [zm.BOS] + tok.encode(p["prompt"], add_special_tokens=False).ids
        full = [zm.BOS] + tok.encode(p["prompt"] + p["answer"], add_special_tokens=False).ids
        assert full[:len(pids)] == pids, p
        ans = full[len(pids):]
        dis = tok.encode(p["distractor"], add_special_tokens=False).ids[0] if "distractor" in p else None
        items.append((p["kind"], pids, ans, dis))
    right, dist_hits, totals = defaultdict(int), defaultdict(int), defaultdict(int)
    if family == "mdlm":
        for kind, pids, ans, dis in items:
            x = torch.tensor([pids + [zm.MASK] * len(ans)])
            logits = zm.logits_of(model, x)[0, len(pids):]
            logits[:, zm.MASK] = float("-inf")  # a fill is a token, never the mask (as ch08::sample_llada)
            pred = logits.argmax(-1).tolist()
            totals[kind] += 1
            right[kind] += int(pred == ans)
            dist_hits[kind] += int(dis is not None and pred[0] == dis)
    else:
        order = sorted(range(len(items)), key=lambda i: len(items[i][1]) + len(items[i][2]))
        bs = 16
        for s in range(0, len(order), bs):
            group = [items[i] for i in order[s:s + bs]]
            seqs = [pids + ans for _, pids, ans, _ in group]
            width = max(map(len, seqs))
            x = torch.tensor([q + [zm.BOS] * (width - len(q)) for q in seqs])  # right padding
            pred = zm.logits_of(model, x).argmax(-1)
            for r, (kind, pids, ans, dis) in enumerate(group):
                got = pred[r, len(pids) - 1:len(pids) - 1 + len(ans)].tolist()
                totals[kind] += 1
                right[kind] += int(got == ans)
                dist_hits[kind] += int(dis is not None and got[0] == dis)
    out = {}
    for kind in totals:
        out[kind] = round(right[kind] / totals[kind], 4)
        if kind.startswith("recall"):
            out[kind + "_distractor"] = round(dist_hits[kind] / totals[kind], 4)
    out["n_per_set"] = max(totals.values())
    return out


def evaluate(name: str, model, work_dir: str, corpus_dir: str, threads: int = 1) -> dict:
    from tokenizers import Tokenizer
    torch.set_num_threads(threads)
    val = np.load(os.path.join(work_dir, "val.npy"))
    tok = Tokenizer.from_file(os.path.join(corpus_dir, "tokenizer.json"))
    with open(os.path.join(corpus_dir, "probes.jsonl"), encoding="utf-8") as f:
        probes = [json.loads(line) for line in f]
    loss = val_loss(name, model, val)
    res = {"val_loss": round(loss, 4), "val_ppl": round(math.exp(loss), 3),
           "val_tokens": int(((len(val) - 1) // zm.CTX) * zm.CTX),
           "val_loss_kind": "mdlm_elbo" if zm.SPECS[name][0] == "mdlm" else "next_token_ce"}
    res["probes"] = probe_accuracy(name, model, probes, tok)
    return res


@torch.no_grad()
def agreement(draft, target, val_tokens: np.ndarray, windows: int = 16) -> dict:
    """How often a draft model agrees with its target, per position of validation text
    (teacher-forced over `windows` windows of 512): `greedy` the share of positions where the two
    argmaxes are the same token (greedy speculative decoding's acceptance rate), `sampled` the mean
    of sum_x min(p(x), q(x)) (speculative sampling's acceptance rate at temperature 1)."""
    seq = zm.CTX
    n = min(windows, (len(val_tokens) - 1) // seq)
    x = torch.from_numpy(np.stack([val_tokens[j * seq:(j + 1) * seq] for j in range(n)]).astype(np.int64))
    same, overlap = 0.0, 0.0
    for i in range(0, n, 4):
        lp, lq = zm.logits_of(draft, x[i:i + 4]), zm.logits_of(target, x[i:i + 4])
        same += float((lp.argmax(-1) == lq.argmax(-1)).sum())
        overlap += float(torch.minimum(lp.softmax(-1), lq.softmax(-1)).sum())
    total = x.numel()
    return {"greedy": round(same / total, 4), "sampled": round(overlap / total, 4), "positions": total}
