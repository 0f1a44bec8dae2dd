#!/usr/bin/env python3
"""Which zoo models a stock Hugging Face stack loads as they are (docs/scale-out.md).

    tools/.venv/bin/python tools/check_hf_load.py [--models-dir data/models] [--golden-dir data/golden]
                                                   [--json FILE]

For every folder of the zoo, reads the first entry of config.json's `architectures`. Where
transformers has a class of that name, the folder should load: it is loaded with
AutoModelForCausalLM.from_pretrained (CPU, float32), its tokenizer with AutoTokenizer, and one
greedy forward of the golden's first prompt ("Once upon a time there were") is run. The folder
passes when the loaded class is the one named, no weight was left missing, unused or misshapen,
the tokenizer gives the golden's token ids, and the greedy next token is the golden's (computed
in float64 by the same class, data/golden/NAME/). Where transformers has no class of that name
(the project's own InferLab* architectures), the folder is listed with the reason and does not
fail the run.

Prints a table (folder, architecture, loads, why not) and the versions it ran with; exits 1 if
a folder that should load does not, 0 otherwise. Nothing is downloaded: every path is local.
"""
import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What runs each project-defined architecture instead (the chapters' executables).
RUN_INSTEAD = {
    "InferLabCLAForCausalLM": "ch05_cla",
    "InferLabLTIMambaForCausalLM": "ch07_mamba lti / recall",
    "InferLabMDLMForMaskedDiffusion": "ch08_diffusion_lm",
}


def golden_prompt(golden_dir: pathlib.Path, name: str):
    """The golden's first prompt: its text, input ids and greedy ids, or None without a golden."""
    manifest = golden_dir / name / "manifest.json"
    tensors = golden_dir / name / "golden.safetensors"
    if not manifest.exists() or not tensors.exists():
        return None
    from safetensors.numpy import load_file

    m = json.loads(manifest.read_text())
    g = load_file(str(tensors))
    return {
        "text": m["prompts"][0]["text"],
        "ids": [int(i) for i in g["prompt0.input_ids"]],
        "next": int(g["prompt0.greedy_ids"][0]),
        "last_logits": g.get("prompt0.last_logits_f64"),
        "bos": int(m["prompts"][0]["ids"][0]),
    }


def check_folder(folder: pathlib.Path, golden_dir: pathlib.Path):
    """One row: {folder, architecture, expected, loads, why, next_token, max_dlogit}."""
    import torch
    import transformers

    row = {"folder": folder.name, "architecture": "", "expected": False, "loads": False, "why": ""}
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        row["why"] = f"config.json unreadable: {e}"
        return row
    archs = config.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else ""
    row["architecture"] = arch or "(none)"
    if not arch:
        row["why"] = "config.json names no architecture"
        return row
    if getattr(transformers, arch, None) is None:
        instead = RUN_INSTEAD.get(arch)
        row["why"] = f"transformers has no class {arch}" + (f" (the project runs it: {instead})" if instead else "")
        return row
    row["expected"] = True
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=torch.float32, output_loading_info=True, local_files_only=True
        )
    except Exception as e:  # any refusal is the finding
        row["why"] = f"from_pretrained failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        return row
    model.eval()
    problems = []
    if type(model).__name__ != arch:
        problems.append(f"loaded as {type(model).__name__}")
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = list(info.get(key) or [])
        if keys:
            problems.append(f"{key.replace('_', ' ')}: {', '.join(str(k) for k in keys[:3])}" + (" ..." if len(keys) > 3 else ""))
    golden = golden_prompt(golden_dir, folder.name)
    text = golden["text"] if golden else "Once upon a time there were"
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        row["tokenizer"] = type(tok).__name__
    except Exception as e:
        problems.append(f"AutoTokenizer failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        tok = None
    if tok is not None:
        bos = golden["bos"] if golden else config.get("bos_token_id", 0)
        ids = [bos] + tok.encode(text, add_special_tokens=False)
        if golden and ids != golden["ids"]:
            problems.append(f"tokenizer gives {ids}, the golden {golden['ids']}")
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        if not torch.isfinite(logits).all():
            problems.append("non-finite logits")
        nxt = int(logits.argmax())
        row["next_token"] = f"{nxt} {tok.decode([nxt])!r}"
        if golden:
            if golden["last_logits"] is not None:
                ref = torch.from_numpy(golden["last_logits"])
                row["max_dlogit"] = float((logits - ref).abs().max())
            if nxt != golden["next"]:
                problems.append(f"greedy next token {nxt}, the golden's {golden['next']}")
        else:
            row["why_no_golden"] = "no golden to compare with"
    row["loads"] = not problems
    row["why"] = "; ".join(problems)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=pathlib.Path, default=ROOT / "data" / "models")
    ap.add_argument("--golden-dir", type=pathlib.Path, default=ROOT / "data" / "golden")
    ap.add_argument("--json", type=pathlib.Path, help="also write the rows and versions here")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"check_hf_load: needs torch and transformers ({e}); run it with tools/.venv/bin/python")
    torch.manual_seed(0)
    folders = sorted(p.parent for p in args.models_dir.glob("*/config.json"))
    if not folders:
        sys.exit(f"check_hf_load: no model folders (*/config.json) under {args.models_dir}")
    rows = [check_folder(f, args.golden_dir) for f in folders]

    header = ("folder", "architecture", "loads", "greedy next token", "max |Δlogit| vs f64", "why not")
    table = []
    for r in rows:
        loads = "yes" if r["loads"] else ("no" if r["expected"] else "no (not expected)")
        dl = f"{r['max_dlogit']:.1e}" if "max_dlogit" in r else ""
        table.append((r["folder"], r["architecture"], loads, r.get("next_token", ""), dl, r["why"]))
    widths = [max(len(str(c)) for c in col) for col in zip(header, *table)]
    for line in [header, tuple("-" * w for w in widths)] + table:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip())
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    print(f"transformers {versions['transformers']}, torch {versions['torch']}, CPU, float32")
    if args.json:
        args.json.write_text(json.dumps({"versions": versions, "rows": rows}, indent=2) + "\n")
    failed = [r["folder"] for r in rows if r["expected"] and not r["loads"]]
    if failed:
        print(f"check_hf_load: {len(failed)} folder(s) whose architecture transformers has did not load: "
              f"{', '.join(failed)}", file=sys.stderr)
        sys.exit(1)
    n = sum(r["expected"] for r in rows)
    print(f"check_hf_load: {n} of {len(rows)} folders name a transformers class, and all {n} load and match their goldens")


if __name__ == "__main__":
    main()
