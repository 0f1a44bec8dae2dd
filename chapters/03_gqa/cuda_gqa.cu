// Grouped decode attention: version 2 of the decode-attention family
// (common/cuda/decode_attention.cuh, `grouped`): one block per (KV head, chunk of positions)
// serves the whole query group of that KV head. See cuda_gqa.h.
#include "chapters/03_gqa/cuda_gqa.h"
#include "common/cuda/backend.h"

namespace inferlab::ch03 {

void gqa_decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, Tensor& out) {
  cuda::decode_attention(cuda::DecodeAttention::Grouped, q, k, v, len, out);
}

}  // namespace inferlab::ch03
