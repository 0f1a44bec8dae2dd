#!/usr/bin/env python3
"""Golden files for chapter 09, written by the `gguf` package (llama.cpp's own Python library).

  data/golden/quant/blocks.safetensors   an input matrix and its Q8_0 and Q4_0 bytes, as
                                         gguf.quants quantises them (bit-exact with ggml-quants.c)
  data/golden/quant/reference.gguf       a small GGUF file written by gguf.GGUFWriter: metadata
                                         of several types and F32, F16, Q8_0 and Q4_0 tensors
  data/golden/quant/reference.json       what the reader must find in it (values dequantised by gguf)

Run from the repository root:  tools/.venv/bin/python tools/make_quant_goldens.py
"""
import json
import pathlib
from importlib.metadata import version

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "quant"


def test_matrix() -> np.ndarray:
    rng = np.random.default_rng(20261129)
    w = rng.standard_normal((8, 256)).astype(np.float32)
    w[1, :32] = 0.0                                   # an all-zero block
    w[2, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    w[3, 32:64] *= 100.0                              # a block of large values
    w[4, 64:96] = 0.5 * np.arange(-16, 16, dtype=np.float32) / 16 * 127 / 127  # values on rounding ties
    w[5, :] = np.float32(3.0)                         # constant row: max equals every value
    w[6, 5] = -20.0                                   # one outlier, negative
    return w


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    w = test_matrix()
    save_file({"input": w,
               "q8_0": gguf.quants.quantize(w, Q.Q8_0),
               "q4_0": gguf.quants.quantize(w, Q.Q4_0)},
              str(OUT / "blocks.safetensors"), metadata={"made_by": f"gguf {version('gguf')}"})

    path = OUT / "reference.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_uint32("llama.context_length", 512)
    wr.add_float32("llama.rope.freq_base", 10000.0)
    wr.add_string("general.name", "inferlab test file")
    wr.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b", "▁hello"])
    a = np.arange(96, dtype=np.float32).reshape(3, 32) / 7
    b = (np.arange(128, dtype=np.float32).reshape(2, 64) / 13).astype(np.float16)
    c = w[:4, :64]
    d = w[4:8, :64]
    wr.add_tensor("a.f32", a)
    wr.add_tensor("b.f16", b)
    wr.add_tensor("c.q8_0", gguf.quants.quantize(c, Q.Q8_0), raw_dtype=Q.Q8_0)
    wr.add_tensor("d.q4_0", gguf.quants.quantize(d, Q.Q4_0), raw_dtype=Q.Q4_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()

    expect = {
        "reference": f"gguf {version('gguf')}",
        "metadata": {"general.architecture": "llama", "llama.context_length": 512, "llama.rope.freq_base": 10000.0,
                     "general.name": "inferlab test file", "tokenizer.ggml.tokens": ["<s>", "a", "b", "▁hello"]},
        "tensors": {
            "a.f32": {"type": "F32", "shape": list(a.shape), "values": a.reshape(-1).tolist()},
            "b.f16": {"type": "F16", "shape": list(b.shape), "values": b.astype(np.float32).reshape(-1).tolist()},
            "c.q8_0": {"type": "Q8_0", "shape": list(c.shape),
                       "values": gguf.quants.dequantize(gguf.quants.quantize(c, Q.Q8_0), Q.Q8_0).reshape(-1).tolist()},
            "d.q4_0": {"type": "Q4_0", "shape": list(d.shape),
                       "values": gguf.quants.dequantize(gguf.quants.quantize(d, Q.Q4_0), Q.Q4_0).reshape(-1).tolist()},
        },
    }
    (OUT / "reference.json").write_text(json.dumps(expect, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
