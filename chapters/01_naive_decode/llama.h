#pragma once
/// @file llama.h
/// @brief Chapter 01: a Llama-family decoder, its weights and its forward pass.
///
/// The structs mirror the math (as llama2.c's do): one LlamaLayer per transformer block, the
/// weights stored like torch.nn.Linear ([out, in]). The forward pass below is the whole model
/// in about forty lines; chapter 02 adds a KV cache to exactly this code.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/hf_config.h"
#include "common/ops.h"
#include "common/tensor.h"

namespace inferlab::ch01 {

struct LlamaLayer {
  Tensor attn_norm;              ///< [D] RMSNorm before attention
  Tensor wq, wk, wv, wo;         ///< [N·H, D], [K·H, D], [K·H, D], [D, N·H]
  Tensor bq, bk, bv;             ///< q/k/v biases (Qwen2), or undefined
  Tensor mlp_norm;               ///< [D] RMSNorm before the MLP
  Tensor w_gate, w_up, w_down;   ///< [F, D], [F, D], [D, F]
};

struct Llama {
  TransformerConfig config;
  RopePairing rope_pairing = RopePairing::HalfSplit;  ///< Adjacent for llama2.c checkpoints
  Tensor inv_freq;     ///< [H/2] RoPE frequencies (with the config's rope_scaling applied)
  Tensor embed;        ///< [V, D]
  std::vector<LlamaLayer> layers;
  Tensor final_norm;   ///< [D]
  Tensor lm_head;      ///< [V, D]; the same tensor as embed when the embeddings are tied
  std::string source;  ///< where it was loaded from

  Device device() const { return embed.device(); }
  DType weight_dtype() const { return embed.dtype(); }
  /// Bytes of all weights (a tied head counted once).
  std::int64_t weight_bytes() const;
  /// A copy on `device` with the matrices converted to `dtype` (norms and frequencies stay f32).
  Llama to(Device device, DType dtype) const;
};

/// Whether a config.json architecture runs exactly this chapter's forward pass (Llama, Mistral
/// without a sliding window, Qwen2, ...).
bool llama_family(const std::string& arch);

/// Loads a Hugging Face model folder (config.json and safetensors: Llama, Mistral, Qwen2 and
/// other Llama-family architectures) or a llama2.c checkpoint (.bin). Checks every tensor's
/// shape against the config and says which one is wrong or missing.
Llama load_llama(const std::string& path);

/// Random weights for a config: the benchmarks' large models and the two-path tests' small
/// ones. Matrices ~ U(-a, a) with a = 1/sqrt(fan_in), norms ~ U(0.8, 1.2). On CUDA the values
/// are generated on the device (a different stream of numbers than on the CPU).
Llama random_llama(const TransformerConfig& config, std::uint64_t seed, DType dtype = DType::F32,
                   Device device = Device::CPU);

/// RoPE inverse frequencies for a config, including Llama 3's "llama3" and the "linear"
/// rope_scaling; other scaling types are an error that names them.
Tensor rope_frequencies(const TransformerConfig& config);

/// The forward pass over a whole sequence, from the first token: returns logits for every
/// position [T, V], or only for the last one [1, V] when `all_positions` is false.
Tensor forward(const Llama& m, const std::vector<std::int32_t>& tokens, bool all_positions = false);

}  // namespace inferlab::ch01
