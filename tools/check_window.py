#!/usr/bin/env python3
"""Pin down the sliding-window semantics of transformers' Ministral class.

With one layer and window W, the output at query position i can only depend on
the tokens whose keys the query sees.  Changing the token at position j and
watching whether the output at i moves tells exactly which j are visible.
Expected (and asserted): j in i-W+1 .. i, i.e. W keys, the query's own included.
"""
import sys

import torch
from transformers import MinistralConfig, MinistralForCausalLM


def visible_keys(model, i: int, n: int) -> list[int]:
    base = torch.arange(2, 2 + n)[None]
    with torch.no_grad():
        ref = model(input_ids=base).logits[0, i]
        seen = []
        for j in range(n):
            x = base.clone()
            x[0, j] = 100
            if not torch.allclose(model(input_ids=x).logits[0, i], ref, atol=0, rtol=0):
                seen.append(j)
    return seen


def main() -> int:
    torch.manual_seed(0)
    w, n = 4, 12
    cfg = MinistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                          max_position_embeddings=64, sliding_window=w,
                          layer_types=["sliding_attention"])
    model = MinistralForCausalLM(cfg).double().eval()
    ok = True
    for impl in ("eager", "sdpa"):  # eager: goldens; sdpa: training
        model.config._attn_implementation = impl
        for i in (3, 7, 11):
            seen = visible_keys(model, i, n)
            want = list(range(max(0, i - w + 1), i + 1))
            print(f"{impl}, window {w}: query {i} sees keys {seen} (expected {want})")
            ok &= seen == want
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
