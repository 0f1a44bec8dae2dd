// B = 1 matrix-vector products at a Llama-3.1-8B layer shape (gate/up: 14336 × 4096), each
// format reading its own packed weights, against the unquantised baseline (f32 on the CPU,
// bf16 on the GPU). Decoding is memory-bound, so the speed-up should follow the bytes:
// int8 about 2× bf16, int4 about 3.9×.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>

#include "bench_main.h"
#include "chapters/09_quantization/qmodel.h"
#include "chapters/09_quantization/quant.h"
#include "chapters/09_quantization/quant_impl.h"
#include "common/ceiling.h"
#include "common/cuda/backend.h"
#include "common/gguf.h"
#include "common/metrics.h"
#include "common/ops.h"

using namespace inferlab;
using namespace inferlab::ch09;

namespace {

constexpr std::int64_t N = 14336, K = 4096;

const Tensor& weights() {
  static const Tensor w = [] {
    Tensor t = Tensor::empty({N, K}, DType::F32);
    std::uint64_t s = 1;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      t.data<float>()[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) * 0x1p-23f;
    }
    return t;
  }();
  return w;
}

// The read ceiling of a kernel's own kind: on the CPU a streaming read over as many bytes as it
// reads (a 4-bit matrix may sit in a cache an f32 one overflows), on a GPU its memory bandwidth.
double ceiling(Device d, double bytes) {
  static double gpu = 0;
  if (d == Device::CUDA && gpu == 0) gpu = cuda::measure_read_bandwidth(std::size_t(2) << 30);
  return d == Device::CUDA ? gpu : metrics::cpu_read_ceiling(bytes).bytes_per_s();
}

std::map<std::string, double>& baseline() {
  static std::map<std::string, double> b;
  return b;
}

template <class F>
void run(benchmark::State& state, Device dev, double bytes, const std::string& name, F&& f) {
  f();
  if (dev == Device::CUDA) cuda::synchronize();
  double total = 0;
  for (auto _ : state) {
    metrics::Timer t;
    const int reps = dev == Device::CUDA ? 20 : 1;
    for (int i = 0; i < reps; ++i) f();
    if (dev == Device::CUDA) cuda::synchronize();
    const double dt = t.seconds() / reps;
    state.SetIterationTime(dt);
    total += dt;
  }
  const double per = total / static_cast<double>(state.iterations());
  const std::string key = device_name(dev).data();
  if (name == "baseline") baseline()[key] = per;
  state.counters["GB/s"] = bytes / per / 1e9;
  state.counters["of_ceiling"] = bytes / per / ceiling(dev, bytes);
  state.counters["bits/w"] = 8 * bytes / static_cast<double>(N * K);
  if (baseline().count(key)) state.counters["speedup"] = baseline()[key] / per;
  state.SetLabel(name);
}

bool skip_without(Device dev, benchmark::State& state) {
  if (dev == Device::CPU) return false;
  const std::string r = cuda::unavailable_reason();
  if (r.empty()) return false;
  state.SkipWithError(("no CUDA device available: " + r).c_str());
  return true;
}

void baseline_on(benchmark::State& state, Device dev) {
  if (skip_without(dev, state)) return;
  const DType dt = dev == Device::CUDA ? DType::BF16 : DType::F32;  // the usual unquantised decode weights
  const Tensor w = weights().to(dt).to(dev), x = Tensor::zeros({1, K}, DType::F32, dev);
  Tensor out = Tensor::empty({1, N}, DType::F32, dev);
  run(state, dev, static_cast<double>(w.nbytes()), "baseline", [&] { ops::matmul(x, w, out); });
  state.SetLabel(std::string(dtype_name(dt)) + " (baseline)");
}
void BM_CpuMatvecBaseline(benchmark::State& state) { baseline_on(state, Device::CPU); }
void BM_CudaMatvecBaseline(benchmark::State& state) { baseline_on(state, Device::CUDA); }
BENCHMARK(BM_CpuMatvecBaseline)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CudaMatvecBaseline)->UseManualTime()->Unit(benchmark::kMicrosecond);

const std::vector<QuantSpec> kSpecs = {
    {Format::Int8Row}, {Format::LlmInt8}, {Format::Q8_0}, {Format::Fp8E4M3}, {Format::Int4Sym, 128}, {Format::Int4Asym, 128},
    {Format::Q4_0},    {Format::Q4_1},    {Format::Q5_0}, {Format::Q5_1},    {Format::Q4_K},         {Format::Q5_K},
    {Format::Q6_K},    {Format::Q2_K},    {Format::Q3_K}, {Format::IQ4_NL},  {Format::IQ4_XS}};
const int kLastSpec = static_cast<int>(kSpecs.size()) - 1;

// Formats that come from GGUF files, not from quantize(): blocks of pseudo-random bytes (every
// quant and sub-block scale pattern is valid) with their f16 scales (d, and m or dmin) set to 1/16.
bool from_gguf(Format f) { return f != Format::Q8_0 && f != Format::Q4_0 && blocks_activations(f); }
QMatrix gguf_blocks(Format f, std::int64_t rows = N, std::int64_t cols = K) {
  const gguf::Type t = gguf_type(f);
  const std::int64_t bv = gguf::block_values(t), bb = gguf::row_bytes(t, bv), blocks = rows * cols / bv;
  Tensor bytes = Tensor::empty({blocks * bb}, DType::U8);
  auto* p = bytes.data<std::uint8_t>();
  std::uint64_t s = 7;
  for (std::int64_t i = 0; i < bytes.numel(); ++i)
    s ^= s << 13, s ^= s >> 7, s ^= s << 17, p[i] = static_cast<std::uint8_t>(s >> 32);
  for (std::int64_t b = 0; b < blocks; ++b)
    for (const int o : half_offsets(f)) p[b * bb + o] = 0x00, p[b * bb + o + 1] = 0x2C;  // 0x2C00: 1/16
  return QMatrix({f}, rows, cols, bytes);
}

void quantised_on(benchmark::State& state, Device dev) {
  if (skip_without(dev, state)) return;
  const QuantSpec spec = kSpecs.at(static_cast<std::size_t>(state.range(0)));
  const QMatrix q = (from_gguf(spec.format) ? gguf_blocks(spec.format) : quantize(weights(), spec)).to(dev);
  const Tensor x = Tensor::zeros({1, K}, DType::F32, dev);
  Tensor out = Tensor::empty({1, N}, DType::F32, dev);
  const std::string version =
      dev == Device::CUDA && has_qgemv_v2(spec) ? " v" + std::to_string(default_qgemv_version()) : "";
  run(state, dev, static_cast<double>(q.bytes()), spec.name() + version, [&] { qmatmul(x, q, out); });
}
void BM_CpuMatvec(benchmark::State& state) { quantised_on(state, Device::CPU); }
// The same matrices laid out for the fast kernel (eight rows' blocks together, qmodel.h), where a
// format has that layout: the int8 and int4 formats then multiply x as q8_0 blocks in integer SIMD,
// as the GGUF formats do.
void BM_CpuMatvecInterleaved(benchmark::State& state) {
  const QuantSpec spec = kSpecs.at(static_cast<std::size_t>(state.range(0)));
  const QMatrix q = from_gguf(spec.format) ? gguf_blocks(spec.format) : quantize(weights(), spec);
  if (!interleavable(q)) {
    state.SkipWithError((spec.name() + " has no interleaved layout in this build").c_str());
    return;
  }
  const ch09::Interleaved8 il(q);
  const Tensor x = Tensor::zeros({1, K}, DType::F32);
  Tensor out = Tensor::empty({1, N}, DType::F32);
  run(state, Device::CPU, static_cast<double>(il.bytes()), spec.name() + " (interleaved)", [&] { il.matmul(x, out); });
}
void BM_CudaMatvec(benchmark::State& state) { quantised_on(state, Device::CUDA); }
BENCHMARK(BM_CpuMatvec)->DenseRange(0, kLastSpec)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CpuMatvecInterleaved)->DenseRange(0, kLastSpec)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CudaMatvec)->DenseRange(0, kLastSpec)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Every version of the CUDA product (QMatrix::gemv_version) of the formats with a version 2, at the GEMV
// table's Llama-3.2-1B and Llama-3.1-8B layer shapes, against the bf16 GEMV (the default version)
// at the same shape, timed in the same run. Several copies of each matrix, rotated, so that the
// 50 MB L2 cannot serve repeated reads (a 4-bit 14336 × 4096 matrix is 33 MB). Each version's
// result is checked against the CPU's product of the same function before timing: x̂ · Wᵀ (x̂ x's
// q8_0 blocks) for version 2 and the GGUF formats, x · Wᵀ for version 1 of int8_row and int4,
// within 2(γ_K + 2u) Σ |x_k w_k| as the tests bound it.
const std::vector<QuantSpec> kGemvSpecs = {{Format::Int8Row},     {Format::Q8_0},         {Format::Q4_0},
                                           {Format::Int4Sym, 32}, {Format::Int4Sym, 128}, {Format::Int4Asym, 128},
                                           {Format::Q4_K}};
const std::vector<std::pair<std::int64_t, std::int64_t>> kGemvShapes = {
    {14336, 4096}, {4096, 14336}, {2048, 8192}, {8192, 2048}};

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::F32);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t.data<float>()[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) * 0x1p-23f;
  }
  return t;
}

// One format at one shape, shared by its versions (they run one after another): the matrix on the
// CPU and its device copies, x and x̂ (x's q8_0 blocks), Σ_k |x_k w_k| a row for each, and the bf16
// GEMV's time at the shape.
struct QgemvCase {
  int spec = -1, shape = -1;
  QMatrix q;
  std::vector<QMatrix> copies;
  Tensor x, xhat, xd;
  std::vector<double> mag, mag_hat;
  double bf16 = 0;
};

// Seconds per call of f(i) over `copies` rotated inputs: the best of five batches of 50 after one
// warm call.
template <class F>
double seconds_per_call(int copies, F&& f) {
  f(0);
  cuda::synchronize();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    metrics::Timer t;
    for (int i = 0; i < 50; ++i) f(i % copies);
    cuda::synchronize();
    best = std::min(best, t.seconds() / 50);
  }
  return best;
}

const QgemvCase& qgemv_case(int spec_index, int shape_index) {
  static QgemvCase c;
  if (c.spec == spec_index && c.shape == shape_index) return c;
  c = QgemvCase{};
  const auto [rows, cols] = kGemvShapes.at(static_cast<std::size_t>(shape_index));
  static std::pair<int, Tensor> w{-1, Tensor{}};  // the f32 matrix of the shape, for every format
  if (w.first != shape_index) w = {shape_index, random_matrix(rows, cols, 1)};
  const QuantSpec spec = kGemvSpecs.at(static_cast<std::size_t>(spec_index));
  c.q = from_gguf(spec.format) ? gguf_blocks(spec.format, rows, cols) : quantize(w.second, spec);
  const int copies = std::max<int>(2, static_cast<int>(std::ceil(256e6 / static_cast<double>(c.q.bytes()))));
  // The same values (one check serves all), repacked once and copied on the device.
  c.copies.push_back(c.q.to(Device::CUDA));
  for (int i = 1; i < copies; ++i) {
    QMatrix d = c.copies[0];
    for (Tensor* t : {&d.data, &d.scales, &d.zeros, &d.gpu_quants, &d.gpu_scales})
      if (t->defined()) *t = t->clone();
    c.copies.push_back(std::move(d));
  }
  c.x = random_matrix(1, cols, 2), c.xhat = q8_0_activations(c.x), c.xd = c.x.to(Device::CUDA);
  const Tensor D = dequantize(c.q);
  c.mag.assign(static_cast<std::size_t>(rows), 0.0), c.mag_hat.assign(static_cast<std::size_t>(rows), 0.0);
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t k = 0; k < cols; ++k) {
      double w = std::fabs(D.data<float>()[n * cols + k]);
      if (spec.format == Format::Q4_K) {  // its minimum's term, summed apart: 2 |dmin · m| (as the tests bound it)
        const std::uint8_t* sb = c.q.data.data<std::uint8_t>() + (n * (cols / 256) + k / 256) * 144;
        std::uint8_t sc, m;
        gguf::scale_min_k4(static_cast<int>(k % 256 / 32), sb + 4, sc, m);
        w += 2 * std::fabs(static_cast<double>(from_half(sb + 2)) * m);
      }
      c.mag[n] += w * std::fabs(c.x.data<float>()[k]), c.mag_hat[n] += w * std::fabs(c.xhat.data<float>()[k]);
    }
  // The bf16 GEMV at this shape (ops::matmul, M = 1: its default version).
  const int bf_copies = std::max<int>(2, static_cast<int>(std::ceil(256e6 / (rows * cols * 2.0))));
  std::vector<Tensor> bfs;
  for (int i = 0; i < bf_copies; ++i) {
    bfs.push_back(Tensor::empty({rows, cols}, DType::BF16, Device::CUDA));
    cuda::fill_uniform(bfs.back(), 10 + static_cast<std::uint64_t>(i), -1, 1);
  }
  Tensor out = Tensor::empty({1, rows}, DType::F32, Device::CUDA);
  c.bf16 = seconds_per_call(bf_copies, [&](int i) { ops::matmul(c.xd, bfs[static_cast<std::size_t>(i)], out); });
  c.spec = spec_index, c.shape = shape_index;
  return c;
}

void BM_CudaQgemv(benchmark::State& state) {
  if (skip_without(Device::CUDA, state)) return;
  const int version = static_cast<int>(state.range(0));
  const int spec_index = static_cast<int>(state.range(1)), shape_index = static_cast<int>(state.range(2));
  const QuantSpec spec = kGemvSpecs.at(static_cast<std::size_t>(spec_index));
  const auto [rows, cols] = kGemvShapes.at(static_cast<std::size_t>(shape_index));
  const QgemvCase& c = qgemv_case(spec_index, shape_index);
  std::vector<QMatrix> copies = c.copies;  // the same matrices, running `version`
  for (QMatrix& q : copies) q.gemv_version = version;
  Tensor out = Tensor::empty({1, rows}, DType::F32, Device::CUDA);
  // The check.
  qmatmul(c.xd, copies[0], out);
  const auto got = out.to_double_vector();
  const bool blocks = blocks_activations(spec.format) || version == 2;
  const auto want = qmatmul(blocks ? c.xhat : c.x, c.q).to_double_vector();
  const std::vector<double>& mag = blocks ? c.mag_hat : c.mag;
  const double u = 0x1p-24, g = static_cast<double>(cols) * u / (1 - static_cast<double>(cols) * u);
  const double roundings = spec.format == Format::Q4_K ? 4 : 2;  // the sub-block scales' extra ones
  for (std::int64_t n = 0; n < rows; ++n)
    if (!(std::fabs(got[n] - want[n]) <= 2 * (g + roundings * u) * mag[n])) {
      state.SkipWithError(
          ("row " + std::to_string(n) + ": " + std::to_string(got[n]) + " against the CPU's " + std::to_string(want[n]))
              .c_str());
      return;
    }
  const int n_copies = static_cast<int>(copies.size());
  double total = 0;
  for (auto _ : state) {
    const double dt = seconds_per_call(n_copies, [&](int i) { qmatmul(c.xd, copies[static_cast<std::size_t>(i)], out); });
    state.SetIterationTime(dt);
    total += dt;
  }
  const double per = total / static_cast<double>(state.iterations()), bytes = static_cast<double>(c.q.bytes());
  state.counters["GB/s"] = bytes / per / 1e9;
  state.counters["of_ceiling"] = bytes / per / ceiling(Device::CUDA, bytes);
  state.counters["bits/w"] = 8 * bytes / static_cast<double>(rows * cols);
  state.counters["vs_bf16"] = c.bf16 / per;
  state.counters["bf16_us"] = c.bf16 * 1e6;
  state.SetLabel(spec.name() + " " + std::to_string(rows) + "x" + std::to_string(cols) + " v" + std::to_string(version));
}
// Arguments: the version, the format (kGemvSpecs), the shape (kGemvShapes); the first varies
// fastest, so that one format and shape's setup serves both versions.
BENCHMARK(BM_CudaQgemv)
    ->ArgsProduct({{1, 2},
                   benchmark::CreateDenseRange(0, static_cast<int>(kGemvSpecs.size()) - 1, 1),
                   benchmark::CreateDenseRange(0, static_cast<int>(kGemvShapes.size()) - 1, 1)})
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMicrosecond);

// A pass over R rows of x (a speculative draft's catch-up after a fully accepted round, R = 2; a
// verification, R = γ + 1) against a pass over one, taking turns in every iteration so that the
// host's drifting bandwidth cancels: "vs_one_row" is its cost in one-row passes, about 1 while
// the weight stream, not the arithmetic, sets the time. The formats are chapter 10's drafts.
// int4's direct kernel takes up to kInt4DirectRows = 32 rows; R = 33 is the unpacked path.
const std::vector<QuantSpec> kDraftSpecs = {{Format::Int8Row}, {Format::Q8_0}, {Format::Int4Sym, 32}};
void BM_CpuFewRows(benchmark::State& state) {
  const QuantSpec spec = kDraftSpecs.at(static_cast<std::size_t>(state.range(0)));
  const std::int64_t R = state.range(1);
  const QMatrix q = quantize(weights(), spec);
  Tensor x1 = Tensor::empty({1, K}, DType::F32), xr = Tensor::empty({R, K}, DType::F32);
  std::copy_n(weights().data<float>(), K, x1.data<float>());  // activations of a realistic spread
  std::copy_n(weights().data<float>() + K, R * K, xr.data<float>());
  Tensor o1 = Tensor::empty({1, N}, DType::F32), orr = Tensor::empty({R, N}, DType::F32);
  qmatmul(x1, q, o1), qmatmul(xr, q, orr);
  double one = 0, many = 0;
  for (auto _ : state) {
    metrics::Timer t1;
    qmatmul(x1, q, o1);
    one += t1.seconds();
    metrics::Timer tr;
    qmatmul(xr, q, orr);
    const double dt = tr.seconds();
    many += dt;
    state.SetIterationTime(dt);
  }
  const double per = many / static_cast<double>(state.iterations());
  state.counters["GB/s"] = static_cast<double>(q.bytes()) / per / 1e9;
  state.counters["of_ceiling"] = static_cast<double>(q.bytes()) / per / ceiling(Device::CPU, static_cast<double>(q.bytes()));
  state.counters["vs_one_row"] = many / one;
  state.SetLabel(spec.name() + ", " + std::to_string(R) + " rows");
}
BENCHMARK(BM_CpuFewRows)->ArgsProduct({{0, 1, 2}, {2, 5, 8, 9}})->UseManualTime()->Unit(benchmark::kMicrosecond);
// int4 at more rows: its direct kernel to 32, then one row of the unpacked path.
BENCHMARK(BM_CpuFewRows)->ArgsProduct({{2}, {12, 16, 24, 32, 33}})->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
