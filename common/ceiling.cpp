#include "common/ceiling.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "common/cuda/backend.h"

namespace inferlab::metrics {

double RooflinePoint::read_bytes_per_s() const { return read.bytes_per_s() > 0 ? read.bytes_per_s() : ceiling.bytes_per_s; }

double RooflinePoint::attainable_flops_per_s() const {
  return std::min(ceiling.flops_per_s, read_bytes_per_s() * intensity());
}

std::string RooflinePoint::bound() const {
  return intensity() < ceiling.flops_per_s / read_bytes_per_s() ? "memory" : "compute";
}

double RooflinePoint::fraction_of_roof() const {
  double a = attainable_flops_per_s();
  return a > 0 ? achieved_flops_per_s() / a : 0;
}

RooflinePoint roofline(std::string label, const Work& work, double seconds, const Ceiling& ceiling,
                       double working_set_bytes) {
  RooflinePoint p;
  p.label = std::move(label);
  p.work = work;
  p.seconds = seconds;
  p.ceiling = ceiling;
  p.read = read_ceiling_for(ceiling, working_set_bytes >= 0 ? working_set_bytes : work.bytes);
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

namespace {
// The power of 1000 human_rate() divides `v` by, so a spread prints in the best run's unit.
double unit_scale(double v) {
  double scale = 1;
  while (std::fabs(v) >= 1000 && scale < 1e15) {
    v /= 1000;
    scale *= 1000;
  }
  return scale;
}
}  // namespace

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
  ReadCeiling read = p.read;  // roofline() sets it; a point made by hand reads against the device's memory
  if (read.bytes_per_s() <= 0) read.rate = {c.bytes_per_s, c.bytes_per_s, c.bytes_per_s, 1}, read.kind = "from memory";
  os << against(p.achieved_bytes_per_s(), read) << "; " << human_rate(p.achieved_flops_per_s(), "FLOP") << " = "
     << static_cast<int>(std::lround(100 * p.achieved_flops_per_s() / c.flops_per_s)) << "% of "
     << human_rate(c.flops_per_s, "FLOP") << " (" << c.flops_dtype << "); intensity "
     << std::lround(p.intensity() * 100) / 100.0 << " FLOP/B vs ridge "
     << std::lround(c.flops_per_s / read.bytes_per_s() * 10) / 10.0 << ": " << p.bound() << "-bound [" << c.name << ", "
     << c.source << "]";
  return os.str();
}

nlohmann::json to_json(const Ceiling& c) {
  return {{"name", c.name},
          {"bytes_per_s", c.bytes_per_s},
          {"flops_per_s", c.flops_per_s},
          {"flops_dtype", c.flops_dtype},
          {"source", c.source},
          {"ridge_flops_per_byte", c.ridge()},
          {"memory_bytes", c.memory_bytes},
          {"read_spread", to_json(c.read)},
          {"compute_spread", to_json(c.compute)}};
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
          {"read_ceiling", to_json(p.read)},
          {"ceiling", to_json(p.ceiling)}};
}

Spread spread_of(std::vector<double> rates) {
  Spread s;
  if (rates.empty()) return s;
  std::sort(rates.begin(), rates.end());
  const std::size_t n = rates.size();
  s.best = rates.back();
  s.worst = rates.front();
  s.median = n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  s.runs = static_cast<int>(n);
  return s;
}

std::string describe(const Spread& s, const char* unit) {
  if (s.runs <= 1) return human_rate(s.best, unit);
  char buf[96];
  std::snprintf(buf, sizeof buf, " (best of %d; median %.3g, worst %.3g)", s.runs, s.median / unit_scale(s.best),
                s.worst / unit_scale(s.best));
  return human_rate(s.best, unit) + buf;
}

nlohmann::json to_json(const Spread& s) {
  return {{"best", s.best}, {"median", s.median}, {"worst", s.worst}, {"runs", s.runs}};
}

namespace {

// Reads the n floats of `a` `passes` times with `threads` threads, each thread its own static
// share, all passes inside one parallel region; returns the total.
float sum_passes(const float* a, std::size_t n, int threads, int passes) {
  float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const std::size_t blocks = n / 16, lo = blocks * t / nt, hi = blocks * (t + 1) / nt;
    // 16 independent partial sums, so that the adds vectorise and memory, not the add latency,
    // is the limit; and the array asked for 16 KiB ahead, into L2, as the GEMV asks for its
    // weights (cpu::simd::dots): on some CPUs the hardware prefetcher alone leaves a tenth of the
    // bandwidth unused, and a ceiling that a product can beat is no ceiling.
    typedef float f32x16 __attribute__((vector_size(64)));  // one AVX-512 register, two AVX ones
    f32x16 acc = {};
    for (int p = 0; p < passes; ++p)
      for (std::size_t i = lo; i < hi; ++i) {
        __builtin_prefetch(a + i * 16 + 4096, 0, 2);
        f32x16 v;
        std::memcpy(&v, a + i * 16, sizeof v);
        acc += v;
      }
    for (int k = 0; k < 16; ++k) total += acc[k];
  }
  return total;
}

double physical_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

}  // namespace

Spread measure_cpu_read_spread(std::size_t bytes, int threads, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  const std::size_t n = std::max<std::size_t>(bytes / sizeof(float) / 16, 1) * 16;
  std::unique_ptr<float[]> a(new float[n]);
  // First touch from the threads that will read, so pages land near them.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<float>(i & 1023) * 1e-3f;
  volatile float sink = 0;
  // One pass to warm the caches (and, for an array in cache, to see how many passes last 20 ms).
  Timer warm(Clock::Work);
  sink = sink + sum_passes(a.get(), n, threads, 1);
  const double one = std::max(warm.seconds(), 1e-7);
  const int passes = static_cast<int>(std::clamp(0.02 / one, 1.0, 1e6));
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    Timer t(Clock::Work);
    sink = sink + sum_passes(a.get(), n, threads, passes);
    rates.push_back(static_cast<double>(n * sizeof(float)) * passes / t.seconds());
  }
  (void)sink;
  return spread_of(rates);
}

ReadPasses::ReadPasses(double working_set_bytes, int threads)
    : working_set_(working_set_bytes),
      // A working set beyond memory_ceiling_bytes() is read from memory as an array of that size is:
      // an 8B model's 32 GB of f32 weights need no second 32 GB beside them.
      n_(std::max<std::size_t>(
             static_cast<std::size_t>(std::min(working_set_bytes, static_cast<double>(memory_ceiling_bytes()))) /
                 sizeof(float) / 16,
             1) *
         16),
      threads_(threads > 0 ? threads : omp_get_max_threads()) {
  a_.reset(new float[n_]);
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (std::size_t i = 0; i < n_; ++i) a_[i] = static_cast<float>(i & 1023) * 1e-3f;
}

void ReadPasses::run() {
  volatile float sink = 0;
  Timer t(Clock::Work);  // as the steps it takes turns with are timed
  sink = sink + sum_passes(a_.get(), n_, threads_, 1);
  (void)sink;
  rates_.push_back(static_cast<double>(n_ * sizeof(float)) / t.seconds());
}

ReadCeiling ReadPasses::ceiling() const {
  ReadCeiling c;
  c.working_set_bytes = working_set_;
  c.measured_bytes = static_cast<double>(n_ * sizeof(float));
  c.rate = spread_of(rates_);
  // The figure's data and the array take turns: both stay in the cache where the two fit together,
  // and where one alone fills it, each evicts the other.
  const double llc = last_level_cache_bytes();
  c.kind = 2 * working_set_ <= llc ? "in cache" : working_set_ >= llc ? "from memory" : "partly in cache";
  return c;
}

double measure_cpu_read_bandwidth(std::size_t bytes, int threads, int reps) {
  return measure_cpu_read_spread(bytes, threads, reps).best;
}

double last_level_cache_bytes() {
  static const double llc = [] {
    // The largest cache sysfs lists for cpu0 ("300M", "32768K").
    double best = 0;
    for (int i = 0; i < 8; ++i) {
      std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
      std::string v;
      if (!(in >> v) || v.empty()) continue;
      double x = std::atof(v.c_str());
      const char u = v.back();
      x *= u == 'K' ? 1024.0 : u == 'M' ? 1048576.0 : u == 'G' ? 1073741824.0 : 1.0;
      best = std::max(best, x);
    }
    if (best <= 0)
      best = static_cast<double>(std::max<long>(sysconf(_SC_LEVEL3_CACHE_SIZE), sysconf(_SC_LEVEL2_CACHE_SIZE)));
    return best > 0 ? best : 32.0 * 1048576;
  }();
  return llc;
}

std::string cache_kind(double working_set_bytes) {
  const double llc = last_level_cache_bytes();
  return working_set_bytes <= 0.5 * llc ? "in cache" : working_set_bytes >= 2 * llc ? "from memory" : "partly in cache";
}

std::size_t memory_ceiling_bytes() {
  const double want = std::max(4 * last_level_cache_bytes(), 1073741824.0);
  const double cap = std::max(physical_memory_bytes() / 8, 268435456.0);
  return static_cast<std::size_t>(std::min(want, cap));
}

ReadCeiling read_ceiling_for(const Ceiling& device, double working_set_bytes) {
  ReadCeiling c;
  c.working_set_bytes = working_set_bytes;
  if (!device.cpu) {  // a GPU's or a datasheet's ceiling: its memory bandwidth
    c.measured_bytes = 0;
    c.rate = device.read.runs ? device.read : Spread{device.bytes_per_s, device.bytes_per_s, device.bytes_per_s, 1};
    c.kind = "from memory";
    return c;
  }
  c.kind = cache_kind(working_set_bytes);
  const double big = static_cast<double>(memory_ceiling_bytes());
  if (working_set_bytes >= big && device.read.runs > 0) {  // the device's own ceiling is of this kind
    c.measured_bytes = big;
    c.rate = device.read;
    return c;
  }
  // Memoised per size on a grid of 2^(1/8) (within 10% of the working set), at least 256 KiB.
  static std::map<long, Spread> measured;
  const double size = std::min(std::max(working_set_bytes, 262144.0), big);
  const long step = std::lround(8 * std::log2(size));
  c.measured_bytes = std::exp2(step / 8.0);
  auto it = measured.find(step);
  if (it == measured.end())
    it = measured.emplace(step, measure_cpu_read_spread(static_cast<std::size_t>(c.measured_bytes), 0, 5)).first;
  c.rate = it->second;
  return c;
}

ReadCeiling cpu_read_ceiling(double working_set_bytes) {
  Ceiling cpu;
  cpu.cpu = true;
  return read_ceiling_for(cpu, working_set_bytes);
}

double percent_of(double achieved, const ReadCeiling& c) {
  return c.bytes_per_s() > 0 ? 100 * achieved / c.bytes_per_s() : 0;
}

std::string above_ceiling_note(double achieved, const ReadCeiling& c) {
  if (achieved <= c.bytes_per_s()) return "";
  if (c.kind == "partly in cache")
    return "above: the figure's working set is partly in cache, and the cache keeps more of a step's reuse than of a plain "
           "sum";
  if (achieved <= c.bytes_per_s() * (1 + (c.rate.best - c.rate.worst) / std::max(c.rate.best, 1e-30)))
    return "above: within the ceiling's spread; the machine moved between the two measurements";
  return "above: the figure reads fewer bytes than it counts (part of them stay in a faster cache level)";
}

std::string against(double achieved, const ReadCeiling& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s = %.0f%% of %s %s", human_rate(achieved, "B").c_str(), percent_of(achieved, c),
                human_rate(c.bytes_per_s(), "B").c_str(), c.kind.c_str());
  std::string s = buf;
  if (c.rate.runs > 1) {
    std::snprintf(buf, sizeof buf, " (best of %d, worst %.3g)", c.rate.runs, c.rate.worst / unit_scale(c.rate.best));
    s += buf;
  }
  const std::string note = above_ceiling_note(achieved, c);
  return note.empty() ? s : s + " [" + note + "]";
}

std::string against_in_turns(const Spread& a, const ReadCeiling& c) {
  const auto share = [](double x, double of) { return of > 0 ? 100 * x / of : 0.0; };
  char buf[240];
  std::snprintf(buf, sizeof buf, "%s median of %d = %.0f%% of the sums' median %s (best %.3g = %.0f%% of %.3g), %s",
                human_rate(a.median, "B").c_str(), a.runs, share(a.median, c.rate.median),
                human_rate(c.rate.median, "B").c_str(), a.best / unit_scale(c.rate.median), share(a.best, c.rate.best),
                c.rate.best / unit_scale(c.rate.median), c.kind.c_str());
  return buf;
}

double CeilingLegend::percent(const std::string& label, double achieved, const ReadCeiling& c) {
  bool seen = false;
  for (const auto& u : used_) seen = seen || (u.measured_bytes == c.measured_bytes && u.kind == c.kind);
  if (!seen) used_.push_back(c);
  const std::string note = above_ceiling_note(achieved, c);
  if (!note.empty()) notes_.push_back(label + ": " + note);
  return percent_of(achieved, c);
}

void CeilingLegend::print(const char* pad) const {
  if (used_.empty()) return;
  std::vector<ReadCeiling> by_size = used_;
  std::sort(by_size.begin(), by_size.end(),
            [](const ReadCeiling& a, const ReadCeiling& b) { return a.measured_bytes < b.measured_bytes; });
  std::printf("%sceilings (a streaming read over as many bytes as the figure's step reads):\n", pad);
  for (const auto& c : by_size)
    std::printf("%s  %-15s %9s: %s\n", pad, c.kind.c_str(),
                c.measured_bytes > 0 ? human_bytes(c.measured_bytes).c_str() : "device", describe(c.rate, "B").c_str());
  for (const auto& n : notes_) std::printf("%s%s\n", pad, n.c_str());
}

nlohmann::json to_json(const ReadCeiling& c) {
  return {{"working_set_bytes", c.working_set_bytes},
          {"measured_bytes", c.measured_bytes},
          {"bytes_per_s", c.bytes_per_s()},
          {"spread", to_json(c.rate)},
          {"kind", c.kind},
          {"last_level_cache_bytes", last_level_cache_bytes()}};
}

Spread measure_cpu_matmul_spread(int n, int reps) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  c.noalias() = a * b;  // warm-up (threads, pages, clocks)
  c.noalias() = a * b;
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    Timer t(Clock::Work);
    c.noalias() = a * b;
    rates.push_back(2.0 * n * n * static_cast<double>(n) / t.seconds());
  }
  volatile float sink = c(0, 0);
  (void)sink;
  return spread_of(rates);
}

double measure_cpu_matmul_flops(int n, int reps) { return measure_cpu_matmul_spread(n, reps).best; }

Ceiling measure_cpu_ceiling(int threads, int gemm_n, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  Ceiling c;
  c.name = "cpu (" + std::to_string(threads) + " threads)";
  const std::size_t bytes = memory_ceiling_bytes();
  c.read = measure_cpu_read_spread(bytes, threads, reps);
  c.compute = measure_cpu_matmul_spread(gemm_n, reps);
  c.bytes_per_s = c.read.best;
  c.flops_per_s = c.compute.best;
  c.flops_dtype = "f32";
  c.cpu = true;
  char src[200];
  std::snprintf(src, sizeof src,
                "measured: OpenMP sum over %s, 4x the %s last-level cache (best of %d); Eigen f32 GEMM %d^3 (best of %d)",
                human_bytes(static_cast<double>(bytes)).c_str(), human_bytes(last_level_cache_bytes()).c_str(), reps, gemm_n,
                reps);
  c.source = src;
  c.memory_bytes = physical_memory_bytes();
  return c;
}

Ceiling measure_cuda_ceiling() {
  cuda::require_device();
  Ceiling c;
  c.name = cuda::device_description();
  c.bytes_per_s = cuda::measure_read_bandwidth(std::size_t(2) << 30);
  c.flops_per_s = cuda::measure_gemm_flops(8192);
  c.flops_dtype = "bf16";
  c.read = {c.bytes_per_s, c.bytes_per_s, c.bytes_per_s, 1};  // the runs stay on the device: the best only
  c.compute = {c.flops_per_s, c.flops_per_s, c.flops_per_s, 1};
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

Ceiling measure_ceiling(Device device) { return device == Device::CUDA ? measure_cuda_ceiling() : measure_cpu_ceiling(); }

}  // namespace inferlab::metrics
