#pragma once
/// @file gguf_model.h
/// @brief Chapter 09: Llama models to GGUF, llama.cpp's file format (the reader is the core's,
/// common/models/gguf_llama.h).
///
/// Tensor names follow llama.cpp (token_embd, blk.N.attn_q/attn_k/attn_v/attn_output/attn_norm,
/// blk.N.ffn_gate/ffn_up/ffn_down/ffn_norm, output_norm, output) and so does RoPE: llama.cpp's
/// "llama" architecture rotates adjacent pairs, so q/k rows are stored in that order (converted
/// from Hugging Face's rotate-half order with permute_rope_rows, as llama.cpp's converter does).

#include <memory>
#include <string>

#include "chapters/09_quantization/qmodel.h"
#include "common/gguf.h"
#include "common/models/gguf_llama.h"
#include "common/tokenizer.h"

namespace inferlab::ch09 {

using models::gguf_config;
using models::gguf_tokenizer;
using models::gguf_windows;
using models::interleave_blocks;
using models::load_gguf;
using models::load_gguf_layers;
/// Writes a model (q8_0 or q4_0 projections from quantize_model, or plain ones as F32, or as F16
/// when stored in 16 bits; embeddings and norms as F32) and its tokenizer (a byte-level BPE
/// tokenizer.json: tokens, merges, BOS/EOS) as GGUF.
void save_gguf(const std::string& path, const models::Llama& m, const HfTokenizer& tok);

/// ch09_quantization export: the model at `model` (a Hugging Face folder) quantised with `spec`
/// and saved as GGUF at `out`, which must not be one of the model's files (check_not_input).
void export_gguf(const std::string& model, const QuantSpec& spec, const std::string& out);
/// The same with the projections unquantised, as F32 or F16 (llama.cpp's llama-quantize reads these).
void export_gguf(const std::string& model, DType plain, const std::string& out);

}  // namespace inferlab::ch09
