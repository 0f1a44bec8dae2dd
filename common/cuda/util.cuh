#pragma once
// Shared helpers of the CUDA backend: error checks, the one stream and cuBLAS handle every op
// uses, a reusable scratch buffer, and block-wide reductions.
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <cstddef>

#include "common/error.h"

namespace inferlab::cuda {

[[noreturn]] void cuda_failed(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void cublas_failed(cublasStatus_t s, const char* what, const char* file, int line);

#define IL_CUDA(call)                                                                          \
  do {                                                                                         \
    cudaError_t il_e_ = (call);                                                                \
    if (il_e_ != cudaSuccess) ::inferlab::cuda::cuda_failed(il_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define IL_CUBLAS(call)                                                                                    \
  do {                                                                                                     \
    cublasStatus_t il_s_ = (call);                                                                         \
    if (il_s_ != CUBLAS_STATUS_SUCCESS) ::inferlab::cuda::cublas_failed(il_s_, #call, __FILE__, __LINE__); \
  } while (0)
/// Counts one kernel launch (cuda::launches()): IL_CUDA_LAUNCHED does after every launch.
void count_launch();
/// After every kernel launch: a bad launch configuration surfaces here, not later; and the launch
/// is counted.
#define IL_CUDA_LAUNCHED()            \
  do {                                \
    IL_CUDA(cudaGetLastError());      \
    ::inferlab::cuda::count_launch(); \
  } while (0)

/// The stream all of InferLab's device work is queued on (non-default, so it can be captured
/// into a CUDA graph).
cudaStream_t stream();
/// cuBLAS handle bound to stream().
cublasHandle_t cublas();
/// A device buffer of at least `bytes`, reused between calls (grown when needed). Valid until
/// the next call; work on stream() is ordered, so reuse is safe.
void* scratch(std::size_t bytes);

inline unsigned blocks_for(long long n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

/// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024). All threads get it.
__device__ inline float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Maximum of `v` over the block; same rules as block_sum.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// The argmax order: NaN largest, ties to the lower index; the same order as ops::argmax on the CPU.
/// Σ_{j<n} w[j] · row(j), added in order of j, four values row(j) loaded before they are used: one
/// thread's output dimension over a chunk's value rows in split-K attention (the loads, not the
/// arithmetic, are the cost, so several are kept in flight).
template <class Row>
__device__ inline float weighted_rows(const float* w, int n, Row row) {
  float a = 0.0f;
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    float x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = row(j + u);
#pragma unroll
    for (int u = 0; u < 4; ++u) a += w[j + u] * x[u];
  }
  for (; j < n; ++j) a += w[j] * row(j);
  return a;
}

__device__ inline bool argmax_beats(float a, int ia, float b, int ib) {
  const bool na = isnan(a), nb = isnan(b);
  if (na || nb) return na && (!nb || ia < ib);
  return a > b || (a == b && ia < ib);
}

/// Index of the largest of x[0, n) in argmax_beats order, computed by the whole block
/// (blockDim.x a power of two, at most 1024). All threads get it.
__device__ inline int block_argmax(const float* __restrict__ x, long long n) {
  __shared__ float sv[1024];
  __shared__ int si[1024];
  float best = x[0];
  int bi = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x)
    if (argmax_beats(x[i], static_cast<int>(i), best, bi)) best = x[i], bi = static_cast<int>(i);
  sv[threadIdx.x] = best, si[threadIdx.x] = bi;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && argmax_beats(sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x]))
      sv[threadIdx.x] = sv[threadIdx.x + s], si[threadIdx.x] = si[threadIdx.x + s];
    __syncthreads();
  }
  return si[0];
}

}  // namespace inferlab::cuda
