"""Train the zoo's shared byte-level BPE tokenizer with Hugging Face `tokenizers`.

Layout of the resulting tokenizer.json:
  * model: BPE (vocab + merges), no unk token (byte-level covers every input)
  * pre_tokenizer: ByteLevel(add_prefix_space=False, use_regex=True) - GPT-2 split
  * post_processor: TemplateProcessing, "<|endoftext|> $A" (a BOS is prepended)
  * decoder: ByteLevel
  * special tokens: id 0 "<|endoftext|>" (BOS and EOS), id 1 "<|mask|>" (tiny-mdlm)
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ["<|endoftext|>", "<|mask|>"]
BOS_ID = 0
MASK_ID = 1


def train_tokenizer(texts: list[str], vocab_size: int = 1024) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A",
        pair="<|endoftext|> $A <|endoftext|> $B",
        special_tokens=[("<|endoftext|>", BOS_ID)],
    )
    assert tok.token_to_id("<|endoftext|>") == BOS_ID and tok.token_to_id("<|mask|>") == MASK_ID
    return tok
