#pragma once
/// @file gemv_q.h
/// @brief The layout and the integer arithmetic of the quantised GEMV's version 2
/// (common/quant/gemv_q.cuh), as plain C++ marked IL_HD: the CPU repacks the weights with these
/// functions before they go to the GPU, the kernels unpack and multiply with them, and a CPU test
/// checks both against the formats' own decoders.
///
/// A decode step reads every weight once, so the GEMV runs at the speed of its loads. GGUF's
/// blocks keep each block's f16 scale beside its quants (34 bytes for q8_0, 18 for q4_0): a lane
/// reading them issues unaligned byte and 2-byte loads. Version 2 keeps a row's quants in one
/// contiguous, 16-byte aligned run and the scales in an array of their own, so a lane reads its
/// quants with one 16-byte load (LDG.128) at a time:
///
///   8-bit (int8_row, q8_0)   a 16-byte load holds 16 int8 quants: half a block of 32
///   4-bit (q4_0, int4, q4_k) a 16-byte load holds one block of 32: byte i holds value i in its
///                            low nibble and value i + 16 in its high one (q4_0's order)
///
/// x is quantised per block of 32 as q8_0 does (the f16 scale d = max |x| / 127, 32 int8 values,
/// and their sum), so a block's products are int8 · int8 sums in int32 (dp4a: four at a time).
/// q4_k's super-blocks of 256 become eight such blocks, each with its 6-bit scale and min
/// unpacked into two bytes, and the super-block's f16 d and dmin kept apart.
/// Nibbles unpack with two bit operations a 32-bit word (q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F),
/// and the 4-bit formats' offset (8, or int4_asym's zero point z) is subtracted once a block
/// through x's block sum: Σ (q − z)·x = Σ q·x − z·Σ x.

#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/host_device.h"
#include "common/quant/format.h"

namespace inferlab::quant::qgemv {

/// The formats version 2 multiplies (chapter 09's int8_row, q8_0, q4_0, int4_gG_sym, int4_gG_asym, q4_k).
/// The formats version 2 multiplies (int8_row, q8_0, q4_0, int4 sym and asym, q4_k): of the one list.
using Kind = Format;

/// Whether a kind's quants are 4-bit (one block of 32 per 16-byte load) or 8-bit (half a block).
IL_HD constexpr bool four_bit(Kind k) { return k != Kind::Int8Row && k != Kind::Q8_0; }
/// f16 scales a row of K values keeps in the layout: one a block (q8_0, q4_0), d and dmin a
/// super-block of 256 (q4_k), none (int8_row and int4 keep chapter 09's f32 scales).
IL_HD constexpr long long half_scales(Kind k, long long K) {
  return k == Kind::Q8_0 || k == Kind::Q4_0 ? K / 32 : k == Kind::Q4_K ? K / 256 * 2 : 0;
}
/// Bytes of sub-block scales a row keeps: q4_k's 6-bit scale and min of each block of 32, a byte each.
IL_HD constexpr long long sub_scale_bytes(Kind k, long long K) { return k == Kind::Q4_K ? K / 32 * 2 : 0; }
/// Values per 16-byte load of quants.
IL_HD constexpr int unit_values(Kind k) { return four_bit(k) ? 32 : 16; }
/// Bytes of quants per row of K values.
IL_HD constexpr long long row_bytes(Kind k, long long K) { return four_bit(k) ? K / 2 : K; }

/// Value i (0 ≤ i < 32) of a 4-bit run of 16 bytes: the low nibble of byte i, or the high nibble
/// of byte i − 16.
IL_HD inline int run_nibble(const std::uint8_t* run, int i) { return i < 16 ? run[i] & 15 : run[i - 16] >> 4; }

/// Value e of an int4 group of G values as chapter 09 stores it (byte e of the group holds value e
/// in its low nibble and value e + G/2 in its high one).
IL_HD inline int group_nibble(const std::uint8_t* group, int G, int e) {
  return e < G / 2 ? group[e] & 15 : group[e - G / 2] >> 4;
}

/// Block j (values 32j .. 32j + 31) of an int4 group of G values, as a run. For G = 32 the group
/// already is one.
IL_HD inline void int4_run(const std::uint8_t* group, int G, int j, std::uint8_t* run) {
  for (int i = 0; i < 16; ++i)
    run[i] = static_cast<std::uint8_t>(group_nibble(group, G, 32 * j + i) | (group_nibble(group, G, 32 * j + 16 + i) << 4));
}

/// A GGUF block of `bytes` bytes (q8_0: 34, q4_0: 18) split into its f16 scale's bits and its
/// quants (32 int8, or a run of 16 bytes: q4_0 already stores its nibbles in run order).
IL_HD inline void split_block(const std::uint8_t* block, int bytes, std::uint8_t* quants, std::uint16_t* d) {
  *d = static_cast<std::uint16_t>(block[0] | (block[1] << 8));
  for (int i = 2; i < bytes; ++i) quants[i - 2] = block[i];
}

/// c + the four products of the signed bytes of a and b: __dp4a on the GPU, a loop on the CPU.
IL_HD inline int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int>(static_cast<std::int8_t>(static_cast<unsigned>(a) >> (8 * i))) *
         static_cast<int>(static_cast<std::int8_t>(static_cast<unsigned>(b) >> (8 * i)));
  return c;
#endif
}

/// Σ w_i · x_i over one 8-bit load: 16 int8 quants (four words) times 16 int8 values of x.
IL_HD inline int dot_int8_unit(const unsigned (&w)[4], const int (&x)[4]) {
  int s = 0;
  for (int t = 0; t < 4; ++t) s = dp4a(static_cast<int>(w[t]), x[t], s);
  return s;
}

/// Σ q_i · x_i over one 4-bit load: the 32 nibbles q of a run (four words) times a block of x,
/// values 0 .. 15 in x[0 .. 3] and 16 .. 31 in x[4 .. 7]. The nibbles are unsigned (0 .. 15): the
/// caller subtracts the offset through x's block sum.
IL_HD inline int dot_nibble_unit(const unsigned (&w)[4], const int (&x)[8]) {
  int s = 0;
  for (int t = 0; t < 4; ++t) {
    s = dp4a(static_cast<int>(w[t] & 0x0F0F0F0Fu), x[t], s);
    s = dp4a(static_cast<int>((w[t] >> 4) & 0x0F0F0F0Fu), x[4 + t], s);
  }
  return s;
}

/// Whether version 2 reads a copy of the quants (repack()) rather than chapter 09's data itself:
/// int8_row's rows and int4's groups of 32 already are runs of 16-byte loads.
IL_HD constexpr bool repacked(Kind k, int G) {
  return k == Kind::Q8_0 || k == Kind::Q4_0 || k == Kind::Q4_K || ((k == Kind::Int4Sym || k == Kind::Int4Asym) && G != 32);
}

/// Sub-block s (0-7) of a q4_k super-block of 144 bytes (f16 d, f16 dmin, 12 bytes of packed 6-bit
/// scales and mins, 128 bytes of nibbles: 32 bytes hold sub-block 2j in their low nibbles and
/// 2j + 1 in their high ones) as a run, with its scale and min (gguf::scale_min_k4's unpacking).
IL_HD inline void q4_k_run(const std::uint8_t* sb, int s, std::uint8_t* run, std::uint8_t* sc, std::uint8_t* m) {
  const std::uint8_t* q = sb + 4;
  if (s < 4) {
    *sc = q[s] & 63, *m = q[s + 4] & 63;
  } else {
    *sc = static_cast<std::uint8_t>((q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((q[s + 4] >> 4) | ((q[s] >> 6) << 4));
  }
  const std::uint8_t* qs = sb + 16 + 32 * (s / 2);
  const int shift = 4 * (s % 2);
  for (int i = 0; i < 16; ++i)
    run[i] = static_cast<std::uint8_t>(((qs[i] >> shift) & 15) | (((qs[16 + i] >> shift) & 15) << 4));
}

/// The weights as version 2 reads them: device pointers in the kernels, host pointers in the tests.
struct Weights {
  const std::uint8_t* quants;  ///< row n at quants + n · row_bytes(kind, K), 16-byte aligned
  const std::uint16_t* d;      ///< q8_0, q4_0: f16 bits per block of 32 [N, K / 32]; q4_k: d, dmin [N, K / 256, 2]
  const std::uint8_t* sub;     ///< q4_k: each block's 6-bit scale and min [N, K / 32, 2]
  const float* scales;         ///< int8_row: one per row; int4: one per group [N, K / G]
  const std::uint8_t* zeros;   ///< int4_asym: one per group
  int K, G;
};

/// The float of f16 bits.
IL_HD inline float half_value(std::uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return f16_to_f32(h);
#endif
}

/// The block of 32 that load i of a row lies in.
IL_HD constexpr long long block_of(Kind k, long long i) { return four_bit(k) ? i : i / 2; }

/// What row n's block b multiplies its integer sum by: the scale (1 for int8_row, whose row scale
/// multiplies at the end), the integer offset of the 4-bit quants (8, int4_asym's zero point; 0
/// for q4_k) and q4_k's minimum (dmin · m; 0 elsewhere).
struct BlockScale {
  float scale, minimum;
  int offset;
};
IL_HD inline BlockScale block_scale(Kind k, const Weights& w, long long n, long long b) {
  const long long blk = n * (w.K / 32) + b;
  switch (k) {
    case Kind::Int8Row: return {1.0f, 0.0f, 0};
    case Kind::Q8_0: return {half_value(w.d[blk]), 0.0f, 0};
    case Kind::Q4_0: return {half_value(w.d[blk]), 0.0f, 8};
    case Kind::Q4_K: {  // (d · sc) and (dmin · m), as gguf's decoder forms them
      const long long o = 2 * (n * (w.K / 256) + b / 8);
      return {half_value(w.d[o]) * static_cast<float>(w.sub[2 * blk]),
              half_value(w.d[o + 1]) * static_cast<float>(w.sub[2 * blk + 1]), 0};
    }
    default: break;  // int4, sym and asym
  }
  const long long g = n * (w.K / w.G) + b * 32 / w.G;
  return {w.scales[g], 0.0f, k == Kind::Int4Asym ? static_cast<int>(w.zeros[g]) : 8};
}

/// acc plus one load's products: the quants wv (four words) times x's values xv (16 int8 in
/// xv[0 .. 3], or a block of 32 in xv[0 .. 7] for the 4-bit kinds), dx and sx the scale and sum of
/// x's block. The integer sum is exact; it is scaled once (and q4_k's minimum taken off once).
IL_HD inline float unit_fma(Kind k, const unsigned (&wv)[4], const int (&xv)[8], const BlockScale& s, float dx, int sx,
                            float acc) {
  int isum;
  if (four_bit(k)) {
    isum = dot_nibble_unit(wv, xv) - s.offset * sx;
  } else {
    const int x4[4] = {xv[0], xv[1], xv[2], xv[3]};
    isum = dot_int8_unit(wv, x4);
  }
  acc = fmaf(s.scale * dx, static_cast<float>(isum), acc);
  if (k == Kind::Q4_K) acc = fmaf(-(s.minimum * dx), static_cast<float>(sx), acc);
  return acc;
}

/// Version 2's layout of a [rows, cols] matrix: `quants` (row_bytes(k, cols) bytes a row),
/// `scales` (half_scales(k, cols) f16s' bits a row) and `sub` (sub_scale_bytes(k, cols) a row: q4_k's
/// scale and min of each block); int8_row and int4 keep their f32 scales (and zero points) where
/// chapter 09 stores them. `packed` is the matrix's data as chapter 09 stores it. cols is a multiple
/// of 32 (and of G, and of 256 for q4_k).
inline void repack(Kind k, int G, const std::uint8_t* packed, long long rows, long long cols, std::uint8_t* quants,
                   std::uint16_t* scales, std::uint8_t* sub) {
  const long long nb = cols / 32;
  for (long long n = 0; n < rows; ++n)
    for (long long b = 0; b < nb; ++b) {
      const long long blk = n * nb + b;
      switch (k) {
        case Kind::Int8Row: std::memcpy(quants + blk * 32, packed + blk * 32, 32); break;
        case Kind::Q8_0: split_block(packed + blk * 34, 34, quants + blk * 32, scales + blk); break;
        case Kind::Q4_0: split_block(packed + blk * 18, 18, quants + blk * 16, scales + blk); break;
        case Kind::Int4Sym:
        case Kind::Int4Asym: {
          const long long g = b * 32 / G, j = b % (G / 32);  // group of the row, block within it
          int4_run(packed + n * (cols / 2) + g * (G / 2), G, static_cast<int>(j), quants + blk * 16);
          break;
        }
        case Kind::Q4_K: {
          const std::uint8_t* sb = packed + (n * (cols / 256) + b / 8) * 144;
          q4_k_run(sb, static_cast<int>(b % 8), quants + blk * 16, sub + 2 * blk, sub + 2 * blk + 1);
          if (b % 8 == 0) {  // the super-block's d and dmin
            const long long o = 2 * (n * (cols / 256) + b / 8);
            scales[o] = static_cast<std::uint16_t>(sb[0] | (sb[1] << 8));
            scales[o + 1] = static_cast<std::uint16_t>(sb[2] | (sb[3] << 8));
          }
          break;
        }
        default: break;  // not a format of version 2 (qgemv_kind() has none for it)
      }
    }
}

}  // namespace inferlab::quant::qgemv
