// Chapter 10 on the GPU: both models on CUDA, the target's verification pass over γ + 1 tokens
// there; greedy speculative decoding equals the CPU's token for token (skipped, with the driver's
// reason, without a GPU).
#include <gtest/gtest.h>

#include <filesystem>

#include "chapters/10_speculative_sampling/speculative.h"
#include "golden_util.h"

namespace inferlab {
namespace {

TEST(CudaSpeculative, GreedyOnTheGpuEqualsTheCpu) {
  IL_REQUIRE_CUDA();
  const std::string data = INFERLAB_DATA_DIR;
  const ch01::Llama target = ch01::load_llama(data + "/models/tiny-mha"), draft = ch01::load_llama(data + "/models/tiny-draft");
  const ch01::Llama gt = target.to(Device::CUDA, DType::F32), gd = draft.to(Device::CUDA, DType::F32);
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  ch10::CachedModel ct(target, 128, {}), cd(draft, 128, {}), t(gt, 128, {}), d(gd, 128, {});
  Sampler a({}), b({});
  const auto cpu = ch10::speculative_generate(ct, cd, prompt, 48, 4, a, {});
  const auto gpu = ch10::speculative_generate(t, d, prompt, 48, 4, b, {});
  EXPECT_EQ(gpu.generated, cpu.generated);
}

}  // namespace
}  // namespace inferlab
