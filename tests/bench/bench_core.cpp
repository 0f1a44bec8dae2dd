// The core ops against this machine's ceilings. GEMV is decode's whole cost (every weight read
// once per token), so its achieved bandwidth over the measured read bandwidth is the number
// that matters; GEMM is prefill's, measured against the measured FLOP/s.
//
//   bench_core [--benchmark_filter=...] [--benchmark_out=FILE --benchmark_out_format=json]
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>

#include "common/ceiling.h"
#include "common/cuda/backend.h"
#include "common/metrics.h"
#include "common/ops.h"

using namespace inferlab;

namespace {

const metrics::Ceiling& cpu_ceiling() {
  static const metrics::Ceiling c = metrics::measure_cpu_ceiling();
  return c;
}

const metrics::Ceiling& cuda_ceiling() {
  static const metrics::Ceiling c = metrics::measure_cuda_ceiling();
  return c;
}

Tensor random(const Shape& shape, DType dtype, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return dtype == DType::F32 ? t : t.to(dtype);
}

void report(benchmark::State& state, const metrics::Work& per_iter, double seconds, const metrics::Ceiling& c) {
  const double n = static_cast<double>(state.iterations());
  const auto p = metrics::roofline("bench", {per_iter.flops * n, per_iter.bytes * n}, seconds, c, per_iter.bytes);
  state.counters["GB/s"] = p.achieved_bytes_per_s() / 1e9;
  state.counters["GFLOP/s"] = p.achieved_flops_per_s() / 1e9;
  state.counters["of_bw_ceiling"] = p.achieved_bytes_per_s() / p.read_bytes_per_s();  // of its own kind
  state.counters["of_flop_ceiling"] = p.achieved_flops_per_s() / c.flops_per_s;
}

// ---------------------------------------------------------------------------------------------
void BM_CpuReadBandwidth(benchmark::State& state) {
  for (auto _ : state) {
    const double bw = metrics::measure_cpu_read_bandwidth(std::size_t(1) << 30, 0, 3);
    state.SetIterationTime((std::size_t(1) << 30) / bw);
    state.counters["GB/s"] = bw / 1e9;
  }
}
BENCHMARK(BM_CpuReadBandwidth)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

// M = 1: the decode step's matrix-vector product, K x N weights. M of 2 to 8 rows is a
// speculative verification pass (chapter 10) or a small decode batch: it should still cost one
// read of the weights, so its GB/s should stay near M = 1's.
void BM_CpuGemv(benchmark::State& state) {
  const std::int64_t N = state.range(0), K = state.range(1), M = state.range(3);
  const DType wt = state.range(2) ? DType::BF16 : DType::F32;
  // Enough weight copies, rotated, that the working set (>= 256 MiB) is far beyond the L3.
  const int copies = std::max<int>(1, static_cast<int>(std::ceil(256e6 / (N * K * dtype_size(wt)))));
  std::vector<Tensor> ws;
  for (int i = 0; i < copies; ++i) ws.push_back(random({N, K}, wt, 2 + i));
  Tensor x = random({M, K}, DType::F32, 1), out = Tensor::empty({M, N}, DType::F32);
  metrics::Work work;
  {
    metrics::CountScope s;
    ops::matmul(x, ws[0], out);
    work = s.work();
  }
  double total = 0;
  int i = 0;
  for (auto _ : state) {
    metrics::Timer t;
    ops::matmul(x, ws[static_cast<std::size_t>(i++ % copies)], out);
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt;
  }
  report(state, work, total, cpu_ceiling());
  state.SetLabel(std::string(dtype_name(wt)) + " weights, " + std::to_string(M) + (M == 1 ? " row" : " rows"));
}
BENCHMARK(BM_CpuGemv)
    ->Args({4096, 4096, 0, 1})
    ->Args({4096, 4096, 1, 1})
    ->Args({11008, 4096, 1, 1})
    ->Args({4096, 11008, 0, 1})
    ->Args({4096, 4096, 0, 2})
    ->Args({4096, 4096, 0, 3})
    ->Args({4096, 4096, 0, 5})
    ->Args({4096, 4096, 0, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// M large: prefill's matrix product.
void BM_CpuGemm(benchmark::State& state) {
  const std::int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  Tensor x = random({M, K}, DType::F32, 1), w = random({N, K}, DType::F32, 2), out = Tensor::empty({M, N}, DType::F32);
  metrics::Work work;
  {
    metrics::CountScope s;
    ops::matmul(x, w, out);
    work = s.work();
  }
  double total = 0;
  for (auto _ : state) {
    metrics::Timer t;
    ops::matmul(x, w, out);
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt;
  }
  report(state, work, total, cpu_ceiling());
}
BENCHMARK(BM_CpuGemm)->Args({512, 2048, 2048})->UseManualTime()->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------------------------------------
// CUDA. Launches are queued back to back and timed as a batch (device work is asynchronous).
bool skip_without_cuda(benchmark::State& state) {
  const std::string r = cuda::unavailable_reason();
  if (r.empty()) return false;
  state.SkipWithError(("no CUDA device available: " + r).c_str());
  return true;
}

void BM_CudaReadBandwidth(benchmark::State& state) {
  if (skip_without_cuda(state)) return;
  for (auto _ : state) {
    const double bw = cuda_ceiling().bytes_per_s;
    state.SetIterationTime(double(std::size_t(2) << 30) / bw);
    state.counters["GB/s"] = bw / 1e9;
    state.counters["bf16_GEMM_TFLOP/s"] = cuda_ceiling().flops_per_s / 1e12;
  }
}
BENCHMARK(BM_CudaReadBandwidth)->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);

void BM_CudaGemv(benchmark::State& state) {
  if (skip_without_cuda(state)) return;
  const std::int64_t N = state.range(0), K = state.range(1);
  const auto kernel = state.range(2) ? cuda::GemvKernel::Cublas : cuda::GemvKernel::Own;
  // Several weight copies, rotated, so that the 60 MB L2 cannot serve repeated reads.
  const int copies = std::max<int>(2, static_cast<int>(std::ceil(256e6 / (N * K * 2.0))));
  std::vector<Tensor> ws;
  for (int i = 0; i < copies; ++i) ws.push_back(random({N, K}, DType::BF16, 10 + i).to(Device::CUDA));
  Tensor x = random({1, K}, DType::F32, 1).to(Device::CUDA), out = Tensor::empty({1, N}, DType::F32, Device::CUDA);
  cuda::set_gemv_kernel(kernel);
  metrics::Work work;
  {
    metrics::CountScope s;
    ops::matmul(x, ws[0], out);
    work = s.work();
  }
  constexpr int kBatch = 50;
  double total = 0;
  for (auto _ : state) {
    cuda::synchronize();
    metrics::Timer t;
    for (int i = 0; i < kBatch; ++i) ops::matmul(x, ws[i % copies], out);
    cuda::synchronize();
    const double dt = t.seconds() / kBatch;
    state.SetIterationTime(dt);
    total += dt;
  }
  cuda::set_gemv_kernel(cuda::GemvKernel::Own);
  report(state, work, total, cuda_ceiling());
  state.SetLabel(kernel == cuda::GemvKernel::Own ? "own kernel, bf16" : "cuBLAS, bf16");
}
// Llama-3.2-1B (2048 wide, MLP 8192) and Llama-3.1-8B (4096 wide, MLP 14336) layer shapes.
BENCHMARK(BM_CudaGemv)
    ->Args({2048, 2048, 0})
    ->Args({8192, 2048, 0})
    ->Args({4096, 4096, 0})
    ->Args({14336, 4096, 0})
    ->Args({4096, 14336, 0})
    ->Args({14336, 4096, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_CudaGemm(benchmark::State& state) {
  if (skip_without_cuda(state)) return;
  const std::int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  Tensor x = random({M, K}, DType::F32, 1).to(Device::CUDA), w = random({N, K}, DType::BF16, 2).to(Device::CUDA);
  Tensor out = Tensor::empty({M, N}, DType::F32, Device::CUDA);
  metrics::Work work;
  {
    metrics::CountScope s;
    ops::matmul(x, w, out);
    work = s.work();
  }
  double total = 0;
  for (auto _ : state) {
    cuda::synchronize();
    metrics::Timer t;
    for (int i = 0; i < 10; ++i) ops::matmul(x, w, out);
    cuda::synchronize();
    const double dt = t.seconds() / 10;
    state.SetIterationTime(dt);
    total += dt;
  }
  report(state, work, total, cuda_ceiling());
}
BENCHMARK(BM_CudaGemm)->Args({4096, 4096, 4096})->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  try {
    const auto& c = cpu_ceiling();
    benchmark::AddCustomContext("cpu_ceiling",
                                metrics::describe(metrics::roofline("ceiling", {c.flops_per_s, c.bytes_per_s}, 1, c)));
    benchmark::AddCustomContext("cpu_read_GBps", std::to_string(c.bytes_per_s / 1e9));
    benchmark::AddCustomContext("cpu_f32_GFLOPs", std::to_string(c.flops_per_s / 1e9));
    if (cuda::unavailable_reason().empty()) {
      const auto& g = cuda_ceiling();
      benchmark::AddCustomContext("cuda_device", g.name);
      benchmark::AddCustomContext("cuda_read_GBps", std::to_string(g.bytes_per_s / 1e9));
      benchmark::AddCustomContext("cuda_bf16_TFLOPs", std::to_string(g.flops_per_s / 1e12));
    } else {
      benchmark::AddCustomContext("cuda", "no CUDA device available: " + cuda::unavailable_reason());
    }
    benchmark::RunSpecifiedBenchmarks();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_core: error: %s\n", e.what());
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
