#pragma once
// The one GEMV family and the one RMSNorm of the CUDA backend, shared by ops:: (common/cuda/ops.cu)
// and chapter 02's fused decoder. A decode step's cost is reading the weights, so a GEMV is one
// warp per output row streaming its row in 16-byte loads, several in flight per lane.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>

#include "common/cuda/util.cuh"

namespace inferlab::cuda {

__device__ inline float to_f(float v) { return v; }
__device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_f(__half v) { return __half2float(v); }

constexpr int kGemvWarps = 8;     // warps per block: one output row per warp
constexpr int kGemvInFlight = 4;  // 16-byte weight loads each lane issues before using them

// The dot product of one 16-byte load of weights (16 / sizeof(W) of them) with the x values
// they multiply (16-byte aligned).
template <class W>
__device__ inline float dot16(const uint4& raw, const float* __restrict__ x) {
  constexpr int E = 16 / sizeof(W);
  const W* e = reinterpret_cast<const W*>(&raw);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < E / 4; ++j) {
    const float4 a = x4[j];
    acc += to_f(e[4 * j]) * a.x + to_f(e[4 * j + 1]) * a.y + to_f(e[4 * j + 2]) * a.z + to_f(e[4 * j + 3]) * a.w;
  }
  return acc;
}

/// dot(w[0:K], x[0:K]) for one warp (every lane gets it). kVec: 16-byte loads of w and x
/// (K a multiple of 16 / sizeof(W), both 16-byte aligned), kGemvInFlight of them outstanding per
/// lane; otherwise one element per lane per step.
template <class W, bool kVec>
__device__ inline float warp_dot(const W* __restrict__ w, const float* __restrict__ x, long long K, int lane) {
  constexpr int E = 16 / sizeof(W);
  float acc = 0.0f;
  if constexpr (kVec) {
    const uint4* w4 = reinterpret_cast<const uint4*>(w);
    const long long n = K / E;
    long long i = lane;
    for (; i + 32 * (kGemvInFlight - 1) < n; i += 32 * kGemvInFlight) {
      uint4 r[kGemvInFlight];
#pragma unroll
      for (int u = 0; u < kGemvInFlight; ++u) r[u] = w4[i + 32 * u];
#pragma unroll
      for (int u = 0; u < kGemvInFlight; ++u) acc += dot16<W>(r[u], x + (i + 32 * u) * E);
    }
    for (; i < n; i += 32) acc += dot16<W>(w4[i], x + i * E);
  } else {
    for (long long k = lane; k < K; k += 32) acc += to_f(w[k]) * x[k];
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

/// Up to three weight matrices [rows_i, K] stacked into one output vector (q, k and v in one
/// launch), each with an optional f32 bias.
template <class W>
struct GemvSegments {
  const W* w[3];
  const float* bias[3];
  int rows[3];
  int count;
};

/// y[row] = W[row]·x + bias[row], or y[row] += W[row]·x when `accumulate` (a residual add).
/// Launch blocks_for(total rows, kGemvWarps) blocks of kGemvWarps * 32 threads.
template <class W, bool kVec>
__global__ void gemv(GemvSegments<W> s, const float* __restrict__ x, float* y, long long K, long long total,
                     bool accumulate) {
  const long long row = static_cast<long long>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= total) return;
  // The segment holding this row, with constant indices only (indexing the parameter's arrays
  // with a variable would copy them to local memory).
  long long r = row;
  const W* w = s.w[0];
  const float* bias = s.bias[0];
  if (s.count > 1 && r >= s.rows[0]) {
    r -= s.rows[0], w = s.w[1], bias = s.bias[1];
    if (s.count > 2 && r >= s.rows[1]) r -= s.rows[1], w = s.w[2], bias = s.bias[2];
  }
  float v = warp_dot<W, kVec>(w + r * K, x, K, lane);
  if (lane == 0) {
    if (bias) v += bias[r];
    y[row] = accumulate ? y[row] + v : v;
  }
}

/// hid[row] = silu(Wg[row]·x) · (Wu[row]·x): gate, up and SwiGLU in one pass over both weights.
template <class W, bool kVec>
__global__ void gemv_swiglu(const W* __restrict__ wg, const W* __restrict__ wu, const float* __restrict__ x,
                            float* __restrict__ hid, long long F, long long K) {
  const long long row = static_cast<long long>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= F) return;
  const float g = warp_dot<W, kVec>(wg + row * K, x, K, lane);
  const float u = warp_dot<W, kVec>(wu + row * K, x, K, lane);
  if (lane == 0) hid[row] = g / (1.0f + expf(-g)) * u;
}

/// Whether the 16-byte path may read these: K a multiple of the weights per load, and every
/// pointer (the weights' first rows and x) 16-byte aligned.
template <class W>
inline bool gemv_vectorizable(long long K, const float* x, std::initializer_list<const void*> w) {
  bool ok = K % (16 / static_cast<long long>(sizeof(W))) == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  for (const void* p : w) ok = ok && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
  return ok;
}

/// Launches gemv on stream() over segments `s` (the 16-byte path where it may).
template <class W>
void launch_gemv(const GemvSegments<W>& s, const float* x, float* y, long long K, bool accumulate) {
  long long total = 0;
  for (int i = 0; i < s.count; ++i) total += s.rows[i];
  if (total == 0) return;
  const bool vec = gemv_vectorizable<W>(K, x, {s.w[0], s.w[1], s.w[2]});  // unused segments are null
  const unsigned blocks = blocks_for(total, kGemvWarps);
  if (vec) gemv<W, true><<<blocks, kGemvWarps * 32, 0, stream()>>>(s, x, y, K, total, accumulate);
  else gemv<W, false><<<blocks, kGemvWarps * 32, 0, stream()>>>(s, x, y, K, total, accumulate);
  IL_CUDA_LAUNCHED();
}

/// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) · w, one block per row.
template <class W>
__global__ void rmsnorm_rows(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out, long long D,
                             float eps) {
  const float* xr = x + blockIdx.x * D;
  float ss = 0.0f;
  for (long long i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv_rms = rsqrtf(ss / static_cast<float>(D) + eps);
  for (long long i = threadIdx.x; i < D; i += blockDim.x) out[blockIdx.x * D + i] = xr[i] * inv_rms * to_f(w[i]);
}

}  // namespace inferlab::cuda
