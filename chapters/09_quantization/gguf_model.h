#pragma once
/// @file gguf_model.h
/// @brief Chapter 09: Llama models to and from GGUF, llama.cpp's file format.
///
/// Tensor names follow llama.cpp (token_embd, blk.N.attn_q/attn_k/attn_v/attn_output/attn_norm,
/// blk.N.ffn_gate/ffn_up/ffn_down/ffn_norm, output_norm, output) and so does RoPE: llama.cpp's
/// "llama" architecture rotates adjacent pairs, so q/k rows are stored in that order (converted
/// from Hugging Face's rotate-half order with permute_rope_rows, as llama.cpp's converter does).

#include <memory>
#include <string>

#include "chapters/09_quantization/qmodel.h"
#include "common/gguf.h"
#include "common/tokenizer.h"

namespace inferlab::ch09 {

/// Writes a model (q8_0 or q4_0 projections from quantize_model, or plain ones as F32, or as F16
/// when stored in 16 bits; embeddings and norms as F32) and its tokenizer (a byte-level BPE
/// tokenizer.json: tokens, merges, BOS/EOS) as GGUF.
void save_gguf(const std::string& path, const models::Llama& m, const HfTokenizer& tok);

/// ch09_quantization export: the model at `model` (a Hugging Face folder) quantised with `spec`
/// and saved as GGUF at `out`, which must not be one of the model's files (check_not_input).
void export_gguf(const std::string& model, const QuantSpec& spec, const std::string& out);
/// The same with the projections unquantised, as F32 or F16 (llama.cpp's llama-quantize reads these).
void export_gguf(const std::string& model, DType plain, const std::string& out);

/// Reads a Llama GGUF (architecture llama, or qwen2: q/k/v biases, RoPE over the halves of each
/// head; qwen3: per-head q/k norms) whose matrices are F32, F16, BF16 or one of the block types
/// (README: which run packed). A model with sliding-window layers (gemma2, gemma3) is refused,
/// naming chapter 06, which reads it with load_gguf_layers.
models::Llama load_gguf(const std::string& path);
models::Llama load_gguf(const gguf::File& f);
/// The same for any of those architectures and gemma2 / gemma3, with the windows of its layers
/// (gguf_windows) given: they choose the RoPE base of Gemma 3's local layers.
models::Llama load_gguf_layers(const gguf::File& f, const std::vector<std::int64_t>& windows);
/// Per layer, the sliding window llama.cpp applies (0: global): gemma2 and gemma3 from
/// ARCH.attention.sliding_window and ARCH.attention.sliding_window_pattern, llama.cpp's defaults when absent
/// (gemma2: 4096, one layer in 2 global; gemma3: one in 6); 0 for every layer of the others.
std::vector<std::int64_t> gguf_windows(const gguf::File& f, const TransformerConfig& c);

/// The config of a Llama GGUF from its llama.* metadata; throws naming the file and the key
/// for a missing key, one of the wrong type, or a value out of range.
TransformerConfig gguf_config(const gguf::File& f);

/// The tokenizer to generate with a GGUF model: the one at `explicit_path` when given (a
/// tokenizer.json, a folder holding one, or a llama2.c .bin), which must fit the model's
/// vocabulary; else the file's own (tokenizer.ggml.*, common/gguf_tokenizer.h); else, for a file
/// without one, `default_model`'s when its size is the model's vocabulary.
std::unique_ptr<Tokenizer> gguf_tokenizer(const gguf::File& f, const std::string& explicit_path,
                                          const std::string& default_model);

}  // namespace inferlab::ch09
