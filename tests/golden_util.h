#pragma once
// What the golden tests (a model against tools/golden.py's float64 transformers run) share:
// the ids stored in a golden file, and the float32 error bound they are held to.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/hf_config.h"
#include "common/tensor.h"
#include "test_util.h"

namespace inferlab::test {

/// A golden file's I64 token ids as the model's I32.
inline std::vector<std::int32_t> ids_of(const Tensor& t) {
  std::vector<std::int32_t> out;
  for (double v : t.to_double_vector()) out.push_back(static_cast<std::int32_t>(v));
  return out;
}

/// Our float32 forward pass against the float64 reference: the same error budget as the
/// two-path tests (P = 6L + 2 dependent stages, each within γ_K of its inputs' scale, a
/// condition factor of 4), plus the golden file's own rounding to float32.
inline double golden_bound(const TransformerConfig& c, double scale) {
  const double P = 6.0 * static_cast<double>(c.num_layers) + 2;
  const double K = static_cast<double>(std::max({c.hidden_size, c.intermediate_size, c.max_position_embeddings}));
  return P * gamma(K) * 4 * scale + 0x1p-24 * scale;
}

}  // namespace inferlab::test
