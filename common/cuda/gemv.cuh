#pragma once
// The one GEMV family and the one RMSNorm of the CUDA backend, shared by ops:: (common/cuda/ops.cu)
// and chapter 02's fused decoder. A decode step's cost is reading the weights: a GEMV streams
// every weight once in 16-byte loads, several in flight per lane, and the versions differ in how
// they keep enough loads in flight and where they read x from. Numbered as llm.c numbers its
// versions (cuda::GemvVersion in common/cuda/backend.h):
//
//   1 warp_row    one warp per output row, x read from global memory beside every weight load:
//                 the simple version
//   2 shared_x    x staged once per block in shared memory, 2 or 4 consecutive rows a warp (each x
//                 value read once for all of them), no more blocks than the GPU holds at once, each
//                 going on to further rows (so x is staged once per block, not once per row group),
//                 the first weight loads requested before the staging so that their latency covers
//                 it, bf16 widened by bit operations
//   3 norm_fused  version 2 whose prologue is the RMSNorm of x: the block sums x² itself, then
//                 scales x by inv_rms · the norm's weight as it stages it, so a decode step has no
//                 separate RMSNorm launch (and no normalised copy of x to write and read back)
//
// Each version serves the same three products of a decode step: up to three matrices stacked
// into one output (q, k and v; GemvSegments) with biases, a residual add into the output
// (`accumulate`), and gate/up with SwiGLU in one pass over both weights. Versions 2 and 3 index
// through common/cuda/gemv_index.h, which the CPU tests walk as the kernels do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "common/cuda/backend.h"
#include "common/cuda/gemv_index.h"
#include "common/cuda/util.cuh"

namespace inferlab::cuda {

__device__ inline float to_f(float v) { return v; }
__device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_f(__half v) { return __half2float(v); }

// --- version 1 ----------------------------------------------------------------------------------
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

/// hid[row] = silu(Wg[row]·x) · (Wu[row]·x) by version 1, on stream() (the 16-byte path where it may).
template <class W>
void launch_gemv_swiglu(const W* wg, const W* wu, const float* x, float* hid, long long F, long long K) {
  if (F == 0) return;
  const unsigned blocks = blocks_for(F, kGemvWarps);
  if (gemv_vectorizable<W>(K, x, {wg, wu}))
    gemv_swiglu<W, true><<<blocks, kGemvWarps * 32, 0, stream()>>>(wg, wu, x, hid, F, K);
  else gemv_swiglu<W, false><<<blocks, kGemvWarps * 32, 0, stream()>>>(wg, wu, x, hid, F, K);
  IL_CUDA_LAUNCHED();
}

// --- versions 2 and 3 ----------------------------------------------------------------------------
namespace staged {

// A bf16 is the top half of an f32: a pair of them in one 32-bit word widens by a shift and a mask.
__device__ inline float bf16_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ inline float bf16_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

// acc plus the dot product of one 16-byte load of weights with the x values xv they multiply.
template <class W>
__device__ inline float fma16(const uint4& raw, const float* xv, float acc) {
  const unsigned q[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<W, __nv_bfloat16>) {
      acc = fmaf(bf16_lo(q[i]), xv[2 * i], acc);
      acc = fmaf(bf16_hi(q[i]), xv[2 * i + 1], acc);
    } else if constexpr (std::is_same_v<W, __half>) {
      acc = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(q[i] & 0xffffu))), xv[2 * i], acc);
      acc = fmaf(__half2float(__ushort_as_half(static_cast<unsigned short>(q[i] >> 16))), xv[2 * i + 1], acc);
    } else {
      acc = fmaf(__uint_as_float(q[i]), xv[i], acc);
    }
  }
  return acc;
}

// xs[0, K) = x, or with kNorm x / sqrt(mean(x²) + eps) · norm (as rmsnorm_rows computes it), by
// the whole block, which it then synchronises. kVec: K a multiple of 4, x and norm 16-byte
// aligned. Each thread scales the values it staged itself, so only the sum needs the block.
template <bool kVec, bool kNorm>
__device__ inline void stage_x(const float* __restrict__ x, const float* __restrict__ norm, float eps, long long K,
                               float* xs) {
  float ss = 0.0f;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* s4 = reinterpret_cast<float4*>(xs);
    for (long long i = threadIdx.x; i < K / 4; i += blockDim.x) {
      const float4 v = x4[i];
      s4[i] = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if constexpr (kNorm) {
      const float inv_rms = rsqrtf(block_sum(ss) / static_cast<float>(K) + eps);
      const float4* g4 = reinterpret_cast<const float4*>(norm);
      for (long long i = threadIdx.x; i < K / 4; i += blockDim.x) {
        float4 v = s4[i];
        const float4 g = g4[i];
        v.x = v.x * inv_rms * g.x, v.y = v.y * inv_rms * g.y, v.z = v.z * inv_rms * g.z, v.w = v.w * inv_rms * g.w;
        s4[i] = v;
      }
    }
  } else {
    for (long long i = threadIdx.x; i < K; i += blockDim.x) {
      const float v = x[i];
      xs[i] = v;
      ss += v * v;
    }
    if constexpr (kNorm) {
      const float inv_rms = rsqrtf(block_sum(ss) / static_cast<float>(K) + eps);
      for (long long i = threadIdx.x; i < K; i += blockDim.x) xs[i] = xs[i] * inv_rms * norm[i];
    }
  }
  __syncthreads();
}

// acc[j] = Σ_k w[j][k]·xs[k] for kN rows at once, by one warp (every lane gets every sum): each
// value of x read from shared memory serves kN weights. prologue() stages xs and synchronises the
// block. On the 16-byte path (kVec: K a multiple of 16 / sizeof(W), rows 16-byte aligned) a lane
// keeps gemv_index::kLoads loads in flight over its kN rows; the first step's are requested
// before the prologue, so that their latency covers the staging, and each load slot is requested
// again for the next step as soon as it has been used.
template <class W, int kN, bool kVec, class Prologue>
__device__ inline void warp_dots(const W* const (&w)[kN], const float* xs, long long K, int lane, float (&acc)[kN],
                                 const Prologue& prologue) {
#pragma unroll
  for (int j = 0; j < kN; ++j) acc[j] = 0.0f;
  if constexpr (kVec) {
    constexpr int E = 16 / sizeof(W), U = gemv_index::unroll(kN);
    const long long n = K / E, steps = gemv_index::steps(n, U);
    uint4 r[kN][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = gemv_index::chunk(0, u, lane, U);
      if (i < n)
#pragma unroll
        for (int j = 0; j < kN; ++j) r[j][u] = __ldg(reinterpret_cast<const uint4*>(w[j]) + i);
    }
    prologue();
    for (long long step = 0; step < steps; ++step) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long i = gemv_index::chunk(step, u, lane, U);
        if (i < n) {
          float xv[E];
          const float4* x4 = reinterpret_cast<const float4*>(xs + i * E);
#pragma unroll
          for (int q = 0; q < E / 4; ++q) {
            const float4 a = x4[q];
            xv[4 * q] = a.x, xv[4 * q + 1] = a.y, xv[4 * q + 2] = a.z, xv[4 * q + 3] = a.w;
          }
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[j] = fma16<W>(r[j][u], xv, acc[j]);
        }
        const long long next = gemv_index::chunk(step + 1, u, lane, U);
        if (next < n)
#pragma unroll
          for (int j = 0; j < kN; ++j) r[j][u] = __ldg(reinterpret_cast<const uint4*>(w[j]) + next);
      }
    }
  } else {
    prologue();
    for (long long k = lane; k < K; k += 32) {
      const float xv = xs[k];
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[j] = fmaf(to_f(w[j][k]), xv, acc[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kN; ++j)
    for (int o = 16; o > 0; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
}

}  // namespace staged

/// Versions 2 and 3 of gemv: y[row] = W[row]·x' + bias[row] (or y[row] += ...), x' = x in
/// version 2 (kNorm false), x / sqrt(mean(x²) + eps) · norm in version 3. A group is kRows
/// consecutive rows for each of the block's gemv_index::kWarps warps; a block stages x' once and
/// then computes groups blockIdx.x, blockIdx.x + gridDim.x, ... (at most as many blocks as fit on
/// the GPU at once, so that staging x costs once per block, not once per group). K floats of
/// dynamic shared memory.
template <class W, int kRows, bool kVec, bool kNorm>
__global__ void __launch_bounds__(gemv_index::kWarps * 32)
    gemv_staged(GemvSegments<W> s, const float* __restrict__ x, const float* __restrict__ norm, float eps, float* y,
                long long K, long long total, bool accumulate) {
  extern __shared__ float4 staged_x[];
  float* xs = reinterpret_cast<float*>(staged_x);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const long long groups = gemv_index::groups(total, kRows);
  for (long long g = blockIdx.x; g < groups; g += gridDim.x) {  // the same groups for the whole block
    const long long first = gemv_index::first_row(g, warp, kRows);
    const W* w[kRows];
    const float* bias[kRows];
    long long local[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const long long row = gemv_index::clamp_row(first + j, total);
      // Constant indices only (a variable index into the parameter's arrays would copy them to
      // local memory).
      const int seg = gemv_index::segment_of(row, s.rows[0], s.rows[1], s.count, local[j]);
      w[j] = (seg == 0 ? s.w[0] : seg == 1 ? s.w[1] : s.w[2]) + local[j] * K;
      bias[j] = seg == 0 ? s.bias[0] : seg == 1 ? s.bias[1] : s.bias[2];
    }
    float acc[kRows];
    staged::warp_dots<W, kRows, kVec>(w, xs, K, lane, acc, [&] {
      if (g == blockIdx.x) staged::stage_x<kVec, kNorm>(x, norm, eps, K, xs);  // the block's first group
    });
#pragma unroll
    for (int j = 0; j < kRows; ++j)
      if (lane == j && first + j < total) {  // lanes 0 .. kRows − 1 store the warp's rows together
        float v = acc[j];
        if (bias[j]) v += bias[j][local[j]];
        y[first + j] = accumulate ? y[first + j] + v : v;
      }
  }
}

/// Versions 2 and 3 of gemv_swiglu: hid[row] = silu(Wg[row]·x') · (Wu[row]·x'), x' as in
/// gemv_staged; a warp reads its kRows rows of both matrices together. Launched as gemv_staged.
template <class W, int kRows, bool kVec, bool kNorm>
__global__ void __launch_bounds__(gemv_index::kWarps * 32)
    gemv_swiglu_staged(const W* __restrict__ wg, const W* __restrict__ wu, const float* __restrict__ x,
                       const float* __restrict__ norm, float eps, float* __restrict__ hid, long long F, long long K) {
  extern __shared__ float4 staged_x[];
  float* xs = reinterpret_cast<float*>(staged_x);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const long long groups = gemv_index::groups(F, kRows);
  for (long long g = blockIdx.x; g < groups; g += gridDim.x) {
    const long long first = gemv_index::first_row(g, warp, kRows);
    const W* w[2 * kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const long long row = gemv_index::clamp_row(first + j, F);
      w[2 * j] = wg + row * K, w[2 * j + 1] = wu + row * K;
    }
    float acc[2 * kRows];
    staged::warp_dots<W, 2 * kRows, kVec>(w, xs, K, lane, acc, [&] {
      if (g == blockIdx.x) staged::stage_x<kVec, kNorm>(x, norm, eps, K, xs);
    });
#pragma unroll
    for (int j = 0; j < kRows; ++j)
      if (lane == j && first + j < F) {
        const float gate = acc[2 * j], up = acc[2 * j + 1];
        hid[first + j] = gate / (1.0f + expf(-gate)) * up;
      }
  }
}

namespace staged {

inline int device_attribute(cudaDeviceAttr a) {
  int device = 0, v = 0;
  IL_CUDA(cudaGetDevice(&device));
  IL_CUDA(cudaDeviceGetAttribute(&v, a, device));
  return v;
}
// The device's SMs and the shared memory a block may ask for, read once (the process uses one device).
inline int sms() {
  static const int n = device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}
inline long long shared_limit() {
  static const long long bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return bytes;
}

// Blocks of `kernel` with `bytes` of dynamic shared memory that one SM holds at once, asked of the
// occupancy calculator once per (kernel, bytes). The first time, the kernel is also allowed all
// the shared memory a block may have beside its static arrays (block_sum's): more than the default
// 48 KiB must be asked for.
inline int resident_blocks(const void* kernel, std::size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, std::size_t>, int> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = known.try_emplace({kernel, bytes}, 0);
  if (fresh) {
    cudaFuncAttributes a{};
    IL_CUDA(cudaFuncGetAttributes(&a, kernel));
    const long long dynamic = shared_limit() - static_cast<long long>(a.sharedSizeBytes);
    IL_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic)));
    IL_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, gemv_index::kWarps * 32, bytes));
  }
  return it->second;
}

// Calls f(rows, vec, norm) with each as a compile-time constant (std::integral_constant), so that
// a launch picks its kernel among the versions' instantiations.
template <class F>
void with_variant(int rows, bool vec, bool norm, F&& f) {
  auto by_norm = [&](auto r, auto v) {
    if (norm) f(r, v, std::true_type{});
    else f(r, v, std::false_type{});
  };
  auto by_vec = [&](auto r) {
    if (vec) by_norm(r, std::true_type{});
    else by_norm(r, std::false_type{});
  };
  if (rows == 4) by_vec(std::integral_constant<int, 4>{});
  else by_vec(std::integral_constant<int, 2>{});
}

// Launches kernel over `total` rows, `rows` a warp, with x of K floats in dynamic shared memory:
// one block per group of rows, but no more blocks than the GPU holds at once.
template <class Kernel, class... Args>
void launch(Kernel* kernel, int rows, long long total, long long K, Args... args) {
  const std::size_t bytes = static_cast<std::size_t>(K) * sizeof(float);
  const int resident = resident_blocks(reinterpret_cast<const void*>(kernel), bytes);
  IL_CHECK(resident > 0, "GEMV: no block of 128 threads with ", bytes, " bytes of shared memory fits on an SM");
  const long long grid = gemv_index::grid(gemv_index::groups(total, rows), sms(), resident);
  kernel<<<static_cast<unsigned>(grid), gemv_index::kWarps * 32, bytes, stream()>>>(args...);
  IL_CUDA_LAUNCHED();
}

}  // namespace staged

/// Whether versions 2 and 3 can stage x of K floats in a block's shared memory (with room for the
/// block reduction's own): where they cannot, version 2 runs version 1 and version 3 is refused.
inline bool gemv_stages(long long K) { return K * static_cast<long long>(sizeof(float)) + 1024 <= staged::shared_limit(); }

/// Version 2 (norm null) or 3 (x normalised by norm [K] and eps first) of gemv over segments `s`,
/// on stream(); the 16-byte path where it may.
template <class W>
void launch_gemv_staged(const GemvSegments<W>& s, const float* x, float* y, long long K, bool accumulate,
                        const float* norm = nullptr, float eps = 0.0f) {
  long long total = 0;
  for (int i = 0; i < s.count; ++i) total += s.rows[i];
  if (total == 0) return;
  if (!gemv_stages(K)) {
    IL_CHECK(!norm, "GEMV version 3: x of ", K, " floats does not fit in a block's shared memory (", staged::shared_limit(),
             " bytes); normalise it first and run version 2");
    return launch_gemv(s, x, y, K, accumulate);
  }
  const bool vec = gemv_vectorizable<W>(K, x, {s.w[0], s.w[1], s.w[2], norm});  // unused pointers are null
  const int rows = gemv_index::rows_per_warp(total, staged::sms());
  staged::with_variant(rows, vec, norm != nullptr, [&](auto r, auto v, auto n) {
    staged::launch(gemv_staged<W, decltype(r)::value, decltype(v)::value, decltype(n)::value>, rows, total, K, s, x, norm,
                   eps, y, K, total, accumulate);
  });
}

/// hid[row] = silu(Wg[row]·x) · (Wu[row]·x) by version 2 (norm null) or 3 (x normalised by norm
/// and eps first), on stream().
template <class W>
void launch_gemv_swiglu_staged(const W* wg, const W* wu, const float* x, float* hid, long long F, long long K,
                               const float* norm = nullptr, float eps = 0.0f) {
  if (F == 0) return;
  if (!gemv_stages(K)) {
    IL_CHECK(!norm, "GEMV version 3: x of ", K, " floats does not fit in a block's shared memory (", staged::shared_limit(),
             " bytes); normalise it first and run version 2");
    return launch_gemv_swiglu(wg, wu, x, hid, F, K);
  }
  const bool vec = gemv_vectorizable<W>(K, x, {wg, wu, norm});
  const int rows = gemv_index::rows_per_warp(F, staged::sms());
  staged::with_variant(rows, vec, norm != nullptr, [&](auto r, auto v, auto n) {
    staged::launch(gemv_swiglu_staged<W, decltype(r)::value, decltype(v)::value, decltype(n)::value>, rows, F, K, wg, wu, x,
                   norm, eps, hid, F, K);
  });
}

/// The GEMV over segments `s` by `version` (version 3 needs `norm`, the others take none).
template <class W>
void launch_gemv(GemvVersion version, const GemvSegments<W>& s, const float* x, float* y, long long K, bool accumulate,
                 const float* norm = nullptr, float eps = 0.0f) {
  IL_CHECK((version == GemvVersion::NormFused) == (norm != nullptr), "GEMV version ", gemv_version_name(version),
           ": version 3 needs the RMSNorm's weight, the others take none");
  if (version == GemvVersion::WarpRow) return launch_gemv(s, x, y, K, accumulate);
  launch_gemv_staged(s, x, y, K, accumulate, norm, eps);
}

/// The gate/up product with SwiGLU by `version` (version 3 needs `norm`, the others take none).
template <class W>
void launch_gemv_swiglu(GemvVersion version, const W* wg, const W* wu, const float* x, float* hid, long long F, long long K,
                        const float* norm = nullptr, float eps = 0.0f) {
  IL_CHECK((version == GemvVersion::NormFused) == (norm != nullptr), "GEMV version ", gemv_version_name(version),
           ": version 3 needs the RMSNorm's weight, the others take none");
  if (version == GemvVersion::WarpRow) return launch_gemv_swiglu(wg, wu, x, hid, F, K);
  launch_gemv_swiglu_staged(wg, wu, x, hid, F, K, norm, eps);
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
