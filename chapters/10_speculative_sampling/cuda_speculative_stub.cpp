// Chapter 10's kernels in a build without CUDA: every call says so.
#include "chapters/10_speculative_sampling/cuda_speculative.h"
#include "common/cuda/backend.h"

namespace inferlab::ch10::cuda {
namespace {
[[noreturn]] void no_backend() {
  inferlab::cuda::require_device();  // throws, naming why
  fail("no CUDA device available: this build has no CUDA backend");
}
}  // namespace
Tensor distributions(const Tensor&, const SamplingParams&) { no_backend(); }
std::int32_t draw(const Tensor&, std::int64_t, double) { no_backend(); }
DeviceVerdict verify(const std::vector<std::int32_t>&, const Tensor&, const Tensor&, const std::vector<double>&) {
  no_backend();
}
}  // namespace inferlab::ch10::cuda
