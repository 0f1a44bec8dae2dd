// Chapter 12's kernels in a build without CUDA.
#include "chapters/12_paged_attention/cuda_paged.h"
#include "common/cuda/backend.h"

namespace inferlab::ch12 {
void cuda_paged_attention(const Tensor&, const PagedKV&, std::int64_t, Tensor&, std::int64_t) { cuda::require_device(); }
void cuda_write_slots(const Tensor&, const Tensor&, const std::vector<std::int64_t>&, const Tensor&, const Tensor&) {
  cuda::require_device();
}
}  // namespace inferlab::ch12
