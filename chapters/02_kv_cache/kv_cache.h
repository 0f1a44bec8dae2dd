#pragma once
/// @file kv_cache.h
/// @brief Chapter 02: the KV cache. Prefill fills it, decode reads it.
///
/// Chapter 01's forward pass recomputes every earlier position's keys and values at every step,
/// although under the causal mask they never change. Keep them instead: for every layer, K and
/// V of every position so far. Then a step only has to run its new tokens through the network:
/// the whole prompt at once (prefill), then one token at a time (decode).

#include <functional>
#include <string>
#include <vector>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/01_naive_decode/llama.h"

namespace inferlab::ch02 {

/// For every layer, keys and values of up to `capacity` positions: [capacity, K, H] each.
struct KVCache {
  std::int64_t capacity = 0;  ///< positions it can hold (S)
  std::int64_t length = 0;    ///< positions filled so far
  std::vector<Tensor> k, v;   ///< one per layer

  static KVCache allocate(const TransformerConfig& c, std::int64_t capacity, Device device = Device::CPU,
                          DType dtype = DType::F32);
  /// S × K × H × L × 2 × bytes per element, exactly (the lecture's formula).
  std::int64_t bytes() const;
  /// "5 layers × {K, V} × [512, 4, 8] f32 = 655,360 bytes"
  std::string layout() const;
};

/// Chapter 01's forward pass with a cache: `tokens` continue the sequence the cache holds.
/// Their keys and values are appended to the cache, and attention reads every cached position.
/// Prefill is a call with the whole prompt; each decode step is a call with one token.
Tensor forward_cached(const ch01::Llama& m, KVCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions = false);

/// `x · wᵀ` for the plain weights of ch01::Llama. forward_cached_with() calls `linear(x, w)`
/// for every projection, so a model whose weights are another type (chapter 09's quantised
/// matrices) runs the same forward pass by providing its own `linear`.
inline Tensor linear(const Tensor& x, const Tensor& w) { return ops::matmul(x, w); }

/// forward_cached for any Llama-shaped model: it needs the fields of ch01::Llama (config,
/// rope_pairing, inv_freq, embed, layers with attn_norm/wq/wk/wv/wo/bq/bk/bv/mlp_norm/w_gate/
/// w_up/w_down, final_norm, lm_head) and a `linear(x, w)` for its weight type.
template <class Model>
Tensor forward_cached_with(const Model& m, KVCache& cache, const std::vector<std::int32_t>& tokens,
                           bool all_positions = false);

/// The lecture's serving metrics for one generation.
struct Timing {
  double ttft_s = 0;                  ///< time to first token: prefill + the first sample
  std::vector<double> decode_step_s;  ///< each later token's step
  double total_s = 0;
  double tpot_s() const;              ///< time per output token after the first (mean decode step)
  double tokens_per_s(std::size_t n) const { return total_s > 0 ? static_cast<double>(n) / total_s : 0; }
};

struct CachedGeneration {
  ch01::Generation gen;  ///< tokens and per-step work, as in chapter 01
  Timing timing;
};

/// Prefill the prompt, then decode one token per step until max_new or an EOS id.
CachedGeneration generate_cached(const ch01::Llama& m, const std::vector<std::int32_t>& prompt, int max_new,
                                 Sampler& sampler, const std::vector<std::int64_t>& eos_ids,
                                 const ch01::OnToken& on_token = nullptr);

}  // namespace inferlab::ch02

#include "chapters/02_kv_cache/kv_cache_forward.h"
