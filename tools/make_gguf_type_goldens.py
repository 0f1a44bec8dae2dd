#!/usr/bin/env python3
"""Golden blocks of the GGUF tensor types that chapter 09 reads from files, decoded by the
`gguf` package (llama.cpp's own Python library, whose numpy decoders follow ggml-quants.c).

  data/golden/quant/gguf_types.safetensors
      <type>.bytes  U8 [rows, row_bytes]  the packed blocks of a [rows, cols] matrix
      <type>.f32    F32 [rows, cols]      what gguf.quants.dequantize makes of them

Q4_1, Q5_0 and Q5_1 are gguf.quants.quantize's blocks of a random matrix. The k-quants (Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K, 256 values a super-block) are random bytes with every f16 scale replaced by a finite
one, so that every bit pattern of the packed quants and sub-block scales occurs; so are IQ4_NL (blocks of
32) and IQ4_XS (super-blocks of 256), whose nibbles index the table of levels kvalues_iq4nl (the gguf
package decodes them but has no quantiser for them).

Run from the repository root:  tools/.venv/bin/python tools/make_gguf_type_goldens.py
"""
import pathlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "quant" / "gguf_types.safetensors"

# Byte offsets of the f16 scales in one block, per k-quant (ggml's block_q4_K, block_q5_K, block_q6_K).
# Q2_K and Q3_K, then IQ4_NL and IQ4_XS (ggml's block_iq4_nl, block_iq4_xs: d first) come last so that
# the earlier types' random bytes stay as they were.
F16_AT = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,)}


def main() -> None:
    rng = np.random.default_rng(20261202)
    out = {}
    w = rng.standard_normal((4, 256)).astype(np.float32)
    w[1, :32] = 0.0
    w[2, 32:64] *= 50.0
    for t in (Q.Q4_1, Q.Q5_0, Q.Q5_1):
        blocks = gguf.quants.quantize(w, t)
        out[f"{t.name}.bytes"] = blocks
        out[f"{t.name}.f32"] = gguf.quants.dequantize(blocks, t).astype(np.float32)
    rows, cols = 3, 512
    for t, offsets in F16_AT.items():
        block_values, block_bytes = gguf.GGML_QUANT_SIZES[t]
        n = rows * cols // block_values
        blocks = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
        for o in offsets:  # finite scales between -2 and 2
            blocks[:, o:o + 2] = rng.uniform(-2, 2, size=n).astype(np.float16).view(np.uint8).reshape(n, 2)
        packed = blocks.reshape(rows, -1)
        out[f"{t.name}.bytes"] = packed
        out[f"{t.name}.f32"] = gguf.quants.dequantize(packed, t).astype(np.float32)
    save_file(out, str(OUT), metadata={"gguf": gguf.__version__ if hasattr(gguf, "__version__") else "see requirements.txt"})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
