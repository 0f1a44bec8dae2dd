// Chapter 12: attention through a block table against the float64 formula on the same keys and
// values laid out contiguously: random permuted tables, block sizes 1, 16 and 32, lengths that
// are not multiples of the block size, prefill rows and decode rows, GQA; split-KV with any
// number of splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "attention_exact.h"
#include "chapters/12_paged_attention/paged_attention.h"
#include "test_util.h"

using namespace inferlab;
using namespace inferlab::ch12;

namespace {

struct Paged {
  Tensor k_pool, v_pool, k, v;  // the pools, and the same positions contiguous [S, K, H]
  std::vector<std::int32_t> table;
  std::int64_t block_size;
  PagedKV view() const { return {k_pool, v_pool, table, block_size}; }
};

// A pool with more blocks than the sequence needs, the sequence's blocks in random order, and
// every other row of the pool filled with garbage that a wrong lookup would read.
Paged random_paged(std::mt19937_64& rng, std::int64_t S, std::int64_t B, std::int64_t K, std::int64_t H) {
  Paged p;
  p.block_size = B;
  const std::int64_t need = (S + B - 1) / B, blocks = need * 2 + 3;
  p.k_pool = test::uniform(rng, {blocks, B, K, H}, -50, 50), p.v_pool = test::uniform(rng, {blocks, B, K, H}, -50, 50);
  std::vector<std::int32_t> all(static_cast<std::size_t>(blocks));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  p.table.assign(all.begin(), all.begin() + need);
  p.k = test::uniform(rng, {S, K, H}), p.v = test::uniform(rng, {S, K, H});
  write_slots(p.view(), 0, p.k, p.v);
  return p;
}

void expect_matches(const Tensor& got, const test::AttnRef& want, const std::string& what) {
  test::expect_within(got.to_double_vector(), want.out, want.bound, what);
}

}  // namespace

TEST(PagedAttention, EqualsAttentionOverTheSameRowsContiguous) {
  auto rng = test::rng_for_test();
  const std::int64_t N = 8, K = 2, H = 16;
  for (const std::int64_t B : {1, 16, 32})
    for (const std::int64_t S : {1, 17, 45, 100})
      for (const std::int64_t T : {1, 5}) {
        if (T > S) continue;
        const Paged p = random_paged(rng, S, B, K, H);
        const Tensor q = test::uniform(rng, {T, N, H});
        AttentionParams ap;
        ap.q_offset = S - T;
        const test::AttnRef want = test::attention_exact(q, p.k, p.v, ap);
        const std::string what = "B = " + std::to_string(B) + ", S = " + std::to_string(S) + ", T = " + std::to_string(T);
        Tensor out = Tensor::empty(q.shape(), DType::F32);
        ch12::ref::paged_attention(q, p.view(), S - T, out);
        expect_matches(out, want, "ref, " + what);
        paged_attention(q, p.view(), S - T, out, 1);
        expect_matches(out, want, "fast, " + what);
        // The two paths: paged and contiguous (ops::attention on the rows gathered in order).
        const Tensor contiguous = ops::attention(q, p.k, p.v, ap);
        const auto a = out.to_double_vector(), b = contiguous.to_double_vector();
        for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2 * want.bound[i]) << what;
      }
}

// Split-KV: the ranges' softmax statistics merged give the one-pass result, for any number of
// splits (more splits than positions included). The merge rescales each range by exp(m_r − m),
// one more exponential and product per weight: a relative 3u more than one pass.
TEST(PagedAttention, SplitKvWithAnyNumberOfSplitsEqualsOnePass) {
  auto rng = test::rng_for_test();
  const std::int64_t N = 4, K = 4, H = 32, S = 300, T = 3;
  const Paged p = random_paged(rng, S, 16, K, H);
  const Tensor q = test::uniform(rng, {T, N, H});
  AttentionParams ap;
  ap.q_offset = S - T;
  const test::AttnRef want = test::attention_exact(q, p.k, p.v, ap, 3 * 0x1p-24);
  for (const std::int64_t splits : {1, 2, 3, 7, 16, 299, 300, 1000}) {
    Tensor out = Tensor::empty(q.shape(), DType::F32);
    paged_attention(q, p.view(), S - T, out, splits);
    expect_matches(out, want, std::to_string(splits) + " splits");
  }
}

// The slot mapping by hand: block size 4, table {5, 2, 9}.
TEST(PagedAttention, TheSlotOfAPosition) {
  const std::vector<std::int32_t> table = {5, 2, 9};
  const std::vector<std::int64_t> want = {20, 21, 22, 23, 8, 9, 10, 11, 36, 37};
  for (std::int64_t p = 0; p < 10; ++p) EXPECT_EQ(slot(table, 4, p), want[static_cast<std::size_t>(p)]) << p;
}

TEST(PagedAttention, Errors) {
  auto rng = test::rng_for_test();
  Paged p = random_paged(rng, 20, 8, 2, 16);  // 3 blocks
  const Tensor q = test::uniform(rng, {1, 4, 16});
  Tensor out = Tensor::empty(q.shape(), DType::F32);
  test::expect_error([&] { paged_attention(q, p.view(), 24, out); }, {"25 positions", "3 blocks of 8"});
  p.table[1] = 1000;
  test::expect_error([&] { paged_attention(q, p.view(), 10, out); }, {"block 1000", "outside the pool"});
  p.table[1] = 0;
  const Tensor bad = test::uniform(rng, {1, 3, 16});
  Tensor bad_out = Tensor::empty(bad.shape(), DType::F32);
  test::expect_error([&] { paged_attention(bad, p.view(), 10, bad_out); }, {"dividing 3 query heads"});
  test::expect_error([&] { write_slots(p.view(), 20, p.k, p.v); }, {"positions up to 40", "3 blocks"});
}
