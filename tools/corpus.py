"""Seeded synthetic corpus and probe sets for the InferLab model zoo.

Everything here is generated from a seed with Python's own `random.Random`,
so the same seed gives byte-identical files on any machine (no downloads).

Two kinds of documents:

* stories (half of the documents): short, simple English in the spirit of
  TinyStories.  Characters are introduced together with facts ("Mia painted
  her kite blue.", "Tom named his dog Bo.") and the story later asks about
  them and answers by repeating the fact ("What colour did Mia paint her kite?
  Mia painted her kite blue.").  Each object and animal occurs once per story,
  so the answer is whatever followed that noun earlier.  Facts and questions
  are separated by filler sentences, so answering needs attention over tens to
  hundreds of tokens.
* memory games: a list of key/value pairs of made-up words and digits,
  followed by queries ("Mia played a memory game: zob 7, kam 3, ... Then Mia
  asked: kam 3, zob 7.").  This is multi-query associative recall, the task
  used to separate state-space models from attention.

Probe sets (JSONL, one probe a line: prompt text, expected answer text, kind)
are built with the trained tokenizer so that the distance between a fact and
its question can be controlled in tokens.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

GIRLS = ["Mia", "Lily", "Anna", "Lucy", "Emma", "Zoe", "Kate", "Amy", "Ella", "Rose",
         "Ruby", "Lena", "Nina", "Ivy", "Maya", "Sara"]
BOYS = ["Tom", "Ben", "Sam", "Max", "Jack", "Leo", "Tim", "Dan", "Finn", "Noah",
        "Jake", "Owen", "Hugo", "Paul", "Carl", "Eli"]
NAMES = GIRLS + BOYS
OBJECTS = ["kite", "ball", "hat", "boat", "cup", "box", "bike", "coat", "book", "drum",
           "bag", "car", "doll", "shoe", "lamp", "sock"]
COLOURS = ["red", "blue", "green", "yellow", "pink", "black", "white", "brown",
           "orange", "purple", "grey", "gold"]
ANIMALS = ["dog", "cat", "bird", "fish", "frog", "duck", "rabbit", "horse", "cow",
           "pig", "goat", "mouse"]
PET_NAMES = ["Bo", "Pip", "Dot", "Fuzz", "Buddy", "Coco", "Milo", "Luna", "Bella",
             "Rocky", "Daisy", "Oscar", "Teddy", "Sunny", "Pepper", "Ziggy"]
FOODS = ["cake", "soup", "bread", "rice", "pie", "cheese", "pasta", "eggs",
         "honey", "carrots", "grapes", "cookies"]
PLACES = ["the park", "the shop", "the beach", "the farm", "the garden", "the school",
          "the lake", "the woods", "the zoo", "the market"]
# made-up keys for the memory game: consonant-vowel-consonant words (a few real
# words removed)
KEYS = sorted({a + b + c for a in "bdgkmpz" for b in "aiou" for c in "bgkmnp"} - {
    "bag", "big", "bog", "bug", "dig", "dog", "dug", "gum", "gun", "kin", "mop", "map",
    "mug", "pig", "pin", "pop", "pup", "zip", "bun", "bib", "dim", "din", "dip", "gap",
    "kip", "mum", "nap", "pan", "pun", "pip", "bum", "bin", "bab", "bob"})

FILLER = [
    "{a} went to {place}.",
    "The sun was warm and the sky was clear.",
    "{a} and {b} played a game.",
    "They laughed and ran around.",
    "A little bird sang in a tree.",
    "{a} ate some {food}.",
    "It began to rain, so they went inside.",
    "{a} said, \"I am happy today.\"",
    "{b} smiled at {a}.",
    "They sat under a big tree.",
    "{a} found a shiny stone.",
    "The wind blew the leaves.",
    "{b} was a little sad, but {a} helped.",
    "They drew a picture together.",
    "{a} jumped over a puddle.",
    "Mom made {food} for dinner.",
    "{b} sang a song.",
    "{a} looked at the clouds.",
    "They walked to {place} and back.",
    "{a} gave {b} a hug.",
    "The day was long and fun.",
    "{b} counted the stars at night.",
    "{a} read a story to {b}.",
    "A big truck drove by.",
    "{a} felt sleepy and took a nap.",
    "{b} wanted to go to {place}.",
    "They shared the {food}.",
    "{a} heard a funny noise.",
    "It was only the wind.",
    "{b} and {a} were good friends.",
    "{a} cleaned the room.",
    "The cat next door came to play.",
    "{b} asked, \"Can we play again?\"",
    "{a} said yes.",
    "They built a tower of blocks.",
    "The tower fell down, and they laughed.",
]


@dataclass
class Fact:
    kind: str
    statement: str   # full sentence, ends with the answer then "."
    question: str    # question sentence
    cue: str         # text that precedes the answer when the story answers
    answer: str      # answer text (one or two tokens)


def _pos(name: str) -> str:
    return "her" if name in GIRLS else "his"


def make_fact(rng: random.Random, kind: str, name: str, used: dict) -> Fact:
    """Facts are phrased so that the answer directly follows a noun that is
    unique within the story (every object and animal appears once per story):
    recalling the answer means finding that noun again, however far back."""
    pos = _pos(name)
    if kind == "colour":
        obj = rng.choice([o for o in OBJECTS if o not in used.setdefault("obj", set())])
        used["obj"].add(obj)
        col = rng.choice(COLOURS)
        cue = f"{name} painted {pos} {obj}"
        return Fact(kind, f"{cue} {col}.", f"What colour did {name} paint {pos} {obj}?", cue, col)
    if kind == "pet":
        an = rng.choice([a for a in ANIMALS if a not in used.setdefault("animal", set())])
        used["animal"].add(an)
        pet = rng.choice(PET_NAMES)
        cue = f"{name} named {pos} {an}"
        return Fact(kind, f"{cue} {pet}.", f"What did {name} name {pos} {an}?", cue, pet)
    raise ValueError(kind)


FACT_KINDS = ["colour", "pet"]


def filler(rng: random.Random, names: list[str]) -> str:
    a, b = rng.sample(names, 2) if len(names) > 1 else (names[0], "Mom")
    return rng.choice(FILLER).format(a=a, b=b, place=rng.choice(PLACES), food=rng.choice(FOODS))


def answer_sentence(f: Fact) -> str:
    return f"{f.cue} {f.answer}."


def make_story(rng: random.Random) -> str:
    """One story: characters with facts early, questions answered later."""
    n_chars = rng.choice([2, 2, 3])
    names = rng.sample(NAMES, n_chars)
    used: dict = {}
    facts: list[Fact] = []
    parts = [f"Once upon a time there were {n_chars} friends: " +
             ", ".join(names[:-1]) + f" and {names[-1]}."]
    for nm in names:
        for k in FACT_KINDS:
            if rng.random() < 0.7:
                f = make_fact(rng, k, nm, used)
                facts.append(f)
                parts.append(f.statement)
    # body: filler, new facts and questions about earlier facts
    n_steps = rng.randint(20, 50)
    for _ in range(n_steps):
        r = rng.random()
        if r < 0.45:
            parts.append(filler(rng, names))
        elif r < 0.9 and facts:
            f = rng.choice(facts)
            parts.append(f"{f.question} {answer_sentence(f)}")
        else:
            nm = rng.choice(names)
            f = make_fact(rng, rng.choice(FACT_KINDS), nm, used)
            facts.append(f)
            parts.append(f.statement)
        if len(used.get("obj", ())) >= len(OBJECTS) - 1 or len(used.get("animal", ())) >= len(ANIMALS) - 1:
            break
    parts.append("The end.")
    return " ".join(parts)


def make_game(rng: random.Random, n_pairs: int | None = None, n_queries: int | None = None) -> str:
    """Memory game: key/value list then queries (multi-query associative recall).
    Each value directly follows its key, in the list and in the answers."""
    name = rng.choice(NAMES)
    n = n_pairs if n_pairs is not None else rng.randint(4, 32)
    keys = rng.sample(KEYS, n)
    vals = [str(rng.randint(0, 9)) for _ in range(n)]
    q = n_queries if n_queries is not None else rng.randint(max(2, n // 2), n + 4)
    asked = [rng.randrange(n) for _ in range(q)]
    return game_list(name, keys, vals) + ", ".join(f"{keys[i]} {vals[i]}" for i in asked) + "."


def game_list(name: str, keys: list[str], vals: list[str]) -> str:
    """The memory game up to its questions; training documents and probes share it."""
    return f"{name} played a memory game: " + ", ".join(f"{k} {v}" for k, v in zip(keys, vals)) + f". Then {name} asked: "


def make_document(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return make_story(rng)
    # one to three games in a document
    return " ".join(make_game(rng) for _ in range(rng.choice([1, 2, 3])))


def make_corpus(seed: int, n_train: int, n_val: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    train = [make_document(rng) for _ in range(n_train)]
    rng_v = random.Random(seed + 1_000_003)
    val = [make_document(rng_v) for _ in range(n_val)]
    return train, val


# ----------------------------------------------------------------------------
# probes


def make_recall_probe(rng: random.Random, tok, distance: int) -> dict:
    """A story whose target fact's answer token sits `distance` tokens before
    the position where the model must produce the answer again.

    Layout: intro, target fact, filler (with one same-kind distractor fact about
    another character placed in the middle), question, cue.  Filler is added
    sentence by sentence until the measured token distance is as close as
    possible to `distance` from below; the actual distance is recorded.
    """
    names = rng.sample(NAMES, 3)
    used: dict = {}
    kind = rng.choice(FACT_KINDS)
    target = make_fact(rng, kind, names[0], used)
    distractor = make_fact(rng, kind, names[1], used)
    while distractor.answer == target.answer:
        distractor = make_fact(rng, kind, names[1], used)
    intro = (f"Once upon a time there were 3 friends: {names[0]}, {names[1]} and {names[2]}.")
    head = f"{intro} {target.statement}"
    tail = f"{target.question} {target.cue}"
    # position (index in token list) of the answer in the fact statement
    stmt_prefix_ids = tok(f"{intro} {target.cue}")
    ans_pos = len(stmt_prefix_ids)  # first answer token index
    def build(fl: list[str]) -> str:
        k = len(fl) // 2
        return " ".join([head] + fl[:k] + [distractor.statement] + fl[k:] + [tail])

    fillers: list[str] = []
    best = None
    while True:
        body = build(fillers)
        d = len(tok(body)) - ans_pos  # the answer is predicted at index len(ids)
        if d > distance:
            break
        best = (body, d)
        if d == distance:
            break
        fillers.append(filler(rng, names))
    if best is None:
        best = (body, d)
    body, d = best
    # ans_pos points at the answer only if the cue tokenizes as a prefix of the statement
    assert tok(head)[:ans_pos] == stmt_prefix_ids, head
    return {"kind": f"recall_{distance}", "fact_kind": kind, "prompt": body,
            "answer": " " + target.answer, "distance": d,
            "distractor": " " + distractor.answer}


def make_ar_probe(rng: random.Random, n_pairs: int) -> dict:
    name = rng.choice(NAMES)
    keys = rng.sample(KEYS, n_pairs)
    vals = [str(rng.randint(0, 9)) for _ in range(n_pairs)]
    i = rng.randrange(n_pairs)
    prompt = game_list(name, keys, vals) + keys[i]
    return {"kind": f"ar_{n_pairs}", "prompt": prompt, "answer": " " + vals[i], "key_index": i}


# Recall distances on both sides of tiny-swa's receptive field (a window of 64, four layers: at
# most 252 tokens back), and associative recall from few pairs to more than the training games
# hold (4-48), so that a fixed-size state's fall shows.  Each set has its own seed, so adding one
# leaves the others' probes as they were.
PROBE_SETS = [("recall", d) for d in (32, 48, 64, 96, 128, 192, 256, 320, 400)] + \
             [("ar", n) for n in (4, 8, 16, 32, 64)]


def make_probes(seed: int, tok, per_set: int) -> list[dict]:
    out = []
    for kind, n in PROBE_SETS:
        rng = random.Random(f"{seed}-{kind}-{n}")
        for _ in range(per_set):
            out.append(make_recall_probe(rng, tok, n) if kind == "recall" else make_ar_probe(rng, n))
    return out


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
