"""Model cards (data/models/<name>/README.md) and docs/model-zoo.md, written from
each model's config.json, model.safetensors and metrics.json."""
from __future__ import annotations

import json
import os

import zoo_models as zm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

F32 = 4  # bytes per cached value: the zoo's weights and caches are float32

DESCRIPTION = {
    "tiny-mha": "Llama decoder with multi-head attention: one KV head per query head. The default model of the tour.",
    "tiny-gqa": "Llama decoder with grouped-query attention: 8 query heads share 2 KV heads (groups of 4).",
    "tiny-mqa": "Llama decoder with multi-query attention: all 8 query heads share 1 KV head.",
    "tiny-mla": "DeepSeek-V3 multi-head latent attention (dense MLP in every layer): the cache holds a 32-dim latent plus an 8-dim decoupled RoPE key per token and layer.",
    "tiny-cla": "Llama decoder with cross-layer attention (CLA2, Brandon et al. 2024): layers 1 and 3 reuse the K and V of layers 0 and 2.",
    "tiny-swa": "Llama-style decoder (transformers Ministral) where every layer attends to a sliding window of 64 tokens.",
    "tiny-hybrid": "Llama-style decoder (transformers Ministral): layers 0-2 use a 64-token sliding window, layer 3 is global.",
    "tiny-mamba": "Mamba (selective state-space model), 6 layers; the state has a fixed size whatever the length.",
    "tiny-lti": "The tiny-mamba stack with the selection removed: delta, B and C are learned per-channel constants (S4D-style linear time-invariant SSM).",
    "tiny-mdlm": "Bidirectional masked-diffusion language model (LLaDA/MDLM objective) on a Llama body without the causal mask.",
    "tiny-draft": "A much smaller Llama (2 layers, d=64) on the same tokenizer: the draft model for speculative sampling against tiny-mha.",
}


def kv_bytes(name: str, cfg: dict) -> dict:
    """KV-cache (or state) size in bytes, float32 values."""
    fam = zm.SPECS[name][0]
    ctx = zm.CTX
    if fam in ("llama", "ministral", "cla"):
        L = cfg["num_hidden_layers"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        per_layer = 2 * cfg["num_key_value_heads"] * hd * F32
        owners = L // cfg.get("kv_share_factor", 1)
        if fam == "ministral":
            w = cfg["sliding_window"]
            types = cfg["layer_types"]
            n_full = sum(t == "full_attention" for t in types)
            n_slide = len(types) - n_full
            per_tok = per_layer * len(types)
            at_ctx = per_layer * (n_full * ctx + n_slide * min(w, ctx))
            growth = per_layer * n_full
            note = (f"{per_tok} B per token while the sequence is shorter than the window ({w}); "
                    f"past it the {n_slide} sliding layer(s) stop growing, so the cache grows by "
                    f"{growth} B per token")
            return {"per_token": per_tok, "growth_per_token_long": growth, "at_512": at_ctx, "note": note}
        per_tok = per_layer * owners
        return {"per_token": per_tok, "growth_per_token_long": per_tok, "at_512": per_tok * ctx,
                "note": f"2 (K,V) x {owners} caching layer(s) x {cfg['num_key_value_heads']} KV heads x {hd} x 4 B"}
    if fam == "deepseek_v3":
        L = cfg["num_hidden_layers"]
        per = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * F32
        return {"per_token": per * L, "growth_per_token_long": per * L, "at_512": per * L * ctx,
                "note": f"{L} layers x ({cfg['kv_lora_rank']} latent + {cfg['qk_rope_head_dim']} RoPE key) x 4 B"}
    if fam in ("mamba", "lti"):
        L = cfg["num_hidden_layers"]
        d_in = cfg["intermediate_size"]
        st = d_in * (cfg["conv_kernel"] - 1 + cfg["state_size"]) * F32 * L
        return {"per_token": 0, "growth_per_token_long": 0, "at_512": st,
                "note": f"fixed {st} B per sequence: {L} layers x {d_in} channels x ((conv_kernel-1)={cfg['conv_kernel'] - 1} conv inputs + {cfg['state_size']} SSM states) x 4 B"}
    if fam == "mdlm":
        return {"per_token": None, "growth_per_token_long": None, "at_512": None,
                "note": "no KV cache: bidirectional attention, every denoising step recomputes the whole sequence"}
    raise ValueError(fam)


def _tensor_table(path: str) -> str:
    from safetensors import safe_open
    rows = ["| tensor | shape | dtype |", "| --- | --- | --- |"]
    with safe_open(path, "pt") as f:
        names = list(f.keys())

        def key(n):
            parts = n.split(".")
            return [int(p) if p.isdigit() else p for p in parts]
        layer0 = [n for n in names if ".layers." not in n or ".layers.0." in n or ".layers.1." in n]
        for n in sorted(layer0, key=key):
            t = f.get_slice(n)
            rows.append(f"| `{n}` | {list(t.get_shape())} | {t.get_dtype()} |")
    n_layers = len({n.split(".layers.")[1].split(".")[0] for n in names if ".layers." in n})
    rows.append(f"\nLayers 0 and 1 shown; layers 0..{n_layers - 1} repeat the pattern "
                f"({len(names)} tensors in all).")
    return "\n".join(rows)


def _fmt_bytes(b) -> str:
    if b is None:
        return "n/a"
    if b >= 1024 * 1024:
        return f"{b / 1024 / 1024:.2f} MiB"
    if b >= 1024:
        return f"{b / 1024:.1f} KiB"
    return f"{b} B"


# The zoo page's columns (every set is in the cards and the plot): recall inside tiny-swa's window,
# inside its four layers' reach and beyond it, and associative recall from few pairs to many.
PROBE_COLS = [("recall_32", "recall@32"), ("recall_128", "recall@128"), ("recall_256", "recall@256"),
              ("recall_400", "recall@400"), ("recall_400_distractor", "distractor@400"), ("ar_8", "AR 8 pairs"), ("ar_32", "AR 32 pairs"),
              ("ar_64", "AR 64 pairs")]


def probe_labels(pr: dict) -> list[tuple[str, str]]:
    """Every probe set a model was scored on, recall by distance then AR by pairs, with labels."""
    import re
    sets = [(m.group(1), int(m.group(2)), k) for k in pr if (m := re.fullmatch(r"(recall|ar)_(\d+)", k))]
    return [(k, f"recall@{n}" if kind == "recall" else f"AR {n} pairs")
            for kind, n, k in sorted(sets, key=lambda t: (t[0] != "recall", t[1]))]


def _load(name: str, model_dir: str) -> tuple[dict, dict, dict]:
    """A model folder's config.json, metrics.json and KV-cache bytes."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "metrics.json")) as f:
        met = json.load(f)
    return cfg, met, kv_bytes(name, cfg)


def _training_tokens(tr: dict) -> str:
    """The training budget in a card: v1's steps of 512-token sequences, or a recipe's phases."""
    if "phases" not in tr:
        return f"{tr['tokens']:,} ({tr['steps']} steps x {tr['batch']} sequences x {tr['seq_len']} tokens)"
    parts = "; ".join(f"{p['steps']:,} steps x {p['batch']} rows x {p['rows']} tokens ({', '.join(p['mix'])}"
                      f"{'; a fresh optimiser and schedule' if p.get('restart') else ''})"
                      for p in tr["phases"])
    return f"{tr['tokens']:,}, recipe {tr['recipe']} (`tools/recipe.py`): {parts}"


def _probe_note(tr: dict) -> str:
    """What a card says of its probes: the first recipe left every model at chance."""
    if tr.get("recipe", "v1") == "v1":
        return ("At the first recipe's training budget every model is still at chance level on these\n"
                "probes (see `docs/model-zoo.md`, \"Reading the table\").")
    return ("`docs/model-zoo.md` (\"Reading the table\") sets these beside the other models'; chance is\n"
            "1/12 for colours, 1/16 for pet names and 1/10 for digits.")


def _agreement_row(met: dict) -> str:
    """tiny-draft's card: how often it agrees with tiny-mha (chapter 10's acceptance rate)."""
    ag = met.get("agreement_with_tiny-mha")
    if not ag:
        return ""
    return (f"| agreement with tiny-mha | greedy {ag['greedy']:.3f} (same argmax), sampled {ag['sampled']:.3f} "
            f"(mean of sum min(p, q) at temperature 1), per position over {ag['positions']:,} validation tokens |\n")


def write_card(name: str, model_dir: str) -> None:
    import notes
    cfg, met, kv = _load(name, model_dir)
    tr = met["training"]
    pr = met["probes"]
    arch = cfg.get("architectures", ["?"])[0]
    cfg_rows = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in cfg.items()
                         if k not in ("architectures", "transformers_version", "torch_dtype", "dtype"))
    lossname = ("masked-diffusion ELBO (upper bound on NLL), nats/token" if met["val_loss_kind"] == "mdlm_elbo"
                else "next-token cross-entropy, nats/token")
    probe_rows = "\n".join(
        f"| {label} | {pr[k]:.3f} |" + (f" {pr[k + '_distractor']:.3f} |" if k + "_distractor" in pr else " - |")
        for k, label in probe_labels(pr))
    text = f"""# {name}

{DESCRIPTION[name]}

Part of the InferLab model zoo (see `docs/model-zoo.md`): every model is trained
from scratch on the same seeded synthetic corpus, tokenizer (byte-level BPE, 1024
tokens), context length ({zm.CTX}) and token budget, so differences in quality
belong to the technique.  Regenerate with `tools/.venv/bin/python tools/zoo.py all`
(see `tools/README.md`).

## Summary

| | |
| --- | --- |
| architecture | `{arch}` |
| parameters | {met['params']:,} (embedding tied to the output head) |
| KV cache / state | {_fmt_bytes(kv['per_token']) + ' per token' if kv['per_token'] else _fmt_bytes(kv['at_512']) if kv['at_512'] else 'n/a'}; at {zm.CTX} tokens: {_fmt_bytes(kv['at_512'])} |
| | {kv['note']} |
| training tokens | {_training_tokens(tr)} |
| training time | {tr['train_seconds']:.0f} s wall clock, {tr['threads']} CPU thread (a 2-core machine shared with other jobs) |
| seed | {tr['seed']} (data order seed 1234) |
| validation loss | {met['val_loss']:.4f} ({lossname}) |
| validation perplexity | {met['val_ppl']:.3f} |
{_agreement_row(met)}
## Probes

Exact greedy match of the answer token(s), {pr['n_per_set']} probes per set
(`data/corpus/probes.jsonl`).  recall\\@N: a fact stated about N tokens before the
answer position (a distractor fact of the same kind about another character sits
in between); AR: associative recall over N key/value pairs.

| probe | accuracy | picked the distractor |
| --- | --- | --- |
{probe_rows}

{_probe_note(tr)}

## Goldens

`data/golden/{name}/golden.safetensors` with `manifest.json`: reference outputs
computed in float64 ({'the project reference named in the manifest' if arch.startswith('InferLab') else 'transformers `' + arch + '`'}, eager attention) for
three fixed prompts: per-position logits, caches or states after the prompt,
greedy continuations (tiny-mdlm: first denoising step and a short sampling
run).  `tools/check_cards.py` recomputes them from this card's description
and the weights alone and agrees to about 1e-14.

## Config (`config.json`)

| key | value |
| --- | --- |
{cfg_rows}

## Tensors (`model.safetensors`, float32)

{_tensor_table(os.path.join(model_dir, 'model.safetensors'))}

{notes.NOTES[zm.SPECS[name][0]]}
"""
    with open(os.path.join(model_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(text)


def zoo_table(models_dir: str, only_trained: bool = False) -> str:
    """The zoo page's side-by-side table of the models in `models_dir`, linked from docs/."""
    rows = []
    for name in zm.ORDER:
        d = os.path.join(models_dir, name)
        if not os.path.exists(os.path.join(d, "metrics.json")):
            if not only_trained:
                rows.append(f"| {name} | (not trained) |" + " |" * (len(PROBE_COLS) + 6))
            continue
        cfg, met, kv = _load(name, d)
        pr = met["probes"]
        per = _fmt_bytes(kv["per_token"])
        if kv["per_token"] == 0:
            per = "0 (fixed state)"
        loss = f"{met['val_loss']:.3f}" + (" *" if met["val_loss_kind"] == "mdlm_elbo" else "")
        ppl = f"{met['val_ppl']:.2f}" + (" *" if met["val_loss_kind"] == "mdlm_elbo" else "")
        # staged models are named, not linked: the docs site holds data/models only
        label = f"`{name}`" if only_trained else \
            f"[{name}]({os.path.relpath(os.path.join(d, 'README.md'), os.path.join(ROOT, 'docs'))})"
        rows.append(
            f"| {label} | {met['params'] / 1e6:.2f} M | {per} | "
            f"{_fmt_bytes(kv['at_512'])} | {loss} | {ppl} | "
            + " | ".join(f"{pr[k]:.2f}" if k in pr else "-" for k, _ in PROBE_COLS)
            + f" | {met['training'].get('recipe', 'v1')} | {met['training']['train_seconds'] / 60:.1f} |")
    header = ("| model | params | KV bytes / token | cache at 512 tokens | val loss | val ppl | "
              + " | ".join(lbl for _, lbl in PROBE_COLS) + " | recipe | train min |\n"
              "| --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in PROBE_COLS) + " | --- | --- |")
    return header + "\n" + "\n".join(rows)


def write_zoo_doc(path: str) -> None:
    """docs/model-zoo.md from the models' metrics: the zoo's (data/models), and the staged
    retraining's (data/staging) while it has models there."""
    import notes
    import zoo
    table = zoo_table(zoo.MODELS_DIR)
    staged = zoo_table(zoo.STAGING_DIR, only_trained=True) if zoo.has_staged() else ""
    text = notes.ZOO_DOC.format(table=table, staging=notes.STAGING_DOC.format(table=staged) if staged else "")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
