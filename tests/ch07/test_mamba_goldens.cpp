// Chapter 07 against transformers (float64): tiny-mamba (MambaForCausalLM) and tiny-lti (its LTI
// subclass, tools/ref_lti_mamba.py), three prompts each (tools/golden.py), and the random Mamba
// shapes of data/golden/mamba-random (tools/make_mamba_goldens.py: state sizes 4 to 64, conv
// widths 2 to 5, dt ranks given and "auto", expand 1.5, biases, an untied head). Logits from one
// prefill (the fast scan and the chunked scan) and token by token from the state, the conv and SSM
// states after prefill, greedy tokens.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "mamba_bound.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;
using test::ids_of;
using test::rows_of;

// Every position's logits three ways, the states after the sequence, and the greedy tokens.
void check_model(const models::mamba::MambaModel& m, const SafetensorsFile& g, const std::string& key,
                 const std::string& what) {
  const auto& c = m.config;
  const auto ids = ids_of(g.get(key + "input_ids"));
  const std::int64_t T = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  const auto want = g.get(key + "logits").to_double_vector();
  models::mamba::MambaState state(c);
  test::expect_mamba_golden(c, T, models::mamba::forward_cached(m, state, ids, true).to_double_vector(), want,
                            what + ": prefill logits");
  models::mamba::MambaState chunked(c);
  test::expect_mamba_golden(
      c, T, models::mamba::forward_cached(m, chunked, ids, true, models::mamba::ScanPath::Parallel).to_double_vector(), want,
      what + ": prefill logits, chunked scan");
  const std::int64_t P = std::min<std::int64_t>(3, T - 1);
  models::mamba::MambaState steps(c);
  test::expect_mamba_golden(c, T,
                            models::mamba::forward_cached(m, steps, {ids.begin(), ids.begin() + P}, true).to_double_vector(),
                            rows_of(want, V, 0, P), what + ": prefill of the first " + std::to_string(P));
  for (std::int64_t t = P; t < T; ++t)
    test::expect_mamba_golden(c, T,
                              models::mamba::forward_cached(m, steps, {ids[static_cast<std::size_t>(t)]}).to_double_vector(),
                              rows_of(want, V, t, t + 1), what + ": decode step at position " + std::to_string(t));
  const std::int64_t E = c.inner_size, K = c.conv_kernel;
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const std::string layer = key + "layer" + std::to_string(l) + ".";
    // transformers keeps the last K inputs [E, K], the newest in column K − 1; the state keeps K − 1.
    const Tensor conv = g.get(layer + "conv_state");
    ASSERT_EQ(conv.shape(), (Shape{E, K})) << layer;
    std::vector<double> got, ref;
    for (std::int64_t r = 0; r < K - 1; ++r)
      for (std::int64_t e = 0; e < E; ++e)
        got.push_back(state.conv(l).at<float>({r, e})), ref.push_back(conv.at<float>({e, r + 1}));
    test::expect_mamba_golden(c, T, got, ref, what + " " + layer + "conv_state");
    test::expect_mamba_golden(c, T, state.ssm(l).to_double_vector(), g.get(layer + "ssm_state").to_double_vector(),
                              what + " " + layer + "ssm_state");
  }
  Sampler s({});
  const auto greedy = ids_of(g.get(key + "greedy_ids"));
  EXPECT_EQ(models::mamba::generate(m, ids, static_cast<int>(greedy.size()), s, {}).generated, greedy)
      << what << ": greedy tokens";
}

class ZooMambaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooMambaGolden, LogitsStatesAndGreedyTokensMatchTransformers) {
  const std::string name = GetParam(), model_dir = kData + "/models/" + name, golden_dir = kData + "/golden/" + name;
  ASSERT_TRUE(std::filesystem::exists(model_dir)) << model_dir << " is missing (see tools/README.md)";
  const models::mamba::MambaModel m = models::mamba::load_mamba(model_dir);
  EXPECT_EQ(m.config.lti, name == "tiny-lti");
  const auto tok = Tokenizer::for_model(model_dir);
  const auto manifest = load_json(golden_dir + "/manifest.json");
  EXPECT_EQ(manifest["compute_dtype"], "float64");
  const SafetensorsFile g(golden_dir + "/golden.safetensors");
  int p = 0;
  for (const auto& prompt : manifest["prompts"]) {
    const std::string key = "prompt" + std::to_string(p++) + ".";
    SCOPED_TRACE(name + " " + key);
    EXPECT_EQ(tok->encode(prompt["text"].get<std::string>()), ids_of(g.get(key + "input_ids")));
    check_model(m, g, key, name + " " + key);
  }
  EXPECT_EQ(p, 3);
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooMambaGolden, ::testing::Values("tiny-mamba", "tiny-lti"));

TEST(MambaRandomGolden, EveryShapeMatchesTransformers) {
  const std::string dir = kData + "/golden/mamba-random";
  const auto manifest = load_json(dir + "/manifest.json");
  ASSERT_GE(manifest["models"].size(), 4u);
  for (const auto& [name, info] : manifest["models"].items()) {
    SCOPED_TRACE(name + ": " + info["covers"].get<std::string>());
    const models::mamba::MambaModel m = models::mamba::load_mamba(dir + "/" + name);
    EXPECT_EQ(m.config.state_size, info["config"]["state_size"].get<std::int64_t>());
    const SafetensorsFile g(dir + "/" + name + "/golden.safetensors");
    check_model(m, g, "", name);
  }
}

// A user's checkpoint: MAMBA_MODEL=/path/to/mamba-130m-hf runs it (a Hugging Face
// MambaForCausalLM folder with its tokenizer.json); skipped otherwise.
TEST(MambaCheckpoint, AUsersFolderLoadsAndGenerates) {
  const char* path = std::getenv("MAMBA_MODEL");
  if (!path) GTEST_SKIP() << "set MAMBA_MODEL to a MambaForCausalLM folder (e.g. state-spaces/mamba-130m-hf) to run it";
  const models::mamba::MambaModel m = models::mamba::load_mamba(path);
  const auto tok = Tokenizer::for_model(path);
  const auto ids = tok->encode("The capital of France is");
  Sampler s({});
  const auto g = models::mamba::generate(m, ids, 8, s, {});
  EXPECT_EQ(g.generated.size(), 8u);
  // Decoding from the state equals recomputing the whole sequence (the same model two ways).
  auto all = ids;
  all.insert(all.end(), g.generated.begin(), g.generated.end() - 1);
  const auto last = models::mamba::forward_sequence(m, all).to_double_vector();
  const auto argmax = std::max_element(last.begin(), last.end()) - last.begin();
  EXPECT_EQ(argmax, g.generated.back());
}

}  // namespace
}  // namespace inferlab
