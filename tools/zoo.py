#!/usr/bin/env python3
"""Regenerate InferLab's model zoo: corpus, tokenizer, probes, models, goldens, cards.

    tools/.venv/bin/python tools/zoo.py all            # everything, in order
    tools/.venv/bin/python tools/zoo.py data           # corpus + tokenizer + probes
    tools/.venv/bin/python tools/zoo.py train tiny-mha # one model (train, evaluate, card)
    tools/.venv/bin/python tools/zoo.py golden tiny-mha
    tools/.venv/bin/python tools/zoo.py docs           # docs/model-zoo.md from the metrics
    tools/.venv/bin/python tools/zoo.py land           # staged models (data/staging) into the zoo

Options: --threads N (torch threads, default 1), --models a,b,c (subset for
`all`), --recipe NAME (default: each model's committed recipe, recipe.ZOO; v1 is the first zoo's 1M-token run and
--tokens N sets its budget), --device cuda (train on a GPU),
--train-docs N (corpus size for `data`).  Same library versions (tools/requirements.txt) and the same thread
count give the same bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

WORK = os.path.join(HERE, ".work")             # scratch (git-ignored)
CORPUS_DIR = os.path.join(ROOT, "data", "corpus")
MODELS_DIR = os.path.join(ROOT, "data", "models")
STAGING_DIR = os.path.join(ROOT, "data", "staging")  # a retraining's models until they land
GOLDEN_DIR = os.path.join(ROOT, "data", "golden")
TOKENIZER = os.path.join(CORPUS_DIR, "tokenizer.json")

CORPUS_SEED = 1234
N_TRAIN_DOCS = 9000
N_VAL_DOCS = 120
PROBES_PER_SET = 200
TRAIN_SEED = 0
# per model training settings (tokens are the same for every model)
TOKEN_BUDGET = 1_024_000          # 250 steps of 8 x 512 tokens
BATCH = 8
LR = 4e-3                          # peak learning rate, the same for every model


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def step_data(n_train: int = N_TRAIN_DOCS) -> None:
    import numpy as np
    import corpus
    from tokenizer_train import train_tokenizer
    from tokenizers import Tokenizer

    os.makedirs(WORK, exist_ok=True)
    os.makedirs(CORPUS_DIR, exist_ok=True)
    train_docs, val_docs = corpus.make_corpus(CORPUS_SEED, n_train, N_VAL_DOCS)
    with open(os.path.join(WORK, "train.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(train_docs) + "\n")
    with open(os.path.join(CORPUS_DIR, "val.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(val_docs) + "\n")
    with open(os.path.join(CORPUS_DIR, "train-sample.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(train_docs[:12]) + "\n")
    log(f"corpus: {len(train_docs)} train docs, {len(val_docs)} val docs")
    tok = train_tokenizer(train_docs)
    tok.save(TOKENIZER, pretty=True)
    tok = Tokenizer.from_file(TOKENIZER)
    for split, docs in (("train", train_docs), ("val", val_docs)):
        ids = [i for enc in tok.encode_batch(docs) for i in enc.ids]   # BOS before each doc
        np.save(os.path.join(WORK, f"{split}.npy"), np.array(ids, dtype=np.uint16))
        log(f"{split}: {len(ids)} tokens")

    def enc(s):
        return tok.encode(s, add_special_tokens=False).ids
    probes = corpus.make_probes(CORPUS_SEED, enc, PROBES_PER_SET)
    corpus.write_jsonl(os.path.join(CORPUS_DIR, "probes.jsonl"), probes)
    log(f"probes: {len(probes)}")


def info_path(name: str, models_dir: str) -> str:
    """Where a trained model's training record waits for its evaluation (scratch: the record ends
    up in metrics.json)."""
    tag = "" if models_dir == MODELS_DIR else "-" + os.path.basename(os.path.normpath(models_dir))
    return os.path.join(WORK, f"train-{name}{tag}.json")


def train_model(name: str, threads: int, tokens_budget: int, device: str, recipe_name: str,
                checkpoint: str | None = None):
    """Trains `name` from its seed with `recipe_name` and returns (model, training record): v1 is
    train.py's train(), the others tools/recipe.py's (saved to and resumed from `checkpoint`)."""
    import numpy as np
    import train as tr

    tokens = np.load(os.path.join(WORK, "train.npy"))
    if recipe_name == "v1":
        model, info = tr.train(name, tokens, seed=TRAIN_SEED, token_budget=tokens_budget, batch=BATCH,
                               lr=LR, threads=threads, device=device, log=log)
    else:
        import recipe
        from tokenizers import Tokenizer
        recipe.NAME = recipe_name
        tok = Tokenizer.from_file(TOKENIZER)
        model, info = tr.train_recipe(name, tokens, lambda s: tok.encode(s, add_special_tokens=False).ids,
                                      seed=TRAIN_SEED, threads=threads, device=device, checkpoint=checkpoint, log=log)
    return model, info


def extend_checkpoint(name: str, recipe_name: str, checkpoint: str) -> None:
    """Writes `checkpoint` as the state at the step where the committed model's training ended,
    when its phases are the first of `recipe_name`'s for `name` and the next phase restarts
    (a fresh optimiser, its own schedule): the committed weights are then exactly that state, so
    the run goes on from there as a run from the seed would (v3-relay's first 3,300 steps are
    v3's).  A checkpoint already there is left alone: its run resumes."""
    import torch
    import recipe
    import train as tr
    import zoo_models as zm

    if os.path.exists(checkpoint):
        return
    record = os.path.join(MODELS_DIR, name, "metrics.json")
    if not os.path.exists(record):
        sys.exit(f"--extend: no committed {name} to start from ({record} is missing)")
    with open(record) as f:
        done = json.load(f)["training"]
    recipe.NAME, recipe.MODEL = recipe_name, name
    planned = json.loads(json.dumps(recipe.describe()))
    k = len(done["phases"])
    if planned[:k] != done["phases"] or k >= len(planned) or not planned[k].get("restart"):
        sys.exit(f"--extend: {name} was trained with {done['recipe']}, whose phases are not the first of "
                 f"{recipe.label()}'s followed by a phase that restarts the optimiser")
    model = zm.load(name, os.path.join(MODELS_DIR, name))
    step = sum(p["steps"] for p in done["phases"])
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    torch.save({"model": model.state_dict(), "opt": tr.optimiser(model, recipe.LR).state_dict(), "step": step,
                "elapsed": done["train_seconds"], "losses": [], "phases": recipe.describe()}, checkpoint)
    log(f"{name}: {recipe_name} starts at step {step} from the committed {done['recipe']} model")


def step_train(name: str, threads: int, tokens_budget: int = TOKEN_BUDGET, device: str = "cpu",
               recipe_name: str = "v3", models_dir: str = MODELS_DIR, extend: bool = False) -> None:
    """Trains one model and saves it, with its metrics and card, under models_dir/name.  Recipe
    v1 is train.py's train(); v2 and v3 are tools/recipe.py's, checkpointed to tools/.work/ckpt/
    as they go, so that an interrupted run resumes where it stopped.  With `extend`, the run
    starts where the committed model's training ended (extend_checkpoint)."""
    import zoo_models as zm

    checkpoint = os.path.join(WORK, "ckpt", f"{name}-{recipe_name}.pt")
    if extend:
        extend_checkpoint(name, recipe_name, checkpoint)
    model, info = train_model(name, threads, tokens_budget, device, recipe_name, checkpoint=checkpoint)
    out = os.path.join(models_dir, name)
    zm.save(name, model, out, TOKENIZER)
    with open(info_path(name, models_dir), "w") as f:
        json.dump(info, f, indent=2)
    log(f"{name}: saved")
    step_eval(name, threads, models_dir)


def step_eval(name: str, threads: int, models_dir: str = MODELS_DIR) -> None:
    import evaluate
    import zoo_models as zm
    out = os.path.join(models_dir, name)
    record = info_path(name, models_dir)
    if os.path.exists(record):
        with open(record) as f:
            info = json.load(f)
    else:  # scratch is gone (a fresh checkout): the training record is kept in metrics.json too
        with open(os.path.join(out, "metrics.json")) as f:
            info = json.load(f)["training"]
    model = zm.load(name, out)
    metrics = evaluate.evaluate(name, model, WORK, CORPUS_DIR, threads=threads)
    metrics["training"] = info
    metrics["params"] = zm.param_count(model)
    if name == "tiny-draft" and os.path.exists(os.path.join(models_dir, "tiny-mha", "model.safetensors")):
        import numpy as np
        target = zm.load("tiny-mha", os.path.join(models_dir, "tiny-mha"))
        metrics["agreement_with_tiny-mha"] = evaluate.agreement(model, target, np.load(os.path.join(WORK, "val.npy")))
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
        f.write("\n")
    log(f"{name}: {json.dumps({k: v for k, v in metrics.items() if k != 'training'})}")
    import cards
    cards.write_card(name, out)


def step_golden(name: str, threads: int) -> None:
    import golden
    golden.make_golden(name, os.path.join(MODELS_DIR, name), os.path.join(GOLDEN_DIR, name),
                       threads=threads)


def has_staged() -> bool:
    """Whether data/staging holds a trained model (a retraining is under way)."""
    import zoo_models as zm
    return any(os.path.exists(os.path.join(STAGING_DIR, n, "metrics.json")) for n in zm.ORDER)


def step_land(names: list[str]) -> None:
    """Moves staged models (data/staging/NAME) over the zoo's (data/models/NAME); main() then
    writes their goldens, checks them against the cards and redraws the page and the plot."""
    import shutil
    for name in names:
        src, dst = os.path.join(STAGING_DIR, name), os.path.join(MODELS_DIR, name)
        if not os.path.exists(os.path.join(src, "metrics.json")):
            sys.exit(f"{src} holds no trained model (no metrics.json)")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.move(src, dst)
        log(f"{name}: {src} -> {dst}")


def main() -> None:
    import recipe
    import zoo_models as zm
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["all", "data", "train", "eval", "golden", "card", "docs", "land"])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default=",".join(zm.ORDER))
    ap.add_argument("--tokens", type=int, default=TOKEN_BUDGET,
                    help="training tokens per model for recipe v1 (v2 and v3 fix theirs)")
    ap.add_argument("--device", default="cpu", help="training device (cpu, cuda); goldens always run on the CPU")
    ap.add_argument("--recipe", default=None, choices=["v1", *recipe.RECIPES],
                    help="training recipe (default: each model's committed one, recipe.ZOO: v3; v3-games "
                         "for tiny-mamba and tiny-lti; v3-relay for tiny-swa, tiny-hybrid and tiny-mdlm): v3 tools/recipe.py's, "
                         "v3-games v3 with memory games first for the state-space models, v3-relay v3 then far "
                         "story answers for the windowed ones and tiny-mdlm, v2 its first try, "
                         "v1 train.py's train() (the first zoo: 1M tokens, no retrieval)")
    ap.add_argument("--extend", action="store_true",
                    help="train: start from the committed model where the recipe only adds phases after its own, "
                         "the first of them restarting the optimiser (v3-relay after v3)")
    ap.add_argument("--models-dir", default=MODELS_DIR,
                    help="where `train`, `eval` and `card` put the models (default data/models; another folder stages a retraining)")
    ap.add_argument("--train-docs", type=int, default=N_TRAIN_DOCS,
                    help="training documents for `data` (the committed zoo uses the default; more documents "
                         "rewrite data/corpus, tokenizer included)")
    a = ap.parse_args()
    names = a.names or a.models.split(",")
    if a.step in ("all", "data"):
        step_data(a.train_docs)
        import check_window
        if check_window.main() != 0:
            sys.exit("sliding-window semantics changed: see tools/check_window.py")
    if a.step in ("all", "train"):
        for n in names:
            step_train(n, a.threads, a.tokens, a.device, a.recipe or recipe.zoo_recipe(n), a.models_dir, a.extend)
    if a.step == "eval":
        for n in names:
            step_eval(n, a.threads, a.models_dir)
    if a.step == "land":
        step_land(names)
    if a.step in ("all", "golden", "land"):
        for n in names:
            step_golden(n, a.threads)
        import check_cards
        if not all([check_cards.check(n) for n in names]):
            sys.exit("a golden disagrees with the card-based re-implementation (tools/check_cards.py)")
    if a.step == "card":
        import cards
        for n in names:
            cards.write_card(n, os.path.join(a.models_dir, n))
    if a.step in ("all", "docs", "card", "land"):
        import cards
        cards.write_zoo_doc(os.path.join(ROOT, "docs", "model-zoo.md"))
        import plot_zoo
        plot_zoo.plot(MODELS_DIR, os.path.join(ROOT, "docs", "zoo-recall.svg"))
        staged_plot = os.path.join(ROOT, "docs", "zoo-recall-v3.svg")
        if has_staged():
            plot_zoo.plot(STAGING_DIR, staged_plot)
        elif os.path.exists(staged_plot):
            os.remove(staged_plot)


if __name__ == "__main__":
    main()
