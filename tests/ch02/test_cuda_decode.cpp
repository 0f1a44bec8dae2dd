// Chapter 02's CUDA decoder against the CPU path (skipped, with the driver's reason, without a
// GPU): the same logits within a bf16 budget, the same greedy tokens, the graph and the plain
// launches bit for bit, and split-K attention over contexts longer than one chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "chapters/02_kv_cache/cuda_decode.h"
#include "common/cuda/backend.h"
#include "test_util.h"

namespace inferlab {
namespace {

const std::string kData = INFERLAB_DATA_DIR;

// The GPU prefill rounds activations to bf16 before its GEMMs (cuBLAS wants both inputs in one
// type); everything else is f32 arithmetic on the same bf16 weights as the CPU reference. Each
// of the P = 6L + 2 stages may thus add u_bf16 + γ_K of its scale; condition factor 4 as in
// the CPU tests. A decode step keeps its activations in f32 (GEMVs read bf16 weights and widen
// them), so from the same cache a step differs from the CPU only by summation order: γ_K alone,
// about a hundred times tighter, tight enough that a wrong RoPE position or a missing key fails.
double error_bound(const TransformerConfig& c, double scale, bool bf16_activations) {
  const double P = 6.0 * static_cast<double>(c.num_layers) + 2;
  const double K = static_cast<double>(std::max({c.hidden_size, c.intermediate_size, c.max_position_embeddings}));
  return P * ((bf16_activations ? 0x1p-8 : 0.0) + test::gamma(K)) * 4 * scale;
}

void expect_close(const Tensor& gpu, const Tensor& cpu, const TransformerConfig& c, bool bf16_activations,
                  const std::string& what) {
  const auto g = gpu.to_double_vector(), r = cpu.to_double_vector();
  ASSERT_EQ(g.size(), r.size());
  double scale = 0, worst = 0;
  for (double v : r) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(g[i] - r[i]));
  EXPECT_LE(worst, error_bound(c, scale, bf16_activations)) << what;
}

// The CPU continues from the GPU's cache, so that each decode step is compared on its own rather
// than with the prefill's bf16 differences carried along.
void adopt_cache(models::ContiguousKVCache& cpu, const ch02::CudaDecoder& dec) {
  for (std::int64_t l = 0; l < cpu.layers(); ++l) cpu.k(l).copy_from(dec.cache().k(l)), cpu.v(l).copy_from(dec.cache().v(l));
  cpu.truncate(0);
  cpu.commit(dec.length());
}

// Every version of the GEMV family (common/cuda/gemv.cuh), which the decoder takes from
// cuda::gemv_version() when it is constructed: version 3 folds each RMSNorm into the product after it.
constexpr cuda::GemvVersion kGemvVersions[] = {cuda::GemvVersion::WarpRow, cuda::GemvVersion::SharedX,
                                               cuda::GemvVersion::NormFused};

TEST(CudaDecoder, MatchesTheCpuPathOnTinyMha) {
  IL_REQUIRE_CUDA();
  const models::Llama cpu = models::load_llama(kData + "/models/tiny-mha").to(Device::CPU, DType::BF16);
  const models::Llama gpu = cpu.to(Device::CUDA, DType::BF16);
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  for (cuda::GemvVersion v : kGemvVersions) {
    SCOPED_TRACE(std::string("GEMV version ") + cuda::gemv_version_name(v));
    cuda::set_gemv_version(v);
    ch02::CudaDecoder dec(gpu, 64);
    cuda::set_gemv_version(cuda::kDefaultGemvVersion);
    models::ContiguousKVCache cache(cpu.config, 64);
    expect_close(dec.prefill(prompt), models::forward_cached(cpu, cache, prompt), cpu.config, true, "prefill");
    EXPECT_EQ(dec.length(), cache.length());
    adopt_cache(cache, dec);
    for (std::int32_t t : {15, 7, 300, 42, 1000}) {
      expect_close(dec.step(t), models::forward_cached(cpu, cache, {t}), cpu.config, false, "decode step");
      EXPECT_EQ(dec.length(), cache.length());
    }
  }
}

TEST(CudaDecoder, GreedyOnDeviceEqualsGreedyOnHostAndGraphEqualsLaunches) {
  IL_REQUIRE_CUDA();
  const models::Llama gpu = models::load_llama(kData + "/models/tiny-mha").to(Device::CUDA, DType::BF16);
  const std::vector<std::int32_t> prompt = {0, 523, 524, 278, 525, 522, 482};
  ch02::CudaDecoder a(gpu, 128, true), b(gpu, 128, false);
  const auto la = a.prefill(prompt).to(Device::CPU), lb = b.prefill(prompt).to(Device::CPU);
  const std::int32_t first = ops::argmax(la).data<std::int32_t>()[0];
  const auto on_device = a.greedy(first, 40);
  std::vector<std::int32_t> on_host;
  std::int32_t t = first;
  for (int i = 0; i < 40; ++i) {
    t = ops::argmax(b.step(t).to(Device::CPU)).data<std::int32_t>()[0];
    on_host.push_back(t);
  }
  EXPECT_EQ(on_device, on_host);
  // The graph replays exactly the launches it captured.
  ch02::CudaDecoder c(gpu, 128, true), d(gpu, 128, false);
  c.prefill(prompt), d.prefill(prompt);
  for (std::int32_t tok : {5, 6, 7}) EXPECT_EQ(c.step(tok).to_float_vector(), d.step(tok).to_float_vector());
}

TEST(CudaDecoder, SplitKAttentionOverLongContexts) {
  IL_REQUIRE_CUDA();
  // A random GQA model, with q/k/v biases (Qwen2), and a context spanning several 256-position chunks.
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 256, c.intermediate_size = 512, c.num_layers = 2, c.num_heads = 8, c.num_kv_heads = 2;
  c.head_dim = 32, c.vocab_size = 500, c.max_position_embeddings = 2048, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  c.attention_bias = true;
  const models::Llama cpu = models::random_llama(c, 7, DType::BF16);
  const models::Llama gpu = cpu.to(Device::CUDA, DType::BF16);
  auto rng = test::rng_for_test();
  std::vector<std::int32_t> prompt(700);
  for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % 500);
  ch02::CudaDecoder dec(gpu, 800);
  models::ContiguousKVCache cache(c, 800);
  expect_close(dec.prefill(prompt), models::forward_cached(cpu, cache, prompt), c, true, "long prefill");
  adopt_cache(cache, dec);
  for (std::int32_t t : {1, 2, 3})
    expect_close(dec.step(t), models::forward_cached(cpu, cache, {t}), c, false, "long-context decode step");
}

// Llama's attention_bias biases o_proj too: the decode step adds it with the output projection.
// MLP biases (mlp_bias) the fused gate/up kernel does not add: refused by name, not dropped.
TEST(CudaDecoder, LlamaAttentionBiasesIncludingOProj) {
  IL_REQUIRE_CUDA();
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 256, c.intermediate_size = 512, c.num_layers = 2, c.num_heads = 8, c.num_kv_heads = 2;
  c.head_dim = 32, c.vocab_size = 500, c.max_position_embeddings = 256, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  c.attention_bias = c.attention_out_bias = true;
  const models::Llama cpu = models::random_llama(c, 11, DType::BF16);
  ASSERT_TRUE(cpu.layers[0].wo.bias.defined());
  const models::Llama gpu = cpu.to(Device::CUDA, DType::BF16);
  const std::vector<std::int32_t> prompt = {3, 141, 59, 265, 35, 89, 79, 323};
  for (cuda::GemvVersion v : kGemvVersions) {
    SCOPED_TRACE(std::string("GEMV version ") + cuda::gemv_version_name(v));
    cuda::set_gemv_version(v);
    ch02::CudaDecoder dec(gpu, 64);
    cuda::set_gemv_version(cuda::kDefaultGemvVersion);
    models::ContiguousKVCache cache(c, 64);
    expect_close(dec.prefill(prompt), models::forward_cached(cpu, cache, prompt), c, true, "prefill with o_proj bias");
    adopt_cache(cache, dec);
    for (std::int32_t t : {7, 8})
      expect_close(dec.step(t), models::forward_cached(cpu, cache, {t}), c, false, "decode step with o_proj bias");
  }
  c.mlp_bias = true;
  const models::Llama mlp = models::random_llama(c, 11, DType::BF16).to(Device::CUDA, DType::BF16);
  test::expect_error([&] { ch02::CudaDecoder d(mlp, 16); }, {"CudaDecoder", "mlp_bias"});
}

TEST(CudaDecoder, WithoutADeviceItSaysSo) {
  const std::string reason = cuda::unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "a CUDA device is available";
  const models::Llama cpu = models::load_llama(kData + "/models/tiny-mha");
  test::expect_error([&] { ch02::CudaDecoder d(cpu, 16); }, {"no CUDA device available"});
}

}  // namespace
}  // namespace inferlab
