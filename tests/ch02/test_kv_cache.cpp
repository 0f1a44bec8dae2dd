// Chapters 01 and 02: a real checkpoint's reference output, and two paths to one answer
// (naive vs cached, prefill + decode vs one forward pass), plus the cache's size and limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numbers>

#include "chapters/01_naive_decode/convert.h"
#include "chapters/01_naive_decode/generate.h"
#include "common/cli.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/models/kv_cache.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "golden_util.h"
#include "test_util.h"

namespace inferlab {
namespace {

using models::Llama;
using test::expect_error;
constexpr double u = 0x1p-24;

// --- stories260K: a real pretrained checkpoint and its documented greedy output --------------
const std::vector<std::int32_t> kStories260KReference = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
    410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352,
    266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415};

std::string stories_dir() {
  const std::string d = test::shared_dir();
  return d.empty() ? "" : d + "/models/stories260K";
}

#define IL_REQUIRE_STORIES() \
  if (stories_dir().empty()) GTEST_SKIP() << "../shared/models/stories260K is absent (shared test data)"

TEST(Stories260K, GreedyFromBosReproducesTheReference) {
  IL_REQUIRE_STORIES();
  const Llama m = models::load_llama(stories_dir() + "/stories260K.bin");
  EXPECT_EQ(m.config.num_kv_heads, 4);
  EXPECT_TRUE(m.config.tie_word_embeddings);
  EXPECT_EQ(m.rope_pairing, RopePairing::Adjacent);
  Sampler a({}), b({});
  const auto naive = ch01::generate_naive(m, {1}, 60, a, {});
  const auto cached = models::generate_cached(m, {1}, 60, b, {});
  EXPECT_EQ(naive.generated, kStories260KReference);
  EXPECT_EQ(cached.generated, kStories260KReference);
  const auto tok = Tokenizer::for_model(stories_dir() + "/stories260K.bin");
  std::vector<std::int32_t> all = {1};
  all.insert(all.end(), kStories260KReference.begin(), kStories260KReference.end());
  EXPECT_EQ(tok->decode(all, true),
            "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, "
            "she saw a big, red ball. She wanted to play with it, but it was too high");
}

TEST(Stories260K, TokenizerRoundTripAndItsHuggingFaceConversion) {
  IL_REQUIRE_STORIES();
  const auto tok = Llama2cTokenizer::load(stories_dir() + "/tok512.bin");
  EXPECT_EQ(tok.vocab_size(), 512);
  test::TempDir dir;
  test::write_file(dir.file("tokenizer.json"), tok.to_tokenizer_json());
  const HfTokenizer hf = HfTokenizer::load(dir.path().string());
  for (const std::string s : {"Once upon a time, there was a little girl named Lily.", "Tom said \"Hi!\"\n\nThe end.",
                              "Émile ate 12 café crêpes 🍰", "  two  spaces", "a"}) {
    SCOPED_TRACE(s);
    EXPECT_EQ(hf.encode(s), tok.encode(s));  // SentencePiece BPE by scores == BPE by ranked merges
    EXPECT_EQ(tok.decode(tok.encode(s), true), s);
  }
}

TEST(Stories260K, LlamaCToHuggingFaceConversionGivesTheSameLogits) {
  // Two paths to one model: llama2.c's adjacent-pair RoPE on the original q/k rows, and
  // Hugging Face's rotate-half RoPE on rows permuted as its conversion script permutes them.
  IL_REQUIRE_STORIES();
  const auto ck = load_llama2c(stories_dir() + "/stories260K.bin");
  Llama a = models::load_llama(stories_dir() + "/stories260K.bin");
  Llama b = a;
  b.rope_pairing = RopePairing::HalfSplit;
  for (auto& l : b.layers) {
    l.wq.weight = permute_rope_rows(l.wq.weight, a.config.num_heads, true);
    l.wk.weight = permute_rope_rows(l.wk.weight, a.config.num_kv_heads, true);
  }
  const std::vector<std::int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  const auto la = ch01::forward(a, toks, true).to_float_vector(), lb = ch01::forward(b, toks, true).to_float_vector();
  // The rotations pair the same numbers and the dot products q·k sum the same products in a
  // different order: within γ_H of each score, far below a logit's scale.
  for (std::size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-4) << i;
  // And the file round-trips through our llama2.c writer.
  test::TempDir dir;
  save_llama2c(dir.file("copy.bin"), ck.config, ck.tensors);
  const auto ck2 = load_llama2c(dir.file("copy.bin"));
  for (const auto& [name, t] : ck.tensors) EXPECT_EQ(ck2.tensors.at(name).to_float_vector(), t.to_float_vector()) << name;
}

TEST(Stories260K, ConvertedToAHuggingFaceFolderAndBack) {
  IL_REQUIRE_STORIES();
  test::TempDir dir;
  const std::string hf = dir.file("hf"), back = dir.file("back.bin");
  ch01::convert_llama2c_to_hf(stories_dir() + "/stories260K.bin", "", hf);
  const Llama a = models::load_llama(stories_dir() + "/stories260K.bin"), b = models::load_llama(hf);
  EXPECT_EQ(b.rope_pairing, RopePairing::HalfSplit);
  const std::vector<std::int32_t> toks = {1, 403, 407, 261, 378, 432, 383};
  const auto la = ch01::forward(a, toks, true).to_float_vector(), lb = ch01::forward(b, toks, true).to_float_vector();
  for (std::size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-4) << i;
  Sampler s({});
  EXPECT_EQ(models::generate_cached(b, {1}, 60, s, {}).generated, kStories260KReference);
  const auto tok = Tokenizer::for_model(hf);  // the converted tokenizer.json
  EXPECT_EQ(tok->encode("Once upon a time"),
            Llama2cTokenizer::load(stories_dir() + "/tok512.bin").encode("Once upon a time"));
  ch01::convert_hf_to_llama2c(hf, back);  // and back: the original weights, bit for bit
  const auto ck = load_llama2c(stories_dir() + "/stories260K.bin"), ck2 = load_llama2c(back);
  for (const auto& [name, t] : ck.tensors) EXPECT_EQ(ck2.tensors.at(name).to_float_vector(), t.to_float_vector()) << name;
  // What the llama2.c header cannot say is refused, not written into a file that computes
  // something else: another rms_norm_eps, and a llama2.c file given as the "Hugging Face" side.
  auto cfg = load_json(hf + "/config.json");
  cfg["rms_norm_eps"] = 1e-6;
  write_json(hf + "/config.json", cfg);
  expect_error([&] { ch01::convert_hf_to_llama2c(hf, back); }, {"hf", "cannot express", "rms_norm_eps 1e-06"});
  expect_error([&] { ch01::convert_hf_to_llama2c(stories_dir() + "/stories260K.bin", back); },
               {"stories260K.bin is already a llama2.c checkpoint"});
}

TEST(Llama2c, BrokenFilesAreClearErrors) {
  test::TempDir dir;
  test::write_file(dir.file("short.bin"), "abc");
  expect_error([&] { load_llama2c(dir.file("short.bin")); }, {"short.bin", "too short"});
  std::string header(28, '\0');
  const std::int32_t h[7] = {64, 172, 5, 8, 4, 512, 512};
  std::memcpy(header.data(), h, 28);
  test::write_file(dir.file("trunc.bin"), header + std::string(1000, '\0'));
  expect_error([&] { load_llama2c(dir.file("trunc.bin")); }, {"trunc.bin", "truncated"});
  const std::int32_t bad[7] = {64, 172, 5, 7, 4, 512, 512};
  std::memcpy(header.data(), bad, 28);
  test::write_file(dir.file("bad.bin"), header);
  expect_error([&] { load_llama2c(dir.file("bad.bin")); }, {"bad.bin", "not a multiple of n_heads"});
  test::write_file(dir.file("tok.bin"), std::string("\x10\0\0\0\0\0\0\0\x05\0\0\0ab", 14));
  expect_error([&] { Llama2cTokenizer::load(dir.file("tok.bin")); }, {"tok.bin", "token 0 is truncated"});
  // A NaN score ranks no merge: refused, not used.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string tok(4, '\0');
  tok[0] = 4;
  for (int i = 0; i < 5; ++i) {
    const float score = i == 3 ? nan : -1.0f * static_cast<float>(i);
    const std::int32_t len = 1;
    tok.append(reinterpret_cast<const char*>(&score), 4).append(reinterpret_cast<const char*>(&len), 4);
    tok += static_cast<char>('a' + i);
  }
  test::write_file(dir.file("nan.bin"), tok);
  expect_error([&] { Llama2cTokenizer::load(dir.file("nan.bin")); }, {"nan.bin", "token 3 has score nan", "finite"});
}

TEST(Llama2c, CraftedHeadersAreRefusedWithoutOverflow) {
  test::TempDir dir;
  std::string header(28, '\0');
  // -2^31: no positive counterpart (std::abs of it was undefined behaviour).
  const std::int32_t intmin[7] = {64, 172, 5, 8, 4, INT32_MIN, 512};
  std::memcpy(header.data(), intmin, 28);
  test::write_file(dir.file("intmin.bin"), header);
  expect_error([&] { load_llama2c(dir.file("intmin.bin")); }, {"intmin.bin", "vocab_size = -2147483648"});
  // Every field below 2^24, but layers × dim × hidden_dim passes 2^63 (it overflowed while counting):
  // the shared config limits refuse it before any size is computed.
  const std::int32_t big[7] = {(1 << 24) - 4, (1 << 24) - 1, (1 << 24) - 1, 2, 2, (1 << 24) - 1, (1 << 24) - 1};
  std::memcpy(header.data(), big, 28);
  test::write_file(dir.file("big.bin"), header);
  expect_error([&] { load_llama2c(dir.file("big.bin")); }, {"big.bin", "'hidden_size' must be in [1, 1048576]"});
  const std::int32_t odd[7] = {72, 172, 5, 8, 8, 512, 512};  // head size 9
  std::memcpy(header.data(), odd, 28);
  test::write_file(dir.file("odd.bin"), header);
  expect_error([&] { load_llama2c(dir.file("odd.bin")); }, {"odd.bin", "9 must be even"});
}

TEST(Llama2c, ATokenizerBinMustHoldExactlyTheModelsVocabulary) {
  // tokenizer.bin stores no count: one cut at a token boundary still loads, with fewer tokens.
  test::TempDir dir;
  std::string bin(4, '\0');
  bin[0] = 8;
  for (const char* piece : {"<unk>", "<s>", "</s>", " ", "a", "b"}) {
    const float score = 0;
    const std::int32_t len = static_cast<std::int32_t>(std::strlen(piece));
    bin.append(reinterpret_cast<const char*>(&score), 4).append(reinterpret_cast<const char*>(&len), 4).append(piece);
  }
  test::write_file(dir.file("tok.bin"), bin);
  const auto tok = Llama2cTokenizer::load(dir.file("tok.bin"));
  EXPECT_NO_THROW(check_tokenizer_vocab(tok, 6, "model.bin"));
  expect_error([&] { check_tokenizer_vocab(tok, 7, "model.bin"); }, {"tok.bin", "6 tokens", "model.bin", "7"});
  expect_error([&] { check_tokenizer_vocab(tok, 5, "model.bin"); }, {"tok.bin", "6 tokens", "5"});
  // A tokenizer.json may be smaller than a padded embedding table, never larger.
  const auto hf = HfTokenizer::load(std::string(INFERLAB_DATA_DIR) + "/models/tiny-mha");
  EXPECT_NO_THROW(check_tokenizer_vocab(hf, 1024, "tiny-mha"));
  expect_error([&] { check_tokenizer_vocab(hf, 512, "tiny-mha"); }, {"988 tokens", "512"});
  if (!stories_dir().empty()) {  // the real one, cut after 510 of its 512 tokens
    const auto full = Llama2cTokenizer::load(stories_dir() + "/tok512.bin");
    const auto model = load_llama2c(stories_dir() + "/stories260K.bin");
    EXPECT_NO_THROW(check_tokenizer_vocab(full, model.config.vocab_size, "stories260K.bin"));
    std::ifstream in(stories_dir() + "/tok512.bin", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    std::size_t at = 4;
    for (int i = 0; i < 510; ++i) {
      std::int32_t len;
      std::memcpy(&len, all.data() + at + 4, 4);
      at += 8 + static_cast<std::size_t>(len);
    }
    test::write_file(dir.file("tok510.bin"), all.substr(0, at));
    const auto short_tok = Llama2cTokenizer::load(dir.file("tok510.bin"));
    EXPECT_EQ(short_tok.vocab_size(), 510);
    expect_error([&] { check_tokenizer_vocab(short_tok, 512, "stories260K.bin"); }, {"510 tokens", "512"});
  }
}

// --- two paths on random models -------------------------------------------------------------
TransformerConfig small_config(std::int64_t kv_heads, std::int64_t layers = 2) {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 64, c.intermediate_size = 160, c.num_layers = layers, c.num_heads = 8, c.num_kv_heads = kv_heads;
  c.head_dim = 8, c.vocab_size = 97, c.max_position_embeddings = 128, c.rms_norm_eps = 1e-5, c.rope_theta = 10000;
  return c;
}

using test::random_tokens;

// The two paths run the same float32 arithmetic except the matmuls' summation order (GEMV for
// one row, GEMM for many). Each dependent stage on the way to a logit (q/k/v, QKᵀ, PV, o, gate
// and up, down per layer; embedding and head) can add γ_K of its inputs' scale, K its inner
// size; first-order errors add along the P = 6L + 2 stages. Each path is within P·γ_K·scale of
// the exact logits, so the two are within 2·P·γ_K·scale of each other, scale = max |logit|·4
// allowing a condition factor of 4 for these randomly initialised models.
double two_path_bound(const TransformerConfig& c, const std::vector<float>& logits) {
  double scale = 0;
  for (float v : logits) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  const double P = 6.0 * static_cast<double>(c.num_layers) + 2;
  const double K = static_cast<double>(std::max({c.hidden_size, c.intermediate_size, c.max_position_embeddings}));
  return 2 * P * test::gamma(K) * 4 * scale;
}

struct TwoPathCase {
  std::int64_t kv_heads;
  std::size_t prompt, decode;
};

class TwoPaths : public ::testing::TestWithParam<TwoPathCase> {};

TEST_P(TwoPaths, PrefillThenDecodeEqualsOneForwardPass) {
  const auto [K, P, n] = GetParam();
  auto rng = test::rng_for_test();
  const auto c = small_config(K);
  const Llama m = models::random_llama(c, rng());
  const auto tokens = random_tokens(rng, P + n, c.vocab_size);
  // One forward pass over all P + n tokens (chapter 01) ...
  const auto full = ch01::forward(m, tokens, true).to_float_vector();
  // ... against prefill(P) and n single-token decode steps through the cache (chapter 02).
  models::ContiguousKVCache cache(c, static_cast<std::int64_t>(P + n));
  std::vector<float> cached =
      models::forward_cached(m, cache, {tokens.begin(), tokens.begin() + static_cast<long>(P)}, true).to_float_vector();
  for (std::size_t i = P; i < P + n; ++i) {
    const auto row = models::forward_cached(m, cache, {tokens[i]}).to_float_vector();
    cached.insert(cached.end(), row.begin(), row.end());
  }
  ASSERT_EQ(cached.size(), full.size());
  EXPECT_EQ(cache.length(), static_cast<std::int64_t>(P + n));
  const double bound = two_path_bound(c, full);
  double worst = 0;
  for (std::size_t i = 0; i < full.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(full[i] - cached[i])));
  EXPECT_LE(worst, bound) << "max |Δ logit| over " << full.size() << " logits";
  RecordProperty("worst_over_bound", std::to_string(worst / bound));
}

INSTANTIATE_TEST_SUITE_P(Configs, TwoPaths,
                         ::testing::Values(TwoPathCase{8, 1, 20}, TwoPathCase{8, 17, 12}, TwoPathCase{2, 1, 30},
                                           TwoPathCase{2, 40, 8}, TwoPathCase{1, 9, 9}, TwoPathCase{4, 64, 1}),
                         [](const auto& info) {
  return "K" + std::to_string(info.param.kv_heads) + "_prompt" + std::to_string(info.param.prompt) + "_decode" +
         std::to_string(info.param.decode);
});

TEST(TwoPaths, NaiveAndCachedGenerationChooseTheSameTokens) {
  auto rng = test::rng_for_test();
  const SamplingParams params{0.9f, 20, 0.95f, 11};
  for (std::int64_t K : {8, 2, 1}) {
    const auto c = small_config(K, 3);
    const Llama m = models::random_llama(c, rng());
    const auto prompt = random_tokens(rng, 5, c.vocab_size);
    Sampler a(params), b(params);
    const auto naive = ch01::generate_naive(m, prompt, 40, a, {});
    const auto cached = models::generate_cached(m, prompt, 40, b, {});
    ASSERT_EQ(naive.generated.size(), cached.generated.size()) << "K = " << K;
    const auto split = std::mismatch(naive.generated.begin(), naive.generated.end(), cached.generated.begin());
    if (split.first == naive.generated.end()) continue;
    // The two paths' logits agree to a few units in the last place (above), so a sampled token can
    // differ only where the step's random draw lands that close to a boundary between tokens (top-k,
    // top-p or the cumulative sum): rare, but over every run of the suite it happens. Such a split
    // must then be exactly that: the same prefix, logits within the two-path bound, and the same
    // random number choosing each path's token from its own logits. A bug in either loop (a token
    // fed twice, a draw skipped) fails here, since its token would not be the one its logits give.
    const auto j = static_cast<std::size_t>(split.first - naive.generated.begin());
    std::vector<std::int32_t> prefix = prompt;
    prefix.insert(prefix.end(), naive.generated.begin(), naive.generated.begin() + static_cast<long>(j));
    const auto l1 = ch01::forward(m, prefix);
    models::ContiguousKVCache cache(c, static_cast<std::int64_t>(prefix.size()));
    Tensor l2 = models::forward_cached(m, cache, prompt);
    for (std::size_t i = prompt.size(); i < prefix.size(); ++i) l2 = models::forward_cached(m, cache, {prefix[i]});
    const auto v1 = l1.to_float_vector(), v2 = l2.to_float_vector();
    double worst = 0;
    for (std::size_t i = 0; i < v1.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(v1[i] - v2[i])));
    EXPECT_LE(worst, two_path_bound(c, v1)) << "K = " << K << ", token " << j;
    const auto replay = [&](const Tensor& logits) {
      Sampler s(params);
      for (std::size_t i = 0; i < j; ++i) s.uniform();  // one random number per token drawn before
      return s.sample(logits);
    };
    EXPECT_EQ(replay(l1), naive.generated[j])
        << "K = " << K << ": the naive loop's token " << j << " is not its logits' draw";
    EXPECT_EQ(replay(l2), cached.generated[j])
        << "K = " << K << ": the cached loop's token " << j << " is not its logits' draw";
  }
}

// The batch step: prefill chunks and decode tokens of different sequences in one forward pass
// give each sequence what it gets alone (the matmuls see more rows, so within the two-path bound).
TEST(BatchStep, MixedPrefillChunksAndDecodeTokensEqualEachSequenceAlone) {
  auto rng = test::rng_for_test();
  const auto c = small_config(2);
  const Llama m = models::random_llama(c, rng());
  struct Seq {
    std::size_t cached, fresh;
    bool all;
  };
  const std::vector<Seq> plan = {{3, 5, false}, {11, 1, false}, {0, 7, true}, {20, 1, true}};
  std::vector<std::unique_ptr<models::ContiguousKVCache>> batched, alone;
  std::vector<models::SequenceStep> steps;
  std::vector<float> want;
  for (const Seq& p : plan) {
    const auto toks = random_tokens(rng, p.cached + p.fresh, c.vocab_size);
    const std::vector<std::int32_t> before(toks.begin(), toks.begin() + static_cast<long>(p.cached)),
        fresh(toks.begin() + static_cast<long>(p.cached), toks.end());
    batched.push_back(std::make_unique<models::ContiguousKVCache>(c, 40));
    alone.push_back(std::make_unique<models::ContiguousKVCache>(c, 40));
    if (p.cached) models::forward_cached(m, *batched.back(), before), models::forward_cached(m, *alone.back(), before);
    const auto one = models::forward_cached(m, *alone.back(), fresh, p.all).to_float_vector();
    want.insert(want.end(), one.begin(), one.end());
    steps.push_back({fresh, batched.back().get(), p.all});
  }
  const auto got = models::forward(m, steps).to_float_vector();
  ASSERT_EQ(got.size(), want.size());  // 1 + 1 + 7 + 1 rows of logits
  EXPECT_EQ(got.size(), static_cast<std::size_t>(10 * c.vocab_size));
  const double bound = two_path_bound(c, want);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], bound) << i;
  for (std::size_t b = 0; b < plan.size(); ++b) EXPECT_EQ(batched[b]->length(), alone[b]->length());
  // Entries the batch cannot run are errors that name the sequence.
  std::vector<models::SequenceStep> bad = {{{1}, batched[0].get()}, {{}, batched[1].get()}};
  expect_error([&] { models::forward(m, bad); }, {"sequence 1", "no new tokens"});
  bad = {{{1}, nullptr}};
  expect_error([&] { models::forward(m, bad); }, {"sequence 0", "no cache"});
}

TEST(BatchStep, ChunkedPrefillEqualsOneShotPrefill) {
  auto rng = test::rng_for_test();
  const auto c = small_config(4);
  const Llama m = models::random_llama(c, rng());
  const auto toks = random_tokens(rng, 23, c.vocab_size);
  models::ContiguousKVCache whole(c, 32), chunked(c, 32);
  const auto a = models::forward_cached(m, whole, toks, true).to_float_vector();
  std::vector<float> b;
  for (std::size_t at = 0; at < toks.size(); at += 5) {
    const std::vector<std::int32_t> part(toks.begin() + static_cast<long>(at),
                                         toks.begin() + static_cast<long>(std::min(toks.size(), at + 5)));
    const auto l = models::forward_cached(m, chunked, part, true).to_float_vector();
    b.insert(b.end(), l.begin(), l.end());
  }
  ASSERT_EQ(a.size(), b.size());
  const double bound = two_path_bound(c, a);
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], bound) << i;
}

TEST(KVCache, TruncateRollsBackExactlyAndReleaseFreesIt) {
  auto rng = test::rng_for_test();
  const auto c = small_config(2);
  const Llama m = models::random_llama(c, rng());
  const auto toks = random_tokens(rng, 14, c.vocab_size);
  models::ContiguousKVCache cache(c, 20);
  models::forward_cached(m, cache, {toks.begin(), toks.begin() + 10});
  const auto first = models::forward_cached(m, cache, {toks[10], toks[11]}, true).to_float_vector();
  models::forward_cached(m, cache, {toks[12], toks[13]});  // tokens that a rollback rejects
  EXPECT_EQ(cache.length(), 14);
  cache.truncate(10);  // speculative sampling's rollback: back to the accepted prefix
  EXPECT_EQ(cache.length(), 10);
  // The same arithmetic on the same cached rows: bit for bit the logits of before.
  EXPECT_EQ(models::forward_cached(m, cache, {toks[10], toks[11]}, true).to_float_vector(), first);
  expect_error([&] { cache.truncate(13); }, {"cannot truncate 12", "to 13"});
  EXPECT_GT(cache.bytes(), 0);
  cache.release();
  EXPECT_EQ(cache.bytes(), 0);
  EXPECT_EQ(cache.length(), 0);
  expect_error([&] { models::forward_cached(m, cache, {1}); }, {"KV cache"});
}

// The cache alone, without a model: attending chunk by chunk (a prefill, then decode steps) gives
// each query what one causal attention over the whole sequence gives it, and keeps every row.
TEST(KVCache, AttendingChunkByChunkEqualsOneAttentionOverTheWholeSequence) {
  auto rng = test::rng_for_test();
  const auto c = small_config(2);
  const std::int64_t T = 9, N = c.num_heads, K = c.num_kv_heads, H = c.head_dim;
  std::vector<Tensor> q, k, v;
  for (std::int64_t layer = 0; layer < c.num_layers; ++layer) {
    q.push_back(test::uniform(rng, {T, N, H}));
    k.push_back(test::uniform(rng, {T, K, H}));
    v.push_back(test::uniform(rng, {T, K, H}));
  }
  models::ContiguousKVCache cache(c, T);
  const std::vector<std::int64_t> chunks = {0, 5, 6, 7, T};  // a prompt of 5, then one token a step
  for (std::size_t i = 0; i + 1 < chunks.size(); ++i) {
    const std::int64_t a = chunks[i], b = chunks[i + 1];
    for (std::size_t l = 0; l < q.size(); ++l) {
      Tensor out = Tensor::empty({b - a, N, H}, DType::F32);
      cache.attend(static_cast<std::int64_t>(l), q[l].slice(0, a, b), k[l].slice(0, a, b), v[l].slice(0, a, b), out);
      // The same kernel over the same rows: equal bit for bit.
      EXPECT_EQ(out.to_float_vector(), ops::attention(q[l], k[l], v[l]).slice(0, a, b).to_float_vector())
          << "layer " << l << ", rows " << a << ".." << b;
    }
    cache.commit(b - a);  // every layer has kept the chunk
  }
  for (std::size_t l = 0; l < q.size(); ++l) {
    EXPECT_EQ(cache.k(static_cast<std::int64_t>(l)).to_float_vector(), k[l].to_float_vector());
    EXPECT_EQ(cache.v(static_cast<std::int64_t>(l)).to_float_vector(), v[l].to_float_vector());
  }
}

TEST(BatchStep, EachSequencesNewTokensSitAfterItsCachedPositions) {
  const auto c = small_config(2);
  const Llama m = models::random_llama(c, 1);
  models::ContiguousKVCache a(c, 16), b(c, 16), d(c, 16);
  a.commit(3), d.commit(11);  // three and eleven positions already cached, b is empty
  std::vector<models::SequenceStep> seqs = {{{7, 8}, &a}, {{1, 2, 3, 4}, &b, true}, {{9}, &d}};
  const models::Batch batch(m, seqs);
  EXPECT_EQ(batch.tokens, (std::vector<std::int32_t>{7, 8, 1, 2, 3, 4, 9}));
  const std::int32_t* pos = batch.pos.data<std::int32_t>();
  EXPECT_EQ(std::vector<std::int32_t>(pos, pos + batch.pos.numel()), (std::vector<std::int32_t>{3, 4, 0, 1, 2, 3, 11}));
  EXPECT_EQ(batch.begin, (std::vector<std::int64_t>{0, 2, 6, 7}));
  EXPECT_EQ(batch.logit_rows, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6}));  // b asked for all its rows
}

TEST(Llama, ADecodeStepReadsOneEmbeddingRowUnlessTheHeadIsTheTable) {
  auto c = small_config(2);
  const Llama untied = models::random_llama(c, 1);
  const std::int64_t table = c.vocab_size * c.hidden_size * 4, row = c.hidden_size * 4;
  EXPECT_EQ(untied.step_weight_bytes(), untied.weight_bytes() - table + row);
  c.tie_word_embeddings = true;
  const Llama tied = models::random_llama(c, 1);
  EXPECT_EQ(tied.step_weight_bytes(), tied.weight_bytes());  // the head reads the whole table
  EXPECT_EQ(untied.weight_bytes() - tied.weight_bytes(), table);
}

TEST(KVCache, BytesEqualTheFormulaAndOverflowIsAnError) {
  const auto c = small_config(2);
  models::ContiguousKVCache cache(c, 100);
  EXPECT_EQ(cache.bytes(), 100 * c.num_kv_heads * c.head_dim * c.num_layers * 2 * 4);  // S × K × H × L × 2 × 4
  const models::ContiguousKVCache bf(c, 100, Device::CPU, DType::BF16);
  EXPECT_EQ(bf.bytes(), 100 * 2 * 8 * 2 * 2 * 2);
  const Llama m = models::random_llama(c, 1);
  models::forward_cached(m, cache, std::vector<std::int32_t>(98, 3));
  expect_error([&] { models::forward_cached(m, cache, {1, 2, 3}); }, {"KV cache full", "98", "capacity of 100"});
  Sampler s({});
  expect_error([&] { models::generate_cached(m, std::vector<std::int32_t>(100, 1), 40, s, {}); },
               {"longer than the model's context of 128"});
  expect_error([&] { ch01::forward(m, {5, 97}); }, {"token id 97"});
}

// --- writers that must not destroy their input, and loaders that refuse NaN -------------------
// A model's weights under Hugging Face names (the embedding tied to the head).
std::map<std::string, Tensor> tied_hf_tensors(const Llama& m) {
  std::map<std::string, Tensor> t = {{"model.embed_tokens.weight", m.embed}, {"model.norm.weight", m.final_norm}};
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = l.attn_norm, t[p + "post_attention_layernorm.weight"] = l.mlp_norm;
    t[p + "self_attn.q_proj.weight"] = l.wq.weight, t[p + "self_attn.k_proj.weight"] = l.wk.weight;
    t[p + "self_attn.v_proj.weight"] = l.wv.weight, t[p + "self_attn.o_proj.weight"] = l.wo.weight;
    t[p + "mlp.gate_proj.weight"] = l.w_gate.weight, t[p + "mlp.up_proj.weight"] = l.w_up.weight;
    t[p + "mlp.down_proj.weight"] = l.w_down.weight;
  }
  return t;
}

// A small random model in `dir`: model.bin and tokenizer.bin (llama2.c), and hf/ (config.json,
// model.safetensors) holding `dtype` weights.
struct SmallModel {
  std::string bin, tok, hf;
  TransformerConfig config;
  std::map<std::string, Tensor> tensors;
};
SmallModel small_model(const test::TempDir& dir, DType dtype = DType::F32) {
  SmallModel s{dir.file("model.bin"), dir.file("tokenizer.bin"), dir.file("hf"), small_config(2), {}};
  s.config.tie_word_embeddings = true;
  s.tensors = tied_hf_tensors(models::random_llama(s.config, 5, dtype));
  save_llama2c(s.bin, s.config, s.tensors);
  std::string tok;  // max_token_length, then per token: score, length, bytes
  auto put = [&](auto v) { tok.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(std::int32_t{8});
  for (std::int32_t i = 0; i < s.config.vocab_size; ++i) {
    const std::string piece = "t" + std::to_string(i);
    put(-static_cast<float>(i)), put(static_cast<std::int32_t>(piece.size()));
    tok += piece;
  }
  test::write_file(s.tok, tok);
  std::filesystem::create_directory(s.hf);
  save_safetensors(s.hf + "/model.safetensors", {s.tensors.begin(), s.tensors.end()});
  test::write_file(s.hf + "/config.json", R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":160,"num_hidden_layers":2,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":97,
      "max_position_embeddings":128,"rms_norm_eps":1e-5,"tie_word_embeddings":true})");
  return s;
}

// convert used to write into the folder it read, replacing the model it was converting.
TEST(Convert, RefusesToWriteOverItsInput) {
  test::TempDir dir;
  const SmallModel s = small_model(dir);
  const auto before = test::list_folder(dir.path().string());
  expect_error([&] { ch01::convert_llama2c_to_hf(s.bin, s.tok, dir.path().string()); },
               {"output folder", "holds", "model.bin", "another folder"});
  EXPECT_EQ(test::list_folder(dir.path().string()), before);
  const std::string weights = s.hf + "/model.safetensors", bytes = test::read_file(weights);
  expect_error([&] { ch01::convert_hf_to_llama2c(s.hf, weights); }, {weights, "the folder this command reads"});
  expect_error([&] { ch01::convert_hf_to_llama2c(s.hf, s.hf + "/config.json"); }, {"config.json", "reads"});
  expect_error([&] { ch01::convert_hf_to_llama2c(s.hf, s.hf); }, {"which this command reads"});
  EXPECT_TRUE(test::read_file(weights) == bytes) << weights << " changed";  // not printed: megabytes
  // Elsewhere both directions work, and give back the same file.
  ch01::convert_llama2c_to_hf(s.bin, s.tok, dir.file("out"));
  ch01::convert_hf_to_llama2c(dir.file("out"), dir.file("back.bin"));
  EXPECT_TRUE(test::read_file(dir.file("back.bin")) == test::read_file(s.bin)) << "back.bin differs";
}

// save_llama2c finds a missing tensor only after writing the ones before it: that used to leave
// a partial file at the target.
TEST(Convert, AWriterFailingHalfwayLeavesNoFile) {
  test::TempDir dir;
  const SmallModel s = small_model(dir);
  auto missing = s.tensors;
  missing.erase("model.norm.weight");  // written after every layer
  test::TempDir out;
  expect_error([&] { save_llama2c(out.file("m.bin"), s.config, missing); }, {"no tensor 'model.norm.weight'"});
  EXPECT_TRUE(test::list_folder(out.path().string()).empty());
  // Over an existing file, the old file stays as it was.
  const std::string old = test::read_file(s.bin);
  expect_error([&] { save_llama2c(s.bin, s.config, missing); }, {"model.norm.weight"});
  EXPECT_TRUE(test::read_file(s.bin) == old) << s.bin << " changed";
  EXPECT_EQ(test::list_folder(dir.path().string()), (std::vector<std::string>{"hf", "model.bin", "tokenizer.bin"}));
}

// An error during generation says which token was being generated and at which position (it
// used to be the sampler's "sample: logit 0 is NaN" alone, for any of the steps).
TEST(Generate, AnErrorInAStepNamesTheTokenAndItsPosition) {
  Sampler s({});
  int step = 0;
  auto logits = [&](const std::vector<std::int32_t>&) {
    std::vector<float> l{0.5f, 1.0f, 0.25f};
    if (++step == 3) l[0] = std::numeric_limits<float>::quiet_NaN();  // the model's output breaks at the third step
    return Tensor::from_vector(l, {1, 3});
  };
  expect_error(
      [&] {
    models::generate({2, 0, 2, 0}, 8, s, {}, Device::CPU, models::Feed::NewTokens, logits);
      },
      {"generating token 3 (position 6): sample: logit 0 is NaN"});
}

// A NaN or infinite weight used to load and generate (NaN logits, or 0 once quantised).
TEST(Loading, NonFiniteWeightsAreRefusedNamingTheTensor) {
  for (DType d : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(d)));
    test::TempDir dir;
    SmallModel s = small_model(dir, d);
    EXPECT_EQ(models::load_llama(s.hf).layers.size(), 2u);
    Tensor norm = s.tensors.at("model.layers.1.post_attention_layernorm.weight").to(DType::F32);
    norm.at<float>({17}) = std::numeric_limits<float>::quiet_NaN();
    s.tensors["model.layers.1.post_attention_layernorm.weight"] = norm.to(d);
    save_safetensors(s.hf + "/model.safetensors", {s.tensors.begin(), s.tensors.end()});
    expect_error([&] { models::load_llama(s.hf); },
                 {s.hf, "model.layers.1.post_attention_layernorm.weight", "element [17] is nan"});
  }
  test::TempDir dir;
  SmallModel s = small_model(dir);
  Tensor embed = s.tensors.at("model.embed_tokens.weight").clone();
  embed.at<float>({3, 5}) = -std::numeric_limits<float>::infinity();
  s.tensors["model.embed_tokens.weight"] = embed;
  save_llama2c(s.bin, s.config, s.tensors);
  expect_error([&] { models::load_llama(s.bin); }, {"model.bin", "model.embed_tokens.weight", "element [3, 5] is -inf"});
}

// The tensors of a one-layer model under Hugging Face names, lm_head included.
std::vector<std::pair<std::string, Tensor>> hf_tensors(const Llama& m) {
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"model.embed_tokens.weight", m.embed}, {"model.norm.weight", m.final_norm}, {"lm_head.weight", m.lm_head.weight}};
  const auto& l = m.layers[0];
  for (auto [n, t] : {std::pair{"input_layernorm.weight", l.attn_norm},
                      {"self_attn.q_proj.weight", l.wq.weight},
                      {"self_attn.k_proj.weight", l.wk.weight},
                      {"self_attn.v_proj.weight", l.wv.weight},
                      {"self_attn.o_proj.weight", l.wo.weight},
                      {"post_attention_layernorm.weight", l.mlp_norm},
                      {"mlp.gate_proj.weight", l.w_gate.weight},
                      {"mlp.up_proj.weight", l.w_up.weight},
                      {"mlp.down_proj.weight", l.w_down.weight}})
    ts.emplace_back(std::string("model.layers.0.") + n, t);
  return ts;
}

TEST(Loading, ModelFoldersAndTheirErrors) {
  test::TempDir dir;
  auto c = small_config(2, 1);
  const Llama m = models::random_llama(c, 3, DType::BF16);
  auto ts = hf_tensors(m);
  const auto& l = m.layers[0];
  save_safetensors(dir.file("model.safetensors"), ts);
  test::write_file(dir.file("config.json"), R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":160,"num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":97,
      "max_position_embeddings":128,"rms_norm_eps":1e-5})");
  const Llama back = models::load_llama(dir.path().string());
  EXPECT_EQ(back.weight_dtype(), DType::BF16);
  const std::vector<std::int32_t> toks = {1, 2, 3};
  EXPECT_EQ(ch01::forward(back, toks).to_float_vector(), ch01::forward(m, toks).to_float_vector());
  // A checkpoint with more layers than the config says would otherwise run truncated.
  ts.emplace_back("model.layers.1.input_layernorm.weight", l.attn_norm);
  save_safetensors(dir.file("model.safetensors"), ts);
  expect_error([&] { models::load_llama(dir.path().string()); },
               {"'model.layers.1.input_layernorm.weight' is not part of the model", "num_hidden_layers"});
  test::write_file(dir.file("config.json"), R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":128,"num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":2,"vocab_size":97})");
  expect_error([&] { models::load_llama(dir.path().string()); },
               {"mlp.gate_proj.weight", "[160, 64]", "expected [128, 64]"});
  test::write_file(dir.file("config.json"), R"({"architectures":["MambaForCausalLM"],"hidden_size":64})");
  expect_error([&] { models::load_llama(dir.path().string()); }, {"MambaForCausalLM", "not a Llama-family"});
  for (const char* bad : {R"({"hidden_size":64})", R"({"architectures":[]})", R"({"architectures":"LlamaForCausalLM"})"}) {
    test::write_file(dir.file("config.json"), bad);
    expect_error([&] { models::load_llama(dir.path().string()); }, {"config.json", "field 'architectures'"});
  }
  expect_error([&] { models::load_llama(dir.file("nothing")); }, {"nothing", "no such file"});
}

TEST(Loading, ConfigFieldsTheCheckpointDoesNotBackAreRefusedByName) {
  test::TempDir dir;
  const Llama m = models::random_llama(small_config(2, 1), 3, DType::BF16);
  auto ts = hf_tensors(m);
  const std::string config = dir.file("config.json"), base = R"({"architectures":["LlamaForCausalLM"],
      "hidden_size":64,"intermediate_size":160,"num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":2,
      "vocab_size":97,"max_position_embeddings":128,"rms_norm_eps":1e-5)";
  test::write_file(config, base + "}");
  // Without lm_head.weight an untied model used to run with the embedding as its head.
  ts.erase(ts.begin() + 2);
  save_safetensors(dir.file("model.safetensors"), ts);
  expect_error([&] { models::load_llama(dir.path().string()); },
               {config, "field 'tie_word_embeddings' is false (its default)", "no tensor 'lm_head.weight'"});
  test::write_file(config, base + R"(,"tie_word_embeddings":true,"attention_bias":true})");
  expect_error([&] { models::load_llama(dir.path().string()); },
               {config, "field 'attention_bias' is true", "no tensor 'model.layers.0.self_attn.q_proj.bias'"});
  // MLP biases would be missing from the computation (this one used to load and run).
  test::write_file(config, base + R"(,"tie_word_embeddings":true,"mlp_bias":true})");
  expect_error([&] { models::load_llama(dir.path().string()); },
               {config, "field 'mlp_bias' is true", "no tensor 'model.layers.0.mlp.gate_proj.bias'"});
  // Llama's attention_bias biases o_proj as well: q, k and v alone are not its checkpoint.
  {
    auto with_qkv = ts;
    with_qkv.emplace_back("model.layers.0.self_attn.q_proj.bias", Tensor::zeros({64}, DType::F32));
    with_qkv.emplace_back("model.layers.0.self_attn.k_proj.bias", Tensor::zeros({16}, DType::F32));
    with_qkv.emplace_back("model.layers.0.self_attn.v_proj.bias", Tensor::zeros({16}, DType::F32));
    save_safetensors(dir.file("model.safetensors"), with_qkv);
    test::write_file(config, base + R"(,"tie_word_embeddings":true,"attention_bias":true})");
    expect_error([&] { models::load_llama(dir.path().string()); },
                 {config, "field 'attention_bias' is true", "no tensor 'model.layers.0.self_attn.o_proj.bias'"});
    // Biases the config leaves out are named as biases, not as a layer count that disagrees.
    test::write_file(config, base + R"(,"tie_word_embeddings":true})");
    expect_error([&] { models::load_llama(dir.path().string()); },
                 {"self_attn.", "_proj.bias' is not part of the model", "attention_bias / mlp_bias"});
    save_safetensors(dir.file("model.safetensors"), ts);
  }
  std::string qwen = base;
  qwen.replace(qwen.find("LlamaForCausalLM"), 16, "Qwen2ForCausalLM");
  test::write_file(config, qwen + R"(,"model_type":"qwen2","attention_bias":false,"tie_word_embeddings":true,
      "use_sliding_window":true,"sliding_window":4})");
  expect_error([&] { models::load_llama(dir.path().string()); }, {config, "field 'use_sliding_window' is true"});
  // Qwen2's q/k/v biases are implied by its architecture even without model_type: a checkpoint
  // without them used to run without them.
  test::write_file(config, qwen + R"(,"tie_word_embeddings":true})");
  expect_error(
      [&] { models::load_llama(dir.path().string()); },
      {config, "field 'attention_bias' is true (for Qwen2ForCausalLM)", "no tensor 'model.layers.0.self_attn.q_proj.bias'"});
  // A tensor of integers is named with its file, not left to fail inside a conversion.
  test::write_file(config, base + R"(,"tie_word_embeddings":true})");
  ts[1].second = Tensor::zeros({64}, DType::I32);  // model.norm.weight
  save_safetensors(dir.file("model.safetensors"), ts);
  expect_error([&] { models::load_llama(dir.path().string()); },
               {"model.safetensors", "tensor 'model.norm.weight' is I32", "F32, F16 or BF16"});
}

TEST(Loading, AFifoModelIsRefusedNotOpened) {
  test::TempDir dir;
  test::expect_fifo_refused(dir.file("stories.bin"), [](const std::string& p) { models::load_llama(p); });
  test::write_file(dir.file("config.json"), R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
      "intermediate_size":160,"num_hidden_layers":1,"num_attention_heads":8,"vocab_size":97})");
  test::expect_fifo_refused(dir.file("model.safetensors"),
                            [&](const std::string&) { models::load_llama(dir.path().string()); });
}

TEST(Rope, Llama3ScalingMatchesTheReferenceFormula) {
  // Llama 3.1's rope_scaling on its own numbers: factor 8, low 1, high 4, original context 8192.
  TransformerConfig c = small_config(2);
  c.head_dim = 128, c.rope_theta = 500000;
  c.rope_scaling = {{"rope_type", "llama3"},
                    {"factor", 8.0},
                    {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 8192}};
  const auto f = models::rope_frequencies(c).to_double_vector();
  const auto base = rope_inv_freq(128, 500000).to_double_vector();
  // High frequencies (wavelength < 8192/4 = 2048) are untouched; low ones (> 8192) divided by 8.
  for (std::size_t j = 0; j < f.size(); ++j) {
    const double wl = 2 * std::numbers::pi / base[j];
    if (wl < 2048) EXPECT_EQ(f[j], base[j]);
    else if (wl > 8192) EXPECT_NEAR(f[j], base[j] / 8, base[j] * 1e-6);
    else EXPECT_TRUE(f[j] < base[j] && f[j] > base[j] / 8);
  }
  c.rope_scaling = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { models::rope_frequencies(c); }, {"rope_scaling type 'yarn'"});
}

}  // namespace
}  // namespace inferlab
