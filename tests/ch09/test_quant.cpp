// Chapter 09: every format's error bound, fp8's bit patterns, LLM.int8()'s two limits, the
// products against float64, Q8_0/Q4_0 bytes against the gguf package, GGUF files both ways,
// AWQ against round-to-nearest, and CUDA against the CPU.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>
#include <tuple>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/09_quantization/awq.h"
#include "chapters/09_quantization/gguf_model.h"
#include "chapters/09_quantization/qmodel.h"
#include "chapters/09_quantization/quant_impl.h"
#include "common/eval.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/models/kv_cache.h"
#include "common/ops_cpu.h"
#include "common/safetensors.h"
#include "golden_util.h"
#include "small_tokenizer.h"
#include "test_util.h"

namespace inferlab::ch09 {
namespace {

using test::expect_within;
using test::gamma;
const std::string kData = INFERLAB_DATA_DIR;
constexpr double u = 0x1p-24, u16 = 0x1p-11;

Tensor weights(std::mt19937_64& rng, std::int64_t N, std::int64_t K) {
  Tensor w = test::uniform(rng, {N, K}, -1, 1);
  w.at<float>({0, 3}) = 9.0f;  // an outlier weight
  w.at<float>({1, 0}) = -0.0f;
  for (std::int64_t k = 0; k < std::min<std::int64_t>(K, 64); ++k) w.at<float>({2, k}) = 0.0f;  // an all-zero group
  for (std::int64_t k = 0; k < std::min<std::int64_t>(K, 64); ++k) {                            // groups of one sign
    w.at<float>({3, k}) = 0.5f + 0.5f * std::fabs(w.at<float>({3, k}));
    w.at<float>({4, k}) = -0.5f - 0.5f * std::fabs(w.at<float>({4, k}));
  }
  return w;
}

// The largest error each format allows for weight (n, k), derived from how it rounds.
double bound(const QMatrix& q, const Tensor& w, std::int64_t n, std::int64_t k) {
  const std::int64_t K = q.cols;
  const double x = std::fabs(w.at<float>({n, k}));
  const double slack = 4 * u * x;  // w/s and (q − z)·s, each one float rounding
  switch (q.spec.format) {
    case Format::Int8Tensor: return q.scales.data<float>()[0] / 2 + slack;  // round to nearest, never clamped
    case Format::Int8Row:
    case Format::LlmInt8: return q.scales.data<float>()[n] / 2 + slack;
    case Format::Int4Sym: return q.scales.data<float>()[n * (K / q.spec.group) + k / q.spec.group] / 2 + slack;
    // Asymmetric: z = round(−min/s) can shift the range by half a step, so an end value may be
    // clamped a whole step away.
    case Format::Int4Asym: return q.scales.data<float>()[n * (K / q.spec.group) + k / q.spec.group] + slack;
    case Format::Q8_0: {
      const double d =
          f16_to_f32(*reinterpret_cast<const std::uint16_t*>(q.data.data<std::uint8_t>() + n * (K / 32 * 34) + k / 32 * 34));
      return d / 2 + 127 * d * u16 + slack;  // rounding, plus d stored in f16 (relative u16) times |q| ≤ 127
    }
    case Format::Q4_0: {
      const double d = std::fabs(f16_to_f32(
          *reinterpret_cast<const std::uint16_t*>(q.data.data<std::uint8_t>() + n * (K / 32 * 18) + k / 32 * 18)));
      return d + 8 * d * u16 + slack;  // trunc(x/d + 8.5) is round-half-up, but +8·d clips to +7·d
    }
    case Format::Fp8E4M3: return x * 0x1p-4 + q.scales.data<float>()[0] * 0x1p-10 + slack;  // 3 mantissa bits; subnormals
    case Format::Q2_K:
    case Format::Q3_K:
    case Format::Q4_K:
    case Format::Q5_K:
    case Format::Q6_K:
    case Format::Q4_1:
    case Format::Q5_0:
    case Format::Q5_1:
    case Format::IQ4_NL:
    case Format::IQ4_XS: break;  // read from GGUF files, never quantised here
    case Format::F32:
    case Format::F16:
    case Format::BF16: break;  // not quantised
  }
  return 0;
}

TEST(Quant, EveryFormatWithinItsErrorBound) {
  auto rng = test::rng_for_test();
  const Tensor w = weights(rng, 9, 256);
  for (const QuantSpec& spec : all_specs()) {
    SCOPED_TRACE(spec.name());
    const QMatrix q = quantize(w, spec);
    const Tensor d = dequantize(q);
    for (std::int64_t n = 0; n < 9; ++n)
      for (std::int64_t k = 0; k < 256; ++k)
        ASSERT_LE(std::fabs(d.at<float>({n, k}) - w.at<float>({n, k})), bound(q, w, n, k)) << n << ", " << k;
    EXPECT_EQ(QuantSpec::parse(spec.name()).name(), spec.name());
  }
  EXPECT_NEAR(quantize(w, {Format::Q4_0}).bits_per_weight(), 4.5, 1e-9);
  EXPECT_NEAR(quantize(w, {Format::Q8_0}).bits_per_weight(), 8.5, 1e-9);
  EXPECT_NEAR(quantize(w, {Format::Int4Asym, 32}).bits_per_weight(), 4 + 40.0 / 32, 1e-9);
  test::expect_error([&] { quantize(test::uniform(rng, {2, 40}), {Format::Q8_0}); }, {"multiple of 32"});
  test::expect_error([] { QuantSpec::parse("int3"); }, {"unknown quantisation format 'int3'"});
}

TEST(Quant, EveryFiniteFp8PatternRoundTrips) {
  int finite = 0;
  for (int b = 0; b < 256; ++b) {
    const float f = e4m3_to_f32(static_cast<std::uint8_t>(b));
    if (std::isnan(f)) continue;
    ++finite;
    EXPECT_EQ(f32_to_e4m3(f), b) << "pattern " << b << " = " << f;
  }
  EXPECT_EQ(finite, 254);  // only S.1111.111 is NaN
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7E);  // saturates
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(1.0625f), f32_to_e4m3(1.0f));   // a tie goes to the even mantissa (1.000)
  EXPECT_EQ(f32_to_e4m3(1.1875f), f32_to_e4m3(1.25f));  // ... and here to 1.010
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);               // half the smallest subnormal: to zero (even)
  EXPECT_EQ(f32_to_e4m3(0x1p-10f * 3), 0x02);           // 1.5 subnormal steps: to 2 (even)
}

TEST(Quant, WeightOnlyProductsAgainstFloat64) {
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  for (const QuantSpec& spec : all_specs()) {
    if (spec.format == Format::LlmInt8 || blocks_activations(spec.format)) continue;  // they quantise x too
    SCOPED_TRACE(spec.name());
    // M = 1 and 3 take the fast path's direct kernels, 11 its unpacked rows; K = 200 leaves a
    // tail after the SIMD loops (only the formats without blocks or groups allow it); N = 600 is
    // enough work for the direct kernels to run on both threads.
    const bool any_k = spec.format == Format::Int8Tensor || spec.format == Format::Int8Row || spec.format == Format::Fp8E4M3;
    for (const auto& [K, M, N] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {512, 1, 70}, {512, 3, 70}, {512, 11, 70}, {200, 1, 70}, {200, 3, 70}, {200, 11, 70}, {512, 1, 600}}) {
      if (K % 32 != 0 && !any_k) continue;
      SCOPED_TRACE("M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K));
      const Tensor w = weights(rng, N, K), x = test::uniform(rng, {M, K});
      const QMatrix q = quantize(w, spec);
      const auto D = dequantize(q).to_double_vector(), X = x.to_double_vector();
      std::vector<double> exact(M * N), b(M * N);
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          double s = 0, a = 0;
          for (std::int64_t k = 0; k < K; ++k) s += X[m * K + k] * D[n * K + k], a += std::fabs(X[m * K + k] * D[n * K + k]);
          exact[m * N + n] = s, b[m * N + n] = (gamma(K) + 2 * u) * a;  // the dot product's bound, plus unpacking
        }
      Tensor r = Tensor::empty({M, N}, DType::F32);
      qmatmul_ref(x, q, r);
      expect_within(r.to_double_vector(), exact, b, "reference");
      expect_within(qmatmul(x, q).to_double_vector(), exact, b, "fast");
    }
  }
}

// A speculative draft's catch-up pass multiplies two rows of x at once, a verification pass γ + 1.
// Up to kInt4DirectRows rows, every row of an int4 product is the product of that row alone, to
// the bit (the fast kernel widens each weight row once for four of them; more rows take the
// unpacked path, which sums in another order).
TEST(Quant, EveryRowOfAFewRowProductIsThatRowsOwnProduct) {
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  for (const QuantSpec& spec : {QuantSpec{Format::Int4Sym, 32}, QuantSpec{Format::Int4Asym, 64}}) {
    SCOPED_TRACE(spec.name());
    const std::int64_t K = 512, N = 600;  // N: work for both threads
    const QMatrix q = quantize(weights(rng, N, K), spec);
    for (std::int64_t M = 2; M <= kInt4DirectRows; ++M) {
      SCOPED_TRACE("M = " + std::to_string(M));
      const Tensor x = test::uniform(rng, {M, K});
      const Tensor y = qmatmul(x, q);
      for (std::int64_t i = 0; i < M; ++i) {
        Tensor xi = Tensor::empty({1, K}, DType::F32);
        std::memcpy(xi.data<float>(), x.data<float>() + i * K, K * sizeof(float));
        const Tensor yi = qmatmul(xi, q);
        EXPECT_EQ(std::memcmp(yi.data<float>(), y.data<float>() + i * N, N * sizeof(float)), 0) << "row " << i;
      }
    }
  }
}

// x rounded through q8_0 blocks (what q8_0, q4_0, q4_k and q6_k multiply): each value within half a
// step of x, the step d = max |x| / 127 of its block (stored as f16: up to 127 steps of relative
// error u16 more). A block of zeros, and one too small for 1 / d, become zeros.
TEST(Quant, ActivationsRoundedThroughQ8_0BlocksAreWithinHalfAStep) {
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {3, 128}, -4, 4);
  x.at<float>({1, 40}) = 1000.0f;                                           // one large value in block 1
  for (int k = 64; k < 96; ++k) x.at<float>({2, k}) = 0.0f;                 // a block of zeros
  for (int k = 96; k < 128; ++k) x.at<float>({2, k}) = 1e-39f * (k - 100);  // subnormals: 1 / d overflows
  const Tensor r = q8_0_activations(x);
  for (std::int64_t m = 0; m < 3; ++m)
    for (std::int64_t k = 0; k < 128; ++k) {
      double amax = 0;
      for (std::int64_t j = k / 32 * 32; j < k / 32 * 32 + 32; ++j)
        amax = std::max<double>(amax, std::fabs(x.at<float>({m, j})));
      const double d = amax / 127, v = x.at<float>({m, k}), got = r.at<float>({m, k});
      if (m == 2 && k >= 64) {
        EXPECT_EQ(got, 0.0f) << k;
        continue;
      }
      EXPECT_LE(std::fabs(got - v), d / 2 + 127 * d * u16 + 4 * u * std::fabs(v)) << m << ", " << k;
    }
}

// q4_0 takes x as q8_0 blocks: its products (the ref:: loop, the fast integer kernels at M ≤ 4,
// the unpacked rows at M = 11) are the float64 product of the decoded weights with x rounded
// through those blocks, within the dot product's bound.
std::vector<double> minimum_terms(const QMatrix& q);

// The float64 product of x rounded through q8_0 blocks with q's decoded weights [M, N], and each
// output's bound: (γ_K + roundings·u) · Σ |x|·(|w| + 2·|minimum|). γ_K is the dot product's; the
// scale products formed once per block add a few roundings of each term (3 for q8_0 and q4_0:
// dw·dx and the integer sum's scaling; 4 with the k-quants' sub-block scales). The formats with a
// minimum (q4_k: (d·sc)·q − dmin·m) sum the two parts apart, so their bound runs over the size of
// both (minimum_terms), not over |x·w| alone.
std::pair<std::vector<double>, std::vector<double>> blocked_product(const Tensor& x, const QMatrix& q, int roundings) {
  const std::int64_t M = x.size(0), N = q.rows, K = q.cols;
  const auto D = dequantize(q).to_double_vector(), Dm = minimum_terms(q), X = q8_0_activations(x).to_double_vector();
  std::vector<double> exact(M * N), b(M * N);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double xk = X[m * K + k], wk = D[n * K + k];
        s += xk * wk, a += std::fabs(xk) * (std::fabs(wk) + 2 * std::fabs(Dm[n * K + k]));
      }
      exact[m * N + n] = s, b[m * N + n] = (gamma(K) + roundings * u) * a;
    }
  return {exact, b};
}

// An interleaved matrix is q's format and gives q's bytes back in row order, exactly.
void expect_the_same_blocks(const Interleaved8& il, const QMatrix& q) {
  EXPECT_EQ(il.format(), q.spec.name());
  const QMatrix back = il.rows_in_order();
  ASSERT_EQ(back.data.nbytes(), q.data.nbytes());
  EXPECT_EQ(std::memcmp(back.data.data<std::uint8_t>(), q.data.data<std::uint8_t>(), q.data.nbytes()), 0);
}

TEST(Quant, Q4_0MultipliesXRoundedThroughQ8_0Blocks) {
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  // K = 224: 7 blocks a row, four in the kernels' main loop and three past it.
  for (const auto& [M, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {1, 70, 512}, {3, 70, 512}, {4, 70, 512}, {11, 70, 512}, {1, 600, 512}, {1, 70, 224}, {3, 70, 224}}) {
    SCOPED_TRACE("M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K));
    const Tensor w = weights(rng, N, K), x = test::uniform(rng, {M, K});
    const QMatrix q = quantize(w, {Format::Q4_0});
    const auto [exact, b] = blocked_product(x, q, 3);
    Tensor r = Tensor::empty({M, N}, DType::F32);
    qmatmul_ref(x, q, r);
    expect_within(r.to_double_vector(), exact, b, "reference");
    expect_within(qmatmul(x, q).to_double_vector(), exact, b, "fast");
  }
}

// The interleaved q4_0 and q8_0 matrices (eight rows' blocks together) give their bytes back in
// row order exactly and multiply x rounded through q8_0 blocks within the row-order bound, for
// decode (the eight-row kernel) and prefill rows; what they cannot hold is refused.
TEST(Quant, InterleavedBlocksAreTheSameMatrix) {
  if (!quant::interleaved_kernels())
    GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels: run keeps every matrix in row order";
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  for (const Format f : {Format::Q4_0, Format::Q8_0})
    for (const auto& [M, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 16, 224}, {3, 24, 224}, {4, 8, 512}, {9, 16, 224}, {1, 1024, 512}}) {
      SCOPED_TRACE(QuantSpec{f}.name() + ", M = " + std::to_string(M) + ", N = " + std::to_string(N) +
                   ", K = " + std::to_string(K));
      const Tensor x = test::uniform(rng, {M, K});
      QMatrix q = quantize(weights(rng, N, K), {f});
      if (f == Format::Q8_0)
        q.data.data<std::uint8_t>()[2 * (K / 32) * 34 + 2 + 9] = 0x80;  // −128, which a GGUF file may hold
      const Interleaved8 il(q);
      expect_the_same_blocks(il, q);
      EXPECT_EQ(il.bytes(), q.bytes());
      const auto [exact, b] = blocked_product(x, q, 3);
      Tensor y = Tensor::empty({M, N}, DType::F32);
      il.matmul(x, y);
      expect_within(y.to_double_vector(), exact, b, "interleaved");
    }
  const QMatrix odd = quantize(weights(rng, 12, 64), {Format::Q4_0});
  EXPECT_FALSE(interleavable(odd));
  EXPECT_FALSE(interleavable(quantize(weights(rng, 8, 64), {Format::Fp8E4M3})));   // no integer form
  EXPECT_FALSE(interleavable(quantize(weights(rng, 8, 200), {Format::Int8Row})));  // n_in not whole blocks of 32
  test::expect_error([&] { Interleaved8 bad(odd); }, {"rows a multiple of 8"});
  const Interleaved8 il(quantize(weights(rng, 8, 64), {Format::Q4_0}));
  Tensor x = Tensor::zeros({1, 64}, DType::F32), y = Tensor::empty({1, 8}, DType::F32);
  x.data<float>()[5] = std::numeric_limits<float>::infinity();
  test::expect_error([&] { il.matmul(x, y); }, {"the activations hold inf at row 0, column 5"});
  test::expect_error([&] { il.matmul(Tensor::zeros({1, 32}, DType::F32), y); }, {"x must be contiguous f32 [M, 64]"});
}

// The formats the lecture names, laid out for the fast kernel (int8 rows, int4 groups of 32, 64
// and 128, centred or with zero points): the row-order matrix comes back exactly, the layout
// reads the bytes the format stores, and the products (the eight-row kernel at M ≤ 4, decoded
// rows for more) are the float64 product of x rounded through q8_0 blocks with the format's
// weights, within the dot product's bound. The integer sums are exact, so the float roundings are
// the q8_0 ones: dx·S per block, the accumulation, and the row's or group's scale.
TEST(Quant, TheLecturesFormatsRunOnTheInterleavedKernels) {
  if (!quant::interleaved_kernels()) GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels";
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  for (const QuantSpec& spec :
       {QuantSpec{Format::Int8Row}, QuantSpec{Format::Int8Tensor}, QuantSpec{Format::Int4Sym, 32},
        QuantSpec{Format::Int4Asym, 32}, QuantSpec{Format::Int4Sym, 64}, QuantSpec{Format::Int4Asym, 64},
        QuantSpec{Format::Int4Sym, 128}, QuantSpec{Format::Int4Asym, 128}})
    for (const auto& [M, N, K] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
             {1, 16, 256}, {3, 24, 384}, {4, 8, 512}, {9, 16, 256}, {1, 1024, 512}}) {
      SCOPED_TRACE(spec.name() + ", M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K));
      const Tensor x = test::uniform(rng, {M, K});
      const QMatrix q = quantize(weights(rng, N, K), spec);
      ASSERT_TRUE(interleavable(q));
      const Interleaved8 il(q);
      const QMatrix back = il.rows_in_order();
      EXPECT_EQ(il.format(), spec.name());
      for (const auto& [a, b] : std::vector<std::pair<const Tensor*, const Tensor*>>{
               {&q.data, &back.data}, {&q.scales, &back.scales}, {&q.zeros, &back.zeros}}) {
        ASSERT_EQ(a->defined(), b->defined());
        if (!a->defined()) continue;
        ASSERT_EQ(a->nbytes(), b->nbytes());
        EXPECT_EQ(std::memcmp(a->raw_data(), b->raw_data(), a->nbytes()), 0);
      }
      // int8_tensor's one scale is kept once a row
      EXPECT_EQ(il.bytes(), q.bytes() + (spec.format == Format::Int8Tensor ? 4 * (N - 1) : 0));
      const auto [exact, b] = blocked_product(x, q, 4);
      Tensor y = Tensor::empty({M, N}, DType::F32);
      il.matmul(x, y);
      expect_within(y.to_double_vector(), exact, b, "interleaved");
    }
}

// The fast kernel (the matrix interleaved) and the reference kernel (the matrix in row order: int8
// and int4 multiply x in f32) compute two functions: the fast one multiplies x̂, x rounded through
// q8_0 blocks. They differ by at most what that rounding moves, Σ_k |x̂_k − x_k|·|w_k|, plus each
// product's own float bound.
TEST(Quant, TheFastKernelDiffersFromTheReferenceByTheRoundingOfX) {
  if (!quant::interleaved_kernels()) GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels";
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  const std::int64_t M = 3, N = 64, K = 512;
  for (const QuantSpec& spec :
       {QuantSpec{Format::Int8Row}, QuantSpec{Format::Int4Asym, 32}, QuantSpec{Format::Int4Sym, 128}}) {
    SCOPED_TRACE(spec.name());
    const Tensor x = test::uniform(rng, {M, K}, -3, 3);
    const QMatrix q = quantize(weights(rng, N, K), spec);
    const auto D = dequantize(q).to_double_vector(), X = x.to_double_vector(), Xr = q8_0_activations(x).to_double_vector();
    Tensor fast = Tensor::empty({M, N}, DType::F32);
    Interleaved8(q).matmul(x, fast);
    const Tensor reference = qmatmul(x, q);
    double largest_move = 0;
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double moved = 0, a = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const double w = std::fabs(D[n * K + k]);
          moved += std::fabs(Xr[m * K + k] - X[m * K + k]) * w;
          a += (std::fabs(X[m * K + k]) + std::fabs(Xr[m * K + k])) * w;
        }
        const double got = fast.data<float>()[m * N + n], want = reference.data<float>()[m * N + n];
        EXPECT_LE(std::fabs(got - want), moved + (gamma(K) + 4 * u) * a) << m << ", " << n;
        largest_move = std::max(largest_move, moved);
      }
    EXPECT_GT(largest_move, 0);  // the two functions do differ
  }
}

// LLM.int8() interleaved: x quantised by row outside the outlier columns, as the row-order product
// does, its int8 sums through the eight-row kernel (an exact int32 sum per block, so only the
// float steps differ: s_x·S per block, their sum, s_w; for more than four rows the decoded path,
// s_x·xq and s_w·wq each rounded, then a dot product of K terms) and the outlier columns in 16
// bits, summed as the reference does.
TEST(LlmInt8, TheInterleavedProductIsTheReferenceWithinItsFloatSteps) {
  if (!quant::interleaved_kernels()) GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels";
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  for (const auto& [M, N, K] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{{1, 64, 256}, {3, 600, 512}, {9, 16, 256}}) {
    SCOPED_TRACE("M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K));
    Tensor x = test::uniform(rng, {M, K}, -2, 2);
    x.at<float>({0, 5}) = 60.0f, x.at<float>({M - 1, 77}) = -9.0f;  // two outlier features
    const QuantSpec spec{Format::LlmInt8};
    const QMatrix q = quantize(weights(rng, N, K), spec);
    Tensor fast = Tensor::empty({M, N}, DType::F32), ref = Tensor::empty({M, N}, DType::F32);
    Interleaved8(q).matmul(x, fast);
    qmatmul_ref(x, q, ref);
    const auto O = outlier_columns(x, spec.threshold);
    EXPECT_EQ(std::count(O.begin(), O.end(), 1), 2);
    std::vector<std::int8_t> xq;
    std::vector<float> sx;
    quantize_rows_int8(x, O, xq, sx);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double a = 0;  // Σ |s_x·xq·s_w·wq| over the int8 columns
        for (std::int64_t k = 0; k < K; ++k)
          a += std::fabs(double{sx[m]} * xq[m * K + k] * q.scales.data<float>()[n] * q.data.data<std::int8_t>()[n * K + k]);
        const double hi = std::fabs(ref.data<float>()[m * N + n]) + a;  // bounds the outlier part and the sum
        const double g = M <= kDirectRows ? gamma(K / 32) + 6 * u : gamma(K) + 6 * u;
        EXPECT_LE(std::fabs(fast.data<float>()[m * N + n] - ref.data<float>()[m * N + n]), g * a + 2 * u * hi)
            << m << ", " << n;
      }
  }
}

TEST(Quant, TheFastFp8DecoderGivesEveryFinitePatternExactly) {
  // Row b holds pattern b (NaN patterns left out) once, among zeros: with x all ones each output is
  // that one weight, no rounding anywhere. M = 1 runs the bit-manipulating decoder (every pattern
  // sits in its 32-wide SIMD part, not the scalar tail), M = 5 the table.
  const std::int64_t K = 40;
  QMatrix q;
  q.spec = {Format::Fp8E4M3}, q.rows = 256, q.cols = K;
  q.data = Tensor::zeros({256, K}, DType::U8);
  q.scales = Tensor::from_vector(std::vector<float>{0.75f}, {1});
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7F) != 0x7F) q.data.data<std::uint8_t>()[b * K + b % 32] = static_cast<std::uint8_t>(b);
  for (std::int64_t M : {1, 5}) {
    const Tensor y = qmatmul(Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(M * K), 1.0f), {M, K}), q);
    for (std::int64_t m = 0; m < M; ++m)
      for (int b = 0; b < 256; ++b)
        ASSERT_EQ(y.at<float>({m, b}), (b & 0x7F) == 0x7F ? 0.0f : e4m3_to_f32(static_cast<std::uint8_t>(b)) * 0.75f)
            << "pattern " << b << ", M = " << M;
  }
}

TEST(Quant, NonFiniteWeightsAndOddGroupsAreRefused) {
  auto rng = test::rng_for_test();
  Tensor w = test::uniform(rng, {4, 64});
  test::expect_error([&] { quantize(w, {Format::Int4Sym, 16}); }, {"group size", "multiple of 32", "16"});
  w.at<float>({2, 5}) = std::numeric_limits<float>::quiet_NaN();
  for (const QuantSpec& spec : all_specs()) test::expect_error([&] { quantize(w, spec); }, {"weight (2, 5)", "finite"});
}

// A small random Llama's config: widths D and F, `layers` layers, `heads` heads of head_dim
// (D / heads) and `kv` KV heads, a vocabulary of 40 and a context of 32.
TransformerConfig small_config(std::int64_t D, std::int64_t F, std::int64_t layers, std::int64_t heads, std::int64_t kv) {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = D, c.intermediate_size = F, c.num_layers = layers, c.num_heads = heads, c.num_kv_heads = kv;
  c.head_dim = D / heads, c.vocab_size = 40, c.max_position_embeddings = 32, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  return c;
}

// quantize() used to say which weight was NaN but not in which of the model's matrices.
TEST(Quant, NonFiniteWeightsNameTheMatrix) {
  models::Llama m = models::random_llama(small_config(128, 256, 2, 8, 2), 7);  // every width a multiple of every group size
  m.source = "random";
  m.layers[1].w_up.weight = m.layers[1].w_up.weight.clone();
  m.layers[1].w_up.weight.at<float>({4, 9}) = std::numeric_limits<float>::infinity();
  for (const QuantSpec& spec : all_specs())
    test::expect_error([&] { quantize_model(m, spec); },
                       {"random: " + spec.name() + " of model.layers.1.mlp.up_proj.weight", "weight (4, 9) is inf"});
}

// A real checkpoint's widths need not be whole blocks (stories260K's down_proj reads 172): asked
// to keep them, quantize_model quantises every other matrix and leaves those as they were,
// naming them once; not asked, it refuses, naming the matrix.
TEST(Quant, MatricesAFormatCannotHoldAreKeptWhenAskedAndNamed) {
  models::Llama m = models::random_llama(small_config(64, 172, 2, 8, 4), 7);
  m.source = "random";
  std::vector<std::string> kept;
  const models::Llama q = quantize_model(m, {Format::Q4_0}, &kept);
  EXPECT_EQ(kept, std::vector<std::string>{"mlp.down_proj"});
  for (const models::LlamaLayer& l : q.layers) {
    EXPECT_FALSE(l.w_down.packed);
    EXPECT_EQ(l.w_down.weight.to_float_vector(), m.layers[&l - q.layers.data()].w_down.weight.to_float_vector());
    for (const Linear* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up}) EXPECT_EQ(w->packed->format(), "q4_0");
  }
  EXPECT_EQ(q.lm_head.packed->format(), "q4_0");
  test::expect_error([&] { quantize_model(m, {Format::Q4_0}); }, {"model.layers.0.mlp.down_proj", "multiple of 32"});
  kept.clear();
  quantize_model(m, {Format::Int4Sym, 128}, &kept);  // no width of 64 or 172 is whole groups of 128
  EXPECT_EQ(kept, (std::vector<std::string>{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "lm_head"}));
  kept.clear();
  quantize_model(m, {Format::Int8Row}, &kept);  // per-row formats take any width
  EXPECT_TRUE(kept.empty());
}

// A q8_0/q4_0 block scale is an f16: beyond 65504 it used to be stored as infinity, and the
// exported file decoded to inf and NaN. An int4_asym scale (max − min)/15 can overflow a float.
TEST(Quant, ScalesBeyondTheirTypeAreRefused) {
  auto rng = test::rng_for_test();
  Tensor w = test::uniform(rng, {4, 64});
  w.at<float>({2, 40}) = 8.4e6f;  // q8_0: d = 8.4e6 / 127 = 66142 > 65504
  test::expect_error([&] { quantize(w, {Format::Q8_0}, "w"); },
                     {"w: row 2, block 1 (weights 32..63) has scale inf", "65504"});
  w.at<float>({2, 40}) = 8.3e6f;  // d = 65354 still fits
  EXPECT_EQ(dequantize(quantize(w, {Format::Q8_0})).at<float>({2, 40}), f16_to_f32(f32_to_f16(8.3e6f / 127)) * 127);
  w.at<float>({2, 40}) = -5.3e5f;  // q4_0: d = max / −8 = 66250
  test::expect_error([&] { quantize(w, {Format::Q4_0}, "w"); }, {"w: row 2, block 1", "scale inf"});
  w.at<float>({2, 40}) = 3e38f, w.at<float>({2, 41}) = -3e38f;
  test::expect_error([&] { quantize(w, {Format::Int4Asym, 32}, "w"); }, {"w: row 2, group 1 spans", "float scale"});
  // Formats whose scales are floats scaled by the largest weight store it (q·s, a rounding or two).
  for (const QuantSpec& spec : {QuantSpec{Format::Int8Row}, QuantSpec{Format::Int4Sym, 32}, QuantSpec{Format::Fp8E4M3}})
    EXPECT_NEAR(dequantize(quantize(w, spec)).at<float>({2, 40}), 3e38, 3e38 * 4 * u) << spec.name();
}

// A logit row holding NaN or infinity (here from norms too large for f32) used to give a
// perplexity of nan, printed by ch09_quantization table with exit status 0.
TEST(Quant, APerplexityThatIsNotANumberIsAnError) {
  models::Llama m = models::random_llama(small_config(64, 96, 1, 4, 2), 7);
  const eval::LogitsFn f = [&m](const std::vector<std::int32_t>& t) { return ch01::forward(m, t, true); };
  const std::vector<std::int32_t> tokens = {1, 5, 9, 3, 7, 2, 8, 4, 6};
  EXPECT_TRUE(std::isfinite(eval::perplexity(f, tokens, 8).ppl));
  m.layers[0].attn_norm = m.layers[0].attn_norm.clone();
  for (std::int64_t i = 0; i < 64; ++i) m.layers[0].attn_norm.at<float>({i}) = 1e30f;  // q·k overflows
  test::expect_error([&] { eval::perplexity(f, tokens, 8, 0, "m as q8_0"); },
                     {"m as q8_0: window 0, position 0", "NaN or infinity"});
}

TEST(Quant, ProductsNameWhatIsWrongWithTheirOperands) {
  auto rng = test::rng_for_test();
  const QMatrix q = quantize(test::uniform(rng, {6, 64}), {Format::Int8Row});
  const Tensor x = test::uniform(rng, {2, 64});
  test::expect_error([&] { qmatmul(test::uniform(rng, {2, 32}), q); }, {"disagree on the input width n_in", "64"});
  test::expect_error([&] { qmatmul(x.to(DType::BF16), q); }, {"x must be contiguous f32"});
  Tensor wide = Tensor::empty({2, 12}, DType::F32), small = Tensor::empty({2, 5}, DType::F32);
  Tensor strided = wide.slice(1, 0, 6);  // [2, 6] with a row stride of 12
  test::expect_error([&] { qmatmul(x, q, small); }, {"should be contiguous f32 [2, 6]"});
  test::expect_error([&] { qmatmul(x, q, strided); }, {"should be contiguous f32 [2, 6]"});
}

// Values so small that a scale underflows to 0 (or its inverse overflows) used to be divided by
// that 0 and cast to integers as NaN or infinity (undefined; the sanitizer build stops on it, and
// the fuzzer found it through a GGUF). They quantise to zeros.
TEST(Quant, ValuesTooSmallForAScaleQuantiseToZero) {
  const float tiny = std::numeric_limits<float>::denorm_min() * 3;
  Tensor w = Tensor::zeros({2, 128}, DType::F32);
  for (std::int64_t k = 0; k < 128; ++k) w.at<float>({0, k}) = k % 2 ? tiny : -tiny;
  Tensor x = Tensor::zeros({1, 128}, DType::F32);
  for (std::int64_t k = 0; k < 128; ++k) x.at<float>({0, k}) = 1e-39f * static_cast<float>(k % 5);
  for (const QuantSpec& spec : all_specs()) {
    SCOPED_TRACE(spec.name());
    const QMatrix q = quantize(w, spec);
    for (float v : dequantize(q).to_float_vector()) EXPECT_LE(std::fabs(v), tiny);
    for (float v : qmatmul(x, q).to_float_vector()) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Quant, ActivationsThatOverflowedAreAnErrorWhereTheyWouldBeCastToIntegers) {
  auto rng = test::rng_for_test();
  const Tensor w = test::uniform(rng, {6, 64});
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    for (Format f : {Format::Q8_0, Format::LlmInt8}) {
      Tensor x = test::uniform(rng, {3, 64});
      x.at<float>({1, 40}) = bad;
      const QMatrix q = quantize(w, {f});
      test::expect_error([&] { qmatmul(x, q); }, {q.spec.name(), "row 1, column 40", "overflowed"});
      test::expect_error(
          [&] {
        Tensor out = Tensor::empty({3, 6}, DType::F32);
        qmatmul_ref(x, q, out);
          },
          {"row 1, column 40"});
    }
  // The formats that keep x in f32 pass a NaN on to the output, where the sampler refuses it.
  Tensor x = test::uniform(rng, {1, 64});
  x.at<float>({0, 3}) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(qmatmul(x, quantize(w, {Format::Int8Row})).to_float_vector()[0]));
}

// Plain vector-wise int8 (W8A8), written out independently: x rows and W rows by their absmax.
std::vector<float> vectorwise_int8(const Tensor& x, const QMatrix& w) {
  const std::int64_t M = x.size(0), K = x.size(1), N = w.rows;
  std::vector<float> y(static_cast<std::size_t>(M * N));
  for (std::int64_t m = 0; m < M; ++m) {
    float a = 0;
    for (std::int64_t k = 0; k < K; ++k) a = std::max(a, std::fabs(x.at<float>({m, k})));
    const float s = a > 0 ? a / 127.0f : 1.0f;
    for (std::int64_t n = 0; n < N; ++n) {
      std::int32_t acc = 0;
      for (std::int64_t k = 0; k < K; ++k)
        acc += static_cast<std::int32_t>(std::clamp(std::round(x.at<float>({m, k}) / s), -127.0f, 127.0f)) *
               w.data.data<std::int8_t>()[n * K + k];
      y[static_cast<std::size_t>(m * N + n)] = static_cast<float>(acc) * s * w.scales.data<float>()[n];
    }
  }
  return y;
}

TEST(LlmInt8, InfiniteThresholdIsVectorWiseInt8AndZeroIsThe16BitProduct) {
  auto rng = test::rng_for_test();
  // K = 200: the SIMD integer dot product's tail; N = 600: enough work for both threads.
  test::ThreadCount threads(2);
  for (const auto& [M, N, K] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{{2, 9, 200}, {1, 600, 512}}) {
    const Tensor w = weights(rng, N, K), x = test::uniform(rng, {M, K}, -3, 3);
    QuantSpec spec{Format::LlmInt8};
    spec.threshold = std::numeric_limits<float>::infinity();
    const QMatrix q = quantize(w, spec);
    EXPECT_EQ(qmatmul(x, q).to_float_vector(), vectorwise_int8(x, q)) << M << " x " << N << " x " << K;
  }
  const Tensor w = weights(rng, 40, 256), x = test::uniform(rng, {5, 256}, -3, 3);
  QuantSpec spec{Format::LlmInt8};
  spec.threshold = std::numeric_limits<float>::infinity();
  QMatrix q = quantize(w, spec);
  const auto plain = vectorwise_int8(x, q);
  Tensor r = Tensor::empty({5, 40}, DType::F32);
  qmatmul_ref(x, q, r);
  EXPECT_EQ(r.to_float_vector(), plain);  // integer sums: exact
  EXPECT_EQ(qmatmul(x, q).to_float_vector(), plain);
  // Threshold 0: every column is an outlier, so everything is the 16-bit product of x and the
  // (int8-stored) weights: Σ f16(x)·f16(w) accumulated in f32.
  q.spec.threshold = 0.0f;
  const auto D = dequantize(q).to_double_vector();
  std::vector<double> exact(200), b(200);
  for (std::int64_t m = 0; m < 5; ++m)
    for (std::int64_t n = 0; n < 40; ++n) {
      double s = 0, a = 0;
      for (std::int64_t k = 0; k < 256; ++k) {
        const double p = f16_to_f32(f32_to_f16(x.at<float>({m, k}))) *
                         static_cast<double>(f16_to_f32(f32_to_f16(static_cast<float>(D[n * 256 + k]))));
        s += p, a += std::fabs(p);
      }
      exact[m * 40 + n] = s, b[m * 40 + n] = gamma(257) * a;
    }
  qmatmul_ref(x, q, r);
  expect_within(r.to_double_vector(), exact, b, "threshold 0");
  expect_within(qmatmul(x, q).to_double_vector(), exact, b, "threshold 0, fast");
}

TEST(LlmInt8, AnOutlierFeatureNoLongerRuinsTheOtherColumns) {
  // The paper's observation: one activation column of magnitude 60 makes the per-row int8 scale
  // 60/127, crushing every other column to a few levels. Keeping that column in 16 bits fixes it.
  auto rng = test::rng_for_test();
  const Tensor w = test::uniform(rng, {64, 512}, -1, 1);
  Tensor x = test::uniform(rng, {4, 512}, -1, 1);
  for (std::int64_t m = 0; m < 4; ++m) x.at<float>({m, 100}) = 60.0f;
  const QMatrix q = quantize(w, {Format::LlmInt8});
  const auto exact = ops::matmul(x, dequantize(q)).to_double_vector();
  const auto mixed = qmatmul(x, q).to_double_vector();
  const auto plain = vectorwise_int8(x, q);
  double e_mixed = 0, e_plain = 0;
  for (std::size_t i = 0; i < exact.size(); ++i)
    e_mixed += std::pow(mixed[i] - exact[i], 2), e_plain += std::pow(plain[i] - exact[i], 2);
  EXPECT_LT(e_mixed * 25, e_plain) << "16-bit outliers should cut the error by far more than 5x";
}

TEST(Q8_0, TheFastActivationQuantiserIsTheReferenceBitForBit) {
  auto rng = test::rng_for_test();
  const std::int64_t K = 32 * 12;
  Tensor x = test::uniform(rng, {3, K});
  float* p = x.data<float>();
  for (std::int64_t k = 0; k < K; ++k) p[k] *= 100.0f;        // row 0: wide, row 1: [-1, 1), row 2: tiny and special
  for (std::int64_t k = 0; k < 32; ++k) p[2 * K + k] = 0.0f;  // d = 0
  for (std::int64_t k = 32; k < 64; ++k) p[2 * K + k] = 1e-40f * static_cast<float>(k % 5);  // 1/d overflows
  for (std::int64_t k = 64; k < 96; ++k) p[2 * K + k] = 1e30f * (k % 2 ? 1.0f : -0.5f);      // d beyond f16
  // d = 1, id = 1: every value a tie k + 0.5 that std::round takes away from zero
  for (std::int64_t k = 96; k < 128; ++k)
    p[2 * K + k] = k == 96 ? 127.0f : (static_cast<float>(k % 7) + 0.5f) * (k % 2 ? 1 : -1);
  // d = 1 again: the largest float below each half, which std::round takes toward zero
  for (std::int64_t k = 128; k < 160; ++k)
    p[2 * K + k] = k == 128 ? 127.0f : static_cast<float>(k % 3) + std::nextafter(0.5f, 0.0f);
  const BlockedActivations ref = q8_0_blocks(x), fast = blocked_activations_fast(x);
  EXPECT_EQ(fast.q, ref.q);
  EXPECT_EQ(fast.sum, ref.sum);
  EXPECT_EQ(fast.sum16, ref.sum16);
  ASSERT_EQ(fast.d.size(), ref.d.size());
  for (std::size_t i = 0; i < ref.d.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint32_t>(fast.d[i]), std::bit_cast<std::uint32_t>(ref.d[i])) << "block " << i;
}

TEST(Q8_0, ActivationsQuantisedToBlocksWithExactIntegerSums) {
  auto rng = test::rng_for_test();
  test::ThreadCount threads(2);
  // 7 blocks: the fast path's four at a time, then three; N = 600: enough work for both threads.
  for (const auto& [nb, N] : std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 30}, {7, 30}, {16, 600}}) {
    const std::int64_t K = nb * 32;
    const Tensor w = weights(rng, N, K), x = test::uniform(rng, {3, K});
    QMatrix q = quantize(w, {Format::Q8_0});
    q.data.data<std::uint8_t>()[5 * nb * 34 + 2 + 7] = 0x80;  // −128: llama.cpp never writes it, a GGUF file may hold it
    Tensor r = Tensor::empty({3, N}, DType::F32);
    qmatmul_ref(x, q, r);
    const Tensor f = qmatmul(x, q);
    // Independently: x into q8_0 blocks, per block an integer sum scaled by d_w·d_x.
    for (std::int64_t m = 0; m < 3; ++m) {
      std::vector<std::uint8_t> xb(nb * 34);
      for (int b = 0; b < nb; ++b) quantize_q8_0_block(x.data<float>() + m * K + b * 32, xb.data() + b * 34);
      for (std::int64_t n = 0; n < N; ++n) {
        double y = 0, a = 0;
        for (int b = 0; b < nb; ++b) {
          const std::uint8_t* wb = q.data.data<std::uint8_t>() + n * nb * 34 + b * 34;
          std::int32_t s = 0;
          for (int i = 0; i < 32; ++i)
            s += static_cast<std::int8_t>(wb[2 + i]) * static_cast<std::int8_t>(xb[b * 34 + 2 + i]);
          const double p = static_cast<double>(s) * (static_cast<double>(from_half(wb)) * from_half(xb.data() + b * 34));
          y += p, a += std::fabs(p);
        }
        // The integer sums are exact; the float part is a scale product per block and an
        // nb-term sum in any order (fused or not): within (2u + γ_nb)·Σ|terms|.
        EXPECT_NEAR(r.at<float>({m, n}), y, (2 * u + gamma(nb)) * a);
        EXPECT_NEAR(f.at<float>({m, n}), y, (2 * u + gamma(nb)) * a);
      }
    }
  }
}

TEST(Gguf, OurQ8_0AndQ4_0BytesEqualTheGgufPackage) {
  const SafetensorsFile f(kData + "/golden/quant/blocks.safetensors");
  const Tensor w = f.get("input");
  for (auto [name, fmt] : {std::pair{"q8_0", Format::Q8_0}, std::pair{"q4_0", Format::Q4_0}}) {
    const QMatrix q = quantize(w, {fmt});
    const Tensor want = f.get(name);
    ASSERT_EQ(q.data.nbytes(), want.nbytes()) << name;
    EXPECT_EQ(std::memcmp(q.data.raw_data(), want.raw_data(), want.nbytes()), 0) << name << ": bytes differ from gguf's";
  }
}

TEST(Gguf, ReadsAndWritesWhatTheGgufPackageWrites) {
  const std::string ref = kData + "/golden/quant/reference.gguf";
  const gguf::File f(ref);
  const auto want = load_json(kData + "/golden/quant/reference.json");
  EXPECT_EQ(f.get("general.architecture").s, "llama");
  EXPECT_EQ(f.get("llama.context_length").i, 512);
  EXPECT_EQ(f.get("llama.rope.freq_base").f, 10000.0);
  EXPECT_EQ(f.get("tokenizer.ggml.tokens").items.at(3).s, "▁hello");
  for (const auto& [name, t] : want["tensors"].items()) {
    SCOPED_TRACE(name);
    const auto& info = f.info(name);
    EXPECT_EQ(info.shape, t["shape"].get<Shape>());
    std::vector<double> got;
    if (info.type == gguf::Type::F32 || info.type == gguf::Type::F16) {
      got = f.tensor(name).to_double_vector();
    } else {
      const QMatrix q{{info.type == gguf::Type::Q8_0 ? Format::Q8_0 : Format::Q4_0},
                      info.shape[0],
                      info.shape[1],
                      f.raw(name).clone(),
                      {},
                      {}};
      got = dequantize(q).to_double_vector();
    }
    EXPECT_EQ(got, t["values"].get<std::vector<double>>());
  }
  // Our writer, given the same metadata and tensors, writes the same bytes.
  std::vector<std::pair<std::string, gguf::Value>> meta;
  for (const auto& [k, v] : f.metadata()) meta.emplace_back(k, v);
  std::vector<gguf::Output> ts;
  for (const auto& i : f.tensors()) ts.push_back({i.name, i.type, i.shape, f.raw(i.name).view({-1})});
  test::TempDir dir;
  gguf::write(dir.file("copy.gguf"), meta, ts);
  const MappedFile a(ref, "GGUF file"), b(dir.file("copy.gguf"), "GGUF file");
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0);
  test::write_file(dir.file("bad.gguf"), std::string("GGUF\x07\0\0\0", 8) + std::string(16, '\0'));
  test::expect_error([&] { gguf::File g(dir.file("bad.gguf")); }, {"bad.gguf", "version 7"});
  test::write_file(dir.file("cut.gguf"), std::string(reinterpret_cast<const char*>(a.data()), 600));
  test::expect_error([&] { gguf::File g(dir.file("cut.gguf")); }, {"cut.gguf", "past the end"});
}

TEST(Gguf, AQuantisedZooModelRoundTripsThroughGguf) {
  const models::Llama m = models::load_llama(kData + "/models/tiny-mha");
  const auto tok = HfTokenizer::load(kData + "/models/tiny-mha");
  for (Format fmt : {Format::Q8_0, Format::Q4_0}) {
    const models::Llama q = quantize_model(m, {fmt});
    test::TempDir dir;
    save_gguf(dir.file("m.gguf"), q, tok);
    const models::Llama back = load_gguf(dir.file("m.gguf"));
    EXPECT_EQ(back.rope_pairing, RopePairing::Adjacent);  // llama.cpp's order, rows permuted on the way out
    EXPECT_EQ(back.matrix_bytes(), q.matrix_bytes());
    const std::vector<std::int32_t> toks = {0, 523, 524, 278, 525, 522, 482};
    const auto a = ch01::forward(q, toks, true).to_float_vector(), b = ch01::forward(back, toks, true).to_float_vector();
    // The same numbers, attention summing q·k over the head's dimensions in another order.
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4 * (1 + std::fabs(a[i]))) << i;
    const gguf::File f(dir.file("m.gguf"));
    EXPECT_EQ(f.get("tokenizer.ggml.tokens").items.size(), 1024u);
    EXPECT_EQ(f.get("llama.attention.head_count").i, 8);
  }
}

// tiny-mha quantised to q8_0 and saved as GGUF: a valid file to break one field at a time.
std::string tiny_gguf(const test::TempDir& dir) {
  const std::string path = dir.file("tiny.gguf");
  save_gguf(path, quantize_model(models::load_llama(kData + "/models/tiny-mha"), {Format::Q8_0}),
            HfTokenizer::load(kData + "/models/tiny-mha"));
  return path;
}

// A copy of the GGUF at `from` with metadata `key` set to `v` (added if absent).
std::string with_metadata(const std::string& from, const std::string& to, const std::string& key, const gguf::Value& v) {
  const gguf::File f(from);
  std::vector<std::pair<std::string, gguf::Value>> meta(f.metadata().begin(), f.metadata().end());
  bool found = false;
  for (auto& [k, old] : meta)
    if (k == key) old = v, found = true;
  if (!found) meta.emplace_back(key, v);
  std::vector<gguf::Output> ts;
  for (const auto& i : f.tensors()) ts.push_back({i.name, i.type, i.shape, f.raw(i.name).view({-1})});
  gguf::write(to, meta, ts);
  return to;
}

gguf::Value int_value(gguf::Value::Kind k, std::int64_t i) {
  gguf::Value v;
  v.kind = k, v.i = i;
  return v;
}
gguf::Value float_value(double f) {
  gguf::Value v;
  v.kind = gguf::Value::Kind::F32, v.f = f;
  return v;
}

TEST(Gguf, BadLlamaMetadataNamesTheKeyAndTheFile) {
  test::TempDir dir;
  const std::string good = tiny_gguf(dir), bad = dir.file("bad.gguf");
  using K = gguf::Value::Kind;
  const struct {
    std::string key;
    gguf::Value value;
    std::vector<std::string> words;
  } cases[] = {
      // Each of these used to crash (SIGFPE), run with no layers, or read as 0.
      {"llama.attention.head_count", gguf::Value::u32(0), {"'llama.attention.head_count' = 0", "[1, 2^24)"}},
      {"llama.attention.head_count", gguf::Value::str("8"), {"'llama.attention.head_count' is STRING", "integer"}},
      {"llama.attention.head_count_kv",
       gguf::Value::u32(3),
       {"llama.* metadata", "not a multiple of num_key_value_heads 3"}},
      {"llama.attention.head_count", gguf::Value::u32(3), {"'llama.embedding_length' 128", "head_count' 3"}},
      {"llama.block_count", int_value(K::I64, -1), {"'llama.block_count' = -1"}},
      {"llama.block_count", int_value(K::U64, -1), {"'llama.block_count' = 18446744073709551615", "2^63"}},
      {"llama.block_count", gguf::Value::u32(1 << 24), {"'llama.block_count' = 16777216"}},
      {"llama.context_length", gguf::Value::str("x"), {"'llama.context_length' is STRING"}},
      {"llama.attention.layer_norm_rms_epsilon", gguf::Value::str("x"), {"rms_epsilon' is STRING", "FLOAT32"}},
      {"llama.attention.layer_norm_rms_epsilon", float_value(-1e-5), {"layer_norm_rms_epsilon' = -1e-05", "above 0"}},
      {"llama.attention.layer_norm_rms_epsilon", float_value(std::nan("")), {"layer_norm_rms_epsilon' = nan"}},
      {"llama.rope.freq_base", gguf::Value::u32(10000), {"'llama.rope.freq_base' is UINT32"}},
      {"llama.rope.dimension_count", gguf::Value::u32(8), {"'llama.rope.dimension_count' = 8", "partial RoPE"}},
      {"tokenizer.ggml.eos_token_id", gguf::Value::u32(999999), {"eos_token_id' = 999999", "[0, 1024)"}},
      {"general.architecture", gguf::Value::u32(1), {"'general.architecture' is UINT32", "STRING"}},
      // Scaled RoPE would load and run with the wrong frequencies.
      {"llama.rope.scaling.type", gguf::Value::str("yarn"), {"scales its RoPE frequencies"}},
      // Linear scaling runs (Gemma 3's), with its factor.
      {"llama.rope.scaling.type", gguf::Value::str("linear"), {"missing metadata 'llama.rope.scaling.factor'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + " " + gguf::kind_name(c.value.kind));
    with_metadata(good, bad, c.key, c.value);
    try {
      load_gguf(bad);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
      for (const auto& w : c.words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(load_gguf(good).config.num_layers, 4);
  {  // A norm (a vector) stored in Q8_0 blocks: refused, not read as a matrix past its shape.
    const gguf::File f(good);
    std::vector<gguf::Output> ts;
    for (const auto& i : f.tensors())
      if (i.name == "blk.0.attn_norm.weight")
        ts.push_back(
            {i.name, gguf::Type::Q8_0, i.shape, Tensor::zeros({gguf::row_bytes(gguf::Type::Q8_0, i.shape[0])}, DType::U8)});
      else ts.push_back({i.name, i.type, i.shape, f.raw(i.name).view({-1})});
    gguf::write(bad, std::vector<std::pair<std::string, gguf::Value>>(f.metadata().begin(), f.metadata().end()), ts);
    test::expect_error([&] { load_gguf(bad); }, {"bad.gguf", "blk.0.attn_norm.weight is Q8_0", "F32, F16 and BF16 vectors"});
  }
}

// A GGUF of one F32 tensor "t" with dimensions `ne` (innermost first) at `offset`, and 64 data bytes.
std::string one_tensor_gguf(const std::vector<std::uint64_t>& ne, std::uint64_t offset, std::uint32_t type = 0) {
  std::string b = "GGUF";
  auto put = [&](auto v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(std::uint32_t{3}), put(std::uint64_t{1}), put(std::uint64_t{0});
  put(std::uint64_t{1}), b += "t", put(static_cast<std::uint32_t>(ne.size()));
  for (auto d : ne) put(d);
  put(type), put(offset);
  b.append((32 - b.size() % 32) % 32, '\0');
  return b + std::string(64, '\0');
}

// A copy of the GGUF at `from` whose tensor `name` has its bytes changed by `edit`.
template <class F>
void with_tensor_bytes(const std::string& from, const std::string& to, const std::string& name, F edit) {
  const gguf::File f(from);
  std::vector<gguf::Output> ts;
  for (const auto& i : f.tensors()) {
    Tensor b = f.raw(i.name).view({-1}).clone();
    if (i.name == name) edit(b.data<std::uint8_t>());
    ts.push_back({i.name, i.type, i.shape, b});
  }
  gguf::write(to, std::vector<std::pair<std::string, gguf::Value>>(f.metadata().begin(), f.metadata().end()), ts);
}

// NaN or infinity in a GGUF's weights, block scales or norms used to load and generate text.
TEST(Gguf, NonFiniteScalesAndNormsAreRefusedAtLoad) {
  test::TempDir dir;
  const std::string good = tiny_gguf(dir), bad = dir.file("bad.gguf");
  auto set_f16 = [](std::uint8_t* p, std::uint16_t h) { std::memcpy(p, &h, 2); };
  with_tensor_bytes(good, bad, "blk.2.attn_v.weight", [&](std::uint8_t* b) { set_f16(b + 34 * 5, 0x7E00); });  // NaN
  test::expect_error([&] { load_gguf(bad); }, {"bad.gguf: tensor blk.2.attn_v.weight: row 1, block 1", "scale nan"});
  with_tensor_bytes(good, bad, "output.weight", [&](std::uint8_t* b) { set_f16(b, 0xFC00); });  // −inf
  test::expect_error([&] { load_gguf(bad); }, {"tensor output.weight: row 0, block 0", "scale -inf"});
  with_tensor_bytes(good, bad, "output_norm.weight", [](std::uint8_t* b) {
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(b + 4 * 7, &inf, 4);
  });
  test::expect_error([&] { load_gguf(bad); }, {"bad.gguf: tensor output_norm.weight: element [7] is inf"});
  with_tensor_bytes(good, bad, "token_embd.weight", [](std::uint8_t* b) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(b + 4 * 130, &nan, 4);
  });
  test::expect_error([&] { load_gguf(bad); }, {"tensor token_embd.weight: element [1, 2] is nan"});
}

// export used to write over the model it read (and exit 0); gguf::write used to truncate the
// old file before a write that could fail.
TEST(Gguf, ExportNeverDestroysAFile) {
  test::TempDir dir;
  const std::string model = dir.file("m"), weights = model + "/model.safetensors";
  std::filesystem::copy(kData + "/models/tiny-mha", model);
  const std::string bytes = test::read_file(weights);
  test::expect_error([&] { export_gguf(model, {Format::Q8_0}, weights); }, {weights, "the folder this command reads"});
  EXPECT_TRUE(test::read_file(weights) == bytes) << weights << " changed";  // not printed: megabytes
  const std::string good = tiny_gguf(dir), before = test::read_file(good);
  {
    test::FileSizeLimit limit(100000);  // tiny.gguf is larger
    test::expect_error([&] { with_tensor_bytes(good, good, "", [](std::uint8_t*) {}); }, {"error writing", good});
  }
  EXPECT_TRUE(test::read_file(good) == before) << good << " changed";
  EXPECT_EQ(test::list_folder(dir.path().string()), (std::vector<std::string>{"m", "tiny.gguf"}));
}

// A metadata value that does not fit its kind's width was cast silently (300 written as a U8 44).
TEST(Gguf, WriterRefusesAValueOutsideItsKind) {
  test::TempDir dir;
  gguf::Value v = gguf::Value::u32(0);
  v.kind = gguf::Value::Kind::U8, v.i = 300;
  test::expect_error(
      [&] {
    gguf::write(dir.file("w.gguf"), {{"general.alignment_hint", v}}, {});
      },
      {"metadata 'general.alignment_hint' = 300 is out of range [0, 255]"});
  v.kind = gguf::Value::Kind::U32, v.i = -1;
  const gguf::Value list = gguf::Value::array(gguf::Value::Kind::U32, {gguf::Value::u32(7), v});
  test::expect_error(
      [&] {
    gguf::write(dir.file("w.gguf"), {{"ids", list}}, {});
      },
      {"metadata 'ids[1]' = -1 is out of range"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.gguf")));
}

TEST(Gguf, BadTensorTablesAreClearErrorsNotCrashes) {
  test::TempDir dir;
  const std::string path = dir.file("t.gguf");
  test::write_file(path, one_tensor_gguf({16}, 0));
  EXPECT_EQ(gguf::File(path).tensor("t").numel(), 16);
  const struct {
    std::vector<std::uint64_t> ne;
    std::uint64_t offset;
    std::string words;
  } cases[] = {
      {{0}, 0, "a dimension of 0"},  // divided by: SIGFPE
      {{4, 0}, 0, "a dimension of 0"},
      {{16, ~std::uint64_t{0}}, 0, "a dimension of 18446744073709551615"},
      {{std::uint64_t{1} << 62, std::uint64_t{1} << 62}, 0, "implausibly large"},
      {{16}, ~std::uint64_t{0} - 63, "runs past the end"},  // offset + bytes wrapped past 2^64: garbage read
      {{16}, std::uint64_t{1} << 63, "runs past the end"},
      {{17}, 0, "runs past the end"},
      // A header that claims 16 TB names that tensor and those bytes, before anything is allocated.
      {{std::uint64_t{1} << 22, std::uint64_t{1} << 20}, 0, "(17592186044416 bytes at offset 0) runs past the end"},
      {{16}, 4, "not a multiple of the alignment 32"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.words);
    test::write_file(path, one_tensor_gguf(c.ne, c.offset));
    test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "tensor 't'", c.words});
  }
  // A UINT64 too large for the int64 the values are held in is refused, not wrapped negative.
  gguf::write(path, {{"x.big", int_value(gguf::Value::Kind::U64, -1)}}, {});
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "'x.big' = 18446744073709551615", "2^63"});
  // general.alignment must be an integer power of two, at least 8 (so F32/F16 data is aligned).
  gguf::write(path, {{"general.alignment", gguf::Value::str("32")}}, {});
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "'general.alignment' is STRING"});
  gguf::write(path, {{"general.alignment", gguf::Value::u32(4)}}, {});
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "general.alignment 4", "at least 8"});
  // A type this reader does not decode is named as ggml names it, not by its number alone.
  for (const auto& [type, words] : std::vector<std::pair<std::uint32_t, std::string>>{
           {16, "is IQ2_XXS (ggml type 16), which this reader does not decode"},
           {21, "is IQ3_S (ggml type 21)"},
           {9, "is Q8_1 (ggml type 9)"},
           {15, "is Q8_K (ggml type 15)"},
           {39, "is MXFP4 (ggml type 39)"},
           {4, "is Q4_2 (retired) (ggml type 4)"},
           {99, "is ggml type 99 (unknown), which"}}) {
    test::write_file(path, one_tensor_gguf({256}, 0, type));
    test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "tensor 't'", words});
  }
  test::expect_error([] { gguf::row_bytes(gguf::Type::F32, std::int64_t{1} << 62); }, {"out of range"});
  test::expect_error([] { gguf::row_bytes(gguf::Type::F16, -32); }, {"out of range"});
  EXPECT_EQ(gguf::row_bytes(gguf::Type::Q4_0, 64), 36);
}

// Every number the gguf package names (tools/make_ggml_type_names.py) has that name here; the
// numbers between them are the types ggml retired, and past them none is known.
TEST(Gguf, TypeNamesAreGgmlsNames) {
  const auto golden = load_json(kData + "/golden/quant/ggml_type_names.json");
  std::uint32_t last = 0;
  for (const auto& [number, name] : golden["names"].items()) {
    const auto t = static_cast<std::uint32_t>(std::stoul(number));
    EXPECT_EQ(gguf::ggml_type_name(t), name.get<std::string>()) << "ggml type " << t;
    last = std::max(last, t);
  }
  EXPECT_EQ(gguf::ggml_type_name(20), "IQ4_NL");
  for (std::uint32_t t = 0; t < last; ++t) {
    if (golden["names"].contains(std::to_string(t))) continue;
    EXPECT_NE(gguf::ggml_type_name(t).find("(retired)"), std::string::npos) << t;
  }
  EXPECT_EQ(gguf::ggml_type_name(last + 1), "ggml type " + std::to_string(last + 1) + " (unknown)");
  EXPECT_EQ(gguf::type_name(gguf::Type::Q6_K), "Q6_K");
}

// A GGUF of two F32 tensors of 16 values, `a` at offset 0 and `b` at `offset_b`, with 128 data
// bytes and `extra` more.
std::string two_tensor_gguf(const std::string& b_name, std::uint64_t offset_b, std::size_t extra = 0) {
  std::string b = "GGUF";
  auto put = [&](auto v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(std::uint32_t{3}), put(std::uint64_t{2}), put(std::uint64_t{0});
  for (auto [name, offset] : {std::pair<std::string, std::uint64_t>{"a", 0}, {b_name, offset_b}}) {
    put(std::uint64_t{name.size()}), b += name, put(std::uint32_t{1}), put(std::uint64_t{16});
    put(std::uint32_t{0}), put(offset);
  }
  b.append((32 - b.size() % 32) % 32, '\0');
  return b + std::string(128 + extra, '\0');
}

// A file of just the 4 bytes "GGUF" used to be called "no 'GGUF' magic", which it has.
TEST(Gguf, AFileCutAfterItsMagicSaysSo) {
  test::TempDir dir;
  const std::string path = dir.file("t.gguf");
  test::write_file(path, "GGUF");
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "truncated after the magic (4 bytes"});
  test::write_file(path, std::string("GGUF\3\0\0\0", 8));
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "truncated after the magic (8 bytes"});
  test::write_file(path, "GGML");
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "no 'GGUF' magic"});
}

TEST(Gguf, TheTensorTableMustDescribeTheDataExactly) {
  test::TempDir dir;
  const std::string path = dir.file("t.gguf");
  test::write_file(path, two_tensor_gguf("b", 64));
  EXPECT_EQ(gguf::File(path).tensors().size(), 2u);
  // Each of these used to load, reading bytes that belong to another tensor or to none.
  test::write_file(path, two_tensor_gguf("b", 32));
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "tensors 'a' and 'b' overlap"});
  test::write_file(path, two_tensor_gguf("a", 64));
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "tensor 'a' appears twice"});
  test::write_file(path, two_tensor_gguf("b", 64, 64));
  test::expect_error([&] { gguf::File f(path); }, {"t.gguf", "64 bytes after the last tensor 'b' belong to no tensor"});
  // A tensor count one short: the last entry is read as padding and every tensor shifts.
  const std::string good = tiny_gguf(dir), bad = dir.file("bad.gguf");
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::uint64_t n;
  std::memcpy(&n, bytes.data() + 8, 8);
  --n;
  std::memcpy(bytes.data() + 8, &n, 8);
  test::write_file(bad, bytes);
  test::expect_error([&] { load_gguf(bad); }, {"bad.gguf", "does the tensor count, " + std::to_string(n) + ", match"});
  // block_count below the layers present: the last layer's tensors are left over, not ignored.
  with_metadata(good, bad, "llama.block_count", gguf::Value::u32(3));
  test::expect_error([&] { load_gguf(bad); },
                     {"bad.gguf", "tensor 'blk.3.", "is not part of the model", "llama.block_count = 3"});
  with_metadata(good, bad, "llama.block_count", gguf::Value::u32(5));
  test::expect_error([&] { load_gguf(bad); }, {"bad.gguf", "no tensor 'blk.4."});
}

// llama.cpp's Q4_0 files keep a tied embedding as Q8_0: the head must run it as Q8_0, the type it
// is stored in, not re-quantised to the projections' Q4_0.
TEST(Gguf, ATiedHeadRunsInTheTypeTheEmbeddingIsStoredIn) {
  test::TempDir dir;
  const std::string q4 = dir.file("q4.gguf");
  save_gguf(q4, quantize_model(models::load_llama(kData + "/models/tiny-mha"), {Format::Q4_0}),
            HfTokenizer::load(kData + "/models/tiny-mha"));
  const gguf::File f(q4);
  std::vector<gguf::Output> ts;
  const QMatrix embd = quantize(f.tensor("token_embd.weight").to(DType::F32), {Format::Q8_0});
  for (const auto& i : f.tensors()) {
    if (i.name == "output.weight") continue;  // tied: the head is the embedding table
    ts.push_back(i.name == "token_embd.weight" ? gguf::Output{i.name, gguf::Type::Q8_0, i.shape, embd.data.view({-1})}
                                               : gguf::Output{i.name, i.type, i.shape, f.raw(i.name).view({-1})});
  }
  const std::string mixed = dir.file("mixed.gguf");
  gguf::write(mixed, {f.metadata().begin(), f.metadata().end()}, ts);
  const models::Llama m = load_gguf(mixed);
  EXPECT_EQ(qmatrix(m.lm_head, "the head").spec.format, Format::Q8_0);
  EXPECT_EQ(qmatrix(m.layers[0].wq, "wq").spec.format, Format::Q4_0);
  // The head's rows are the stored bytes, dequantised exactly as the embedding's.
  const auto head = dequantize(qmatrix(m.lm_head, "the head")).to_double_vector(), table = m.embed.to_double_vector();
  EXPECT_EQ(head, table);
}

// F16 and BF16 GGUFs (what a float checkpoint converts to): the projections run as stored, and
// the model computes what the same weights widened to f32 compute (the two paths differ only in
// how the products read their weights); greedy decoding gives the same tokens.
TEST(Gguf, SixteenBitModelsRunInTheirStoredType) {
  test::TempDir dir;
  const std::string q8 = tiny_gguf(dir);
  const gguf::File f(q8);
  for (const auto& [type, dtype] : {std::pair{gguf::Type::F16, DType::F16}, std::pair{gguf::Type::BF16, DType::BF16}}) {
    std::vector<gguf::Output> ts;
    for (const auto& i : f.tensors()) {
      if (i.type != gguf::Type::Q8_0) {
        ts.push_back({i.name, i.type, i.shape, f.raw(i.name).view({-1})});
        continue;
      }
      // The Q8_0 projection's values, stored as 16-bit floats (rounded once, here).
      const Tensor w = dequantize(QMatrix({Format::Q8_0}, i.shape[0], i.shape[1], f.raw(i.name).clone())).to(dtype);
      ts.push_back({i.name, type, i.shape,
                    Tensor::wrap(const_cast<void*>(w.raw_data()), {static_cast<std::int64_t>(w.nbytes())}, DType::U8,
                                 Device::CPU, nullptr)
                        .clone()});
    }
    const std::string path = dir.file(gguf::type_name(type) + ".gguf");
    gguf::write(path, {f.metadata().begin(), f.metadata().end()}, ts);
    const models::Llama m = load_gguf(path);
    ASSERT_EQ(m.layers[0].wq.weight.dtype(), dtype) << "the projections were converted on load";
    const models::Llama wide = m.to(Device::CPU, DType::F32);  // the same values in f32
    const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
    const auto a = ch01::forward(m, prompt).to_double_vector(), b = ch01::forward(wide, prompt).to_double_vector();
    const double bound = test::two_path_bound(m.config, b);
    for (std::size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], bound) << gguf::type_name(type);
    Sampler s1({}), s2({});
    EXPECT_EQ(models::generate_cached(m, prompt, 24, s1, {}).generated,
              models::generate_cached(wide, prompt, 24, s2, {}).generated)
        << gguf::type_name(type);
  }
}

// The GGUF block types a downloaded file holds (Q4_K_M is Q4_K and Q6_K; Q5_K_M, Q4_1, Q5_0,
// Q5_1), decoded bit for bit as the gguf package decodes them (tools/make_gguf_type_goldens.py).
TEST(Gguf, BlockTypesDecodeAsTheGgufPackageDecodesThem) {
  const SafetensorsFile f(kData + "/golden/quant/gguf_types.safetensors");
  for (const auto& [name, type] : std::vector<std::pair<std::string, gguf::Type>>{{"Q4_1", gguf::Type::Q4_1},
                                                                                  {"Q5_0", gguf::Type::Q5_0},
                                                                                  {"Q5_1", gguf::Type::Q5_1},
                                                                                  {"Q2_K", gguf::Type::Q2_K},
                                                                                  {"Q3_K", gguf::Type::Q3_K},
                                                                                  {"Q4_K", gguf::Type::Q4_K},
                                                                                  {"Q5_K", gguf::Type::Q5_K},
                                                                                  {"Q6_K", gguf::Type::Q6_K},
                                                                                  {"IQ4_NL", gguf::Type::IQ4_NL},
                                                                                  {"IQ4_XS", gguf::Type::IQ4_XS}}) {
    const Tensor bytes = f.get(name + ".bytes"), want = f.get(name + ".f32");
    const Tensor got = gguf::dequantize_rows(type, bytes, want.size(1));
    const auto a = got.to_float_vector(), b = want.to_float_vector();
    ASSERT_EQ(a.size(), b.size()) << name;
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << name << ", value " << i;
  }
  // Q8_0 and Q4_0 through the same decoder give chapter 09's own decoding.
  const SafetensorsFile q(kData + "/golden/quant/blocks.safetensors");
  for (auto [name, type, fmt] :
       {std::tuple{"q8_0", gguf::Type::Q8_0, Format::Q8_0}, std::tuple{"q4_0", gguf::Type::Q4_0, Format::Q4_0}}) {
    const Tensor raw = q.get(name);
    const Tensor packed = raw.contiguous().view({8, raw.numel() / 8});
    EXPECT_EQ(gguf::dequantize_rows(type, packed, 256).to_float_vector(),
              dequantize(QMatrix({fmt}, 8, 256, packed.clone())).to_float_vector())
        << name;
  }
  test::expect_error([&] { gguf::dequantize_rows(gguf::Type::Q6_K, f.get("Q6_K.bytes"), 256); },
                     {"Q6_K rows of 256", "210 bytes"});
  test::expect_error([&] { gguf::dequantize_rows(gguf::Type::Q4_K, f.get("Q4_K.bytes"), 100); },
                     {"not whole Q4_K blocks of 256"});
}

// export --format f32 / f16 writes the unquantised model (what llama.cpp's llama-quantize reads):
// it loads back with its projections in that type and computes what the Hugging Face folder does.
TEST(Gguf, UnquantisedExportsRunAsTheFolderDoes) {
  test::TempDir dir;
  const std::string tiny = kData + "/models/tiny-mha";
  const models::Llama hf = models::load_llama(tiny);
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  for (const DType t : {DType::F32, DType::F16}) {
    const std::string path = dir.file(std::string(dtype_name(t)) + ".gguf");
    export_gguf(tiny, t, path);
    const gguf::File f(path);
    EXPECT_EQ(f.info("blk.0.attn_q.weight").type, t == DType::F32 ? gguf::Type::F32 : gguf::Type::F16);
    EXPECT_EQ(f.get_int("general.file_type"), t == DType::F32 ? 0 : 1);
    const models::Llama m = load_gguf(path), want = hf.to(Device::CPU, t);
    EXPECT_EQ(m.layers[0].wq.weight.dtype(), t);
    const auto a = ch01::forward(m, prompt).to_double_vector(), b = ch01::forward(want, prompt).to_double_vector();
    const double bound = test::two_path_bound(m.config, b);
    for (std::size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], bound) << dtype_name(t);
  }
  test::expect_error([&] { export_gguf(tiny, DType::BF16, dir.file("x.gguf")); }, {"f32 or f16"});
}

// test::small_bpe_tokenizer() as a file in `dir`.
std::string small_tokenizer(const test::TempDir& dir) {
  const std::string path = dir.file("small-bpe.json");
  test::write_file(path, test::small_bpe_tokenizer().dump());
  return path;
}

// A Qwen2 (biases on q, k and v; RoPE over the halves of each head) goes through GGUF as llama.cpp's
// qwen2 architecture: written with its biases and its rows as trained, read back, and run, it
// gives transformers' float64 logits and greedy tokens (tools/make_window_goldens.py's Qwen2
// whose window is unused).
TEST(Gguf, AQwen2RunsAsTransformersDoes) {
  test::TempDir dir;
  const std::string model = kData + "/golden/window-random/qwen2-unused";
  const models::Llama hf = models::load_llama(model);
  ASSERT_TRUE(hf.layers[0].wq.bias.defined());
  const std::string path = dir.file("qwen2.gguf");
  save_gguf(path, hf, HfTokenizer::load(small_tokenizer(dir)));
  const gguf::File f(path);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen2");
  EXPECT_EQ(f.get_int("qwen2.block_count"), 2);
  EXPECT_TRUE(f.contains("blk.1.attn_k.bias"));
  const models::Llama m = load_gguf(path);
  EXPECT_EQ(m.rope_pairing, RopePairing::HalfSplit);
  const SafetensorsFile g(model + "/golden.safetensors");
  const auto ids = test::ids_of(g.get("input_ids"));
  models::ContiguousKVCache cache(m.config, static_cast<std::int64_t>(ids.size()), Device::CPU);
  test::expect_golden(m.config, models::forward_cached(m, cache, ids, true).to_double_vector(),
                      g.get("logits").to_double_vector(), "qwen2 through GGUF: every position's logits");
  const auto greedy = test::ids_of(g.get("greedy_ids"));
  Sampler s({});
  EXPECT_EQ(models::generate_cached(m, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
  // qwen2 metadata under its own prefix: a file that names it wrongly is refused by key.
  test::expect_error(
      [&] { gguf_config(gguf::File(with_metadata(path, dir.file("bad.gguf"), "qwen2.block_count", gguf::Value::u32(0)))); },
      {"bad.gguf", "qwen2.block_count"});
}

// The part of a GGUF block matrix's values that its fast product sums apart from the quants' part:
// the values its blocks give with every quant 0. They are m for q4_1 and q5_1, −dmin·m for q2_k,
// q4_k and q5_k, and −32·d·sc for q6_k and −4·d·(sc − 32) for q3_k, whose products subtract the
// 32 or the 4 with x's 16-value sums. q4_0 and q5_0 centre their quants in integers, exactly, so
// theirs is 0 here. A block of bb bytes holds its quants in bytes [from, to).
std::vector<double> minimum_terms(const QMatrix& q) {
  std::int64_t bb = 0, from = 0, to = 0;
  switch (q.spec.format) {
    case Format::Q4_1: bb = 20, from = 4, to = 20; break;
    case Format::Q5_1: bb = 24, from = 4, to = 24; break;
    case Format::Q2_K: bb = 84, from = 16, to = 80; break;
    case Format::Q4_K: bb = 144, from = 16, to = 144; break;
    case Format::Q5_K: bb = 176, from = 16, to = 176; break;
    case Format::Q6_K: bb = 210, from = 0, to = 192; break;
    case Format::Q3_K: bb = 110, from = 0, to = 96; break;
    default: return std::vector<double>(static_cast<std::size_t>(q.rows * q.cols), 0.0);
  }
  QMatrix z = q;
  z.data = q.data.clone();
  auto* p = z.data.data<std::uint8_t>();
  for (std::int64_t b = 0; b < q.data.numel() / bb; ++b)
    std::memset(p + b * bb + from, 0, static_cast<std::size_t>(to - from));
  return dequantize(z).to_double_vector();
}

// Products over x of a GGUF block matrix's packed blocks (the ref:: product, the fast one and,
// given, `also`): the float64 product of the decoded values with x rounded through its q8_0
// blocks, within blocked_product's bound.
void expect_products_within_the_bound(const QMatrix& q, const std::string& what, const PackedMatrix* also = nullptr) {
  auto rng = test::rng_for_test();
  const std::int64_t N = q.rows, K = q.cols;
  for (const std::int64_t M : {1, 3, 4, 11}) {  // 1-4: the direct kernels; 11: unpacked rows
    SCOPED_TRACE(what + ", M = " + std::to_string(M));
    const Tensor x = test::uniform(rng, {M, K});
    const auto [exact, b] = blocked_product(x, q, 4);
    Tensor r = Tensor::empty({M, N}, DType::F32);
    qmatmul_ref(x, q, r);
    expect_within(r.to_double_vector(), exact, b, "reference");
    expect_within(qmatmul(x, q).to_double_vector(), exact, b, "fast");
    if (also) {
      Tensor y = Tensor::empty({M, N}, DType::F32);
      also->matmul(x, y);
      expect_within(y.to_double_vector(), exact, b, "interleaved");
    }
  }
}

// q4_k, q5_k, q6_k, iq4_nl, iq4_xs, q4_1, q5_0 and q5_1 interleaved eight rows at a time (q4_k's,
// q5_k's and iq4_xs's scales unpacked to bytes, q6_k's values split into their low four and top two
// bits, the fifth bits of q5_0, q5_1 and q5_k gathered a piece at a time, iq4_nl's blocks as
// q4_0's) give their bytes back in row order exactly and multiply within the same bound as the
// row-order products.
TEST(Gguf, InterleavedKQuantsAreTheSameMatrix) {
  if (!quant::interleaved_kernels())
    GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels: run keeps every matrix in row order";
  test::ThreadCount threads(2);
  for (const auto& [f, bb] : std::vector<std::pair<Format, std::int64_t>>{{Format::Q4_K, 144},
                                                                          {Format::Q5_K, 176},
                                                                          {Format::Q6_K, 210},
                                                                          {Format::IQ4_NL, 18},
                                                                          {Format::IQ4_XS, 136},
                                                                          {Format::Q4_1, 20},
                                                                          {Format::Q5_0, 22},
                                                                          {Format::Q5_1, 24}}) {
    SCOPED_TRACE(QuantSpec{f}.name());
    const std::int64_t N = 16, K = 512, bv = gguf::block_values(gguf_type(f));  // two super-blocks a row
    Tensor bytes = Tensor::empty({N * K / bv * bb}, DType::U8);
    auto* p = bytes.data<std::uint8_t>();
    std::uint64_t r = 11;
    for (std::int64_t i = 0; i < bytes.numel(); ++i)
      r ^= r << 13, r ^= r >> 7, r ^= r << 17, p[i] = static_cast<std::uint8_t>(r >> 32);
    for (std::int64_t b = 0; b < N * K / bv; ++b)
      for (const int o : half_offsets(f)) p[b * bb + o + 1] &= 0x3B;  // finite scales (below 2^15)
    const QMatrix q({f}, N, K, bytes);
    ASSERT_TRUE(interleavable(q));
    const Interleaved8 il(q);
    expect_the_same_blocks(il, q);
    // q4_k and q5_k: each row's scales and minimums as 16 bytes instead of 12; iq4_xs's 6 bytes of
    // scales as 8; the others: the same bytes
    EXPECT_EQ(il.bytes(), f == Format::Q4_K     ? q.bytes() / 144 * 148
                          : f == Format::Q5_K   ? q.bytes() / 176 * 180
                          : f == Format::IQ4_XS ? q.bytes() / 136 * 138
                                                : q.bytes());
    expect_products_within_the_bound(q, QuantSpec{f}.name(), &il);
    EXPECT_FALSE(interleavable(QMatrix({f}, 8, bv + 16, Tensor::empty({1}, DType::U8))));  // the rule, not the bytes
  }
}

// Every GGUF block type a downloaded file holds runs packed: chapter 09's formats q4_1 … q6_k
// hold the file's blocks (random bytes with finite scales, so every bit pattern occurs), their
// values are the gguf package's decoding bit for bit, and the products read the bytes.
TEST(Gguf, BlockTypesRunPackedAndDecodeAsTheGgufPackage) {
  const SafetensorsFile f(kData + "/golden/quant/gguf_types.safetensors");
  // Each format with its GGUF type's name and number (ggml.h's enum ggml_type).
  for (const auto& [fmt, name, number] :
       std::vector<std::tuple<Format, std::string, std::uint32_t>>{{Format::Q4_1, "Q4_1", 3},
                                                                   {Format::Q5_0, "Q5_0", 6},
                                                                   {Format::Q5_1, "Q5_1", 7},
                                                                   {Format::Q2_K, "Q2_K", 10},
                                                                   {Format::Q3_K, "Q3_K", 11},
                                                                   {Format::Q4_K, "Q4_K", 12},
                                                                   {Format::Q5_K, "Q5_K", 13},
                                                                   {Format::Q6_K, "Q6_K", 14},
                                                                   {Format::IQ4_NL, "IQ4_NL", 20},
                                                                   {Format::IQ4_XS, "IQ4_XS", 23}}) {
    const Tensor bytes = f.get(name + ".bytes"), want = f.get(name + ".f32");
    const QMatrix q({fmt}, want.size(0), want.size(1), bytes.clone());
    EXPECT_EQ(static_cast<std::uint32_t>(gguf_type(fmt)), number) << name;
    std::string lower = name;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    EXPECT_EQ(q.format(), lower);
    EXPECT_EQ(dequantize(q).to_float_vector(), want.to_float_vector()) << name;
    expect_products_within_the_bound(q, name);
    if (gguf::block_values(gguf_type(fmt)) == 32) {  // rows of 2 blocks: the products' tail past whole fours of blocks
      const std::int64_t rows = q.rows * q.cols / 64;
      expect_products_within_the_bound(
          QMatrix({fmt}, rows, 64, bytes.contiguous().view({rows, bytes.numel() / rows}).clone()), name + " in rows of 64");
    }
    test::expect_error([&] { QuantSpec::parse(q.format()); }, {q.format(), "read from GGUF files"});
  }
}

// A valid Q4_K block for 256 values: every sub-block scale and min 1, dmin = 8·d, so each value is
// d·(q − 8), as Q4_0 (llama.cpp's quantiser searches better scales; any valid block will do here).
void q4_k_block(const float* w, std::uint8_t* b) {
  float amax = 0;
  for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(w[i]));
  const std::uint16_t dh = f32_to_f16(amax / 8 > 0 ? amax / 8 : 1), mh = f32_to_f16(f16_to_f32(dh) * 8);
  const float d = f16_to_f32(dh);
  std::memcpy(b, &dh, 2), std::memcpy(b + 2, &mh, 2);
  for (int j = 0; j < 8; ++j) b[4 + j] = 1;
  b[12] = b[13] = b[14] = b[15] = 0x11;
  for (int i = 0; i < 256; ++i) {
    const int q = static_cast<int>(std::clamp(std::lround(w[i] / d) + 8, 0L, 15L));
    const int j = i / 64, l = i % 32, high = (i % 64) / 32;
    std::uint8_t& byte = b[16 + 32 * j + l];
    byte = static_cast<std::uint8_t>(high ? (byte & 0x0F) | (q << 4) : (byte & 0xF0) | q);
  }
}

// A valid Q6_K block: every scale 1, so each value is d·(q − 32), q in 0..63 (layout as weight_value).
void q6_k_block(const float* w, std::uint8_t* b) {
  float amax = 0;
  for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(w[i]));
  const std::uint16_t dh = f32_to_f16(amax / 31 > 0 ? amax / 31 : 1);
  const float d = f16_to_f32(dh);
  std::memset(b, 0, 210);
  for (int i = 192; i < 208; ++i) b[i] = 1;
  std::memcpy(b + 208, &dh, 2);
  for (int i = 0; i < 256; ++i) {
    const int q = static_cast<int>(std::clamp(std::lround(w[i] / d) + 32, 0L, 63L));
    const int half = i / 128, r = (i % 128) / 32, l = i % 32;
    b[64 * half + l + 32 * (r % 2)] |= static_cast<std::uint8_t>((q & 15) << (4 * (r / 2)));
    b[128 + 32 * half + l] |= static_cast<std::uint8_t>((q >> 4) << (2 * r));
  }
}

// The simple path of a format that takes x as q8_0 blocks: its decoded f32 matrix, multiplied
// (by ops::matmul) with x rounded through those blocks.
struct DecodedWithBlockedInput : PackedMatrix {
  Tensor w;
  std::string fmt;
  explicit DecodedWithBlockedInput(const QMatrix& q) : w(dequantize(q)), fmt(q.format()) {}
  void matmul(const Tensor& x, Tensor& out) const override { linear(q8_0_activations(x), Linear(w), out); }
  std::int64_t out_features() const override { return w.size(0); }
  std::int64_t in_features() const override { return w.size(1); }
  std::int64_t bytes() const override { return static_cast<std::int64_t>(w.nbytes()); }
  Device device() const override { return Device::CPU; }
  std::shared_ptr<const PackedMatrix> to_device(Device) const override { fail("CPU only"); }
  std::string format() const override { return fmt + " decoded"; }
};

// A valid Q2_K or Q3_K block for 256 values: every sub-block scale 1 (and Q2_K's min 2 with
// dmin = d), so each value is d·(q − 2) with q in 0..3, or d·(q − 4) with q in 0..7.
void q23_k_block(gguf::Type t, const float* w, std::uint8_t* b) {
  const bool two = t == gguf::Type::Q2_K;
  float amax = 0;
  for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(w[i]));
  const std::uint16_t dh = f32_to_f16(amax > 0 ? amax / (two ? 2 : 4) : 1);
  const float d = f16_to_f32(dh);
  std::memset(b, 0, two ? 84 : 110);
  if (two) {
    std::memset(b, 0x21, 16);  // sc 1, m 2
    std::memcpy(b + 80, &dh, 2), std::memcpy(b + 82, &dh, 2);
  } else {
    std::memset(b + 96, 0x11, 8), std::memset(b + 104, 0xAA, 4);  // every 6-bit scale 33: low 1, high 2
    std::memcpy(b + 108, &dh, 2);
  }
  for (int i = 0; i < 256; ++i) {
    const int q = static_cast<int>(std::clamp(std::lround(w[i] / d) + (two ? 2 : 4), 0L, two ? 3L : 7L));
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    b[(two ? 16 : 32) + 32 * h + l] |= static_cast<std::uint8_t>((q & 3) << (2 * j));
    if (!two) b[l] |= static_cast<std::uint8_t>((q >> 2) << (4 * h + j));
  }
}

// A valid IQ4_NL (32 values) or IQ4_XS (256) block for w: d = max|w| / 127 (IQ4_XS: every
// sub-block scale 33, so each sub-block's is d·1), each value the nearest of the levels d·T[q]
// (llama.cpp's quantiser searches better scales; any valid block will do here).
void iq4_block(gguf::Type t, const float* w, std::uint8_t* b) {
  const bool xs = t == gguf::Type::IQ4_XS;
  const int n = xs ? 256 : 32;
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const std::uint16_t dh = f32_to_f16(amax > 0 ? amax / 127 : 1);
  const float d = f16_to_f32(dh);
  std::memset(b, 0, xs ? 136 : 18);
  std::memcpy(b, &dh, 2);
  if (xs) b[2] = b[3] = 0xAA, std::memset(b + 4, 0x11, 4);  // sc = 1 | 2 << 4 = 33 for every sub-block
  for (int i = 0; i < n; ++i) {
    int best = 0;
    for (int q = 1; q < 16; ++q)
      if (std::fabs(w[i] - d * gguf::kIq4nlValues[q]) < std::fabs(w[i] - d * gguf::kIq4nlValues[best])) best = q;
    const int j = i / 32, l = i % 32;
    b[(xs ? 8 + 16 * j : 2) + l % 16] |= static_cast<std::uint8_t>(best << (l < 16 ? 0 : 4));
  }
}

// A valid block of the other GGUF types for w (32 values, or 256 for q5_k) on a plain grid:
// q4_1 and q5_1 d = (max − min) / (15 or 31) and m = min, so each value is d·q + m; q5_0
// d = max|w| / 15, d·(q − 16); q5_k every sub-block scale and min 1 and dmin = 16·d, so each
// value is d·(q − 16). Layouts as weight_value (llama.cpp's quantisers search better scales).
// Q8_0 and Q4_0 are llama.cpp's own reference quantisers.
void pack_block(gguf::Type t, const float* w, std::uint8_t* b) {
  if (t == gguf::Type::Q8_0) return quantize_q8_0_block(w, b);
  if (t == gguf::Type::Q4_0) return quantize_q4_0_block(w, b);
  if (t == gguf::Type::Q4_K) return q4_k_block(w, b);
  if (t == gguf::Type::Q6_K) return q6_k_block(w, b);
  if (t == gguf::Type::Q2_K || t == gguf::Type::Q3_K) return q23_k_block(t, w, b);
  if (t == gguf::Type::IQ4_NL || t == gguf::Type::IQ4_XS) return iq4_block(t, w, b);
  const int n = t == gguf::Type::Q5_K ? 256 : 32;
  const bool has_min = t == gguf::Type::Q4_1 || t == gguf::Type::Q5_1;
  const int top = t == gguf::Type::Q4_1 ? 15 : 31;
  float lo = w[0], hi = w[0], amax = 0;
  for (int i = 0; i < n; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]), amax = std::max(amax, std::fabs(w[i]));
  const float span = has_min ? (hi - lo) / static_cast<float>(top) : amax / (t == gguf::Type::Q5_K ? 16.0f : 15.0f);
  const std::uint16_t dh = f32_to_f16(span > 0 ? span : 1.0f);
  const float d = f16_to_f32(dh);
  std::memset(b, 0, static_cast<std::size_t>(gguf::row_bytes(t, n)));
  std::memcpy(b, &dh, 2);
  float m = 0;
  if (has_min) {
    const std::uint16_t mh = f32_to_f16(lo);
    std::memcpy(b + 2, &mh, 2), m = f16_to_f32(mh);
  }
  auto q_of = [&](float v) {
    return static_cast<int>(
        std::clamp(has_min ? std::lround((v - m) / d) : std::lround(v / d) + 16, 0L, static_cast<long>(top)));
  };
  if (t == gguf::Type::Q5_K) {
    const std::uint16_t mh = f32_to_f16(f16_to_f32(dh) * 16);
    std::memcpy(b + 2, &mh, 2);
    for (int j = 0; j < 8; ++j) b[4 + j] = 1;
    b[12] = b[13] = b[14] = b[15] = 0x11;
    for (int i = 0; i < 256; ++i) {
      const int q = q_of(w[i]), j = i / 64, l = i % 32, sub = i / 32;
      b[48 + 32 * j + l] |= static_cast<std::uint8_t>((q & 15) << (4 * (sub % 2)));
      b[16 + l] |= static_cast<std::uint8_t>((q >> 4) << sub);
    }
    return;
  }
  IL_CHECK(t == gguf::Type::Q4_1 || t == gguf::Type::Q5_0 || t == gguf::Type::Q5_1, "pack_block: no packer for ",
           gguf::type_name(t));
  const bool five = t != gguf::Type::Q4_1;
  std::uint8_t* qs = b + (has_min ? 4 : 2) + (five ? 4 : 0);
  std::uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) {
    const int q = q_of(w[i]);
    qs[i % 16] |= static_cast<std::uint8_t>((q & 15) << (i < 16 ? 0 : 4));
    qh |= static_cast<std::uint32_t>(q >> 4) << i;
  }
  if (five) std::memcpy(b + (has_min ? 4 : 2), &qh, 4);
}

// A random model of config `c` (untied head) in a GGUF file in `dir`, each projection and the head
// re-packed as type_for(its name) from the model's Q8_0 values; the embedding stays Q8_0.
std::string repacked_gguf(const test::TempDir& dir, const TransformerConfig& c,
                          const std::function<gguf::Type(const std::string&)>& type_for) {
  const std::string q8 = dir.file("q8_0.gguf");
  save_gguf(q8, quantize_model(models::random_llama(c, 5), {Format::Q8_0}), HfTokenizer::load(kData + "/models/tiny-mha"));
  const gguf::File f(q8);
  std::vector<gguf::Output> ts;
  for (const auto& i : f.tensors()) {
    if (i.type != gguf::Type::Q8_0 || i.name == "token_embd.weight") {
      ts.push_back({i.name, i.type, i.shape, f.raw(i.name).view({-1})});
      continue;
    }
    const gguf::Type t = type_for(i.name);
    const Tensor w = dequantize(QMatrix({Format::Q8_0}, i.shape[0], i.shape[1], f.raw(i.name).clone()));
    const std::int64_t bv = gguf::block_values(t), bb = gguf::row_bytes(t, bv), blocks = w.numel() / bv;
    Tensor packed = Tensor::empty({blocks * bb}, DType::U8);
    for (std::int64_t k = 0; k < blocks; ++k) pack_block(t, w.data<float>() + k * bv, packed.data<std::uint8_t>() + k * bb);
    ts.push_back({i.name, t, i.shape, packed});
  }
  const std::string path = dir.file("repacked.gguf");
  gguf::write(path, {f.metadata().begin(), f.metadata().end()}, ts);
  return path;
}

// tiny-mha's config at widths that are whole 256-value super-blocks, two layers, untied head.
TransformerConfig super_block_config() {
  TransformerConfig c = models::load_llama(kData + "/models/tiny-mha").config;
  c.hidden_size = 256, c.intermediate_size = 512, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64, c.num_layers = 2;
  c.tie_word_embeddings = false;
  return c;
}

// A GGUF model with packed matrices runs as the same model decoded to f32 (multiplying x rounded
// through q8_0 blocks, as the packed products do) does. Greedy decoding of the packed model
// through its cache, then both models teacher-forced over what it emitted: every position's
// logits agree within the two paths' bound, and each emitted token is the decoded model's argmax
// or within twice that bound of it (the cached logits and the decoded ones each sit within one
// bound of the packed forward's). A random model's logits are nearly flat, so a near-tie may fall
// either way from one build's rounding to another's; comparing two free-running greedy decodes
// would test the rounding, not the products.
void expect_runs_as_decoded(const models::Llama& m) {
  // The decoded model's products must sum as the packed prefill does (cpu::dot_rows, the row
  // kernel): each layer rounds its input through q8_0 blocks, and that rounding is a step
  // function, so an ulp of difference upstream can move a value a whole q8_0 step and the two
  // paths would no longer be comparable to their rounding bound.
  struct RowKernel {
    RowKernel() { cpu::set_batch_gemv(cpu::BatchGemv::Rows); }
    ~RowKernel() { cpu::set_batch_gemv(cpu::kDefaultBatchGemv); }
  } rows;
  for (const models::LlamaLayer& l : m.layers)
    for (const Linear* w : l.linears()) ASSERT_TRUE(w->packed) << "a projection was decoded at load";
  ASSERT_TRUE(m.lm_head.packed);
  models::Llama wide = m;  // every matrix decoded to f32: the simple path
  auto decoded = [](const Linear& l, const char* what) {
    return Linear(std::make_shared<DecodedWithBlockedInput>(qmatrix(l, what)), l.bias);
  };
  for (models::LlamaLayer& l : wide.layers)
    for (Linear* w : l.linears()) *w = decoded(*w, "projection");
  wide.lm_head = decoded(m.lm_head, "head");
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  Sampler sampler({});
  const std::vector<std::int32_t> emitted = models::generate_cached(m, prompt, 24, sampler, {}).generated;
  ASSERT_EQ(emitted.size(), 24u);
  std::vector<std::int32_t> seq = prompt;
  seq.insert(seq.end(), emitted.begin(), emitted.end() - 1);
  const auto a = ch01::forward(m, seq, true).to_double_vector(), b = ch01::forward(wide, seq, true).to_double_vector();
  const double bound = test::two_path_bound(m.config, b);
  for (std::size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], bound) << "logit " << k;
  const auto V = static_cast<std::size_t>(m.config.vocab_size);
  for (std::size_t i = 0; i < emitted.size(); ++i) {
    const double* row = b.data() + (prompt.size() - 1 + i) * V;
    EXPECT_LE(*std::max_element(row, row + V) - row[emitted[i]], 2 * bound) << "step " << i << " emitted " << emitted[i];
  }
}

// A model shaped like a Q4_K_M file (widths multiples of 256): Q4_K projections, Q6_K for
// ffn_down and the head, loads with every matrix packed in its own type and runs as the same
// model decoded to f32 does.
TEST(Gguf, AMixedKQuantFileRunsEveryMatrixPacked) {
  test::TempDir dir;
  const TransformerConfig c = super_block_config();
  const std::string path = repacked_gguf(dir, c, [](const std::string& name) {
    const bool six = name.find("ffn_down") != std::string::npos || name == "output.weight";
    return six ? gguf::Type::Q6_K : gguf::Type::Q4_K;
  });
  const models::Llama m = load_gguf(path);
  EXPECT_EQ(m.layers[0].wq.packed->format(), "q4_k");
  EXPECT_EQ(m.layers[1].w_down.packed->format(), "q6_k");
  EXPECT_EQ(m.lm_head.packed->format(), "q6_k");
  const gguf::File g(path);
  EXPECT_EQ(dequantize(qmatrix(m.layers[1].w_up, "w_up")).to_float_vector(),
            gguf::dequantize_rows(gguf::Type::Q4_K, g.raw("blk.1.ffn_up.weight"), c.hidden_size).to_float_vector());
  expect_runs_as_decoded(m);
}

// Generates `tokens` tokens greedily from a fixed prompt with `il`, every matrix of which is
// Interleaved8, and holds each product on the model's own activations to blocked_product's bound;
// returns how many products it checked.
int generate_checking_products(const models::Llama& il, int tokens) {
  int checked = 0;
  LinearHook hook([&](const Linear& l, const Tensor& x) {
    const auto* iv = dynamic_cast<const Interleaved8*>(l.packed.get());
    ASSERT_NE(iv, nullptr);
    const QMatrix q = iv->rows_in_order();
    Tensor y = Tensor::empty({x.size(0), q.rows}, DType::F32);
    iv->matmul(x, y);
    const auto [exact, b] = blocked_product(x, q, 4);
    expect_within(y.to_double_vector(), exact, b,
                  iv->format() + " " + std::to_string(q.rows) + " × " + std::to_string(q.cols));
    ++checked;
  });
  Sampler sampler({});
  const auto emitted = models::generate_cached(il, {0, 523, 524, 278, 525, 522, 482}, tokens, sampler, {}).generated;
  EXPECT_EQ(emitted.size(), static_cast<std::size_t>(tokens));
  return checked;
}

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K and IQ4_XS files whose matrices run
// interleaved (as `run` does on the CPU) run as the files do.
TEST(Gguf, BlockFilesRunInterleavedAsInRowOrder) {
  if (!quant::interleaved_kernels())
    GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels: run keeps every matrix in row order";
  for (const gguf::Type t : {gguf::Type::Q4_0, gguf::Type::Q4_1, gguf::Type::Q5_0, gguf::Type::Q5_1, gguf::Type::Q8_0,
                             gguf::Type::IQ4_NL, gguf::Type::Q4_K, gguf::Type::Q5_K, gguf::Type::Q6_K, gguf::Type::IQ4_XS}) {
    SCOPED_TRACE(gguf::type_name(t));
    test::TempDir dir;
    const TransformerConfig c = super_block_config();
    const std::string path = repacked_gguf(dir, c, [t](const std::string&) { return t; });
    const models::Llama m = load_gguf(path);
    models::Llama il = m;
    int count = 0;
    interleave_blocks(il, &count);
    EXPECT_EQ(count, 7 * c.num_layers + 1);
    EXPECT_NE(dynamic_cast<const Interleaved8*>(il.layers[0].wq.packed.get()), nullptr);
    // the same bytes a step, but q4_k's and q5_k's 12 bytes of scales and minimums a super-block
    // and row, which become 16, and iq4_xs's 6 bytes of scales, which become 8
    std::int64_t scale_bytes = 0;
    if (t == gguf::Type::Q4_K || t == gguf::Type::Q5_K || t == gguf::Type::IQ4_XS) {
      const std::int64_t bb = gguf::row_bytes(t, 256), more = t == gguf::Type::IQ4_XS ? 2 : 4;
      for (const models::LlamaLayer& l : m.layers)
        for (const Linear* w : l.linears()) scale_bytes += w->bytes() / bb * more;
      scale_bytes += m.lm_head.bytes() / bb * more;
    }
    EXPECT_EQ(il.step_weight_bytes(), m.step_weight_bytes() + scale_bytes);
    // Generating from the prompt (prefill: unpacked groups; then a token a step: the eight-row
    // kernel), every interleaved product on the model's own activations is the float64 product of
    // x rounded through q8_0 blocks with the decoded weights, within the bound the row-order
    // products meet (blocked_product's, as expect_products_within_the_bound). The logits themselves are not compared:
    // rounding x through q8_0 blocks is a step function, so a float32 difference in one product can
    // move a later layer's x by a whole step.
    EXPECT_EQ(generate_checking_products(il, 16), 16 * count);  // the prompt's step and 15 more
    EXPECT_NE(dynamic_cast<const Interleaved8*>(il.layers[0].wq.packed->to_device(Device::CPU).get()), nullptr);
  }
}

// tiny-mha quantised to the lecture's formats and laid out for the fast kernel (as the chapter's
// tables run it): every matrix is interleaved, the step reads the format's bytes, and generating
// from a prompt (prefill: decoded rows; then a token a step: the eight-row kernel) every product
// on the model's own activations is the float64 product of x rounded through q8_0 blocks with the
// format's weights, within blocked_product's bound (LLM.int8(), whose x is quantised by row, is
// held to its reference by LlmInt8.TheInterleavedProductIsTheReferenceWithinItsFloatSteps).
TEST(Quant, AQuantisedZooModelRunsOnTheFastKernel) {
  if (!quant::interleaved_kernels()) GTEST_SKIP() << "this build has no AVX2, so no interleaved kernels";
  const models::Llama m = models::load_llama(kData + "/models/tiny-mha");
  for (const QuantSpec& spec :
       {QuantSpec{Format::Int8Row}, QuantSpec{Format::Int4Asym, 32}, QuantSpec{Format::Int4Sym, 64}}) {
    SCOPED_TRACE(spec.name());
    const models::Llama q = quantize_model(m, spec);
    models::Llama il = q;
    int count = 0;
    interleave_blocks(il, &count);
    EXPECT_EQ(count, 7 * m.config.num_layers + 1);
    EXPECT_EQ(il.step_weight_bytes(), q.step_weight_bytes());
    EXPECT_EQ(generate_checking_products(il, 8), 8 * count);
  }
}

// Files whose matrices are Q4_1, Q5_0, Q5_1, Q5_K, Q2_K, Q3_K, IQ4_NL or IQ4_XS (Q5_K_M, Q3_K_M,
// Q2_K, IQ4_NL and IQ4_XS files, and the Q5_0 that llama.cpp puts where a row is not whole
// super-blocks) load with every matrix packed in that type and run as the same model decoded to
// f32 does.
TEST(Gguf, FilesOfTheOtherBlockTypesRunPacked) {
  const TransformerConfig c = super_block_config();
  for (const auto& [t, format] : std::vector<std::pair<gguf::Type, std::string>>{{gguf::Type::Q4_1, "q4_1"},
                                                                                 {gguf::Type::Q5_0, "q5_0"},
                                                                                 {gguf::Type::Q5_1, "q5_1"},
                                                                                 {gguf::Type::Q5_K, "q5_k"},
                                                                                 {gguf::Type::Q2_K, "q2_k"},
                                                                                 {gguf::Type::Q3_K, "q3_k"},
                                                                                 {gguf::Type::IQ4_NL, "iq4_nl"},
                                                                                 {gguf::Type::IQ4_XS, "iq4_xs"}}) {
    SCOPED_TRACE(format);
    test::TempDir dir;
    const std::string path = repacked_gguf(dir, c, [t = t](const std::string&) { return t; });
    const models::Llama m = load_gguf(path);
    for (const models::LlamaLayer& l : m.layers)
      for (const Linear* w : l.linears()) ASSERT_TRUE(w->packed && w->packed->format() == format);
    const gguf::File g(path);
    EXPECT_EQ(dequantize(qmatrix(m.layers[1].w_down, "w_down")).to_float_vector(),
              gguf::dequantize_rows(t, g.raw("blk.1.ffn_down.weight"), c.intermediate_size).to_float_vector());
    expect_runs_as_decoded(m);
  }
}

TEST(Gguf, RunUsesTheTokenizerItIsGivenElseTheFilesOwn) {
  test::TempDir dir;
  const std::string path = tiny_gguf(dir), tiny = kData + "/models/tiny-mha";
  std::filesystem::copy_file(tiny + "/tokenizer.json", dir.file("custom.json"));
  const gguf::File f(path);
  // --tokenizer names a file: that file, not a tokenizer.json beside it (there is none here).
  EXPECT_EQ(gguf_tokenizer(f, dir.file("custom.json"), tiny)->path(), dir.file("custom.json"));
  test::expect_error([&] { gguf_tokenizer(f, dir.file("none.json"), tiny); }, {"none.json"});
  // Without --tokenizer, the file's own (tokenizer.ggml.*), which tokenizes as the model's
  // tokenizer.json does; its padding to 1024 rows is not part of it.
  const auto own = gguf_tokenizer(f, "", tiny);
  EXPECT_NE(own->path().find("tokenizer.ggml"), std::string::npos) << own->path();
  EXPECT_EQ(own->vocab_size(), 988);
  const auto ref = HfTokenizer::load(tiny);
  for (const std::string s : {"Once upon a time, Lily saw 3 cats.", "  spaced\n\nout  ", "<|endoftext|>Tom ran."})
    EXPECT_EQ(own->encode(s), ref.encode(s)) << s;
  // A vocabulary cut short no longer holds its merges: an error naming the file.
  auto tokens = f.get("tokenizer.ggml.tokens");
  tokens.items.resize(900);
  auto types = f.get("tokenizer.ggml.token_type");
  types.items.resize(900);
  with_metadata(path, dir.file("small.gguf"), "tokenizer.ggml.tokens", tokens);
  const gguf::File small(with_metadata(dir.file("small.gguf"), dir.file("small.gguf"), "tokenizer.ggml.token_type", types));
  test::expect_error([&] { gguf_tokenizer(small, "", tiny); }, {"small.gguf (tokenizer.ggml.*)", "merge"});
  // A llama2.c tokenizer has no count of its own: it must match the model's vocabulary exactly.
  std::string bin(4, '\0');
  bin[0] = 8;
  for (const char* piece : {"<unk>", "<s>", "</s>", " ", "a"}) {
    const float score = 0;
    const std::int32_t len = static_cast<std::int32_t>(std::strlen(piece));
    bin.append(reinterpret_cast<const char*>(&score), 4).append(reinterpret_cast<const char*>(&len), 4).append(piece);
  }
  test::write_file(dir.file("tok.bin"), bin);
  test::expect_error([&] { gguf_tokenizer(f, dir.file("tok.bin"), tiny); }, {"tok.bin", "5 tokens", "1024"});
}

// The chapter's executable, built beside this test: exit status and stderr of one command line.
struct Ch09Run {
  int status;
  std::string err;
};
std::filesystem::path ch09_exe() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / "ch09_quantization";
}
Ch09Run run_ch09(const test::TempDir& dir, const std::string& args) {
  const std::string cmd = ch09_exe().string() + " " + args + " >" + dir.file("out.txt") + " 2>" + dir.file("err.txt");
  const int rc = std::system(cmd.c_str());
  std::ifstream in(dir.file("err.txt"));
  std::stringstream err;
  err << in.rdbuf();
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, err.str()};
}

TEST(Ch09Cli, OptionsAreCheckedAndDeviceOnlyWhereItIsUsed) {
  if (!std::filesystem::exists(ch09_exe())) GTEST_SKIP() << ch09_exe() << " is not built";
  test::TempDir dir;
  for (const auto& [args, status, words] : std::vector<std::tuple<std::string, int, std::string>>{
           {"table --windows -1", 2, "--windows: -1 is outside [0, "},
           {"table --probes-per-kind -5", 2, "--probes-per-kind: -5 is outside [0, "},
           // Options live on the commands that use them: anywhere else they are not accepted.
           {"table --device cuda", 2, "not expected: cuda --device"},
           {"export " + dir.file("x.gguf") + " --device cuda", 2, "not expected: cuda --device"},
           {"--device cuda", 2, "not expected: cuda --device"},
           {"--model x speed", 2, "speed excludes --model"},
           {"--kernel fastest", 2, "--kernel: fastest not in {fast,reference}"},
           {"table --kernel simple", 2, "--kernel: simple not in {fast,reference}"},
       }) {
    SCOPED_TRACE(args);
    const Ch09Run r = run_ch09(dir, args);
    EXPECT_EQ(r.status, status) << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_ch09(dir, "table --help").status, 0);
  std::ifstream help(dir.file("out.txt"));
  std::stringstream h;
  h << help.rdbuf();
  EXPECT_NE(h.str().find("(0: all of them)"), std::string::npos) << h.str();
  EXPECT_NE(h.str().find("(0: skip the probes)"), std::string::npos) << h.str();
  EXPECT_EQ(h.str().find("--device"), std::string::npos) << h.str();
  // export onto a file of the model it reads is refused (it used to replace the model).
  std::filesystem::copy(kData + "/models/tiny-mha", dir.file("m"));
  const std::string config = dir.file("m") + "/config.json", text = test::read_file(config);
  const Ch09Run e = run_ch09(dir, "export --model " + dir.file("m") + " " + config);
  EXPECT_EQ(e.status, 1) << e.err;
  EXPECT_NE(e.err.find(config + " is a file of " + dir.file("m")), std::string::npos) << e.err;
  EXPECT_EQ(test::read_file(config), text);
  // run --tokenizer DIR/custom.json reads that file (it used to look for DIR/tokenizer.json).
  const std::string path = tiny_gguf(dir);
  std::filesystem::copy_file(kData + "/models/tiny-mha/tokenizer.json", dir.file("custom.json"));
  const Ch09Run r = run_ch09(dir, "run " + path + " --tokenizer " + dir.file("custom.json") + " --max-new-tokens 2");
  EXPECT_EQ(r.status, 0) << r.err;
}

// --kernel picks the products a table runs: the fast kernel interleaves the matrices, the reference
// kernel keeps them in row order; both score the model, and the JSON says which ran.
TEST(Ch09Cli, TheTableRunsOnEitherKernel) {
  if (!std::filesystem::exists(ch09_exe())) GTEST_SKIP() << ch09_exe() << " is not built";
  test::TempDir dir;
  for (const std::string kernel : {"fast", "reference"}) {
    SCOPED_TRACE(kernel);
    const Ch09Run r = run_ch09(dir,
                               "table --formats int8_row,int4_g32_asym --no-awq --windows 1 --probes-per-kind 0 "
                               "--kernel " +
                                   kernel + " --json " + dir.file(kernel + ".json"));
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(test::read_file(dir.file(kernel + ".json")));
    EXPECT_EQ(j.at("kernel"), kernel);
    ASSERT_EQ(j.at("rows").size(), 3u);  // f32 and the two formats
    for (const auto& row : j.at("rows")) EXPECT_TRUE(std::isfinite(row.at("val_ppl").get<double>())) << row.dump();
  }
}

TEST(Awq, NeverLosesToRoundToNearestAndKeepsTheFunction) {
  const models::Llama m = models::load_llama(kData + "/models/tiny-mha");
  const auto tok = HfTokenizer::load(kData + "/models/tiny-mha");
  auto calib = eval::tokenize_documents(tok, kData + "/corpus/train-sample.txt");
  calib.resize(512);
  const QuantSpec spec{Format::Int4Asym, 32};
  std::vector<AwqGroup> report;
  const models::Llama scaled = awq_scale(m, calib, spec, &report, 5);
  ASSERT_EQ(report.size(), 4u * 4);
  // α = 0 is round-to-nearest and is on the grid, so the search cannot end above it by
  // construction (asserting that here would restate the search); what can fail is finding nothing.
  int improved = 0;
  for (const auto& g : report) improved += g.loss_awq < g.loss_rtn;
  EXPECT_GT(improved, 0) << "AWQ found no better scales anywhere";
  // Scaling x down and W up is exact in real arithmetic: the float model is unchanged but for
  // rounding (one extra multiply and divide per weight and activation).
  const std::vector<std::int32_t> toks(calib.begin(), calib.begin() + 64);
  const auto a = ch01::forward(m, toks, true).to_float_vector(), b = ch01::forward(scaled, toks, true).to_float_vector();
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-3 * (1 + std::fabs(a[i]))) << i;
}

// What version 2's layout tests run over: a matrix of each format the layout takes (every group
// size of the int4 formats), quantised from random weights, then q4_k from a GGUF file's golden
// blocks (every bit pattern of quants, scales and mins).
std::vector<QMatrix> qgemv_matrices(std::mt19937_64& rng, std::int64_t rows, std::int64_t cols) {
  std::vector<QMatrix> matrices;
  for (const QuantSpec& spec : std::vector<QuantSpec>{{Format::Int8Row},
                                                      {Format::Q8_0},
                                                      {Format::Q4_0},
                                                      {Format::Int4Sym, 32},
                                                      {Format::Int4Sym, 64},
                                                      {Format::Int4Sym, 128},
                                                      {Format::Int4Asym, 32},
                                                      {Format::Int4Asym, 64},
                                                      {Format::Int4Asym, 128}})
    matrices.push_back(quantize(weights(rng, rows, cols), spec));
  const SafetensorsFile f(kData + "/golden/quant/gguf_types.safetensors");
  const Tensor q4k = f.get("Q4_K.f32");
  matrices.emplace_back(QuantSpec{Format::Q4_K}, q4k.size(0), q4k.size(1), f.get("Q4_K.bytes").clone());
  return matrices;
}

// A matrix in version 2's layout, made on the CPU by repack() (one spare element in d and sub, so
// that their data() is a pointer where the format keeps none).
struct Repacked {
  std::vector<std::uint8_t> quants;
  std::vector<std::uint16_t> d;
  std::vector<std::uint8_t> sub;
  explicit Repacked(const QMatrix& q) {
    const quant::qgemv::Kind kind = qgemv_kind(q.spec.format).value();
    const std::int64_t N = q.rows, K = q.cols;
    quants.resize(static_cast<std::size_t>(N * quant::qgemv::row_bytes(kind, K)));
    d.resize(static_cast<std::size_t>(N * quant::qgemv::half_scales(kind, K)) + 1);
    sub.resize(static_cast<std::size_t>(N * quant::qgemv::sub_scale_bytes(kind, K)) + 1);
    quant::qgemv::repack(kind, q.spec.group, static_cast<const std::uint8_t*>(q.data.raw_data()), N, K, quants.data(),
                         d.data(), sub.data());
  }
};

// Version 2's layout (common/quant/gemv_q.h), on the CPU: the repacked quants with their scales
// give every weight the value the format gives it, and where repacked() says the data already is
// the layout (int8_row, int4 groups of 32), repack() copies it unchanged.
TEST(QgemvLayout, RepackedQuantsHoldEveryWeightsValue) {
  using quant::qgemv::Kind;
  auto rng = test::rng_for_test();
  const std::vector<QMatrix> matrices = qgemv_matrices(rng, 5, 256);
  for (const QMatrix& q : matrices) {
    const QuantSpec& spec = q.spec;
    SCOPED_TRACE(spec.name());
    const std::int64_t N = q.rows, K = q.cols, nb = K / 32, G = spec.group;
    const Kind kind = qgemv_kind(spec.format).value();
    const Repacked r(q);
    const auto &quants = r.quants, &sub = r.sub;
    const auto& d = r.d;
    if (!quant::qgemv::repacked(kind, spec.group)) {
      EXPECT_EQ(0, std::memcmp(quants.data(), q.data.raw_data(), quants.size()));
    }
    const Tensor want = dequantize(q);
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) {
        const std::int64_t blk = n * nb + k / 32;
        const int nibble = quant::qgemv::four_bit(kind) ? quant::qgemv::run_nibble(&quants[blk * 16], k % 32) : 0;
        float v = 0;
        switch (kind) {
          case Kind::Int8Row:
            v = static_cast<float>(static_cast<std::int8_t>(quants[n * K + k])) * q.scales.data<float>()[n];
            break;
          case Kind::Q8_0: v = static_cast<float>(static_cast<std::int8_t>(quants[n * K + k])) * f16_to_f32(d[blk]); break;
          case Kind::Q4_0: v = static_cast<float>(nibble - 8) * f16_to_f32(d[blk]); break;
          case Kind::Int4Sym:
          case Kind::Int4Asym: {
            const std::int64_t g = n * (K / G) + k / G;
            const int z = kind == Kind::Int4Sym ? 8 : q.zeros.data<std::uint8_t>()[g];
            v = static_cast<float>(nibble - z) * q.scales.data<float>()[g];
            break;
          }
          case Kind::Q4_K: {  // (d · sc) · q − dmin · m, as gguf::dequantize_block forms it
            const std::int64_t o = 2 * (n * (K / 256) + k / 256);
            const float scale = f16_to_f32(d[o]) * static_cast<float>(sub[2 * blk]);
            const float minimum = f16_to_f32(d[o + 1]) * static_cast<float>(sub[2 * blk + 1]);
            v = scale * static_cast<float>(nibble) - minimum;
            break;
          }
          default: FAIL() << "not a format of version 2";
        }
        ASSERT_EQ(v, want.at<float>({n, k})) << "n " << n << ", k " << k;
      }
  }
}

// Version 2's whole product on the CPU: every row walked load by load through the kernel's own
// functions (block_scale, unit_fma: the scale, offset and minimum of each block, the dp4a sums),
// on the repacked layout and x's blocks as the GPU's quantiser makes them, equals the float64
// product of x̂ and the decoded weights within the dot product's bound.
TEST(QgemvLayout, RowsWalkedAsTheKernelDoesGiveTheProduct) {
  using quant::qgemv::Kind;
  auto rng = test::rng_for_test();
  const std::vector<QMatrix> matrices = qgemv_matrices(rng, 7, 512);
  for (const QMatrix& q : matrices) {
    SCOPED_TRACE(q.spec.name());
    const std::int64_t N = q.rows, K = q.cols, nb = K / 32;
    const Kind kind = qgemv_kind(q.spec.format).value();
    const Repacked r(q);
    const std::uint8_t* layout =
        quant::qgemv::repacked(kind, q.spec.group) ? r.quants.data() : static_cast<const std::uint8_t*>(q.data.raw_data());
    const quant::qgemv::Weights w{layout,
                                  r.d.data(),
                                  r.sub.data(),
                                  q.scales.defined() ? q.scales.data<float>() : nullptr,
                                  q.zeros.defined() ? q.zeros.data<std::uint8_t>() : nullptr,
                                  static_cast<int>(K),
                                  q.spec.group};
    const Tensor x = test::uniform(rng, {1, K});
    const BlockedActivations a = blocked_activations_fast(x);
    const auto [exact, bound] = blocked_product(x, q, 4);
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0;
      for (std::int64_t i = 0; i < K / quant::qgemv::unit_values(kind); ++i) {
        const std::int64_t b = quant::qgemv::block_of(kind, i);
        unsigned wv[4];
        int xv[8] = {};
        std::memcpy(wv, layout + n * quant::qgemv::row_bytes(kind, K) + 16 * i, 16);
        std::memcpy(xv, a.q.data() + (quant::qgemv::four_bit(kind) ? 32 * i : 16 * i),
                    quant::qgemv::four_bit(kind) ? 32 : 16);
        acc = quant::qgemv::unit_fma(kind, wv, xv, quant::qgemv::block_scale(kind, w, n, b), a.d[b], a.sum[b], acc);
      }
      if (kind == Kind::Int8Row) acc *= q.scales.data<float>()[n];
      EXPECT_NEAR(acc, exact[n], bound[n]) << "row " << n << " of " << nb << " blocks";
    }
  }
}

// The kernels' integer arithmetic (dp4a on the CPU): a 16-byte load of int8 quants or of a run of
// nibbles times x's int8 values equals the plain sum of products.
TEST(QgemvLayout, UnitDotsEqualPlainSums) {
  auto rng = test::rng_for_test();
  std::uniform_int_distribution<unsigned> word(0, 0xFFFFFFFFu);
  for (int trial = 0; trial < 200; ++trial) {
    unsigned w[4];
    int x[8];
    for (unsigned& v : w) v = word(rng);
    for (int& v : x) v = static_cast<int>(word(rng));
    // Extremes: every byte -128 or 127 at times.
    if (trial == 0) std::fill(std::begin(x), std::end(x), static_cast<int>(0x80808080u)), std::fill(w, w + 4, 0x80808080u);
    if (trial == 1) std::fill(std::begin(x), std::end(x), 0x7F7F7F7F), std::fill(w, w + 4, 0xFFFFFFFFu);
    std::uint8_t wb[16];
    std::int8_t xb[32];
    std::memcpy(wb, w, 16), std::memcpy(xb, x, 32);
    int want8 = 0, want4 = 0;
    for (int i = 0; i < 16; ++i) want8 += static_cast<std::int8_t>(wb[i]) * xb[i];
    for (int i = 0; i < 32; ++i) want4 += quant::qgemv::run_nibble(wb, i) * xb[i];
    const int x4[4] = {x[0], x[1], x[2], x[3]};
    EXPECT_EQ(quant::qgemv::dot_int8_unit(w, x4), want8) << trial;
    EXPECT_EQ(quant::qgemv::dot_nibble_unit(w, x), want4) << trial;
  }
}

TEST(CudaQuant, ProductsMatchTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  // Every version on odd and short N (fewer rows than a block's warps compute), several K, and M
  // = 1 (decode's launch), 3 and 11 (past one launch's 8 rows of x). The large activations are
  // LLM.int8()'s outliers (threshold 6): its mixed-precision half runs too.
  struct Shape {
    std::int64_t M, N, K;
  };
  std::vector<QuantSpec> specs = all_specs();
  specs.push_back({Format::Int4Sym, 64});
  for (const int version : {1, 2}) {
    for (const Shape& sh : {Shape{1, 301, 1024}, Shape{3, 300, 256}, Shape{11, 7, 4096}, Shape{1, 2051, 512}})
      for (const QuantSpec& spec : specs) {
        const std::int64_t M = sh.M, N = sh.N, K = sh.K;
        SCOPED_TRACE(spec.name() + " version " + std::to_string(version) + " M=" + std::to_string(M) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K));
        const Tensor w = weights(rng, N, K);
        Tensor x = test::uniform(rng, {M, K});
        x.at<float>({std::min<std::int64_t>(1, M - 1), 5}) = 8.0f, x.at<float>({0, K / 2 + 3}) = -7.0f,
                                                       x.at<float>({M - 1, K / 2 + 3}) = 9.5f;
        const QMatrix q = quantize(w, spec);
        // Version 2 multiplies x's int8 blocks for int8_row and int4 too: the CPU product of those
        // blocks' values is the function it computes.
        const bool blocks = blocks_activations(spec.format) || (version == 2 && has_qgemv_v2(spec));
        const Tensor xin = blocks ? q8_0_activations(x) : x;
        const auto cpu = qmatmul(xin, q).to_double_vector();
        const auto gpu = qmatmul(x.to(Device::CUDA), q.to(Device::CUDA, version)).to_double_vector();
        const auto D = dequantize(q).to_double_vector();
        const auto X = xin.to_double_vector();
        std::vector<double> b(cpu.size());
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < N; ++n) {
            double a = 0;
            for (std::int64_t k = 0; k < K; ++k) a += std::fabs(X[m * K + k] * D[n * K + k]);
            // Both sides within γ_K of the same value (the integer formats' int32 sums are exact;
            // their float scaling and block sums reorder).
            b[m * N + n] = 2 * (gamma(K) + 2 * u) * a;
          }
        expect_within(gpu, cpu, b, "cuda vs cpu");
      }
  }
  // The block types read from GGUF files (the golden blocks: every bit pattern of quants and scales).
  // Both versions (version 2 has q4_k; the others run version 1 under it).
  const SafetensorsFile f(kData + "/golden/quant/gguf_types.safetensors");
  for (const int version : {1, 2})
    for (const Format fmt : {Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q2_K, Format::Q3_K, Format::Q4_K,
                             Format::Q5_K, Format::Q6_K, Format::IQ4_NL, Format::IQ4_XS}) {
      const std::string name = gguf::type_name(gguf_type(fmt));
      SCOPED_TRACE(name + " version " + std::to_string(version));
      const Tensor want = f.get(name + ".f32");
      const QMatrix q({fmt}, want.size(0), want.size(1), f.get(name + ".bytes").clone());
      const std::int64_t N = q.rows, K = q.cols, M = 5;
      const Tensor x = test::uniform(rng, {M, K});
      const auto cpu = qmatmul(x, q).to_double_vector();
      const auto gpu = qmatmul(x.to(Device::CUDA), q.to(Device::CUDA, version)).to_double_vector();
      const auto D = want.to_double_vector(), Dm = minimum_terms(q), X = q8_0_activations(x).to_double_vector();
      std::vector<double> b(cpu.size());
      for (std::int64_t m = 0; m < M; ++m)
        for (std::int64_t n = 0; n < N; ++n) {
          double a = 0;
          for (std::int64_t k = 0; k < K; ++k)
            a += std::fabs(X[m * K + k]) * (std::fabs(D[n * K + k]) + 2 * std::fabs(Dm[n * K + k]));
          b[m * N + n] = 2 * (gamma(K) + 4 * u) * a;  // each side's bound (expect_products_within_the_bound)
        }
      expect_within(gpu, cpu, b, "cuda vs cpu");
    }
  // Integer accumulation is exact: llm_int8 without outliers and single-block q8_0 agree bit for bit.
  QuantSpec inf{Format::LlmInt8};
  inf.threshold = std::numeric_limits<float>::infinity();
  const Tensor w = weights(rng, 64, 512), x = test::uniform(rng, {4, 512});
  const QMatrix q = quantize(w, inf);
  EXPECT_EQ(qmatmul(x.to(Device::CUDA), q.to(Device::CUDA)).to_float_vector(), qmatmul(x, q).to_float_vector());
  // Version 1 scales each block's whole int32 sum once, as the CPU does; version 2 scales its two
  // halves (a 16-byte load each), so only its integer parts are exact.
  const Tensor w32 = weights(rng, 64, 32), x32 = test::uniform(rng, {2, 32});
  const QMatrix q32 = quantize(w32, {Format::Q8_0});
  EXPECT_EQ(qmatmul(x32.to(Device::CUDA), q32.to(Device::CUDA, 1)).to_float_vector(), qmatmul(x32, q32).to_float_vector());
}

// q8_0 over one block against identity rows: y_n = 127·q_n·d_w·d_x with q_n the n-th int8 of x's
// block, exact on both sides, so the GPU's x block (its scale and its values) must equal the CPU's
// bit for bit. A failure prints the block each side implies.
TEST(CudaQuant, Q8_0BlockOfXEqualsTheCpusBitForBit) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  Tensor eye = Tensor::zeros({32, 32}, DType::F32);
  for (std::int64_t n = 0; n < 32; ++n) eye.at<float>({n, n}) = 1.0f;
  const QMatrix q = quantize(eye, {Format::Q8_0});
  // Both versions quantise x on the GPU (version 2 in its own kernel); one of a block's halves
  // holds the product of an identity row, the other sums to 0, so version 2 is exact too.
  for (const int version : {1, 2})
    for (const float amax : {1.0f, 0.99f, 9.5f, 1e-3f, 127.0f / 128.0f}) {
      Tensor x = test::uniform(rng, {2, 32}, -amax, amax);
      x.at<float>({0, 7}) = amax, x.at<float>({1, 30}) = -amax;
      const auto cpu = qmatmul(x, q).to_float_vector();
      const auto gpu = qmatmul(x.to(Device::CUDA), q.to(Device::CUDA, version)).to_float_vector();
      std::uint8_t block[34];
      quantize_q8_0_block(x.data<float>(), block);
      const float unit = 127.0f * from_half(q.data.data<std::uint8_t>());  // 127·d_w: y_n = unit·q_n·d_x
      std::ostringstream why;
      why << "version " << version << ", amax " << amax << ": the CPU's block of row 0 has d_x " << from_half(block)
          << "; n, x, CPU's q, y_cpu / (127·d_w), y_gpu / (127·d_w):";
      for (int n = 0; n < 32; ++n)
        why << "\n  " << n << " " << x.at<float>({0, n}) << " " << int(static_cast<std::int8_t>(block[2 + n])) << " "
            << cpu[static_cast<std::size_t>(n)] / unit << " " << gpu[static_cast<std::size_t>(n)] / unit;
      EXPECT_EQ(gpu, cpu) << why.str();
    }
}

}  // namespace
}  // namespace inferlab::ch09
