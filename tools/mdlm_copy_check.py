#!/usr/bin/env python3
"""Does a tiny-mdlm checkpoint copy from its context?  Two fills, greedy, the mask token excluded:

* copy: BOS, random tokens, a 16-token span repeated after a gap of 0-15 tokens; the copy's last
  two tokens masked (the fourteen before them visible), with the row ending at the copy or going
  on with random tokens.  Only copying fills these (chance is 1/1022);
* text: 128-token windows of the validation corpus with 10% of the tokens masked at random.

    tools/.venv/bin/python tools/mdlm_copy_check.py data/models/tiny-mdlm [another folder ...]

docs/model-zoo.md ("tiny-mdlm misses its target") quotes it.
"""
from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import zoo_models as zm  # noqa: E402

WORK = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".work")


def fill_accuracy(model, rows: list[tuple[list[int], list[int]]]) -> float:
    """The fraction of masked positions whose greedy fill is the original token."""
    hit = tot = 0
    for ids, masked in rows:
        x = torch.tensor([ids])
        inp = x.clone()
        inp[0, masked] = zm.MASK
        with torch.no_grad():
            logits = zm.logits_of(model, inp)[0]
        logits[:, zm.MASK] = float("-inf")
        hit += sum(int(logits[p].argmax() == x[0, p]) for p in masked)
        tot += len(masked)
    return hit / tot


def copy_rows(rng: random.Random, at_end: bool, n: int = 200, span: int = 16) -> list:
    rows = []
    for _ in range(n):
        ids = [zm.BOS] + [rng.randrange(2, zm.VOCAB) for _ in range(96)]
        first = rng.randint(1, 20)
        second = first + span + rng.randint(0, 15)
        ids[second:second + span] = ids[first:first + span]
        if at_end:
            ids = ids[:second + span]
        rows.append((ids, [second + span - 2, second + span - 1]))
    return rows


def text_rows(rng: random.Random, val: np.ndarray, n: int = 20) -> list:
    rows = []
    for _ in range(n):
        s = rng.randrange(0, len(val) - 128)
        rows.append(([int(t) for t in val[s:s + 128]], rng.sample(range(128), 13)))
    return rows


def main() -> None:
    torch.set_num_threads(2)
    val = np.load(os.path.join(WORK, "val.npy"))
    for d in sys.argv[1:] or [os.path.join("data", "models", "tiny-mdlm")]:
        model = zm.load("tiny-mdlm", d).eval()
        rng = random.Random(0)
        end, middle = fill_accuracy(model, copy_rows(rng, True)), fill_accuracy(model, copy_rows(rng, False))
        text = fill_accuracy(model, text_rows(rng, val))
        print(f"{d}: copy fill {end:.3f} (row ends at the copy), {middle:.3f} (row goes on); "
              f"text fill {text:.3f} (10% masked)")


if __name__ == "__main__":
    main()
