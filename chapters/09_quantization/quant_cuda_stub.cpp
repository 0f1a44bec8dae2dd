// Chapter 09's CUDA products in a build without CUDA.
#include "chapters/09_quantization/quant_impl.h"
#include "common/cuda/backend.h"

namespace inferlab::ch09 {
void cuda_qmatmul(const Tensor&, const QMatrix&, Tensor&) { cuda::require_device(); }
}  // namespace inferlab::ch09
