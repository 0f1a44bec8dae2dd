// Chapter 03's grouped decode attention and chapter 02's per-head kernel against the CPU, over
// contexts spanning several chunks (skipped, with the driver's reason, without a GPU).
#include <gtest/gtest.h>

#include "chapters/02_kv_cache/cuda_decode.h"
#include "chapters/03_gqa/cuda_gqa.h"
#include "test_util.h"

namespace inferlab {
namespace {

TEST(CudaGqa, GroupedAndPerHeadKernelsMatchTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  struct Case {
    std::int64_t N, K, H, len;
  };
  // Group sizes 1, 2, 3 (the grouped kernel's variant for 4 with one head unused), 4, 8 and 16; head
  // sizes that are and are not multiples of the warp; lengths at and just past a 256-row chunk.
  for (const Case& c : {Case{32, 8, 128, 1000}, Case{8, 1, 64, 300}, Case{4, 4, 32, 5}, Case{16, 2, 256, 600},
                        Case{4, 2, 64, 256}, Case{6, 2, 40, 257}, Case{48, 3, 96, 700}}) {
    SCOPED_TRACE("N " + std::to_string(c.N) + ", K " + std::to_string(c.K) + ", H " + std::to_string(c.H) + ", len " +
                 std::to_string(c.len));
    const std::int64_t S = c.len + 7;
    Tensor q = test::uniform(rng, {1, c.N, c.H}, -2, 2), k = test::uniform(rng, {S, c.K, c.H}, -2, 2),
           v = test::uniform(rng, {S, c.K, c.H});
    AttentionParams p;
    p.q_offset = c.len - 1;
    const auto cpu =
        ops::attention(q, k.slice(0, 0, c.len).contiguous(), v.slice(0, 0, c.len).contiguous(), p).to_double_vector();
    Tensor gq = q.to(Device::CUDA), gk = k.to(Device::CUDA), gv = v.to(Device::CUDA);
    Tensor a = Tensor::empty(q.shape(), DType::F32, Device::CUDA), b = Tensor::empty(q.shape(), DType::F32, Device::CUDA);
    ch03::gqa_decode_attention(gq, gk, gv, c.len, a);
    ch02::decode_attention(gq, gk, gv, c.len, b);
    // The bound of test_ops_cuda.cpp: each side within (2η + 2γ_S + 3u)·max|v| of the exact
    // value, η including the chunk rescalings (2 per chunk) on the GPU.
    const double u = 0x1p-24, scale = 1.0 / std::sqrt(static_cast<double>(c.H));
    const double eta = test::gamma(c.H) * 4.0 * c.H * scale + u * 8.0 * c.H * scale + 2 * u;
    const double chunks = std::ceil(c.len / 256.0);
    const std::vector<double> bound(cpu.size(), 2 * (2 * eta + 2 * test::gamma(c.len) + 3 * u) + 2 * (2 * chunks + 4) * u);
    test::expect_within(a.to_double_vector(), cpu, bound, "grouped kernel");
    test::expect_within(b.to_double_vector(), cpu, bound, "per-head kernel");
  }
}

}  // namespace
}  // namespace inferlab
