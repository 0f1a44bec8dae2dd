#!/usr/bin/env python3
"""A Llama GGUF's greedy tokens computed in float64 from its dequantised weights, beside InferLab's.

  tools/.venv/bin/python tools/gguf_reference.py FILE.gguf RUN.json [--round-x] [--json OUT.json]

RUN.json is what `ch09_quantization run FILE.gguf --temperature 0 --json RUN.json` wrote: its
prompt ids and the tokens InferLab generated. The reference reads the file with the `gguf` package
(llama.cpp's own Python library): every tensor is dequantised by `gguf.quants.dequantize` and
widened to float64, and the forward pass is written here from the Llama equations (RMSNorm;
RoPE over adjacent pairs, as llama.cpp's `llama` architecture stores q and k, or over the two
halves of a head for `qwen2`, with its q/k/v biases; grouped-query attention; SwiGLU), with no
code of InferLab's or of transformers'. It decodes greedily from the same prompt, as many tokens
as InferLab generated, teacher-forced on InferLab's tokens, and reports at every step whether
InferLab's token is the reference's argmax and, where it is not, the reference's gap between the
two logits (a near-tie when that is about the size of the rounding in InferLab's float32 path).

--sensitivity (with --round-x) runs the reference again with every activation moved by a random
relative amount of up to --ulps float32 ulps (default 8) before its rounding, and reports how far
that alone moves the logits. The q8_0 rounding of x is a step function: activations that differ
by float32 rounding (a dot product of n terms in float32 is typically off by about √n·2^-24
relative, and the errors compound through the layers) land on different steps wherever they sit
near a step's edge. At a step whose tokens differ it draws --draws such perturbations and reports
σ, the root mean square of the change they make to the gap between the two tokens' logits: the
difference is a near-tie of the rounding when the gap is a few σ at most. --twin32 computes the
same forward in float32 (numpy's) at such a step and gives its gap: negative where a float32
implementation of the same function also prefers InferLab's token.

--round-x rounds the input of every block-quantised matrix through q8_0 blocks first (32 values,
d = max|x| / 127, x ≈ f16(d)·round(x / d)): the function that InferLab's and llama.cpp's
CPU products of those matrices compute. Without it the reference is the float model over the
dequantised weights.
"""
import argparse
import json
import sys

import gguf
import numpy as np

PLAIN = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            sys.exit(f"gguf_reference: {key} missing from the file")
        return default
    return f.contents()


def q8_0_round(x, rng=None, ulps=0):
    """x [T, n] rounded through q8_0 blocks of 32 as llama.cpp's quantize_row_q8_0 defines it: with
    d = max|x| / 127, q = round(x / d) (halves away from zero, as C's roundf) and the value
    f16(d)·q; the quotient takes d before its rounding to f16. With rng, x is first moved by a
    random relative ulps·2^-23 at most (float32's spacing is 2^-23 relative)."""
    b = x.reshape(x.shape[0], -1, 32)
    if rng is not None:
        b = b * (1 + rng.uniform(-ulps * 2.0 ** -23, ulps * 2.0 ** -23, size=b.shape)).astype(b.dtype)
    d = np.abs(b).max(axis=2, keepdims=True) / b.dtype.type(127)
    inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
    v = b * inv
    q = np.sign(v) * np.floor(np.abs(v) + b.dtype.type(0.5))
    return (q * d.astype(np.float16).astype(b.dtype)).reshape(x.shape)


class Model:
    def __init__(self, path, round_x):
        self.rng, self.ulps = None, 0  # with --sensitivity: the perturbation's generator and size
        self.dt, self.w32 = np.float64, {}  # with --twin32: the same forward in float32
        r = gguf.GGUFReader(path)
        self.arch = field(r, "general.architecture")
        if self.arch not in ("llama", "qwen2"):
            sys.exit(f"gguf_reference: architecture {self.arch!r}; this reference runs llama and qwen2")
        a = self.arch
        self.D = int(field(r, f"{a}.embedding_length"))
        self.L = int(field(r, f"{a}.block_count"))
        self.H = int(field(r, f"{a}.attention.head_count"))
        self.KV = int(field(r, f"{a}.attention.head_count_kv", self.H))
        self.hd = int(field(r, f"{a}.attention.key_length", self.D // self.H))
        self.eps = float(field(r, f"{a}.attention.layer_norm_rms_epsilon"))
        self.theta = float(field(r, f"{a}.rope.freq_base", 10000.0))
        self.w, self.packed = {}, set()
        for t in r.tensors:
            v = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)
            self.w[t.name] = v.reshape([int(n) for n in reversed(t.shape)]) if v.ndim > 1 or len(t.shape) > 1 else v
            if t.tensor_type not in PLAIN:
                self.packed.add(t.name)
        if "output.weight" not in self.w:  # a tied head
            self.w["output.weight"] = self.w["token_embd.weight"]
            if "token_embd.weight" in self.packed:
                self.packed.add("output.weight")
        self.round_x = round_x

    def W(self, name):
        if self.dt == np.float64:
            return self.w[name]
        if name not in self.w32:
            self.w32[name] = self.w[name].astype(self.dt)
        return self.w32[name]

    def linear(self, x, name):
        if self.round_x and name in self.packed:
            x = q8_0_round(x, self.rng, self.ulps)
        y = x @ self.W(name).T
        bias = name.replace(".weight", ".bias")
        return y + self.W(bias) if bias in self.w else y

    def norm(self, x, name):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.W(name)

    def rope(self, x):  # x [T, heads, hd]
        T, hd = x.shape[0], self.hd
        inv = self.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :].astype(self.dt), np.sin(ang)[:, None, :].astype(self.dt)
        if self.arch == "llama":  # adjacent pairs (2i, 2i + 1)
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
            return out
        a, b = x[..., : hd // 2], x[..., hd // 2:]  # qwen2: halves (i, i + hd/2)
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def logits(self, ids):
        x = self.W("token_embd.weight")[np.asarray(ids)]
        T, G = len(ids), self.H // self.KV
        mask = np.triu(np.full((T, T), -np.inf, dtype=self.dt), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = self.norm(x, p + "attn_norm.weight")
            q = self.rope(self.linear(h, p + "attn_q.weight").reshape(T, self.H, self.hd))
            k = self.rope(self.linear(h, p + "attn_k.weight").reshape(T, self.KV, self.hd))
            v = self.linear(h, p + "attn_v.weight").reshape(T, self.KV, self.hd)
            k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / self.dt(np.sqrt(self.hd)) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, self.H * self.hd)
            x = x + self.linear(o, p + "attn_output.weight")
            h = self.norm(x, p + "ffn_norm.weight")
            g, u = self.linear(h, p + "ffn_gate.weight"), self.linear(h, p + "ffn_up.weight")
            x = x + self.linear(g / (1 + np.exp(-g)) * u, p + "ffn_down.weight")
        return self.linear(self.norm(x[-1:], "output_norm.weight"), "output.weight")[0].astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("run", help="ch09_quantization run --temperature 0 --json output for the same file")
    ap.add_argument("--round-x", action="store_true", help="round packed matrices' inputs through q8_0 blocks")
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--sensitivity", action="store_true",
                    help="with --round-x: also run the reference with its activations moved by --ulps float32 ulps, and "
                         "report how far that alone moves its logits (how large a near-tie float32 rounding can break)")
    ap.add_argument("--ulps", type=float, default=8, help="the perturbation of --sensitivity, in float32 ulps (default 8)")
    ap.add_argument("--twin32", action="store_true",
                    help="also run the same forward in float32 (numpy's), and give its gap where the tokens differ")
    ap.add_argument("--draws", type=int, default=8, help="perturbations drawn at a step whose tokens differ (default 8)")
    a = ap.parse_args()
    run = json.load(open(a.run))
    m = Model(a.file, a.round_x)
    seq, steps = list(run["prompt_tokens"]), []
    for i, tok in enumerate(run["generated"]):
        z = m.logits(seq)
        best, second = (int(j) for j in np.argsort(z)[::-1][:2])
        shift, sigma = None, None
        if a.sensitivity:
            moved = []
            for r in range(a.draws if best != tok else 1):
                m.rng, m.ulps = np.random.default_rng([i, r]), a.ulps
                moved.append(m.logits(seq) - z)
            m.rng = None
            shift = float(max(np.abs(d).max() for d in moved))
            if best != tok:
                sigma = float(np.sqrt(np.mean([(d[best] - d[tok]) ** 2 for d in moved])))
        twin = None
        if a.twin32 and best != tok:
            m.dt = np.float32
            z32 = m.logits(seq)
            m.dt = np.float64
            twin = float(z32[best] - z32[tok])
        steps.append({"step": i, "inferlab": tok, "reference": best, "gap": float(z[best] - z[tok]), "twin32_gap": twin,
                      "margin": float(z[best] - z[second]), "logit_range": float(z.max() - z.min()),
                      "perturbed_shift": shift, "gap_sigma": sigma})
        seq.append(tok)  # teacher-forced on InferLab's tokens
    differ = [s for s in steps if s["inferlab"] != s["reference"]]
    first = differ[0]["step"] if differ else None
    # The same greedy sequence up to the first difference (after it, a free-running reference
    # would continue from its own token).
    print(f"{a.file}: {len(steps)} tokens, {len(steps) - len(differ)} the reference's argmax"
          f"{'' if first is None else f'; first difference at step {first}'}"
          f"{' (x rounded through q8_0 blocks)' if a.round_x else ''}")
    margins = sorted(s["margin"] for s in steps)
    print(f"  the reference's top-two margin: median {np.median(margins):.3g}, smallest {margins[0]:.3g}; "
          f"logit range median {np.median([s['logit_range'] for s in steps]):.3g}")
    if a.sensitivity:
        shifts = [s["perturbed_shift"] for s in steps]
        print(f"  activations moved by {a.ulps:g} float32 ulps move the reference's logits by up to {max(shifts):.3g} "
              f"(median {np.median(shifts):.3g})")
    for s in differ:
        print(f"  step {s['step']}: InferLab {s['inferlab']}, reference {s['reference']}, reference logit gap {s['gap']:.3g}"
              + ("" if s["gap_sigma"] is None else f", {s['gap'] / s['gap_sigma']:.2g} σ of its change under the perturbation "
                                                   f"(σ = {s['gap_sigma']:.3g})")
              + ("" if s["twin32_gap"] is None else f"; the float32 twin's gap {s['twin32_gap']:.3g}"))
    if a.json:
        json.dump({"file": a.file, "round_x": a.round_x, "tokens": len(steps), "agree": len(steps) - len(differ),
                   "first_difference": first, "steps": steps}, open(a.json, "w"), indent=1)
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main())
