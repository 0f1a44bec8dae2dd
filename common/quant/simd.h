#pragma once
// x86 vector helpers shared by the row-order products (blocks.cpp, chapter 09's quant_rows.cpp)
// and the interleaved ones (interleaved.cpp). INFERLAB_QUANT_SIMD is set where the CPU has AVX2, FMA and F16C;
// without them these files take their plain paths.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <cstdint>
#define INFERLAB_QUANT_SIMD 1

namespace inferlab::quant::simd {

#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
inline constexpr bool kVnni = true;
#else
inline constexpr bool kVnni = false;
#endif

// acc + the products of unsigned bytes u and signed bytes s, summed four at a time into eight
// int32 lanes: one vpdpbusd where the CPU has VNNI (exact in int32), else vpmaddubsw (pairs into
// int16, saturating) then vpmaddwd by 1, exact while a pair stays below 2^15 (u ≤ 128 with
// |s| ≤ 127 does).
inline __m256i dot4_acc(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The sum of the lanes.
inline float hsum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float hsum(__m256 v) { return hsum(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))); }
inline std::int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

}  // namespace inferlab::quant::simd
#endif
