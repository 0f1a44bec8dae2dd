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
  for (DType wt : {DType::F32, DType::BF16, DType::F16}) {
    matmul_case(1, 4096, 300, wt, cuda::GemvKernel::Own);  // vectorised path
    matmul_case(1, 1001, 77, wt, cuda::GemvKernel::Own);   // K not a multiple of 8: scalar path
  }
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
