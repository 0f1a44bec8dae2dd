// Absorbed-MLA decode attention: version 3 of the decode-attention family
// (common/cuda/decode_attention.cuh, `latent`), one block per (group of query heads, chunk of
// positions) reading each latent row once and scoring it against the whole group. And the plain
// path's rebuild of K and V from the latent rows, for comparison. See cuda_mla.h.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"
#include "common/models/cuda_mla.h"

namespace inferlab::models::mla {

namespace {

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

}  // namespace

void mla_decode_attention(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r,
                          Tensor& out) {
  cuda::latent_decode_attention(q, latent, len, scale, r, out);
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

}  // namespace inferlab::models::mla
