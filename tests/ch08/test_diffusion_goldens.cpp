// Chapter 08 against its reference (tools/ref_transformer.py with causal = false, float64): tiny-mdlm's
// logits on a canvas of masks after each of three prompts, and the deterministic sampling run of
// tools/golden.py (16 masks, 8 steps, the 2 most confident committed per step, ties to the lower
// position), which is LLaDA's sampler at temperature 0 with one block.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "chapters/08_diffusion_lm/diffusion.h"
#include "common/json_file.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;

TEST(MdlmGolden, CanvasLogitsAndTheSamplingRunMatchTheReference) {
  const std::string model_dir = kData + "/models/tiny-mdlm", golden_dir = kData + "/golden/tiny-mdlm";
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " is missing (see tools/README.md)";
  const ch08::DiffusionModel m = ch08::load_diffusion(model_dir);
  const auto tok = Tokenizer::for_model(model_dir);
  const auto manifest = load_json(golden_dir + "/manifest.json");
  EXPECT_EQ(manifest["compute_dtype"], "float64");
  const SafetensorsFile g(golden_dir + "/golden.safetensors");
  int p = 0;
  for (const auto& prompt : manifest["prompts"]) {
    const std::string key = "prompt" + std::to_string(p++) + ".";
    SCOPED_TRACE(key);
    const auto ids = test::ids_of(g.get(key + "input_ids"));
    EXPECT_EQ(tok->encode(prompt["text"].get<std::string>()), ids);
    const auto canvas = test::ids_of(g.get(key + "masked_input_ids"));
    ASSERT_EQ(canvas.size(), ids.size() + 16);
    test::expect_golden(m.base.config, ch08::denoise(m, {canvas}).to_double_vector(),
                        g.get(key + "logits").to_double_vector(), key + "logits on the masked canvas");
    ch08::SamplerOptions o;
    o.gen_length = 16, o.steps = 8, o.block_length = 16;
    const auto run = ch08::sample_llada(ch08::denoiser(m), ids, m.mask_id, o);
    EXPECT_EQ(run.tokens, test::ids_of(g.get(key + "sample_ids"))) << "the sampled canvas";
    std::vector<std::int64_t> when;
    for (double w : g.get(key + "sample_commit_step").to_double_vector()) when.push_back(static_cast<std::int64_t>(w));
    EXPECT_EQ(run.commit_step, when) << "the step that committed each position";
  }
  EXPECT_EQ(p, 3);
}

}  // namespace
}  // namespace inferlab
