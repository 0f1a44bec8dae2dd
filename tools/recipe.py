"""A candidate training recipe for the zoo (v2): data stream and schedule (tools/train.py's
train_recipe; tools/probe_curve.py --recipe v2 measures it).  The committed zoo is still trained
with train.py's train(); docs/model-zoo.md records what v2 measured so far.

Why a recipe of its own: at the first recipe's budget (250 steps of 8 x 512 tokens) every model
sat at chance on the probes.  What a small model needs to learn to copy from its context is
optimizer *steps*: it sits on the unigram plateau for the first ~2,000 of them whatever the
tokens, so steps are made cheap (short rows first) and the rows are made to teach retrieval.

Each step is `BATCH` rows.  A row is one of three kinds, in a seeded order that depends on the
step number only (so a run resumes exactly where it stopped):

* text: a window of the training corpus, every position scored (the language model);
* copy: a corpus window in which one span of 4-16 tokens appears a second time further on
  (COPY_SOURCE "random": a span of 8-24 random tokens written into the window, then repeated);
  only the second copy is scored (after its first token, which nothing predicts).  This is
  the induction-head pattern the recall probes need ("Mia painted her kite" ... "Mia painted
  her kite" -> "blue"), at every distance the row allows;
* recall: memory games (corpus.make_game, the multi-query associative recall task of the
  Zoology paper) packed into the row; only the queried values are scored.

Rows grow through the curriculum (PHASES: 128, then 256, then 512 tokens), so the distances a
row can hold grow with them.  Every row's loss is the mean over its scored positions, and the
step's loss is the mean over rows, so a copy row (a dozen scored tokens) weighs as much as a
text row (hundreds).  Learning rate: linear warm-up, constant, linear decay over the last
DECAY of the steps.
"""
from __future__ import annotations

import random

import numpy as np

import corpus
import zoo_models as zm

BATCH = 8
# (steps, row length): short rows first, where steps are cheap, then the distances probes use.
PHASES = [(5000, 128), (2500, 256), (1500, 512)]
LR = 3e-3
WARMUP = 100
DECAY = 0.15          # the last 15% of the steps decay linearly to 10% of LR
MIX = ("text", "copy", "recall")
# What a copy row repeats: a span of the corpus window itself ("corpus"), or a span of uniformly
# random tokens written into it ("random"), which only copying predicts; and the span's lengths.
COPY_SOURCE = "corpus"
COPY_LENGTH = {"corpus": (4, 16), "random": (8, 24)}
FIRST_ORDINARY = max(zm.BOS, zm.MASK) + 1  # random spans draw from the ordinary tokens
DATA_SEED = 1234


def total_steps() -> int:
    return sum(s for s, _ in PHASES)


def row_length(step: int) -> int:
    for s, n in PHASES:
        if step < s:
            return n
        step -= s
    return PHASES[-1][1]


def learning_rate(step: int) -> float:
    total = total_steps()
    start_decay = int(total * (1 - DECAY))
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    if step < start_decay:
        return LR
    return LR * (1 - 0.9 * (step - start_decay) / max(1, total - start_decay))


def single(encode, text: str) -> int:
    ids = encode(text)
    assert len(ids) == 1, f"{text!r} is not one token of the zoo's tokenizer: {ids}"
    return ids[0]


class Stream:
    """Rows of the recipe for any step: tokens [BATCH, n + 1] and score masks [BATCH, n]."""

    def __init__(self, tokens: np.ndarray, encode):
        self.tokens = tokens
        self.encode = encode  # text -> ids (no BOS)
        self.colon = single(encode, ":")
        self.digits = {single(encode, f" {d}") for d in range(10)}

    def _window(self, rng: random.Random, n: int) -> np.ndarray:
        start = rng.randrange(0, len(self.tokens) - n - 1)
        return self.tokens[start:start + n + 1].astype(np.int64)

    def _copy(self, rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
        x = self._window(rng, n)
        length = rng.randint(*COPY_LENGTH[COPY_SOURCE])
        first = rng.randrange(0, n - 2 * length)
        second = rng.randrange(first + length, n + 1 - length)
        if COPY_SOURCE == "random":  # a span that only copying predicts
            x[first:first + length] = [rng.randrange(FIRST_ORDINARY, zm.VOCAB) for _ in range(length)]
        x[second:second + length] = x[first:first + length]
        mask = np.zeros(n, dtype=np.float32)
        mask[second:second + length - 1] = 1  # target t+1 is predicted at position t
        return x, mask

    def _recall(self, rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
        ids: list[int] = []
        scored: list[int] = []
        while True:
            # a game's queries start after "Then NAME asked:"; its values are what is scored
            pairs = rng.randint(4, max(4, min(48, n // 8)))
            name = rng.choice(corpus.NAMES)
            keys = rng.sample(corpus.KEYS, pairs)
            vals = [str(rng.randint(0, 9)) for _ in range(pairs)]
            asked = [rng.randrange(pairs) for _ in range(rng.randint(max(2, pairs // 2), pairs + 4))]
            body = self.encode(corpus.game_list(name, keys, vals) + ", ".join(f"{keys[i]} {vals[i]}" for i in asked) + ".")
            # the scored values: every digit after the game's second ':' ("Then NAME asked:")
            start = [i for i, t in enumerate(body) if t == self.colon][1]
            marks = [i for i in range(start, len(body)) if body[i] in self.digits]
            game = [0] + body  # BOS first, as between documents
            if ids and len(ids) + len(game) > n + 1:
                break
            scored += [len(ids) + 1 + m for m in marks]
            ids += game
            if len(ids) >= n + 1:
                break
        fill = self._window(rng, n)
        x = np.concatenate([np.array(ids[:n + 1], dtype=np.int64), fill])[:n + 1]
        mask = np.zeros(n, dtype=np.float32)
        for m in scored:
            if 1 <= m <= n:
                mask[m - 1] = 1  # the value at index m is predicted at position m - 1
        return x, mask

    @staticmethod
    def kinds(step: int) -> list[str]:
        """The kind of each of the step's rows."""
        return [MIX[(step * BATCH + r) % len(MIX)] for r in range(BATCH)]

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        n = row_length(step)
        rng = random.Random(f"{DATA_SEED}-{step}")
        xs, ms = [], []
        for kind in self.kinds(step):
            if kind == "text":
                x, m = self._window(rng, n), np.ones(n, dtype=np.float32)
            elif kind == "copy":
                x, m = self._copy(rng, n)
            else:
                x, m = self._recall(rng, n)
            xs.append(x)
            ms.append(m)
        return np.stack(xs), np.stack(ms)
