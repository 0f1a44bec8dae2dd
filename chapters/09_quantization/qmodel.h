#pragma once
/// @file qmodel.h
/// @brief Chapter 09: a Llama whose projections are quantised matrices.
///
/// Only the seven projections per layer and the output head are quantised (the bytes a decode
/// step reads); embeddings and norms stay as they were. The forward pass is chapter 02's,
/// unchanged: forward_cached_with() calls `linear(x, w)`, and for a QMatrix that is qmatmul().

#include <array>
#include <string>
#include <vector>

#include "chapters/02_kv_cache/kv_cache.h"
#include "chapters/09_quantization/quant.h"

namespace inferlab::ch09 {

/// `x · wᵀ` reading the quantised weights (found by forward_cached_with through ADL).
inline Tensor linear(const Tensor& x, const QMatrix& w) { return qmatmul(x, w); }

struct QLayer {
  Tensor attn_norm, mlp_norm;
  QMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  Tensor bq, bk, bv;
  /// The seven projections, for loops over all of them.
  std::array<QMatrix*, 7> matrices() { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
  std::array<const QMatrix*, 7> matrices() const { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
};

struct QLlama {
  TransformerConfig config;
  RopePairing rope_pairing = RopePairing::HalfSplit;
  Tensor inv_freq, embed, final_norm;
  std::vector<QLayer> layers;
  QMatrix lm_head;
  std::string source;
  Device device() const { return embed.device(); }
  /// Bytes of the quantised matrices (what a decode step reads, besides the cache and norms).
  std::int64_t matrix_bytes() const;
  /// Their weights' count.
  std::int64_t matrix_weights() const;
  QLlama to(Device d) const;
};

/// Quantises every projection of `m` (and the head) with `spec`.
QLlama quantize_model(const ch01::Llama& m, const QuantSpec& spec);

/// All logits [T, V] of a token sequence (for perplexity and probes).
Tensor forward_all(const QLlama& m, const std::vector<std::int32_t>& tokens);

}  // namespace inferlab::ch09
