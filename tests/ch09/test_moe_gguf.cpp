// Mixture-of-experts models in GGUF (common/models/gguf_moe.h): the random Mixtral
// (llama with expert tensors) and Qwen2-MoE (qwen2moe) of data/golden/moe-random, written in
// llama.cpp's layout by tools/make_moe_gguf.py. Loaded from GGUF they give transformers' logits
// and greedy tokens, and the Hugging Face path's logits; a Q8_0 file's experts are the checkpoint's
// within Q8_0's rounding, each expert sliced out of the stacked tensors at its own rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/09_quantization/gguf_model.h"
#include "chapters/09_quantization/quant.h"
#include "common/models/kv_cache.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"

namespace inferlab {
namespace {

const std::string kDir = std::string(INFERLAB_DATA_DIR) + "/golden/moe-random";

class MoeGguf : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeGguf, LogitsAndGreedyTokensMatchTransformersAndTheHfPath) {
  const std::string dir = kDir + "/" + GetParam();
  const models::Llama g = ch09::load_gguf(dir + "/model.gguf");
  const models::Llama hf = models::load_llama(dir);
  ASSERT_TRUE(g.config.moe.has_value());
  EXPECT_EQ(g.config.moe->num_experts, hf.config.moe->num_experts);
  EXPECT_EQ(g.config.moe->top_k, hf.config.moe->top_k);
  EXPECT_EQ(g.config.moe->norm_topk_prob, hf.config.moe->norm_topk_prob);
  EXPECT_EQ(g.config.moe->shared_size, hf.config.moe->shared_size);
  for (std::size_t i = 0; i < g.layers.size(); ++i)
    EXPECT_EQ(g.layers[i].moe.defined(), hf.layers[i].moe.defined()) << "layer " << i;
  const SafetensorsFile gold(dir + "/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  const auto want = gold.get("logits").to_double_vector();
  const auto got = ch01::forward(g, ids, true).to_double_vector();
  test::expect_golden(g.config, got, want, "GGUF logits against transformers");
  const auto ref = ch01::forward(hf, ids, true).to_double_vector();
  test::expect_within(got, ref, std::vector<double>(ref.size(), test::two_path_bound(g.config, ref)),
                      "GGUF logits against the Hugging Face folder's");
  const auto greedy = test::ids_of(gold.get("greedy_ids"));
  Sampler sampler({});
  EXPECT_EQ(models::generate_cached(g, ids, static_cast<int>(greedy.size()), sampler, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, MoeGguf, ::testing::Values("mixtral", "qwen2-moe"), test::ModelName());

// DeepSeek's deepseek2 files (MLA with MoE) run in chapter 04, which the refusal names.
TEST(MoeGguf, ADeepseek2FileNamesTheChapterThatRunsIt) {
  test::expect_error(
      [&] { ch09::load_gguf(kDir + "/deepseek-v3-noaux/model.gguf"); },
      {"architecture 'deepseek2' is not llama", "(it runs in chapter 04, ch04_mla generate --model FILE.gguf)"});
}

// A weight as f32 values, packed or plain.
std::vector<double> values(const Linear& w) {
  return (w.packed ? ch09::dequantize(dynamic_cast<const ch09::QMatrix&>(*w.packed)) : w.weight.to(DType::F32))
      .to_double_vector();
}

// Each Q8_0 block of 32 holds its values to within half a step d = max|w| / 127, plus d's own F16
// rounding times up to 127 steps (max|w| · 2^-11); F16 to 2^-11 relative (2^-25 below its normal range).
TEST(MoeGguf, Q8ExpertsAreTheCheckpointsSlicedAtTheirRows) {
  const models::Llama q = ch09::load_gguf(kDir + "/mixtral/model-q8_0.gguf");
  const models::Llama hf = models::load_llama(kDir + "/mixtral");
  for (std::size_t l = 0; l < q.layers.size(); ++l) {
    const MoeFfn& a = q.layers[l].moe;
    const MoeFfn& b = hf.layers[l].moe;
    ASSERT_EQ(a.experts.size(), b.experts.size());
    EXPECT_EQ(values(a.router), values(b.router)) << "the router stays F32";
    for (std::size_t e = 0; e < a.experts.size(); ++e) {
      ASSERT_TRUE(a.experts[e].gate.packed && a.experts[e].up.packed) << "gate and up are Q8_0";
      ASSERT_FALSE(a.experts[e].down.packed) << "down (24 columns) is F16";
      for (auto [x, y] : {std::pair{&a.experts[e].gate, &b.experts[e].gate}, std::pair{&a.experts[e].up, &b.experts[e].up},
                          std::pair{&a.experts[e].down, &b.experts[e].down}}) {
        const auto got = values(*x), want = values(*y);
        ASSERT_EQ(got.size(), want.size());
        const bool q8 = x->packed != nullptr;
        std::vector<double> bound(want.size());
        for (std::size_t i = 0; i < want.size(); i += 32) {
          double amax = 0;
          for (std::size_t j = i; j < std::min(i + 32, want.size()); ++j) amax = std::max(amax, std::fabs(want[j]));
          for (std::size_t j = i; j < std::min(i + 32, want.size()); ++j)
            bound[j] = q8 ? amax / 127 * 0.5 + amax * 0x1p-11 : std::max(std::fabs(want[j]) * 0x1p-11, 0x1p-25);
        }
        test::expect_within(got, want, bound, "layer " + std::to_string(l) + " expert " + std::to_string(e));
      }
    }
  }
  // And the model runs from the file.
  const SafetensorsFile gold(kDir + "/mixtral/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  EXPECT_EQ(ch01::forward(q, ids, true).size(0), static_cast<std::int64_t>(ids.size()));
}

// Our export: a random Mixtral and Qwen2-MoE (tiny-mha's tokenizer, widths that Q8_0's blocks
// divide) written by save_gguf, plain and Q8_0, and read back by load_gguf: the same experts, the
// same dense layer, the same logits.
TEST(MoeGguf, ExportsRoundTrip) {
  const std::string data = INFERLAB_DATA_DIR;
  const auto tok = HfTokenizer::load(data + "/models/tiny-mha");
  for (const char* name : {"mixtral", "qwen2-moe"}) {
    HfConfig hf = load_hf_config(kDir + "/" + name);
    hf.json["vocab_size"] = 1024;
    for (const char* width : {"intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"})
      if (hf.json.contains(width)) hf.json[width] = 64;
    const TransformerConfig c = parse_transformer_config(hf);
    const models::Llama m = models::random_llama(c, 9);
    for (bool q8 : {false, true}) {
      SCOPED_TRACE(std::string(name) + (q8 ? " q8_0" : " f32"));
      const models::Llama w = q8 ? ch09::quantize_model(m, {ch09::Format::Q8_0}) : m;
      test::TempDir dir;
      ch09::save_gguf(dir.file("m.gguf"), w, tok);
      const models::Llama back = ch09::load_gguf(dir.file("m.gguf"));
      ASSERT_TRUE(back.config.moe.has_value());
      EXPECT_EQ(back.config.moe->num_experts, c.moe->num_experts);
      EXPECT_EQ(back.config.moe->dense_layers, c.moe->dense_layers);
      EXPECT_EQ(back.matrix_bytes(), w.matrix_bytes());
      for (std::size_t l = 0; l < back.layers.size(); ++l) {
        ASSERT_EQ(back.layers[l].moe.defined(), w.layers[l].moe.defined()) << "layer " << l;
        if (q8 && w.layers[l].moe.defined()) {  // an expert's packed bytes, sliced back at their rows
          EXPECT_EQ(values(back.layers[l].moe.experts[3].down), values(w.layers[l].moe.experts[3].down));
        }
      }
      const std::vector<std::int32_t> toks = {0, 523, 524, 278, 525, 522, 482};
      const auto want = ch01::forward(w, toks, true).to_double_vector();
      test::expect_within(ch01::forward(back, toks, true).to_double_vector(), want,
                          std::vector<double>(want.size(), test::two_path_bound(c, want)), "logits after the round trip");
    }
  }
}

}  // namespace
}  // namespace inferlab
