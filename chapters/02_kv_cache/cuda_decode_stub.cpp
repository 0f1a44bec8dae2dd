// The CUDA decoder of a build without CUDA: constructing one says so.
#include "chapters/02_kv_cache/cuda_decode.h"
#include "common/cuda/backend.h"

namespace inferlab::ch02 {
struct CudaDecoder::Impl {};
CudaDecoder::CudaDecoder(const models::Llama&, std::int64_t, bool) { cuda::require_device(); }
CudaDecoder::~CudaDecoder() = default;
Tensor CudaDecoder::prefill(const std::vector<std::int32_t>&) {
  cuda::require_device();
  return {};
}
Tensor CudaDecoder::step(std::int32_t) {
  cuda::require_device();
  return {};
}
std::vector<std::int32_t> CudaDecoder::greedy(std::int32_t, int) {
  cuda::require_device();
  return {};
}
std::int64_t CudaDecoder::length() const { return 0; }
const models::ContiguousKVCache& CudaDecoder::cache() const {
  cuda::require_device();
  throw Error("no CUDA device available: this build has no CUDA backend");
}
double CudaDecoder::step_bytes() const { return 0; }
void decode_attention(const Tensor&, const Tensor&, const Tensor&, std::int64_t, Tensor&) { cuda::require_device(); }
}  // namespace inferlab::ch02
