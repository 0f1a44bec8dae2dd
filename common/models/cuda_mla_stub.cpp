// The absorbed-MLA kernel of a build without CUDA.
#include "common/cuda/backend.h"
#include "common/models/cuda_mla.h"

namespace inferlab::models::mla {
void mla_decode_attention(const Tensor&, const Tensor&, std::int64_t, float, std::int64_t, Tensor&) {
  cuda::require_device();
}
void mla_rebuild_kv(const Tensor&, std::int64_t, const Tensor&, std::int64_t, Tensor&, Tensor&) { cuda::require_device(); }
}  // namespace inferlab::models::mla
