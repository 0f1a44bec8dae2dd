#pragma once
/// @file gguf_llama.h
/// @brief Llama-family models from GGUF, llama.cpp's file format (chapter 09 writes them).
///
/// Tensor names follow llama.cpp (token_embd, blk.N.attn_q/attn_k/attn_v/attn_output/attn_norm,
/// blk.N.ffn_gate/ffn_up/ffn_down/ffn_norm, output_norm, output) and so does RoPE: llama.cpp's
/// "llama" architecture rotates adjacent pairs, so q/k rows are stored in that order (converted
/// from Hugging Face's rotate-half order with permute_rope_rows, as llama.cpp's converter does).
/// A matrix stored in a block type stays packed (common/quant/qmatrix.h).

#include <memory>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/models/llama.h"
#include "common/tokenizer.h"

namespace inferlab::models {

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

/// `m` with every matrix that can be interleaved (common/quant/interleaved_matrix.h) so; the number
/// changed in `count` when given. The fast kernel: a GGUF model on the CPU runs this way, and
/// chapter 09's quantised models (--kernel fast, the default).
void interleave_blocks(Llama& m, int* count = nullptr);

}  // namespace inferlab::models
