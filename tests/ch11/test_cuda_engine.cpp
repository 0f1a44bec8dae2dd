// Chapter 11 on the GPU: the engine's batched steps on CUDA (cuBLAS GEMMs over every sequence's
// rows, chapter 02's attention kernel per sequence) give the CPU engine's tokens under greedy and
// seeded sampling (skipped, with the driver's reason, without a GPU).
#include <gtest/gtest.h>

#include "chapters/11_continuous_batching/trace.h"
#include "common/eval.h"
#include "golden_util.h"

namespace inferlab {
namespace {

TEST(CudaEngine, ContinuousBatchingOnTheGpuEqualsTheCpu) {
  IL_REQUIRE_CUDA();
  const std::string data = INFERLAB_DATA_DIR;
  const models::Llama cpu = models::load_llama(data + "/models/tiny-mha"), gpu = cpu.to(Device::CUDA, DType::F32);
  ch11::TraceSpec t;
  t.requests = 12;
  t.context = 256;
  const auto trace = ch11::make_trace(t, eval::validation_tokens(data, 4000));
  std::vector<std::vector<std::int32_t>> out[2];
  for (const bool on_gpu : {false, true}) {
    const models::Llama& m = on_gpu ? gpu : cpu;
    ch11::ContiguousPool pool(m.config, m.config.kv_cache_bytes(1024, 4), ch11::Allocation::OnDemand, m.device());
    ch11::EngineConfig c;
    c.scheduler = {ch11::Policy::Continuous, 6, 24};
    c.clock = ch11::Clock::Steps;
    ch11::Engine e(m, pool, c);
    for (ch11::Request r : trace) {
      if (r.id % 2) r.sampling.temperature = 0.8f, r.sampling.seed = static_cast<std::uint64_t>(r.id);
      e.add(r);
    }
    e.run();
    std::vector<std::vector<std::int32_t>> tokens(trace.size());
    for (const auto& s : e.finished()) tokens[static_cast<std::size_t>(s->request.id)] = s->tokens;
    out[on_gpu] = tokens;
  }
  EXPECT_EQ(out[1], out[0]);
}

}  // namespace
}  // namespace inferlab
