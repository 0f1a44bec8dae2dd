#!/usr/bin/env python3
"""Probe accuracy against training tokens: one zoo model, one long run, evaluated as it trains.

    tools/.venv/bin/python tools/zoo.py data        # once: tools/.work/{train,val}.npy
    tools/.venv/bin/python tools/probe_curve.py tiny-mha --tokens 12288000 --every 250
    tools/.venv/bin/python tools/probe_curve.py tiny-mha --recipe v3 --every 500
    tools/.venv/bin/python tools/probe_curve.py tiny-gqa --evaluate ckpt-*.pt   # saved checkpoints
    tools/.venv/bin/python tools/probe_curve.py tiny-swa --recipe relay --init   # fine-tune the committed model

Trains with the zoo's recipe (tools/train.py, same seed, batch and peak learning rate; the
cosine schedule stretched over --tokens), or with --recipe v2 or v3 a candidate of
tools/recipe.py (its own schedule; --steps stops early), and, every --every steps, prints one line
"PROBE <step> {json}" with the validation loss and every probe set's accuracy.  Nothing is
saved: this measures how large a budget the probes need before retraining the zoo with it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import evaluate as ev  # noqa: E402
import recipe  # noqa: E402
import train as tr  # noqa: E402
import zoo  # noqa: E402
import zoo_models as zm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name", choices=zm.ORDER)
    ap.add_argument("--tokens", type=int, default=12_288_000, help="training tokens (the zoo's recipe)")
    ap.add_argument("--recipe", choices=["v1", *recipe.RECIPES], default="v1",
                    help="v1: the committed zoo's; v2, v3: tools/recipe.py's")
    ap.add_argument("--copy", choices=["corpus", "random"], default=None, help="v2, v3: what a copy row repeats (recipe.COPY_SOURCE)")
    ap.add_argument("--mix", default=None, help="v2, v3: every phase's row kinds, comma-separated (recipe.KINDS), e.g. text,rcopy,recall")
    ap.add_argument("--steps", type=int, default=None, help="v2, v3: stop after this many steps")
    ap.add_argument("--every", type=int, default=250, help="steps between evaluations (a multiple of 25: train.py logs every 25)")
    ap.add_argument("--checkpoint", default=None, help="v2, v3: save the run there as it goes and resume from it")
    ap.add_argument("--fact-far", type=int, default=None,
                    help="facts rows: score the answers told at least this many tokens before (recipe.FACT_FAR, 48)")
    ap.add_argument("--init", action="store_true",
                    help="start from the committed weights (data/models/NAME) instead of the seed's initialisation")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--evaluate", nargs="+", metavar="CKPT", default=None,
                    help="train nothing: evaluate these training checkpoints (train_recipe's, e.g. copies of "
                         "tools/.work/ckpt/NAME-v3.pt taken as a run went) and print their PROBE lines")
    a = ap.parse_args()
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(zoo.TOKENIZER)
    with open(os.path.join(zoo.CORPUS_DIR, "probes.jsonl"), encoding="utf-8") as f:
        probes = [json.loads(line) for line in f]
    val = np.load(os.path.join(zoo.WORK, "val.npy"))
    if a.evaluate:
        import torch
        torch.set_num_threads(a.threads)
        rows = []
        for path in a.evaluate:
            state = torch.load(path, weights_only=False)
            m = zm.build(a.name, zoo.TRAIN_SEED)
            m.load_state_dict(state["model"])
            m.eval()
            rows.append((state["step"], {"val_loss": round(ev.val_loss(a.name, m, val), 4),
                                         **ev.probe_accuracy(a.name, m, probes, tok)}))
        for step, res in sorted(rows, key=lambda r: r[0]):
            print("PROBE", step, json.dumps(res), flush=True)
        return
    tokens = np.load(os.path.join(zoo.WORK, "train.npy"))

    built = {}
    build = zm.build

    def keep(name, seed):  # train.train builds the model itself; keep a handle to evaluate it
        built["model"] = build(name, seed)
        if a.init:
            built["model"].load_state_dict(zm.load(name, os.path.join(zoo.MODELS_DIR, name)).state_dict())
        return built["model"]
    zm.build = keep

    def report(step: str) -> None:
        m = built["model"]
        m.eval()
        device = next(m.parameters()).device
        m.to("cpu")
        res = {"val_loss": round(ev.val_loss(a.name, m, val), 4), **ev.probe_accuracy(a.name, m, probes, tok)}
        m.to(device)
        m.train()
        print("PROBE", step, json.dumps(res), flush=True)

    def log(msg: str) -> None:
        print(time.strftime("%H:%M:%S"), msg, flush=True)
        hit = re.search(r"step (\d+)/", msg)
        if hit and int(hit.group(1)) > 0 and int(hit.group(1)) % a.every == 0:
            report(hit.group(1))

    if a.recipe != "v1":
        recipe.NAME = a.recipe
        if a.copy:
            recipe.COPY_SOURCE = a.copy
        if a.fact_far is not None:
            recipe.FACT_FAR = a.fact_far
        if a.mix:
            recipe.override_mix(tuple(a.mix.split(",")))
        model, _ = tr.train_recipe(a.name, tokens, lambda s: tok.encode(s, add_special_tokens=False).ids,
                                   seed=zoo.TRAIN_SEED, threads=a.threads, device=a.device, stop_after=a.steps,
                                   checkpoint=a.checkpoint, log=log)
    else:
        model, _ = tr.train(a.name, tokens, seed=zoo.TRAIN_SEED, token_budget=a.tokens, batch=zoo.BATCH,
                            lr=zoo.LR, threads=a.threads, device=a.device, log=log)
    built["model"] = model
    report("final")


if __name__ == "__main__":
    main()
