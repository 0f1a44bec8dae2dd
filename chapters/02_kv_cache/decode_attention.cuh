#pragma once
// Chapter 02's decode attention over the cache, split into chunks (flash-decoding). A header
// so that chapter 03 can run the same kernels (and compare its grouped kernel against them).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda/util.cuh"
#include "common/tensor.h"

namespace inferlab::ch02 {
namespace {

constexpr int kChunk = 256;  // attention positions per split
constexpr int kAttnThreads = 128;
constexpr int kMaxHead = 256;

// Flash-decoding, part 1: one block per (query head, chunk of kChunk positions) computes the
// chunk's softmax statistics (max m, sum l) and unnormalised output acc = Σ e^(s−m) v.
__global__ void attention_partial(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                                  const int* __restrict__ pos_p, float* __restrict__ pm, float* __restrict__ pl,
                                  float* __restrict__ pacc, int N, int Kh, int H, float scale) {
  __shared__ float qs[kMaxHead];
  __shared__ float sc[kChunk];
  const int h = blockIdx.x, c = blockIdx.y, splits = gridDim.y, slot = h * splits + c;
  const int len = *pos_p + 1, start = c * kChunk, end = min(start + kChunk, len);
  if (start >= len) {  // this chunk is past the sequence: contributes nothing
    if (threadIdx.x == 0) pm[slot] = -INFINITY, pl[slot] = 0.0f;
    for (int d = threadIdx.x; d < H; d += blockDim.x) pacc[static_cast<long long>(slot) * H + d] = 0.0f;
    return;
  }
  const int kvh = h / (N / Kh), n = end - start, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int d = threadIdx.x; d < H; d += blockDim.x) qs[d] = q[h * H + d] * scale;
  __syncthreads();
  for (int j = warp; j < n; j += blockDim.x / 32) {  // a warp per key: coalesced reads of its row
    const float* kr = kc + (static_cast<long long>(start + j) * Kh + kvh) * H;
    float dot = 0.0f;
    for (int d = lane; d < H; d += 32) dot += qs[d] * kr[d];
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) sc[j] = dot;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sc[j]);
  mx = cuda::block_max(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) sum += (sc[j] = expf(sc[j] - mx));
  sum = cuda::block_sum(sum);  // synchronises: sc[] holds the weights
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float a = 0.0f;
    for (int j = 0; j < n; ++j) a += sc[j] * vc[(static_cast<long long>(start + j) * Kh + kvh) * H + d];
    pacc[static_cast<long long>(slot) * H + d] = a;
  }
  if (threadIdx.x == 0) pm[slot] = mx, pl[slot] = sum;
}

// Flash-decoding, part 2: rescale each chunk by e^(m_c − M) and normalise by the total sum.
__global__ void attention_merge(const float* __restrict__ pm, const float* __restrict__ pl, const float* __restrict__ pacc,
                                float* __restrict__ out, int splits, int H) {
  const int h = blockIdx.x;
  float M = -INFINITY;
  for (int c = 0; c < splits; ++c) M = fmaxf(M, pm[h * splits + c]);
  float L = 0.0f;
  for (int c = 0; c < splits; ++c) L += pl[h * splits + c] * expf(pm[h * splits + c] - M);
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float o = 0.0f;
    for (int c = 0; c < splits; ++c)
      o += pacc[static_cast<long long>(h * splits + c) * H + d] * expf(pm[h * splits + c] - M);
    out[h * H + d] = o / L;
  }
}

// The inputs of one decode-attention call, checked before any kernel indexes them: q and out
// [1, N, H], the cache k and v [S, K, H] with K dividing N, all f32, contiguous, on the device,
// and 0 < len <= S positions filled.
inline void check_decode_inputs(const char* who, const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len,
                                const Tensor& out) {
  IL_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && out.is_cuda(), who, ": tensors must be on CUDA");
  IL_CHECK(q.ndim() == 3 && k.ndim() == 3 && q.size(0) == 1 && k.size(1) > 0 && k.size(2) == q.size(2) &&
               v.shape() == k.shape() && out.shape() == q.shape() && q.size(1) % k.size(1) == 0,
           who, ": expected q and out [1, N, H] and k, v [S, K, H] with K dividing N; got q ", q.describe(), ", k ",
           k.describe(), ", v ", v.describe(), ", out ", out.describe());
  for (const Tensor* t : {&q, &k, &v, &out})
    IL_CHECK(t->dtype() == DType::F32 && t->is_contiguous(), who, ": ", t->describe(), " must be contiguous f32");
  IL_CHECK(len > 0 && len <= k.size(0), who, ": length ", len, " outside the cache of ", k.size(0), " positions");
}

// The host side shared by the one-off split-K launches: how many chunks a length needs, and one
// scratch allocation holding the last position (a device int, as the kernels read it) followed by
// each (query head, chunk)'s statistics m, l and partial output acc. Not for graph capture (it
// may grow the scratch buffer and copies from the host): CudaDecoder keeps its own buffers.
struct SplitScratch {
  int splits;
  int* pos;
  float *m, *l, *acc;
};
inline SplitScratch split_scratch(std::int64_t N, std::int64_t H, std::int64_t len, cudaStream_t stream) {
  SplitScratch s{};
  s.splits = static_cast<int>((len + kChunk - 1) / kChunk);
  char* base = static_cast<char*>(cuda::scratch(256 + static_cast<std::size_t>(N * s.splits * (H + 2)) * 4));
  s.pos = reinterpret_cast<int*>(base);
  s.m = reinterpret_cast<float*>(base + 256);
  s.l = s.m + N * s.splits;
  s.acc = s.l + N * s.splits;
  const int last = static_cast<int>(len - 1);
  IL_CUDA(cudaMemcpyAsync(s.pos, &last, sizeof last, cudaMemcpyHostToDevice, stream));
  return s;
}

}  // namespace
}  // namespace inferlab::ch02
