// Chapter 04's absorbed-MLA decode kernel against the CPU's ops::attention (latent rows as one KV
// head, values their first r columns), at tiny-mla's and DeepSeek-V2's dims, over contexts
// spanning several chunks (skipped, with the driver's reason, without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/models/cuda_mla.h"
#include "common/models/mla.h"
#include "test_util.h"

namespace inferlab {
namespace {

// The bound of test_cuda_gqa.cpp, for scores that are R-term dot products of terms at most qk in
// magnitude and values at most vmax: each side within (2η + 2γ_len + 3u)·vmax of the exact value,
// η including the chunk rescalings (2 per chunk of 256) on the GPU.
double attention_bound(std::int64_t R, std::int64_t len, double scale, double qk, double vmax) {
  const double u = 0x1p-24;
  const double eta = test::gamma(R) * qk * R * scale + u * 2 * qk * R * scale + 2 * u;
  const double chunks = std::ceil(len / 256.0);
  return (2 * (2 * eta + 2 * test::gamma(len) + 3 * u) + 2 * (2 * chunks + 4) * u) * vmax;
}

// The CPU's answer: one KV head whose key is the whole row and whose value its first r columns.
std::vector<double> cpu_reference(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r) {
  const Tensor k = latent.slice(0, 0, len).contiguous();
  AttentionParams p;
  p.q_offset = len - 1;
  p.scale = scale;
  return ops::attention(q, k, k.slice(2, 0, r).contiguous(), p).to_double_vector();
}

std::vector<double> gpu_result(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r) {
  Tensor out = Tensor::empty({1, q.size(1), r}, DType::F32, Device::CUDA);
  models::mla::mla_decode_attention(q.to(Device::CUDA), latent.to(Device::CUDA), len, scale, r, out);
  return out.to_double_vector();
}

// Rows len .. S-1 of the cache hold NaN: a kernel that reads past the context poisons its output.
void poison_tail(Tensor& latent, std::int64_t len) {
  const std::int64_t R = latent.size(2);
  for (std::int64_t i = len * R; i < latent.numel(); ++i) latent.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
}

struct Dims {
  std::int64_t N, r, dr, dn, len;
};

TEST(CudaMla, AbsorbedKernelMatchesTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  for (const Dims& c : {Dims{128, 512, 64, 128, 1000},                       // DeepSeek-V2: 4 chunks, the last one partial
                        Dims{128, 512, 64, 128, 37},                         // few rows: a wrong score shows in the output
                        Dims{16, 512, 64, 128, 2049},                        // 9 chunks, the last of 1 row
                        Dims{8, 32, 8, 16, 5},                               // tiny-mla
                        Dims{8, 32, 8, 16, 300}, Dims{20, 64, 16, 32, 257},  // a head group of 16 and one of 4
                        Dims{1, 4, 4, 4, 256}}) {                            // exactly one chunk
    SCOPED_TRACE("N " + std::to_string(c.N) + ", r " + std::to_string(c.r) + ", dr " + std::to_string(c.dr) + ", len " +
                 std::to_string(c.len));
    const std::int64_t R = c.r + c.dr, S = c.len + 7;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dn + c.dr)));
    const Tensor q = test::uniform(rng, {1, c.N, R}, -2, 2);
    Tensor latent = test::uniform(rng, {S, 1, R}, -1, 1);
    poison_tail(latent, c.len);
    const auto want = cpu_reference(q, latent, c.len, scale, c.r);
    const std::vector<double> bound(want.size(), attention_bound(R, c.len, scale, 2.0, 1.0));
    test::expect_within(gpu_result(q, latent, c.len, scale, c.r), want, bound, "absorbed MLA kernel");
  }
}

// With q = 0 every score is exactly 0 and every weight exactly 1: the output is the mean of the
// value rows, close enough that leaving out or repeating a single row (one chunk's edge, say)
// moves it by more than the bound.
TEST(CudaMla, EveryPositionCountsOnce) {
  IL_REQUIRE_CUDA();
  for (const Dims& c : {Dims{128, 512, 64, 128, 513}, Dims{8, 32, 8, 16, 256}, Dims{20, 64, 16, 32, 1025}}) {
    SCOPED_TRACE("N " + std::to_string(c.N) + ", len " + std::to_string(c.len));
    const std::int64_t R = c.r + c.dr, S = c.len + 3;
    Tensor latent = Tensor::empty({S, 1, R}, DType::F32);
    for (std::int64_t j = 0; j < c.len; ++j)
      for (std::int64_t d = 0; d < R; ++d) latent.data<float>()[j * R + d] = static_cast<float>((j * 7 + d) % 13) / 13.0f;
    poison_tail(latent, c.len);
    const Tensor q = Tensor::zeros({1, c.N, R}, DType::F32);
    const auto want = cpu_reference(q, latent, c.len, 0.1f, c.r);
    // A row j left out or counted twice moves the mean by (v_j − mean)/(len ∓ 1). Every row has
    // a dimension d < r where v_jd = 0 while the mean is about 6/13, so some output moves by more
    // than 0.4/len: above the bound at these lengths.
    const double b = attention_bound(R, c.len, 0.1, 0.0, 1.0);
    ASSERT_LT(b, 0.4 / static_cast<double>(c.len));
    test::expect_within(gpu_result(q, latent, c.len, 0.1f, c.r), want, std::vector<double>(want.size(), b),
                        "uniform weights");
  }
}

// LatentCache::attend on the GPU with one decode row runs the kernel and gives the CPU cache's
// answer; the rows it stores are the same.
TEST(CudaMla, LatentCacheDecodeStepUsesTheKernel) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  TransformerConfig c;
  c.num_layers = 2, c.num_heads = 8, c.num_kv_heads = 8, c.head_dim = 8;
  models::mla::MlaConfig mla;
  mla.kv_lora_rank = 32, mla.qk_nope_head_dim = 16, mla.qk_rope_head_dim = 8, mla.v_head_dim = 16;  // tiny-mla
  const std::int64_t R = mla.latent_dim(), r = mla.kv_lora_rank, P = 300;
  models::mla::LatentCache cpu(c, mla, P + 1), gpu(c, mla, P + 1, Device::CUDA);
  const Tensor prompt = test::uniform(rng, {P, R}, -1, 1);
  cpu.append(1, prompt), gpu.append(1, prompt);
  cpu.commit(P), gpu.commit(P);
  const Tensor q = test::uniform(rng, {1, c.num_heads, R}, -2, 2), k = test::uniform(rng, {1, 1, R}, -1, 1);
  Tensor want = Tensor::empty({1, c.num_heads, r}, DType::F32);
  cpu.attend(1, q, k, k.slice(2, 0, r), want);
  const Tensor gk = k.to(Device::CUDA);
  Tensor got = Tensor::empty({1, c.num_heads, r}, DType::F32, Device::CUDA);
  gpu.attend(1, q.to(Device::CUDA), gk, gk.slice(2, 0, r), got);
  const std::vector<double> bound(static_cast<std::size_t>(want.numel()),
                                  attention_bound(R, P + 1, mla.softmax_scale(), 2.0, 1.0));
  test::expect_within(got.to_double_vector(), want.to_double_vector(), bound, "LatentCache::attend on CUDA");
  EXPECT_EQ(gpu.rows(1).to_double_vector(), cpu.rows(1).to_double_vector());
}

// The plain path's rebuild on the GPU against ops::matmul on the CPU: k = [W_UK c ‖ k_pe] and
// v = W_UV c per head. Each GEMM value is an r-term dot product: within γ_r·r·max|c|·max|w| of
// the exact one on either side; k_pe is copied exactly.
TEST(CudaMla, PlainPathRebuildMatchesTheCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  struct Case {
    std::int64_t N, r, dr, dn, dv, len;
  };
  for (const Case& c : {Case{8, 32, 8, 16, 16, 300}, Case{16, 512, 64, 128, 128, 100}, Case{3, 20, 4, 12, 10, 7}}) {
    const std::int64_t R = c.r + c.dr, S = c.len + 5;
    const Tensor latent = test::uniform(rng, {S, 1, R}, -1, 1), w = test::uniform(rng, {c.N * (c.dn + c.dv), c.r}, -1, 1);
    const Tensor up = ops::matmul(latent.slice(0, 0, c.len).contiguous().view({c.len, R}).slice(1, 0, c.r).contiguous(), w);
    std::vector<double> k_want, v_want;
    for (std::int64_t s = 0; s < c.len; ++s)
      for (std::int64_t h = 0; h < c.N; ++h) {
        const float* row = up.data<float>() + (s * c.N + h) * (c.dn + c.dv);
        k_want.insert(k_want.end(), row, row + c.dn);
        k_want.insert(k_want.end(), latent.data<float>() + s * R + c.r, latent.data<float>() + (s + 1) * R);
        v_want.insert(v_want.end(), row + c.dn, row + c.dn + c.dv);
      }
    Tensor k = Tensor::empty({c.len, c.N, c.dn + c.dr}, DType::F32, Device::CUDA),
           v = Tensor::empty({c.len, c.N, c.dv}, DType::F32, Device::CUDA);
    models::mla::mla_rebuild_kv(latent.to(Device::CUDA), c.len, w.to(Device::CUDA), c.dn, k, v);
    const double b = 2 * test::gamma(c.r) * c.r;
    test::expect_within(k.to_double_vector(), k_want, std::vector<double>(k_want.size(), b), "rebuilt keys");
    test::expect_within(v.to_double_vector(), v_want, std::vector<double>(v_want.size(), b), "rebuilt values");
  }
}

TEST(CudaMla, BadArgumentsAreRefusedByName) {
  IL_REQUIRE_CUDA();
  const std::int64_t N = 4, r = 32, R = 40, S = 10;
  auto gpu = [](const Shape& s, DType t = DType::F32) { return Tensor::zeros(s, t, Device::CUDA); };
  const Tensor q = gpu({1, N, R}), latent = gpu({S, 1, R}), out = gpu({1, N, r});
  auto refused = [](const Tensor& q_, const Tensor& latent_, std::int64_t len, std::int64_t r_, Tensor out_,
                    std::initializer_list<std::string> parts) {
    test::expect_error([&] { models::mla::mla_decode_attention(q_, latent_, len, 0.2f, r_, out_); }, parts);
  };
  refused(q, latent, 0, r, out, {"mla_decode_attention", "length 0", "10 positions"});
  refused(q, latent, S + 1, r, out, {"length 11", "10 positions"});
  refused(gpu({2, N, R}), latent, S, r, out, {"q [1, N, r + dr]", "[2, 4, 40]"});
  refused(q, gpu({S, 2, R}), S, r, out, {"latent [S, 1, r + dr]", "[10, 2, 40]"});
  refused(q, gpu({S, 1, R + 4}), S, r, out, {"latent [S, 1, r + dr]", "[10, 1, 44]"});
  refused(q, latent, S, r, gpu({1, N, r + 1}), {"out must be [1, 4, 32]", "[1, 4, 33]"});
  refused(q, latent, S, R + 1, out, {"value width r = 41", "r + dr = 40"});
  refused(gpu({1, N, 42}), gpu({S, 1, 42}), S, 34, gpu({1, N, 34}), {"r + dr = 42", "multiple of 4"});
  refused(q.to(Device::CPU), latent, S, r, out, {"must be on CUDA"});
  refused(gpu({1, N, R}, DType::BF16), latent, S, r, out, {"contiguous f32"});
}

}  // namespace
}  // namespace inferlab
