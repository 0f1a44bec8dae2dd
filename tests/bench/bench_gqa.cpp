// GQA's speed at long context, where the KV cache is what a decode step reads.
//
// CUDA (Llama-3-8B attention: N = 32 query heads, K = 8 KV heads, H = 128, one layer's cache):
//   grouped   chapter 03's kernel on the GQA cache (each KV head read once per group)
//   per-head  chapter 02's kernel on the same cache (each KV head fetched once per query head)
//   MHA       chapter 02's kernel on K/V repeated per query head (what MHA would read)
// Achieved GB/s counts the bytes each layout must hold: K·S·H·2·4 for GQA, N·S·H·2·4 for MHA.
// CPU: ops::attention on the same shapes, and a whole decode step's throughput by batch size
// lives in `ch03_gqa throughput`.
#include <benchmark/benchmark.h>

#include <cstring>

#include "chapters/02_kv_cache/cuda_decode.h"
#include "chapters/03_gqa/cuda_gqa.h"
#include "common/ceiling.h"
#include "common/cuda/backend.h"
#include "common/metrics.h"
#include "common/ops.h"

using namespace inferlab;

namespace {

constexpr std::int64_t N = 32, K = 8, H = 128;

Tensor repeat_heads(const Tensor& kv) {  // [S, K, H] -> [S, N, H]
  const Tensor src = kv.to(Device::CPU);
  const std::int64_t S = src.size(0), G = N / K;
  Tensor out = Tensor::empty({S, N, H}, DType::F32);
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t h = 0; h < N; ++h)
      std::memcpy(out.data<float>() + (s * N + h) * H, src.data<float>() + (s * K + h / G) * H, H * 4);
  return out.to(kv.device());
}

void BM_CudaDecodeAttention(benchmark::State& state) {
  const std::string reason = cuda::unavailable_reason();
  if (!reason.empty()) {
    state.SkipWithError(("no CUDA device available: " + reason).c_str());
    return;
  }
  const std::int64_t S = state.range(0), variant = state.range(1);
  static const double ceiling = cuda::measure_read_bandwidth(std::size_t(2) << 30);
  Tensor q = Tensor::empty({1, N, H}, DType::F32, Device::CUDA), k = Tensor::empty({S, K, H}, DType::F32, Device::CUDA),
         v = Tensor::empty({S, K, H}, DType::F32, Device::CUDA), out = Tensor::empty({1, N, H}, DType::F32, Device::CUDA);
  cuda::fill_uniform(q, 1, -1, 1), cuda::fill_uniform(k, 2, -1, 1), cuda::fill_uniform(v, 3, -1, 1);
  Tensor kr, vr;
  if (variant == 2) kr = repeat_heads(k), vr = repeat_heads(v);
  auto run = [&] {
    if (variant == 0) ch03::gqa_decode_attention(q, k, v, S, out);
    else if (variant == 1) ch02::decode_attention(q, k, v, S, out);
    else ch02::decode_attention(q, kr, vr, S, out);
  };
  run();
  cuda::synchronize();
  double total = 0;
  for (auto _ : state) {
    metrics::Timer t;
    for (int i = 0; i < 20; ++i) run();
    cuda::synchronize();
    const double dt = t.seconds() / 20;
    state.SetIterationTime(dt);
    total += dt;
  }
  const double heads = variant == 2 ? N : K;
  const double bytes = heads * static_cast<double>(S) * H * 2 * 4;
  const double per = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = bytes / per / 1e9;
  state.counters["of_ceiling"] = bytes / per / ceiling;
  state.counters["us"] = per * 1e6;
  state.SetLabel(variant == 0   ? "grouped kernel, GQA cache"
                 : variant == 1 ? "per-head kernel, GQA cache"
                                : "per-head kernel, MHA cache (K/V repeated)");
}
BENCHMARK(BM_CudaDecodeAttention)->ArgsProduct({{4096, 32768}, {0, 1, 2}})->UseManualTime()->Unit(benchmark::kMicrosecond);

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

BENCHMARK_MAIN();
