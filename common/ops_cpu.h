#pragma once
/// @file ops_cpu.h
/// @brief The fast CPU paths behind ops:: (inputs already checked by check::).
///
/// matmul and attention have one, and two elementwise ops of a decode step, add and swiglu, run
/// their reference expressions over the threads (the same bits). The other elementwise ops are
/// limited by memory, not arithmetic, so on CPU tensors ops:: runs their ref:: loops as they are.

#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "common/dtype.h"
#include "common/ops.h"

namespace inferlab::cpu {

/// The vector kernels of the fast paths, for other fast paths to share (chapter 12's paged attention).
namespace simd {

// SIMD through GCC/Clang vector extensions: L floats per vector (L = 8: one AVX register, two
// NEON ones; L = 16: one AVX-512 register), written once for every target instead of per-ISA
// intrinsics.
template <int L>
struct Lanes {
  typedef float f32 __attribute__((vector_size(4 * L)));
  typedef std::uint16_t u16 __attribute__((vector_size(2 * L)));
  typedef std::uint32_t u32 __attribute__((vector_size(4 * L)));
};
typedef Lanes<8>::f32 f32x8;
typedef Lanes<8>::u16 u16x8;
typedef Lanes<8>::u32 u32x8;

template <int L>
inline typename Lanes<L>::f32 load(const float* p) {
  typename Lanes<L>::f32 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// L bf16 values widened to f32: each is the top half of a float.
// (GCC builds the generic widening of 16 lanes out of 8-lane halves; AVX-512 gets its two
// instructions.)
template <int L>
inline typename Lanes<L>::f32 load(const std::uint16_t* p) {
  typename Lanes<L>::f32 v;
#if defined(__AVX512F__)
  if constexpr (L == 16) {
    const __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
    std::memcpy(&v, &w, sizeof v);
    return v;
  }
#endif
  typename Lanes<L>::u16 h;
  std::memcpy(&h, p, sizeof h);
  const typename Lanes<L>::u32 w = __builtin_convertvector(h, typename Lanes<L>::u32) << 16;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
/// IEEE binary16 weights (GGUF's F16), kept apart from bf16's uint16_t so that each widens its own way.
struct Half {
  std::uint16_t bits;
};
// L binary16 values widened to f32 (exact): F16C's vcvtph2ps, 8 or 16 at a time.
template <int L>
inline typename Lanes<L>::f32 load(const Half* p) {
  typename Lanes<L>::f32 v;
#if defined(__F16C__)
  if constexpr (L == 16) {
#if defined(__AVX512F__)
    const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    std::memcpy(&v, &w, sizeof v);
#else
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
    std::memcpy(&v, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&v) + sizeof lo, &hi, sizeof hi);
#endif
  } else {
    static_assert(L == 8, "binary16 weights load 8 or 16 lanes");
    const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    std::memcpy(&v, &w, sizeof v);
  }
#else
  for (int i = 0; i < L; ++i) v[i] = f16_to_f32(p[i].bits);
#endif
  return v;
}
inline f32x8 load8(const float* p) { return load<8>(p); }
inline f32x8 load8(const std::uint16_t* p) { return load<8>(p); }
// Eight int8 values as f32 (chapter 09's int8 rows; the scale is applied by the caller).
// (GCC compiles the generic conversion one lane at a time, so AVX2 gets its two instructions.)
inline f32x8 load8(const std::int8_t* p) {
#if defined(__AVX2__)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  typedef std::int8_t i8x8 __attribute__((vector_size(8)));
  i8x8 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, f32x8);
#endif
}
inline float widen(float v) { return v; }
inline float widen(std::uint16_t b) { return bf16_to_f32(b); }
inline float widen(std::int8_t b) { return static_cast<float>(b); }
inline float widen(Half h) { return f16_to_f32(h.bits); }

// M dot products of x's rows with each of R consecutive weight rows (w, w + K, ...): each slice
// of w is loaded once and used for all M rows of x (decode, even batched, reads the weights once).
// Independent vector accumulators (M·U per weight row) keep the multiply-adds from waiting on each
// other without spilling the vector registers. The lanes L and U depend on M only, so a row's sum
// runs in the same order whatever R is: y is the same, bit for bit. Any summation order obeys the
// reference loop's γ_K error bound. y[m·y_stride + r] gets x row m against weight row r.
//
// One row of x (plain decode) takes 16 lanes, one AVX-512 register (two AVX ones): 256 bytes of
// f32 weights an iteration in four loads, where 8 lanes needed eight (attention's short dot
// products below keep 8).
//
// The GEMV loop asks for the weights kPrefetchBytes ahead, into L2 (locality hint 2, x86's prefetcht1).
// With x's rows in the loop each cache line of w carries M multiply-adds and M loads of x, so the
// out-of-order window holds fewer lines in flight than the stream needs, and the hardware
// prefetcher alone does not keep it at the read ceiling; on the development machine's Xeon not
// even for one row (a 400 MB pass of 1024-wide f32 rows: 11.1 GB/s without, 15.7-17.4 with, against
// 17.0 for a plain sum of the same array, one thread). Into L2, not L1: a prefetch into L1 holds one
// of the core's few L1 miss buffers until its line arrives, which is what the demand loads of x and w
// wait for; one into L2 does not. On a 2-core Zen VM a 5-row pass over a 100M-parameter f32 model
// costs 1.6-1.9 one-row passes with the L1 hint and 1.0-1.4 with this one (2.4 and 1.6 on one
// core; docs/performance.md, "Prefetching into L2").
//
// R = 2 makes each load of x feed two multiply-adds. With the weights streaming, a 5-row pass
// issues M + 1 loads for M multiply-adds and the loads, not the arithmetic, hold it back; with two
// weight rows it is M + 2 loads for 2M (docs/performance.md, "Two weight rows at a time").
constexpr std::int64_t kPrefetchBytes = 16384;
/// Asks for the `bytes` bytes from p into L2 (locality hint 2, for the reason above), a cache line
/// at a time: for streams the hardware prefetcher does not follow far enough ahead on its own.
inline void ask_for(const void* p, std::int64_t bytes) {
  for (std::int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(static_cast<const char*>(p) + o, 0, 2);
}

// L weights from p as f32 (int8 rows come eight at a time).
template <int L, class W>
inline typename Lanes<L>::f32 load_weights(const W* p) {
  if constexpr (std::is_same_v<W, std::int8_t>) {
    static_assert(L == 8, "int8 weights load eight lanes");
    return load8(p);
  } else {
    return load<L>(p);
  }
}

template <int M, class W, int R = 1, int L = M == 1 && !std::is_same_v<W, std::int8_t> ? 16 : 8>
inline void dots(const float* x, std::int64_t K, const W* w, float* y, std::int64_t y_stride) {
  constexpr int U = M <= 2 ? 4 : M <= 4 ? 2 : 1;
  typedef typename Lanes<L>::f32 vec;
  vec acc[R][M][U] = {};
  std::int64_t k = 0;
  for (; k + L * U <= K; k += L * U) {
    vec wv[R][U];
    for (int r = 0; r < R; ++r) {
      if constexpr (M >= 2 || L == 16)
        ask_for(reinterpret_cast<const char*>(w + r * K + k) + kPrefetchBytes, L * U * std::int64_t{sizeof(W)});
      for (int u = 0; u < U; ++u) wv[r][u] = load_weights<L>(w + r * K + k + L * u);
    }
    for (int m = 0; m < M; ++m)
      for (int u = 0; u < U; ++u) {
        const vec xv = load<L>(x + m * K + k + L * u);
        for (int r = 0; r < R; ++r) acc[r][m][u] += xv * wv[r][u];
      }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      vec t = acc[r][m][0];
      for (int u = 1; u < U; ++u) t += acc[r][m][u];
      float s = 0.0f;
      for (int i = 0; i < L; ++i) s += t[i];
      for (std::int64_t j = k; j < K; ++j) s += x[m * K + j] * widen(w[r * K + j]);
      y[m * y_stride + r] = s;
    }
}

/// x · w over K floats, vectorised: the kernel of the fast attention paths. Eight lanes and no
/// prefetch: a head's 32 to 128 values at a time, and the next key row is not 16 KiB ahead.
inline float dot(const float* x, const float* w, std::int64_t K) {
  float y;
  dots<1, float, 1, 8>(x, K, w, &y, 1);
  return y;
}

}  // namespace simd

using simd::dot;
using simd::dots;

void matmul(const Tensor& x, const Tensor& w, Tensor& out);
/// matmul of one x by several checked weights (q, k and v; gate and up): below 8 rows of x, one
/// parallel region over the rows of all of them, each row summed as matmul sums it, so the threads
/// are woken once and a weight too small to split on its own is split with the others.
void matmuls(const Tensor& x, const std::vector<const Tensor*>& ws, const std::vector<Tensor*>& outs);
/// How matmul multiplies 8 to 32 rows of x (a batched decode step) by f32, bf16 or f16 weights:
/// `Rows`, the simple version, dots each weight row with eight x rows at a time (dots<8>);
/// `Tiles` keeps a tile of 4 weight rows × 8 x rows in 32 vector accumulators of 16 lanes, so
/// that each load feeds several multiply-adds and the arithmetic, not the loads, sets the pace.
/// `Broadcast` (f32 weights; bf16 ones take the tiles) puts the batch's rows in the lanes
/// instead: x is transposed once, and each weight is broadcast against all of them, so every
/// weight is read once, no lane sums remain, and x streams through L1 at 64 bytes per k and
/// vector. `Auto` (the default) takes the broadcast kernel from kBroadcastMinRows rows of x by
/// f32 weights and the tiles otherwise: with 8 rows half of the broadcast's lanes are empty.
/// All obey the reference loop's γ_K bound; benchmarks and tests pick one.
enum class BatchGemv { Rows, Tiles, Broadcast, Auto };
/// The version matmul uses unless set_batch_gemv chose another.
inline constexpr BatchGemv kDefaultBatchGemv = BatchGemv::Auto;
/// Where Auto changes from the tiles to the broadcast kernel. Chapter 11's engine step on the
/// 100M shape, the two alternating step by step: at 8 rows the tiles 31.5 ms against 32.6; at 9
/// the broadcast kernel 34.2 against 37.4 (the tiles' ninth row is a second pass of the rows
/// kernel), at 12 37.8 against 52.1.
inline constexpr std::int64_t kBroadcastMinRows = 9;
void set_batch_gemv(BatchGemv k);
BatchGemv batch_gemv();
/// Attention over a checked, resolved batch (a single sequence is a batch of one).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
               const AttentionParams& p);
/// Attention over the caches of a checked, resolved batch (every q_offset filled in).
void attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, Tensor& out, const AttentionParams& p);
/// A checked batch step's new keys and values into their slots (ops::store_cached).
void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v);

/// ref::add and ref::swiglu over the threads, each element by the reference's own expression (the
/// same bits), on checked tensors.
void add(const Tensor& a, const Tensor& b, Tensor& out);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);

/// y[m·y_stride] = x[m, :] · w for m < M: M dot products of length K against one f32 (or int8)
/// row, reading and widening the row once (the fast GEMV's inner kernel, for other chapters'
/// formats).
void dot_rows(const float* x, std::int64_t M, std::int64_t K, const float* w, float* y, std::int64_t y_stride);
void dot_rows(const float* x, std::int64_t M, std::int64_t K, const std::int8_t* w, float* y, std::int64_t y_stride);

/// Reads element i of a weight tensor (F32, F16 or BF16) as float.
inline float weight_at(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

}  // namespace inferlab::cpu
