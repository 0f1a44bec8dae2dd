// The quantised formats' CUDA products in a build without CUDA.
#include "common/cuda/backend.h"
#include "common/quant/qmatrix_impl.h"

namespace inferlab::quant {
void cuda_qmatmul(const Tensor&, const QMatrix&, Tensor&) { cuda::require_device(); }
}  // namespace inferlab::quant
