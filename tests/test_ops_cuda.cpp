// Every op on CUDA against the CPU path, on fresh random inputs. Skipped, with the driver's
// reason, where no CUDA device is usable. Bounds: both sides obey the float64 bounds of
// test_ops.cpp, so they differ by at most the sum; each bound is restated here.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "attention_exact.h"
#include "common/cuda/backend.h"
#include "common/cuda/gemv_index.h"
#include "common/ops.h"
#include "common/sampling.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::expect_within;
using test::gamma;
constexpr double u = 0x1p-24;

Tensor on_gpu(const Tensor& t) { return t.to(Device::CUDA); }

void matmul_case(std::int64_t M, std::int64_t K, std::int64_t N, DType wt, cuda::GemvKernel gemv) {
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {M, K}), w = test::uniform_as(rng, {N, K}, wt);
  cuda::set_gemv_kernel(gemv);
  Tensor g = ops::matmul(on_gpu(x), on_gpu(w)).to(Device::CPU);
  cuda::set_gemv_kernel(cuda::GemvKernel::Own);
  Tensor c = ops::matmul(x, w);
  const auto X = x.to_double_vector(), W = w.to_double_vector();
  // Our GEMV and cuBLAS' f32 GEMM keep x in f32: |gpu − cpu| ≤ 2γ_K Σ|x w|. cuBLAS with 16-bit
  // weights first rounds x to the weights' type (relative u16 on each x), adding u16 Σ|x w|.
  const bool rounds_x = wt != DType::F32 && !(M == 1 && gemv == cuda::GemvKernel::Own);
  const double extra = rounds_x ? unit_roundoff(wt) : 0.0;
  std::vector<double> bound(M * N);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double a = 0;
      for (std::int64_t k = 0; k < K; ++k) a += std::fabs(X[m * K + k] * W[n * K + k]);
      bound[m * N + n] = (2 * gamma(K) + extra * (1 + gamma(K))) * a;
    }
  expect_within(g.to_double_vector(), c.to_double_vector(), bound,
                "cuda matmul M=" + std::to_string(M) + " " + std::string(dtype_name(wt)));
}

TEST(Cuda, MatmulGemvOwnKernel) {
  IL_REQUIRE_CUDA();
  for (auto v : {cuda::GemvVersion::WarpRow, cuda::GemvVersion::SharedX, cuda::GemvVersion::NormFused}) {
    cuda::set_gemv_version(v);
    for (DType wt : {DType::F32, DType::BF16, DType::F16}) {
      matmul_case(1, 4096, 300, wt, cuda::GemvKernel::Own);  // vectorised path
      matmul_case(1, 1001, 77, wt, cuda::GemvKernel::Own);   // K not a multiple of 8: scalar path
    }
  }
  cuda::set_gemv_version(cuda::kDefaultGemvVersion);
}

// The GEMV family's index arithmetic (common/cuda/gemv_index.h), walked on the CPU as versions 2
// and 3 walk it: every output row computed by exactly one warp of one block, whatever the grid,
// and a grid that fills the GPU; every 16-byte load of a row issued once into the slot its step
// reads, in pipelined order; every stacked row found in its own matrix.
TEST(GemvIndex, EveryRowAndEveryLoadExactlyOnce) {
  namespace gi = cuda::gemv_index;
  for (int sms : {1, 108, 132})
    for (int resident : {1, 3, 8}) {
      for (long long total : {1LL, 7LL, 8LL, 9LL, 2048LL, 3072LL, 4097LL, 14336LL, 128256LL}) {
        const int rows = gi::rows_per_warp(total, sms);
        ASSERT_TRUE(rows == 2 || rows == 4);
        const long long groups = gi::groups(total, rows), grid = gi::grid(groups, sms, resident);
        ASSERT_TRUE(grid >= 1 && grid <= groups && grid <= static_cast<long long>(sms) * resident);
        // The last group is not empty: no rows past the end but the last group's.
        EXPECT_LT(gi::first_row(groups - 1, 0, rows), total);
        std::vector<int> seen(static_cast<std::size_t>(total), 0);
        long long most = 0, least = groups;
        for (long long block = 0; block < grid; ++block) {
          long long mine = 0;
          for (long long g = block; g < groups; g += grid, ++mine)
            for (int warp = 0; warp < gi::kWarps; ++warp)
              for (int j = 0; j < rows; ++j) {
                const long long row = gi::first_row(g, warp, rows) + j;
                const long long read = gi::clamp_row(row, total);
                ASSERT_TRUE(read >= 0 && read < total) << "row " << row << " of " << total;
                if (row < total) ++seen[static_cast<std::size_t>(row)];
              }
          most = std::max(most, mine), least = std::min(least, mine);
        }
        EXPECT_LE(most - least, 1) << "blocks of unequal work: " << total << " rows, grid " << grid;
        // As few rounds as the GPU allows: no block does more groups than the slots force.
        const long long slots = static_cast<long long>(sms) * resident;
        EXPECT_EQ(most, (groups + slots - 1) / slots) << total << " rows, grid " << grid;
        for (long long r = 0; r < total; ++r)
          ASSERT_EQ(seen[static_cast<std::size_t>(r)], 1)
              << "row " << r << " of " << total << ", " << sms << " SMs, " << resident << " blocks each";
      }
      // A 2048-row matrix (Llama-3.2-1B's projections) still gives every SM a block where two fit.
      if (resident >= 2) {
        EXPECT_GE(gi::grid(gi::groups(2048, gi::rows_per_warp(2048, sms)), sms, resident), std::min(sms, 256));
      }
    }
  for (int kN : {1, 2, 3, 4, 8, 16}) {
    const int U = gi::unroll(kN);
    ASSERT_GE(U, 1);
    ASSERT_LE(U * kN, std::max(gi::kLoads, kN));
    for (long long n : {0LL, 1LL, 31LL, 32LL, 33LL, 255LL, 256LL, 257LL, 512LL, 1791LL, 1792LL}) {
      // slot[lane][u]: the load requested into that register slot and not yet used (−1: none).
      std::vector<std::vector<long long>> slot(32, std::vector<long long>(static_cast<std::size_t>(U), -1));
      std::vector<int> used(static_cast<std::size_t>(n), 0);
      for (int lane = 0; lane < 32; ++lane)
        for (int u = 0; u < U; ++u)
          if (const long long i = gi::chunk(0, u, lane, U); i < n) slot[lane][u] = i;
      for (long long step = 0; step < gi::steps(n, U); ++step)
        for (int lane = 0; lane < 32; ++lane)
          for (int u = 0; u < U; ++u) {
            const long long i = gi::chunk(step, u, lane, U);
            if (i < n) {
              ASSERT_EQ(slot[lane][u], i) << "n " << n << " unroll " << U << " step " << step;
              ++used[static_cast<std::size_t>(i)];
              slot[lane][u] = -1;
            }
            if (const long long next = gi::chunk(step + 1, u, lane, U); next < n) {
              ASSERT_EQ(slot[lane][u], -1);
              slot[lane][u] = next;
            }
          }
      for (long long i = 0; i < n; ++i) ASSERT_EQ(used[static_cast<std::size_t>(i)], 1) << "load " << i << " of " << n;
      for (const auto& l : slot)
        for (long long v : l) EXPECT_EQ(v, -1) << "a load requested and never used";
    }
  }
  struct Stack {
    int rows[3], count;
  };
  for (const Stack& st :
       {Stack{{7, 0, 0}, 1}, Stack{{3, 4, 0}, 2}, Stack{{2048, 512, 512}, 3}, Stack{{5, 0, 3}, 3}, Stack{{1, 1, 1}, 3}}) {
    long long total = 0, offset[3] = {0, 0, 0};
    for (int i = 0; i < st.count; ++i) offset[i] = total, total += st.rows[i];
    for (long long row = 0; row < total; ++row) {
      long long local = -1;
      const int seg = gi::segment_of(row, st.rows[0], st.rows[1], st.count, local);
      ASSERT_TRUE(seg >= 0 && seg < st.count);
      EXPECT_TRUE(local >= 0 && local < st.rows[seg]) << "row " << row;
      EXPECT_EQ(offset[seg] + local, row);
    }
  }
}

// One GEMV case of the family's test: the stacked matrices' rows, whether they have biases,
// whether the product adds into out or is gate/up with SwiGLU, and whether x starts 4 bytes past
// a 16-byte boundary (the scalar path, as K not a multiple of the weights per load also takes).
struct GemvCase {
  std::int64_t K;
  std::vector<std::int64_t> rows;
  bool bias = false, accumulate = false, swiglu = false, misaligned_x = false;
};

std::string describe(const GemvCase& c) {
  std::string s = "K=" + std::to_string(c.K) + " rows";
  for (auto r : c.rows) s += " " + std::to_string(r);
  return s + (c.bias ? " bias" : "") + (c.accumulate ? " accumulate" : "") + (c.swiglu ? " swiglu" : "") +
         (c.misaligned_x ? " misaligned x" : "");
}

// Every version of the GEMV family on the same inputs, each within the float64 reference's bound
// and within twice it of the CPU path (rmsnorm, then ops::matmul per matrix, bias, swiglu, the
// residual): 16-byte and scalar paths, K of 14336 (x above the default 48 KiB of shared memory),
// odd row counts, q/k/v stacked with biases, a residual add, gate/up with SwiGLU, and enough rows
// for 4 a warp. Version 3 normalises x first.
TEST(Cuda, EveryGemvVersionWithinTheFloat64Bound) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  const float eps = 1e-5f;
  const std::vector<GemvCase> cases = {
      {4096, {300}},
      {1001, {77}},  // K not a multiple of 8
      {2048, {2048, 512, 512}, true},
      {520, {33}, true, true},
      {1000, {131}, false, false, true},
      {777, {45}, false, false, true},
      {14336, {37}, false, true},
      {136, {9001}},  // 4 rows a warp
      {256, {5000}, false, false, true},
      {512, {70, 0, 19}},  // an empty middle matrix
      {4096, {65}, true, true, false, true},
      {1024, {66}, false, false, true, true},
  };
  for (DType wt : {DType::F32, DType::BF16, DType::F16})
    for (const GemvCase& c : cases) {
      const std::int64_t K = c.K;
      Tensor xfull = test::uniform(rng, {K + 1}, -2, 2), norm = test::uniform(rng, {K}, 0.5f, 1.5f);
      const Tensor x = xfull.slice(0, c.misaligned_x ? 1 : 0, K + (c.misaligned_x ? 1 : 0));
      std::vector<Tensor> w, b;
      std::int64_t total = 0;
      // SwiGLU: gate and up, both of c.rows[0] rows.
      for (auto r : c.swiglu ? std::vector<std::int64_t>{c.rows[0], c.rows[0]} : c.rows) {
        w.push_back(test::uniform_as(rng, {r, K}, wt));
        b.push_back(c.bias ? test::uniform(rng, {r}) : Tensor());
        total += r;
      }
      const std::int64_t out_rows = c.swiglu ? c.rows[0] : total;
      Tensor y0 = test::uniform(rng, {out_rows});
      const auto X = x.to_double_vector(), G = norm.to_double_vector(), Y0 = y0.to_double_vector();
      for (auto version : {cuda::GemvVersion::WarpRow, cuda::GemvVersion::SharedX, cuda::GemvVersion::NormFused}) {
        const bool fused = version == cuda::GemvVersion::NormFused;
        const std::string what = std::string("GEMV version ") + cuda::gemv_version_name(version) + ", " +
                                 std::string(dtype_name(wt)) + ", " + describe(c);
        // x' = x, or x normalised (version 3): each value within δ relative of exact, the
        // bound of Cuda.RmsNormRopeEmbedding's GPU side.
        std::vector<double> h = X;
        double delta = 0;
        if (fused) {
          double ss = 0;
          for (double v : X) ss += v * v;
          const double inv = 1.0 / std::sqrt(ss / static_cast<double>(K) + static_cast<double>(eps));
          for (std::int64_t k = 0; k < K; ++k) h[k] = X[k] * inv * G[k];
          delta = 0.5 * gamma(K + 2) + 8 * u;
        }
        // Each row's dot product: its value and Σ|w·x'|. Summing K products and up to two more
        // terms (the bias, the old out) in any order errs by γ_{K+2} of their absolute sum; x'
        // off by δ relative moves the dot by δ·Σ|w·x'|.
        std::vector<double> dot, mag;
        for (const Tensor& wi : w) {
          const auto Wd = wi.to_double_vector();
          for (std::int64_t r = 0; r < wi.size(0); ++r) {
            double d = 0, a = 0;
            for (std::int64_t k = 0; k < K; ++k) d += Wd[r * K + k] * h[k], a += std::fabs(Wd[r * K + k] * h[k]);
            dot.push_back(d), mag.push_back(a);
          }
        }
        std::vector<double> exact(out_rows), bound(out_rows);
        if (c.swiglu) {
          // silu'(t) ∈ [−0.1, 1.1]: an error e in the gate moves silu by at most 1.1e. The
          // kernel's g / (1 + expf(−g)) · u adds 4u (expf, 2 ulp), u, u and u: 8u with slack.
          for (std::int64_t r = 0; r < out_rows; ++r) {
            const double g = dot[r], up = dot[out_rows + r];
            const double bg = delta * mag[r] + gamma(K) * (1 + delta) * mag[r];
            const double bu = delta * mag[out_rows + r] + gamma(K) * (1 + delta) * mag[out_rows + r];
            const double silu = g / (1 + std::exp(-g));
            exact[r] = silu * up;
            bound[r] = 1.1 * bg * (std::fabs(up) + bu) + std::fabs(silu) * bu +
                       8 * u * (std::fabs(silu) + 1.1 * bg) * (std::fabs(up) + bu);
          }
        } else {
          std::int64_t r = 0;
          for (std::size_t i = 0; i < w.size(); ++i) {
            const auto B = b[i].defined() ? b[i].to_double_vector() : std::vector<double>(w[i].size(0), 0.0);
            for (std::int64_t j = 0; j < w[i].size(0); ++j, ++r) {
              const double old = c.accumulate ? Y0[r] : 0.0;
              exact[r] = dot[r] + B[j] + old;
              bound[r] = delta * mag[r] + gamma(K + 2) * ((1 + delta) * mag[r] + std::fabs(B[j]) + std::fabs(old));
            }
          }
        }
        cuda::GemvArgs a;
        for (const Tensor& wi : w) a.weights.push_back(on_gpu(wi));
        if (c.bias)
          for (const Tensor& bi : b) a.biases.push_back(on_gpu(bi));
        a.accumulate = c.accumulate, a.swiglu = c.swiglu;
        if (fused) a.norm = on_gpu(norm), a.eps = eps;
        const Tensor gfull = on_gpu(xfull);
        const Tensor gx = gfull.slice(0, c.misaligned_x ? 1 : 0, K + (c.misaligned_x ? 1 : 0));
        Tensor out = on_gpu(y0);
        cuda::gemv(version, gx, a, out);
        const auto got = out.to_double_vector();
        expect_within(got, exact, bound, what + " vs float64");

        // The CPU path: rmsnorm (version 3), then one ops::matmul per matrix, each with its bias,
        // then SwiGLU or the residual. It obeys the same bound, so the two are within twice it.
        Tensor hx = x.clone().view({1, K});
        if (fused) hx = ops::rmsnorm(hx, norm, eps);
        std::vector<double> cpu;
        if (c.swiglu) {
          cpu = ops::swiglu(ops::matmul(hx, w[0]), ops::matmul(hx, w[1])).to_double_vector();
        } else {
          for (std::size_t i = 0; i < w.size(); ++i) {
            Tensor part = ops::matmul(hx, w[i]);
            if (b[i].defined()) part = ops::add(part, b[i]);
            for (double v : part.to_double_vector()) cpu.push_back(v);
          }
          if (c.accumulate)
            for (std::int64_t r = 0; r < out_rows; ++r) cpu[r] += Y0[r];
        }
        std::vector<double> twice(bound.size());
        for (std::size_t i = 0; i < bound.size(); ++i) twice[i] = 2 * bound[i];
        expect_within(got, cpu, twice, what + " vs the CPU path");
      }
    }
  // Version 3 needs the norm's weight; the others take none.
  Tensor x = Tensor::zeros({64}, DType::F32, Device::CUDA), out = Tensor::zeros({8}, DType::F32, Device::CUDA);
  cuda::GemvArgs a;
  a.weights = {Tensor::zeros({8, 64}, DType::BF16, Device::CUDA)};
  test::expect_error([&] { cuda::gemv(cuda::GemvVersion::NormFused, x, a, out); }, {"cuda::gemv", "version 3"});
  a.norm = Tensor::zeros({64}, DType::F32, Device::CUDA);
  test::expect_error([&] { cuda::gemv(cuda::GemvVersion::SharedX, x, a, out); }, {"cuda::gemv", "version 3"});
  a.norm = Tensor();
  Tensor short_out = Tensor::zeros({7}, DType::F32, Device::CUDA);
  test::expect_error([&] { cuda::gemv(cuda::GemvVersion::SharedX, x, a, short_out); }, {"cuda::gemv", "8 elements"});
}

TEST(Cuda, MatmulCublas) {
  IL_REQUIRE_CUDA();
  for (DType wt : {DType::F32, DType::BF16, DType::F16}) {
    matmul_case(1, 512, 130, wt, cuda::GemvKernel::Cublas);
    matmul_case(37, 256, 96, wt, cuda::GemvKernel::Own);
  }
}

TEST(Cuda, ElementwiseOps) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  Tensor a = test::uniform(rng, {9, 70}, -8, 8), b = test::uniform(rng, {9, 70}), row = test::uniform(rng, {70});
  // add: one rounding each, identical operations: exact agreement.
  EXPECT_EQ(ops::add(on_gpu(a), on_gpu(b)).to_float_vector(), ops::add(a, b).to_float_vector());
  EXPECT_EQ(ops::add(on_gpu(a), on_gpu(row)).to_float_vector(), ops::add(a, row).to_float_vector());
  // swiglu: each side within 6u of the exact value (test_ops.cpp), so 12u apart.
  const auto gs = ops::swiglu(on_gpu(a), on_gpu(b)).to_double_vector(), cs = ops::swiglu(a, b).to_double_vector();
  std::vector<double> bound(cs.size());
  for (std::size_t i = 0; i < cs.size(); ++i) bound[i] = 12 * u * std::fabs(cs[i]) * (1 + 12 * u);
  expect_within(gs, cs, bound, "cuda swiglu");
  // softmax: each side within (2·spread·u + 5u + γ_N) relative; spread ≤ 16 here.
  const auto gm = ops::softmax(on_gpu(a)).to_double_vector(), cm = ops::softmax(a).to_double_vector();
  for (std::size_t i = 0; i < cm.size(); ++i) bound[i] = 2 * (32 * u + 5 * u + gamma(70)) * cm[i] + 1e-300;
  expect_within(gm, cm, bound, "cuda softmax");
}

TEST(Cuda, RmsNormRopeEmbedding) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  for (DType wt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor x = test::uniform(rng, {5, 300}, -3, 3), w = test::uniform_as(rng, {300}, wt, 0.5f, 1.5f);
    const auto g = ops::rmsnorm(on_gpu(x), on_gpu(w), 1e-6f).to_double_vector();
    const auto c = ops::rmsnorm(x, w, 1e-6f).to_double_vector();
    // Each within (γ_{D+2}/2 + 6u) relative of exact (test_ops.cpp), plus rsqrtf's 2 ulp.
    std::vector<double> bound(c.size());
    for (std::size_t i = 0; i < c.size(); ++i) bound[i] = (gamma(302) + 14 * u) * std::fabs(c[i]);
    expect_within(g, c, bound, "cuda rmsnorm " + std::string(dtype_name(wt)));

    Tensor table = test::uniform_as(rng, {50, 24}, wt);
    Tensor ids = Tensor::from_vector(std::vector<std::int32_t>{49, 0, 7, 7}, {4});
    EXPECT_EQ(ops::embedding(on_gpu(table), on_gpu(ids)).to_float_vector(), ops::embedding(table, ids).to_float_vector());
  }
  for (RopePairing pairing : {RopePairing::HalfSplit, RopePairing::Adjacent}) {
    Tensor x = test::uniform(rng, {6, 3, 32});
    Tensor pos = Tensor::from_vector(std::vector<std::int32_t>{0, 1, 2, 500, 8191, 100000}, {6});
    Tensor inv = rope_inv_freq(32, 10000.0);
    Tensor gx = on_gpu(x);
    ops::rope(gx, on_gpu(pos), on_gpu(inv), pairing);
    Tensor cx = x.clone();
    ops::rope(cx, pos, inv, pairing);
    // Same double-precision angles on both sides; each side within 4u(|a| + |b|) ≤ 8u·max|x|.
    const auto X = x.to_double_vector();
    std::vector<double> bound(X.size(), 2 * 8 * u);
    expect_within(gx.to_double_vector(), cx.to_double_vector(), bound, "cuda rope");
    // MLA's trailing range: dimensions 24..31 turn, 0..23 are kept.
    Tensor inv8 = rope_inv_freq(8, 10000.0);
    Tensor tx = on_gpu(x);
    ops::rope(tx, on_gpu(pos), on_gpu(inv8), pairing, 24);
    Tensor ct = x.clone();
    ops::rope(ct, pos, inv8, pairing, 24);
    expect_within(tx.to_double_vector(), ct.to_double_vector(), bound, "cuda rope (trailing)");
  }
}

TEST(Cuda, AttentionWithinTheFloat64BoundAndMatchesCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  struct Case {
    std::int64_t T, S, Nq, Nk, Dqk, Dv, window;
    bool causal;
  };
  for (const Case& c :
       {Case{1, 1, 4, 4, 64, 64, 0, true}, Case{1, 1000, 32, 8, 128, 128, 0, true}, Case{17, 300, 8, 8, 64, 64, 0, true},
        Case{40, 40, 4, 1, 256, 256, 16, true}, Case{6, 300, 4, 2, 64, 64, 130, true}, Case{9, 9, 2, 2, 80, 80, 0, false},
        Case{5, 200, 4, 2, 32, 32, 0, false}, Case{7, 260, 8, 2, 192, 128, 0, true}, Case{3, 20, 4, 4, 40, 72, 5, true},
        Case{2, 150, 8, 1, 576, 512, 0, true},
        // one query row: the split-K decode path (chunks of 256 keys), with a window
        // that starts mid-sequence, bidirectional, and MLA's head sizes
        Case{1, 700, 8, 2, 64, 64, 300, true}, Case{1, 600, 4, 4, 32, 48, 0, false},
        Case{1, 520, 16, 1, 576, 512, 0, true}}) {
    Tensor q = test::uniform(rng, {c.T, c.Nq, c.Dqk}, -2, 2), k = test::uniform(rng, {c.S, c.Nk, c.Dqk}, -2, 2),
           v = test::uniform(rng, {c.S, c.Nk, c.Dv});
    AttentionParams p;
    p.window = c.window, p.causal = c.causal;
    const auto g = ops::attention(on_gpu(q), on_gpu(k), on_gpu(v), p).to_double_vector();
    const auto cpu = ops::attention(q, k, v, p).to_double_vector();
    // The kernel's online softmax rescales once per chunk of 128 keys (exp: 2u each) and takes
    // expf's error: a further (2·chunks + 4)u on each weight (attention_exact.h).
    const double chunks = std::ceil(static_cast<double>(c.S) / 128.0);
    const test::AttnRef eg = test::attention_exact(q, k, v, p, (2 * chunks + 4) * u), ec = test::attention_exact(q, k, v, p);
    const std::string what = "S=" + std::to_string(c.S) + " Dqk=" + std::to_string(c.Dqk) + " Dv=" + std::to_string(c.Dv);
    expect_within(g, eg.out, eg.bound, "cuda attention vs float64 " + what);
    std::vector<double> both(eg.bound.size());
    for (std::size_t i = 0; i < both.size(); ++i) both[i] = eg.bound[i] + ec.bound[i];
    expect_within(g, cpu, both, "cuda attention vs cpu " + what);
  }
}

// Every version of the decode-attention family that reads a contiguous cache (1 per head, 2
// grouped, 4 ragged, 5 paged through the identity block table) on the same inputs, each within
// the float64 reference's bound: MHA, GQA and MQA groups, one to three 256-position chunks, a
// length short of the cache, head sizes of 64 and 128.
TEST(Cuda, EveryDecodeAttentionVersionWithinTheFloat64Bound) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  struct Case {
    std::int64_t S, len, N, K, H;
  };
  for (const Case& c : {Case{16, 1, 4, 4, 64}, Case{256, 256, 8, 8, 64}, Case{272, 257, 8, 2, 128},
                        Case{704, 700, 32, 8, 128}, Case{512, 300, 16, 1, 64}}) {
    Tensor q = test::uniform(rng, {1, c.N, c.H}, -2, 2), k = test::uniform(rng, {c.S, c.K, c.H}, -2, 2),
           v = test::uniform(rng, {c.S, c.K, c.H});
    const Tensor ks = k.slice(0, 0, c.len), vs = v.slice(0, 0, c.len);
    AttentionParams p;
    p.causal = false;  // one row that sees all `len` positions
    const double chunks = std::ceil(static_cast<double>(c.len) / 128.0);
    const test::AttnRef e = test::attention_exact(q, ks, vs, p, (2 * chunks + 4) * u);
    for (auto version : {cuda::DecodeAttention::PerHead, cuda::DecodeAttention::Grouped, cuda::DecodeAttention::Ragged,
                         cuda::DecodeAttention::Paged}) {
      Tensor out = Tensor::empty({1, c.N, c.H}, DType::F32, Device::CUDA);
      cuda::decode_attention(version, on_gpu(q), on_gpu(k), on_gpu(v), c.len, out);
      expect_within(out.to_double_vector(), e.out, e.bound,
                    std::string("decode attention version ") + cuda::decode_attention_name(version) +
                        ", S=" + std::to_string(c.S) + " len=" + std::to_string(c.len) + " N=" + std::to_string(c.N) +
                        " K=" + std::to_string(c.K) + " H=" + std::to_string(c.H));
    }
  }
  Tensor q = Tensor::zeros({1, 4, 64}, DType::F32, Device::CUDA), k = Tensor::zeros({16, 4, 64}, DType::F32, Device::CUDA);
  Tensor out = Tensor::empty({1, 4, 64}, DType::F32, Device::CUDA);
  test::expect_error([&] { cuda::decode_attention(cuda::DecodeAttention::Latent, q, k, k, 4, out); },
                     {"latent_decode_attention"});
  test::expect_error([&] { cuda::decode_attention(cuda::DecodeAttention::Paged, q, k, k, 4, out, 5); },
                     {"blocks of 5 rows must tile the cache of 16"});
  test::expect_error([&] { cuda::decode_attention(cuda::DecodeAttention::PerHead, q, k, k, 17, out); },
                     {"length 17 outside the cache of 16 positions"});
}

TEST(Cuda, AttentionRaggedEqualsOneCallPerSequence) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  const std::int64_t Nq = 8, Nk = 2, Dqk = 64, Dv = 48;
  // 41 sequences, more than one launch takes: decode rows, prefill chunks, whole prompts and
  // sequences with no queries, one of them longer than a chunk of 128 keys, and a decode row over
  // three of the decode path's 256-key chunks (the short decode rows beside it get empty chunks).
  std::vector<std::pair<std::int64_t, std::int64_t>> lengths = {{3, 300}, {1, 700}};
  for (int b = 0; b < 39; ++b) {
    const std::int64_t S = std::uniform_int_distribution<std::int64_t>(1, 60)(rng);
    const std::int64_t chunk = std::uniform_int_distribution<std::int64_t>(1, S)(rng);
    lengths.emplace_back(b % 4 == 0 ? 1 : b % 4 == 1 ? chunk : b % 4 == 2 ? S : 0, S);
  }
  std::shuffle(lengths.begin(), lengths.end(), rng);
  const test::Packed in = test::pack(rng, lengths, Nq, Nk, Dqk, Dv);
  const Tensor gq = on_gpu(in.q), gk = on_gpu(in.k), gv = on_gpu(in.v);
  AttentionParams causal, window, bidir;
  window.window = 20, bidir.causal = false;
  for (const AttentionParams& p : {causal, window, bidir}) {
    const Tensor g = ops::attention_ragged(gq, gk, gv, in.batch, p).to(Device::CPU);
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const std::int64_t q0 = in.batch.q_starts[b], q1 = in.batch.q_starts[b + 1];
      const std::int64_t k0 = in.batch.kv_starts[b], k1 = in.batch.kv_starts[b + 1];
      const auto got = g.slice(0, q0, q1).to_double_vector();
      const std::string what = "sequence " + std::to_string(b) + " (T " + std::to_string(q1 - q0) + ", S " +
                               std::to_string(k1 - k0) + ", window " + std::to_string(p.window) +
                               (p.causal ? ")" : ", bidirectional)");
      // The same kernel on the same rows: the same bits as a call of its own.
      EXPECT_EQ(got, ops::attention(gq.slice(0, q0, q1), gk.slice(0, k0, k1), gv.slice(0, k0, k1), p).to_double_vector())
          << "cuda attention_ragged, " << what;
      const double chunks = std::ceil(static_cast<double>(k1 - k0) / 128.0);
      const test::AttnRef e = test::attention_exact(in.q.slice(0, q0, q1), in.k.slice(0, k0, k1), in.v.slice(0, k0, k1), p,
                                                    (2 * chunks + 4) * u);
      expect_within(got, e.out, e.bound, "cuda attention_ragged vs float64, " + what);
    }
  }
}

// A batch step's attention on the GPU, as every layer of the engine's step runs it: the step's
// new keys and values stored through a CachedBatch (uploaded once) and every sequence attended in
// one launch (test::step_caches: blocks of a shared pool through shuffled tables and rows of their
// own; decode rows beside prefill chunks, whole prompts, a sequence with no rows and one over
// three ranges of 256 positions). MHA, GQA, MQA, MLA's head sizes and rows of a width no multiple
// of 4 (the store's float path); causal, with a window and bidirectional; the second of two
// layers. The stores land where the CPU's do, bit for bit; each sequence's output is within the
// float64 bound and within both bounds of the CPU's per-sequence attention; the one-layer call
// gives the same bits; a row no sequence names is left as it was.
TEST(Cuda, AttentionCachedOverABatchStepWithinTheBound) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  struct Heads {
    std::int64_t Nq, Nk, Dqk, Dv;
  };
  const std::int64_t L = 2, layer = 1;
  for (const Heads& h :
       {Heads{8, 8, 64, 64}, Heads{8, 2, 128, 128}, Heads{8, 1, 64, 64}, Heads{4, 4, 192, 128}, Heads{6, 3, 10, 6}}) {
    const test::StepCaches cpu = test::step_caches(rng, test::step_lengths(rng), h.Nq, h.Nk, h.Dqk, h.Dv, L);
    // The GPU's storage: a copy of the CPU's, the pool once for the sequences that share it.
    std::vector<CachedSeq> gpu = cpu.seqs;
    std::vector<Tensor> pool_k, pool_v;
    for (std::int64_t l = 0; l < L; ++l)
      pool_k.push_back(on_gpu(cpu.seqs[0].k[l])), pool_v.push_back(on_gpu(cpu.seqs[0].v[l]));  // sequence 0 is paged
    for (CachedSeq& s : gpu)
      for (std::int64_t l = 0; l < L; ++l) {
        s.k[l] = s.table ? pool_k[l] : on_gpu(s.k[l]);
        s.v[l] = s.table ? pool_v[l] : on_gpu(s.v[l]);
      }
    const CachedBatch on_cpu(cpu.seqs, cpu.rows), on_device(gpu, cpu.rows);
    ASSERT_EQ(on_device.items(), on_cpu.items());
    ops::store_cached(on_cpu, layer, cpu.k, cpu.v);
    ops::store_cached(on_device, layer, on_gpu(cpu.k), on_gpu(cpu.v));
    const std::string heads = "heads " + std::to_string(h.Nq) + "/" + std::to_string(h.Nk) + ", Dqk " +
                              std::to_string(h.Dqk) + ", Dv " + std::to_string(h.Dv);
    for (std::size_t b = 0; b < gpu.size(); ++b)
      for (std::int64_t l = 0; l < L; ++l) {
        EXPECT_EQ(gpu[b].k[l].to(Device::CPU).to_float_vector(), cpu.seqs[b].k[l].to_float_vector())
            << heads << ": sequence " << b << "'s keys in layer " << l;
        EXPECT_EQ(gpu[b].v[l].to(Device::CPU).to_float_vector(), cpu.seqs[b].v[l].to_float_vector())
            << heads << ": sequence " << b << "'s values in layer " << l;
      }
    AttentionParams causal, window, bidir;
    window.window = 20, bidir.causal = false;
    for (const AttentionParams& p : {causal, window, bidir}) {
      const std::vector<float> sevens(static_cast<std::size_t>(cpu.rows * h.Nq * h.Dv), 7.0f);
      Tensor out = on_gpu(Tensor::from_vector(sevens, {cpu.rows, h.Nq, h.Dv})), one_call = on_gpu(out);
      ops::attention_cached(on_gpu(cpu.q), on_device, layer, out, p);
      ops::attention_cached(on_gpu(cpu.q), on_device.layer(layer), one_call, p);  // uploaded for the call
      const Tensor got = out.to(Device::CPU);
      EXPECT_EQ(got.to_float_vector(), one_call.to(Device::CPU).to_float_vector()) << heads << ": one call, one layer";
      EXPECT_EQ(got.slice(0, cpu.gap, cpu.gap + 1).to_double_vector(),
                std::vector<double>(static_cast<std::size_t>(h.Nq * h.Dv), 7.0))
          << heads << ": a row no sequence names was written";
      for (std::size_t b = 0; b < cpu.seqs.size(); ++b) {
        const CachedSeq& s = cpu.seqs[b];
        if (s.q_end == s.q_begin) continue;
        const auto [kb, vb] = cpu.gather(b, layer);
        const Tensor qb = cpu.q.slice(0, s.q_begin, s.q_end);
        const auto g = got.slice(0, s.q_begin, s.q_end).to_double_vector();
        const auto alone = ops::attention(qb, kb, vb, p).to_double_vector();
        const double chunks = std::ceil(static_cast<double>(s.length) / 128.0);
        const test::AttnRef eg = test::attention_exact(qb, kb, vb, p, (2 * chunks + 4) * u),
                            ec = test::attention_exact(qb, kb, vb, p);
        const std::string what = heads + ", sequence " + std::to_string(b) + (s.table ? " (paged)" : " (rows)") + ", T " +
                                 std::to_string(s.q_end - s.q_begin) + ", S " + std::to_string(s.length) + ", window " +
                                 std::to_string(p.window) + (p.causal ? "" : ", bidirectional");
        expect_within(g, eg.out, eg.bound, "cuda batch step vs float64, " + what);
        std::vector<double> both(eg.bound.size());
        for (std::size_t i = 0; i < both.size(); ++i) both[i] = eg.bound[i] + ec.bound[i];
        expect_within(g, alone, both, "cuda batch step vs the cpu per sequence, " + what);
      }
    }
  }
}

TEST(Cuda, AttentionRefusesHeadsAboveItsLimits) {
  IL_REQUIRE_CUDA();
  Tensor q = on_gpu(Tensor::zeros({1, 1, 8}, DType::F32)), k = on_gpu(Tensor::zeros({2, 1, 8}, DType::F32));
  test::expect_error(
      [&] {
    ops::attention(q, k, on_gpu(Tensor::zeros({2, 1, 513}, DType::F32)));
      },
      {"attention (CUDA)", "value head dimension 513", "512"});
  Tensor wide = on_gpu(Tensor::zeros({2, 1, 1025}, DType::F32));
  test::expect_error(
      [&] {
    ops::attention(on_gpu(Tensor::zeros({1, 1, 1025}, DType::F32)), wide, k);
      },
      {"attention (CUDA)", "query/key head dimension 1025", "1024"});
}

TEST(Cuda, ArgmaxAndSamplingAgreeWithCpu) {
  IL_REQUIRE_CUDA();
  auto rng = test::rng_for_test();
  Tensor x = test::uniform(rng, {8, 32000}, -10, 10);
  x.at<float>({3, 17}) = 10.0f, x.at<float>({3, 31999}) = 10.0f;  // a tie: the lower index wins
  x.at<float>({5, 100}) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(ops::argmax(on_gpu(x)).to(DType::I64).to_double_vector(), ops::argmax(x).to(DType::I64).to_double_vector());
  // The same logits and seed give the same tokens from a CUDA tensor as from a CPU one.
  Tensor logits = test::uniform(rng, {1, 32000}, -5, 5);
  Tensor glogits = on_gpu(logits);
  Sampler a({0.8f, 50, 0.9f, 1234}), b({0.8f, 50, 0.9f, 1234});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(glogits), b.sample(logits));
}

TEST(Cuda, DeviceDescriptionAndCeilings) {
  IL_REQUIRE_CUDA();
  EXPECT_FALSE(cuda::device_description().empty());
  // A device with HBM reads far beyond 100 GB/s; the exact figure goes in the benchmark log.
  EXPECT_GT(cuda::measure_read_bandwidth(std::size_t(256) << 20), 1e11);
}

}  // namespace
}  // namespace inferlab
