// The fast CPU products: threads over output rows; each packed row is unpacked once into f32
// (or kept in int8 for the integer formats) and used for every row of x.
#include <omp.h>

#include <algorithm>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <cstring>
#include <cmath>
#include <vector>

#include "chapters/09_quantization/quant_impl.h"
#include "common/ops_cpu.h"

namespace inferlab::ch09 {

namespace {

// 16 packed bytes -> 16 low nibbles and 16 high nibbles as floats, (v − z)·s. With AVX2 the
// bytes are widened with vpmovzxbd (GCC 12 does not vectorise this conversion on its own);
// elsewhere plain loops.
inline void nibbles16(const std::uint8_t* __restrict__ p, float z, float s, float* __restrict__ lo_out,
                      float* __restrict__ hi_out) {
#if defined(__AVX2__)
  const __m256 zz = _mm256_set1_ps(z), ss = _mm256_set1_ps(s);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
  for (int half = 0; half < 2; ++half) {
    const __m128i l = half ? _mm_srli_si128(lo, 8) : lo, h = half ? _mm_srli_si128(hi, 8) : hi;
    _mm256_storeu_ps(lo_out + 8 * half, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l)), zz), ss));
    _mm256_storeu_ps(hi_out + 8 * half, _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)), zz), ss));
  }
#else
  for (int j = 0; j < 16; ++j) lo_out[j] = (static_cast<float>(p[j] & 15) - z) * s;
  for (int j = 0; j < 16; ++j) hi_out[j] = (static_cast<float>(p[j] >> 4) - z) * s;
#endif
}

// With int4's split-halves layout no lane has to be shuffled: groups of 16 bytes at a time.
inline void nibbles(const std::uint8_t* __restrict__ p, std::int64_t n, float z, float s, float* __restrict__ lo_out,
                    float* __restrict__ hi_out) {
  for (std::int64_t j = 0; j < n; j += 16) nibbles16(p + j, z, s, lo_out + j, hi_out + j);
}

// Unpacks row n of a weight-only format into f32 (the same values as weight_value()).
void unpack_row(const QMatrix& q, std::int64_t n, float* out) {
  const std::int64_t K = q.cols;
  switch (q.spec.format) {
    case Format::Int8Tensor:
    case Format::Int8Row:
    case Format::LlmInt8: {
      const std::int8_t* __restrict__ r = q.data.data<std::int8_t>() + n * K;
      const float s = q.scales.data<float>()[q.spec.format == Format::Int8Tensor ? 0 : n];
      float* __restrict__ o = out;
      for (std::int64_t k = 0; k < K; ++k) o[k] = static_cast<float>(r[k]) * s;
      return;
    }
    case Format::Int4Sym:
    case Format::Int4Asym: {
      const std::int64_t G = q.spec.group;
      const std::uint8_t* r = q.data.data<std::uint8_t>() + n * (K / 2);
      for (std::int64_t g = 0; g < K / G; ++g) {
        const float s = q.scales.data<float>()[n * (K / G) + g];
        const float z = q.spec.format == Format::Int4Sym ? 8.0f : static_cast<float>(q.zeros.data<std::uint8_t>()[n * (K / G) + g]);
        nibbles(r + g * (G / 2), G / 2, z, s, out + g * G, out + g * G + G / 2);
      }
      return;
    }
    case Format::Q4_0: {
      const std::uint8_t* r = q.data.data<std::uint8_t>() + n * (K / 32 * 18);
      // The block scales first (a call each), then the nibbles in a loop free of calls.
      float d[256];
      for (std::int64_t b0 = 0; b0 < K / 32; b0 += 256) {
        const std::int64_t nb = std::min<std::int64_t>(256, K / 32 - b0);
        for (std::int64_t b = 0; b < nb; ++b) d[b] = from_half(r + (b0 + b) * 18);
        for (std::int64_t b = 0; b < nb; ++b)
          nibbles16(r + (b0 + b) * 18 + 2, 8.0f, d[b], out + (b0 + b) * 32, out + (b0 + b) * 32 + 16);
      }
      return;
    }
    case Format::Fp8E4M3: {
      // A 256-entry table: fp8 decoding is a lookup.
      static const std::vector<float> table = [] {
        std::vector<float> t(256);
        for (int b = 0; b < 256; ++b) t[static_cast<std::size_t>(b)] = e4m3_to_f32(static_cast<std::uint8_t>(b));
        return t;
      }();
      const std::uint8_t* r = q.data.data<std::uint8_t>() + n * K;
      const float s = q.scales.data<float>()[0];
      for (std::int64_t k = 0; k < K; ++k) out[k] = table[r[k]] * s;
      return;
    }
    case Format::Q8_0: break;
  }
  fail("unpack_row: not a weight-only format");
}

constexpr std::int64_t kParallel = 1 << 18;

}  // namespace

void qmatmul_fast(const Tensor& x, const QMatrix& w, Tensor& out) {
  const std::int64_t M = x.size(0), K = x.size(1), N = w.rows;
  const float* X = x.data<float>();
  float* Y = out.data<float>();
  if (w.spec.format == Format::LlmInt8) {
    const auto O = outlier_columns(x, w.spec.threshold);
    std::vector<std::int8_t> xq;
    std::vector<float> sx;
    quantize_rows_int8(x, O, xq, sx);
    std::vector<std::int64_t> cols;  // the outlier columns, few
    for (std::int64_t k = 0; k < K; ++k)
      if (O[static_cast<std::size_t>(k)]) cols.push_back(k);
#pragma omp parallel for schedule(static) if (M * N * K >= kParallel)
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int8_t* wr = w.data.data<std::int8_t>() + n * K;
      const float sw = w.scales.data<float>()[n];
      for (std::int64_t m = 0; m < M; ++m) {
        const std::int8_t* xr = xq.data() + m * K;  // outlier columns hold 0 here
        std::int32_t acc = 0;
        for (std::int64_t k = 0; k < K; ++k) acc += static_cast<std::int32_t>(xr[k]) * wr[k];
        float hi = 0.0f;
        for (std::int64_t k : cols)
          hi += f16_to_f32(f32_to_f16(X[m * K + k])) * f16_to_f32(f32_to_f16(static_cast<float>(wr[k]) * sw));
        Y[m * N + n] = static_cast<float>(acc) * sx[static_cast<std::size_t>(m)] * sw + hi;
      }
    }
    return;
  }
  if (w.spec.format == Format::Q8_0) {
    const std::int64_t nb = K / 32;
    std::vector<std::uint8_t> xq(static_cast<std::size_t>(M * nb * 34));
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t b = 0; b < nb; ++b) quantize_q8_0_block(X + m * K + b * 32, xq.data() + (m * nb + b) * 34);
#pragma omp parallel for schedule(static) if (M * N * K >= kParallel)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t m = 0; m < M; ++m) {
        float y = 0.0f;
        for (std::int64_t b = 0; b < nb; ++b) {
          const std::uint8_t* wb = w.data.data<std::uint8_t>() + (n * nb + b) * 34;
          const std::uint8_t* xb = xq.data() + (m * nb + b) * 34;
          std::int32_t sumi = 0;
          for (int i = 0; i < 32; ++i) sumi += static_cast<std::int8_t>(wb[2 + i]) * static_cast<std::int8_t>(xb[2 + i]);
          y += static_cast<float>(sumi) * (from_half(wb) * from_half(xb));
        }
        Y[m * N + n] = y;
      }
    return;
  }
#pragma omp parallel if (M * N * K >= kParallel)
  {
    std::vector<float> row(static_cast<std::size_t>(K));
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < N; ++n) {
      unpack_row(w, n, row.data());
      cpu::dot_rows(X, M, K, row.data(), Y + n, N);
    }
  }
}

}  // namespace inferlab::ch09
