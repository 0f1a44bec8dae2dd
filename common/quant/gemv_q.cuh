#pragma once
// Version 2 of the quantised GEMV (the layout and the integer arithmetic in common/quant/gemv_q.h):
// x quantised per block of 32 by a small kernel (a warp a block), then a warp computes R
// consecutive output rows, each lane keeping gemv_index::kLoads 16-byte loads of quants in flight
// over its rows (as the bf16 GEMV's version 2 does), every load one unit of the row: 16 int8
// quants, or a block of 32 nibbles. The int8 products of a unit sum in int32 by dp4a; the scales
// multiply once per unit. Include it in one .cu file (chapter 09's quant_cuda.cu).
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/backend.h"
#include "common/cuda/gemv_index.h"
#include "common/cuda/util.cuh"
#include "common/quant/gemv_q.h"

namespace inferlab::quant::qgemv {

// x [M, K] as blocks of 32 (device pointers): int8 values, each block's scale (its f16 as a
// float) and the sum of its values.
struct XBlocks {
  const std::int8_t* q;
  const float* d;
  const int* sum;
};

// x into blocks of 32 as the CPU's quantiser makes them (quant::blocked_activations_fast): d =
// max |x| / 127 rounded to f16, q = round(x · (1 / d)) with halves away from zero (0 where 1 / d
// is not finite), a warp a block (blocks: M · K / 32).
__global__ void __launch_bounds__(128) quantize_x(const float* __restrict__ x, long long blocks, std::int8_t* __restrict__ q,
                                                  float* __restrict__ d, int* __restrict__ sum) {
  const long long b = blockIdx.x * 4LL + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (b >= blocks) return;
  const float v = x[b * 32 + lane];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float dv = amax / 127.0f;
  float id = dv != 0.0f ? 1.0f / dv : 0.0f;
  id = isfinite(id) ? id : 0.0f;
  const int qv = static_cast<int>(roundf(v * id));
  q[b * 32 + lane] = static_cast<std::int8_t>(qv);
  int s = qv;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) d[b] = __half2float(__float2half_rn(dv)), sum[b] = s;
}

// The int8 values of x that unit i of a row multiplies (row m of x): 16 (8-bit units) or 32
// (4-bit units, values 0 .. 15 in v[0 .. 3] and 16 .. 31 in v[4 .. 7]), as 16-byte loads.
template <bool kFour>
__device__ inline void x_unit(const std::int8_t* xm, long long i, int (&v)[8]) {
  const int4* p = reinterpret_cast<const int4*>(xm) + (kFour ? 2 * i : i);
  const int4 a = __ldg(p);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  if constexpr (kFour) {
    const int4 b = __ldg(p + 1);
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// y[m, n] = Σ_k x̂[m, k] · w(n, k) for rows n of the block's warps and the first M ≤ kM rows of
// x̂ (x's blocks). A warp computes R consecutive rows (the last row again past the end, its
// result not written); launch gemv_index::groups(N, R) blocks of gemv_index::kWarps · 32 threads.
template <Kind T, int R, int kM>
__global__ void __launch_bounds__(cuda::gemv_index::kWarps * 32)
    gemv_v2(Weights w, XBlocks x, float* __restrict__ y, int M, int N) {
  constexpr bool kFour = four_bit(T);
  // Loads in flight a row: gemv_index::kLoads shared among the R rows, halved where up to 8 rows of
  // x keep their sums beside them (the registers would spill).
  constexpr int U = kM == 1 ? cuda::gemv_index::unroll(R) : (cuda::gemv_index::unroll(R) + 1) / 2;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const long long first = cuda::gemv_index::first_row(blockIdx.x, warp, R);
  if (first >= N) return;  // no block-wide synchronisation follows
  const int K = w.K, nb = K / 32;
  const long long units = K / unit_values(T), steps = cuda::gemv_index::steps(units, U);
  long long n[R];
  const uint4* q[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    n[j] = cuda::gemv_index::clamp_row(first + j, N);
    q[j] = reinterpret_cast<const uint4*>(w.quants + n[j] * row_bytes(T, K));
  }
  float acc[kM][R];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int j = 0; j < R; ++j) acc[m][j] = 0.0f;
  uint4 r[R][U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const long long i = cuda::gemv_index::chunk(0, u, lane, U);
    if (i < units)
#pragma unroll
      for (int j = 0; j < R; ++j) r[j][u] = __ldg(q[j] + i);
  }
  for (long long step = 0; step < steps; ++step) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = cuda::gemv_index::chunk(step, u, lane, U);
      if (i < units) {
        const long long b = block_of(T, i);
        BlockScale sc[R];
#pragma unroll
        for (int j = 0; j < R; ++j) sc[j] = block_scale(T, w, n[j], b);
#pragma unroll
        for (int m = 0; m < kM; ++m)
          if (m < M) {
            int xv[8] = {};
            x_unit<kFour>(x.q + static_cast<long long>(m) * K, i, xv);
            const float dx = x.d[static_cast<long long>(m) * nb + b];
            const int sx = kFour ? x.sum[static_cast<long long>(m) * nb + b] : 0;
#pragma unroll
            for (int j = 0; j < R; ++j) {
              const unsigned wv[4] = {r[j][u].x, r[j][u].y, r[j][u].z, r[j][u].w};
              acc[m][j] = unit_fma(T, wv, xv, sc[j], dx, sx, acc[m][j]);
            }
          }
      }
      const long long next = cuda::gemv_index::chunk(step + 1, u, lane, U);
      if (next < units)
#pragma unroll
        for (int j = 0; j < R; ++j) r[j][u] = __ldg(q[j] + next);
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int j = 0; j < R; ++j) {
      float s = acc[m][j];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (T == Kind::Int8Row) s *= w.scales[n[j]];
      if (m < M && lane == j && first + j < N) y[static_cast<long long>(m) * N + first + j] = s;
    }
}

namespace detail {
inline int sms() {
  static const int count = [] {
    int device = 0, v = 0;
    IL_CUDA(cudaGetDevice(&device));
    IL_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
    return v;
  }();
  return count;
}

template <Kind T, int R, int kM>
void launch(const Weights& w, const XBlocks& x, float* y, int M, int N) {
  gemv_v2<T, R, kM>
      <<<static_cast<unsigned>(cuda::gemv_index::groups(N, R)), cuda::gemv_index::kWarps * 32, 0, cuda::stream()>>>(w, x, y,
                                                                                                                    M, N);
  IL_CUDA_LAUNCHED();
}
}  // namespace detail

// y [M, N] = x̂ · Wᵀ by version 2, x [M, K] f32 on the device (x̂: its blocks of 32), on
// cuda::stream(). Scratch: cuda::scratch. One launch for M = 1 (decode), else launches of up to 8
// rows of x each.
template <Kind T>
void gemv(const Weights& w, const float* x, int M, float* y, int N) {
  const long long K = w.K, blocks = static_cast<long long>(M) * (K / 32);
  // x's values, then its scales and sums (M · K bytes is a multiple of 32: the floats stay aligned).
  auto* base = static_cast<std::uint8_t*>(cuda::scratch(static_cast<std::size_t>(blocks) * (32 + 8)));
  auto* xq = reinterpret_cast<std::int8_t*>(base);
  auto* xd = reinterpret_cast<float*>(base + blocks * 32);
  auto* xs = reinterpret_cast<int*>(base + blocks * 36);
  quantize_x<<<cuda::blocks_for(blocks, 4), 128, 0, cuda::stream()>>>(x, blocks, xq, xd, xs);
  IL_CUDA_LAUNCHED();
  // 4 rows a warp where that leaves every SM two groups, else 2 (gemv_index::rows_per_warp).
  const bool four = cuda::gemv_index::rows_per_warp(N, detail::sms()) == 4;
  for (int m0 = 0; m0 < M; m0 += 8) {
    const int rows = M - m0 < 8 ? M - m0 : 8;
    const long long o = static_cast<long long>(m0) * (K / 32);
    const XBlocks xb{xq + o * 32, xd + o, xs + o};
    float* ym = y + static_cast<long long>(m0) * N;
    if (rows == 1) four ? detail::launch<T, 4, 1>(w, xb, ym, 1, N) : detail::launch<T, 2, 1>(w, xb, ym, 1, N);
    else four ? detail::launch<T, 4, 8>(w, xb, ym, rows, N) : detail::launch<T, 2, 8>(w, xb, ym, rows, N);
  }
}

}  // namespace inferlab::quant::qgemv
