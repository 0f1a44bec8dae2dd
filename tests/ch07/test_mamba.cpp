// Chapter 07's model: the three ways of running it agree (the reference loop, the fast path, the
// chunked scan, and decoding token by token from the state), the LTI model's convolution equals
// its scan, a batch equals its sequences alone, the state's size never changes, and bad configs,
// checkpoints and rollbacks are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/json_file.h"
#include "mamba_bound.h"

namespace inferlab {
namespace {

using models::mamba::MambaConfig;
using models::mamba::ScanPath;

MambaConfig small_config(bool lti) {
  MambaConfig c;
  c.architecture = lti ? "InferLabLTIMambaForCausalLM" : "MambaForCausalLM";
  c.hidden_size = 24, c.inner_size = 40, c.state_size = 5, c.conv_kernel = 3, c.dt_rank = 4, c.num_layers = 3;
  c.vocab_size = 50, c.lti = lti, c.use_bias = !lti, c.tie_word_embeddings = lti;
  return c;
}

TEST(Mamba, PrefillScanPathsAndTokenByTokenDecodeAgree) {
  auto rng = test::rng_for_test();
  for (const bool lti : {false, true}) {
    const MambaConfig c = small_config(lti);
    const models::mamba::MambaModel m = models::mamba::random_mamba(c, rng());
    const auto tokens = test::random_tokens(rng, 45, c.vocab_size);
    const std::int64_t T = static_cast<std::int64_t>(tokens.size());
    models::mamba::MambaState ref_state(c);
    const auto want = models::mamba::forward_cached(m, ref_state, tokens, true, ScanPath::Reference).to_double_vector();
    const double bound = test::two_path_bound(test::bound_config(c, T), want);
    std::vector<ScanPath> paths = {ScanPath::Fast, ScanPath::Parallel};
    if (lti) paths.push_back(ScanPath::Convolution);
    for (ScanPath p : paths) {
      models::mamba::MambaState s(c);
      EXPECT_LE(test::max_diff(models::mamba::forward_cached(m, s, tokens, true, p).to_double_vector(), want), bound)
          << (lti ? "LTI" : "selective") << ", path " << static_cast<int>(p);
      for (std::int64_t l = 0; l < c.num_layers; ++l) {
        EXPECT_LE(test::max_diff(s.ssm(l).to_double_vector(), ref_state.ssm(l).to_double_vector()),
                  test::two_path_bound(test::bound_config(c, T), ref_state.ssm(l).to_double_vector()));
        const auto conv = s.conv(l).to_double_vector(), ref_conv = ref_state.conv(l).to_double_vector();
        if (l == 0)
          EXPECT_EQ(conv, ref_conv);  // the same inputs, kept as they are; later layers' inputs went through a scan
        else EXPECT_LE(test::max_diff(conv, ref_conv), test::two_path_bound(test::bound_config(c, T), ref_conv));
      }
    }
    // A short prefill, then the recurrent step: one token per call, O(1) state.
    models::mamba::MambaState steps(c);
    std::vector<double> got =
        models::mamba::forward_cached(m, steps, {tokens.begin(), tokens.begin() + 4}, true).to_double_vector();
    for (std::int64_t t = 4; t < T; ++t) {
      const auto row = models::mamba::forward_cached(m, steps, {tokens[static_cast<std::size_t>(t)]}).to_double_vector();
      got.insert(got.end(), row.begin(), row.end());
    }
    EXPECT_EQ(steps.length(), T);
    EXPECT_LE(test::max_diff(got, want), bound) << (lti ? "LTI" : "selective") << ": decoding token by token";
  }
}

TEST(Mamba, ABatchEqualsItsSequencesAlone) {
  auto rng = test::rng_for_test();
  const MambaConfig c = small_config(false);
  const models::mamba::MambaModel m = models::mamba::random_mamba(c, rng());
  const auto a = test::random_tokens(rng, 9, c.vocab_size), b = test::random_tokens(rng, 3, c.vocab_size);
  models::mamba::MambaState sa(c), sb(c), ba(c), bb(c);
  const auto alone_a = models::mamba::forward_cached(m, sa, a, true).to_double_vector();
  const auto alone_b = models::mamba::forward_cached(m, sb, b).to_double_vector();
  std::vector<models::mamba::SequenceStep> batch = {{a, &ba, true}, {b, &bb, false}};
  auto both = models::mamba::forward(m, batch).to_double_vector();
  std::vector<double> want = alone_a;
  want.insert(want.end(), alone_b.begin(), alone_b.end());
  EXPECT_LE(test::max_diff(both, want), test::two_path_bound(test::bound_config(c, 9), want));
  // Then one decode step of each, in one batch (rows of different sequences, each its own state).
  std::vector<models::mamba::SequenceStep> step = {{{7}, &ba, false}, {{8}, &bb, false}};
  both = models::mamba::forward(m, step).to_double_vector();
  want = models::mamba::forward_cached(m, sa, {7}).to_double_vector();
  const auto wb = models::mamba::forward_cached(m, sb, {8}).to_double_vector();
  want.insert(want.end(), wb.begin(), wb.end());
  EXPECT_LE(test::max_diff(both, want), test::two_path_bound(test::bound_config(c, 10), want));
  EXPECT_EQ(ba.length(), 10);
  EXPECT_EQ(bb.length(), 4);
}

TEST(MambaState, BytesAreTheFormulaAndNeverGrow) {
  auto rng = test::rng_for_test();
  const MambaConfig c = small_config(false);
  const models::mamba::MambaModel m = models::mamba::random_mamba(c, rng());
  models::mamba::MambaState s(c);
  const std::int64_t want = c.num_layers * c.inner_size * ((c.conv_kernel - 1) + c.state_size) * 4;
  EXPECT_EQ(s.bytes(), want);
  std::int64_t held = 0;
  for (std::int64_t l = 0; l < c.num_layers; ++l) held += static_cast<std::int64_t>(s.conv(l).nbytes() + s.ssm(l).nbytes());
  EXPECT_EQ(held, want);
  models::mamba::forward_cached(m, s, test::random_tokens(rng, 300, c.vocab_size));
  for (int i = 0; i < 20; ++i) models::mamba::forward_cached(m, s, {1});
  EXPECT_EQ(s.length(), 320);
  EXPECT_EQ(s.bytes(), want);  // 320 positions in, the same bytes as none
  EXPECT_NE(s.layout().find("3 layers × (conv [2, 40] + ssm [40, 5]) f32"), std::string::npos) << s.layout();
  s.release();
  EXPECT_EQ(s.bytes(), 0);
  EXPECT_THROW(s.ssm(0), Error);
}

TEST(MambaState, RollbackIsRefusedExceptToTheStart) {
  auto rng = test::rng_for_test();
  const MambaConfig c = small_config(false);
  const models::mamba::MambaModel m = models::mamba::random_mamba(c, rng());
  const auto tokens = test::random_tokens(rng, 6, c.vocab_size);
  models::mamba::MambaState s(c);
  const auto first = models::mamba::forward_cached(m, s, tokens).to_float_vector();
  s.truncate(6);  // no-op
  EXPECT_EQ(s.length(), 6);
  test::expect_error([&] { s.truncate(3); }, {"cannot roll back from position 6 to 3"});
  EXPECT_EQ(s.length(), 6);
  s.truncate(0);
  EXPECT_EQ(s.length(), 0);
  EXPECT_EQ(models::mamba::forward_cached(m, s, tokens).to_float_vector(), first);  // started over: the same logits
}

TEST(Mamba, BadInputIsRefusedByName) {
  auto rng = test::rng_for_test();
  const MambaConfig c = small_config(false);
  const models::mamba::MambaModel m = models::mamba::random_mamba(c, rng());
  models::mamba::MambaState s(c);
  test::expect_error([&] { models::mamba::forward_cached(m, s, {3, 99}); }, {"99"});
  EXPECT_EQ(s.length(), 0);
  test::expect_error([&] { models::mamba::forward_cached(m, s, {}); }, {"no new tokens"});
  models::mamba::forward_cached(m, s, {1, 2});
  test::expect_error([&] { models::mamba::forward_cached(m, s, {3}, false, ScanPath::Convolution); }, {"empty state"});
  // The batch step is chapter 02's for both kinds of model: each refuses the other's cache by name.
  TransformerConfig t;
  t.architecture = "LlamaForCausalLM";
  t.hidden_size = 32, t.intermediate_size = 64, t.num_layers = 1, t.num_heads = 2, t.num_kv_heads = 2, t.head_dim = 16;
  t.vocab_size = c.vocab_size, t.max_position_embeddings = 16;
  const models::Llama llama = models::random_llama(t, rng());
  models::ContiguousKVCache kv(t, 16);
  std::vector<models::mamba::SequenceStep> wrong = {{{1}, &kv, false}};
  test::expect_error([&] { models::mamba::forward(m, wrong); }, {"sequence 0", "no MambaState"});
  std::vector<models::SequenceStep> also_wrong = {{{1}, &s, false}};
  test::expect_error([&] { models::forward(llama, also_wrong); }, {"cache of sequence 0", "not a cache of keys and values"});
}

// A config.json in a temporary folder, beside a model folder's weights.
std::string folder_with(const test::TempDir& dir, const std::string& from, const nlohmann::json& edits) {
  auto cfg = load_json(from + "/config.json");
  for (const auto& [k, v] : edits.items()) {
    if (v.is_null()) cfg.erase(k);
    else cfg[k] = v;
  }
  std::ofstream(dir.path() / "config.json") << cfg.dump(2);
  if (std::filesystem::exists(from + "/model.safetensors"))
    std::filesystem::create_symlink(std::filesystem::absolute(from + "/model.safetensors"),
                                    dir.path() / "model.safetensors");
  return dir.path().string();
}

const std::string kMamba = std::string(INFERLAB_DATA_DIR) + "/models/tiny-mamba";

TEST(MambaConfig, ReadsAsTransformersDoes) {
  test::TempDir dir;
  // Without intermediate_size E = int(expand · D); "auto" is ceil(D / 16).
  const auto c = models::mamba::parse_mamba_config(load_hf_config(folder_with(
      dir, kMamba, {{"intermediate_size", nullptr}, {"expand", 1.5}, {"time_step_rank", "auto"}, {"hidden_size", 100}})));
  EXPECT_EQ(c.inner_size, 150);
  EXPECT_EQ(c.dt_rank, 7);
  EXPECT_TRUE(c.tie_word_embeddings);  // absent: PretrainedConfig's default
  EXPECT_FALSE(c.lti);
  test::TempDir given;  // a config's intermediate_size wins over expand, as PretrainedConfig sets it last
  EXPECT_EQ(
      models::mamba::parse_mamba_config(load_hf_config(folder_with(given, kMamba, {{"intermediate_size", 999}}))).inner_size,
      999);
  const auto tiny = models::mamba::parse_mamba_config(load_hf_config(kMamba));
  EXPECT_EQ(tiny.state_bytes(4), 116736);  // the model card's number
}

TEST(MambaConfig, OtherModelsAndBadFieldsAreRefusedByName) {
  for (const auto& [edit, says] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"architectures", {"Mamba2ForCausalLM"}}, {"model_type", "mamba2"}}, "Mamba-2"},
           {{{"architectures", {"JambaForCausalLM"}}, {"model_type", "jamba"}}, "Jamba"},
           {{{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}}, "not a Mamba model"},
           {{{"hidden_act", "gelu"}}, "hidden_act"},
           {{{"time_step_rank", "big"}}, "time_step_rank"},
           {{{"state_size", 0}}, "state_size"},
           {{{"conv_kernel", -2}}, "conv_kernel"},
           // 1e300 is infinite in float32: the campaign's model ran one token and stopped
           {{{"layer_norm_epsilon", 1e300}}, "layer_norm_epsilon must be positive and within float32's range"},
           {{{"layer_norm_epsilon", 1e-60}}, "layer_norm_epsilon must be positive and within float32's range"},
           {{{"bos_token_id", -1}}, "bos_token_id -1 is outside the vocabulary"},
           // found by the hf_config fuzz target: expand · hidden_size overflowed the cast to int64
           {{{"hidden_size", std::numeric_limits<std::int64_t>::min()}}, "hidden_size is -9223372036854775808"}}) {
    test::TempDir dir;
    SCOPED_TRACE(edit.dump());
    test::expect_error([&] { models::mamba::parse_mamba_config(load_hf_config(folder_with(dir, kMamba, edit))); }, {says});
  }
}

TEST(MambaLoad, ACheckpointThatDisagreesWithItsConfigIsRefused) {
  if (!std::filesystem::exists(kMamba)) GTEST_SKIP() << kMamba << " is missing (see tools/README.md)";
  {
    test::TempDir dir;  // fewer layers than the checkpoint holds: its tensors of layer 5 are left over
    test::expect_error(
        [&] {
      models::mamba::load_mamba(folder_with(dir, kMamba, {{"num_hidden_layers", 5}}));
        },
        {"backbone.layers.5"});
  }
  {
    test::TempDir dir;  // a state size the tensors do not have
    test::expect_error([&] { models::mamba::load_mamba(folder_with(dir, kMamba, {{"state_size", 8}})); }, {"x_proj"});
  }
  {
    test::TempDir dir;  // biases the checkpoint does not have
    test::expect_error([&] { models::mamba::load_mamba(folder_with(dir, kMamba, {{"use_bias", true}})); }, {"in_proj.bias"});
  }
  {
    test::TempDir dir;
    test::expect_error(
        [&] {
      models::mamba::load_mamba(folder_with(dir, kMamba, {{"tie_word_embeddings", false}}));
        },
        {"lm_head"});
  }
}

}  // namespace
}  // namespace inferlab
