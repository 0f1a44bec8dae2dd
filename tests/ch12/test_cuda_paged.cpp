// Chapter 12 on the GPU: the paged attention kernel against the float64 formula (block sizes
// 1, 16 and 32, shuffled tables, split-KV), and chapter 11's engine on a paged GPU cache giving
// the CPU's tokens (skipped, with the driver's reason, without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "attention_exact.h"
#include "chapters/11_continuous_batching/trace.h"
#include "chapters/12_paged_attention/paged_attention.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "common/eval.h"
#include "test_util.h"

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
  const ch01::Llama cpu = ch01::load_llama(data + "/models/tiny-mha"), gpu = cpu.to(Device::CUDA, DType::F32);
  ch11::TraceSpec t;
  t.requests = 10;
  t.context = 256;
  const auto trace = ch11::make_trace(t, eval::validation_tokens(data, 4000));
  std::vector<std::vector<std::int32_t>> out[2];
  for (const bool on_gpu : {false, true}) {
    const ch01::Llama& m = on_gpu ? gpu : cpu;
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

}  // namespace
}  // namespace inferlab
