#!/usr/bin/env python3
"""Retrain one zoo model from its seed, with the recipe it was committed with (recipe.ZOO), into a
temporary folder and compare the bytes of model.safetensors and config.json with the committed ones.

    tools/.venv/bin/python tools/check_repro.py tiny-draft [--threads N]

Needs `zoo.py data` to have been run (tools/.work/train.npy).  Use the thread
count the committed model was trained with (its card says which).
"""
import argparse
import filecmp
import os
import sys
import tempfile


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import recipe  # noqa: E402
import zoo  # noqa: E402
import zoo_models as zm  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    model, _ = zoo.train_model(a.name, a.threads, zoo.TOKEN_BUDGET, "cpu", recipe.zoo_recipe(a.name))
    ok = True
    with tempfile.TemporaryDirectory() as d:
        zm.save(a.name, model, d, zoo.TOKENIZER)
        for f in ("model.safetensors", "config.json"):  # tokenizer.json is copied, not trained
            same = filecmp.cmp(os.path.join(d, f), os.path.join(zoo.MODELS_DIR, a.name, f), shallow=False)
            print(f"{a.name}/{f}: {'identical' if same else 'DIFFERENT'}")
            ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
