#!/usr/bin/env python3
"""The names of ggml's tensor types by number, as the `gguf` package (llama.cpp's own Python
library) has them, for common/gguf.cpp's ggml_type_name to be checked against:

  data/golden/quant/ggml_type_names.json   {"gguf": version, "names": {"0": "F32", ..., "20": "IQ4_NL", ...}}

The numbers ggml retired (4, 5, 31-33, 36-38) are absent from the package and from the file.

Run from the repository root:  tools/.venv/bin/python tools/make_ggml_type_names.py
"""
import importlib.metadata
import json
import pathlib

from gguf import GGMLQuantizationType

OUT = pathlib.Path(__file__).resolve().parent.parent / "data" / "golden" / "quant" / "ggml_type_names.json"


def main() -> None:
    names = {str(t.value): t.name for t in sorted(GGMLQuantizationType, key=lambda t: t.value)}
    OUT.write_text(json.dumps({"gguf": importlib.metadata.version("gguf"), "names": names}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
