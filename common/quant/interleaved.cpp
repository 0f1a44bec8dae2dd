#include "common/quant/interleaved.h"

#include <omp.h>

#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "common/ops_cpu.h"
#include "common/quant/simd.h"

namespace inferlab::quant {

namespace {

// A layout's values and bytes a block (in row order), the unit of eight rows' blocks, its row ↔
// unit copies, its eight-row kernel and, for the plain layouts, its decoder (the block types decode
// through ggml's bytes and gguf::dequantize_block).
struct Codec {
  Layout layout;
  std::int64_t values, block, unit;
  void (*pack)(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i);
  void (*unpack)(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk);
  void (*dot)(const std::uint8_t* group, const BlockedActivations& a, std::int64_t m, std::int64_t units, float* y);
  void (*decode)(const std::uint8_t* u, std::int64_t i, float* out) = nullptr;  ///< row i's `values` values
};

// Interleaving pays only where the kernels below run: without AVX2 no matrix is interleaved (the
// row-order products keep their plain paths), and codec_of has no formats.
#if INFERLAB_QUANT_SIMD
// A block of 32: its quant bytes per row (q4_0: 16, two values a byte; q8_0 and int8 rows: 32),
// the unit of eight rows' blocks (after the eight f16 scales, 16 bytes, where the block has them;
// then, with minimums (q4_1, q5_1), the eight f16 m; then, with a fifth bit (q5_0, q5_1), the
// eight rows' 32 bytes of fifth bits), and the centre taken off each quant value (q4_0: 8; q5_0:
// 16; q8_0's stored w + 128: 128; none with minimums, whose m·Σx is added instead).
struct Block32 {
  bool eight_bit, scales = true, minimums = false, fifth_bit = false;
  constexpr std::int64_t high_bits() const { return (scales ? 16 : 0) + (minimums ? 16 : 0); }
  constexpr std::int64_t head() const { return high_bits() + (fifth_bit ? 32 : 0); }
  constexpr std::int64_t quant_bytes() const { return eight_bit ? 32 : 16; }
  constexpr std::int64_t unit() const { return head() + 8 * quant_bytes(); }
  constexpr std::int32_t centre() const { return eight_bit ? 128 : minimums ? 0 : fifth_bit ? 16 : 8; }
};

// The fifth bits of eight rows' 32 values (q5_0, q5_1) or of a q5_k chunk's half (pieces 0-3 or
// 4-7 of its two sub-blocks) as 32 bytes laid out as a piece's quant bytes: byte 4i + t holds in
// bit k = 4h + p row i's fifth bit of the value that nibble h (0 low, 1 high) of byte t of piece p
// holds. One load serves a block's (a half-chunk's) eight pieces; fifth_bit(H, k) is the bits of
// piece and nibble k moved to bit 4 of each byte (0x10 or 0), ready to OR onto the nibbles: a
// 16-bit shift and an AND (the shift moves bit k to bit 4 within each byte, k ≤ 7).
constexpr std::int64_t fifth_bit_byte(std::int64_t i, std::int64_t t) { return 4 * i + t; }
__m256i fifth_bit(__m256i h, int k) {
  const __m256i moved =
      k < 4 ? _mm256_sll_epi16(h, _mm_cvtsi32_si128(4 - k)) : _mm256_srl_epi16(h, _mm_cvtsi32_si128(k - 4));
  return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}

// Where byte t of row i's quants sits in its unit, after `head` bytes of scales: pieces of 4,
// piece j of every row together.
constexpr std::int64_t quant_byte(std::int64_t i, std::int64_t t, std::int64_t head = 16) {
  return head + 32 * (t / 4) + 4 * i + t % 4;
}

// q4_k: a super-block of eight rows (256 values each) is one unit of 1184 bytes: the eight d, the
// eight dmin (f16), each sub-block j's eight 6-bit scales and then its eight minimums unpacked to a
// byte (at 32 + 8j + i and 96 + 8j + i), then the quants. Row i's quant byte t (ggml's order: byte
// 32c + l holds value l of sub-block 2c in its low nibble, of sub-block 2c + 1 in its high one)
// sits in chunk c's 256 bytes in pieces of 4 as the 32-blocks' do.
//
// q5_k: the same, the quants 256 bytes later, after the fifth bits: chunk c's 64 bytes at 160 + 64c,
// pieces 0-3 then 4-7 of its two sub-blocks as fifth_bit_byte lays out a block's (nibble h = 0:
// sub-block 2c, 1: 2c + 1): 1440 bytes, 180 a row and super-block for ggml's 176.
constexpr std::int64_t kQ4kUnit = 1184, kQ5kUnit = 1440, kQ5kHigh = 160;
template <bool kFive = false>
constexpr std::int64_t q4k_quant_byte(std::int64_t i, std::int64_t t) {
  return (kFive ? kQ5kHigh + 256 : 160) + 256 * (t / 32) + quant_byte(i, t % 32) - 16;
}

// iq4_xs: a super-block of eight rows is one unit of 1104 bytes: the eight d (f16), each
// sub-block j's eight 6-bit scales less 32 as int8 (at 16 + 8j + i), then the quants. Sub-block j
// of a row is a q4_0 block's 16 bytes (ggml's bytes 8 + 16j …), and the eight rows' sit in
// sub-block j's 128 bytes in pieces of 4 as the 32-blocks' do.
constexpr std::int64_t kIq4xsUnit = 1104;
constexpr std::int64_t iq4xs_quant_byte(std::int64_t i, std::int64_t t) {
  return 80 + 128 * (t / 16) + quant_byte(i, t % 16) - 16;
}

// q6_k: a super-block of eight rows is one unit of 1680 bytes (8 · 210): the eight d (f16), each
// 16-value group g's eight int8 scales (at 16 + 8g + i), the values' low four bits as q4_k's quants
// are (sub-blocks 2c and 2c + 1 share chunk c's bytes, low and high nibble), then their top two
// bits, four values to a byte: in chunk c's 128 bytes, byte t of row i at 32j + 4i + t holds those
// of the low nibbles of pieces 2j and 2j + 1 (bits 0-1 and 4-5) and of their high nibbles (2-3, 6-7).
constexpr std::int64_t kQ6kUnit = 1680, kQ6kLow = 144, kQ6kHigh = 1168;

// Value v (0-255, 6 bits) of row i of a q6_k unit, and its 16-value group's scale.
int q6k_value(const std::uint8_t* u, std::int64_t i, std::int64_t v) {
  const std::int64_t c = v / 64, h = v % 64 / 32, l = v % 32, p = l / 4, t = l % 4;
  const std::uint8_t lo = u[kQ6kLow + 256 * c + 32 * p + 4 * i + t];
  const std::uint8_t hi = u[kQ6kHigh + 128 * c + 32 * (p / 2) + 4 * i + t];
  return ((h ? lo >> 4 : lo & 15) | ((hi >> (2 * h + 4 * (p % 2))) & 3) << 4);
}
void set_q6k_value(std::uint8_t* u, std::int64_t i, std::int64_t v, int q) {
  const std::int64_t c = v / 64, h = v % 64 / 32, l = v % 32, p = l / 4, t = l % 4;
  std::uint8_t& lo = u[kQ6kLow + 256 * c + 32 * p + 4 * i + t];
  std::uint8_t& hi = u[kQ6kHigh + 128 * c + 32 * (p / 2) + 4 * i + t];
  lo = static_cast<std::uint8_t>(h ? (lo & 15) | (q & 15) << 4 : (lo & 0xF0) | (q & 15));
  const int shift = static_cast<int>(2 * h + 4 * (p % 2));
  hi = static_cast<std::uint8_t>((hi & ~(3 << shift)) | (q >> 4) << shift);
}
// ggml's Q6_K block: ql[128] (low bits), qh[64] (top bits), scales[16], d. Value v of the block.
int q6k_block_value(const std::uint8_t* b, std::int64_t v) {
  const std::int64_t n = v / 128, quarter = v % 128 / 32, l = v % 32;
  const std::uint8_t ql = b[64 * n + l + 32 * (quarter % 2)], qh = b[128 + 32 * n + l];
  return ((quarter >= 2 ? ql >> 4 : ql & 15) | ((qh >> (2 * quarter)) & 3) << 4);
}
void set_q6k_block_value(std::uint8_t* b, std::int64_t v, int q) {
  const std::int64_t n = v / 128, quarter = v % 128 / 32, l = v % 32;
  std::uint8_t& ql = b[64 * n + l + 32 * (quarter % 2)];
  std::uint8_t& qh = b[128 + 32 * n + l];
  ql = static_cast<std::uint8_t>(quarter >= 2 ? (ql & 15) | (q & 15) << 4 : (ql & 0xF0) | (q & 15));
  qh = static_cast<std::uint8_t>((qh & ~(3 << (2 * quarter))) | (q >> 4) << (2 * quarter));
}

using simd::dot4_acc;
using simd::kVnni;

// Each kernel asks for its unit's bytes kAheadBytes ahead as it starts the unit (blocks.h): the
// units of a product are one stream, and a q6_k decode read at a third of the read ceiling
// without, its loads of quant bytes waiting on memory.
template <std::int64_t kUnit>
inline void ask_ahead(const std::uint8_t* u) {
  quant::ask_ahead(u, kUnit);
}

// Row m of x as q8_0 blocks, as the kernels read it: its int8 values, each block's scale, and the
// sums of each block's values (of 32, and of each half: q6_k's groups of 16).
struct XRow {
  const std::int8_t* q;
  const float* d;
  const std::int32_t* sum;
  const std::int16_t* sum16;
};
XRow x_row(const BlockedActivations& a, std::int64_t m) {
  return {a.q.data() + m * a.cols, a.d.data() + m * (a.cols / 32), a.sum.data() + m * (a.cols / 32),
          a.sum16.data() + m * (a.cols / 16)};
}

__m256i broadcast4(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// iq4_nl's and iq4_xs's levels (gguf::kIq4nlValues) as a vpshufb table: + 128 (unsigned, for
// vpdpbusd, whose sums then need 128·Σx taken off) where the CPU has VNNI, else as they are.
__m256i iq4_table() {
  return _mm256_broadcastsi128_si256(
      _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gguf::kIq4nlValues)), _mm_set1_epi8(kVnni ? -128 : 0)));
}
constexpr std::int32_t kIq4Centre = kVnni ? 128 : 0;
// s + the products of the levels that the nibbles q index with four bytes of x, broadcast: the
// levels + 128 through vpdpbusd, or |level| · (x with the level's sign) (vpmaddubsw's pairs would
// overflow on (level + 128)·x).
__m256i iq4_dot4(__m256i s, __m256i table, __m256i q, __m256i xb) {
  const __m256i w = _mm256_shuffle_epi8(table, q);
  if constexpr (kVnni) return dot4_acc(s, w, xb);
  return dot4_acc(s, _mm256_abs_epi8(w), _mm256_sign_epi8(xb, w));
}

// Each kernel: y[0..7] = the eight rows of one group times row m of x (as q8_0 blocks), over
// `units` blocks (32 values) or super-blocks (256).
//
// q4_0, q5_0, q8_0 and iq4_nl: y[i] = Σ_b d_ib · dx_b · (Σ_k q_ik xq_k − centre · Σ_k xq_k); q4_1 and
// q5_1 (w = d·q + m): y[i] = Σ_b d_ib · dx_b · Σ_k q_ik xq_k + m_ib · dx_b · Σ_k xq_k. A fifth bit
// (q5_0, q5_1) is ORed onto its nibble as bit 4: the values then reach 31, and vpmaddubsw's pairs
// (without VNNI) stay below 2 · 31 · 127 < 2^15, exact. iq4_nl's
// blocks are q4_0's, its nibbles indexes into the levels gguf::kIq4nlValues (one vpshufb for 32),
// taken + 128 (unsigned, centre 128) where vpdpbusd sums them exactly, else as signed bytes. Int8
// rows are q8_0 without the block scales (kScales false): y[i] = Σ_b dx_b · Σ_k q_ik xq_k, the row's
// scale applied by the caller.
template <gguf::Type F, bool kScales = true>
void group_dot(const std::uint8_t* group, const BlockedActivations& a, std::int64_t m, std::int64_t nb, float* y) {
  constexpr bool kEightBit = F == gguf::Type::Q8_0, kLevels = F == gguf::Type::IQ4_NL;
  constexpr bool kMin = F == gguf::Type::Q4_1 || F == gguf::Type::Q5_1,
                 kFive = F == gguf::Type::Q5_0 || F == gguf::Type::Q5_1;
  constexpr Block32 l{kEightBit, kScales, kMin, kFive};
  constexpr std::int32_t kCentre = kLevels ? kIq4Centre : kEightBit && !kVnni ? 0 : l.centre();
  [[maybe_unused]] const __m256i levels = iq4_table();
  const auto [xq, dx, xs, xs16] = x_row(a, m);
  const __m256i low = _mm256_set1_epi8(15);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};  // two chains: blocks alternate
  [[maybe_unused]] __m256 acc_m = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::uint8_t* u = group + b * l.unit();
    ask_ahead<l.unit()>(u);
    const std::int8_t* x = xq + 32 * b;
    [[maybe_unused]] __m256i high;
    if constexpr (kFive) high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + l.high_bits()));
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < l.quant_bytes() / 4; ++j) {  // piece j of every row; four independent sums
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + l.head() + 32 * j));
      if constexpr (kEightBit) {
        if constexpr (kVnni) {
          s[j % 4] = dot4_acc(s[j % 4], v, broadcast4(x + 4 * j));
        } else {  // w·x as |w|·(x with w's sign), w = v − 128 (vpmaddubsw's pairs would overflow on v·x)
          const __m256i w = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
          s[j % 4] = dot4_acc(s[j % 4], _mm256_abs_epi8(w), _mm256_sign_epi8(broadcast4(x + 4 * j), w));
        }
      } else {
        __m256i q[2] = {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)};
        if constexpr (kFive)
          for (int h = 0; h < 2; ++h) q[h] = _mm256_or_si256(q[h], fifth_bit(high, 4 * h + j));
        for (int h = 0; h < 2; ++h) {
          const __m256i xb = broadcast4(x + 16 * h + 4 * j);
          s[j] = kLevels ? iq4_dot4(s[j], levels, q[h], xb) : dot4_acc(s[j], q[h], xb);
        }
      }
    }
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
    if constexpr (kCentre != 0) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(kCentre * xs[b]));  // exact
    if constexpr (kScales) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
      acc[b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, _mm256_set1_ps(dx[b])), acc[b & 1]);
    } else {
      acc[b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(dx[b]), acc[b & 1]);
    }
    if constexpr (kMin) {
      const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 16)));
      acc_m = _mm256_fmadd_ps(mn, _mm256_set1_ps(dx[b] * static_cast<float>(xs[b])), acc_m);
    }
  }
  __m256 total = _mm256_add_ps(acc[0], acc[1]);
  if constexpr (kMin) total = _mm256_add_ps(total, acc_m);
  _mm256_storeu_ps(y, total);
}

// Int4 groups of G, eight rows: y[i] = Σ_g s_ig · Σ_{b ⊂ g} dx_b · (Σ_{k ∈ b} q_ik xq_k − z_ig · Σ_{k ∈ b} xq_k),
// z = 8 without zero points. A unit is one group: the eight f32 scales, the eight zero points, then
// the nibbles in pieces of 4 (piece p: bytes 4p … 4p + 3 of every row), whose low nibbles are values
// 4p … 4p + 3 of the group and high ones G/2 + 4p …: x block p / 8 and G/64 + p / 8 of the group.
// The sums per x block are exact in int32 (|Σ| ≤ 32 · 15 · 127), and so is taking z·Σ xq off.
template <int G, bool kZero>
void group_dot_int4(const std::uint8_t* group, const BlockedActivations& a, std::int64_t m, std::int64_t ng, float* y) {
  constexpr int kBlocks = G / 32, kPieces = G / 8;
  constexpr std::int64_t kHead = kZero ? 40 : 32, kUnit = kHead + 4 * G;
  const auto [xq, dx, xs, xs16] = x_row(a, m);
  const __m256i low = _mm256_set1_epi8(15);
  __m256 out = _mm256_setzero_ps();
  for (std::int64_t g = 0; g < ng; ++g) {
    const std::uint8_t* u = group + g * kUnit;
    ask_ahead<kUnit>(u);
    const std::int8_t* x = xq + G * g;
    __m256i s[kBlocks][2];  // per x block, the low and the high nibbles' sums apart: two chains
    for (auto& sb : s) sb[0] = sb[1] = _mm256_setzero_si256();
    for (int p = 0; p < kPieces; ++p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + kHead + 32 * p));
      s[p / 8][0] = dot4_acc(s[p / 8][0], _mm256_and_si256(v, low), broadcast4(x + 4 * p));
      s[G / 64 + p / 8][1] =
          dot4_acc(s[G / 64 + p / 8][1], _mm256_and_si256(_mm256_srli_epi16(v, 4), low), broadcast4(x + G / 2 + 4 * p));
    }
    const __m256i z =
        kZero ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 32))) : _mm256_set1_epi32(8);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < kBlocks; ++b) {
      const std::int64_t xb = g * kBlocks + b;
      const __m256i sum =
          _mm256_sub_epi32(_mm256_add_epi32(s[b][0], s[b][1]), _mm256_mullo_epi32(z, _mm256_set1_epi32(xs[xb])));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(dx[xb]), acc);
    }
    out = _mm256_fmadd_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(u)), acc, out);
  }
  _mm256_storeu_ps(y, out);
}
// q4_k and q5_k, eight rows: y[i] = Σ_sb d_i·Σ_j sc_ij·dx_j·S_ij − dmin_i·Σ_j m_ij·dx_j·Σx_j, with S_ij = Σ_k q·xq
// over sub-block j (exact, and exact times sc ≤ 63: |S| ≤ 32·31·127 with q5_k's fifth bit, ORed on as bit 4).
template <bool kFive = false>
void group_dot_q4k(const std::uint8_t* group, const BlockedActivations& a, std::int64_t m, std::int64_t nsb, float* y) {
  constexpr std::int64_t kUnit = kFive ? kQ5kUnit : kQ4kUnit, kQs = q4k_quant_byte<kFive>(0, 0);
  const auto [xq, dx, xs, xs16] = x_row(a, m);
  const __m256i low = _mm256_set1_epi8(15);
  __m256 out = _mm256_setzero_ps();
  for (std::int64_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* u = group + sb * kUnit;
    ask_ahead<kUnit>(u);
    __m256 acc_d = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const std::int64_t j = 8 * sb + 2 * c;  // x's block for sub-block 2c; 2c + 1 follows it
      const std::int8_t* x = xq + 32 * j;
      __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
      [[maybe_unused]] __m256i high;
      for (int p = 0; p < 8; ++p) {  // low nibbles: sub-block 2c, high: 2c + 1; two sums each
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + kQs + 256 * c + 32 * p));
        __m256i q0 = _mm256_and_si256(v, low), q1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if constexpr (kFive) {
          if (p % 4 == 0) high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + kQ5kHigh + 64 * c + 8 * p));
          q0 = _mm256_or_si256(q0, fifth_bit(high, p % 4)), q1 = _mm256_or_si256(q1, fifth_bit(high, 4 + p % 4));
        }
        s[p & 1] = dot4_acc(s[p & 1], q0, broadcast4(x + 4 * p));
        s[2 + (p & 1)] = dot4_acc(s[2 + (p & 1)], q1, broadcast4(x + 32 + 4 * p));
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i sum = _mm256_add_epi32(s[2 * h], s[2 * h + 1]);
        auto bytes8 = [&](std::int64_t at) {
          return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + at)));
        };
        const __m256i sc = bytes8(32 + 8 * (2 * c + h)), mn = bytes8(96 + 8 * (2 * c + h));
        acc_d = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(sum, sc)), _mm256_set1_ps(dx[j + h]), acc_d);
        acc_m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mn), _mm256_set1_ps(dx[j + h] * static_cast<float>(xs[j + h])), acc_m);
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u + 16)));
    out = _mm256_fnmadd_ps(dmin, acc_m, _mm256_fmadd_ps(d, acc_d, out));
  }
  _mm256_storeu_ps(y, out);
}
// iq4_xs, eight rows: y[i] = Σ_sb d_i · Σ_j sc_ij · dx_j · S_ij, with S_ij = Σ_k T[q]·xq over
// sub-block j (exact, and exact times |sc| ≤ 32), sub-block j being x's block 8·sb + j.
void group_dot_iq4xs(const std::uint8_t* group, const BlockedActivations& a, std::int64_t m, std::int64_t nsb, float* y) {
  const auto [xq, dx, xs, xs16] = x_row(a, m);
  const __m256i low = _mm256_set1_epi8(15), table = iq4_table();
  __m256 out = _mm256_setzero_ps();
  for (std::int64_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* u = group + sb * kIq4xsUnit;
    ask_ahead<kIq4xsUnit>(u);
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const std::int64_t b = 8 * sb + j;
      const std::int8_t* x = xq + 32 * b;
      __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int p = 0; p < 4; ++p) {  // piece p of every row: values 4p … 4p + 3 (low nibbles) and 16 + 4p … (high)
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 80 + 128 * j + 32 * p));
        s[0] = iq4_dot4(s[0], table, _mm256_and_si256(v, low), broadcast4(x + 4 * p));
        s[1] = iq4_dot4(s[1], table, _mm256_and_si256(_mm256_srli_epi16(v, 4), low), broadcast4(x + 16 + 4 * p));
      }
      __m256i sum = _mm256_add_epi32(s[0], s[1]);
      if constexpr (kIq4Centre != 0) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(kIq4Centre * xs[b]));
      const __m256i sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 16 + 8 * j)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(sum, sc)), _mm256_set1_ps(dx[b]), acc);
    }
    out = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))), acc, out);
  }
  _mm256_storeu_ps(y, out);
}

// q6_k, eight rows: y[i] = Σ_sb d_i · Σ_b dx_b · Σ_{g ⊂ b} sc_ig · (S_ig − 32 · Σ_{k ∈ g} xq_k), S_ig = Σ_{k ∈ g} q·xq,
// all in int32 but the block scale dx_b and d_i.
void group_dot_q6k(const std::uint8_t* group, const BlockedActivations& a, std::int64_t m, std::int64_t nsb, float* y) {
  const auto [xq, dx, xs, xs16] = x_row(a, m);
  const __m256i low = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30), bits01 = _mm256_set1_epi8(3);
  __m256 out = _mm256_setzero_ps();
  for (std::int64_t sb = 0; sb < nsb; ++sb) {
    const std::uint8_t* u = group + sb * kQ6kUnit;
    ask_ahead<kQ6kUnit>(u);
    __m256 acc = _mm256_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const std::int64_t blk = 8 * sb + 2 * c;  // x's blocks 2c (low nibbles) and 2c + 1 (high) of the super-block
      __m256i s[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()}, {_mm256_setzero_si256(), _mm256_setzero_si256()}};
      for (int j = 0; j < 4; ++j) {  // pieces 2j and 2j + 1 share a byte of top bits; pieces 0-3 are group 0, 4-7 group 1
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + kQ6kHigh + 128 * c + 32 * j));
        const __m256i top_of[2][2] = {
            // [piece parity][nibble]: the two top bits, moved to bits 4-5
            {_mm256_slli_epi16(_mm256_and_si256(h, bits01), 4), _mm256_and_si256(_mm256_slli_epi16(h, 2), top)},
            {_mm256_and_si256(h, top), _mm256_and_si256(_mm256_srli_epi16(h, 2), top)}};
        for (int e = 0; e < 2; ++e) {
          const int p = 2 * j + e;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + kQ6kLow + 256 * c + 32 * p));
          const __m256i q0 = _mm256_or_si256(_mm256_and_si256(v, low), top_of[e][0]);
          const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), top_of[e][1]);
          s[0][j / 2] = dot4_acc(s[0][j / 2], q0, broadcast4(xq + 32 * blk + 4 * p));
          s[1][j / 2] = dot4_acc(s[1][j / 2], q1, broadcast4(xq + 32 * (blk + 1) + 4 * p));
        }
      }
      for (int b = 0; b < 2; ++b) {
        __m256i sum = _mm256_setzero_si256();
        for (int g = 0; g < 2; ++g) {
          const std::int64_t group_of_sb = 2 * (2 * c + b) + g;  // 0-15
          const __m256i sc =
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(u + 16 + 8 * group_of_sb)));
          const __m256i centred = _mm256_sub_epi32(s[b][g], _mm256_set1_epi32(32 * xs16[16 * sb + group_of_sb]));
          sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(centred, sc));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(dx[blk + b]), acc);
      }
    }
    out = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))), acc, out);
  }
  _mm256_storeu_ps(y, out);
}

// Row i's block (row order, ggml's bytes) into its place in a unit, and back. Without scales (int8
// rows) a block is its 32 bytes alone.
template <bool kEightBit, bool kScales = true>
void pack_32(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i) {
  constexpr Block32 l{kEightBit, kScales};
  constexpr std::int64_t kQs = kScales ? 2 : 0;
  if (kScales) std::memcpy(u + 2 * i, blk, 2);  // the f16 d, then the quant bytes (q8_0's as w + 128)
  for (std::int64_t t = 0; t < l.quant_bytes(); ++t) u[quant_byte(i, t, l.head())] = blk[kQs + t] ^ (kEightBit ? 0x80 : 0);
}
template <bool kEightBit, bool kScales = true>
void unpack_32(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk) {
  constexpr Block32 l{kEightBit, kScales};
  constexpr std::int64_t kQs = kScales ? 2 : 0;
  if (kScales) std::memcpy(blk, u + 2 * i, 2);
  for (std::int64_t t = 0; t < l.quant_bytes(); ++t) blk[kQs + t] = u[quant_byte(i, t, l.head())] ^ (kEightBit ? 0x80 : 0);
}
// q4_1, q5_0 and q5_1 (ggml's bytes: d, m with minimums, qh[4] with a fifth bit, qs[16]; bit v of
// qh is value v's fifth bit, value v being byte v % 16's low nibble below 16 and its high one
// from 16) into a unit, and back: the f16 d and m, the fifth bits (fifth_bit_byte), the nibbles.
template <gguf::Type F>
void pack_32_more(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i) {
  constexpr bool kMin = F != gguf::Type::Q5_0, kFive = F != gguf::Type::Q4_1;
  constexpr Block32 l{false, true, kMin, kFive};
  constexpr std::int64_t kQs = kMin ? (kFive ? 8 : 4) : 6;
  std::memcpy(u + 2 * i, blk, 2);
  if (kMin) std::memcpy(u + 16 + 2 * i, blk + 2, 2);
  if (kFive) {
    std::uint32_t qh;
    std::memcpy(&qh, blk + kQs - 4, 4);
    for (int v = 0; v < 32; ++v) {
      std::uint8_t& h = u[l.high_bits() + fifth_bit_byte(i, v % 4)];
      h = static_cast<std::uint8_t>(h | ((qh >> v) & 1) << (4 * (v / 16) + v % 16 / 4));
    }
  }
  for (std::int64_t t = 0; t < 16; ++t) u[quant_byte(i, t, l.head())] = blk[kQs + t];
}
template <gguf::Type F>
void unpack_32_more(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk) {
  constexpr bool kMin = F != gguf::Type::Q5_0, kFive = F != gguf::Type::Q4_1;
  constexpr Block32 l{false, true, kMin, kFive};
  constexpr std::int64_t kQs = kMin ? (kFive ? 8 : 4) : 6;
  std::memcpy(blk, u + 2 * i, 2);
  if (kMin) std::memcpy(blk + 2, u + 16 + 2 * i, 2);
  if (kFive) {
    std::uint32_t qh = 0;
    for (int v = 0; v < 32; ++v)
      qh |= static_cast<std::uint32_t>((u[l.high_bits() + fifth_bit_byte(i, v % 4)] >> (4 * (v / 16) + v % 16 / 4)) & 1)
            << v;
    std::memcpy(blk + kQs - 4, &qh, 4);
  }
  for (std::int64_t t = 0; t < 16; ++t) blk[kQs + t] = u[quant_byte(i, t, l.head())];
}
// Int8 rows' values, unscaled (the row's scale applies after).
void decode_i8(const std::uint8_t* u, std::int64_t i, float* out) {
  for (std::int64_t t = 0; t < 32; ++t) out[t] = static_cast<float>(static_cast<std::int8_t>(u[quant_byte(i, t, 0)] ^ 0x80));
}

// An int4 group in row order: its f32 scale, its zero point (with zero points), its G/2 bytes.
template <int G, bool kZero>
void pack_int4(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i) {
  constexpr std::int64_t kHead = kZero ? 40 : 32, kQs = kZero ? 5 : 4;
  std::memcpy(u + 4 * i, blk, 4);
  if (kZero) u[32 + i] = blk[4];
  for (std::int64_t t = 0; t < G / 2; ++t) u[quant_byte(i, t, kHead)] = blk[kQs + t];
}
template <int G, bool kZero>
void unpack_int4(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk) {
  constexpr std::int64_t kHead = kZero ? 40 : 32, kQs = kZero ? 5 : 4;
  std::memcpy(blk, u + 4 * i, 4);
  if (kZero) blk[4] = u[32 + i];
  for (std::int64_t t = 0; t < G / 2; ++t) blk[kQs + t] = u[quant_byte(i, t, kHead)];
}
// (q − z)·s for the G values of row i's group, as chapter 09's weight_value computes them.
template <int G, bool kZero>
void decode_int4(const std::uint8_t* u, std::int64_t i, float* out) {
  constexpr std::int64_t kHead = kZero ? 40 : 32;
  float s;
  std::memcpy(&s, u + 4 * i, 4);
  const int z = kZero ? u[32 + i] : 8;
  for (std::int64_t t = 0; t < G / 2; ++t) {
    const int v = u[quant_byte(i, t, kHead)];
    out[t] = static_cast<float>((v & 15) - z) * s;
    out[t + G / 2] = static_cast<float>((v >> 4) - z) * s;
  }
}
// q4_k (blk: d, dmin, scales[12], qs[128]) and q5_k (d, dmin, scales[12], qh[32], qs[128]; the
// fifth bit of sub-block 2c's value l is bit 2c of qh[l], of sub-block 2c + 1's bit 2c + 1).
template <bool kFive = false>
void pack_q4k(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i) {
  constexpr std::int64_t kQs = kFive ? 48 : 16;
  std::memcpy(u + 2 * i, blk, 2);
  std::memcpy(u + 16 + 2 * i, blk + 2, 2);
  for (int j = 0; j < 8; ++j) gguf::scale_min_k4(j, blk + 4, u[32 + 8 * j + i], u[96 + 8 * j + i]);
  for (std::int64_t t = 0; t < 128; ++t) u[q4k_quant_byte<kFive>(i, t)] = blk[kQs + t];
  if (kFive)
    for (int c = 0; c < 4; ++c)
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          std::uint8_t& b = u[kQ5kHigh + 64 * c + 32 * (l / 16) + fifth_bit_byte(i, l % 4)];
          b = static_cast<std::uint8_t>(b | ((blk[16 + l] >> (2 * c + h)) & 1) << (4 * h + l % 16 / 4));
        }
}
template <bool kFive = false>
void unpack_q4k(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk) {
  constexpr std::int64_t kQs = kFive ? 48 : 16;
  std::memcpy(blk, u + 2 * i, 2);
  std::memcpy(blk + 2, u + 16 + 2 * i, 2);
  std::uint8_t* sc = blk + 4;  // scale_min_k4's packing undone: 6-bit values, j ≥ 4 split over three bytes
  for (int j = 0; j < 4; ++j) {
    const std::uint8_t s0 = u[32 + 8 * j + i], m0 = u[96 + 8 * j + i], s1 = u[32 + 8 * (j + 4) + i],
                       m1 = u[96 + 8 * (j + 4) + i];
    sc[j] = static_cast<std::uint8_t>(s0 | (s1 >> 4) << 6);
    sc[j + 4] = static_cast<std::uint8_t>(m0 | (m1 >> 4) << 6);
    sc[j + 8] = static_cast<std::uint8_t>((s1 & 15) | (m1 & 15) << 4);
  }
  for (std::int64_t t = 0; t < 128; ++t) blk[kQs + t] = u[q4k_quant_byte<kFive>(i, t)];
  if (kFive) {
    std::memset(blk + 16, 0, 32);
    for (int c = 0; c < 4; ++c)
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const std::uint8_t b = u[kQ5kHigh + 64 * c + 32 * (l / 16) + fifth_bit_byte(i, l % 4)];
          blk[16 + l] = static_cast<std::uint8_t>(blk[16 + l] | ((b >> (4 * h + l % 16 / 4)) & 1) << (2 * c + h));
        }
  }
}
void pack_q6k(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i) {  // blk: ql[128], qh[64], scales[16], d
  std::memcpy(u + 2 * i, blk + 208, 2);
  for (int g = 0; g < 16; ++g) u[16 + 8 * g + i] = blk[192 + g];
  for (std::int64_t v = 0; v < 256; ++v) set_q6k_value(u, i, v, q6k_block_value(blk, v));
}
void unpack_q6k(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk) {
  std::memcpy(blk + 208, u + 2 * i, 2);
  for (int g = 0; g < 16; ++g) blk[192 + g] = u[16 + 8 * g + i];
  for (std::int64_t v = 0; v < 256; ++v) set_q6k_block_value(blk, v, q6k_value(u, i, v));
}

void pack_iq4xs(const std::uint8_t* blk, std::uint8_t* u, std::int64_t i) {  // blk: d, scales_h, scales_l[4], qs[128]
  std::memcpy(u + 2 * i, blk, 2);
  for (int j = 0; j < 8; ++j) u[16 + 8 * j + i] = static_cast<std::uint8_t>(gguf::scale_iq4_xs(j, blk));
  for (std::int64_t t = 0; t < 128; ++t) u[iq4xs_quant_byte(i, t)] = blk[8 + t];
}
void unpack_iq4xs(const std::uint8_t* u, std::int64_t i, std::uint8_t* blk) {
  std::memcpy(blk, u + 2 * i, 2);
  unsigned high = 0;  // scale_iq4_xs's packing undone: the low nibbles into scales_l, the top bits into scales_h
  std::memset(blk + 4, 0, 4);
  for (int j = 0; j < 8; ++j) {
    const unsigned sc = static_cast<unsigned>(static_cast<std::int8_t>(u[16 + 8 * j + i]) + 32);
    blk[4 + j / 2] = static_cast<std::uint8_t>(blk[4 + j / 2] | (sc & 15) << (4 * (j % 2)));
    high |= (sc >> 4) << (2 * j);
  }
  blk[2] = static_cast<std::uint8_t>(high & 0xFF), blk[3] = static_cast<std::uint8_t>(high >> 8);
  for (std::int64_t t = 0; t < 128; ++t) blk[8 + t] = u[iq4xs_quant_byte(i, t)];
}

template <int G, bool kZero>
Codec int4_codec() {
  return {Layout::int4_groups(G, kZero), G,
          (kZero ? 5 : 4) + G / 2,       (kZero ? 40 : 32) + 4 * G,
          pack_int4<G, kZero>,           unpack_int4<G, kZero>,
          group_dot_int4<G, kZero>,      decode_int4<G, kZero>};
}

const Codec* codec_of(const Layout& layout) {
  using T = gguf::Type;
  static const Codec codecs[] = {
      {Layout::blocks(T::Q4_0), 32, 18, Block32{false}.unit(), pack_32<false>, unpack_32<false>, group_dot<T::Q4_0>},
      {Layout::blocks(T::Q8_0), 32, 34, Block32{true}.unit(), pack_32<true>, unpack_32<true>, group_dot<T::Q8_0>},
      {Layout::blocks(T::IQ4_NL), 32, 18, Block32{false}.unit(), pack_32<false>, unpack_32<false>, group_dot<T::IQ4_NL>},
      {Layout::blocks(T::Q4_K), 256, 144, kQ4kUnit, pack_q4k, unpack_q4k, group_dot_q4k},
      {Layout::blocks(T::Q5_K), 256, 176, kQ5kUnit, pack_q4k<true>, unpack_q4k<true>, group_dot_q4k<true>},
      {Layout::blocks(T::Q4_1), 32, 20, Block32{false, true, true, false}.unit(), pack_32_more<T::Q4_1>,
       unpack_32_more<T::Q4_1>, group_dot<T::Q4_1>},
      {Layout::blocks(T::Q5_0), 32, 22, Block32{false, true, false, true}.unit(), pack_32_more<T::Q5_0>,
       unpack_32_more<T::Q5_0>, group_dot<T::Q5_0>},
      {Layout::blocks(T::Q5_1), 32, 24, Block32{false, true, true, true}.unit(), pack_32_more<T::Q5_1>,
       unpack_32_more<T::Q5_1>, group_dot<T::Q5_1>},
      {Layout::blocks(T::Q6_K), 256, 210, kQ6kUnit, pack_q6k, unpack_q6k, group_dot_q6k},
      {Layout::blocks(T::IQ4_XS), 256, 136, kIq4xsUnit, pack_iq4xs, unpack_iq4xs, group_dot_iq4xs},
      {Layout::int8_rows(), 32, 32, Block32{true, false}.unit(), pack_32<true, false>, unpack_32<true, false>,
       group_dot<T::Q8_0, false>, decode_i8},
      int4_codec<32, false>(),
      int4_codec<32, true>(),
      int4_codec<64, false>(),
      int4_codec<64, true>(),
      int4_codec<128, false>(),
      int4_codec<128, true>(),
  };
  for (const Codec& c : codecs)
    if (c.layout == layout) return &c;
  return nullptr;
}
#else
const Codec* codec_of(const Layout&) { return nullptr; }
#endif

// fn(unit, block, i) for every block of every row: the unit holding it (units: the interleaved
// bytes) and the block itself (rows: the row-order bytes), i its row within the group of eight.
template <class U, class B, class F>
void each_block(const Codec& c, std::int64_t rows, std::int64_t cols, U* units, B* row_bytes, F&& fn) {
  const std::int64_t nb = cols / c.values;
  for (std::int64_t g = 0; g < rows / 8; ++g)
    for (std::int64_t b = 0; b < nb; ++b)
      for (std::int64_t i = 0; i < 8; ++i)
        fn(units + (g * nb + b) * c.unit, row_bytes + ((8 * g + i) * nb + b) * c.block, i);
}

}  // namespace

std::string Layout::name() const {
  switch (kind) {
    case Kind::Blocks: return gguf::type_name(type);
    case Kind::Int8Rows: return "int8 rows";
    case Kind::Int4Groups:
      return "int4 groups of " + std::to_string(group) + (zero_points ? " (zero points)" : " (centred at 8)");
  }
  return "?";
}

std::int64_t Layout::row_bytes(std::int64_t cols) const {
  switch (kind) {
    case Kind::Blocks: return gguf::row_bytes(type, cols);
    case Kind::Int8Rows: return cols;
    case Kind::Int4Groups: return cols / group * ((zero_points ? 5 : 4) + group / 2);
  }
  return 0;
}

bool interleaved_kernels() { return codec_of(Layout::blocks(gguf::Type::Q4_0)) != nullptr; }

bool interleavable(const Layout& layout, std::int64_t rows, std::int64_t cols) {
  const Codec* c = codec_of(layout);
  return c != nullptr && rows % 8 == 0 && cols % c->values == 0;
}

Interleaved8::Interleaved8(const Layout& layout, std::int64_t rows, std::int64_t cols, const std::uint8_t* row_blocks,
                           const float* row_scales)
    : layout_(layout), rows_(rows), cols_(cols) {
  IL_CHECK(interleavable(layout, rows, cols),
           "interleaved blocks: need a q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, q4_k, q5_k, q6_k, iq4_xs, ",
           "int8-row or int4-group matrix with rows a multiple of 8 and whole blocks (and a CPU with AVX2), got ",
           layout.name(), " ", rows, " × ", cols);
  const Codec& c = *codec_of(layout);
  data_ = Tensor::zeros({rows_ / 8 * (cols_ / c.values) * c.unit},
                        DType::U8);  // zeros: q6_k's codec writes a few bits at a time
  each_block(c, rows_, cols_, data_.data<std::uint8_t>(), row_blocks,
             [&](std::uint8_t* u, const std::uint8_t* blk, std::int64_t i) { c.pack(blk, u, i); });
  if (layout.kind == Layout::Kind::Int8Rows) {
    IL_CHECK(row_scales != nullptr, "interleaved int8 rows: the rows' scales are missing");
    row_scales_ = Tensor::empty({rows_}, DType::F32);
    std::memcpy(row_scales_.data<float>(), row_scales, static_cast<std::size_t>(rows_) * sizeof(float));
  }
}

Tensor Interleaved8::rows_in_order() const {
  const Codec& c = *codec_of(layout_);
  Tensor bytes = Tensor::zeros({rows_ * (cols_ / c.values) * c.block}, DType::U8);
  each_block(c, rows_, cols_, data_.data<std::uint8_t>(), bytes.data<std::uint8_t>(),
             [&](const std::uint8_t* u, std::uint8_t* blk, std::int64_t i) { c.unpack(u, i, blk); });
  return bytes;
}

void Interleaved8::check_operands(const Tensor& x, const Tensor& out, const std::string& what) const {
  IL_CHECK(x.ndim() == 2 && x.dtype() == DType::F32 && x.is_contiguous() && x.device() == Device::CPU && x.size(1) == cols_,
           what, ": x must be contiguous f32 [M, ", cols_, "] on the CPU, got ", x.describe());
  IL_CHECK(out.ndim() == 2 && out.size(0) == x.size(0) && out.size(1) == rows_ && out.dtype() == DType::F32 &&
               out.is_contiguous() && out.device() == Device::CPU,
           what, ": out ", out.describe(), " should be contiguous f32 [", x.size(0), ", ", rows_, "]");
}

void Interleaved8::matmul(const Tensor& x, Tensor& out) const {
  check_operands(x, out, layout_.name() + " (interleaved) product");
  matmul(blocked_activations_fast(x), out.data<float>());
}

namespace {
// The values of block b of row n (c.values of them into out), unscaled by a row scale.
void decode_block(const Codec& c, const Layout& layout, const std::uint8_t* group, std::int64_t b, std::int64_t i,
                  float* out) {
  if (c.decode) return c.decode(group + b * c.unit, i, out);
  std::uint8_t blk[256];  // the largest block, q6_k's, is 210 bytes
  c.unpack(group + b * c.unit, i, blk);
  gguf::dequantize_block(layout.type, blk, out);
}
}  // namespace

float Interleaved8::value(std::int64_t n, std::int64_t k) const {
  const Codec& c = *codec_of(layout_);
  float v[256];  // the largest block holds 256 values
  decode_block(c, layout_, data_.data<std::uint8_t>() + n / 8 * (cols_ / c.values * c.unit), k / c.values, n % 8, v);
  const float w = v[k % c.values];
  return row_scales_.defined() ? w * row_scales_.data<float>()[n] : w;
}

void Interleaved8::matmul(const BlockedActivations& a, float* Y) const {
  const Codec& c = *codec_of(layout_);
  const std::int64_t M = a.rows, groups = rows_ / 8, units = cols_ / c.values, group_bytes = units * c.unit;
  const std::uint8_t* W = data_.data<std::uint8_t>();
  const float* row_scale = row_scales_.defined() ? row_scales_.data<float>() : nullptr;
  if (M <= kDirectRows) {
#pragma omp parallel for schedule(static) if (M * rows_ * cols_ >= kParallel)
    for (std::int64_t g = 0; g < groups; ++g)
      for (std::int64_t m = 0; m < M; ++m) {
        float y[8];
        c.dot(W + g * group_bytes, a, m, units, y);
        if (row_scale)
          for (int i = 0; i < 8; ++i) y[i] *= row_scale[8 * g + i];
        std::memcpy(Y + m * rows_ + 8 * g, y, sizeof y);
      }
    return;
  }
  // Prefill, as in row order: x rounded through its blocks times each weight row decoded to f32
  // (a block type's blocks back in ggml's bytes and through its ref:: decoder).
  decoded_matmul(
      a.rounded().data(), M, rows_, cols_,
      [&](std::int64_t n, float* w) {
    for (std::int64_t b = 0; b < units; ++b) decode_block(c, layout_, W + n / 8 * group_bytes, b, n % 8, w + b * c.values);
    if (row_scale)
      for (std::int64_t k = 0; k < cols_; ++k) w[k] *= row_scale[n];
      },
      Y);
}

}  // namespace inferlab::quant
