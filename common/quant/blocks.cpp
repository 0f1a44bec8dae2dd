// The CPU products of llama.cpp's block types with x as q8_0 blocks (blocks.h), threaded over
// output rows.
//
// Decoding (a few rows of x) is memory-bound only if turning the packed bytes into numbers costs
// less than reading them, so with AVX2 each weight row is multiplied straight from its bytes. x is
// q8_0 blocks (x_k = dx_b · xq_k), so the products sum bytes times bytes in int32 per block of 32
// (vpmaddubsw: 32 products in two instructions, or one vpdpbusd), then scale once:
//   q8_0 blocks     y = Σ_b (dw_b · dx_b) · Σ_{k ∈ b} q_k xq_k
//   q4_0 blocks     y = Σ_b (dw_b · dx_b) · Σ_{k ∈ b} (q_k − 8) xq_k       (q5_0: q_k − 16)
//   q4_1 blocks     y = Σ_b dx_b · (dw_b · Σ_{k ∈ b} q_k xq_k + m_b · Σ_{k ∈ b} xq_k)   (q5_1 too)
//   q4_k sub-blocks y = Σ_j dx_j · ((d·sc_j) · Σ_{k ∈ j} q_k xq_k − (dmin·m_j) · Σ_{k ∈ j} xq_k)
//                   (q5_k too)
//   q6_k            y = Σ_b (d · dx_b) · Σ_{16-value groups g ⊂ b} sc_g · Σ_{k ∈ g} (q_k − 32) xq_k
//                   (q3_k: sc_g − 32 and q_k − 4)
//   q2_k            y = Σ_b dx_b · Σ_{g ⊂ b} (d · sc_g · Σ_{k ∈ g} q_k xq_k − dmin · m_g · Σ_{k ∈ g} xq_k)
//   iq4_nl blocks   y = Σ_b (dw_b · dx_b) · Σ_{k ∈ b} T[q_k] xq_k     (T the 16 int8 levels, one vpshufb)
//   iq4_xs          y = Σ_j (d · (sc_j − 32) · dx_j) · Σ_{k ∈ j} T[q_k] xq_k   (sub-blocks j of 32)
// Prefill (many rows of x) decodes each weight row once into f32 and multiplies it with every row
// of x rounded through its q8_0 blocks. Without AVX2 both cases take the decoding path.
#include "common/quant/blocks.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/ops_cpu.h"
#include "common/quant/simd.h"

namespace inferlab::quant {

namespace {

// Σ a_k · b_k over int8 vectors, in int32 (exact).
std::int32_t dot_i8_scalar(const std::int8_t* a, const std::int8_t* b, std::int64_t n) {
  std::int32_t acc = 0;
  for (std::int64_t k = 0; k < n; ++k) acc += static_cast<std::int32_t>(a[k]) * b[k];
  return acc;
}

#if INFERLAB_QUANT_SIMD
using simd::hsum;

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Four blocks' eight-lane int32 partial sums folded into their four totals, in order (exact).
__m128i fold4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// The f16 at p as a float, in one instruction (f16_to_f32's value, inlined where it runs per block).
float half(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 32 products of unsigned bytes u and signed bytes s summed four at a time into eight int32 lanes
// (simd::dot4_acc: vpdpbusd, or vpmaddubsw and vpmaddwd; u ≤ 128 with |s| ≤ 127 keeps both exact).
__m256i dot32_u8_i8(__m256i u, __m256i s) { return simd::dot4_acc(_mm256_setzero_si256(), u, s); }

// 32 int8 products w·x the same way: |w| is paired with x carrying w's sign. No saturation for any
// weight byte, given |x| ≤ 127 (our activation quantisers never make −128).
__m256i dot32_i8(__m256i w, __m256i x) { return dot32_u8_i8(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)); }
__m256i dot32_i8(const std::int8_t* w, const std::int8_t* x) { return dot32_i8(load32(w), load32(x)); }

// The 32 nibbles of 16 bytes as 32 bytes, in q4_0's element order: byte j holds the low nibble of
// byte j, byte 16 + j its high nibble.
__m256i nibbles32(const std::uint8_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
}

// The 32 bits at p (little-endian) as 32 bytes: byte j is 16 where bit j is set, else 0 (the
// fifth bit of q5_0's and q5_1's element j). Each byte picks the byte of the word holding its bit
// (vpshufb), then tests that bit against a mask with one bit set per byte.
__m256i fifth_bits(const std::uint8_t* p) {
  std::uint32_t h;
  std::memcpy(&h, p, 4);
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)), pick);
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16));
}

// q4_0, q4_1, q5_0, q5_1 · q8_0 for one output, per block of 32 (18, 20, 22, 24 bytes: f16 d,
// for _1 an f16 minimum m, for q5 the 32 fifth bits, 16 bytes of nibbles). The unsigned values q
// (0-15, or 0-31) meet x's bytes in vpmaddubsw directly. q4_0 and q5_0 centre them, q − 8 or
// q − 16: Σ (q − c)·xq = Σ q·xq − c·Σ xq, an exact int32 sum from x's block sums, scaled by
// dw·dx. q4_1 and q5_1 add m·dx·Σ xq instead.
//
// Four blocks at a time, as q8_0_dot: their eight-lane partial sums fold into four exact int32
// sums (fold4), so the centring and the scales (dw·dx, m·dx) apply as four-lane vectors.
template <gguf::Type F>
float q32_q8_dot(const std::uint8_t* r, const std::int8_t* xq, const float* dx, const std::int32_t* xs, std::int64_t nb) {
  constexpr bool kMin = F == gguf::Type::Q4_1 || F == gguf::Type::Q5_1,
                 kFive = F == gguf::Type::Q5_0 || F == gguf::Type::Q5_1;
  constexpr int kBytes = 18 + (kMin ? 2 : 0) + (kFive ? 4 : 0), kQh = kMin ? 4 : 2, kQs = kQh + (kFive ? 4 : 0);
  constexpr int kCentreShift = kFive ? 4 : 3;  // c = 16 or 8
  auto block = [&](const std::uint8_t* blk, const std::int8_t* x) {
    __m256i q = nibbles32(blk + kQs);
    if constexpr (kFive) q = _mm256_or_si256(q, fifth_bits(blk + kQh));
    return dot32_u8_i8(q, load32(x));
  };
  __m128 y = _mm_setzero_ps();
  std::int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    const std::uint8_t* blk = r + b * kBytes;
    const __m128 dx4 = _mm_loadu_ps(dx + b);
    __m128i sums = fold4(block(blk, xq + 32 * b), block(blk + kBytes, xq + 32 * b + 32),
                         block(blk + 2 * kBytes, xq + 32 * b + 64), block(blk + 3 * kBytes, xq + 32 * b + 96));
    const __m128i s4 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xs + b));
    if constexpr (!kMin) sums = _mm_sub_epi32(sums, _mm_slli_epi32(s4, kCentreShift));
    const __m128 dw = _mm_setr_ps(half(blk), half(blk + kBytes), half(blk + 2 * kBytes), half(blk + 3 * kBytes));
    y = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(dw, dx4), y);
    if constexpr (kMin) {
      const __m128 m =
          _mm_setr_ps(half(blk + 2), half(blk + kBytes + 2), half(blk + 2 * kBytes + 2), half(blk + 3 * kBytes + 2));
      y = _mm_fmadd_ps(_mm_mul_ps(m, dx4), _mm_cvtepi32_ps(s4), y);
    }
  }
  float out = hsum(y);
  for (; b < nb; ++b) {
    const std::uint8_t* blk = r + b * kBytes;
    const std::int32_t qx = hsum(block(blk, xq + 32 * b));
    out += static_cast<float>(kMin ? qx : qx - xs[b] * (1 << kCentreShift)) * (half(blk) * dx[b]);
    if constexpr (kMin) out += half(blk + 2) * dx[b] * static_cast<float>(xs[b]);
  }
  return out;
}

// q4_k and q5_k · q8_0 for one output: a sub-block of 32 is one x block. Its values (0-15, or
// 0-31 with q5_k's bit from qh) meet x's bytes in vpmaddubsw directly; the minimum's term needs
// only Σ xq, summed once per call.
template <gguf::Type F>
float qk_q8_dot(const std::uint8_t* r, const std::int8_t* xq, const float* dx, const std::int32_t* xs, std::int64_t nb) {
  constexpr bool kFive = F == gguf::Type::Q5_K;
  constexpr int kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
  const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  __m128 y = _mm_setzero_ps(), ym = _mm_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b, r += kBytes, xq += 256, dx += 8, xs += 8) {
    const __m128 d = _mm_set1_ps(half(r)), dmin = _mm_set1_ps(half(r + 2));
    [[maybe_unused]] const __m256i qh = load32(r + 16);
    // The 8 six-bit scales and mins (gguf::scale_min_k4) unpacked four to a 32-bit word at once:
    // u[0], u[1] hold sc 0-3 and 4-7, u[2], u[3] the mins m 0-3 and 4-7, a byte each.
    std::uint32_t u[4];
    std::memcpy(u, r + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const std::uint32_t m03 = u[1] & 0x3F3F3F3Fu;
    u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = m03;
    u[0] &= 0x3F3F3F3Fu;
    auto floats4 = [](std::uint32_t w) {
      return _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(static_cast<int>(w))));
    };
    // Sub-blocks 4h … 4h + 3 (pairs j = 2h, 2h + 1) fold into four sums, scaled as one vector.
    for (int h = 0; h < 2; ++h) {
      __m256i p[4];
      for (int t = 0; t < 2; ++t) {
        const int j = 2 * h + t;
        const __m256i raw = load32(r + kQs + 32 * j);
        __m256i qlo = _mm256_and_si256(raw, m4), qhi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if constexpr (kFive) {  // sub-block s's fifth bit is bit s of qh[l]: moved to bit 4 of byte l
          const __m256i bits = _mm256_srli_epi16(qh, 2 * j);
          qlo = _mm256_or_si256(qlo, _mm256_slli_epi16(_mm256_and_si256(bits, one), 4));
          qhi = _mm256_or_si256(qhi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 1), one), 4));
        }
        p[2 * t] = dot32_u8_i8(qlo, load32(xq + 64 * j));
        p[2 * t + 1] = dot32_u8_i8(qhi, load32(xq + 64 * j + 32));
      }
      const int k = 4 * h;
      const __m128 dx4 = _mm_loadu_ps(dx + k);
      const __m128 scv = floats4(u[h]), mv = floats4(u[2 + h]);
      y = _mm_fmadd_ps(_mm_cvtepi32_ps(fold4(p[0], p[1], p[2], p[3])), _mm_mul_ps(_mm_mul_ps(d, scv), dx4), y);
      const __m128 xs4 = _mm_cvtepi32_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xs + k)));
      ym = _mm_fmadd_ps(_mm_mul_ps(_mm_mul_ps(dmin, mv), dx4), xs4, ym);
    }
  }
  return hsum(_mm_sub_ps(y, ym));
}

// A 16-bit lane's weight for vpmaddwd: the low 128 bits (the block's first 16 values) get a, the
// high ones b.
__m256i halves16(int a, int b) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(b)), _mm_set1_epi16(static_cast<short>(a)));
}

// q6_k · q8_0 for one output: quarter r of a half is one x block, its 6-bit values (0-63) built
// from ql's nibbles and qh's bit pairs. vpmaddubsw of q against x's bytes gives pairs of q·xq, and
// vpmaddwd weighs the block's two 16-value groups by their int8 scales; four blocks fold into one
// vector (fold4) before scaling. The − 32 is Σ_g sc_g·32·Σ_{k ∈ g} xq, from x's 16-value sums:
// one vpmaddwd of the 16 scales by them gives it for the super-block's 8 blocks at once.
float q6_k_q8_dot(const std::uint8_t* r, const std::int8_t* xq, const float* dx, const std::int16_t* xs16, std::int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
  __m128 y = _mm_setzero_ps();
  __m256 yc = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b, r += 210, xq += 256, dx += 8, xs16 += 16) {
    const float d = half(r + 208);
    const auto* sc = reinterpret_cast<const std::int8_t*>(r + 192);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    const __m256i centre = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs16)));
    yc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(centre), _mm256_mul_ps(_mm256_set1_ps(32 * d), _mm256_loadu_ps(dx)), yc);
    for (int h = 0; h < 2; ++h) {
      const __m256i a = load32(r + 64 * h), c = load32(r + 64 * h + 32), hb = load32(r + 128 + 32 * h);
      auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift), m2), 4); };
      const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(a, m4), high(0)),
                            _mm256_or_si256(_mm256_and_si256(c, m4), high(2)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), high(4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4), high(6))};
      __m256i s[4];
      for (int r4 = 0; r4 < 4; ++r4) {
        const int g = 8 * h + 2 * r4;  // block 4h + r4's first group
        s[r4] = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r4], load32(xq + 128 * h + 32 * r4)), halves16(sc[g], sc[g + 1]));
      }
      y = _mm_fmadd_ps(_mm_cvtepi32_ps(fold4(s[0], s[1], s[2], s[3])), _mm_mul_ps(_mm_set1_ps(d), _mm_loadu_ps(dx + 4 * h)),
                       y);
    }
  }
  return hsum(y) - hsum(yc);
}

// q2_k and q3_k · q8_0 for one output. Quarter j of half h (bits 2j of the half's 32 bytes qs) is
// x block 4h + j, in two 16-value groups with a scale each: vpmaddubsw gives pairs of q·xq,
// vpmaddwd weighs the groups, and four blocks fold into one vector before scaling (as q6_k). The
// part that does not depend on q comes from x's 16-value sums S_g, once per super-block: q2_k's
// minimums dmin·Σ_g m_g·S_g, and q3_k's − 4 as 4·Σ_g sc_g·S_g (bit 4h + j of hmask adds 4 back
// into q, so q runs 0-7 there). q3_k's 16 six-bit scales unpack four to a 32-bit word.
template <gguf::Type F>
float k23_q8_dot(const std::uint8_t* r, const std::int8_t* xq, const float* dx, const std::int16_t* xs16, std::int64_t nb) {
  constexpr bool kTwo = F == gguf::Type::Q2_K;
  constexpr int kBytes = kTwo ? 84 : 110, kQs = kTwo ? 16 : 32;
  const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m128 y = _mm_setzero_ps();
  __m256 yc = _mm256_setzero_ps();
  for (std::int64_t s = 0; s < nb; ++s, r += kBytes, xq += 256, dx += 8, xs16 += 16) {
    const float d = half(r + (kTwo ? 80 : 108));
    std::uint8_t sc[16];  // q2_k: the low nibbles of its 16 scale bytes; q3_k: the 6-bit scales (sc − 32 is applied below)
    __m256i side;         // per group, what multiplies S_g: q2_k's m_g, q3_k's sc_g − 32
    if constexpr (kTwo) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(sc), _mm_and_si128(raw, _mm_set1_epi8(15)));
      side = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)));
    } else {
      std::uint32_t u[4];
      std::memcpy(u, r + 96, 12);
      const std::uint32_t t = u[2];
      u[2] = ((u[0] >> 4) & 0x0F0F0F0Fu) | (((t >> 4) & 0x03030303u) << 4);
      u[3] = ((u[1] >> 4) & 0x0F0F0F0Fu) | (((t >> 6) & 0x03030303u) << 4);
      u[0] = (u[0] & 0x0F0F0F0Fu) | ((t & 0x03030303u) << 4);
      u[1] = (u[1] & 0x0F0F0F0Fu) | (((t >> 2) & 0x03030303u) << 4);
      std::memcpy(sc, u, 16);
      side = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc))),
                              _mm256_set1_epi16(32));
    }
    const __m256i by_s = _mm256_madd_epi16(side, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs16)));  // per block
    const float side_scale = kTwo ? half(r + 82) : 4 * d;  // dmin, or the 4 of q − 4
    yc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(by_s), _mm256_mul_ps(_mm256_set1_ps(side_scale), _mm256_loadu_ps(dx)), yc);
    [[maybe_unused]] const __m256i hm = load32(r);
    for (int h = 0; h < 2; ++h) {
      const __m256i raw = load32(r + kQs + 32 * h);
      __m256i p[4];
      for (int j = 0; j < 4; ++j) {
        const int b = 4 * h + j;
        __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * j), m2);
        if constexpr (!kTwo) q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, b), one), 2));
        const int s0 = kTwo ? sc[2 * b] : sc[2 * b] - 32, s1 = kTwo ? sc[2 * b + 1] : sc[2 * b + 1] - 32;
        p[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(xq + 32 * b)), halves16(s0, s1));
      }
      y = _mm_fmadd_ps(_mm_cvtepi32_ps(fold4(p[0], p[1], p[2], p[3])), _mm_mul_ps(_mm_set1_ps(d), _mm_loadu_ps(dx + 4 * h)),
                       y);
    }
  }
  return hsum(y) - hsum(yc);
}

// iq4_nl and iq4_xs: the 32 nibbles of 16 bytes (q4_0's order) as the signed levels they index,
// gguf::kIq4nlValues. The table fits one 128-bit lane, so vpshufb looks up all 32 at once (its
// index is the low four bits of each byte, which is all a nibble has). The levels lie in
// [−127, 113], so dot32_i8 multiplies them with x's bytes exactly.
__m256i iq4_levels32(const std::uint8_t* qs) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gguf::kIq4nlValues)));
  return _mm256_shuffle_epi8(table, nibbles32(qs));
}

// iq4_nl · q8_0 for one output, per block of 32 (18 bytes: f16 d, 16 bytes of nibbles): as
// q8_0_dot once the nibbles are looked up, four blocks folded into four exact int32 sums.
float iq4_nl_q8_dot(const std::uint8_t* r, const std::int8_t* xq, const float* dx, std::int64_t nb) {
  __m128 y = _mm_setzero_ps();
  std::int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    const std::uint8_t* blk = r + b * 18;
    __m256i s[4];
    for (int i = 0; i < 4; ++i) s[i] = dot32_i8(iq4_levels32(blk + 18 * i + 2), load32(xq + 32 * (b + i)));
    const __m128 dw = _mm_setr_ps(half(blk), half(blk + 18), half(blk + 36), half(blk + 54));
    y = _mm_fmadd_ps(_mm_cvtepi32_ps(fold4(s[0], s[1], s[2], s[3])), _mm_mul_ps(dw, _mm_loadu_ps(dx + b)), y);
  }
  float out = hsum(y);
  for (; b < nb; ++b)
    out +=
        static_cast<float>(hsum(dot32_i8(iq4_levels32(r + 18 * b + 2), load32(xq + 32 * b)))) * (half(r + 18 * b) * dx[b]);
  return out;
}

// iq4_xs · q8_0 for one output: a super-block of 256 (136 bytes: f16 d, the scales' top bits
// scales_h, their low nibbles scales_l, 128 bytes of nibbles) is eight x blocks, each a sub-block
// with its 6-bit scale; four sub-blocks fold into one vector, scaled by d·(sc − 32)·dx as q4_k does.
float iq4_xs_q8_dot(const std::uint8_t* r, const std::int8_t* xq, const float* dx, std::int64_t nb) {
  __m128 y = _mm_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b, r += 136, xq += 256, dx += 8) {
    const __m128 d = _mm_set1_ps(half(r));
    for (int h = 0; h < 2; ++h) {
      __m256i p[4];
      for (int t = 0; t < 4; ++t) p[t] = dot32_i8(iq4_levels32(r + 8 + 16 * (4 * h + t)), load32(xq + 32 * (4 * h + t)));
      const __m128 sc = _mm_cvtepi32_ps(_mm_setr_epi32(gguf::scale_iq4_xs(4 * h, r), gguf::scale_iq4_xs(4 * h + 1, r),
                                                       gguf::scale_iq4_xs(4 * h + 2, r), gguf::scale_iq4_xs(4 * h + 3, r)));
      y = _mm_fmadd_ps(_mm_cvtepi32_ps(fold4(p[0], p[1], p[2], p[3])),
                       _mm_mul_ps(_mm_mul_ps(d, sc), _mm_loadu_ps(dx + 4 * h)), y);
    }
  }
  return hsum(y);
}

// One output: row n of W (block type t, row-order bytes w) times row m of a.
float blocked_dot(gguf::Type t, const std::uint8_t* w, std::int64_t n, std::int64_t n_in, const BlockedActivations& a,
                  std::int64_t m) {
  const std::int64_t nb = n_in / 32;
  const std::int8_t* xq = a.q.data() + m * n_in;
  const float* dx = a.d.data() + m * nb;
  const std::int32_t* xs = a.sum.data() + m * nb;
  const std::int16_t* xs16 = a.sum16.data() + m * nb * 2;
  using T = gguf::Type;
  switch (t) {
    case T::Q4_0: return q32_q8_dot<T::Q4_0>(w + n * nb * 18, xq, dx, xs, nb);
    case T::Q4_1: return q32_q8_dot<T::Q4_1>(w + n * nb * 20, xq, dx, xs, nb);
    case T::Q5_0: return q32_q8_dot<T::Q5_0>(w + n * nb * 22, xq, dx, xs, nb);
    case T::Q5_1: return q32_q8_dot<T::Q5_1>(w + n * nb * 24, xq, dx, xs, nb);
    case T::Q4_K: return qk_q8_dot<T::Q4_K>(w + n * (n_in / 256 * 144), xq, dx, xs, n_in / 256);
    case T::Q5_K: return qk_q8_dot<T::Q5_K>(w + n * (n_in / 256 * 176), xq, dx, xs, n_in / 256);
    case T::Q6_K: return q6_k_q8_dot(w + n * (n_in / 256 * 210), xq, dx, xs16, n_in / 256);
    case T::Q2_K: return k23_q8_dot<T::Q2_K>(w + n * (n_in / 256 * 84), xq, dx, xs16, n_in / 256);
    case T::Q3_K: return k23_q8_dot<T::Q3_K>(w + n * (n_in / 256 * 110), xq, dx, xs16, n_in / 256);
    case T::IQ4_NL: return iq4_nl_q8_dot(w + n * nb * 18, xq, dx, nb);
    case T::IQ4_XS: return iq4_xs_q8_dot(w + n * (n_in / 256 * 136), xq, dx, n_in / 256);
    default: break;
  }
  fail("blocked_dot: ", gguf::type_name(t), " has no integer product with q8_0 blocks");
}

// q8_0 · q8_0 for one output: each block's integer sum exact, then scaled by d_w · d_x. Four
// blocks at a time: their eight-lane partial sums are folded into four exact int32 sums.
float q8_0_dot(const std::uint8_t* w, const std::int8_t* xq, const float* dx, std::int64_t nb) {
  __m128 y = _mm_setzero_ps();
  std::int64_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    __m256i s[4];
    float dw[4];
    for (int i = 0; i < 4; ++i) {
      const std::uint8_t* blk = w + (b + i) * 34;
      s[i] = dot32_i8(reinterpret_cast<const std::int8_t*>(blk + 2), xq + (b + i) * 32);
      std::uint16_t h;
      std::memcpy(&h, blk, 2);
      dw[i] = _cvtsh_ss(h);
    }
    const __m128i sums = fold4(s[0], s[1], s[2], s[3]);
    const __m128 scale = _mm_mul_ps(_mm_loadu_ps(dw), _mm_loadu_ps(dx + b));
    y = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scale, y);
  }
  float r = hsum(y);
  for (; b < nb; ++b) {
    const std::uint8_t* blk = w + b * 34;
    r += static_cast<float>(dot_i8(reinterpret_cast<const std::int8_t*>(blk + 2), xq + b * 32, 32)) * (half(blk) * dx[b]);
  }
  return r;
}
#else
float half(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

float q8_0_dot(const std::uint8_t* w, const std::int8_t* xq, const float* dx, std::int64_t nb) {
  float y = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b)
    y += static_cast<float>(dot_i8_scalar(reinterpret_cast<const std::int8_t*>(w + b * 34 + 2), xq + b * 32, 32)) *
         (half(w + b * 34) * dx[b]);
  return y;
}
#endif

}  // namespace

BlockedActivations::BlockedActivations(std::int64_t m, std::int64_t n_in) : rows(m), cols(n_in) {
  IL_CHECK(cols % 32 == 0, "q8_0 activations: the input width ", cols, " is not a multiple of 32");
  const std::int64_t nb = cols / 32;
  q.resize(static_cast<std::size_t>(rows * cols));
  d.resize(static_cast<std::size_t>(rows * nb));
  sum.resize(static_cast<std::size_t>(rows * nb));
  sum16.resize(static_cast<std::size_t>(rows * nb * 2));
}

void BlockedActivations::sum_block(std::int64_t b) {
  std::int32_t half_sums[2] = {0, 0};  // |Σ| ≤ 16 · 127: an int16
  for (int j = 0; j < 32; ++j) half_sums[j / 16] += q[static_cast<std::size_t>(32 * b + j)];
  const auto i = static_cast<std::size_t>(b);
  sum[i] = half_sums[0] + half_sums[1];
  sum16[2 * i] = static_cast<std::int16_t>(half_sums[0]), sum16[2 * i + 1] = static_cast<std::int16_t>(half_sums[1]);
}

std::vector<float> BlockedActivations::rounded() const {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t m = 0; m < rows; ++m)
    for (std::int64_t k = 0; k < cols; ++k) out[static_cast<std::size_t>(m * cols + k)] = value(m, k);
  return out;
}

float inverse_scale(float d) {
  const float id = d != 0 ? 1.0f / d : 0.0f;
  return std::isfinite(id) ? id : 0.0f;
}

std::int32_t dot_i8(const std::int8_t* w, const std::int8_t* x, std::int64_t n) {
#if INFERLAB_QUANT_SIMD
  __m256i acc = _mm256_setzero_si256();
  std::int64_t k = 0;
  for (; k + 32 <= n; k += 32) acc = _mm256_add_epi32(acc, dot32_i8(w + k, x + k));
  return hsum(acc) + dot_i8_scalar(w + k, x + k, n - k);
#else
  return dot_i8_scalar(w, x, n);
#endif
}

BlockedActivations blocked_activations_fast(const Tensor& x) {
#if INFERLAB_QUANT_SIMD
  BlockedActivations a(x.size(0), x.size(1));
  const std::int64_t blocks = a.rows * a.cols / 32;
  const float* X = x.data<float>();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 almost_half = _mm256_set1_ps(0x1.fffffep-2f);  // the largest float below 0.5
  for (std::int64_t b = 0; b < blocks; ++b) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(X + 32 * b + 8 * i);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                             _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    // llama.cpp's scale and its inverse, as its reference quantiser computes them
    const float dq = amax / 127.0f, id = inverse_scale(dq);
    a.d[static_cast<std::size_t>(b)] = f16_to_f32(f32_to_f16(dq));
    // std::round (halves away from zero) of p = x·id: trunc(p + copysign(0.5⁻, p)), exact for |p| < 2^22
    // (here |p| ≤ 127). ISO C++ mode compiles without contracting x·id into the add.
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 p = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
      const __m256 bias = _mm256_or_ps(almost_half, _mm256_andnot_ps(abs_mask, p));
      q[i] = _mm256_cvttps_epi32(_mm256_add_ps(p, bias));
    }
    const __m256i lo = _mm256_add_epi32(q[0], q[1]), hi = _mm256_add_epi32(q[2], q[3]);
    const std::int32_t s_lo = hsum(lo), s_hi = hsum(hi);
    a.sum[static_cast<std::size_t>(b)] = s_lo + s_hi;
    a.sum16[static_cast<std::size_t>(2 * b)] = static_cast<std::int16_t>(s_lo);
    a.sum16[static_cast<std::size_t>(2 * b + 1)] = static_cast<std::int16_t>(s_hi);
    // 32 int32 lanes to 32 bytes: the packs interleave 128-bit halves, the permutation undoes it
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q.data() + 32 * b),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  return a;
#else
  BlockedActivations a(x.size(0), x.size(1));
  for (std::int64_t b = 0; b < a.rows * a.cols / 32; ++b) {
    const float* v = x.data<float>() + 32 * b;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float dq = amax / 127.0f, id = inverse_scale(dq);
    a.d[static_cast<std::size_t>(b)] = f16_to_f32(f32_to_f16(dq));
    for (int i = 0; i < 32; ++i) a.q[static_cast<std::size_t>(32 * b + i)] = static_cast<std::int8_t>(std::round(v[i] * id));
    a.sum_block(b);
  }
  return a;
#endif
}

void decoded_matmul(const float* X, std::int64_t M, std::int64_t rows, std::int64_t cols,
                    const std::function<void(std::int64_t n, float* out)>& decode_row, float* Y) {
#pragma omp parallel if (M * rows * cols >= kParallel)
  {
    std::vector<float> row(static_cast<std::size_t>(cols));
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < rows; ++n) {
      decode_row(n, row.data());
      cpu::dot_rows(X, M, cols, row.data(), Y + n, rows);
    }
  }
}

void blocks_matmul(gguf::Type t, const std::uint8_t* w, std::int64_t rows, std::int64_t cols, const BlockedActivations& a,
                   float* Y) {
  const std::int64_t M = a.rows, bv = gguf::block_values(t), bb = gguf::row_bytes(t, bv);
  IL_CHECK(a.cols == cols && cols % bv == 0, "blocks_matmul: a ", gguf::type_name(t), " matrix of ", rows, " × ", cols,
           " against x of width ", a.cols);
  if (t == gguf::Type::Q8_0) {  // bytes times bytes at any M: nothing to decode
    const std::int64_t nb = cols / 32;
#pragma omp parallel for schedule(static) if (M * rows * cols >= kParallel)
    for (std::int64_t n = 0; n < rows; ++n) {
      ask_ahead(w + n * nb * 34, nb * 34);
      for (std::int64_t m = 0; m < M; ++m)
        Y[m * rows + n] = q8_0_dot(w + n * nb * 34, a.q.data() + m * cols, a.d.data() + m * nb, nb);
    }
    return;
  }
#if INFERLAB_QUANT_SIMD
  if (M <= kDirectRows) {
#pragma omp parallel for schedule(static) if (M * rows * cols >= kParallel)
    for (std::int64_t n = 0; n < rows; ++n) {
      ask_ahead(w + n * (cols / bv * bb), cols / bv * bb);
      for (std::int64_t m = 0; m < M; ++m) Y[m * rows + n] = blocked_dot(t, w, n, cols, a, m);
    }
    return;
  }
#endif
  // x̂ (x rounded through its blocks) in f32 against each decoded row: the same function.
  const std::int64_t row_bytes = cols / bv * bb;
  decoded_matmul(
      a.rounded().data(), M, rows, cols,
      [&](std::int64_t n, float* out) {
    for (std::int64_t b = 0; b < cols / bv; ++b) gguf::dequantize_block(t, w + n * row_bytes + b * bb, out + b * bv);
      },
      Y);
}

}  // namespace inferlab::quant
