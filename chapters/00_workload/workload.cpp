#include "chapters/00_workload/workload.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/lab.h"

namespace inferlab::ch00 {

Cost matmul_cost(double B, double D, double F, double w) {
  // EXERCISE 00.1 BEGIN: the FLOPs and bytes of a matmul
  return {2 * B * D * F, w * (B * D + D * F + B * F)};
  // EXERCISE 00.1 STUB
  // lab::not_done("00.1", "return {FLOPs, bytes} of y[B, F] = x[B, D] W[D, F]: 2 FLOPs per multiply-add; "
  //                       "read x and W and write y once, w bytes per element");
  // EXERCISE 00.1 END
}

Cost mlp_cost(double B, double T, double D, double F, double w) {
  return {6 * B * T * D * F, 2 * w * B * T * D + 2 * w * B * T * F + 3 * w * D * F};
}

Cost attention_cost(double B, double S, double T, double N, double K, double H, double w) {
  // EXERCISE 00.2 BEGIN: the FLOPs and bytes of attention
  return {4 * B * S * T * N * H, w * (2 * B * T * N * H + 2 * B * S * K * H)};
  // EXERCISE 00.2 STUB
  // lab::not_done("00.2", "return {FLOPs, bytes} of attention for T new tokens over S positions: Q·K^T and "
  //                       "P·V for each of the N query heads; bytes: read Q and write the output (N heads), "
  //                       "read K and V (K heads, S positions)");
  // EXERCISE 00.2 END
}

Cost forward_cost(const TransformerConfig& c, double B, double S, double T, double w) {
  const double D = c.hidden_size, F = c.intermediate_size, N = c.num_heads, K = c.num_kv_heads, H = c.head_dim;
  const double tokens = B * T;
  Cost layer;
  layer += matmul_cost(tokens, D, (N + 2 * K) * H, w);  // q, k, v projections
  layer += matmul_cost(tokens, N * H, D, w);            // output projection
  layer += attention_cost(B, S, T, N, K, H, w);
  layer += mlp_cost(B, T, D, F, w);
  Cost total;
  total.flops = layer.flops * c.num_layers;
  total.bytes = layer.bytes * c.num_layers;
  // Each step also writes the new tokens' K and V into the cache.
  total.bytes += static_cast<double>(c.kv_cache_bytes(1, 1)) * w * tokens;
  total += matmul_cost(tokens, D, c.vocab_size, w);  // the output head
  total.bytes += w * tokens * D;                     // the embedding rows of the new tokens
  return total;
}

std::int64_t param_bytes(const TransformerConfig& c, std::int64_t w) { return c.num_parameters() * w; }

std::int64_t max_batch(const TransformerConfig& c, std::int64_t S, double memory, std::int64_t w) {
  const double free = memory - static_cast<double>(param_bytes(c, w));
  if (free < 0) return -1;
  return static_cast<std::int64_t>(std::floor(free / static_cast<double>(c.kv_cache_bytes(S, w))));
}

LatencyPoint memory_bound_latency(const TransformerConfig& c, std::int64_t S, std::int64_t B, const metrics::Ceiling& acc,
                                  std::int64_t w) {
  LatencyPoint p;
  p.batch = B;
  // EXERCISE 00.4 BEGIN: a memory-bound step's latency and throughput
  p.memory_bytes = static_cast<double>(param_bytes(c, w)) + static_cast<double>(B) * c.kv_cache_bytes(S, w);
  p.latency_s = p.memory_bytes / acc.bytes_per_s;
  p.throughput = static_cast<double>(B) / p.latency_s;
  // EXERCISE 00.4 STUB
  // lab::not_done("00.4", "set p.memory_bytes (the weights once, plus B caches of S positions), p.latency_s "
  //                       "(those bytes at the accelerator's bandwidth) and p.throughput (tokens per second)");
  // EXERCISE 00.4 END
  p.compute_s =
      forward_cost(c, static_cast<double>(B), static_cast<double>(S), 1, static_cast<double>(w)).flops / acc.flops_per_s;
  p.fits = acc.memory_bytes <= 0 || p.memory_bytes <= acc.memory_bytes;
  return p;
}

namespace {
TransformerConfig llama(std::int64_t D, std::int64_t F, std::int64_t L, std::int64_t N, std::int64_t K, std::int64_t V,
                        std::int64_t ctx, double theta) {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = D, c.intermediate_size = F, c.num_layers = L, c.num_heads = N, c.num_kv_heads = K;
  c.head_dim = D / N, c.vocab_size = V, c.max_position_embeddings = ctx, c.rope_theta = theta;
  c.rms_norm_eps = 1e-5, c.torch_dtype = "bfloat16";
  return c;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  s.erase(std::remove_if(s.begin(), s.end(), [](char ch) { return ch == '-' || ch == '_' || ch == '.' || ch == ' '; }),
          s.end());
  return s;
}
}  // namespace

const std::vector<NamedModel>& named_models() {
  static const std::vector<NamedModel> models = {
      {"Llama-2-7B", llama(4096, 11008, 32, 32, 32, 32000, 4096, 1e4), "meta-llama/Llama-2-7b-hf config.json"},
      {"Llama-2-13B", llama(5120, 13824, 40, 40, 40, 32000, 4096, 1e4), "meta-llama/Llama-2-13b-hf config.json"},
      {"Llama-2-70B", llama(8192, 28672, 80, 64, 8, 32000, 4096, 1e4), "meta-llama/Llama-2-70b-hf config.json"},
      {"Llama-3-8B", llama(4096, 14336, 32, 32, 8, 128256, 8192, 5e5), "meta-llama/Meta-Llama-3-8B config.json"},
      {"Llama-3-70B", llama(8192, 28672, 80, 64, 8, 128256, 8192, 5e5), "meta-llama/Meta-Llama-3-70B config.json"},
      {"Llama-3.1-405B", llama(16384, 53248, 126, 128, 8, 128256, 131072, 5e5), "meta-llama/Llama-3.1-405B config.json"},
  };
  return models;
}

TransformerConfig find_model(const std::string& name_or_path) {
  for (const auto& m : named_models())
    if (lower(m.name) == lower(name_or_path)) return m.config;
  if (std::filesystem::exists(name_or_path)) return parse_transformer_config(load_hf_config(name_or_path));
  std::string names;
  for (const auto& m : named_models()) names += (names.empty() ? "" : ", ") + m.name;
  fail("unknown model '", name_or_path, "': not one of ", names, ", and no such config.json or model folder");
}

metrics::Ceiling find_accelerator(const std::string& name) {
  const std::string n = lower(name);
  for (const auto& c : metrics::accelerator_presets())
    if (lower(c.name).rfind(n, 0) == 0) return c;
  fail("unknown accelerator '", name, "' (known: h100, h200, a100)");
}

}  // namespace inferlab::ch00
