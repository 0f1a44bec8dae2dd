// The core ops against this machine's ceilings. GEMV is decode's whole cost (every weight read
// once per token), so its achieved bandwidth over the measured read bandwidth is the number
// that matters; GEMM is prefill's, measured against the measured FLOP/s.
//
//   bench_core [--benchmark_filter=...] [--benchmark_out=FILE --benchmark_out_format=json]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/ceiling.h"
#include "common/cli.h"
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
// The read ceiling over a working set of range(0) MiB, best and median of 5 passes: in L2, in the
// last-level cache, from memory. Each CPU rate the project prints is compared with the one of its
// own working set's size (metrics::read_ceiling_for); this shows how far apart they are.
void BM_CpuReadBandwidth(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  for (auto _ : state) {
    const metrics::Spread s = metrics::measure_cpu_read_spread(bytes, 0, 5);
    state.SetIterationTime(static_cast<double>(bytes) / s.best);
    state.counters["GB/s"] = s.best / 1e9;
    state.counters["median_GB/s"] = s.median / 1e9;
  }
  state.SetLabel(metrics::cache_kind(static_cast<double>(bytes)));
}
BENCHMARK(BM_CpuReadBandwidth)
    ->Arg(1024)
    ->Arg(2)
    ->Arg(16)
    ->Arg(48)
    ->Arg(128)
    ->UseManualTime()
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

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

// The GEMV family (common/cuda/gemv.cuh) against cuBLAS at M = 1: bf16 weights [N, K], f32 x and
// y. Variant 0 is cuBLAS through ops::matmul (x rounded to bf16 first, as cuBLAS wants both inputs
// in one type), 1 to 3 the family's versions by number through cuda::gemv (3 normalises x by an
// RMSNorm in its prologue, as the decoder runs it before q/k/v, gate/up and the head). Each case
// is first checked against the float64 product within its dtype's bound: a mismatch is reported
// as an error, not a figure. GB/s counts the weights, x and y (and version 3's norm weight) once;
// of_bw_ceiling divides it by the read bandwidth measured in the same run.
//   bench_core --benchmark_filter='CudaGemv/.*/2/'     # version 2 at every shape
struct GemvRef {
  std::vector<double> exact, mag;  // the float64 product and Σ|w·x| of each row
};

// The float64 product of the bf16 weights w (on the device) with x, normalised first when `norm`
// is defined (as version 3 does), for the check before timing. Computed once per shape and kind.
const GemvRef& gemv_reference(const Tensor& w, const Tensor& x, const Tensor& norm, float eps) {
  static std::map<std::tuple<std::int64_t, std::int64_t, bool>, GemvRef> cache;
  const std::int64_t N = w.size(0), K = w.size(1);
  GemvRef& r = cache[{N, K, norm.defined()}];
  if (!r.exact.empty()) return r;
  const Tensor wh = w.to(Device::CPU);
  const std::uint16_t* W = static_cast<const std::uint16_t*>(wh.raw_data());
  std::vector<double> h = x.to(Device::CPU).to_double_vector();
  if (norm.defined()) {
    const auto g = norm.to(Device::CPU).to_double_vector();
    double ss = 0;
    for (double v : h) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(K) + static_cast<double>(eps));
    for (std::int64_t k = 0; k < K; ++k) h[k] = h[k] * inv * g[k];
  }
  r.exact.resize(N), r.mag.resize(N);
  for (std::int64_t n = 0; n < N; ++n) {
    double d = 0, a = 0;
    for (std::int64_t k = 0; k < K; ++k) {
      const double p = static_cast<double>(bf16_to_f32(W[n * K + k])) * h[k];
      d += p, a += std::fabs(p);
    }
    r.exact[n] = d, r.mag[n] = a;
  }
  return r;
}

void BM_CudaGemv(benchmark::State& state) {
  if (skip_without_cuda(state)) return;
  const std::int64_t N = state.range(0), K = state.range(1);
  const int variant = static_cast<int>(state.range(2));
  const bool fused = variant == static_cast<int>(cuda::GemvVersion::NormFused);
  const float eps = 1e-5f;
  // Several weight copies, rotated, so that the 50 to 60 MB L2 cannot serve repeated reads.
  const int copies = std::max<int>(2, static_cast<int>(std::ceil(256e6 / (N * K * 2.0))));
  std::vector<Tensor> ws;
  for (int i = 0; i < copies; ++i) {
    ws.push_back(Tensor::empty({N, K}, DType::BF16, Device::CUDA));
    cuda::fill_uniform(ws.back(), 10 + static_cast<std::uint64_t>(i), -1, 1);
  }
  Tensor x = random({1, K}, DType::F32, 1).to(Device::CUDA), out = Tensor::empty({1, N}, DType::F32, Device::CUDA);
  const Tensor norm = fused ? random({K}, DType::F32, 3).to(Device::CUDA) : Tensor();
  std::vector<cuda::GemvArgs> args(static_cast<std::size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    args[i].weights = {ws[i]};
    args[i].norm = norm, args[i].eps = eps;
  }
  auto run = [&](int i) {
    if (variant == 0) ops::matmul(x, ws[i], out);
    else cuda::gemv(static_cast<cuda::GemvVersion>(variant), x, args[i], out);
  };
  if (variant == 0) cuda::set_gemv_kernel(cuda::GemvKernel::Cublas);
  // The check: |y − exact| ≤ (γ_{K+2} + δ) Σ|w·x'|, δ the normalised x's error (version 3, as in
  // the tests) or cuBLAS' rounding of x to bf16.
  run(0);
  const auto got = out.to_double_vector();
  const GemvRef& ref = gemv_reference(ws[0], x, norm, eps);
  const double g = (K + 2) * 0x1p-24 / (1 - (K + 2) * 0x1p-24);
  const double delta = variant == 0 ? 0x1p-8 : fused ? 0.5 * g + 8 * 0x1p-24 : 0.0;
  for (std::int64_t n = 0; n < N; ++n)
    if (!(std::fabs(got[n] - ref.exact[n]) <= (delta + g * (1 + delta)) * ref.mag[n])) {
      cuda::set_gemv_kernel(cuda::GemvKernel::Own);
      state.SkipWithError(("row " + std::to_string(n) + ": " + std::to_string(got[n]) + " against the float64 " +
                           std::to_string(ref.exact[n]))
                              .c_str());
      return;
    }
  constexpr int kBatch = 50;
  double total = 0;
  for (auto _ : state) {
    cuda::synchronize();
    metrics::Timer t;
    for (int i = 0; i < kBatch; ++i) run(i % copies);
    cuda::synchronize();
    const double dt = t.seconds() / kBatch;
    state.SetIterationTime(dt);
    total += dt;
  }
  cuda::set_gemv_kernel(cuda::GemvKernel::Own);
  const metrics::Work work{2.0 * N * K, 2.0 * N * K + 4.0 * K + 4.0 * N + (fused ? 4.0 * K : 0.0)};
  report(state, work, total, cuda_ceiling());
  state.SetLabel(variant == 0 ? std::string("cuBLAS, bf16")
                              : std::string("version ") + cuda::gemv_version_name(static_cast<cuda::GemvVersion>(variant)) +
                                    ", bf16");
}
// Llama-3.2-1B (2048 wide, MLP 8192) and Llama-3.1-8B (4096 wide, MLP 14336) layer shapes and the
// 8B's head (vocabulary 128256), each by cuBLAS (variant 0) and every version (1 to 3).
BENCHMARK(BM_CudaGemv)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (auto [N, K] : {std::pair<std::int64_t, std::int64_t>{2048, 2048},
                          {8192, 2048},
                          {2048, 8192},
                          {4096, 4096},
                          {14336, 4096},
                          {4096, 14336},
                          {128256, 4096}})
        for (std::int64_t v = 0; v <= 3; ++v) b->Args({N, K, v});
    })
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
  wait_passively(argv);  // as the executables wait (common/cli.h)
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
