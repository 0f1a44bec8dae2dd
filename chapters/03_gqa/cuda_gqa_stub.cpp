// The grouped attention kernel of a build without CUDA.
#include "chapters/03_gqa/cuda_gqa.h"
#include "common/cuda/backend.h"

namespace inferlab::ch03 {
void gqa_decode_attention(const Tensor&, const Tensor&, const Tensor&, std::int64_t, Tensor&) { cuda::require_device(); }
}  // namespace inferlab::ch03
