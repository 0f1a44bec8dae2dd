// Chapter 03: GQA as a function of MHA (two views, one answer), the mean-pooling conversion, the
// batched decode step, the cache's size, and our evaluation against the model cards' numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/03_gqa/gqa.h"
#include "common/decode_bench.h"
#include "common/eval.h"
#include "common/json_file.h"
#include "common/models/batch_decode.h"
#include "common/tokenizer.h"
#include "test_util.h"

namespace inferlab {
namespace {

using models::Llama;
const std::string kData = INFERLAB_DATA_DIR;

TransformerConfig config(std::int64_t kv_heads) {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 64, c.intermediate_size = 128, c.num_layers = 2, c.num_heads = 8, c.num_kv_heads = kv_heads;
  c.head_dim = 8, c.vocab_size = 50, c.max_position_embeddings = 256, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  return c;
}

// Prefill 20 tokens then decode 10, returning every logit. Up to 32 rows the matmuls take the
// GEMV path, whose per-output arithmetic does not depend on how many outputs there are.
std::vector<float> run(const Llama& m, const std::vector<std::int32_t>& toks) {
  models::ContiguousKVCache cache(m.config, 64);
  std::vector<float> out = models::forward_cached(m, cache, {toks.begin(), toks.begin() + 20}, true).to_float_vector();
  for (std::size_t i = 20; i < toks.size(); ++i) {
    const auto row = models::forward_cached(m, cache, {toks[i]}).to_float_vector();
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<std::int32_t> tokens(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % 50);
  return t;
}

TEST(Gqa, EqualsMhaOnKvHeadsRepeatedPerGroupBitForBit) {
  auto rng = test::rng_for_test();
  for (std::int64_t K : {4, 2, 1}) {
    const Llama gqa = models::random_llama(config(K), rng());
    const Llama mha = ch03::repeat_kv_heads(gqa);
    EXPECT_EQ(mha.config.num_kv_heads, 8);
    const auto t = tokens(rng, 30);
    EXPECT_EQ(run(gqa, t), run(mha, t)) << "K = " << K;
  }
}

TEST(Gqa, KEqualsNIsMhaBitForBit) {
  auto rng = test::rng_for_test();
  const Llama mha = models::random_llama(config(8), rng());
  const Llama same = ch03::mean_pool_kv_heads(mha, 8);
  const auto t = tokens(rng, 30);
  EXPECT_EQ(run(same, t), run(mha, t));
}

TEST(Gqa, MeanPoolingKeepsTheFunctionWhenAGroupsHeadsAgree) {
  // When the two KV heads of every group already hold the same weights, pooling them changes
  // nothing: (a + a) / 2 = a exactly.
  auto rng = test::rng_for_test();
  const Llama gqa = models::random_llama(config(4), rng());
  const Llama mha = ch03::repeat_kv_heads(gqa);  // 8 heads, pairs equal
  const Llama pooled = ch03::mean_pool_kv_heads(mha, 4);
  const auto t = tokens(rng, 30);
  EXPECT_EQ(run(pooled, t), run(gqa, t));
  test::expect_error([&] { ch03::mean_pool_kv_heads(mha, 3); }, {"cannot be pooled into 3 groups"});
}

TEST(Gqa, BatchedDecodeEqualsOneSequenceAtATime) {
  auto rng = test::rng_for_test();
  const Llama m = models::random_llama(config(2), rng());
  // Three sequences at different lengths, decoded together and one by one.
  std::vector<std::unique_ptr<models::ContiguousKVCache>> together, alone;
  std::vector<models::KVCache*> batch_caches;
  for (std::int64_t len : {1, 7, 19}) {
    const auto p = tokens(rng, static_cast<std::size_t>(len));
    together.push_back(std::make_unique<models::ContiguousKVCache>(m.config, 40));
    alone.push_back(std::make_unique<models::ContiguousKVCache>(m.config, 40));
    models::forward_cached(m, *together.back(), p);
    models::forward_cached(m, *alone.back(), p);
    batch_caches.push_back(together.back().get());
  }
  for (int step = 0; step < 5; ++step) {
    const std::vector<std::int32_t> next = {static_cast<std::int32_t>(rng() % 50), static_cast<std::int32_t>(rng() % 50),
                                            static_cast<std::int32_t>(rng() % 50)};
    const auto batch = models::decode_step(m, batch_caches, next).to_float_vector();
    for (std::size_t b = 0; b < 3; ++b) {
      const auto one = models::forward_cached(m, *alone[b], {next[b]}).to_float_vector();
      // Same arithmetic but a different summation order in the matmuls (eight rows against
      // one): each within 2·P·γ_K of the other's scale, as in chapter 02's two-path tests.
      double scale = 0;
      for (float v : one) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      const double bound = 2 * (6.0 * 2 + 2) * test::gamma(256) * 4 * scale;
      for (std::size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(batch[b * one.size() + i], one[i], bound) << b;
    }
  }
  for (std::size_t b = 0; b < 3; ++b) EXPECT_EQ(together[b]->length(), alone[b]->length());
}

TEST(Gqa, CacheBytesShrinkByKOverN) {
  for (std::int64_t K : {8, 2, 1}) {
    const models::ContiguousKVCache cache(config(K), 100);
    EXPECT_EQ(cache.bytes(), 100 * K * 8 * 2 * 2 * 4);  // S × K × H × L × 2 × 4
  }
  const Llama m = models::random_llama(config(2), 1);
  EXPECT_EQ(decode_step_bytes(static_cast<double>(m.step_weight_bytes()), m.config, {10, 30}),
            static_cast<double>(m.step_weight_bytes()) + (11 + 31) * 2 * 8 * 2 * 2 * 4.0);
}

TEST(Eval, OurPerplexityAndProbesMatchTheModelCards) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the full validation set takes minutes under AddressSanitizer; the release suite runs it";
#endif
  // tools/evaluate.py measured tiny-mha with PyTorch; we measure it with chapter 01's forward pass.
  const auto card = load_json(kData + "/models/tiny-mha/metrics.json");
  const Llama m = models::load_llama(kData + "/models/tiny-mha");
  const auto tok = Tokenizer::for_model(kData + "/models/tiny-mha");
  auto logits = [&](const std::vector<std::int32_t>& t) { return ch01::forward(m, t, true); };
  const auto val = eval::tokenize_documents(*tok, kData + "/corpus/val.txt");
  const auto ppl = eval::perplexity(logits, val, 512);
  EXPECT_EQ(ppl.tokens, card["val_tokens"].get<std::int64_t>());
  // The card rounds to 4 decimals; float32 against PyTorch's float32 differs far less.
  EXPECT_NEAR(ppl.loss, card["val_loss"].get<double>(), 1e-4);
  // The two cheapest probe sets in full (200 each): the same answers as PyTorch, give or take a
  // near-tie argmax (one probe, 0.005).
  std::vector<eval::Probe> probes;
  for (const auto& p : eval::load_probes(kData + "/corpus/probes.jsonl"))
    if (p.kind == "ar_8" || p.kind == "recall_32") probes.push_back(p);
  const auto acc = eval::probe_accuracy(logits, *tok, probes);
  EXPECT_EQ(acc.per_kind, 200);
  for (const char* kind : {"ar_8", "recall_32"})
    EXPECT_NEAR(acc.accuracy.at(kind), card["probes"][kind].get<double>(), 0.0051) << kind;
}

}  // namespace
}  // namespace inferlab
