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

// kG: the group size rounded up to a power of two (1 … 16), so that the loops over the group have a
// constant bound: their accumulators stay in registers, as many as the group needs.
template <int kG>
__global__ void gqa_partial(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                            const int* __restrict__ pos_p, float* __restrict__ pm, float* __restrict__ pl,
                            float* __restrict__ pacc, int N, int Kh, int H, float scale) {
  __shared__ float qs[kMaxGroupDims];
  __shared__ float sc[kG][kChunk];
  const int kvh = blockIdx.x, c = blockIdx.y, splits = gridDim.y, G = N / Kh;
  const int len = *pos_p + 1, start = c * kChunk, end = min(start + kChunk, len), n = max(0, end - start);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int i = threadIdx.x; i < G * H; i += blockDim.x) qs[i] = q[kvh * G * H + i] * scale;  // the group's queries
  __syncthreads();
  // Scores: a warp per key row, read once, dotted with all G queries.
  for (int j = warp; j < n; j += warps) {
    const float* kr = kc + (static_cast<long long>(start + j) * Kh + kvh) * H;
    float kv[8];  // H/32 ≤ 8 values of the row per lane; constant indices keep them in registers
#pragma unroll
    for (int e = 0; e < 8; ++e) kv[e] = lane + 32 * e < H ? kr[lane + 32 * e] : 0.0f;
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (lane + 32 * e < H) dot += qs[g * H + lane + 32 * e] * kv[e];
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
  // Outputs: each value row read once, accumulated into all G query heads. The loops over the
  // group run to the constant kG, guarded, so the accumulators stay in registers (with a loop
  // bound of G they lived in local memory), and four value rows are loaded before they are used.
  // The sums run in the same order as one row at a time.
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float acc[kG] = {};
    const float* vd = vc + static_cast<long long>(start) * Kh * H + kvh * H + d;
    const long long row = static_cast<long long>(Kh) * H;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      float vv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) vv[u] = vd[(j + u) * row];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int g = 0; g < kG; ++g)
          if (g < G) acc[g] += sc[g][j + u] * vv[u];
    }
    for (; j < n; ++j) {
      const float vv = vd[j * row];
#pragma unroll
      for (int g = 0; g < kG; ++g)
        if (g < G) acc[g] += sc[g][j] * vv;
    }
#pragma unroll
    for (int g = 0; g < kG; ++g)
      if (g < G) pacc[static_cast<long long>((kvh * G + g) * splits + c) * H + d] = acc[g];
  }
}

// One launch of gqa_partial<kG>.
template <int kG>
void launch_partial(dim3 grid, const float* q, const float* k, const float* v, const ch02::SplitScratch& s, int N, int Kh,
                    int H, float scale) {
  gqa_partial<kG><<<grid, kAttnThreads, 0, cuda::stream()>>>(q, k, v, s.pos, s.m, s.l, s.acc, N, Kh, H, scale);
  IL_CUDA_LAUNCHED();
}

}  // namespace

void gqa_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, Tensor& out) {
  ch02::check_decode_inputs("gqa_decode_attention", q, k, v, len, out);
  const std::int64_t N = q.size(1), H = q.size(2), Kh = k.size(1), G = N / Kh;
  IL_CHECK(G <= kMaxGroup && G * H <= kMaxGroupDims && H <= 256, "gqa_decode_attention: groups of ", G, " heads of size ", H,
           " exceed the kernel's limits (", kMaxGroup, " heads, ", kMaxGroupDims, " values)");
  const ch02::SplitScratch s = ch02::split_scratch(N, H, len, cuda::stream());
  const auto launch = G <= 1   ? launch_partial<1>
                      : G <= 2 ? launch_partial<2>
                      : G <= 4 ? launch_partial<4>
                      : G <= 8 ? launch_partial<8>
                               : launch_partial<16>;  // the group size rounded up to a power of two
  launch(dim3(static_cast<unsigned>(Kh), static_cast<unsigned>(s.splits)), q.data<float>(), k.data<float>(), v.data<float>(),
         s, static_cast<int>(N), static_cast<int>(Kh), static_cast<int>(H), 1.0f / std::sqrt(static_cast<float>(H)));
  ch02::attention_merge<<<static_cast<unsigned>(N), kAttnThreads, 0, cuda::stream()>>>(s.m, s.l, s.acc, out.data<float>(),
                                                                                       s.splits, static_cast<int>(H));
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::ch03
