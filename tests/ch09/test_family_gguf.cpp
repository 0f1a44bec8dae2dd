// Qwen3 and Gemma in GGUF (tools/make_family_goldens.py writes data/golden/family-random/<name>/
// model.gguf as llama.cpp's converter does): a qwen3 file through chapter 02's cache gives
// transformers' logits and the Hugging Face folder's, its per-head norms read from attn_q_norm and
// attn_k_norm; a gemma2 or gemma3 file is refused here, naming chapter 06 (which runs it:
// tests/ch06/test_gemma.cpp); llama.cpp's window metadata is read as llama.cpp reads it.
#include <gtest/gtest.h>

#include <filesystem>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/09_quantization/gguf_model.h"
#include "common/models/kv_cache.h"
#include "common/safetensors.h"
#include "golden_util.h"
#include "test_util.h"

namespace inferlab {
namespace {

const std::string kFamily = std::string(INFERLAB_DATA_DIR) + "/golden/family-random";

class Qwen3Gguf : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen3Gguf, TheGgufIsTheSameModelAsTheFolder) {
  const std::string name = GetParam(), dir = kFamily + "/" + name;
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.gguf"))
      << dir << "/model.gguf is missing (tools/make_family_goldens.py)";
  const models::Llama g = ch09::load_gguf(dir + "/model.gguf"), hf = models::load_llama(dir);
  const auto& c = g.config;
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(g.rope_pairing, RopePairing::HalfSplit);
  EXPECT_EQ(c.tie_word_embeddings, hf.config.tie_word_embeddings);
  EXPECT_EQ(c.num_parameters(), hf.config.num_parameters());
  const SafetensorsFile gold(dir + "/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  const auto want = gold.get("logits").to_double_vector();
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  models::ContiguousKVCache a(c, T), b(hf.config, T);
  const auto got = models::forward_cached(g, a, ids, true).to_double_vector();
  test::expect_golden(c, got, want, name + ".gguf: logits");
  const auto folder = models::forward_cached(hf, b, ids, true).to_double_vector();
  EXPECT_LE(test::max_diff(got, folder), test::two_path_bound(c, folder)) << "the GGUF against the folder";
  Sampler s({});
  const auto greedy = test::ids_of(gold.get("greedy_ids"));
  EXPECT_EQ(models::generate_cached(g, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy);
}

INSTANTIATE_TEST_SUITE_P(Models, Qwen3Gguf, ::testing::Values("qwen3-gqa", "qwen3-tied"), test::ModelName());

// Llama 3.2's kind of file: no output.weight (the head is the embedding table) and llama3 RoPE
// scaling as llama.cpp stores it, one factor per pair in rope_freqs.weight; q and k rows in
// llama.cpp's adjacent-pair order.
TEST(Llama32Gguf, TiedHeadAndRopeFactorsAreTheFolderSModel) {
  const std::string dir = kFamily + "/llama32-tied";
  const models::Llama g = ch09::load_gguf(dir + "/model.gguf"), hf = models::load_llama(dir);
  EXPECT_TRUE(g.tied());
  EXPECT_EQ(g.rope_pairing, RopePairing::Adjacent);
  const auto fg = g.inv_freq.to_double_vector(), fh = hf.inv_freq.to_double_vector();
  ASSERT_EQ(fg.size(), fh.size());
  for (std::size_t j = 0; j < fg.size(); ++j) EXPECT_NEAR(fg[j], fh[j], 1e-6 * fh[j]) << "pair " << j;
  const SafetensorsFile gold(dir + "/golden.safetensors");
  const auto ids = test::ids_of(gold.get("input_ids"));
  const auto want = gold.get("logits").to_double_vector();
  const auto got = ch01::forward(g, ids, true).to_double_vector();
  test::expect_golden(g.config, got, want, "llama32-tied.gguf: logits");
  const auto folder = ch01::forward(hf, ids, true).to_double_vector();
  EXPECT_LE(test::max_diff(got, folder), test::two_path_bound(g.config, folder)) << "the GGUF against the folder";
}

TEST(GemmaGguf, RefusedHereNamingChapterSix) {
  for (const char* name : {"gemma2-gguf", "gemma3-gguf"})
    test::expect_error([&] { ch09::load_gguf(kFamily + "/" + name + "/model.gguf"); },
                       {"model.gguf", "chapter 06", "ch06_local_attention"});
}

TEST(GemmaGguf, WindowsAsLlamaCppReadsThem) {
  const gguf::File g2(kFamily + "/gemma2-gguf/model.gguf"), g3(kFamily + "/gemma3-gguf/model.gguf"),
      q3(kFamily + "/qwen3-gqa/model.gguf");
  EXPECT_EQ(ch09::gguf_windows(g2, ch09::gguf_config(g2)), (std::vector<std::int64_t>{5, 0, 5, 0}));
  EXPECT_EQ(ch09::gguf_windows(g3, ch09::gguf_config(g3)), (std::vector<std::int64_t>{6, 6, 0, 6, 6, 0}));
  EXPECT_EQ(ch09::gguf_windows(q3, ch09::gguf_config(q3)), (std::vector<std::int64_t>{0, 0}));
  // llama.cpp's gemma2 defaults the file leaves out: caps 50 and 30, the scale 1/√head_dim.
  const TransformerConfig c = ch09::gguf_config(g2);
  EXPECT_EQ(c.query_pre_attn_scalar, static_cast<double>(c.head_dim));
  EXPECT_FLOAT_EQ(static_cast<float>(c.embed_scale), std::sqrt(static_cast<float>(c.hidden_size)));
}

}  // namespace
}  // namespace inferlab
