// Decode speed against the memory ceiling, on Llama-shaped models with random weights large
// enough to leave the caches. Each step must read every weight and the KV cache so far; the
// achieved bandwidth is those bytes over the measured time per token, and the ceiling is this
// machine's read bandwidth measured in the same run.
//
//   bench_decode [--benchmark_filter=Cpu|Cuda] [--benchmark_out=FILE --benchmark_out_format=json]
//
// CPU: a ~350M-parameter GQA model (f32 and bf16 weights), B = 1, 64 tokens of context.
// CUDA: Llama-3.2-1B and Llama-3.1-8B shapes in bf16 through chapter 02's CudaDecoder (CUDA
// graph, device-side greedy), B = 1, 256 tokens of context, with each version of the GEMV family
// (the second argument: 3, the default, folds the RMSNorms into the products after them).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "bench_main.h"
#include "chapters/02_kv_cache/cuda_decode.h"
#include "common/ceiling.h"
#include "common/cuda/backend.h"
#include "common/metrics.h"
#include "common/models/kv_cache.h"

using namespace inferlab;

namespace {

TransformerConfig shape(std::int64_t D, std::int64_t F, std::int64_t L, std::int64_t N, std::int64_t K, std::int64_t H,
                        std::int64_t V, bool tied) {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = D, c.intermediate_size = F, c.num_layers = L, c.num_heads = N, c.num_kv_heads = K, c.head_dim = H;
  c.vocab_size = V, c.max_position_embeddings = 8192, c.rms_norm_eps = 1e-5, c.rope_theta = 5e5;
  c.tie_word_embeddings = tied;
  return c;
}

const TransformerConfig kCpu350M = shape(1536, 4096, 10, 12, 4, 128, 32000, false);
const TransformerConfig kLlama1B = shape(2048, 8192, 16, 32, 8, 64, 128256, true);
const TransformerConfig kLlama8B = shape(4096, 14336, 32, 32, 8, 128, 128256, false);

// The read ceiling of a step's own kind: a streaming read over as many bytes as it reads (these
// models are beyond the last-level cache on most machines, but not on every one).
double cpu_bandwidth(double bytes_per_step) { return metrics::cpu_read_ceiling(bytes_per_step).bytes_per_s(); }

void report(benchmark::State& state, double bytes_per_token, double s_per_token, double ceiling, double params) {
  state.counters["tokens/s"] = 1.0 / s_per_token;
  state.counters["GB/s"] = bytes_per_token / s_per_token / 1e9;
  state.counters["ceiling_GB/s"] = ceiling / 1e9;
  state.counters["of_ceiling"] = bytes_per_token / s_per_token / ceiling;
  state.counters["params_M"] = params / 1e6;
}

void BM_CpuDecode(benchmark::State& state) {
  const DType wt = state.range(0) ? DType::BF16 : DType::F32;
  static std::map<int, std::unique_ptr<models::Llama>> models;
  auto& m = models[static_cast<int>(state.range(0))];
  if (!m) m = std::make_unique<models::Llama>(models::random_llama(kCpu350M, 1, wt));
  const std::vector<std::int32_t> prompt(64, 7);
  models::ContiguousKVCache cache(kCpu350M, 64 + 1000);
  models::forward_cached(*m, cache, prompt);
  double total = 0, bytes = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    const double cache_bytes = static_cast<double>(kCpu350M.kv_cache_bytes(cache.length() + 1, 4));
    metrics::Timer t;
    benchmark::DoNotOptimize(models::forward_cached(*m, cache, {7}).raw_data());
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt, bytes += static_cast<double>(m->step_weight_bytes()) + cache_bytes, ++n;
    if (cache.length() >= cache.capacity() - 1) cache.truncate(64);  // stay near the same context
  }
  report(state, bytes / static_cast<double>(n), total / static_cast<double>(n),
         cpu_bandwidth(bytes / static_cast<double>(n)), static_cast<double>(kCpu350M.num_parameters()));
  state.SetLabel(std::string(dtype_name(wt)) + " weights, context 64, B=1");
}
BENCHMARK(BM_CpuDecode)->Arg(0)->Arg(1)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

// A pass over `rows` new tokens after a 16-token prompt on chapter 01's memory-bound 100M shape
// (f32): chapter 10's verification pass over γ + 1 drafts. Decoding reads the weights once per
// pass, so the lecture's formula takes its cost to be one step's whatever the rows; compare the
// rows = 1 line with the others.
void BM_CpuVerifyPass(benchmark::State& state) {
  const std::int64_t rows = state.range(0);
  static const TransformerConfig c = models::memory_bound_shape(8, 16, 1024, 4096);
  static const models::Llama m = models::random_llama(c, 1);
  models::ContiguousKVCache cache(c, 16 + rows);
  models::forward_cached(m, cache, std::vector<std::int32_t>(16, 5));
  const std::vector<std::int32_t> feed(static_cast<std::size_t>(rows), 9);
  double total = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    metrics::Timer t;
    benchmark::DoNotOptimize(models::forward_cached(m, cache, feed, true).raw_data());
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt, ++n;
    cache.truncate(16);
  }
  report(state, static_cast<double>(m.step_weight_bytes()), total / static_cast<double>(n),
         cpu_bandwidth(static_cast<double>(m.step_weight_bytes())), static_cast<double>(c.num_parameters()));
  state.counters["tokens/s"] = static_cast<double>(rows * n) / total;
  state.SetLabel(std::to_string(rows) + (rows == 1 ? " row" : " rows") + " a pass, f32 weights");
}
BENCHMARK(BM_CpuVerifyPass)->Arg(1)->Arg(2)->Arg(5)->Arg(8)->UseManualTime()->Iterations(20)->Unit(benchmark::kMillisecond);

void BM_CudaDecode(benchmark::State& state) {
  const std::string reason = cuda::unavailable_reason();
  if (!reason.empty()) {
    state.SkipWithError(("no CUDA device available: " + reason).c_str());
    return;
  }
  const TransformerConfig& c = state.range(0) == 1 ? kLlama1B : kLlama8B;
  static std::map<int, std::unique_ptr<models::Llama>> models;
  auto& m = models[static_cast<int>(state.range(0))];
  if (!m) m = std::make_unique<models::Llama>(models::random_llama(c, 1, DType::BF16, Device::CUDA));
  static const double ceiling = cuda::measure_read_bandwidth(std::size_t(4) << 30);
  const int context = 256, warmup = 4, steps = 64;
  double total = 0, bytes = 0;
  std::int64_t n = 0;
  const auto version = static_cast<cuda::GemvVersion>(state.range(1));
  for (auto _ : state) {
    cuda::set_gemv_version(version);                      // read by the decoder when it is constructed
    ch02::CudaDecoder dec(*m, context + warmup + steps);  // every position the loop below fills
    cuda::set_gemv_version(cuda::kDefaultGemvVersion);
    dec.prefill(std::vector<std::int32_t>(context, 7));
    dec.greedy(7, warmup);  // captures the graph
    cuda::synchronize();
    const double start_len = static_cast<double>(dec.length());
    metrics::Timer t;
    dec.greedy(7, steps);  // steps back to back on the device; one copy of the tokens at the end
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt, n += steps;
    const double kv = static_cast<double>(c.kv_cache_bytes(1, 4));  // one position, f32
    bytes += steps * static_cast<double>(m->step_weight_bytes()) + kv * (steps * start_len + steps * (steps + 1) / 2.0);
  }
  report(state, bytes / static_cast<double>(n), total / static_cast<double>(n), ceiling,
         static_cast<double>(c.num_parameters()));
  state.SetLabel(std::string(state.range(0) == 1 ? "Llama-3.2-1B shape" : "Llama-3.1-8B shape") +
                 ", bf16, context 256, B=1, GEMV version " + cuda::gemv_version_name(version));
}
BENCHMARK(BM_CudaDecode)->ArgsProduct({{1, 8}, {1, 2, 3}})->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
