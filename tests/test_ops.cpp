// Every op on the CPU: the reference loop against float64 arithmetic on fresh random inputs,
// the fast path against both, and the checks' error messages. Each tolerance is an error
// bound derived from the float32 unit roundoff u = 2^-24 (see the comment at each bound).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "attention_exact.h"
#include "common/cached_batch.h"
#include "common/hf_config.h"
#include "common/metrics.h"
#include "common/ops.h"
#include "common/ops_cpu.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::attention_exact;
using test::AttnRef;
using test::expect_error;
using test::expect_within;
using test::gamma;
using test::pack;
using test::Packed;
constexpr double u = 0x1p-24;  // float32 unit roundoff

// ---------------------------------------------------------------------------------------------
// matmul
struct MatmulCase {
  std::int64_t M, K, N;
  DType wt;
};

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, ReferenceAndFastPathWithinTheDotProductBound) {
  const auto [M, K, N, wt] = GetParam();
  test::ThreadCount threads(2);  // the fast path's threaded partition, on shapes above its threshold
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {M, K});
  Tensor w = test::uniform_as(rng, {N, K}, wt);
  const auto X = x.to_double_vector(), W = w.to_double_vector();
  std::vector<double> exact(M * N), bound(M * N);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (std::int64_t k = 0; k < K; ++k) s += X[m * K + k] * W[n * K + k], a += std::fabs(X[m * K + k] * W[n * K + k]);
      exact[m * N + n] = s;
      // |fl(x·w) − x·w| ≤ γ_K Σ|x_k w_k| for any summation order, with or without FMA; the
      // float64 reference itself is off by at most γ_K(2^-53) Σ|x_k w_k|.
      bound[m * N + n] = (gamma(K) + gamma(K, 0x1p-53)) * a;
    }
  Tensor r = Tensor::empty({M, N}, DType::F32), f = Tensor::empty({M, N}, DType::F32);
  ref::matmul(x, w, r);
  expect_within(r.to_double_vector(), exact, bound, "ref::matmul vs float64");
  std::vector<double> both(bound.size());
  for (std::size_t i = 0; i < both.size(); ++i) both[i] = 2 * bound[i];
  // Every version of the batched GEMV (8 to 32 rows; the others ignore the choice).
  for (const cpu::BatchGemv kind :
       {cpu::BatchGemv::Rows, cpu::BatchGemv::Tiles, cpu::BatchGemv::Broadcast, cpu::BatchGemv::Auto}) {
    const std::string name = kind == cpu::BatchGemv::Rows        ? " (rows)"
                             : kind == cpu::BatchGemv::Tiles     ? " (tiles)"
                             : kind == cpu::BatchGemv::Broadcast ? " (broadcast)"
                                                                 : " (auto)";
    cpu::set_batch_gemv(kind);
    ops::matmul(x, w, f);
    cpu::set_batch_gemv(cpu::kDefaultBatchGemv);
    expect_within(f.to_double_vector(), exact, bound, "ops::matmul vs float64" + name);
    expect_within(f.to_double_vector(), r.to_double_vector(), both, "ops::matmul vs ref::matmul" + name);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Values(MatmulCase{1, 64, 48, DType::F32}, MatmulCase{1, 257, 33, DType::BF16},
                                           MatmulCase{1, 1024, 515, DType::F32}, MatmulCase{2, 1027, 300, DType::BF16},
                                           MatmulCase{1, 1000, 130, DType::F16}, MatmulCase{3, 128, 64, DType::BF16},
                                           MatmulCase{4, 77, 19, DType::F32}, MatmulCase{17, 300, 65, DType::F32},
                                           MatmulCase{33, 128, 300, DType::BF16}, MatmulCase{9, 64, 40, DType::F16},
                                           MatmulCase{5, 300, 37, DType::F32}, MatmulCase{6, 130, 21, DType::BF16},
                                           MatmulCase{3, 1031, 515, DType::F32}, MatmulCase{5, 96, 2, DType::F16},
                                           MatmulCase{5, 1031, 64, DType::BF16}, MatmulCase{6, 64, 40, DType::F32},
                                           // a batched decode step: whole tiles, row and column tails, a K tail
                                           MatmulCase{8, 1024, 64, DType::F32}, MatmulCase{16, 1031, 130, DType::BF16},
                                           MatmulCase{31, 70, 37, DType::F32}, MatmulCase{32, 300, 515, DType::F32},
                                           MatmulCase{12, 200, 41, DType::F32}, MatmulCase{9, 300, 130, DType::F32},
                                           MatmulCase{16, 1031, 70, DType::F32}),
                         [](const auto& info) {
  return "M" + std::to_string(info.param.M) + "_K" + std::to_string(info.param.K) + "_N" + std::to_string(info.param.N) +
         "_" + std::string(dtype_name(info.param.wt));
});

// Auto, the default batched GEMV, is the broadcast kernel from kBroadcastMinRows rows of x by f32
// weights and the tiles otherwise: the two sum in different orders, so each choice shows in the
// bits (MatmulTest only bounds them).
TEST(Matmul, AutoIsTheBroadcastKernelFromItsRowCountAndTheTilesBelow) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  const std::int64_t K = 300, N = 130;
  auto with = [](cpu::BatchGemv kind, const Tensor& x, const Tensor& w) {
    cpu::set_batch_gemv(kind);
    Tensor out = Tensor::empty({x.size(0), w.size(0)}, DType::F32);
    ops::matmul(x, w, out);
    cpu::set_batch_gemv(cpu::kDefaultBatchGemv);
    return out.to_double_vector();
  };
  for (const DType wt : {DType::F32, DType::BF16})
    for (const std::int64_t M :
         {std::int64_t{8}, cpu::kBroadcastMinRows, std::int64_t{16}, std::int64_t{17}, std::int64_t{32}}) {
      SCOPED_TRACE(std::string(dtype_name(wt)) + " weights, M = " + std::to_string(M));
      const Tensor x = test::uniform(rng, {M, K}), w = test::uniform_as(rng, {N, K}, wt);
      const bool broadcast = wt == DType::F32 && M >= cpu::kBroadcastMinRows;
      const auto tiles = with(cpu::BatchGemv::Tiles, x, w), auto_ = with(cpu::BatchGemv::Auto, x, w);
      EXPECT_EQ(auto_, broadcast ? with(cpu::BatchGemv::Broadcast, x, w) : tiles);
      if (broadcast) {
        EXPECT_NE(auto_, tiles) << "the two kernels sum in different orders: these shapes should show it";
      }
    }
}

// With 5 or 6 rows of x the fast path dots two weight rows at a time (a verification pass). Each
// output must be what the one-weight-row kernel of the same library gives, bit for bit: the same
// sums in the same order, the pairs not mixed up, the odd last row of N done alone, both threads'
// halves. (bf16 weights take the same pairing; MatmulTest bounds them.)
TEST(Matmul, TwoWeightRowsAtATimeEqualOneAtATimeExactly) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  const std::int64_t K = 1031, N = 301;  // a K tail past the vectors; an odd N; work for both threads
  for (const std::int64_t M : {5, 6}) {
    SCOPED_TRACE("M = " + std::to_string(M));
    const Tensor x = test::uniform(rng, {M, K}), w = test::uniform(rng, {N, K});
    Tensor f = Tensor::empty({M, N}, DType::F32);
    ops::matmul(x, w, f);
    std::vector<float> one(static_cast<std::size_t>(M * N));
    for (std::int64_t n = 0; n < N; ++n) cpu::dot_rows(x.data<float>(), M, K, w.data<float>() + n * K, one.data() + n, N);
    for (std::int64_t i = 0; i < M * N; ++i)
      ASSERT_EQ(f.data<float>()[i], one[static_cast<std::size_t>(i)]) << "row " << i / N << ", column " << i % N;
  }
}

TEST(Matmul, SeveralWeightsSharingXEqualOneMatmulEachExactly) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  // q, k and v of a small model: k and v alone are below the work one op splits over threads;
  // K has a tail past the vectors, the Ns are odd. From 8 rows of x, one matmul each.
  const std::int64_t K = 1031;
  for (const DType wt : {DType::F32, DType::BF16, DType::F16})
    for (const std::int64_t M : {1, 3, 5, 6, 8}) {
      SCOPED_TRACE(std::string(dtype_name(wt)) + ", M = " + std::to_string(M));
      const Tensor x = test::uniform(rng, {M, K});
      std::vector<Tensor> w, fused, alone;
      for (const std::int64_t N : {301, 67, 67}) {
        w.push_back(test::uniform_as(rng, {N, K}, wt));
        fused.push_back(Tensor::empty({M, N}, DType::F32)), alone.push_back(ops::matmul(x, w.back()));
      }
      ops::matmuls(x, {&w[0], &w[1], &w[2]}, {&fused[0], &fused[1], &fused[2]});
      for (std::size_t j = 0; j < w.size(); ++j)
        for (std::int64_t i = 0; i < alone[j].numel(); ++i)
          ASSERT_EQ(fused[j].data<float>()[i], alone[j].data<float>()[i]) << "weight " << j << ", element " << i;
    }
  Tensor x = Tensor::zeros({2, 8}, DType::F32), w = Tensor::zeros({4, 8}, DType::F32),
         out = Tensor::zeros({2, 4}, DType::F32);
  const Tensor narrow = Tensor::zeros({4, 7}, DType::F32);
  expect_error([&] { ops::matmuls(x, {&w, &narrow}, {&out, &out}); }, {"matmul", "inner dimension"});
  expect_error([&] { ops::matmuls(x, {&w, &w}, {&out}); }, {"matmuls", "2 weights", "1 outputs"});
}

TEST(Matmul, CountsItsWork) {
  Tensor x = Tensor::zeros({3, 8}, DType::F32), w = Tensor::zeros({5, 8}, DType::BF16);
  metrics::CountScope outer;
  {
    metrics::CountScope inner;
    ops::matmul(x, w);
    EXPECT_EQ(inner.work().flops, 2.0 * 3 * 5 * 8);
    EXPECT_EQ(inner.work().bytes, 3 * 8 * 4 + 5 * 8 * 2 + 3 * 5 * 4);  // x + w + out, each once
  }
  EXPECT_EQ(outer.work().flops, 240.0);  // the inner scope's work reaches the outer one
}

TEST(Matmul, ShapeAndDtypeErrors) {
  Tensor x = Tensor::zeros({2, 8}, DType::F32);
  expect_error([&] { ops::matmul(x, Tensor::zeros({4, 7}, DType::F32)); }, {"matmul", "inner dimension"});
  expect_error([&] { ops::matmul(x, Tensor::zeros({4, 8}, DType::I8)); }, {"matmul", "w must be f32, f16 or bf16"});
  expect_error(
      [&] {
    ops::matmul(Tensor::zeros({2, 8}, DType::BF16), Tensor::zeros({4, 8}, DType::F32));
      },
      {"matmul", "x must be f32"});
  Tensor out = Tensor::zeros({2, 5}, DType::F32);
  expect_error([&] { ops::matmul(x, Tensor::zeros({4, 8}, DType::F32), out); }, {"matmul", "out", "[2, 4]"});
  Tensor wide = Tensor::zeros({4, 16}, DType::F32);
  expect_error([&] { ops::matmul(x, wide.slice(1, 0, 8)); }, {"matmul", "contiguous"});
}

// ---------------------------------------------------------------------------------------------
TEST(Add, ExactToOneRoundingAndBroadcastsARow) {
  auto rng = test::rng_for_test();
  Tensor a = test::uniform(rng, {7, 13}), b = test::uniform(rng, {7, 13}), row = test::uniform(rng, {13});
  const auto A = a.to_double_vector(), B = b.to_double_vector(), R = row.to_double_vector();
  std::vector<double> e1(A.size()), e2(A.size()), b1(A.size()), b2(A.size());
  for (std::size_t i = 0; i < A.size(); ++i) {
    e1[i] = A[i] + B[i], e2[i] = A[i] + R[i % 13];
    b1[i] = u * std::fabs(e1[i]), b2[i] = u * std::fabs(e2[i]);  // one rounding
  }
  expect_within(ops::add(a, b).to_double_vector(), e1, b1, "add");
  expect_within(ops::add(a, row).to_double_vector(), e2, b2, "add (row broadcast)");
  expect_error([&] { ops::add(a, Tensor::zeros({7}, DType::F32)); }, {"add", "one row"});
}

// ops::add runs cpu::add's threaded loop: the same bits as the reference loop, for a row or a
// whole tensor, in place, on shapes small and large enough to be split over the threads.
TEST(Add, ThreadedLoopEqualsTheReferenceExactly) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  for (const Shape& shape : {Shape{}, Shape{5}, Shape{3, 0}, Shape{7, 13}, Shape{96, 4099}}) {
    const std::int64_t L = shape.empty() ? 1 : shape.back();
    Tensor a = test::uniform(rng, shape), b = test::uniform(rng, shape), row = test::uniform(rng, {L});
    for (const Tensor* other : {&b, &row}) {
      if (shape.empty() && other == &row) continue;  // a 0-d tensor has no row
      Tensor want = Tensor::empty(shape, DType::F32), got = a.clone();
      ref::add(a, *other, want);
      ops::add(got, *other, got);  // in place, as the residual stream is updated
      EXPECT_EQ(got.to_double_vector(), want.to_double_vector()) << shape_str(shape) << (other == &row ? " row" : "");
    }
  }
}

// ---------------------------------------------------------------------------------------------
TEST(RmsNorm, WithinItsBound) {
  auto rng = test::rng_for_test();
  for (DType wt : {DType::F32, DType::BF16}) {
    const std::int64_t M = 5, D = 96;
    Tensor x = test::uniform(rng, {M, D}, -3, 3), w = test::uniform_as(rng, {D}, wt, 0.5f, 1.5f);
    const float eps = 1e-5f;
    const auto X = x.to_double_vector(), W = w.to_double_vector();
    std::vector<double> exact(M * D), bound(M * D);
    for (std::int64_t m = 0; m < M; ++m) {
      double ss = 0;
      for (std::int64_t i = 0; i < D; ++i) ss += X[m * D + i] * X[m * D + i];
      const double inv = 1.0 / std::sqrt(ss / D + static_cast<double>(eps));
      for (std::int64_t i = 0; i < D; ++i) {
        exact[m * D + i] = X[m * D + i] * inv * W[i];
        // Sum of squares: relative γ_D; /D, +eps: 2u; the square root halves that and adds u;
        // 1/sqrt: u; two products: 2u. Relative bound (γ_{D+2})/2 + 4u, plus slack of 2u for
        // sqrt/rsqrt implementations within 1 ulp more.
        bound[m * D + i] = (0.5 * gamma(D + 2) + 6 * u) * std::fabs(exact[m * D + i]);
      }
    }
    Tensor out = Tensor::empty({M, D}, DType::F32);
    ref::rmsnorm(x, w, eps, out);
    expect_within(out.to_double_vector(), exact, bound, "ref::rmsnorm");
    expect_within(ops::rmsnorm(x, w, eps).to_double_vector(), exact, bound, "ops::rmsnorm");
  }
  expect_error(
      [] {
    ops::rmsnorm(Tensor::zeros({2, 8}, DType::F32), Tensor::zeros({7}, DType::F32), 1e-5f);
      },
      {"rmsnorm", "last dimension"});
}

// ---------------------------------------------------------------------------------------------
// RoPE against the rotation written out in double, for both pairings.
std::vector<double> rope_exact(const Tensor& x, const std::vector<std::int32_t>& pos, const Tensor& inv_freq,
                               RopePairing pairing, std::vector<double>& bound, std::int64_t begin = 0) {
  const std::int64_t T = x.size(0), Hn = x.size(1), D = x.size(2), half = inv_freq.size(0);
  auto X = x.to_double_vector();
  const auto F = inv_freq.to_double_vector();
  bound.assign(X.size(), 0.0);
  auto out = X;
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < Hn; ++h)
      for (std::int64_t j = 0; j < half; ++j) {
        const std::int64_t base = (t * Hn + h) * D + begin;
        const std::int64_t ia = base + (pairing == RopePairing::HalfSplit ? j : 2 * j);
        const std::int64_t ib = base + (pairing == RopePairing::HalfSplit ? j + half : 2 * j + 1);
        const double ang = pos[t] * F[j], a = X[ia], b = X[ib];
        out[ia] = a * std::cos(ang) - b * std::sin(ang);
        out[ib] = a * std::sin(ang) + b * std::cos(ang);
        // cos and sin rounded to float (u each), two products (u each), one sum (u): at most
        // 3u(|a| + |b|); 4u leaves room for the double reference's own rounding.
        bound[ia] = bound[ib] = 4 * u * (std::fabs(a) + std::fabs(b));
      }
  return out;
}

TEST(Rope, BothPairingsWithinTheirBound) {
  auto rng = test::rng_for_test();
  const std::int64_t T = 6, Hn = 3, D = 16;
  std::vector<std::int32_t> pos = {0, 1, 7, 100, 4095, 131071};
  Tensor positions = Tensor::from_vector(pos, {T});
  for (auto [rot, pairing] : {std::pair{D, RopePairing::HalfSplit}, std::pair{D, RopePairing::Adjacent},
                              std::pair{std::int64_t{8}, RopePairing::HalfSplit}}) {
    Tensor inv = rope_inv_freq(rot, 10000.0);
    Tensor x = test::uniform(rng, {T, Hn, D});
    std::vector<double> bound;
    const auto exact = rope_exact(x, pos, inv, pairing, bound);
    Tensor r = x.clone(), f = x.clone();
    ref::rope(r, positions, inv, pairing);
    ops::rope(f, positions, inv, pairing);
    expect_within(r.to_double_vector(), exact, bound, "ref::rope");
    expect_within(f.to_double_vector(), exact, bound, "ops::rope");
    // Position 0 is the identity, exactly; dimensions past the rotary ones are untouched.
    for (std::int64_t i = 0; i < Hn * D; ++i) EXPECT_EQ(r.data<float>()[i], x.data<float>()[i]);
    if (rot < D) {
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t d = rot; d < D; ++d) EXPECT_EQ(r.at<float>({t, 0, d}), x.at<float>({t, 0, d}));
    }
  }
}

TEST(Rope, TrailingRangeWithinTheBoundAndTheRestUntouched) {
  // MLA's layout: each head is [no-RoPE part | RoPE part]; only the trailing rot dimensions turn.
  auto rng = test::rng_for_test();
  const std::int64_t T = 5, Hn = 3, D = 24, rot = 8, begin = D - rot;
  std::vector<std::int32_t> pos = {3, 1, 77, 4095, 131071};
  Tensor positions = Tensor::from_vector(pos, {T});
  Tensor inv = rope_inv_freq(rot, 10000.0);
  for (RopePairing pairing : {RopePairing::HalfSplit, RopePairing::Adjacent}) {
    Tensor x = test::uniform(rng, {T, Hn, D});
    std::vector<double> bound;
    const auto exact = rope_exact(x, pos, inv, pairing, bound, begin);
    Tensor r = x.clone(), f = x.clone();
    ref::rope(r, positions, inv, pairing, begin);
    ops::rope(f, positions, inv, pairing, begin);
    expect_within(r.to_double_vector(), exact, bound, "ref::rope (trailing)");
    expect_within(f.to_double_vector(), exact, bound, "ops::rope (trailing)");
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < Hn; ++h) {
        for (std::int64_t d = 0; d < begin; ++d) EXPECT_EQ(r.at<float>({t, h, d}), x.at<float>({t, h, d}));
        // Every position here is non-zero, so each rotated pair moves (the range is not ignored).
        EXPECT_NE(r.at<float>({t, h, begin}), x.at<float>({t, h, begin}));
      }
  }
  // A range in the middle: the dimensions on both sides are kept.
  Tensor x = test::uniform(rng, {T, Hn, D});
  Tensor r = x.clone();
  std::vector<double> bound;
  const auto exact = rope_exact(x, pos, inv, RopePairing::Adjacent, bound, 6);
  ops::rope(r, positions, inv, RopePairing::Adjacent, 6);
  expect_within(r.to_double_vector(), exact, bound, "ops::rope (middle)");
}

TEST(Rope, AdjacentPairingIsHalfSplitOnPermutedDimensions) {
  // The llama2.c <-> Hugging Face conversion in one identity: moving element 2j to j and
  // 2j+1 to j + D/2 turns adjacent-pair RoPE into rotate-half RoPE.
  auto rng = test::rng_for_test();
  const std::int64_t T = 4, Hn = 2, D = 8, half = D / 2;
  Tensor positions = Tensor::from_vector(std::vector<std::int32_t>{0, 3, 9, 27}, {T});
  Tensor inv = rope_inv_freq(D, 500000.0);
  Tensor x = test::uniform(rng, {T, Hn, D});
  Tensor perm = Tensor::empty({T, Hn, D}, DType::F32);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < Hn; ++h)
      for (std::int64_t j = 0; j < half; ++j) {
        perm.at<float>({t, h, j}) = x.at<float>({t, h, 2 * j});
        perm.at<float>({t, h, j + half}) = x.at<float>({t, h, 2 * j + 1});
      }
  ref::rope(x, positions, inv, RopePairing::Adjacent);
  ref::rope(perm, positions, inv, RopePairing::HalfSplit);
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < Hn; ++h)
      for (std::int64_t j = 0; j < half; ++j) {
        EXPECT_EQ(perm.at<float>({t, h, j}), x.at<float>({t, h, 2 * j}));
        EXPECT_EQ(perm.at<float>({t, h, j + half}), x.at<float>({t, h, 2 * j + 1}));
      }
}

// YaRN against transformers 4.57.6's _compute_yarn_parameters, run in float64 (the numbers
// below are its output): a ramp with whole ends (A), fractional ends and mscale != mscale_all_dim
// (B), the defaults with an explicit attention_factor (C), and equal ends (D: hi += 0.001).
TEST(Rope, YarnFrequenciesAndAttentionFactorMatchTransformers) {
  struct Case {
    const char* name;
    std::int64_t dim;
    double theta;
    YarnScaling y;
    std::vector<double> inv_freq;
    double attention_factor;
  };
  auto yarn = [](double s, double L, double fast, double slow, bool truncate, double ms, double ms_all, double af) {
    YarnScaling y;
    y.factor = s, y.original_context = L, y.beta_fast = fast, y.beta_slow = slow, y.truncate = truncate;
    y.mscale = ms, y.mscale_all_dim = ms_all, y.attention_factor = af;
    return y;
  };
  const Case cases[] = {
      {"A",
       16,
       10000,
       yarn(4, 128, 32, 1, true, 1, 1, 0),
       {1.0, 0.237170822156548, 0.04999999850988388, 0.007905694150420948, 0.0025, 0.0007905694150420947, 0.00025,
        7.905694150420948e-05},
       1.0},
      {"B",
       8,
       100,
       yarn(4, 64, 4, 1, false, 1, 0.5, 0),
       {1.0, 0.2791745498060977, 0.02599659711122513, 0.007905694150420948},
       1.0648216253695715},
      {"C",
       8,
       500,
       yarn(8, 64, 32, 1, true, 0, 0, 0.9),
       {1.0, 0.11895426713706346, 0.005590169943749474, 0.0011821770112539697},
       0.9},
      {"D", 8, 10000, yarn(2, 4096, 2, 2, false, 0, 0, 0), {1.0, 0.1, 0.01, 0.0005}, 1.0693147180559945},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // One float32 rounding of the result (u · inv), plus transformers' own ramp, computed in
    // float32 (a few roundings, at most 4u of the ramp's [0, 1]), which moves inv by up to
    // 4u · f · (1 - 1/s) with f the plain frequency (case A's 0.0499999985 for 0.05).
    const auto plain = rope_inv_freq(c.dim, c.theta).to_double_vector();
    std::vector<double> bound;
    for (std::size_t i = 0; i < plain.size(); ++i)
      bound.push_back(u * c.inv_freq[i] + 4 * u * plain[i] * (1 - 1 / c.y.factor));
    expect_within(yarn_inv_freq(c.dim, c.theta, c.y).to_double_vector(), c.inv_freq, bound, "yarn_inv_freq");
    EXPECT_NEAR(yarn_attention_factor(c.y), c.attention_factor, 1e-15);
  }
  EXPECT_EQ(yarn_mscale(1.0, 3.0), 1.0);  // no extension, no correction
  EXPECT_NEAR(yarn_mscale(40.0, 0.707), 0.1 * 0.707 * std::log(40.0) + 1, 1e-15);
  expect_error([] { yarn_inv_freq(8, 1.0, YarnScaling{}); }, {"yarn_inv_freq", "theta 1 must be above 1"});
}

TEST(Rope, Errors) {
  Tensor x = Tensor::zeros({2, 1, 8}, DType::F32);
  Tensor pos = Tensor::from_vector(std::vector<std::int32_t>{0, 1}, {2});
  expect_error([&] { ops::rope(x, pos, rope_inv_freq(10, 1e4), RopePairing::HalfSplit); }, {"rope", "head dimension is 8"});
  Tensor pos3 = Tensor::from_vector(std::vector<std::int32_t>{0, 1, 2}, {3});
  expect_error([&] { ops::rope(x, pos3, rope_inv_freq(8, 1e4), RopePairing::HalfSplit); }, {"rope", "3 positions"});
  expect_error([] { rope_inv_freq(7, 1e4); }, {"even"});
  // A range that runs past the head, or starts before it.
  expect_error([&] { ops::rope(x, pos, rope_inv_freq(4, 1e4), RopePairing::Adjacent, 5); },
               {"rope", "dimensions 5..8", "head dimension is 8"});
  Tensor fits = x.clone();
  ops::rope(fits, pos, rope_inv_freq(4, 1e4), RopePairing::Adjacent, 4);  // 4..7: the last that fits
  expect_error([&] { ops::rope(x, pos, rope_inv_freq(4, 1e4), RopePairing::HalfSplit, -1); }, {"rope", "dimensions -1..2"});
}

// ---------------------------------------------------------------------------------------------
TEST(Softmax, WithinItsBoundAndRowsSumToOne) {
  auto rng = test::rng_for_test();
  const std::int64_t M = 4, N = 300;
  Tensor x = test::uniform(rng, {M, N}, -4, 4);
  const auto X = x.to_double_vector();
  std::vector<double> exact(M * N), bound(M * N);
  for (std::int64_t m = 0; m < M; ++m) {
    double mx = -INFINITY, s = 0, spread = 0;
    for (std::int64_t i = 0; i < N; ++i) mx = std::max(mx, X[m * N + i]);
    for (std::int64_t i = 0; i < N; ++i) s += std::exp(X[m * N + i] - mx), spread = std::max(spread, mx - X[m * N + i]);
    for (std::int64_t i = 0; i < N; ++i) {
      const double e = std::exp(X[m * N + i] - mx) / s;
      exact[m * N + i] = e;
      // x − max: u|x − max| absolute, which exp turns into relative; exp itself ≤ 2u; the sum
      // γ_N (and every term's error, at most u·spread + 2u); the division u.
      bound[m * N + i] = ((mx - X[m * N + i]) * u + spread * u + 5 * u + gamma(N)) * e + 1e-300;
    }
  }
  Tensor r = Tensor::empty({M, N}, DType::F32);
  ref::softmax(x, r);
  expect_within(r.to_double_vector(), exact, bound, "ref::softmax");
  expect_within(ops::softmax(x).to_double_vector(), exact, bound, "ops::softmax");
  // Large logits do not overflow (the max is subtracted first).
  Tensor big = Tensor::from_vector(std::vector<float>{1000.0f, 1000.0f}, {1, 2});
  EXPECT_EQ(ops::softmax(big).to_float_vector(), (std::vector<float>{0.5f, 0.5f}));
}

TEST(Swiglu, WithinItsBound) {
  auto rng = test::rng_for_test();
  Tensor g = test::uniform(rng, {3, 200}, -8, 8), up = test::uniform(rng, {3, 200});
  const auto G = g.to_double_vector(), U = up.to_double_vector();
  std::vector<double> exact(G.size()), bound(G.size());
  for (std::size_t i = 0; i < G.size(); ++i) {
    exact[i] = G[i] / (1 + std::exp(-G[i])) * U[i];
    // exp ≤ 2u, 1 + e^-g: u (both positive), division u, product u: 5u relative; 6u with the
    // reference's own rounding.
    bound[i] = 6 * u * std::fabs(exact[i]);
  }
  Tensor r = Tensor::empty(g.shape(), DType::F32);
  ref::swiglu(g, up, r);
  expect_within(r.to_double_vector(), exact, bound, "ref::swiglu");
  expect_within(ops::swiglu(g, up).to_double_vector(), exact, bound, "ops::swiglu");
  // ops::swiglu is cpu::swiglu, the reference's expression over the threads: the same bits, also
  // where the elements are split over the threads.
  test::ThreadCount threads(2);
  Tensor g2 = test::uniform(rng, {32, 2816}, -8, 8), up2 = test::uniform(rng, {32, 2816}),
         r2 = Tensor::empty(g2.shape(), DType::F32);
  ref::swiglu(g2, up2, r2);
  EXPECT_EQ(ops::swiglu(g2, up2).to_double_vector(), r2.to_double_vector());
}

// ---------------------------------------------------------------------------------------------
TEST(Embedding, ExactRowsForEveryTableDtype) {
  auto rng = test::rng_for_test();
  for (DType d : {DType::F32, DType::F16, DType::BF16}) {
    Tensor table = test::uniform_as(rng, {10, 6}, d);
    Tensor ids = Tensor::from_vector(std::vector<std::int32_t>{3, 0, 9, 3}, {4});
    Tensor out = ops::embedding(table, ids);
    const auto T = table.to_float_vector();
    for (std::int64_t t = 0; t < 4; ++t)
      for (std::int64_t i = 0; i < 6; ++i)
        EXPECT_EQ(out.at<float>({t, i}), T[ids.data<std::int32_t>()[t] * 6 + i]) << dtype_name(d);
  }
  Tensor table = Tensor::zeros({10, 6}, DType::F32);
  expect_error(
      [&] {
    ops::embedding(table, Tensor::from_vector(std::vector<std::int32_t>{2, 10}, {2}));
      },
      {"token id 10", "position 1", "[0, 10)"});
  expect_error([&] { ops::embedding(table, Tensor::from_vector(std::vector<std::int32_t>{-1}, {1})); }, {"token id -1"});
}

// ---------------------------------------------------------------------------------------------
// Attention against float64 (test::attention_exact in attention_exact.h, with its bound).
struct AttnCase {
  std::int64_t T, S, Nq, Nk, Dqk, Dv, window;
  bool causal;
};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

TEST_P(AttentionTest, ReferenceAndFastPathWithinTheirBound) {
  const auto c = GetParam();
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  Tensor q = test::uniform(rng, {c.T, c.Nq, c.Dqk}, -2, 2), k = test::uniform(rng, {c.S, c.Nk, c.Dqk}, -2, 2),
         v = test::uniform(rng, {c.S, c.Nk, c.Dv});
  AttentionParams p;
  p.window = c.window, p.causal = c.causal;
  const AttnRef e = attention_exact(q, k, v, p);
  Tensor r = Tensor::empty({c.T, c.Nq, c.Dv}, DType::F32);
  ref::attention(q, k, v, r, p);
  expect_within(r.to_double_vector(), e.out, e.bound, "ref::attention vs float64");
  Tensor f = ops::attention(q, k, v, p);
  expect_within(f.to_double_vector(), e.out, e.bound, "ops::attention vs float64");
  std::vector<double> both(e.bound.size());
  for (std::size_t i = 0; i < both.size(); ++i) both[i] = 2 * e.bound[i];
  expect_within(f.to_double_vector(), r.to_double_vector(), both, "ops::attention vs ref::attention");
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(AttnCase{1, 1, 4, 4, 8, 8, 0, true},       // first token
                                           AttnCase{9, 9, 4, 4, 16, 16, 0, true},     // prefill, MHA
                                           AttnCase{1, 40, 8, 2, 32, 32, 0, true},    // decode, GQA
                                           AttnCase{5, 33, 6, 1, 8, 8, 0, true},      // MQA, queries at the end
                                           AttnCase{12, 12, 4, 2, 8, 8, 4, true},     // sliding window
                                           AttnCase{6, 20, 4, 2, 16, 16, 5, true},    // window, queries at the end
                                           AttnCase{1, 30, 4, 1, 8, 8, 7, true},      // window, decode
                                           AttnCase{7, 7, 2, 2, 8, 8, 0, false},      // bidirectional
                                           AttnCase{3, 11, 4, 2, 8, 8, 0, false},     // bidirectional, T < S
                                           AttnCase{8, 5, 2, 1, 8, 8, 0, false},      // bidirectional, T > S
                                           AttnCase{4, 10, 4, 2, 24, 16, 0, true},    // MLA-like: Dv < Dqk
                                           AttnCase{3, 8, 2, 2, 8, 20, 3, true},      // Dv > Dqk, window
                                           AttnCase{5, 9, 4, 4, 12, 6, 0, false},     // Dv < Dqk, bidirectional
                                           AttnCase{32, 64, 8, 2, 32, 32, 0, true},   // large enough to thread
                                           AttnCase{32, 64, 8, 2, 48, 16, 9, true}),  // the same, MLA-like, window
                         [](const auto& info) {
  const auto& c = info.param;
  return "T" + std::to_string(c.T) + "_S" + std::to_string(c.S) + "_N" + std::to_string(c.Nq) + "_K" + std::to_string(c.Nk) +
         "_D" + std::to_string(c.Dqk) + "_V" + std::to_string(c.Dv) + "_W" + std::to_string(c.window) +
         (c.causal ? "_causal" : "_bidir");
});

TEST(Attention, GqaEqualsMhaOnRepeatedKv) {
  auto rng = test::rng_for_test();
  const std::int64_t T = 5, S = 11, Nq = 8, Nk = 2, H = 16, group = Nq / Nk;
  Tensor q = test::uniform(rng, {T, Nq, H}), k = test::uniform(rng, {S, Nk, H}), v = test::uniform(rng, {S, Nk, H});
  Tensor kr = Tensor::empty({S, Nq, H}, DType::F32), vr = Tensor::empty({S, Nq, H}, DType::F32);
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t h = 0; h < Nq; ++h)
      for (std::int64_t d = 0; d < H; ++d)
        kr.at<float>({s, h, d}) = k.at<float>({s, h / group, d}), vr.at<float>({s, h, d}) = v.at<float>({s, h / group, d});
  // The reference loop computes each query head the same way whichever KV layout: identical bits.
  Tensor a = Tensor::empty(q.shape(), DType::F32), b = Tensor::empty(q.shape(), DType::F32);
  ref::attention(q, k, v, a);
  ref::attention(q, kr, vr, b);
  EXPECT_EQ(a.to_float_vector(), b.to_float_vector());
  // The fast path groups query heads per KV head; the same dots, so the same bits too.
  EXPECT_EQ(ops::attention(q, k, v).to_float_vector(), ops::attention(q, kr, vr).to_float_vector());
}

// Scores past float's exp range: exp(89) overflows float32, so a softmax that does not subtract
// the row's largest score first gets inf / inf = NaN. Subtracting it, every weight is exp of a
// score at most 0, and the result is as close to float64 as ever (the bound grows with |score|).
TEST(Attention, ScoresBeyondFloatsExpRangeStayWithinTheBound) {
  auto rng = test::rng_for_test();
  const std::int64_t T = 4, S = 12, N = 2, D = 8;
  Tensor q = test::uniform(rng, {T, N, D}, -2, 2), k = test::uniform(rng, {S, N, D}, -2, 2),
         v = test::uniform(rng, {S, N, D});
  for (const bool causal : {true, false}) {
    AttentionParams p;
    p.causal = causal, p.scale = 30.0f;  // scores of several hundred
    double top = -INFINITY;
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t j = 0; j < S; ++j) {
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += q.at<float>({t, 0, d}) * k.at<float>({j, 0, d});
        top = std::max(top, dot * p.scale);
      }
    ASSERT_GT(top, 89.0) << "the test needs a score whose exp overflows float32";
    const AttnRef e = attention_exact(q, k, v, p);
    Tensor r = Tensor::empty({T, N, D}, DType::F32);
    ref::attention(q, k, v, r, p);
    expect_within(r.to_double_vector(), e.out, e.bound, causal ? "ref::attention, causal" : "ref::attention, bidirectional");
    expect_within(ops::attention(q, k, v, p).to_double_vector(), e.out, e.bound,
                  causal ? "ops::attention, causal" : "ops::attention, bidirectional");
  }
}

TEST(Attention, OneRowAtATimeEqualsAllRowsAtOnce) {
  // Decoding's view (one query against the keys so far) and prefill's view (all queries,
  // causal mask) compute the same thing.
  auto rng = test::rng_for_test();
  const std::int64_t S = 10, N = 4, H = 8;
  Tensor q = test::uniform(rng, {S, N, H}), k = test::uniform(rng, {S, N, H}), v = test::uniform(rng, {S, N, H});
  const auto all = ops::attention(q, k, v).to_float_vector();
  for (std::int64_t t = 0; t < S; ++t) {
    const auto one = ops::attention(q.slice(0, t, t + 1).contiguous(), k.slice(0, 0, t + 1).contiguous(),
                                    v.slice(0, 0, t + 1).contiguous())
                         .to_float_vector();
    for (std::int64_t i = 0; i < N * H; ++i) EXPECT_EQ(one[i], all[t * N * H + i]) << "row " << t;
  }
}

TEST(Attention, WindowEdgeCases) {
  auto rng = test::rng_for_test();
  const std::int64_t S = 9, N = 2, H = 4;
  Tensor q = test::uniform(rng, {S, N, H}), k = test::uniform(rng, {S, N, H}), v = test::uniform(rng, {S, N, H});
  AttentionParams wide;
  wide.window = S;  // a window as long as the sequence is full attention
  EXPECT_EQ(ops::attention(q, k, v, wide).to_float_vector(), ops::attention(q, k, v).to_float_vector());
  AttentionParams self;
  self.window = 1;  // each query sees only its own key: the output is its own value
  EXPECT_EQ(ops::attention(q, k, v, self).to_float_vector(), v.to_float_vector());
}

TEST(Attention, CountsItsWork) {
  // q[3,4,8], k[5,2,8], v[5,2,6]: causal rows see 3, 4 and 5 keys; each seen key costs one
  // Dqk-long dot and one Dv-long multiply-add per query head.
  Tensor q = Tensor::zeros({3, 4, 8}, DType::F32), k = Tensor::zeros({5, 2, 8}, DType::F32),
         v = Tensor::zeros({5, 2, 6}, DType::F32);
  metrics::CountScope scope;
  Tensor out = ops::attention(q, k, v);
  EXPECT_EQ(out.shape(), (Shape{3, 4, 6}));
  EXPECT_EQ(scope.work().flops, 2.0 * (3 + 4 + 5) * 4 * (8 + 6));
  EXPECT_EQ(scope.work().bytes, 4.0 * (3 * 4 * 8 + 5 * 2 * 8 + 5 * 2 * 6 + 3 * 4 * 6));
  metrics::CountScope windowed;
  AttentionParams p;
  p.window = 2;  // every row sees 2 keys
  ops::attention(q, k, v, out, p);
  EXPECT_EQ(windowed.work().flops, 2.0 * (2 + 2 + 2) * 4 * (8 + 6));
}

TEST(Attention, Errors) {
  Tensor q = Tensor::zeros({3, 4, 8}, DType::F32), k = Tensor::zeros({2, 4, 8}, DType::F32);
  expect_error([&] { ops::attention(q, k, k); }, {"attention", "only 2 keys"});
  Tensor k5 = Tensor::zeros({5, 4, 8}, DType::F32), v6 = Tensor::zeros({5, 4, 6}, DType::F32);
  expect_error(
      [&] {
    ops::attention(q, Tensor::zeros({5, 4, 7}, DType::F32), v6);
      },
      {"attention", "q f32[3, 4, 8]", "k f32[5, 4, 7]", "head dimension"});
  expect_error(
      [&] {
    ops::attention(q, k5, Tensor::zeros({4, 4, 6}, DType::F32));
      },
      {"attention", "v f32[4, 4, 6]", "5 rows"});
  expect_error(
      [&] {
    ops::attention(q, k5, Tensor::zeros({5, 2, 6}, DType::F32));
      },
      {"attention", "v f32[5, 2, 6]", "4 heads"});
  Tensor out8 = Tensor::zeros({3, 4, 8}, DType::F32);
  expect_error([&] { ops::attention(q, k5, v6, out8); }, {"attention", "out f32[3, 4, 8]", "[3, 4, 6]"});
  expect_error([&] { ops::attention(q, k5, Tensor::zeros({5, 4}, DType::F32)); }, {"attention", "v must be 3-d"});
  Tensor k3 = Tensor::zeros({3, 3, 8}, DType::F32);
  expect_error([&] { ops::attention(q, k3, k3); }, {"4 query heads", "3 KV heads"});
  AttentionParams p;
  p.causal = false, p.window = 2;
  Tensor k4 = Tensor::zeros({3, 4, 8}, DType::F32);
  expect_error([&] { ops::attention(q, k4, k4, p); }, {"sliding window needs causal"});
}

// ---------------------------------------------------------------------------------------------
// Ragged batches: a ragged call is one attention call per sequence, bit for bit.
// Rows [begin, end) of a tensor, as doubles.
std::vector<double> rows(const Tensor& t, std::int64_t begin, std::int64_t end) {
  return t.slice(0, begin, end).to_double_vector();
}

TEST(AttentionRagged, EqualsOneCallPerSequenceExactly) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  const std::int64_t Nq = 8, Nk = 2, Dqk = 16, Dv = 12;
  // Decode rows (T_b = 1), prefill chunks (T_b < S_b), whole prompts (T_b = S_b) and a sequence
  // with no queries this step, in random lengths; plus one long prompt so the fast path threads.
  std::vector<std::pair<std::int64_t, std::int64_t>> lengths = {{48, 48}};
  for (int b = 0; b < 11; ++b) {
    const std::int64_t S = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const std::int64_t chunk = std::uniform_int_distribution<std::int64_t>(1, S)(rng);
    lengths.emplace_back(b % 4 == 0 ? 1 : b % 4 == 1 ? chunk : b % 4 == 2 ? S : 0, S);
  }
  std::shuffle(lengths.begin(), lengths.end(), rng);
  const Packed in = pack(rng, lengths, Nq, Nk, Dqk, Dv);
  const std::size_t B = lengths.size();
  // Explicit offsets: each sequence's queries somewhere among its keys, not only at the end.
  std::vector<std::int64_t> offsets;
  for (auto [T, S] : lengths) offsets.push_back(std::uniform_int_distribution<std::int64_t>(0, S - T)(rng));

  AttentionParams causal, window, bidir;
  window.window = 5, bidir.causal = false;
  for (const auto& [p, given] : {std::pair{causal, false}, std::pair{window, false}, std::pair{bidir, false},
                                 std::pair{causal, true}, std::pair{window, true}}) {
    RaggedBatch batch = in.batch;
    if (given) batch.q_offsets = offsets;
    Tensor r = Tensor::empty({in.q.size(0), Nq, Dv}, DType::F32);
    ref::attention_ragged(in.q, in.k, in.v, r, batch, p);
    const Tensor f = ops::attention_ragged(in.q, in.k, in.v, batch, p);
    for (std::size_t b = 0; b < B; ++b) {
      const std::int64_t q0 = batch.q_starts[b], q1 = batch.q_starts[b + 1];
      const std::int64_t k0 = batch.kv_starts[b], k1 = batch.kv_starts[b + 1];
      const Tensor qb = in.q.slice(0, q0, q1), kb = in.k.slice(0, k0, k1), vb = in.v.slice(0, k0, k1);
      AttentionParams pb = p;
      if (given) pb.q_offset = offsets[b];
      Tensor rb = Tensor::empty({q1 - q0, Nq, Dv}, DType::F32);
      ref::attention(qb, kb, vb, rb, pb);
      const std::string what = "sequence " + std::to_string(b) + " (T " + std::to_string(q1 - q0) + ", S " +
                               std::to_string(k1 - k0) + ", window " + std::to_string(p.window) +
                               (p.causal ? "" : ", bidirectional") + (given ? ", given offset" : "") + ")";
      EXPECT_EQ(rows(r, q0, q1), rb.to_double_vector()) << "ref::attention_ragged, " << what;
      EXPECT_EQ(rows(f, q0, q1), ops::attention(qb, kb, vb, pb).to_double_vector()) << "ops::attention_ragged, " << what;
      // And both against the formula, so that agreeing with a wrong single call cannot pass.
      const AttnRef e = attention_exact(qb, kb, vb, pb);
      expect_within(rows(f, q0, q1), e.out, e.bound, "ops::attention_ragged vs float64, " + what);
    }
  }
}

// Attention over caches where they are: each sequence's keys and values in storage of its own
// (rows, with room to spare) or in blocks of one shared pool, scattered (chapter 12), read in one
// call. Equal, bit for bit, to ops::attention over the same rows gathered in order; rows no
// sequence names are left untouched.
TEST(AttentionCached, EqualsOneCallPerSequenceExactly) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  struct Heads {
    std::int64_t Nq, Nk, Dqk, Dv;
  };
  for (const Heads& h : {Heads{8, 8, 16, 16}, Heads{8, 2, 16, 12}, Heads{8, 1, 16, 16}, Heads{4, 4, 192, 128}}) {
    std::vector<std::pair<std::int64_t, std::int64_t>> lengths = {{40, 40}};
    for (int b = 0; b < 9; ++b) {
      const std::int64_t S = std::uniform_int_distribution<std::int64_t>(1, 37)(rng);
      const std::int64_t chunk = std::uniform_int_distribution<std::int64_t>(1, S)(rng);
      lengths.emplace_back(b % 3 == 0 ? 1 : b % 3 == 1 ? chunk : S, S);
    }
    const Packed in = pack(rng, lengths, h.Nq, h.Nk, h.Dqk, h.Dv);
    const std::int64_t B = static_cast<std::int64_t>(lengths.size()), block = 4, R = in.q.size(0) + 1;
    // A pool with every paged sequence's blocks, in a shuffled order; even sequences are paged.
    std::int64_t blocks = 0;
    for (auto [T, S] : lengths) blocks += (S + block - 1) / block;
    std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    Tensor kpool = Tensor::zeros({blocks * block, h.Nk, h.Dqk}, DType::F32);
    Tensor vpool = Tensor::zeros({blocks * block, h.Nk, h.Dv}, DType::F32);
    std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(B));
    std::vector<CachedKV> seqs;
    // q with one extra row in the middle that no sequence names.
    const std::int64_t gap = in.batch.q_starts[static_cast<std::size_t>(B / 2)];
    Tensor q = Tensor::zeros({R, h.Nq, h.Dqk}, DType::F32);
    q.slice(0, 0, gap).copy_from(in.q.slice(0, 0, gap));
    q.slice(0, gap + 1, R).copy_from(in.q.slice(0, gap, R - 1));
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      const auto [T, S] = lengths[static_cast<std::size_t>(b)];
      const std::int64_t k0 = in.batch.kv_starts[static_cast<std::size_t>(b)];
      const std::int64_t q0 = in.batch.q_starts[static_cast<std::size_t>(b)] + (b >= B / 2 ? 1 : 0);
      CachedKV c;
      c.length = S, c.q_begin = q0, c.q_end = q0 + T;
      if (b % 2 == 0) {
        auto& table = tables[static_cast<std::size_t>(b)];
        for (std::int64_t i = 0; i < (S + block - 1) / block; ++i) table.push_back(order[next++]);
        for (std::int64_t p = 0; p < S; ++p) {
          const std::int64_t row = table[static_cast<std::size_t>(p / block)] * block + p % block;
          kpool.slice(0, row, row + 1).copy_from(in.k.slice(0, k0 + p, k0 + p + 1));
          vpool.slice(0, row, row + 1).copy_from(in.v.slice(0, k0 + p, k0 + p + 1));
        }
        c.k = kpool, c.v = vpool, c.table = &table, c.block_size = block;
      } else {  // rows of its own, with room for 5 more positions
        c.k = Tensor::zeros({S + 5, h.Nk, h.Dqk}, DType::F32), c.v = Tensor::zeros({S + 5, h.Nk, h.Dv}, DType::F32);
        c.k.slice(0, 0, S).copy_from(in.k.slice(0, k0, k0 + S));
        c.v.slice(0, 0, S).copy_from(in.v.slice(0, k0, k0 + S));
      }
      seqs.push_back(c);
    }
    AttentionParams causal, window, bidir;
    window.window = 5, bidir.causal = false;
    for (const AttentionParams& p : {causal, window, bidir}) {
      Tensor f = Tensor::empty({R, h.Nq, h.Dv}, DType::F32), r = Tensor::empty({R, h.Nq, h.Dv}, DType::F32);
      f.slice(0, gap, gap + 1)
          .copy_from(Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(h.Nq * h.Dv), 7.0f), {1, h.Nq, h.Dv}));
      ops::attention_cached(q, seqs, f, p);
      ref::attention_cached(q, seqs, r, p);
      EXPECT_EQ(rows(f, gap, gap + 1), std::vector<double>(static_cast<std::size_t>(h.Nq * h.Dv), 7.0))
          << "a row no sequence names was written";
      for (std::int64_t b = 0; b < B; ++b) {
        const CachedKV& c = seqs[static_cast<std::size_t>(b)];
        const std::int64_t k0 = in.batch.kv_starts[static_cast<std::size_t>(b)];
        const Tensor qb = q.slice(0, c.q_begin, c.q_end), kb = in.k.slice(0, k0, k0 + c.length),
                     vb = in.v.slice(0, k0, k0 + c.length);
        const std::string what = "heads " + std::to_string(h.Nq) + "/" + std::to_string(h.Nk) + ", sequence " +
                                 std::to_string(b) + (b % 2 == 0 ? " (paged)" : " (rows)") + ", T " +
                                 std::to_string(c.q_end - c.q_begin) + ", S " + std::to_string(c.length) + ", window " +
                                 std::to_string(p.window) + (p.causal ? "" : ", bidirectional");
        EXPECT_EQ(rows(f, c.q_begin, c.q_end), ops::attention(qb, kb, vb, p).to_double_vector()) << what;
        Tensor rb = Tensor::empty({c.q_end - c.q_begin, h.Nq, h.Dv}, DType::F32);
        ref::attention(qb, kb, vb, rb, p);
        EXPECT_EQ(rows(r, c.q_begin, c.q_end), rb.to_double_vector()) << "ref, " << what;
        const AttnRef e = attention_exact(qb, kb, vb, p);
        expect_within(rows(f, c.q_begin, c.q_end), e.out, e.bound, "vs float64, " + what);
      }
    }
  }
}

// A batch step through its context (a CachedBatch, as chapter 02's batch builds it once a step;
// test::step_caches: blocks of a shared pool through shuffled tables and rows of their own, decode
// rows beside prefill chunks and whole prompts, one over three ranges of 256 positions).
// ops::store_cached puts each new key and value row at its sequence's position, through the block
// table where there is one, and writes nothing else; ops::attention_cached over the second of two
// layers is, bit for bit, one ops::attention call per sequence over its positions gathered in
// order: MHA, GQA, MQA and MLA's head sizes; causal, a window and bidirectional. A row no
// sequence names is left as it was.
TEST(AttentionCached, ABatchStepThroughItsContextEqualsOneCallPerSequence) {
  test::ThreadCount threads(2);
  auto rng = test::rng_for_test();
  struct Heads {
    std::int64_t Nq, Nk, Dqk, Dv;
  };
  const std::int64_t L = 2, layer = 1;
  for (const Heads& h : {Heads{8, 8, 16, 16}, Heads{8, 2, 16, 12}, Heads{8, 1, 16, 16}, Heads{4, 4, 192, 128}}) {
    const test::StepCaches c = test::step_caches(rng, test::step_lengths(rng), h.Nq, h.Nk, h.Dqk, h.Dv, L);
    // The storage as it should be after the store: copies, each new row put where its position lives.
    std::vector<CachedSeq> want = c.seqs;
    std::vector<Tensor> pool_k, pool_v;  // sequence 0 is paged: the pool's copies, shared
    for (std::int64_t l = 0; l < L; ++l) pool_k.push_back(c.seqs[0].k[l].clone()), pool_v.push_back(c.seqs[0].v[l].clone());
    for (CachedSeq& s : want) {
      for (std::int64_t l = 0; l < L; ++l) {
        s.k[l] = s.table ? pool_k[l] : s.k[l].clone();
        s.v[l] = s.table ? pool_v[l] : s.v[l].clone();
      }
      for (std::int64_t i = s.q_begin; i < s.q_end; ++i) {
        const std::int64_t pos = s.length - (s.q_end - s.q_begin) + i - s.q_begin;
        const std::int64_t at = s.table ? (*s.table)[static_cast<std::size_t>(pos / 16)] * 16 + pos % 16 : pos;
        s.k[layer].slice(0, at, at + 1).copy_from(c.k.slice(0, i, i + 1));
        s.v[layer].slice(0, at, at + 1).copy_from(c.v.slice(0, i, i + 1));
      }
    }
    const CachedBatch batch(c.seqs, c.rows);
    ops::store_cached(batch, layer, c.k, c.v);
    const std::string heads = "heads " + std::to_string(h.Nq) + "/" + std::to_string(h.Nk);
    for (std::size_t b = 0; b < want.size(); ++b)
      for (std::int64_t l = 0; l < L; ++l)
        if (!want[b].table || b == 0) {  // the pool once
          EXPECT_EQ(c.seqs[b].k[l].to_float_vector(), want[b].k[l].to_float_vector())
              << heads << ", sequence " << b << ", layer " << l << ": keys";
          EXPECT_EQ(c.seqs[b].v[l].to_float_vector(), want[b].v[l].to_float_vector())
              << heads << ", sequence " << b << ", layer " << l << ": values";
        }
    AttentionParams causal, window, bidir;
    window.window = 5, bidir.causal = false;
    for (const AttentionParams& p : {causal, window, bidir}) {
      Tensor out = Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(c.rows * h.Nq * h.Dv), 7.0f),
                                       {c.rows, h.Nq, h.Dv});
      ops::attention_cached(c.q, batch, layer, out, p);
      EXPECT_EQ(rows(out, c.gap, c.gap + 1), std::vector<double>(static_cast<std::size_t>(h.Nq * h.Dv), 7.0))
          << heads << ": a row no sequence names was written";
      for (std::size_t b = 0; b < c.seqs.size(); ++b) {
        const CachedSeq& s = c.seqs[b];
        if (s.q_end == s.q_begin) continue;
        const auto [kb, vb] = c.gather(b, layer);
        EXPECT_EQ(rows(out, s.q_begin, s.q_end),
                  ops::attention(c.q.slice(0, s.q_begin, s.q_end), kb, vb, p).to_double_vector())
            << heads << ", sequence " << b << (s.table ? " (paged)" : " (rows)") << ", T " << s.q_end - s.q_begin << ", S "
            << s.length << ", window " << p.window << (p.causal ? "" : ", bidirectional");
      }
    }
  }
}

// The context refuses what does not fit, naming the sequence.
TEST(AttentionCached, TheStepContextRefusesWhatDoesNotFit) {
  auto rng = test::rng_for_test();
  const test::StepCaches c = test::step_caches(rng, {{1, 20}, {2, 9}}, 2, 1, 4, 4, 2);
  auto with = [&](auto change) {
    std::vector<CachedSeq> seqs = c.seqs;
    change(seqs);
    return [seqs, &c] { CachedBatch{seqs, c.rows}; };
  };
  CachedBatch{c.seqs, c.rows};  // as it is, it fits
  expect_error(with([](auto& s) { s[1].length = 15; }), {"cached batch", "sequence 1 holds 15 positions in 14 rows"});
  expect_error(with([](auto& s) { s[0].length = 50; }), {"sequence 0 holds 50 positions, but its block table lists 2"});
  expect_error(with([](auto& s) { s[1].q_begin = 0; }), {"sequences 0 and 1 both name query row 0"});
  expect_error(with([](auto& s) { s[1].q_offset = 8; }), {"sequence 1's rows at positions 8..9 are not among its 9"});
  expect_error(with([](auto& s) { s[1].k.pop_back(); }), {"sequence 1 has 1 layers of keys and 2 of values"});
  expect_error(with([](auto& s) { s[1].v[1] = Tensor::zeros({14, 1, 5}, DType::F32); }), {"sequence 1's layer 1 keeps"});
  expect_error([&] { CachedBatch{c.seqs, c.rows, 300}; }, {"ranges of 300 positions"});
  const CachedBatch batch(c.seqs, c.rows);
  expect_error([&] { ops::store_cached(batch, 2, c.k, c.v); }, {"store_cached", "no layer 2"});
  expect_error([&] { ops::store_cached(batch, 0, c.k.slice(0, 0, 2), c.v.slice(0, 0, 2)); },
               {"store_cached", "the batch's 4 rows"});
}

TEST(AttentionCached, Errors) {
  auto rng = test::rng_for_test();
  const Packed in = pack(rng, {{1, 5}, {3, 3}}, 2, 1, 4, 4);  // q: 4 rows, k/v: 8 rows
  Tensor out = Tensor::empty({4, 2, 4}, DType::F32);
  const std::vector<std::int32_t> table = {1, 0};
  auto seq = [&](std::int64_t q0, std::int64_t q1, std::int64_t length) {
    return CachedKV{in.k, in.v, nullptr, 1, length, q0, q1, -1};
  };
  ops::attention_cached(in.q, {seq(0, 1, 5), seq(1, 4, 3)}, out);  // the batch itself is fine
  expect_error(
      [&] {
    ops::attention_cached(in.q, {seq(0, 2, 5), seq(1, 4, 3)}, out);
      },
      {"attention_cached", "two sequences name query rows 1..1"});
  expect_error([&] { ops::attention_cached(in.q, {seq(0, 5, 5)}, out); }, {"attention_cached", "not within q's 4 rows"});
  expect_error([&] { ops::attention_cached(in.q, {seq(0, 1, 9)}, out); }, {"holds 9 positions in 8 rows"});
  expect_error([&] { ops::attention_cached(in.q, {seq(0, 3, 2)}, out); }, {"sequence 0", "holds 2"});
  CachedKV paged = seq(0, 1, 9);
  paged.table = &table, paged.block_size = 4;
  expect_error([&] { ops::attention_cached(in.q, {paged}, out); }, {"block table lists 2 blocks of 4"});
  paged.length = 6, paged.block_size = 5;
  expect_error([&] { ops::attention_cached(in.q, {paged}, out); }, {"block 1 is outside its storage of 8 rows"});
  CachedKV wide = seq(0, 1, 5);
  wide.k = Tensor::zeros({8, 3, 4}, DType::F32), wide.v = Tensor::zeros({8, 3, 4}, DType::F32);
  expect_error([&] { ops::attention_cached(in.q, {wide}, out); }, {"2 query heads cannot be grouped", "3 KV heads"});
  AttentionParams single;
  single.q_offset = 1;
  expect_error([&] { ops::attention_cached(in.q, {seq(0, 1, 5)}, out, single); }, {"each CachedKV's q_offset"});
}

TEST(AttentionRagged, CountsTheWorkOfItsSequences) {
  auto rng = test::rng_for_test();
  const Packed in = pack(rng, {{1, 9}, {4, 4}, {0, 3}, {2, 7}}, 4, 2, 8, 6);
  AttentionParams p;
  p.window = 3;
  metrics::Work separate;
  for (std::size_t b = 0; b + 1 < in.batch.q_starts.size(); ++b) {
    metrics::CountScope one;
    const std::int64_t q0 = in.batch.q_starts[b], q1 = in.batch.q_starts[b + 1];
    const std::int64_t k0 = in.batch.kv_starts[b], k1 = in.batch.kv_starts[b + 1];
    ops::attention(in.q.slice(0, q0, q1), in.k.slice(0, k0, k1), in.v.slice(0, k0, k1), p);
    separate += one.work();
  }
  metrics::CountScope all;
  ops::attention_ragged(in.q, in.k, in.v, in.batch, p);
  // With the window of 3, the rows see 3 keys (the decode row), 1, 2, 3, 3 (the prompt) and
  // 3, 3: 18 in all, each costing a Dqk dot and a Dv multiply-add per query head.
  EXPECT_EQ(all.work().flops, 2.0 * 18 * 4 * (8 + 6));
  EXPECT_EQ(all.work().flops, separate.flops);
  EXPECT_EQ(all.work().bytes, separate.bytes);
}

TEST(AttentionRagged, Errors) {
  auto rng = test::rng_for_test();
  const Packed in = pack(rng, {{1, 5}, {3, 3}}, 2, 1, 4, 4);  // q: 4 rows, k/v: 8 rows
  using Starts = std::vector<std::int64_t>;
  auto call = [&](Starts qs, Starts ks, Starts offsets = {}, AttentionParams p = {}) {
    ops::attention_ragged(in.q, in.k, in.v, {qs, ks, offsets}, p);
  };
  call({0, 1, 4}, {0, 5, 8});  // the batch itself is fine
  expect_error([&] { call({0, 1, 4}, {0, 8}); }, {"attention_ragged", "q_starts and kv_starts", "3 and 2"});
  expect_error([&] { call({0, 4}, {0, 8}, {1, 2}); }, {"attention_ragged", "q_offsets has 2 entries for 1 sequences"});
  expect_error([&] { call({0, 1, 3}, {0, 5, 8}); }, {"attention_ragged", "q_starts must run from 0 to q's 4 rows"});
  expect_error([&] { call({1, 1, 4}, {0, 5, 8}); }, {"attention_ragged", "q_starts must run from 0"});
  expect_error([&] { call({0, 1, 4}, {0, 5, 9}); }, {"attention_ragged", "kv_starts must run from 0 to k's 8 rows"});
  expect_error(
      [&] {
    call({0, 3, 2, 4}, {0, 3, 5, 8});
      },
      {"attention_ragged", "q_starts must not decrease", "q_starts[2] = 2"});
  expect_error([&] { call({0, 1, 4}, {0, 8, 8}); }, {"attention_ragged", "kv_starts must increase", "kv_starts[2] = 8"});
  expect_error([&] { call({0, 1, 4}, {0, 6, 8}); }, {"attention_ragged", "sequence 1", "only 2 keys"});
  expect_error(
      [&] {
    call({0, 1, 4}, {0, 5, 8}, {5, 0});
      },
      {"attention_ragged", "sequence 0", "q_offsets[0] = 5", "only 5 keys"});
  expect_error([&] { call({0, 1, 4}, {0, 5, 8}, {0, -1}); }, {"attention_ragged", "q_offsets[1] = -1"});
  AttentionParams single;
  single.q_offset = 2;
  expect_error(
      [&] {
    call({0, 1, 4}, {0, 5, 8}, {}, single);
      },
      {"attention_ragged", "AttentionParams::q_offset", "RaggedBatch::q_offsets"});
  AttentionParams bidir;
  bidir.causal = false;
  call({0, 1, 4}, {0, 6, 8}, {}, bidir);  // without the causal mask, 3 queries may share 2 keys
}

// ---------------------------------------------------------------------------------------------
TEST(Argmax, FirstMaximumAndNaNWins) {
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {6, 1000});
  Tensor a = ops::argmax(x);
  for (std::int64_t m = 0; m < 6; ++m) {
    const float* r = x.data<float>() + m * 1000;
    EXPECT_EQ(a.data<std::int32_t>()[m], std::max_element(r, r + 1000) - r);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor t = Tensor::from_vector(std::vector<float>{1, 3, 3, 2, /**/ 1, nan, 5, nan}, {2, 4});
  Tensor r = Tensor::empty({2}, DType::I32);
  ref::argmax(t, r);
  EXPECT_EQ(r.data<std::int32_t>()[0], 1);  // the first of two equal maxima
  EXPECT_EQ(r.data<std::int32_t>()[1], 1);  // the first NaN
  EXPECT_EQ(ops::argmax(t).to(DType::I64).data<std::int64_t>()[1], 1);
}

}  // namespace
}  // namespace inferlab
