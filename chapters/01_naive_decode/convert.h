#pragma once
/// @file convert.h
/// @brief Converting between llama2.c checkpoints and Hugging Face model folders.
///
/// The one subtle step is RoPE's pairing. llama2.c (like Meta's original code) rotates
/// adjacent pairs (2j, 2j+1) of each head, while transformers' Llama rotates (j, j + H/2). The
/// two compute the same attention scores if the rows of W_q and W_k are permuted within every
/// head, which is what Hugging Face's own conversion script does (permute_rope_rows).

#include <string>

namespace inferlab::ch01 {

/// llama2.c checkpoint (+ its tokenizer.bin) -> folder with config.json, model.safetensors
/// (float32, q/k rows permuted for rotate-half RoPE) and tokenizer.json. Refuses the folder
/// that holds the checkpoint or the tokenizer (check_not_input).
void convert_llama2c_to_hf(const std::string& checkpoint, const std::string& tokenizer, const std::string& out_dir);

/// Hugging Face Llama folder -> llama2.c v0 checkpoint (float32, q/k rows permuted back). The
/// tokenizer is not converted: llama2.c's score-based format has no faithful equivalent of
/// every tokenizer.json. Refuses an existing output in the model folder (check_not_input).
void convert_hf_to_llama2c(const std::string& folder, const std::string& out_file);

}  // namespace inferlab::ch01
