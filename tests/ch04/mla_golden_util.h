#pragma once
// What chapter 04's golden tests (tests/ch04/test_mla_goldens.cpp, test_moe_goldens.cpp) share:
// a model run over a golden sequence token by token, and the test names of (model, path) pairs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "common/models/mla.h"
#include "golden_util.h"

namespace inferlab::test {

/// A short prefill (every position's logits), then one token per step (teacher-forced): each
/// step's logits against row t of `want` [T, V]. `steps` is the cache, empty on entry, holding
/// all T positions on return.
inline void expect_prefill_then_steps(const models::mla::MlaModel& m, models::mla::LatentCache& steps,
                                      const std::vector<std::int32_t>& ids, const std::vector<double>& want,
                                      models::mla::MlaPath path) {
  const auto& c = m.config();
  const std::int64_t P = 5, T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  const std::vector<std::int32_t> prefix(ids.begin(), ids.begin() + P);
  expect_golden(c, models::mla::forward_cached(m, steps, prefix, true, path).to_double_vector(), rows_of(want, V, 0, P),
                "prefill of the first " + std::to_string(P));
  for (std::int64_t t = P; t < T; ++t)
    expect_golden(c,
                  models::mla::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}, false, path).to_double_vector(),
                  rows_of(want, V, t, t + 1), "decode step at position " + std::to_string(t));
}

/// "v3_qlora_Plain": a (model name, decode path) test parameter as a test name.
inline std::string model_path_name(const ::testing::TestParamInfo<std::tuple<std::string, models::mla::MlaPath>>& info) {
  std::string n = std::get<0>(info.param);
  std::replace(n.begin(), n.end(), '-', '_');
  return n + (std::get<1>(info.param) == models::mla::MlaPath::Plain ? "_Plain" : "_Absorbed");
}

}  // namespace inferlab::test
