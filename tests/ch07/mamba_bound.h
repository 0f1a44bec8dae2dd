#pragma once
// The model-level tolerance of chapter 07's tests: golden_util.h's budget for a decoder of the
// same depth and widths (6L + 2 dependent stages over sums of up to max(D, E, T) terms), with T
// the sequence length, since a state carries T tokens' updates.
#include "common/models/mamba.h"
#include "golden_util.h"

namespace inferlab::test {

inline TransformerConfig bound_config(const models::mamba::MambaConfig& c, std::int64_t T) {
  TransformerConfig t;
  t.num_layers = c.num_layers, t.hidden_size = c.hidden_size, t.intermediate_size = c.inner_size;
  t.max_position_embeddings = T;
  return t;
}

inline void expect_mamba_golden(const models::mamba::MambaConfig& c, std::int64_t T, const std::vector<double>& got,
                                const std::vector<double>& want, const std::string& what) {
  expect_golden(bound_config(c, T), got, want, what);
}

}  // namespace inferlab::test
