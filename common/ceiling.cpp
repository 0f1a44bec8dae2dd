#include "common/ceiling.h"

#include <omp.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cuda/backend.h"

namespace inferlab::metrics {

double RooflinePoint::attainable_flops_per_s() const {
  return std::min(ceiling.flops_per_s, ceiling.bytes_per_s * intensity());
}

std::string RooflinePoint::bound() const { return intensity() < ceiling.ridge() ? "memory" : "compute"; }

double RooflinePoint::fraction_of_roof() const {
  double a = attainable_flops_per_s();
  return a > 0 ? achieved_flops_per_s() / a : 0;
}

RooflinePoint roofline(std::string label, const Work& work, double seconds, const Ceiling& ceiling) {
  RooflinePoint p;
  p.label = std::move(label);
  p.work = work;
  p.seconds = seconds;
  p.ceiling = ceiling;
  return p;
}

std::string human_rate(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g %s%s/s", v, prefixes[i], unit);
  return buf;
}

std::string human_bytes(double v) {
  const char* prefixes[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(v) >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, i == 0 ? "%.0f %s" : "%.3g %s", v, prefixes[i]);
  return buf;
}

std::string describe(const RooflinePoint& p) {
  std::ostringstream os;
  const auto& c = p.ceiling;
  os << human_rate(p.achieved_bytes_per_s(), "B") << " = "
     << static_cast<int>(std::lround(100 * p.achieved_bytes_per_s() / c.bytes_per_s)) << "% of "
     << human_rate(c.bytes_per_s, "B") << "; " << human_rate(p.achieved_flops_per_s(), "FLOP") << " = "
     << static_cast<int>(std::lround(100 * p.achieved_flops_per_s() / c.flops_per_s)) << "% of "
     << human_rate(c.flops_per_s, "FLOP") << " (" << c.flops_dtype << "); intensity "
     << std::lround(p.intensity() * 100) / 100.0 << " FLOP/B vs ridge " << std::lround(c.ridge() * 10) / 10.0
     << ": " << p.bound() << "-bound [" << c.name << ", " << c.source << "]";
  return os.str();
}


nlohmann::json to_json(const Ceiling& c) {
  return {{"name", c.name},           {"bytes_per_s", c.bytes_per_s}, {"flops_per_s", c.flops_per_s},
          {"flops_dtype", c.flops_dtype}, {"source", c.source},       {"ridge_flops_per_byte", c.ridge()},
          {"memory_bytes", c.memory_bytes}};
}

nlohmann::json to_json(const RooflinePoint& p) {
  return {{"label", p.label},
          {"work", to_json(p.work)},
          {"seconds", p.seconds},
          {"intensity_flops_per_byte", p.intensity()},
          {"achieved_bytes_per_s", p.achieved_bytes_per_s()},
          {"achieved_flops_per_s", p.achieved_flops_per_s()},
          {"attainable_flops_per_s", p.attainable_flops_per_s()},
          {"fraction_of_roof", p.fraction_of_roof()},
          {"bound", p.bound()},
          {"ceiling", to_json(p.ceiling)}};
}

double measure_cpu_read_bandwidth(std::size_t bytes, int threads, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  const std::size_t n = bytes / sizeof(float);
  std::unique_ptr<float[]> a(new float[n]);
  // First touch from the threads that will read, so pages land near them.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 1023) * 1e-3f;
  double best = 1e300;
  volatile float sink = 0;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    float total = 0;
    // 16 independent partial sums per thread, so that the adds vectorise and memory, not the
    // add latency, is the limit.
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      float acc[16] = {};
#pragma omp for schedule(static)
      for (std::size_t i = 0; i < n / 16; ++i)
        for (int k = 0; k < 16; ++k) acc[k] += a[i * 16 + k];
      for (int k = 0; k < 16; ++k) total += acc[k];
    }
    best = std::min(best, t.seconds());
    sink = sink + total;
  }
  (void)sink;
  return static_cast<double>(n * sizeof(float)) / best;
}

double measure_cpu_matmul_flops(int n, int reps) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  c.noalias() = a * b;  // warm-up (threads, pages, clocks)
  c.noalias() = a * b;
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    c.noalias() = a * b;
    best = std::min(best, t.seconds());
  }
  volatile float sink = c(0, 0);
  (void)sink;
  return 2.0 * n * n * static_cast<double>(n) / best;
}

Ceiling measure_cpu_ceiling(int threads) {
  if (threads <= 0) threads = omp_get_max_threads();
  Ceiling c;
  c.name = "cpu (" + std::to_string(threads) + " threads)";
  c.bytes_per_s = measure_cpu_read_bandwidth(std::size_t(1) << 30, threads, 5);
  c.flops_per_s = measure_cpu_matmul_flops(2048, 5);
  c.flops_dtype = "f32";
  c.source = "measured: OpenMP sum over 1 GiB (best of 5); Eigen f32 GEMM 2048^3 (best of 5)";
  c.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  return c;
}

Ceiling measure_cuda_ceiling() {
  cuda::require_device();
  Ceiling c;
  c.name = cuda::device_description();
  c.bytes_per_s = cuda::measure_read_bandwidth(std::size_t(2) << 30);
  c.flops_per_s = cuda::measure_gemm_flops(8192);
  c.flops_dtype = "bf16";
  c.source = "measured: streaming read kernel over 2 GiB (best of 20); cuBLAS bf16 GEMM 8192^3 (best of 10)";
  c.memory_bytes = static_cast<double>(cuda::device_memory_bytes());
  return c;
}

std::vector<Ceiling> accelerator_presets() {
  // Dense (no sparsity) bf16 tensor-core peaks, HBM bandwidth and capacity from NVIDIA's
  // datasheets (capacities in the datasheets' decimal GB).
  return {
      {"A100 SXM 80GB", 2.039e12, 312e12, "bf16", "datasheet", 80e9},
      {"H100 SXM", 3.35e12, 989e12, "bf16", "datasheet", 80e9},
      {"H200 SXM", 4.8e12, 989e12, "bf16", "datasheet", 141e9},
  };
}

Ceiling measure_ceiling(Device device) {
  return device == Device::CUDA ? measure_cuda_ceiling() : measure_cpu_ceiling();
}

}  // namespace inferlab::metrics
