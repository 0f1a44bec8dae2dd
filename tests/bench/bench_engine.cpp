// Chapter 11's engine step against its roofline: B sequences decoding together on chapter 01's
// memory-bound 100M-parameter shape (f32), on contiguous caches and on chapter 12's paged pool,
// with the step's attention sequence by sequence (each cache's attend()) or batched (one
// ops::attention_cached call a layer over every cache). The roofline time of a step is the larger
// of its bytes (the weights once, every sequence's cache) over the read ceiling measured for that
// many bytes, and its FLOPs over the measured GEMM peak; of_roofline is that time over the step's.
// The projections' product of B rows runs each version of the batched GEMV (cpu::BatchGemv:
// rows, the simple one, tiles, or broadcast, which the default, Auto, picks at 16 and 32 rows of
// f32 weights), so one run compares them.
//
//   bench_engine [--benchmark_filter=...] [--benchmark_out=FILE --benchmark_out_format=json]
#include <benchmark/benchmark.h>

#include <memory>

#include "bench_main.h"
#include "chapters/11_continuous_batching/engine.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "common/ceiling.h"
#include "common/metrics.h"
#include "common/ops_cpu.h"

using namespace inferlab;

namespace {

const TransformerConfig& shape() {
  static const TransformerConfig c = models::memory_bound_shape(8, 16, 1024, 4096);
  return c;
}

const models::Llama& model() {
  static const models::Llama m = models::random_llama(shape(), 1);
  return m;
}

double peak_flops() {
  static const double peak = metrics::measure_cpu_ceiling(0, 1024, 3).flops_per_s;
  return peak;
}

// Arguments: B, paged (0/1), batched attention (0/1), the batched GEMV (0 rows, 1 tiles, 2 broadcast).
void BM_EngineDecodeStep(benchmark::State& state) {
  const std::int64_t B = state.range(0), context = 128;
  const bool paged = state.range(1) != 0, batched = state.range(2) != 0;
  const cpu::BatchGemv kernel = static_cast<cpu::BatchGemv>(state.range(3));
  cpu::set_batch_gemv(kernel);
  const models::Llama& m = model();
  const std::int64_t budget = m.config.kv_cache_bytes(B * (context + 64), 4);
  std::unique_ptr<ch11::KVPool> pool;
  if (paged) pool = std::make_unique<ch12::PagedPool>(m.config, budget, 16);
  else pool = std::make_unique<ch11::ContiguousPool>(m.config, budget, ch11::Allocation::MaxLength);
  ch11::EngineConfig c;
  c.scheduler = {ch11::Policy::Continuous, B, std::max<std::int64_t>(B, 512)};
  c.clock = ch11::Clock::Steps;
  c.attend_path = batched ? models::AttendPath::Batched : models::AttendPath::PerSequence;
  ch11::Engine e(m, *pool, c);
  for (std::int64_t b = 0; b < B; ++b) {
    ch11::Request r;
    r.id = b;
    r.prompt.assign(static_cast<std::size_t>(context), static_cast<std::int32_t>(3 + b));
    r.max_new_tokens = 60;
    e.add(r);
  }
  while (e.steps().empty() || e.steps().back().decode_tokens < B) e.step();  // every prompt in
  double seconds = 0, roof = 0, bytes = 0;
  std::int64_t n = 0;
  for (auto _ : state) {
    e.step();
    const ch11::StepRecord& s = e.steps().back();
    state.SetIterationTime(s.seconds);
    const double read = s.bytes_read / metrics::cpu_read_ceiling(s.bytes_read).bytes_per_s();
    seconds += s.seconds, roof += std::max(read, s.flops / peak_flops()), bytes += s.bytes_read, ++n;
  }
  const metrics::ReadCeiling ceiling = metrics::cpu_read_ceiling(bytes / static_cast<double>(n));
  state.counters["step_ms"] = 1e3 * seconds / static_cast<double>(n);
  state.counters["roofline_ms"] = 1e3 * roof / static_cast<double>(n);
  state.counters["of_roofline"] = roof / seconds;
  state.counters["tokens/s"] = static_cast<double>(B * n) / seconds;
  state.counters["GB/s"] = bytes / seconds / 1e9;
  state.counters["ceiling_GB/s"] = ceiling.bytes_per_s() / 1e9;
  cpu::set_batch_gemv(cpu::kDefaultBatchGemv);
  state.SetLabel(std::string(paged ? "paged" : "contiguous") + ", " + (batched ? "batched" : "per sequence") +
                 " attention, " +
                 (kernel == cpu::BatchGemv::Rows    ? "row"
                  : kernel == cpu::BatchGemv::Tiles ? "tiled"
                                                    : "broadcast") +
                 " GEMV, B=" + std::to_string(B) + ", context ~" + std::to_string(context) + " (" + ceiling.kind + ")");
}
BENCHMARK(BM_EngineDecodeStep)
    ->ArgsProduct({{16, 32}, {0, 1}, {0, 1}, {0, 1, 2}})
    ->UseManualTime()
    ->Iterations(20)
    ->Unit(benchmark::kMillisecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
