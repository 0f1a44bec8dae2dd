#pragma once
// What the golden tests (a model against tools/golden.py's float64 transformers run) share:
// the ids stored in a golden file, and the float32 error bound they are held to.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
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

/// The largest magnitude in v (the scale a bound is taken of).
inline double max_abs(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s = std::max(s, std::fabs(x));
  return s;
}

/// The largest elementwise difference of two vectors of one size.
inline double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double w = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) w = std::max(w, std::fabs(a[i] - b[i]));
  return w;
}

/// Expects got within golden_bound (scaled by want's largest magnitude) of want, elementwise.
inline void expect_golden(const TransformerConfig& c, const std::vector<double>& got, const std::vector<double>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_within(got, want, std::vector<double>(want.size(), golden_bound(c, max_abs(want))), what);
}

/// Rows [r0, r1) of a row-major [T, width] vector (a golden file's logits).
inline std::vector<double> rows_of(const std::vector<double>& all, std::int64_t width, std::int64_t r0, std::int64_t r1) {
  return {all.begin() + r0 * width, all.begin() + r1 * width};
}

/// Token ids drawn uniformly from [0, vocab).
inline std::vector<std::int32_t> random_tokens(std::mt19937_64& rng, std::size_t n, std::int64_t vocab) {
  std::uniform_int_distribution<std::int32_t> d(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

/// Two float32 computations of one value, each within golden_bound of the exact result, differ by
/// at most twice that bound.
inline double two_path_bound(const TransformerConfig& c, const std::vector<double>& ref) {
  return 2 * golden_bound(c, max_abs(ref));
}

}  // namespace inferlab::test
