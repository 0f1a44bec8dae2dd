// Grouped decode attention: one block per (KV head, chunk of positions) serves the whole query
// group of that KV head. See cuda_gqa.h.
#include <cmath>

#include "chapters/02_kv_cache/decode_attention.cuh"
#include "chapters/03_gqa/cuda_gqa.h"
#include "common/cuda/backend.h"

namespace inferlab::ch03 {

namespace {

using ch02::kAttnThreads;
using ch02::kChunk;
constexpr int kMaxGroupDims = 2048;  // G·H values of q kept in shared memory
constexpr int kMaxGroup = 16;

__global__ void gqa_partial(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                            const int* __restrict__ pos_p, float* __restrict__ pm, float* __restrict__ pl,
                            float* __restrict__ pacc, int N, int Kh, int H, float scale) {
  __shared__ float qs[kMaxGroupDims];
  __shared__ float sc[kMaxGroup][kChunk];
  const int kvh = blockIdx.x, c = blockIdx.y, splits = gridDim.y, G = N / Kh;
  const int len = *pos_p + 1, start = c * kChunk, end = min(start + kChunk, len), n = max(0, end - start);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int i = threadIdx.x; i < G * H; i += blockDim.x) qs[i] = q[kvh * G * H + i] * scale;  // the group's queries
  __syncthreads();
  // Scores: a warp per key row, read once, dotted with all G queries.
  for (int j = warp; j < n; j += warps) {
    const float* kr = kc + (static_cast<long long>(start + j) * Kh + kvh) * H;
    float kv[8];  // H/32 ≤ 8 values of the row per lane
    for (int e = 0, d = lane; d < H; ++e, d += 32) kv[e] = kr[d];
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
      for (int e = 0, d = lane; d < H; ++e, d += 32) dot += qs[g * H + d] * kv[e];
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (lane == 0) sc[g][j] = dot;
    }
  }
  __syncthreads();
  // Softmax statistics of each query head over this chunk.
  for (int g = 0; g < G; ++g) {
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sc[g][j]);
    mx = cuda::block_max(mx);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) sum += (sc[g][j] = expf(sc[g][j] - mx));
    sum = cuda::block_sum(sum);
    if (threadIdx.x == 0) pm[(kvh * G + g) * splits + c] = n > 0 ? mx : -INFINITY, pl[(kvh * G + g) * splits + c] = sum;
  }
  __syncthreads();
  // Outputs: each value row read once, accumulated into all G query heads.
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float acc[kMaxGroup];
    for (int g = 0; g < G; ++g) acc[g] = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float vv = vc[(static_cast<long long>(start + j) * Kh + kvh) * H + d];
      for (int g = 0; g < G; ++g) acc[g] += sc[g][j] * vv;
    }
    for (int g = 0; g < G; ++g) pacc[static_cast<long long>((kvh * G + g) * splits + c) * H + d] = acc[g];
  }
}

}  // namespace

void gqa_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, Tensor& out) {
  ch02::check_decode_inputs("gqa_decode_attention", q, k, v, len, out);
  const std::int64_t N = q.size(1), H = q.size(2), Kh = k.size(1), G = N / Kh;
  IL_CHECK(G <= kMaxGroup && G * H <= kMaxGroupDims && H <= 256, "gqa_decode_attention: groups of ", G,
           " heads of size ", H, " exceed the kernel's limits (", kMaxGroup, " heads, ", kMaxGroupDims, " values)");
  const ch02::SplitScratch s = ch02::split_scratch(N, H, len, cuda::stream());
  gqa_partial<<<dim3(static_cast<unsigned>(Kh), static_cast<unsigned>(s.splits)), kAttnThreads, 0, cuda::stream()>>>(
      q.data<float>(), k.data<float>(), v.data<float>(), s.pos, s.m, s.l, s.acc, static_cast<int>(N), static_cast<int>(Kh),
      static_cast<int>(H), 1.0f / std::sqrt(static_cast<float>(H)));
  IL_CUDA_LAUNCHED();
  ch02::attention_merge<<<static_cast<unsigned>(N), kAttnThreads, 0, cuda::stream()>>>(s.m, s.l, s.acc, out.data<float>(),
                                                                                       s.splits, static_cast<int>(H));
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::ch03
