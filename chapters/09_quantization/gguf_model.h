#pragma once
/// @file gguf_model.h
/// @brief Chapter 09: Llama models to and from GGUF, llama.cpp's file format.
///
/// Tensor names follow llama.cpp (token_embd, blk.N.attn_q/attn_k/attn_v/attn_output/attn_norm,
/// blk.N.ffn_gate/ffn_up/ffn_down/ffn_norm, output_norm, output) and so does RoPE: llama.cpp's
/// "llama" architecture rotates adjacent pairs, so q/k rows are stored in that order (converted
/// from Hugging Face's rotate-half order with permute_rope_rows, as llama.cpp's converter does).

#include <string>

#include "chapters/09_quantization/qmodel.h"
#include "common/gguf.h"
#include "common/tokenizer.h"

namespace inferlab::ch09 {

/// Writes a quantised model (q8_0 or q4_0 projections; embeddings and norms as F32) and its
/// tokenizer (a byte-level BPE tokenizer.json: tokens, merges, BOS/EOS) as GGUF.
void save_gguf(const std::string& path, const QLlama& m, const HfTokenizer& tok);

/// Reads a Llama GGUF whose projections are all Q8_0 or all Q4_0 (other tensors F32 or F16).
QLlama load_gguf(const std::string& path);

/// The config of a Llama GGUF from its llama.* metadata.
TransformerConfig gguf_config(const gguf::File& f);

}  // namespace inferlab::ch09
