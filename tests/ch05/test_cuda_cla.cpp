// Chapter 05 on the GPU: the batch step with a shared cache in device memory (the sharing layers'
// attention reads the storage layer its group's first layer wrote, no copy) against the CPU
// (skipped, with the driver's reason, without a GPU).
#include <gtest/gtest.h>

#include <random>

#include "common/models/cla.h"
#include "golden_util.h"

namespace inferlab {
namespace {

TEST(CudaCla, SharedCacheDecodeMatchesTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  struct Shape {
    std::int64_t layers, kv_heads, share;
  };
  for (const Shape s : {Shape{4, 6, 2}, Shape{5, 2, 2}, Shape{4, 1, 3}}) {
    TransformerConfig c;
    c.architecture = "InferLabCLAForCausalLM";
    c.hidden_size = 96, c.intermediate_size = 192, c.num_layers = s.layers, c.num_heads = 6, c.num_kv_heads = s.kv_heads;
    c.head_dim = 16, c.vocab_size = 101, c.max_position_embeddings = 64, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
    const models::cla::ClaModel cpu = models::cla::random_cla(c, s.share, rng());
    const models::cla::ClaModel gpu{cpu.base.to(Device::CUDA, DType::F32), cpu.layout};
    std::uniform_int_distribution<std::int32_t> tok(0, static_cast<std::int32_t>(c.vocab_size - 1));
    std::vector<std::int32_t> tokens(20);
    for (auto& t : tokens) t = tok(rng);
    models::cla::SharedKVCache on_cpu(c, cpu.layout, 20), on_gpu(c, gpu.layout, 20, Device::CUDA);
    EXPECT_EQ(on_gpu.bytes(), models::cla::kv_cache_bytes(c, cpu.layout, 20, 4));
    EXPECT_TRUE(on_gpu.storage().k(0).is_cuda());
    const std::vector<std::int32_t> prompt(tokens.begin(), tokens.begin() + 9);
    std::vector<double> want = models::cla::forward_cached(cpu, on_cpu, prompt, true).to_double_vector();
    std::vector<double> got = models::cla::forward_cached(gpu, on_gpu, prompt, true).to_double_vector();
    for (std::size_t i = 9; i < tokens.size(); ++i) {
      const auto a = models::cla::forward_cached(cpu, on_cpu, {tokens[i]}).to_double_vector();
      const auto b = models::cla::forward_cached(gpu, on_gpu, {tokens[i]}).to_double_vector();
      want.insert(want.end(), a.begin(), a.end()), got.insert(got.end(), b.begin(), b.end());
    }
    // Each side within golden_bound of the exact logits (the same error model: P dependent stages,
    // each within γ_K of its inputs' scale, whatever order a device sums in).
    EXPECT_LE(test::max_diff(got, want), test::two_path_bound(c, want)) << "L = " << s.layers << ", s = " << s.share;
    for (std::int64_t l = 0; l < on_cpu.storage().layers(); ++l) {
      const auto k = on_cpu.storage().k(l).to_double_vector();
      EXPECT_LE(test::max_diff(on_gpu.storage().k(l).to_double_vector(), k), test::two_path_bound(c, k))
          << "storage layer " << l;
    }
  }
}

}  // namespace
}  // namespace inferlab
