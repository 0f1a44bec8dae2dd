// Chapter 06 on the GPU: the ring cache in device memory, decode over its slots with the attention
// kernel (no mask, no copy), against the CPU (skipped, with the driver's reason, without a GPU).
#include <gtest/gtest.h>

#include "common/models/local.h"
#include "golden_util.h"

namespace inferlab {
namespace {

TEST(CudaLocal, RingDecodeMatchesTheCpuPastTheWindow) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  TransformerConfig c;
  c.architecture = "MinistralForCausalLM";
  c.hidden_size = 96, c.intermediate_size = 192, c.num_layers = 3, c.num_heads = 6, c.num_kv_heads = 2;
  c.head_dim = 16, c.vocab_size = 101, c.max_position_embeddings = 128, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  const models::Llama cpu = models::random_llama(c, rng());
  const models::Llama gpu = cpu.to(Device::CUDA, DType::F32);
  for (std::int64_t sinks : {0, 2}) {
    models::local::LocalLayout layout = models::local::LocalLayout::hybrid(3, 6, 3);  // layers 0-1 local, 2 global
    layout.sinks = sinks;
    const auto tokens = test::random_tokens(rng, 40, c.vocab_size);
    models::local::RingKVCache on_cpu(c, layout, 40), on_gpu(c, layout, 40, Device::CUDA);
    EXPECT_TRUE(on_gpu.k(0).is_cuda());
    EXPECT_EQ(on_gpu.bytes(), on_cpu.bytes());
    const std::vector<std::int32_t> prompt(tokens.begin(), tokens.begin() + 11);  // wraps the ring in the prefill
    auto want = models::forward_cached(cpu, on_cpu, prompt, true).to_double_vector();
    auto got = models::forward_cached(gpu, on_gpu, prompt, true).to_double_vector();
    for (std::size_t i = 11; i < tokens.size(); ++i) {
      const auto a = models::forward_cached(cpu, on_cpu, {tokens[i]}).to_double_vector();
      const auto b = models::forward_cached(gpu, on_gpu, {tokens[i]}).to_double_vector();
      want.insert(want.end(), a.begin(), a.end()), got.insert(got.end(), b.begin(), b.end());
    }
    // Each side within golden_bound of the exact logits, whatever order a device sums in.
    EXPECT_LE(test::max_diff(got, want), test::two_path_bound(c, want)) << "sinks = " << sinks;
  }
}

}  // namespace
}  // namespace inferlab
