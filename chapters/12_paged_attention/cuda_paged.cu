// Paged attention on the GPU: version 5 of the decode-attention family
// (common/cuda/decode_attention.cuh, `paged`): flash-decoding with every key and value row found
// through the block table, several query rows per call and a causal limit per row; and the slot
// writes. See cuda_paged.h.
#include <algorithm>
#include <cmath>

#include "chapters/12_paged_attention/cuda_paged.h"
#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"

namespace inferlab::ch12 {

namespace {

constexpr int kThreads = 128;

__global__ void write_rows(float* __restrict__ kp, float* __restrict__ vp, const int* __restrict__ slots,
                           const float* __restrict__ k, const float* __restrict__ v, int row) {
  const int t = blockIdx.x;
  const long long dst = static_cast<long long>(slots[t]) * row, src = static_cast<long long>(t) * row;
  for (int i = threadIdx.x; i < row; i += blockDim.x) kp[dst + i] = k[src + i], vp[dst + i] = v[src + i];
}

}  // namespace

void cuda_paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out, std::int64_t splits) {
  cuda::paged_decode_attention(q, kv.k_pool, kv.v_pool, kv.table, kv.block_size, q_offset, out, splits);
}

void cuda_write_slots(const Tensor& k_pool, const Tensor& v_pool, const std::vector<std::int64_t>& slots, const Tensor& k,
                      const Tensor& v) {
  if (slots.empty()) return;
  const std::vector<std::int32_t> s32(slots.begin(), slots.end());
  const Tensor s = Tensor::from_vector(s32, {static_cast<std::int64_t>(s32.size())}).to(Device::CUDA);
  Tensor kp = k_pool, vp = v_pool;
  write_rows<<<static_cast<unsigned>(slots.size()), kThreads, 0, cuda::stream()>>>(
      kp.data<float>(), vp.data<float>(), s.data<std::int32_t>(), k.data<float>(), v.data<float>(),
      static_cast<int>(k.size(1) * k.size(2)));
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::ch12
