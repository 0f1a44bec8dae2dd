"""The zoo's training recipes: data stream and schedule (tools/train.py's train_recipe;
tools/probe_curve.py --recipe v2|v3 measures them).  The zoo is trained with v3 (tools/zoo.py's
default); v2 was its first try, and train.py's train() is the first zoo's recipe v1;
docs/model-zoo.md records what each measured.

Why a recipe of its own: at the first recipe's budget (250 steps of 8 x 512 tokens) every model
sat at chance on the probes.  What the probes need is copying from the context, and a small model
sits on the unigram plateau until an induction head forms, which takes some 80-180K rows that
only copying predicts (tools/induction_check.py; docs/model-zoo.md), so v3 spends its first phase
on nothing else, on short rows where a row is cheap.

A recipe is a list of phases (steps, tokens per row, rows per step, row kinds).  The rows of a
step take the phase's kinds in turn, and their contents are seeded by the step number only (so a
run resumes exactly where it stopped).  The kinds:

* text: a window of the training corpus, every position scored (the language model);
* copy: a corpus window in which one span of 4-16 tokens appears a second time further on
  (COPY_SOURCE "random": as rcopy); only the second copy is scored (after its first token,
  which nothing predicts).  This is the pattern the recall probes need ("Mia painted her kite"
  ... "Mia painted her kite" -> "blue"), at every distance the row allows;
* rcopy: the same with a span of 8-24 uniformly random tokens written into the window, which
  only copying predicts;
* induct: BOS and uniformly random tokens, a span of 8-16 of them repeated further on;
* recall: memory games (corpus.make_game, the multi-query associative recall task of the
  Zoology paper) packed into the row; only the queried values are scored;
* facts: stories (corpus.make_story) packed into the row; only the answers whose fact was last
  told FACT_FAR or more tokens before are scored: the story probes' task past a sliding window.

Every row's loss is the mean over its scored positions, and the step's loss is the mean over
rows, so a copy row (a dozen scored tokens) weighs as much as a text row (hundreds).  Learning
rate: linear warm-up, constant, linear decay over the last DECAY of the steps (of a restart
phase's steps, from its first, for the phases from one on).
"""
from __future__ import annotations

import random
from typing import NamedTuple

import numpy as np

import corpus
import zoo_models as zm

class Phase(NamedTuple):
    steps: int
    rows: int              # tokens per row
    batch: int             # rows per step
    mix: tuple[str, ...]   # the row kinds, in turn
    restart: bool = False  # begins with a fresh optimiser and its own warm-up and decay: it fine-tunes
                           # what the phases before it made, which end with their own decay


# Recipe v2: batches of 8, a third each of text, copy and recall rows, rows growing 128 -> 512.
V2 = [Phase(5000, 128, 8, ("text", "copy", "recall")),
      Phase(2500, 256, 8, ("text", "copy", "recall")),
      Phase(1500, 512, 8, ("text", "copy", "recall"))]
# Recipe v3: first the induction head, on rows where nothing else predicts anything, then the
# corpus, random spans copied over the whole row, and memory games, at the distances the probes
# use.  tools/induction_check.py --row 64 --batch 64 --span 24 --gap 15 forms the head by step
# 400 (25K rows); with spans of 12 and gaps up to 32 it took 1,200 steps with one seed and more
# than 1,500 with others; at batches of 8 it had not formed after 9,000.
V3 = [Phase(800, 64, 64, ("induct",)),
      Phase(1500, 256, 16, ("text", "rcopy", "recall")),
      Phase(1000, 512, 16, ("text", "rcopy", "recall"))]
# v3-games: v3 for every model but the two state-space ones, whose first phase is memory games
# instead of induction rows (docs/model-zoo.md: on games alone Mamba recalls where the
# time-invariant SSM cannot; neither learns from the induction rows).
# The relay phase: half the rows stories scored only on the answers told FACT_FAR or more tokens
# before.  A sliding window copies a fact inside its window after v3; beyond it, a fact must be
# carried from window to window through the positions between, which nothing in v3 asks for.
# "relay" alone is the calibration run (tools/probe_curve.py tiny-swa --recipe relay --init: the
# committed model fine-tuned); v3-relay is v3 followed by it, with a fresh optimiser.
RELAY = Phase(1500, 512, 16, ("facts", "text", "facts", "recall"), restart=True)
RECIPES = {"v2": V2, "v3": V3, "v3-games": V3, "v3-relay": V3, "relay": [RELAY._replace(restart=False)]}
NAME = "v3"              # the recipe train.train_recipe follows (tools/probe_curve.py --recipe sets it)
# Where one architecture needs its own hyper-parameter (the zoo table's recipe column then names
# it): recipe -> model -> (what differs, its phases).  Another was
#   {"v3": {"tiny-mdlm": ("2,400 induction steps", [V3[0]._replace(steps=2400), *V3[1:]])}}
# which is the tiny-mdlm run docs/model-zoo.md describes (not landed: its probes did not improve).
# The committed tiny-mamba and tiny-lti are v3-games, tiny-swa, tiny-hybrid and tiny-mdlm
# v3-relay; every other committed model is plain v3.
VARIANTS: dict[str, dict[str, tuple[str, list[Phase]]]] = {
    "v3-games": {m: ("memory games in place of the induction rows", [V3[0]._replace(mix=("recall",)), *V3[1:]])
                 for m in ("tiny-mamba", "tiny-lti")},
    "v3-relay": {m: ("then 1,500 steps of far story answers", [*V3, RELAY])
                 for m in ("tiny-swa", "tiny-hybrid", "tiny-mdlm")}}
# The recipe each committed model was trained with: what `zoo.py all`, `zoo.py train` without
# --recipe and check_repro.py follow, so that the pipeline regenerates the zoo as committed.
ZOO = {"tiny-mamba": "v3-games", "tiny-lti": "v3-games", "tiny-swa": "v3-relay", "tiny-hybrid": "v3-relay",
       "tiny-mdlm": "v3-relay"}


def zoo_recipe(name: str) -> str:
    return ZOO.get(name, "v3")


MODEL: str | None = None  # the model being trained (train.train_recipe sets it): picks its variant
KINDS = ("text", "copy", "rcopy", "induct", "recall", "facts")

LR = 3e-3
WARMUP = 100
DECAY = 0.15          # the last 15% of the steps decay linearly to 10% of LR
# What a v2 copy row repeats: a span of the corpus window itself ("corpus"), or a span of uniformly
# random tokens written into it ("random", the same as an rcopy row), which only copying predicts.
COPY_SOURCE = "corpus"
COPY_LENGTH = {"corpus": (4, 16), "random": (8, 24)}
INDUCT_SPAN = (16, 24)   # an induct row's span (tokens) ...
INDUCT_GAP = 15          # ... and the most tokens between its two copies
FACT_FAR = 48           # a facts row scores the answers whose fact was last told this far back
FIRST_ORDINARY = max(zm.BOS, zm.MASK) + 1  # random spans draw from the ordinary tokens
DATA_SEED = 1234


def _variant() -> tuple[str, list[Phase]] | None:
    return VARIANTS.get(NAME, {}).get(MODEL) if MODEL else None


def phases() -> list[Phase]:
    v = _variant()
    return v[1] if v else RECIPES[NAME]


def label() -> str:
    """The recipe's name, and what the current model's variant changes ("v3, 2,400 induction steps")."""
    v = _variant()
    return f"{NAME}, {v[0]}" if v else NAME


def override_mix(mix: tuple[str, ...]) -> None:
    """Every phase of the current recipe with `mix` as its row kinds (calibration runs)."""
    assert set(mix) <= set(KINDS), f"unknown row kinds in {mix}: the kinds are {KINDS}"
    RECIPES[NAME] = [p._replace(mix=mix) for p in RECIPES[NAME]]
    for model, (what, ps) in VARIANTS.get(NAME, {}).items():
        VARIANTS[NAME][model] = (what, [p._replace(mix=mix) for p in ps])


def describe() -> list[dict]:
    """The phases as the training record and checkpoints write them (restart only where set)."""
    return [{k: v for k, v in p._asdict().items() if k != "restart" or v} for p in phases()]


def total_steps() -> int:
    return sum(p.steps for p in phases())


def _stretch(step: int) -> tuple[int, int]:
    """(first step, steps) of the run of phases that `step` lies in: a restart phase begins one."""
    starts, at = [0], 0
    for p in phases():
        if p.restart and at > 0:
            starts.append(at)
        at += p.steps
    first = max(s for s in starts if s <= step)
    end = min([s for s in starts if s > step], default=at)
    return first, end - first


def restarts(step: int) -> bool:
    """Whether `step` is the first of a restart phase (the optimiser starts afresh)."""
    return step > 0 and _stretch(step)[0] == step


def phase(step: int) -> Phase:
    for p in phases():
        if step < p.steps:
            return p
        step -= p.steps
    return phases()[-1]


def row_length(step: int) -> int:
    return phase(step).rows


def total_tokens(steps: int) -> int:
    return sum(phase(s).rows * phase(s).batch for s in range(steps))


def learning_rate(step: int) -> float:
    first, total = _stretch(step)
    step -= first
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


def _score(scored: list[int], n: int) -> np.ndarray:
    """The score mask of a row of n positions for the tokens at the indices `scored` (the token
    at index m is predicted at position m - 1; indices past the row are dropped)."""
    mask = np.zeros(n, dtype=np.float32)
    for m in scored:
        if 1 <= m <= n:
            mask[m - 1] = 1
    return mask


class Stream:
    """Rows of the recipe for any step: tokens [rows, n + 1] and score masks [rows, n]."""

    def __init__(self, tokens: np.ndarray, encode):
        self.tokens = tokens
        self.encode = encode  # text -> ids (no BOS)
        self.colon = single(encode, ":")
        self.digits = {single(encode, f" {d}") for d in range(10)}
        self.nouns = {single(encode, f" {w}") for w in corpus.OBJECTS + corpus.ANIMALS}
        self.answers = {single(encode, f" {w}") for w in corpus.COLOURS + corpus.PET_NAMES}

    def _window(self, rng: random.Random, n: int) -> np.ndarray:
        start = rng.randrange(0, len(self.tokens) - n - 1)
        return self.tokens[start:start + n + 1].astype(np.int64)

    def _copy(self, rng: random.Random, n: int, source: str) -> tuple[np.ndarray, np.ndarray]:
        x = self._window(rng, n)
        length = rng.randint(*COPY_LENGTH[source])
        first = rng.randrange(0, n - 2 * length)
        second = rng.randrange(first + length, n + 1 - length)
        if source == "random":  # a span that only copying predicts
            x[first:first + length] = [rng.randrange(FIRST_ORDINARY, zm.VOCAB) for _ in range(length)]
        x[second:second + length] = x[first:first + length]
        mask = np.zeros(n, dtype=np.float32)
        mask[second:second + length - 1] = 1  # target t+1 is predicted at position t
        return x, mask

    @staticmethod
    def _induct(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
        """BOS and uniformly random tokens, a span of INDUCT_SPAN of them repeated after a gap of
        at most INDUCT_GAP: tools/induction_check.py's rows, where only an induction head lowers
        the loss."""
        x = np.array([zm.BOS] + [rng.randrange(FIRST_ORDINARY, zm.VOCAB) for _ in range(n)], dtype=np.int64)
        length = rng.randint(*INDUCT_SPAN)
        gap = rng.randint(0, min(INDUCT_GAP, n - 2 * length - 1))
        first = rng.randint(1, n - 2 * length - gap)
        second = first + length + gap
        x[second:second + length] = x[first:first + length]
        mask = np.zeros(n, dtype=np.float32)
        mask[second:second + length - 1] = 1
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
        return x, _score(scored, n)

    def _facts(self, rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray]:
        ids: list[int] = []
        scored: list[int] = []
        while len(ids) < n + 1:
            story = [zm.BOS] + self.encode(corpus.make_story(rng))
            told: dict[int, int] = {}  # noun -> where its answer last stood (every noun is told once a story)
            for j in range(1, len(story)):
                noun = story[j - 1]
                if noun in self.nouns and story[j] in self.answers:
                    if noun in told and j - told[noun] >= FACT_FAR:
                        scored.append(len(ids) + j)
                    told[noun] = j
            ids += story
        return np.array(ids[:n + 1], dtype=np.int64), _score(scored, n)

    @staticmethod
    def kinds(step: int) -> list[str]:
        """The kind of each of the step's rows."""
        p = phase(step)
        return [p.mix[(step * p.batch + r) % len(p.mix)] for r in range(p.batch)]

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        n = row_length(step)
        rng = random.Random(f"{DATA_SEED}-{step}")
        xs, ms = [], []
        for kind in self.kinds(step):
            if kind == "text":
                x, m = self._window(rng, n), np.ones(n, dtype=np.float32)
            elif kind == "copy":
                x, m = self._copy(rng, n, COPY_SOURCE)
            elif kind == "rcopy":
                x, m = self._copy(rng, n, "random")
            elif kind == "induct":
                x, m = self._induct(rng, n)
            elif kind == "facts":
                x, m = self._facts(rng, n)
            else:
                x, m = self._recall(rng, n)
            xs.append(x)
            ms.append(m)
        return np.stack(xs), np.stack(ms)
