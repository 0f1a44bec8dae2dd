// Chapter 00: the lecture's arithmetic, pinned. Byte counts are exact integers; the formulas
// are checked against the lecture's own algebra; docs/lecture-numbers.md must match the code.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "chapters/00_workload/lecture.h"
#include "chapters/00_workload/roofline.h"
#include "chapters/00_workload/workload.h"
#include "test_util.h"

namespace inferlab::ch00 {
namespace {

using test::expect_error;

TEST(Ch00Workload, KvCacheBytesAreExact) {
  // S x K x H x L x 2 (K and V) x 2 bytes.
  EXPECT_EQ(find_model("Llama-2-70B").kv_cache_bytes(4096, 2), 4096LL * 8 * 128 * 80 * 2 * 2);
  EXPECT_EQ(find_model("Llama-2-70B").kv_cache_bytes(4096, 2), 1342177280);
  EXPECT_EQ(find_model("Llama-2-13B").kv_cache_bytes(1024, 2), 838860800);
  EXPECT_EQ(find_model("Llama-2-7B").kv_cache_bytes(4096, 2), 2147483648);
  EXPECT_EQ(find_model("Llama-3-8B").kv_cache_bytes(4096, 2), 536870912);
  EXPECT_EQ(find_model("Llama-3.1-405B").kv_cache_bytes(4096, 2), 2113929216);
  EXPECT_EQ(find_model("Llama-3-8B").kv_cache_bytes(4096, 1), 268435456);  // an fp8 cache halves it
}

TEST(Ch00Workload, ParameterCountsAndMaxBatch) {
  EXPECT_EQ(find_model("Llama-2-13B").num_parameters(), 13015864320);
  EXPECT_EQ(find_model("Llama-3.1-405B").num_parameters(), 405853388800);
  EXPECT_EQ(param_bytes(find_model("Llama-2-70B")), 137953296384);
  const double h100 = find_accelerator("h100").memory_bytes;
  EXPECT_EQ(max_batch(find_model("Llama-3-8B"), 4096, h100), 119);
  EXPECT_EQ(max_batch(find_model("Llama-2-7B"), 4096, h100), 30);
  EXPECT_EQ(max_batch(find_model("Llama-2-70B"), 4096, h100), -1);  // 138 GB of weights
  EXPECT_EQ(max_batch(find_model("Llama-2-70B"), 4096, find_accelerator("h200").memory_bytes), 2);
}

TEST(Ch00Workload, MatmulIntensityMatchesTheLecturesAlgebra) {
  // (B x D)(D x F): 2BDF / (2BD + 2DF + 2BF) in bf16.
  const Cost m = matmul_cost(1, 16384, 53248);
  EXPECT_EQ(m.flops, 1744830464.0);
  EXPECT_EQ(m.bytes, 1744969728.0);
  EXPECT_NEAR(matmul_cost(256, 16384, 53248).intensity(), 250.87397, 1e-5);
  EXPECT_EQ(matmul_cost(2, 3, 5, 4).bytes, 4 * (2 * 3 + 3 * 5 + 2 * 5));  // w bytes per element
}

TEST(Ch00Workload, MlpIntensityMatchesTheLecturesAlgebra) {
  // Gated MLP: 6BTDF FLOPs, 4BTD + 4BTF + 6DF bytes.
  const double B = 3, T = 5, D = 64, F = 176;
  EXPECT_EQ(mlp_cost(B, T, D, F).flops, 6 * B * T * D * F);
  EXPECT_EQ(mlp_cost(B, T, D, F).bytes, 4 * B * T * D + 4 * B * T * F + 6 * D * F);
}

TEST(Ch00Workload, AttentionIntensityMatchesTheLecturesAlgebra) {
  // Attention with K = N: 4BSTD FLOPs, 4BSD + 4BTD bytes, intensity ST/(S+T).
  const double B = 3, T = 5, S = 300, N = 8, H = 16, Dm = N * H;
  const Cost a = attention_cost(B, S, T, N, N, H);
  EXPECT_EQ(a.flops, 4 * B * S * T * Dm);
  EXPECT_EQ(a.bytes, 4 * B * S * Dm + 4 * B * T * Dm);
  EXPECT_DOUBLE_EQ(a.intensity(), S * T / (S + T));
  // With GQA the generation intensity approaches N/K instead of 1.
  EXPECT_NEAR(attention_cost(1, 1e6, 1, 64, 8, 128).intensity(), 8.0, 1e-3);
}

TEST(Ch00Workload, ForwardCostCountsKvReadsByHeads) {
  // One decode step reads every weight once and the cache once: GQA's saving is exactly the
  // cache bytes times (1 - K/N).
  TransformerConfig mha = find_model("Llama-2-13B"), gqa = mha;
  gqa.num_kv_heads = 8;
  const double S = 4096;
  const Cost a = forward_cost(mha, 1, S, 1), b = forward_cost(gqa, 1, S, 1);
  const double cache_mha = static_cast<double>(mha.kv_cache_bytes(4096, 2)),
               cache_gqa = static_cast<double>(gqa.kv_cache_bytes(4096, 2));
  const double qkv_saving =
      2.0 * (mha.num_kv_heads - gqa.num_kv_heads) * mha.head_dim * mha.hidden_size * 2 * mha.num_layers;
  // The new token's K and V: written by the projection, then written into the cache.
  const double new_kv = 2 * (2.0 * 2 * (mha.num_kv_heads - gqa.num_kv_heads) * mha.head_dim * mha.num_layers);
  EXPECT_NEAR(a.bytes - b.bytes, (cache_mha - cache_gqa) + qkv_saving + new_kv, 1.0);
  EXPECT_LT(b.bytes, a.bytes);
  // Decode at B = 1 is memory-bound on every preset.
  for (const auto& acc : metrics::accelerator_presets()) EXPECT_LT(a.intensity(), acc.ridge());
}

TEST(Ch00Workload, TheLecturesLatencyTable) {
  const auto h100 = find_accelerator("h100");
  const auto c = find_model("Llama-2-13B");
  const auto p1 = memory_bound_latency(c, 1024, 1, h100);
  EXPECT_EQ(p1.memory_bytes, 26870589440.0);
  EXPECT_NEAR(p1.latency_s * 1e3, 8.0211, 1e-4);
  EXPECT_NEAR(p1.throughput, 124.67, 0.01);
  const auto p64 = memory_bound_latency(c, 1024, 64, h100);
  EXPECT_EQ(p64.memory_bytes, 79718819840.0);
  EXPECT_TRUE(p64.fits);
  EXPECT_FALSE(memory_bound_latency(c, 1024, 256, h100).fits);
  EXPECT_LT(p64.compute_s, p64.latency_s);  // memory-bound, as the lecture says
}

TEST(Ch00Workload, SpeculativeAndFormatFormulas) {
  EXPECT_NEAR(speculative_expected_tokens(0.8, 4), 3.3616, 1e-12);
  EXPECT_NEAR(speculative_expected_tokens(0.5, 4), 1.9375, 1e-12);
  // Brute force: E[tokens] = Σ_{k=0}^{γ} P(first k accepted) · (k accepted + 1 more), with the
  // +1 bonus when all γ are accepted.
  const double alpha = 0.8;
  double e = 0;
  for (int k = 0; k < 4; ++k) e += std::pow(alpha, k) * (1 - alpha) * (k + 1);
  e += std::pow(alpha, 4) * 5;
  EXPECT_NEAR(e, speculative_expected_tokens(alpha, 4), 1e-12);
  EXPECT_EQ(e4m3_max(false), 448.0);
  EXPECT_EQ(e4m3_max(true), 240.0);
}

TEST(Ch00Workload, LectureClaimsAndTheirPage) {
  const auto claims = lecture_claims();
  int disagree = 0, external = 0;
  for (const auto& c : claims) {
    disagree += c.verdict == Claim::Disagree;
    external += c.verdict == Claim::External;
    if (c.verdict != Claim::Agree) {
      EXPECT_FALSE(c.why.empty()) << c.claim;  // every disagreement says why, every external its source
    }
  }
  EXPECT_EQ(claims.size(), 91u);
  EXPECT_EQ(disagree, 22);
  EXPECT_EQ(external, 15);
  // The committed page is exactly what the code generates (regenerate with
  // `ch00_workload lecture --markdown docs/lecture-numbers.md`).
  std::ifstream in(std::string(INFERLAB_SOURCE_DIR) + "/docs/lecture-numbers.md");
  ASSERT_TRUE(in.good()) << "docs/lecture-numbers.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), lecture_markdown()) << "docs/lecture-numbers.md is stale: regenerate it";
}

TEST(Ch00Workload, NamesConfigsAndErrors) {
  EXPECT_EQ(find_model("llama2-13b").hidden_size, 5120);  // case and dashes do not matter
  test::TempDir dir;
  test::write_file(dir.file("config.json"), R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100})");
  EXPECT_EQ(find_model(dir.path().string()).kv_cache_bytes(10, 2), 10 * 2 * 16 * 2 * 2 * 2);
  expect_error([] { find_model("gpt-5"); }, {"unknown model 'gpt-5'", "Llama-2-13B"});
  expect_error([] { find_accelerator("tpu"); }, {"unknown accelerator 'tpu'", "h100"});
}

TEST(Ch00Roofline, PointsFromJsonAndTheFigure) {
  test::TempDir dir;
  test::write_file(dir.file("p.json"), R"({"roofline_points": [
      {"label": "decode", "work": {"flops": 2e9, "bytes": 2e9}, "seconds": 0.5}]})");
  const metrics::Ceiling c{"test", 10e9, 100e9, "f32", "made up", 0};
  const auto pts = load_points(dir.file("p.json"), c);
  ASSERT_EQ(pts.size(), 1u);
  EXPECT_DOUBLE_EQ(pts[0].achieved_bytes_per_s(), 4e9);
  const auto fig = roofline_figure({c}, pts);
  EXPECT_EQ(fig.series.size(), 2u);
  EXPECT_NE(plot::to_svg(fig).find("decode"), std::string::npos);
  test::write_file(dir.file("bad.json"), R"({"roofline_points": [{"label": "x", "seconds": 1}]})");
  expect_error([&] { load_points(dir.file("bad.json"), c); }, {"bad.json", "'work'"});
}

// A legend label wider than the legend's column wraps onto further lines instead of running off
// the figure's right edge (at the 7 px a character the plot assumes), and the next entry moves
// down to make room.
TEST(Ch00Roofline, LongLegendLabelsWrapInsideTheFigure) {
  plot::Figure f;
  for (const char* label : {"tiny-swa's receptive field, 4 × 63 + 1 = 253", "short"}) {
    plot::Series s;
    s.label = label, s.x = {0, 1}, s.y = {0, 1};
    f.series.push_back(s);
  }
  const std::string svg = plot::to_svg(f);
  std::vector<double> baselines;
  for (std::size_t at = 0; (at = svg.find("<text x=\"", at)) != std::string::npos;) {
    const std::size_t open_end = svg.find('>', at), end = svg.find("</text>", at);
    const std::string tag = svg.substr(at, open_end - at);
    std::string text = svg.substr(open_end + 1, end - open_end - 1);
    at = end;
    if (tag.find("text-anchor") != std::string::npos) continue;  // centred or right-aligned: ticks, titles
    const double x = std::stod(tag.substr(9));
    baselines.push_back(std::stod(tag.substr(tag.find("y=\"") + 3)));
    for (std::size_t t; (t = text.find("</tspan>")) != std::string::npos;) text.erase(t, 8);
    for (std::size_t t; (t = text.find("<tspan")) != std::string::npos;) text.replace(t, text.find('>', t) - t + 1, "\n");
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      double glyphs = 0;
      for (char c : line) glyphs += (c & 0xC0) != 0x80;
      EXPECT_LE(x + 7.0 * glyphs, f.width) << "legend line '" << line << "' runs off the figure";
    }
  }
  EXPECT_NE(svg.find("<tspan"), std::string::npos) << "the long label wraps";
  ASSERT_EQ(baselines.size(), 2u);
  EXPECT_GE(baselines[1] - baselines[0], 20.0 + 15.0) << "the next entry leaves room for the wrapped line";
}

}  // namespace
}  // namespace inferlab::ch00
