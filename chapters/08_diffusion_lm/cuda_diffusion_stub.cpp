// Chapter 08's kernel in a build without CUDA.
#include "chapters/08_diffusion_lm/cuda_diffusion.h"
#include "common/cuda/backend.h"

namespace inferlab::ch08 {
void cuda_argmax_probability(const Tensor&, std::int64_t, std::int64_t, std::int32_t, std::vector<std::int32_t>&,
                             std::vector<double>&) {
  cuda::require_device();
}
}  // namespace inferlab::ch08
