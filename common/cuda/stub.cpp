// The CUDA backend of a build without CUDA: every entry point says so clearly.
#include "common/cuda/backend.h"
#include "common/error.h"

namespace inferlab::cuda {

namespace {
constexpr const char* kReason =
    "this build has no CUDA backend (nvcc was not found when it was configured; reconfigure with "
    "-DINFERLAB_CUDA=ON on a machine with the CUDA toolkit)";
[[noreturn]] void no_cuda() { fail("no CUDA device available: ", kReason); }
}  // namespace

bool built() { return false; }
std::string unavailable_reason() { return kReason; }
void require_device() { no_cuda(); }
std::string device_description() { no_cuda(); }
std::size_t device_memory_bytes() { no_cuda(); }
void* device_malloc(std::size_t) { no_cuda(); }
void device_free(void*) {}
void memcpy(void*, const void*, std::size_t) { no_cuda(); }
void memset_zero(void*, std::size_t) { no_cuda(); }
void synchronize() {}
void matmul(const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void add(const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void rmsnorm(const Tensor&, const Tensor&, float, Tensor&) { no_cuda(); }
void rope(Tensor&, const Tensor&, const Tensor&, RopePairing, std::int64_t) { no_cuda(); }
void softmax(const Tensor&, Tensor&) { no_cuda(); }
void swiglu(const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void embedding(const Tensor&, const Tensor&, Tensor&) { no_cuda(); }
void attention(const Tensor&, const Tensor&, const Tensor&, Tensor&, const RaggedBatch&, const AttentionParams&) {
  no_cuda();
}
void argmax(const Tensor&, Tensor&) { no_cuda(); }
void decode_attention(DecodeAttention, const Tensor&, const Tensor&, const Tensor&, std::int64_t, Tensor&, std::int64_t) {
  no_cuda();
}
void latent_decode_attention(const Tensor&, const Tensor&, std::int64_t, float, std::int64_t, Tensor&) { no_cuda(); }
void paged_decode_attention(const Tensor&, const Tensor&, const Tensor&, const std::vector<std::int32_t>&, std::int64_t,
                            std::int64_t, Tensor&, std::int64_t) {
  no_cuda();
}
void store_cached(const CachedBatch&, std::int64_t, const Tensor&, const Tensor&) { no_cuda(); }
void attention_cached(const Tensor&, const CachedBatch&, std::int64_t, Tensor&, const AttentionParams&) { no_cuda(); }
Launches launches() { return {}; }
void fill_uniform(Tensor&, std::uint64_t, float, float) { no_cuda(); }
void set_gemv_kernel(GemvKernel) {}
void set_gemv_version(GemvVersion) {}
GemvVersion gemv_version() { return kDefaultGemvVersion; }
void gemv(GemvVersion, const Tensor&, const GemvArgs&, Tensor&) { no_cuda(); }
double measure_read_bandwidth(std::size_t) { no_cuda(); }
double measure_gemm_flops(int) { no_cuda(); }

}  // namespace inferlab::cuda
