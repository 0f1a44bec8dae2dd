#include "chapters/04_mla/moe_decode.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "chapters/01_naive_decode/llama.h"
#include "common/moe.h"

namespace inferlab::ch04 {

using nlohmann::json;

double moe_step_bytes(const MoeShape& s, double touched) {
  const double D = static_cast<double>(s.hidden), b = static_cast<double>(s.bytes_per_value);
  const double expert = 3 * D * static_cast<double>(s.moe.expert_size);  // gate, up, down
  const double layer = static_cast<double>(s.moe.router_parameters(s.hidden)) + touched * expert +
                       3 * D * static_cast<double>(s.moe.shared_size);
  return layer * b * static_cast<double>(s.moe_layers);
}

MoeStep moe_step(const MoeShape& s, std::int64_t batch) {
  const MoeConfig& m = s.moe;
  MoeStep r;
  r.batch = batch;
  r.experts_touched = expected_experts_touched(m.num_experts, m.top_k, batch);
  r.moe_bytes = moe_step_bytes(s, r.experts_touched);
  r.all_expert_bytes = moe_step_bytes(s, static_cast<double>(m.num_experts));
  // The dense FFN a token of the MoE model does the work of: width k·Fe + Fs, no router.
  const double active_width = static_cast<double>(m.top_k * m.expert_size + m.shared_size);
  r.dense_bytes = 3 * static_cast<double>(s.hidden) * active_width * static_cast<double>(s.bytes_per_value) *
                  static_cast<double>(s.moe_layers);
  r.moe_flops = 2 * static_cast<double>(batch) * static_cast<double>(m.active_parameters(s.hidden)) *
                static_cast<double>(s.moe_layers);
  r.rows_per_expert = static_cast<double>(batch * m.top_k) / r.experts_touched;
  return r;
}

double measured_experts_touched(const std::vector<std::vector<std::int32_t>>& layers, std::int64_t k, std::int64_t batch,
                                int draws) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(batch));
  double sum = 0;
  std::int64_t n = 0;
  for (const auto& experts : layers) {
    const std::int64_t T = static_cast<std::int64_t>(experts.size()) / k;
    IL_CHECK(batch <= T, "measured_experts_touched: a batch of ", batch, " from ", T, " tokens");
    std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
    std::iota(pos.begin(), pos.end(), 0);
    for (int d = 0; d < draws; ++d, ++n) {
      std::shuffle(pos.begin(), pos.end(), rng);
      std::set<std::int32_t> touched;
      for (std::int64_t i = 0; i < batch; ++i)
        for (std::int64_t j = 0; j < k; ++j) touched.insert(experts[static_cast<std::size_t>(pos[i] * k + j)]);
      sum += static_cast<double>(touched.size());
    }
  }
  return sum / static_cast<double>(n);
}

namespace {

MoeConfig deepseek(std::int64_t E, std::int64_t k, std::int64_t Fe, std::int64_t shared, MoeScoring scoring) {
  MoeConfig m;
  m.names = MoeNames::DeepSeek, m.num_experts = E, m.top_k = k, m.expert_size = Fe, m.shared_size = shared * Fe;
  m.scoring = scoring, m.score_bias = scoring == MoeScoring::Sigmoid;
  return m;
}

// The models' config.json numbers (their Hugging Face releases).
std::vector<MoeShape> shapes() {
  MoeConfig mixtral;
  mixtral.num_experts = 8, mixtral.top_k = 2, mixtral.expert_size = 14336;
  return {{"DeepSeek-V2-Lite", 2048, 26, deepseek(64, 6, 1408, 2, MoeScoring::Softmax)},
          {"DeepSeek-V3", 7168, 58, deepseek(256, 8, 2048, 1, MoeScoring::Sigmoid)},
          {"Mixtral-8x7B", 4096, 32, mixtral}};
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, bytes >= 1e9 ? "%.2f GB" : "%.1f MB", bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6);
  return buf;
}

json model_table(const MoeShape& s) {
  const MoeConfig& m = s.moe;
  const MoeStep one = moe_step(s, 1);
  std::printf("\n%s: %lld MoE layers, D = %lld, E = %lld experts of Fe = %lld, k = %lld%s; bf16 weights\n", s.name.c_str(),
              static_cast<long long>(s.moe_layers), static_cast<long long>(s.hidden), static_cast<long long>(m.num_experts),
              static_cast<long long>(m.expert_size), static_cast<long long>(m.top_k),
              m.shared_size ? (", shared width Fs = " + std::to_string(m.shared_size)).c_str() : "");
  std::printf(
      "  one token (B = 1) reads %s of FFN weights: a dense FFN of the same active width (k·Fe + Fs = %lld) "
      "reads %s,\n  all experts are %s (%.1f× more, what the model stores and a large batch reads)\n",
      gb(one.moe_bytes).c_str(), static_cast<long long>(m.top_k * m.expert_size + m.shared_size),
      gb(one.dense_bytes).c_str(), gb(one.all_expert_bytes).c_str(), one.all_expert_bytes / one.moe_bytes);
  std::printf("  %6s %16s %14s %14s %16s %14s %s\n", "B", "experts touched", "MoE bytes", "dense bytes", "MoE bytes/token",
              "dense b/token", "rows per weight read: MoE (dense)");
  json rows = json::array();
  for (std::int64_t B : {1, 2, 4, 8, 16, 32, 64, 128, 256, 1024}) {
    const MoeStep r = moe_step(s, B);
    const double b = static_cast<double>(B);
    std::printf("  %6lld %9.1f of %3lld %14s %14s %16s %14s %5.1f (%4lld)\n", static_cast<long long>(B), r.experts_touched,
                static_cast<long long>(m.num_experts), gb(r.moe_bytes).c_str(), gb(r.dense_bytes).c_str(),
                gb(r.moe_bytes / b).c_str(), gb(r.dense_bytes / b).c_str(), r.rows_per_expert, static_cast<long long>(B));
    rows.push_back({{"batch", B},
                    {"experts_touched_expected", r.experts_touched},
                    {"moe_bytes", r.moe_bytes},
                    {"dense_same_active_bytes", r.dense_bytes},
                    {"all_experts_bytes", r.all_expert_bytes},
                    {"moe_bytes_per_token", r.moe_bytes / b},
                    {"dense_bytes_per_token", r.dense_bytes / b},
                    {"flops", r.moe_flops},
                    {"rows_per_expert", r.rows_per_expert}});
  }
  return {{"model", s.name},
          {"moe_layers", s.moe_layers},
          {"hidden", s.hidden},
          {"experts", m.num_experts},
          {"experts_per_token", m.top_k},
          {"expert_size", m.expert_size},
          {"shared_size", m.shared_size},
          {"bytes_per_value", s.bytes_per_value},
          {"steps", rows}};
}

// The routing of a model with DeepSeek-V2-Lite's router over a prompt of random tokens.
json measured_routing() {
  TransformerConfig c = models::memory_bound_shape(4, 4, 512, 512);
  c.hidden_size = 256, c.num_heads = 4, c.head_dim = 64, c.intermediate_size = 256;
  c.moe = deepseek(64, 6, 32, 2, MoeScoring::Softmax);
  c.moe->validate("the routing model", c.num_layers);
  const models::Llama m = models::random_llama(c, 42);
  std::mt19937_64 rng(5);
  std::vector<std::int32_t> prompt(512);
  for (auto& t : prompt) t = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c.vocab_size));
  std::vector<std::vector<std::int32_t>> layers;
  {
    MoeRoutingHook hook([&](const MoeFfn&, const MoeRouting& r) { layers.push_back(r.expert); });
    ch01::forward(m, prompt);
  }
  const std::int64_t E = c.moe->num_experts, k = c.moe->top_k;
  std::printf(
      "\nExperts touched per layer by a batch of B tokens: E·(1 − (1 − k/E)^B) under uniform routing, and "
      "measured\non a model with DeepSeek-V2-Lite's router (E = %lld, k = %lld, softmax; random weights, %zu "
      "layers)\nover a prompt of %zu random tokens (B of its positions per batch, 200 draws):\n",
      static_cast<long long>(E), static_cast<long long>(k), layers.size(), prompt.size());
  std::printf("  %6s %10s %10s\n", "B", "expected", "measured");
  json rows = json::array();
  for (std::int64_t B : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
    const double want = expected_experts_touched(E, k, B), got = measured_experts_touched(layers, k, B);
    std::printf("  %6lld %10.1f %10.1f\n", static_cast<long long>(B), want, got);
    rows.push_back({{"batch", B}, {"expected", want}, {"measured", got}});
  }
  // How far from uniform this router is: experts ever chosen, and the busiest one's share.
  double chosen = 0, busiest = 0;
  for (const auto& l : layers) {
    std::vector<std::int64_t> count(static_cast<std::size_t>(E), 0);
    for (std::int32_t e : l) ++count[static_cast<std::size_t>(e)];
    chosen += static_cast<double>(std::count_if(count.begin(), count.end(), [](std::int64_t n) { return n > 0; }));
    busiest += static_cast<double>(*std::max_element(count.begin(), count.end())) / static_cast<double>(l.size());
  }
  chosen /= static_cast<double>(layers.size()), busiest /= static_cast<double>(layers.size());
  std::printf(
      "  This router is far from uniform: over the prompt a layer chooses %.1f of its %lld experts at all, and "
      "its busiest\n  expert takes %.1f%% of the choices (uniform: %.1f%%). Skewed routing touches fewer "
      "experts at a given B, so\n  fewer bytes per step, but loads a few experts with most rows: the "
      "imbalance load-balancing losses and\n  DeepSeek-V3's score bias work against. The formula is the "
      "uniform case, the most a batch reads.\n",
      chosen, static_cast<long long>(E), 100 * busiest, 100.0 / static_cast<double>(E));
  return {{"experts", E},
          {"experts_per_token", k},
          {"layers", layers.size()},
          {"prompt_tokens", prompt.size()},
          {"experts_chosen", chosen},
          {"busiest_expert_share", busiest},
          {"rows", rows}};
}

}  // namespace

json moe_decode_table() {
  std::printf(
      "\nMixture-of-experts FFNs at decode: each token runs k of E experts (plus shared ones), so alone it "
      "reads\nno more than a dense FFN of the same active width; a batch reads every expert any of its tokens "
      "chose.\n");
  json models = json::array();
  for (const MoeShape& s : shapes()) models.push_back(model_table(s));
  std::printf(
      "  MoE bytes per step grow with B until every expert is read, so MoE decode stays memory-bound to much "
      "larger\n  batches than dense decode: each expert read serves B·k/touched rows (last column) where a "
      "dense FFN serves B.\n");
  return {{"models", models}, {"measured_routing", measured_routing()}};
}

}  // namespace inferlab::ch04
