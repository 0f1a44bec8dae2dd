#pragma once
/// @file llama.h
/// @brief The core's Llama-family decoder: its weights, its loaders and the blocks of its forward pass.
///
/// The structs mirror the math (as llama2.c's do): one LlamaLayer per transformer block, every
/// projection a Linear ([out, in] as torch.nn.Linear stores it, or chapter 09's packed formats).
/// Chapter 01 builds its forward pass from the blocks below (embed -> layers -> norm -> head);
/// chapter 02 adds a KV cache to exactly that code (kv_cache.h), and every later chapter calls
/// the same blocks.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/hf_config.h"
#include "common/linear.h"
#include "common/moe.h"
#include "common/ops.h"
#include "common/tensor.h"

namespace inferlab::models {

struct LlamaLayer {
  Tensor attn_norm;  ///< [D] RMSNorm before attention
  /// [N·H, D], [K·H, D], [K·H, D], [D, N·H]; biases on q/k/v in Qwen2, on all four with Llama's
  /// attention_bias
  Linear wq, wk, wv, wo;
  Tensor mlp_norm;              ///< [D] RMSNorm before the MLP
  Linear w_gate, w_up, w_down;  ///< [F, D], [F, D], [D, F]; biases with Llama's mlp_bias
  /// A mixture-of-experts FFN in place of w_gate/w_up/w_down, in the layers config.moe names
  /// (common/moe.h); undefined in a dense layer. Its matrices are not in linears().
  MoeFfn moe;
  // Qwen3 and Gemma: undefined (absent) in a plain Llama layer.
  Tensor q_norm, k_norm;  ///< [H] RMSNorm of each query and key head before RoPE (Qwen3, Gemma 3)
  /// [D] RMSNorm of the attention and MLP outputs before their residual add (Gemma 2 / 3, whose
  /// post_attention_layernorm is this one, and pre_feedforward_layernorm the mlp_norm)
  Tensor post_attn_norm, post_mlp_norm;
  Tensor inv_freq;     ///< [H/2] this layer's own RoPE frequencies (Gemma 3's local layers); else the model's
  bool geglu = false;  ///< the MLP gates with tanh-GELU (Gemma) instead of SiLU
  /// The seven projections, for loops over all of them.
  std::array<Linear*, 7> linears() { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
  std::array<const Linear*, 7> linears() const { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
};

struct Llama {
  TransformerConfig config;
  RopePairing rope_pairing = RopePairing::HalfSplit;  ///< Adjacent for llama2.c checkpoints
  Tensor inv_freq;                                    ///< [H/2] RoPE frequencies (with the config's rope_scaling applied)
  Tensor embed;                                       ///< [V, D]
  std::vector<LlamaLayer> layers;
  Tensor final_norm;   ///< [D]
  Linear lm_head;      ///< [V, D]; its weight is the embed tensor when the embeddings are tied
  std::string source;  ///< where it was loaded from

  Device device() const { return embed.device(); }
  DType weight_dtype() const { return embed.dtype(); }
  bool tied() const { return !lm_head.packed && lm_head.weight.raw_data() == embed.raw_data(); }
  /// Bytes of all weights as stored (a tied head counted once).
  std::int64_t weight_bytes() const;
  /// Bytes of weights one decode step reads: every projection and norm, the head (the whole
  /// embedding table when tied), and of an untied embedding table only the token's row.
  std::int64_t step_weight_bytes() const;
  /// Bytes of the projections and the head as stored (what chapter 09's formats shrink).
  std::int64_t matrix_bytes() const;
  /// A copy on `device` with the plain matrices converted to `dtype` (norms and frequencies stay
  /// f32, packed matrices keep their format).
  Llama to(Device device, DType dtype) const;
};

/// Whether a config.json architecture runs exactly this chapter's forward pass (Llama, Mistral
/// without a sliding window, Qwen2, ...).
bool llama_family(const std::string& arch);

/// Loads a Hugging Face model folder (config.json and safetensors: Llama, Mistral, Qwen2 and
/// other Llama-family architectures) or a llama2.c checkpoint (.bin). Checks every tensor's
/// shape against the config and says which one is wrong or missing.
Llama load_llama(const std::string& path);

/// The reading part of load_llama, for a Hugging Face folder whose architecture the caller has
/// already accepted (chapter 06 reads Mistral, Ministral and Qwen2 folders with their windows):
/// the Llama checkpoint layout of config `c` (parse_transformer_config(hf)), every tensor checked,
/// biases where the config asks for them.
Llama load_hf_decoder(const HfConfig& hf, const TransformerConfig& c, const std::string& path);

/// Random weights for a config: the benchmarks' large models and the two-path tests' small
/// ones. Matrices ~ U(-a, a) with a = 1/sqrt(fan_in), norms ~ U(0.8, 1.2). On CUDA the values
/// are generated on the device (a different stream of numbers than on the CPU).
Llama random_llama(const TransformerConfig& config, std::uint64_t seed, DType dtype = DType::F32,
                   Device device = Device::CPU);

/// The shape the speed measurements use where a tiny model would fit in a CPU's caches: D = 1024,
/// F = 2816, 16 heads of 64, about 12M parameters a layer (8 layers: about 100M, 400 MB in f32), so
/// that weights and caches live in DRAM and a decode step is memory-bound as the lecture argues.
TransformerConfig memory_bound_shape(std::int64_t layers, std::int64_t kv_heads, std::int64_t vocab, std::int64_t context);

/// RoPE inverse frequencies for a config, including Llama 3's "llama3" and the "linear"
/// rope_scaling; other scaling types are an error that names them.
Tensor rope_frequencies(const TransformerConfig& config);

// --- the blocks every chapter's forward pass is made of ---------------------------------------
/// The token embeddings of `tokens` [T, D] (times the config's embed_scale, Gemma's √D): the
/// residual stream's first value. Throws naming a token id outside the vocabulary.
Tensor embed(const Llama& m, const std::vector<std::int32_t>& tokens);
/// RMSNorm of the rows of x with weight w and the model's eps.
Tensor norm(const Llama& m, const Tensor& x, const Tensor& w);
/// A block's output y before its residual add: y itself, or its RMSNorm with w where the layer
/// has one there (Gemma's post_attention_layernorm and post_feedforward_layernorm).
Tensor post_norm(const Llama& m, const Tensor& y, const Tensor& w);
/// RMSNorm of each head of x [T, heads, H] where the layer has per-head norms (Qwen3, Gemma 3).
void head_norm(const Llama& m, Tensor& x, const Tensor& w);
/// The RoPE frequencies layer l rotates with: its own (Gemma 3's local layers) or the model's.
const Tensor& rope_freqs(const Llama& m, const LlamaLayer& l);
/// The scale and soft-capping of a config's attention scores (Gemma's query_pre_attn_scalar and
/// attn_logit_softcapping; 1/√head_dim and none for every other family), for the caches that run
/// Gemma (chapter 06's) to pass to the attention op.
AttentionParams attention_params(const TransformerConfig& c);
/// Positions begin .. begin + T - 1 as I32 [T] on the model's device (RoPE's input).
Tensor positions(const Llama& m, std::int64_t begin, std::int64_t T);
/// The MLP: down(silu(gate(h)) * up(h)), h [T, D] -> [T, D] (tanh-GELU for silu in Gemma); an
/// MoE layer's experts instead (moe_block, common/moe.h).
Tensor mlp_block(const LlamaLayer& l, const Tensor& h);
/// The head: logits [T, V] of the final hidden rows x [T, D] (final norm, then lm_head, then
/// Gemma 2's soft-capping where the config has it).
Tensor head(const Llama& m, const Tensor& x);

}  // namespace inferlab::models
