// GQA's speed at long context on the CPU, where the KV cache is what a decode step reads:
// ops::attention on a Llama-3-8B-shaped layer's cache (N = 32 query heads, H = 128) with K = 8
// KV heads and with K = N (MHA); GB/s counts the bytes the cache holds, K·S·H·2·4. A whole
// decode step's throughput by batch size is `ch03_gqa throughput`. The GPU versions (chapter
// 02's per-head kernel, chapter 03's grouped one, on GQA, MHA and MQA caches) are timed together
// by bench_decode_attention.
#include <benchmark/benchmark.h>

#include "bench_main.h"
#include "common/ceiling.h"
#include "common/metrics.h"
#include "common/ops.h"

using namespace inferlab;

namespace {

constexpr std::int64_t N = 32, K = 8, H = 128;

void BM_CpuDecodeAttention(benchmark::State& state) {
  const std::int64_t S = state.range(0), kv = state.range(1);
  Tensor q = Tensor::zeros({1, N, H}, DType::F32), k = Tensor::empty({S, kv, H}, DType::F32),
         v = Tensor::empty({S, kv, H}, DType::F32), out = Tensor::empty({1, N, H}, DType::F32);
  for (Tensor* t : {&k, &v})
    for (std::int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = static_cast<float>(i % 97) * 0.01f;
  double total = 0;
  for (auto _ : state) {
    metrics::Timer t;
    ops::attention(q, k, v, out);
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt;
  }
  const double bytes = static_cast<double>(kv) * static_cast<double>(S) * H * 2 * 4;
  const double per = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = bytes / per / 1e9;
  // Against a streaming read over as many bytes (a short cache sits in the last-level cache).
  const auto ceiling = metrics::cpu_read_ceiling(bytes);
  state.counters["of_ceiling"] = bytes / per / ceiling.bytes_per_s();
  state.SetLabel(std::string(kv == N ? "MHA cache" : "GQA cache (K = 8)") + ", " + ceiling.kind);
}
BENCHMARK(BM_CpuDecodeAttention)->ArgsProduct({{4096, 16384}, {N, K}})->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
