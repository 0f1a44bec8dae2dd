// Chapter 08 on the GPU: the per-row argmax and confidence kernel against the CPU's draw, and
// tiny-mdlm's sampling run on the GPU against its reference run (skipped, with the driver's
// reason, without a GPU).
#include <gtest/gtest.h>

#include <filesystem>

#include "chapters/08_diffusion_lm/cuda_diffusion.h"
#include "chapters/08_diffusion_lm/diffusion.h"
#include "common/safetensors.h"
#include "golden_util.h"

namespace inferlab {
namespace {

TEST(CudaDiffusion, ArgmaxAndConfidenceMatchTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  for (const std::int64_t V : {7, 1024, 5000}) {
    const std::int64_t T = 37;
    Tensor l = test::uniform(rng, {T, V}, -4, 4);
    l.data<float>()[3 * V + 1] = 100;  // the excluded token's logit is the row's largest
    std::vector<std::int32_t> tokens;
    std::vector<double> probs;
    ch08::cuda_argmax_probability(l.to(Device::CUDA), 2, T, 1, tokens, probs);
    ASSERT_EQ(tokens.size(), static_cast<std::size_t>(T - 2));
    std::mt19937_64 unused(0);
    for (std::int64_t r = 2; r < T; ++r) {
      const auto d = ch08::gumbel_draw(l.data<float>() + r * V, V, 0.0, 1, unused);
      EXPECT_EQ(tokens[static_cast<std::size_t>(r - 2)], d.token) << "row " << r << ", V " << V;
      // The kernel sums V float exps, V/256 per thread then a tree of 8 levels, each exp within a
      // couple of ulp: the probability is within γ(V/256 + 8 + 4) of the double one.
      EXPECT_NEAR(probs[static_cast<std::size_t>(r - 2)], d.probability,
                  test::gamma(static_cast<double>(V) / 256 + 12) * d.probability)
          << "row " << r;
    }
  }
}

TEST(CudaDiffusion, TinyMdlmSamplesTheReferenceRunOnTheGpu) {
  IL_REQUIRE_CUDA();
  const std::string dir = std::string(INFERLAB_DATA_DIR) + "/models/tiny-mdlm";
  ASSERT_TRUE(std::filesystem::exists(dir));
  ch08::DiffusionModel m = ch08::load_diffusion(dir);
  m.base = m.base.to(Device::CUDA, DType::F32);
  const SafetensorsFile g(std::string(INFERLAB_DATA_DIR) + "/golden/tiny-mdlm/golden.safetensors");
  ch08::SamplerOptions o;
  o.gen_length = 16, o.steps = 8, o.block_length = 16;
  const auto run = ch08::sample_llada(ch08::denoiser(m), test::ids_of(g.get("prompt0.input_ids")), m.mask_id, o);
  EXPECT_EQ(run.tokens, test::ids_of(g.get("prompt0.sample_ids")));
}

}  // namespace
}  // namespace inferlab
