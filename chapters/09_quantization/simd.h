#pragma once
// Chapter 09's x86 vector helpers shared by the row-order products (quant_fast.cpp) and the
// interleaved ones (repack.cpp). INFERLAB_CH09_SIMD is set where the CPU has AVX2, FMA and F16C;
// without them both files take their plain paths.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define INFERLAB_CH09_SIMD 1

namespace inferlab::ch09::simd {

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

}  // namespace inferlab::ch09::simd
#endif
