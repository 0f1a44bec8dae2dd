#pragma once
// Shared helpers of the CUDA backend: error checks, the one stream and cuBLAS handle every op
// uses, a reusable scratch buffer, and block-wide reductions.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "common/error.h"

namespace inferlab::cuda {

[[noreturn]] void cuda_failed(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void cublas_failed(cublasStatus_t s, const char* what, const char* file, int line);

#define IL_CUDA(call)                                                                     \
  do {                                                                                    \
    cudaError_t il_e_ = (call);                                                           \
    if (il_e_ != cudaSuccess) ::inferlab::cuda::cuda_failed(il_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define IL_CUBLAS(call)                                                                       \
  do {                                                                                        \
    cublasStatus_t il_s_ = (call);                                                            \
    if (il_s_ != CUBLAS_STATUS_SUCCESS) ::inferlab::cuda::cublas_failed(il_s_, #call, __FILE__, __LINE__); \
  } while (0)
/// After every kernel launch: a bad launch configuration surfaces here, not later.
#define IL_CUDA_LAUNCHED() IL_CUDA(cudaGetLastError())

/// The stream all of InferLab's device work is queued on (non-default, so it can be captured
/// into a CUDA graph).
cudaStream_t stream();
/// cuBLAS handle bound to stream().
cublasHandle_t cublas();
/// A device buffer of at least `bytes`, reused between calls (grown when needed). Valid until
/// the next call; work on stream() is ordered, so reuse is safe.
void* scratch(std::size_t bytes);

inline unsigned blocks_for(long long n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

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

}  // namespace inferlab::cuda
