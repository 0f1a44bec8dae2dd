// Chapter 07's kernels in a build without CUDA.
#include "common/cuda/backend.h"
#include "common/models/cuda_mamba.h"

namespace inferlab::models::mamba {
void cuda_selective_scan(const ScanView&, float*) { cuda::require_device(); }
void cuda_causal_conv(const float*, std::int64_t, const float*, const float*, float*, float*, std::int64_t, std::int64_t,
                      std::int64_t, std::int64_t) {
  cuda::require_device();
}
}  // namespace inferlab::models::mamba
