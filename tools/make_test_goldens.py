#!/usr/bin/env python3
"""Golden files for the core's loaders, made by the reference Python libraries.

The C++ tests compare our tokenizer.json reader with Hugging Face `tokenizers` and our
safetensors reader with the `safetensors` package, on files these libraries wrote:

  data/golden/tokenizers/<style>/tokenizer.json   five small BPE tokenizers, one per family
  data/golden/tokenizers/<style>/cases.json       texts, their ids and decodings by `tokenizers`
  data/golden/core/reference.safetensors (+ .json) tensors of every dtype, written by safetensors
  data/golden/core/sharded/                       a two-shard checkpoint with its index file

Run from the repository root:  python3 tools/make_test_goldens.py
Deterministic for the versions pinned in tools/requirements.txt (training uses one thread).
"""
import json
import os
import pathlib

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # tokenizers' trainer: one thread, one result

import numpy as np
import safetensors
import tokenizers
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_TOK = ROOT / "data" / "golden" / "tokenizers"
OUT_CORE = ROOT / "data" / "golden" / "core"

# Training text: a few sentences in several scripts, repeated with variations so merges exist.
TRAIN = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, she saw a big red ball. She wanted to play with it, but it was too high!",
    "The quick brown fox jumps over the lazy dog; it's 12 o'clock and we're 3,456 km away.",
    "Tom and Lily ate 25 apples in 1999. They don't like 7 pears, but they'll eat 100 plums.",
    "Le café est très bon, naïve élève. Über Straße. Привет, мир! Добрый день.",
    "你好，世界。今天天气很好。我们去公园玩吧。",
    "こんにちは世界。東京は大きい町です。",
    "def main():\n    print('hello world')\n    return 0\n\n",
    "Tabs\tand  double  spaces   and newlines\n\nmatter.",
    "Emoji: 👋 🙂 ❤️ and symbols: €, £, ¥, ©, ™, →.",
]
CORPUS = [f"{s} {i}" for i in range(40) for s in TRAIN]

# Texts to encode: ASCII, whitespace runs, digits, contractions, several scripts, emoji with a
# skin-tone modifier, decomposed accents (NFC matters), characters never seen in training
# (byte fallback / unknown bytes), special tokens inside text, and edge cases.
CASES = [
    "Hello world",
    "Once upon a time, there was a little girl named Lily.",
    " leading space",
    "trailing space ",
    "  two  spaces   three    four",
    "line one\nline two\n\n\tindented",
    "I'm sure they'll say we've done it; don't you THINK'S so?",
    "Numbers: 0 7 42 123 4567 89012 3.14159 1,000,000",
    "café naïve élève Straße",
    "cafe\u0301 na\u0131ve",  # decomposed é; dotless i
    "你好，世界。今天天气很好。",
    "東京は大きい",
    "Привет, мир!",
    "Emoji 👋🏽 and ❤️ and 🙂🙂🙂",
    "Unseen: ψ ∑ ש ǅ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "def f(x):\n    return x ** 2\n",
    "",
    "   ",
    "a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def byte_level(style):
    """GPT-2 / Llama-3 / SmolLM / Qwen families: byte-level BPE."""
    tok = Tokenizer(models.BPE(ignore_merges=(style in ("llama3", "qwen"))))
    specials = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>"]
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif style == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:  # llama3, qwen: a Split regex then ByteLevel without its own regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    if style == "qwen":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    if style == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def metaspace(style):
    """Llama-2 / Mistral families: metaspace BPE with byte fallback.

    The `tokenizers` trainer has no option to put the 256 <0xHH> byte tokens into the model
    vocabulary (real Llama-2 files have them there, not as added tokens), so we train, add
    them to the vocabulary in the JSON, and reload: the result has the Llama-2 file's shape.
    """
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if style == "llama2":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    else:  # "mistral": the Metaspace pre-tokenizer with prepend_scheme "first"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  limit_alphabet=120)
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        name = f"<0x{b:02X}>"
        if name not in vocab:
            vocab[name] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(spec))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    return tok


def write_tokenizer(name, tok):
    folder = OUT_TOK / name
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))  # exactly what the C++ side reads
    texts = CASES + ["<|endoftext|>Hello<|endoftext|>", "x <s> y </s>"]
    cases = []
    for text in texts:
        with_special = tok.encode(text, add_special_tokens=True).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": with_special,
            "ids_no_special": plain,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
        })
    doc = {
        "reference": f"tokenizers {tokenizers.__version__}",
        "tokenizer": f"{name}/tokenizer.json",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "cases": cases,
    }
    (folder / "cases.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def write_safetensors():
    OUT_CORE.mkdir(parents=True, exist_ok=True)
    tensors = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(0.5) - np.float32(1),
        "f64": np.array([[1e-300, -2.5], [3.0, np.pi]], dtype=np.float64),
        "f16": np.array([1.0, -0.5, 65504.0, 2.0 ** -24], dtype=np.float16),
        "i64": np.array([-(2 ** 40), 0, 7], dtype=np.int64),
        "i32": np.array([[1, -2], [3, -4], [5, -6]], dtype=np.int32),
        "i8": np.array([-128, 0, 127], dtype=np.int8),
        "u8": np.array([0, 255], dtype=np.uint8),
        "scalar": np.array(42.0, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    meta = {"format": "np", "made_by": "tools/make_test_goldens.py"}
    save_file(tensors, str(OUT_CORE / "reference.safetensors"), metadata=meta)
    expect = {name: {"dtype": str(a.dtype), "shape": list(a.shape), "values": a.reshape(-1).astype(np.float64).tolist()}
              for name, a in tensors.items()}
    (OUT_CORE / "reference.json").write_text(json.dumps({
        "reference": f"safetensors {safetensors.__version__}", "metadata": meta, "tensors": expect}, indent=1) + "\n")

    shard_dir = OUT_CORE / "sharded"
    shard_dir.mkdir(exist_ok=True)
    a = {"model.embed.weight": np.arange(8, dtype=np.float32).reshape(4, 2)}
    b = {"model.norm.weight": np.array([1.0, 2.0], dtype=np.float16), "lm_head.weight": np.ones((4, 2), np.float32)}
    save_file(a, str(shard_dir / "model-00001-of-00002.safetensors"))
    save_file(b, str(shard_dir / "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 8 * 4 + 2 * 2 + 8 * 4},
             "weight_map": {**{k: "model-00001-of-00002.safetensors" for k in a},
                            **{k: "model-00002-of-00002.safetensors" for k in b}}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")


def main():
    for style in ("gpt2", "llama3", "smollm", "qwen"):
        write_tokenizer(style, byte_level(style))
    for style in ("llama2", "mistral"):
        write_tokenizer(style, metaspace(style))
    write_safetensors()
    print("wrote", OUT_TOK, "and", OUT_CORE)


if __name__ == "__main__":
    main()
