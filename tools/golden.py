"""Golden outputs for one zoo model, computed in float64 by a reference that is
not InferLab's C++: the transformers class (Llama, DeepseekV3, Ministral, Mamba)
or, for the three architectures transformers lacks, the PyTorch references in
tools/ (ref_transformer.py for tiny-cla and tiny-mdlm, ref_lti_mamba.py for
tiny-lti; the first is cross-checked against LlamaForCausalLM here).

transformers casts some intermediates to float32 on purpose (RMSNorm input,
RoPE tables, the attention softmax, the Mamba scan).  To get a true float64
reference, golden.py runs the model with default dtype float64 and with
Tensor.float(), Tensor.to(torch.float32) and softmax(dtype=torch.float32)
redirected to float64 for the duration of the run;
the manifest records how far the plain float32 run of the same class is from
the float64 one.

Output (data/golden/<model>/): golden.safetensors and manifest.json.  Tensors
are computed in float64; logits and caches are stored as float32 (rounded from
float64) to keep the files small, the last-position logits of each prompt are
stored as float64 too.  Token ids are int64.
"""
from __future__ import annotations

import contextlib
import json
import os

import torch
from safetensors.torch import save_file

import zoo_models as zm

PROMPTS = [
    "Once upon a time there were",
    "Mia painted her kite blue. Tom painted his ball red. What colour did Mia paint her kite? "
    "Mia painted her kite",
    "Ben played a memory game: zob 7, kam 3, dup 5, gik 1. Then Ben asked: kam",
]
# sliding-window models also get a prompt longer than the window (64); only the
# logits of its last LONG_TAIL positions are stored, and its greedy continuation
LONG_PROMPT = " ".join(PROMPTS[1:] * 2)
LONG_TAIL = 8
GREEDY_TOKENS = 32
MDLM_GEN = 16
MDLM_STEPS = 8


@contextlib.contextmanager
def float64_everywhere():
    orig_float, orig_to = torch.Tensor.float, torch.Tensor.to
    orig_default = torch.get_default_dtype()

    def as_double(self, *a, **k):
        return self.double()

    def to64(self, *args, **kw):
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return orig_to(self, *args, **kw)

    orig_softmax = torch.nn.functional.softmax

    def softmax64(x, *args, **kw):  # eager attention asks for dtype=torch.float32
        if kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return orig_softmax(x, *args, **kw)

    torch.Tensor.float = as_double
    torch.Tensor.to = to64
    torch.nn.functional.softmax = softmax64
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.Tensor.float, torch.Tensor.to = orig_float, orig_to
        torch.nn.functional.softmax = orig_softmax
        torch.set_default_dtype(orig_default)


def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    """Weights for a tiny random golden model, drawn from `seed`: linear weights N(0, 1/fan_in),
    embeddings N(0, 1), vectors (norm weights) uniform in [0.75, 1.25].  An untrained model's
    usual init (std 0.02) would make every attention score and logit nearly equal, and a golden
    test on it would check little."""
    import math
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.ndim == 1:
                p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))


def save_rounded(tensors: dict, path: str, name: str) -> dict:
    """Writes a random model's goldens to `path` as the zoo stores them: float tensors rounded to
    float32, except those named *_f64 and the integer ones; returns each tensor's dtype and shape
    for the manifest."""
    out = {k: (v if (k.endswith("_f64") or not v.is_floating_point()) else v.to(torch.float32)).contiguous()
           for k, v in tensors.items()}
    save_file(out, path, metadata={"model": name})
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)} for k, v in sorted(out.items())}


def first_seed(name: str, seeds, attempt, min_margin: float):
    """Tries `attempt(seed)` for each seed in turn and returns (seed, its result) for the first
    whose greedy margin (the result's last item) exceeds `min_margin`: a random golden model whose
    greedy tokens float32 rounding cannot flip."""
    for seed in seeds:
        result = attempt(seed)
        if result[-1] > min_margin:
            return seed, result
    raise RuntimeError(f"{name}: no seed gives greedy margins above {min_margin}")


@torch.no_grad()
def greedy_reference(model, ids: list[int], greedy_tokens: int) -> tuple[dict, float]:
    """A random golden model's reference run over `ids`: logits at every position, the last row
    kept in float64, and `greedy_tokens` argmax tokens, each step recomputed from scratch (no cache
    of transformers' involved). Returns the tensors and the smallest top-two logit gap of the
    greedy steps (for first_seed)."""
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    seq, margin = list(ids), float("inf")
    for _ in range(greedy_tokens):
        top = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].topk(2)
        margin = min(margin, float(top.values[0] - top.values[1]))
        seq.append(int(top.indices[0]))
    return {"input_ids": torch.tensor(ids, dtype=torch.int64), "logits": logits.clone(),
            "last_logits_f64": logits[-1].clone(), "greedy_ids": torch.tensor(seq[len(ids):], dtype=torch.int64)}, margin


def write_random_set(out, names, make, manifest) -> None:
    """Makes a set of random golden models, `make(name)` each (one thread, deterministic
    algorithms: the same files on every run), and writes the set's manifest.json, built by
    `manifest(models)` from what the makes returned."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    models = [make(name) for name in names]
    (out / "manifest.json").write_text(json.dumps(manifest(models), indent=1) + "\n")
    print("wrote", out)


def random_manifest(what: str, tokens: int, greedy_tokens: int, meaning: dict, models: list) -> dict:
    """The manifest of a set of random transformers models and their greedy_reference goldens;
    `meaning` explains what a set adds to the shared tensors."""
    return {
        "what": what, "versions": _versions(), "compute_dtype": "float64", "attn_implementation": "eager",
        "tokens": tokens, "greedy_tokens": greedy_tokens,
        "meaning": {"input_ids": f"[{tokens}] uniform random ids (torch.Generator seeded with the seed)",
                    "logits": f"[{tokens}, vocab] at every position", "last_logits_f64": "[vocab], float64",
                    "greedy_ids": f"[{greedy_tokens}] argmax continuation, each step recomputed without a cache",
                    **meaning},
        "models": models,
    }


def _versions() -> dict:
    import safetensors
    import tokenizers
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}


def _hf_kv(cache, i):
    if hasattr(cache, "layers"):
        return cache.layers[i].keys, cache.layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


@torch.no_grad()
def _greedy(model, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        logits = zm.logits_of(model, torch.tensor([seq]))
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(ids):]


@torch.no_grad()
def mdlm_sample(model, ids: list[int], gen: int, steps: int):
    """LLaDA-style deterministic sampler: start from prompt + `gen` masks; at each
    of `steps` steps run the model on the whole sequence, take for every masked
    position the argmax token over the vocabulary without <|mask|> and its
    softmax probability, and commit the gen/steps masked positions with the
    highest probability (ties: lower position first).  Returns the final ids and,
    per generated position, the step (0-based) that committed it."""
    x = torch.tensor([ids + [zm.MASK] * gen])
    per = gen // steps
    when = [-1] * gen
    first_logits = None
    for s in range(steps):
        logits = zm.logits_of(model, x)[0]
        if first_logits is None:
            first_logits = logits.clone()
        logits[:, zm.MASK] = float("-inf")
        prob = torch.softmax(logits, dim=-1)
        conf, tok = prob.max(dim=-1)
        masked = (x[0] == zm.MASK).nonzero().flatten().tolist()
        ranked = sorted(masked, key=lambda p: (-float(conf[p]), p))[:per]
        for p in ranked:
            x[0, p] = tok[p]
            when[p - len(ids)] = s
    return x[0].tolist(), when, first_logits


def _capture_mla(model):
    """Hooks that keep MLA's latent cache: c_kv (after kv_a_layernorm) per layer."""
    store = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def hook(mod, inp, out, i=i):
            store[i] = out.detach().clone()
        hooks.append(layer.self_attn.kv_a_layernorm.register_forward_hook(hook))
    return store, hooks


@torch.no_grad()
def run_reference(name: str, model, tok) -> tuple[dict, dict]:
    family = zm.SPECS[name][0]
    tensors: dict[str, torch.Tensor] = {}
    info: dict = {"prompts": []}
    for p, text in enumerate(PROMPTS):
        ids = [zm.BOS] + tok.encode(text, add_special_tokens=False).ids
        pre = f"prompt{p}."
        tensors[pre + "input_ids"] = torch.tensor(ids, dtype=torch.int64)
        entry = {"text": text, "ids": ids, "n_tokens": len(ids)}
        x = torch.tensor([ids])
        if family == "mdlm":
            xin = ids + [zm.MASK] * MDLM_GEN
            final, when, first = mdlm_sample(model, ids, MDLM_GEN, MDLM_STEPS)
            tensors[pre + "masked_input_ids"] = torch.tensor(xin, dtype=torch.int64)
            tensors[pre + "logits"] = first.clone()
            tensors[pre + "last_logits_f64"] = first[-1].clone()
            tensors[pre + "sample_ids"] = torch.tensor(final, dtype=torch.int64)
            tensors[pre + "sample_commit_step"] = torch.tensor(when, dtype=torch.int64)
            entry["sample_text"] = tok.decode(final[len(ids):])
            info["prompts"].append(entry)
            continue
        if family in ("cla",):
            logits, kvs = model(x, return_kv=True)
            for i in range(0, len(kvs), model.cfg.kv_share_factor):
                tensors[pre + f"layer{i}.k"] = kvs[i][0][0].clone()
                tensors[pre + f"layer{i}.v"] = kvs[i][1][0].clone()
        elif family in ("mamba", "lti"):
            out = model(input_ids=x, use_cache=True)
            logits = out.logits
            cp = out.cache_params
            for i in range(model.config.num_hidden_layers):
                tensors[pre + f"layer{i}.conv_state"] = cp.conv_states[i][0].clone()
                tensors[pre + f"layer{i}.ssm_state"] = cp.ssm_states[i][0].clone()
        elif family == "deepseek_v3":
            store, hooks = _capture_mla(model)
            out = model(input_ids=x, use_cache=True)
            for h in hooks:
                h.remove()
            logits = out.logits
            nope = model.config.qk_nope_head_dim
            for i in range(model.config.num_hidden_layers):
                k, _ = _hf_kv(out.past_key_values, i)
                tensors[pre + f"layer{i}.c_kv"] = store[i][0].clone()
                tensors[pre + f"layer{i}.k_rope"] = k[0, 0, :, nope:].clone()
        else:
            out = model(input_ids=x, use_cache=True)
            logits = out.logits
            for i in range(model.config.num_hidden_layers):
                k, v = _hf_kv(out.past_key_values, i)
                tensors[pre + f"layer{i}.k"] = k[0].clone()
                tensors[pre + f"layer{i}.v"] = v[0].clone()
        tensors[pre + "logits"] = logits[0].clone()
        tensors[pre + "last_logits_f64"] = logits[0, -1].clone()
        g = _greedy(model, ids, GREEDY_TOKENS)
        tensors[pre + "greedy_ids"] = torch.tensor(g, dtype=torch.int64)
        entry["greedy_text"] = tok.decode(g)
        info["prompts"].append(entry)
    if family == "ministral":
        ids = [zm.BOS] + tok.encode(LONG_PROMPT, add_special_tokens=False).ids
        logits = zm.logits_of(model, torch.tensor([ids]))
        tensors["long.input_ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors["long.logits_tail"] = logits[0, -LONG_TAIL:].clone()
        tensors["long.last_logits_f64"] = logits[0, -1].clone()
        g = _greedy(model, ids, GREEDY_TOKENS)
        tensors["long.greedy_ids"] = torch.tensor(g, dtype=torch.int64)
        info["long_prompt"] = {"text": LONG_PROMPT, "ids": ids, "n_tokens": len(ids),
                               "greedy_text": tok.decode(g)}
    return tensors, info


def make_golden(name: str, model_dir: str, out_dir: str, threads: int = 1) -> None:
    from tokenizers import Tokenizer
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    family = zm.SPECS[name][0]
    checks = {}
    # float32 run of the same reference, for the record
    m32 = zm.load(name, model_dir, torch.float32)
    t32, _ = run_reference(name, m32, tok)
    with float64_everywhere():
        model = zm.load(name, model_dir, torch.float64)
        tensors, info = run_reference(name, model, tok)
        if family in ("cla", "mdlm"):
            diff = _cross_check_ref()
            # tiny-cla and tiny-mdlm have no transformers class: their reference must first equal
            # LlamaForCausalLM where the two coincide (tiny-mha, sharing and bidirection off)
            assert diff is not None, "golden for %s needs data/models/tiny-mha for the reference cross-check" % name
            assert diff < 1e-10, "RefTransformer differs from LlamaForCausalLM by %g" % diff
            checks["ref_transformer_vs_LlamaForCausalLM"] = diff
    checks["max_abs_logit_diff_float32_run"] = max(
        float((tensors[k].double() - t32[k].double()).abs().max())
        for k in tensors if k.endswith(".logits") or k.endswith(".logits_tail"))
    # storage dtypes (outside the float64 context): float32 except the *_f64 tensors
    out = {k: (v if (k.endswith("_f64") or not v.is_floating_point()) else v.to(torch.float32)).contiguous()
           for k, v in tensors.items()}
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, os.path.join(out_dir, "golden.safetensors"), metadata={"model": name})
    ref = {
        "llama": "transformers.LlamaForCausalLM",
        "ministral": "transformers.MinistralForCausalLM",
        "deepseek_v3": "transformers.DeepseekV3ForCausalLM",
        "mamba": "transformers.MambaForCausalLM",
        "lti": "tools/ref_lti_mamba.py (subclass of transformers.models.mamba.MambaMixer)",
        "cla": "tools/ref_transformer.py RefTransformer (kv_share_factor=2)",
        "mdlm": "tools/ref_transformer.py RefTransformer (causal=False)",
    }[family]
    manifest = {
        "model": name,
        "reference": ref,
        "versions": _versions(),
        "compute_dtype": "float64",
        "storage": {"logits, k, v, c_kv, k_rope, conv_state, ssm_state": "float32 (rounded from float64)",
                    "last_logits_f64": "float64", "ids": "int64"},
        "attn_implementation": "eager",
        "threads": threads,
        "prompt_encoding": "BOS (<|endoftext|>, id 0) + tokenizer.encode(text, add_special_tokens=False)",
        **info,
        "tensors": {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                    for k, v in sorted(out.items())},
        "checks": checks,
        "meaning": _meaning(family),
    }
    if family == "mdlm":
        manifest["sampler"] = {"gen_tokens": MDLM_GEN, "steps": MDLM_STEPS,
                               "tokens_per_step": MDLM_GEN // MDLM_STEPS,
                               "rule": " ".join(mdlm_sample.__doc__.split())}
    else:
        manifest["greedy"] = {"new_tokens": GREEDY_TOKENS, "rule": "argmax of the last position's "
                              "logits, appended, repeated; no stop token"}
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")


def _meaning(family: str) -> dict:
    m = {"promptP.input_ids": "prompt token ids (BOS first)",
         "promptP.logits": "[T, vocab] logits at every position of the prompt",
         "promptP.last_logits_f64": "[vocab] logits at the last prompt position, float64"}
    if family == "mdlm":
        m.update({"promptP.masked_input_ids": "prompt ids followed by 16 <|mask|> (id 1)",
                  "promptP.logits": "[T+16, vocab] logits of the first denoising step on masked_input_ids",
                  "promptP.last_logits_f64": "float64 logits of the last (masked) position, first step",
                  "promptP.sample_ids": "final ids after the deterministic sampler (see sampler)",
                  "promptP.sample_commit_step": "[16] step (0-based) at which each generated position was committed"})
        return m
    m["promptP.greedy_ids"] = "[32] greedy continuation (new tokens only)"
    if family == "ministral":
        m["long.input_ids"] = "a prompt longer than the sliding window"
        m["long.logits_tail"] = f"[{LONG_TAIL}, vocab] logits at its last {LONG_TAIL} positions"
        m["long.last_logits_f64"] = "[vocab] logits at its last position, float64"
        m["long.greedy_ids"] = "[32] greedy continuation of the long prompt"
    if family in ("llama", "ministral"):
        m["promptP.layerL.k / .v"] = ("[n_kv_heads, T, head_dim] KV cache after prefill; k after RoPE "
                                      "(transformers DynamicCache contents)")
    if family == "cla":
        m["promptP.layerL.k / .v"] = ("[n_kv_heads, T, head_dim] KV cache after prefill for the layers that "
                                      "own one (L % kv_share_factor == 0); k after RoPE")
    if family == "deepseek_v3":
        m["promptP.layerL.c_kv"] = "[T, kv_lora_rank] latent cache: kv_a_layernorm(first kv_lora_rank outputs of kv_a_proj_with_mqa)"
        m["promptP.layerL.k_rope"] = "[T, qk_rope_head_dim] decoupled RoPE key (last outputs of kv_a_proj_with_mqa) after RoPE"
    if family in ("mamba", "lti"):
        m["promptP.layerL.conv_state"] = ("[d_inner, conv_kernel] transformers MambaCache conv state after "
                                          "prefill: the last conv_kernel (=4) pre-conv inputs x (oldest first, "
                                          "zero-padded on the left if the prompt is shorter), newest included")
        m["promptP.layerL.ssm_state"] = "[d_inner, state_size] SSM state h after the last prompt token"
    return m


def _cross_check_ref() -> float | None:
    """Max |logit difference| between RefTransformer and LlamaForCausalLM, both
    float64, on tiny-mha's trained weights (the plain Llama case of the reference)."""
    import zoo
    from ref_transformer import RefTransformer
    from safetensors.torch import load_file
    d = os.path.join(zoo.MODELS_DIR, "tiny-mha")
    if not os.path.exists(os.path.join(d, "model.safetensors")):
        return None
    hf = zm.load("tiny-mha", d, torch.float64)
    ref = RefTransformer(zm.ref_config("tiny-mha")).double()
    sd = {k: v.double() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    ref.load_saved(sd)
    ref.eval()
    x = torch.tensor([[zm.BOS] + list(range(2, 60))])
    with torch.no_grad():
        return float((ref(x) - zm.logits_of(hf, x)).abs().max())
