// The CPU products of a QMatrix in row order (--kernel reference), threaded over output rows: the
// formats that keep x in f32, and LLM.int8(). The GGUF block formats, which take x as q8_0 blocks,
// run in common/quant/blocks.cpp; the fast kernel (interleaved_matrix.h's InterleavedMatrix) in
// common/quant/interleaved.cpp.
//
// Decoding (a few rows of x) is memory-bound only if turning the packed bytes into numbers costs
// less than reading them, so with AVX2 each weight row is multiplied straight from its bytes, a
// format's scale applied once per row or group rather than per weight:
//   int8 rows       y = s · Σ x_k q_k   (any build: the core's dot_rows widens the bytes in registers,
//                                        once for every eight rows of x)
//   int4 groups     y = Σ_g s_g · Σ_{k ∈ g} x_k (q_k − z_g)
//   fp8 e4m3        y = s · Σ x_k e4m3(q_k)   (a byte becomes an f16 with two shifts, see fp8_32)
//   llm_int8        int8 · int8 sums in int32, exactly as the reference loop
// Prefill (many rows of x) unpacks each weight row once into f32 and reuses it for every row of x.
// Without AVX2 both cases take the unpacking path.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/ops_cpu.h"
#include "common/quant/interleaved.h"
#include "common/quant/qmatrix_impl.h"
#include "common/quant/simd.h"

namespace inferlab::quant {

namespace {

// The fp8 table: decoding a byte is a lookup in the unpacking path.
const std::vector<float>& fp8_table() {
  static const std::vector<float> t = [] {
    std::vector<float> v(256);
    for (int b = 0; b < 256; ++b) v[static_cast<std::size_t>(b)] = e4m3_to_f32(static_cast<std::uint8_t>(b));
    return v;
  }();
  return t;
}

// Unpacks row n into f32 (the same values as weight_value()); the int8 formats and llm_int8 never
// unpack.
void unpack_row(const QMatrix& q, std::int64_t n, float* __restrict__ out) {
  const std::int64_t n_in = q.cols;
  switch (q.spec.format) {
    case Format::Int4Sym:
    case Format::Int4Asym: {
      const std::int64_t G = q.spec.group, H = G / 2;
      const std::uint8_t* __restrict__ r = q.data.data<std::uint8_t>() + n * (n_in / 2);
      for (std::int64_t g = 0; g < n_in / G; ++g) {
        const float s = q.scales.data<float>()[n * (n_in / G) + g];
        const int z = q.spec.format == Format::Int4Sym ? 8 : q.zeros.data<std::uint8_t>()[n * (n_in / G) + g];
        for (std::int64_t j = 0; j < H; ++j) {
          out[g * G + j] = static_cast<float>((r[g * H + j] & 15) - z) * s;
          out[g * G + H + j] = static_cast<float>((r[g * H + j] >> 4) - z) * s;
        }
      }
      return;
    }
    case Format::Fp8E4M3: {
      const float* t = fp8_table().data();
      const std::uint8_t* __restrict__ r = q.data.data<std::uint8_t>() + n * n_in;
      const float s = q.scales.data<float>()[0];
      for (std::int64_t k = 0; k < n_in; ++k) out[k] = t[r[k]] * s;
      return;
    }
    default: break;
  }
  fail("unpack_row: ", q.spec.name(), " is not a weight-only format");
}

#if INFERLAB_QUANT_SIMD
using quant::simd::hsum;

// Four independent sums: one chain of fused multiply-adds waits about five cycles per step, so a
// single accumulator would cap these loops at a third of what the core can issue.
struct Acc4 {
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 sum() const { return _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])); }
};

// 16 packed bytes hold 32 four-bit values: the low nibbles go with x_lo[0..15], the high ones
// with x_hi[0..15] (int4's layout, which is q4_0's). Adds Σ (q − z)·x to the accumulators of each
// of M rows of x (row i at x_lo + i·stride, x_hi + i·stride): the bytes are widened once for all
// of them, which is what makes a pass over a few tokens cost about one over a single token. Each
// 32-bit lane gets one whole byte, so one widening serves both of its nibbles; q − z is a small
// integer, exact in float. Every row's sums are the ones it would get alone.
template <int M>
void nibbles16(const std::uint8_t* p, __m256i z, const float* x_lo, const float* x_hi, std::int64_t stride, Acc4* acc) {
  const __m256i m = _mm256_set1_epi32(15);
  for (int h = 0; h < 2; ++h) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, m), z));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v, 4), z));
    for (int i = 0; i < M; ++i) {
      acc[i].a[2 * h] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x_lo + i * stride + 8 * h), acc[i].a[2 * h]);
      acc[i].a[2 * h + 1] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x_hi + i * stride + 8 * h), acc[i].a[2 * h + 1]);
    }
  }
}

// Row n of an int4 matrix times M rows of X [M, n_in]: y_i = Σ_g s_g · Σ_{k ∈ g} x_ik (q_k − z_g),
// written to Y[i · y_stride].
template <int M>
void int4_dots(const QMatrix& q, std::int64_t n, const float* X, float* Y, std::int64_t y_stride) {
  const std::int64_t n_in = q.cols, G = q.spec.group, H = G / 2, ng = n_in / G;
  const std::uint8_t* r = q.data.data<std::uint8_t>() + n * (n_in / 2);
  const float* s = q.scales.data<float>() + n * ng;
  const std::uint8_t* zs = q.spec.format == Format::Int4Asym ? q.zeros.data<std::uint8_t>() + n * ng : nullptr;
  __m256 y[M];
  for (int i = 0; i < M; ++i) y[i] = _mm256_setzero_ps();
  for (std::int64_t g = 0; g < ng; ++g) {
    const __m256i z = _mm256_set1_epi32(zs ? zs[g] : 8);
    Acc4 acc[M];
    for (std::int64_t j = 0; j < H; j += 16) nibbles16<M>(r + g * H + j, z, X + g * G + j, X + g * G + H + j, n_in, acc);
    for (int i = 0; i < M; ++i) y[i] = _mm256_fmadd_ps(acc[i].sum(), _mm256_set1_ps(s[g]), y[i]);
  }
  for (int i = 0; i < M; ++i) Y[i * y_stride] = hsum(y[i]);
}

// Row n of an int4 matrix times all M rows of X, four at a time (the row stays in L1 between them).
void int4_rows(const QMatrix& q, std::int64_t n, const float* X, std::int64_t M, float* Y, std::int64_t y_stride) {
  for (std::int64_t m = 0; m < M; m += 4) {
    const float* x = X + m * q.cols;
    float* y = Y + m * y_stride;
    switch (std::min<std::int64_t>(4, M - m)) {
      case 1: int4_dots<1>(q, n, x, y, y_stride); break;
      case 2: int4_dots<2>(q, n, x, y, y_stride); break;
      case 3: int4_dots<3>(q, n, x, y, y_stride); break;
      default: int4_dots<4>(q, n, x, y, y_stride); break;
    }
  }
}

// E4M3 (s eeee mmm, bias 7) laid out as s.0eeee.mmm0000000 is an f16 (bias 15) worth exactly
// value · 2^-8, subnormals included, and vcvtph2ps widens it exactly. A byte interleaved into the
// high half of a 16-bit lane is b << 8; one arithmetic shift right puts eeee.mmm in place and
// copies the sign into bit 14, which the mask clears. The NaN pattern would read as 480 · 2^-8,
// which is why quantize() refuses non-finite weights. Adds 32 products to the accumulators.
void fp8_32(const std::uint8_t* p, const float* x, Acc4& acc) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), zero = _mm256_setzero_si256();
  const __m256i keep = _mm256_set1_epi16(static_cast<short>(0xBFFF));
  const __m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, b), 1), keep);  // bytes 0-7, 16-23
  const __m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, b), 1), keep);  // bytes 8-15, 24-31
  acc.a[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(lo)), _mm256_loadu_ps(x), acc.a[0]);
  acc.a[1] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(hi)), _mm256_loadu_ps(x + 8), acc.a[1]);
  acc.a[2] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(lo, 1)), _mm256_loadu_ps(x + 16), acc.a[2]);
  acc.a[3] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(hi, 1)), _mm256_loadu_ps(x + 24), acc.a[3]);
}

// One output of a weight-only format: row n of W times one row x of length n_in.
float direct_dot(const QMatrix& q, std::int64_t n, const float* x) {
  const std::int64_t n_in = q.cols;
  switch (q.spec.format) {
    case Format::Int4Sym:
    case Format::Int4Asym: {
      float y;
      int4_dots<1>(q, n, x, &y, 1);
      return y;
    }
    case Format::Fp8E4M3: {
      const std::uint8_t* r = q.data.data<std::uint8_t>() + n * n_in;
      Acc4 acc;
      std::int64_t k = 0;
      for (; k + 32 <= n_in; k += 32) fp8_32(r + k, x + k, acc);
      float y = hsum(acc.sum());
      for (; k < n_in; ++k) y += x[k] * (e4m3_to_f32(r[k]) * 0x1p-8f);
      return y * (q.scales.data<float>()[0] * 256.0f);
    }
    default: break;
  }
  fail("direct_dot: ", q.spec.name(), " is not a weight-only format");
}
#endif

// The 16-bit part of LLM.int8(): Σ over the outlier columns of f16(x)·f16(w), w(n, k) = weight(n, k).
template <class W>
float outlier_part(const float* x, const std::vector<std::int64_t>& cols, W&& weight, std::int64_t n) {
  float hi = 0.0f;
  for (std::int64_t k : cols) hi += f16_to_f32(f32_to_f16(x[k])) * f16_to_f32(f32_to_f16(weight(n, k)));
  return hi;
}

std::vector<std::int64_t> outlier_list(const std::vector<char>& O) {
  std::vector<std::int64_t> cols;  // the outlier columns, few
  for (std::size_t k = 0; k < O.size(); ++k)
    if (O[k]) cols.push_back(static_cast<std::int64_t>(k));
  return cols;
}

void llm_int8(const Tensor& x, const QMatrix& w, Tensor& out) {
  const std::int64_t M = x.size(0), n_in = x.size(1), n_out = w.rows;
  const float* X = x.data<float>();
  float* Y = out.data<float>();
  const auto O = outlier_columns(x, w.spec.threshold);
  std::vector<std::int8_t> xq;
  std::vector<float> sx;
  quantize_rows_int8(x, O, xq, sx);  // outlier columns hold 0 here
  const std::vector<std::int64_t> cols = outlier_list(O);
  auto weight = [&w](std::int64_t n, std::int64_t k) {
    return static_cast<float>(w.data.data<std::int8_t>()[n * w.cols + k]) * w.scales.data<float>()[n];
  };
#pragma omp parallel for schedule(static) if (M * n_out * n_in >= kParallel)
  for (std::int64_t n = 0; n < n_out; ++n) {
    const std::int8_t* wr = w.data.data<std::int8_t>() + n * n_in;
    const float sw = w.scales.data<float>()[n];
    for (std::int64_t m = 0; m < M; ++m)
      Y[m * n_out + n] =
          static_cast<float>(quant::dot_i8(wr, xq.data() + m * n_in, n_in)) * sx[static_cast<std::size_t>(m)] * sw +
          outlier_part(X + m * n_in, cols, weight, n);
  }
}

// Prefill: each weight row unpacked once into f32 and multiplied with every row of X [M, n_in].
void unpacked(const float* X, std::int64_t M, const QMatrix& w, float* Y) {
  quant::decoded_matmul(
      X, M, w.rows, w.cols, [&w](std::int64_t n, float* row) { unpack_row(w, n, row); }, Y);
}

}  // namespace

void llm_int8_interleaved(const Tensor& x, const quant::Interleaved8& w, float threshold, Tensor& out) {
  const std::int64_t M = x.size(0), n_in = x.size(1), n_out = w.rows();
  const auto O = outlier_columns(x, threshold);
  std::vector<std::int8_t> xq;
  std::vector<float> sx;
  quantize_rows_int8(x, O, xq, sx);
  // x's int8 rows as blocks that all carry their row's scale: the kernel then sums s_x · Σ xq·wq.
  BlockedActivations a(M, n_in);
  a.q = std::move(xq);
  for (std::int64_t b = 0; b < M * n_in / 32; ++b) {
    a.d[static_cast<std::size_t>(b)] = sx[static_cast<std::size_t>(b / (n_in / 32))];
    a.sum_block(b);
  }
  float* Y = out.data<float>();
  w.matmul(a, Y);
  const std::vector<std::int64_t> cols = outlier_list(O);
  if (cols.empty()) return;
  const float* X = x.data<float>();
  auto weight = [&w](std::int64_t n, std::int64_t k) { return w.value(n, k); };
#pragma omp parallel for schedule(static) if (M * n_out * static_cast <std::int64_t>(cols.size()) * 32 >= kParallel)
  for (std::int64_t n = 0; n < n_out; ++n)
    for (std::int64_t m = 0; m < M; ++m) Y[m * n_out + n] += outlier_part(X + m * n_in, cols, weight, n);
}

void qmatmul_fast(const Tensor& x, const QMatrix& w, Tensor& out) {
  if (w.spec.format == Format::LlmInt8) return llm_int8(x, w, out);
  float* Y = out.data<float>();
  if (blocks_activations(w.spec.format))  // x into q8_0 blocks, once per product
    return quant::blocks_matmul(gguf_type(w.spec.format), w.data.data<std::uint8_t>(), w.rows, w.cols,
                                blocked_activations_fast(x), Y);
  const std::int64_t M = x.size(0);
  const float* X = x.data<float>();
  const std::int64_t n_in = x.size(1), n_out = w.rows;
  if (w.spec.format == Format::Int8Row || w.spec.format == Format::Int8Tensor) {
    // Each int8 row is read and widened in registers once for every eight rows of x (so a
    // verification pass over γ + 1 tokens costs about one over a single token), then each output
    // is scaled once. This is what unpacking would do, without the f32 copy.
    const bool per_row = w.spec.format == Format::Int8Row;
#pragma omp parallel for schedule(static) if (M * n_out * n_in >= kParallel)
    for (std::int64_t n = 0; n < n_out; ++n) {
      cpu::dot_rows(X, M, n_in, w.data.data<std::int8_t>() + n * n_in, Y + n, n_out);
      const float s = w.scales.data<float>()[per_row ? n : 0];
      for (std::int64_t m = 0; m < M; ++m) Y[m * n_out + n] *= s;
    }
    return;
  }
#if INFERLAB_QUANT_SIMD
  const bool int4 = w.spec.format == Format::Int4Sym || w.spec.format == Format::Int4Asym;
  if (M <= (int4 ? kInt4DirectRows : kDirectRows)) {
#pragma omp parallel for schedule(static) if (M * n_out * n_in >= kParallel)
    for (std::int64_t n = 0; n < n_out; ++n) {
      if (int4) {  // each weight row widened once for every four rows of x
        int4_rows(w, n, X, M, Y + n, n_out);
      } else {
        for (std::int64_t m = 0; m < M; ++m) Y[m * n_out + n] = direct_dot(w, n, X + m * n_in);
      }
    }
    return;
  }
#endif
  unpacked(X, M, w, Y);
}

}  // namespace inferlab::quant
