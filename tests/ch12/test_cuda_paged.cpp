// Chapter 12 on the GPU: the paged attention kernel against the float64 formula (block sizes
// 1, 16 and 32, shuffled tables, split-KV), chapter 11's engine on a paged GPU cache giving the
// CPU's tokens, the batched step (one attention launch a layer) against the CPU's cache-by-cache
// step, and its launches per step, the same at any batch (skipped, with the driver's reason,
// without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "attention_exact.h"
#include "bundled_model.h"
#include "chapters/11_continuous_batching/trace.h"
#include "chapters/12_paged_attention/paged_attention.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "common/cuda/backend.h"
#include "common/eval.h"
#include "engine_runs.h"
#include "golden_util.h"

namespace inferlab {
namespace {

TEST(CudaPaged, AttentionMatchesTheFormula) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  const std::int64_t N = 8, K = 2, H = 64;
  for (const std::int64_t B : {1, 16, 32})
    for (const std::int64_t S : {1, 45, 3000}) {
      const std::int64_t need = (S + B - 1) / B, blocks = need + 5;
      std::vector<std::int32_t> all(static_cast<std::size_t>(blocks));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const std::vector<std::int32_t> table(all.begin(), all.begin() + need);
      const Tensor kp = test::uniform(rng, {blocks, B, K, H}), vp = test::uniform(rng, {blocks, B, K, H});
      const Tensor q = test::uniform(rng, {2, N, H});
      Tensor kc = Tensor::empty({S, K, H}, DType::F32), vc = Tensor::empty({S, K, H}, DType::F32);
      for (std::int64_t p = 0; p < S; ++p) {  // the same rows, contiguous
        const std::int64_t s = ch12::slot(table, B, p);
        kc.slice(0, p, p + 1).copy_from(kp.view({blocks * B, K, H}).slice(0, s, s + 1));
        vc.slice(0, p, p + 1).copy_from(vp.view({blocks * B, K, H}).slice(0, s, s + 1));
      }
      const std::int64_t T = std::min<std::int64_t>(2, S);
      const Tensor qt = q.slice(0, 0, T);
      AttentionParams ap;
      ap.q_offset = S - T;
      const test::AttnRef want = test::attention_exact(qt, kc, vc, ap, 3 * 0x1p-24);
      const Tensor gk = kp.to(Device::CUDA), gv = vp.to(Device::CUDA), gq = qt.to(Device::CUDA);
      for (const std::int64_t splits : {1, 4}) {
        Tensor out = Tensor::empty(qt.shape(), DType::F32, Device::CUDA);
        ch12::paged_attention(gq, {gk, gv, table, B}, S - T, out, splits);
        test::expect_within(out.to(Device::CPU).to_double_vector(), want.out, want.bound,
                            "B = " + std::to_string(B) + ", S = " + std::to_string(S));
      }
    }
}

TEST(CudaPaged, TheEngineOnAPagedGpuCacheEqualsTheCpu) {
  IL_REQUIRE_CUDA();
  const std::string data = INFERLAB_DATA_DIR;
  const models::Llama cpu = models::load_llama(data + "/models/tiny-mha"), gpu = cpu.to(Device::CUDA, DType::F32);
  ch11::TraceSpec t;
  t.requests = 10;
  t.context = 256;
  const auto trace = ch11::make_trace(t, eval::validation_tokens(data, 4000));
  std::vector<std::vector<std::int32_t>> out[2];
  for (const bool on_gpu : {false, true}) {
    const models::Llama& m = on_gpu ? gpu : cpu;
    ch12::PagedPool pool(m.config, m.config.kv_cache_bytes(1024, 4), 16, m.device());
    ch11::EngineConfig c;
    c.scheduler = {ch11::Policy::Continuous, 6, 24};
    c.clock = ch11::Clock::Steps;
    ch11::Engine e(m, pool, c);
    for (const auto& r : trace) e.add(r);
    e.run();
    out[on_gpu].resize(trace.size());
    for (const auto& s : e.finished()) out[on_gpu][static_cast<std::size_t>(s->request.id)] = s->tokens;
  }
  EXPECT_EQ(out[1], out[0]);
}

// Chapter 11's engine on the GPU with each layer's attention one launch over the whole batch
// (AttendPath::Batched: contiguous caches and the paged pool) and cache by cache (the simple
// path), against the CPU's simple path: MHA, GQA and MQA, requests arriving while others decode,
// so that prefill chunks share steps with decode rows. The same tokens, and every sampled token's
// logits within the two-path bound.
TEST(CudaPaged, TheBatchedStepOnTheGpuEqualsTheCpuCacheByCache) {
  IL_REQUIRE_CUDA();
  using models::AttendPath;
  const auto requests = test::mixed_requests(INFERLAB_DATA_DIR);
  for (const char* name : {"tiny-mha", "tiny-gqa", "tiny-mqa"}) {
    const models::Llama& cpu = test::bundled_llama(name);
    const models::Llama gpu = cpu.to(Device::CUDA, DType::F32);
    const std::int64_t budget = cpu.config.kv_cache_bytes(4096, 4);
    ch11::ContiguousPool on_cpu(cpu.config, budget, ch11::Allocation::MaxLength);
    const auto want = test::serve(cpu, on_cpu, requests, AttendPath::PerSequence);
    ch11::ContiguousPool rows(gpu.config, budget, ch11::Allocation::MaxLength, Device::CUDA),
        rows_alone(gpu.config, budget, ch11::Allocation::MaxLength, Device::CUDA);
    ch12::PagedPool paged(gpu.config, budget, 16, Device::CUDA);
    const std::vector<std::pair<std::string, std::vector<test::Served>>> runs = {
        {"contiguous, batched", test::serve(gpu, rows, requests, AttendPath::Batched)},
        {"paged, batched", test::serve(gpu, paged, requests, AttendPath::Batched)},
        {"contiguous, cache by cache", test::serve(gpu, rows_alone, requests, AttendPath::PerSequence)}};
    for (const auto& [how, got] : runs)
      for (std::size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i].tokens, want[i].tokens) << name << ", " << how << ", request " << i;
        for (std::size_t t = 0; t < want[i].logits.size(); ++t) {
          const std::vector<double> w(want[i].logits[t].begin(), want[i].logits[t].end());
          const double bound = test::two_path_bound(cpu.config, w);
          for (std::size_t x = 0; x < w.size(); ++x)
            ASSERT_NEAR(got[i].logits[t][x], w[x], bound) << name << ", " << how << ", request " << i << ", token " << t;
        }
      }
  }
}

// The kernel launches of one step do not grow with the batch when each layer attends in one call
// (a store, an attention launch and its merge a layer, whatever the batch); cache by cache they
// do. A step of B sequences, each with 20 cached positions: a prefill chunk of 7 for the first, a
// decode row for each other; contiguous caches and the paged pool.
TEST(CudaPaged, LaunchesPerStepDoNotGrowWithTheBatch) {
  IL_REQUIRE_CUDA();
  using models::AttendPath;
  const models::Llama m = test::bundled_llama("tiny-gqa").to(Device::CUDA, DType::F32);
  const auto text = eval::validation_tokens(INFERLAB_DATA_DIR, 2000);
  auto launches = [&](std::int64_t B, bool paged, AttendPath path) {
    ch12::BlockPool pool(m.config, 8 * B, 16, Device::CUDA);
    std::vector<std::unique_ptr<models::KVCache>> caches;
    for (std::int64_t b = 0; b < B; ++b)
      caches.push_back(paged ? std::unique_ptr<models::KVCache>(std::make_unique<ch12::PagedKVCache>(pool))
                             : std::make_unique<models::ContiguousKVCache>(m.config, 64, Device::CUDA));
    auto step = [&](std::int64_t first, std::int64_t others) {
      std::vector<models::SequenceStep> seqs;
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = b == 0 ? first : others, at = 50 * b + caches[static_cast<std::size_t>(b)]->length();
        if (paged) {
          EXPECT_TRUE(static_cast<ch12::PagedKVCache&>(*caches[static_cast<std::size_t>(b)]).reserve(n));
        }
        seqs.push_back({std::vector<std::int32_t>(text.begin() + at, text.begin() + at + n),
                        caches[static_cast<std::size_t>(b)].get(), false});
      }
      return seqs;
    };
    auto prompts = step(20, 20);
    models::forward(m, prompts, models::attention_block, path);
    auto seqs = step(7, 1);
    const cuda::Launches before = cuda::launches();
    models::forward(m, seqs, models::attention_block, path);
    return cuda::launches().kernels - before.kernels;
  };
  for (const bool paged : {false, true}) {
    const char* kind = paged ? "paged" : "contiguous";
    const std::int64_t two = launches(2, paged, AttendPath::Batched), eight = launches(8, paged, AttendPath::Batched);
    EXPECT_EQ(two, eight) << kind << ": the batched step's launches grew with the batch";
    EXPECT_EQ(launches(1, paged, AttendPath::Batched), two) << kind;
    const std::int64_t alone_two = launches(2, paged, AttendPath::PerSequence),
                       alone_eight = launches(8, paged, AttendPath::PerSequence);
    EXPECT_GT(alone_eight, alone_two) << kind << ": cache by cache, a step launches more for more sequences";
    EXPECT_LT(eight, alone_eight) << kind;
    // Cache by cache, six more sequences add at least a launch each in every layer.
    EXPECT_GE(alone_eight - alone_two, 6 * m.config.num_layers) << kind;
  }
}

}  // namespace
}  // namespace inferlab
