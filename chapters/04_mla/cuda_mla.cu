// Absorbed-MLA decode attention: one block per (group of query heads, chunk of positions) reads
// each latent row once and scores it against the whole group. And the plain path's rebuild of
// K and V from the latent rows, for comparison. See cuda_mla.h.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "chapters/02_kv_cache/decode_attention.cuh"
#include "chapters/04_mla/cuda_mla.h"
#include "common/cuda/backend.h"

namespace inferlab::ch04 {

namespace {

using ch02::kChunk;
constexpr int kHeadsPerBlock = 16;
constexpr int kThreads = 256;
constexpr int kMaxLatent = 1024;                  // r + dr: a row is at most 8 float4 per lane
constexpr int kRowVectors = kMaxLatent / 4 / 32;  // float4 of a row held by each lane
static_assert(kChunk % 4 == 0, "the value loop reads the weights four positions at a time");

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ inline float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// Shared memory: w [kHeadsPerBlock][kChunk] (scores, then softmax weights), then the group's
// scaled queries qs [heads][R]. R = r + dr.
__global__ void mla_partial(const float* __restrict__ q, const float* __restrict__ rows, const int* __restrict__ pos_p,
                            float* __restrict__ pm, float* __restrict__ pl, float* __restrict__ pacc, int N, int R, int r,
                            float scale) {
  extern __shared__ float4 smem[];
  float* w = reinterpret_cast<float*>(smem);
  float* qs = w + kHeadsPerBlock * kChunk;
  const int h0 = blockIdx.x * kHeadsPerBlock, heads = min(kHeadsPerBlock, N - h0);
  const int c = blockIdx.y, splits = gridDim.y;
  const int len = *pos_p + 1, start = c * kChunk, n = max(0, min(start + kChunk, len) - start);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, R4 = R / 4;

  for (int i = threadIdx.x; i < heads * R; i += blockDim.x) qs[i] = q[static_cast<long long>(h0) * R + i] * scale;
  __syncthreads();

  // Scores: a warp per row; the row is loaded once and dotted with every query of the group.
  const float4* q4 = reinterpret_cast<const float4*>(qs);
  for (int j = warp; j < n; j += warps) {
    const float4* row = reinterpret_cast<const float4*>(rows + static_cast<long long>(start + j) * R);
    float4 k[kRowVectors];
#pragma unroll
    for (int e = 0; e < kRowVectors; ++e) k[e] = lane + 32 * e < R4 ? row[lane + 32 * e] : make_float4(0, 0, 0, 0);
    for (int g = 0; g < heads; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kRowVectors; ++e)
        if (lane + 32 * e < R4) dot += dot4(q4[g * R4 + lane + 32 * e], k[e]);
      dot = warp_sum(dot);
      if (lane == 0) w[g * kChunk + j] = dot;
    }
  }
  __syncthreads();

  // Softmax statistics of each head over the chunk: a warp per head. The weights past n, up to
  // the next multiple of 4, are zeroed for the value loop below.
  const int n4 = (n + 3) / 4 * 4;
  for (int g = warp; g < heads; g += warps) {
    float* s = w + g * kChunk;
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) sum += (s[j] = expf(s[j] - mx));
    for (int j = n + lane; j < n4; j += 32) s[j] = 0.0f;
    sum = warp_sum(sum);
    if (lane == 0) pm[(h0 + g) * splits + c] = mx, pl[(h0 + g) * splits + c] = sum;
  }
  __syncthreads();

  // Values: a thread per latent dimension d < r; column d of four rows at a time against the
  // four weights of each head (one 16-byte shared load per four multiply-adds).
  const float4* w4 = reinterpret_cast<const float4*>(w);
  for (int d = threadIdx.x; d < r; d += blockDim.x) {
    float acc[kHeadsPerBlock] = {};
    for (int j = 0; j < n; j += 4) {
      float4 v;
      const float* col = rows + static_cast<long long>(start + j) * R + d;
      v.x = col[0];
      v.y = j + 1 < n ? col[R] : 0.0f;
      v.z = j + 2 < n ? col[2 * R] : 0.0f;
      v.w = j + 3 < n ? col[3 * R] : 0.0f;
#pragma unroll
      for (int g = 0; g < kHeadsPerBlock; ++g)
        if (g < heads) acc[g] += dot4(w4[(g * kChunk + j) / 4], v);
    }
#pragma unroll
    for (int g = 0; g < kHeadsPerBlock; ++g)
      if (g < heads) pacc[(static_cast<long long>(h0 + g) * splits + c) * r + d] = acc[g];
  }
}

// k[s, h, dn + e] = k_pe of position s (latent column r + e), for every head h.
__global__ void copy_k_pe(const float* __restrict__ latent, float* __restrict__ k, long long len, int N, int R, int r,
                          int dn) {
  const int dr = R - r;
  const long long total = len * N * dr;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long s = i / (N * dr);
    const int h = static_cast<int>(i / dr % N), e = static_cast<int>(i % dr);
    k[(s * N + h) * (dn + dr) + dn + e] = latent[s * R + r + e];
  }
}

std::size_t shared_bytes(std::int64_t R) { return static_cast<std::size_t>(kHeadsPerBlock * (kChunk + R)) * sizeof(float); }

int shared_limit() {
  int device = 0, bytes = 0;
  IL_CUDA(cudaGetDevice(&device));
  IL_CUDA(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

bool aligned16(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()) % 16 == 0; }

}  // namespace

void mla_decode_attention(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r,
                          Tensor& out) {
  const char* who = "mla_decode_attention";
  IL_CHECK(q.is_cuda() && latent.is_cuda() && out.is_cuda(), who, ": tensors must be on CUDA; got q ", q.describe(),
           ", latent ", latent.describe(), ", out ", out.describe());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&q, &latent, &out})
    IL_CHECK(t->dtype() == DType::F32 && t->is_contiguous(), who, ": ", t->describe(), " must be contiguous f32");
  IL_CHECK(q.ndim() == 3 && q.size(0) == 1 && q.size(1) > 0 && latent.ndim() == 3 && latent.size(1) == 1 &&
               latent.size(2) == q.size(2),
           who, ": expected q [1, N, r + dr] and latent [S, 1, r + dr]; got q ", q.describe(), ", latent ",
           latent.describe());
  const std::int64_t N = q.size(1), R = q.size(2);
  IL_CHECK(r > 0 && r <= R, who, ": the value width r = ", r, " must be in [1, r + dr = ", R, "]");
  IL_CHECK(out.ndim() == 3 && out.size(0) == 1 && out.size(1) == N && out.size(2) == r, who, ": out must be [1, ", N, ", ",
           r, "] (one row of N heads of r values); got ", out.describe());
  IL_CHECK(len > 0 && len <= latent.size(0), who, ": length ", len, " outside the cache of ", latent.size(0), " positions");
  IL_CHECK(R % 4 == 0 && R <= kMaxLatent, who, ": r + dr = ", R, " must be a multiple of 4 and at most ", kMaxLatent,
           " (rows are read as 16-byte vectors, held in registers)");
  IL_CHECK(aligned16(q) && aligned16(latent), who, ": q and latent must start on a 16-byte boundary");
  const std::size_t smem = shared_bytes(R);
  IL_CHECK(smem <= static_cast<std::size_t>(shared_limit()), who, ": r + dr = ", R, " needs ", smem,
           " bytes of shared memory per block, more than this GPU's ", shared_limit());
  IL_CUDA(cudaFuncSetAttribute(mla_partial, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const ch02::SplitScratch s = ch02::split_scratch(N, r, len, cuda::stream());
  const unsigned groups = static_cast<unsigned>((N + kHeadsPerBlock - 1) / kHeadsPerBlock);
  mla_partial<<<dim3(groups, static_cast<unsigned>(s.splits)), kThreads, smem, cuda::stream()>>>(
      q.data<float>(), latent.data<float>(), s.pos, s.m, s.l, s.acc, static_cast<int>(N), static_cast<int>(R),
      static_cast<int>(r), scale);
  IL_CUDA_LAUNCHED();
  ch02::attention_merge<<<static_cast<unsigned>(N), ch02::kAttnThreads, 0, cuda::stream()>>>(
      s.m, s.l, s.acc, out.data<float>(), s.splits, static_cast<int>(r));
  IL_CUDA_LAUNCHED();
}

void mla_rebuild_kv(const Tensor& latent, std::int64_t len, const Tensor& w_kvb, std::int64_t dn, Tensor& k, Tensor& v) {
  const char* who = "mla_rebuild_kv";
  IL_CHECK(latent.is_cuda() && w_kvb.is_cuda() && k.is_cuda() && v.is_cuda(), who, ": tensors must be on CUDA");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&latent, &w_kvb, &k, &v})
    IL_CHECK(t->dtype() == DType::F32 && t->is_contiguous(), who, ": ", t->describe(), " must be contiguous f32");
  IL_CHECK(latent.ndim() == 3 && latent.size(1) == 1 && k.ndim() == 3 && v.ndim() == 3 && w_kvb.ndim() == 2 && dn > 0 &&
               k.size(0) == len && v.size(0) == len && v.size(1) == k.size(1) && k.size(2) > dn,
           who, ": expected latent [S, 1, r + dr], k [len, N, dn + dr], v [len, N, dv] with len = ", len, ", dn = ", dn,
           "; got latent ", latent.describe(), ", k ", k.describe(), ", v ", v.describe());
  const std::int64_t N = k.size(1), dr = k.size(2) - dn, dv = v.size(2), R = latent.size(2), r = R - dr;
  IL_CHECK(r > 0 && w_kvb.size(0) == N * (dn + dv) && w_kvb.size(1) == r, who, ": w_kvb must be [N·(dn + dv), r] = [",
           N * (dn + dv), ", ", r, "]; got ", w_kvb.describe());
  IL_CHECK(len > 0 && len <= latent.size(0), who, ": length ", len, " outside the cache of ", latent.size(0), " positions");
  // Row-major matrices seen column-major by cuBLAS: head h's keys K_hᵀ [dn, len] (column stride
  // N·(dn + dr)) = W_UK,h [dn, r] · cᵀ [r, len] (c read in place, column stride R); batch over h.
  const float one = 1.0f, zero = 0.0f;
  const float *w = w_kvb.data<float>(), *c = latent.data<float>();
  const long long w_head = (dn + dv) * r;
  IL_CUBLAS(cublasSgemmStridedBatched(cuda::cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(dn), static_cast<int>(len),
                                      static_cast<int>(r), &one, w, static_cast<int>(r), w_head, c, static_cast<int>(R), 0,
                                      &zero, k.data<float>(), static_cast<int>(N * (dn + dr)), dn + dr,
                                      static_cast<int>(N)));
  IL_CUBLAS(cublasSgemmStridedBatched(cuda::cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(dv), static_cast<int>(len),
                                      static_cast<int>(r), &one, w + dn * r, static_cast<int>(r), w_head, c,
                                      static_cast<int>(R), 0, &zero, v.data<float>(), static_cast<int>(N * dv), dv,
                                      static_cast<int>(N)));
  copy_k_pe<<<cuda::blocks_for(std::min<long long>(len * N * dr, 1 << 20), 256), 256, 0, cuda::stream()>>>(
      c, k.data<float>(), len, static_cast<int>(N), static_cast<int>(R), static_cast<int>(r), static_cast<int>(dn));
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::ch04
