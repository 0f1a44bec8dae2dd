// The decode-attention family (common/cuda/decode_attention.cuh), every version on the same
// inputs: one query row against a layer's cache, as every decode step runs it. Each (version,
// shape) is first checked against the float64 reference with the dtype's bound (a version outside
// it is reported as an error, not timed), then timed; GB/s counts the bytes the cache holds for
// the positions read (K·len·H·2·4, or len·R·4 for latent rows) and of_ceiling divides by the read
// bandwidth measured in the same run. Run a version alone by its number:
//   bench_decode_attention --benchmark_filter='Cuda.*/1/'       # version 1, every shape
//
//   version 1 per_head, 2 grouped, 4 ragged, 5 paged: GQA as Llama-3-8B (N 32, K 8, H 128), MHA
//             and MQA beside it, at 4K, 16K and 32K positions
//   version 3 latent: MLA's absorbed decode as DeepSeek-V2-Lite (16 heads, r 512 + dr 64)
//   version 5 over a batch step (BM_CudaDecodeAttentionBatch): 1, 8 and 64 sequences of 4K
//             positions, contiguous caches and a pool of blocks, with the store of the step's rows
//   the CPU's fast path over a batch step (BM_CpuDecodeAttentionBatch): chapter 11's engine step
//             on the 100M shape, 8 and 32 sequences of 160 and 2,048 positions
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "../attention_exact.h"
#include "bench_main.h"
#include "common/cached_batch.h"
#include "common/ceiling.h"
#include "common/cuda/backend.h"
#include "common/metrics.h"
#include "common/ops.h"

using namespace inferlab;

namespace {

constexpr double u = 0x1p-24;

struct AttnShape {
  const char* name;
  std::int64_t N, K, H;
};
constexpr AttnShape kShapes[] = {
    {"GQA N32 K8 H128", 32, 8, 128}, {"MHA N32 K32 H128", 32, 32, 128}, {"MQA N32 K1 H128", 32, 1, 128}};

double read_ceiling() {
  static const double c = cuda::measure_read_bandwidth(std::size_t(2) << 30);
  return c;
}

Tensor random_cpu(const inferlab::Shape& s, std::uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(s, DType::F32, Device::CUDA);
  cuda::fill_uniform(t, seed, lo, hi);
  return t.to(Device::CPU);
}

// Where the version's output is outside the float64 reference's bound: the first such element,
// or an empty string.
std::string check(const Tensor& got, const test::AttnRef& e) {
  const auto g = got.to_double_vector();
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - e.out[i]) <= e.bound[i]))
      return "element " + std::to_string(i) + ": " + std::to_string(g[i]) + " against " + std::to_string(e.out[i]) +
             " (bound " + std::to_string(e.bound[i]) + ")";
  return "";
}

// Times run() (20 calls a sample) and reports the counters every row shares.
template <class Run>
void time_it(benchmark::State& state, double bytes, const Run& run) {
  run();
  cuda::synchronize();
  double total = 0;
  for (auto _ : state) {
    metrics::Timer t;
    for (int i = 0; i < 20; ++i) run();
    cuda::synchronize();
    const double dt = t.seconds() / 20;
    state.SetIterationTime(dt);
    total += dt;
  }
  const double per = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = bytes / per / 1e9;
  state.counters["of_ceiling"] = bytes / per / read_ceiling();
  state.counters["us"] = per * 1e6;
}

// Args: version (1, 2, 4, 5), shape index, positions.
void BM_CudaDecodeAttention(benchmark::State& state) {
  const std::string reason = cuda::unavailable_reason();
  if (!reason.empty()) return state.SkipWithError(("no CUDA device available: " + reason).c_str());
  const auto version = static_cast<cuda::DecodeAttention>(state.range(0));
  const AttnShape s = kShapes[state.range(1)];
  const std::int64_t S = state.range(2);
  const Tensor q = random_cpu({1, s.N, s.H}, 1, -2, 2), k = random_cpu({S, s.K, s.H}, 2, -2, 2),
               v = random_cpu({S, s.K, s.H}, 3, -1, 1);
  // The float64 reference once per (shape, length); the bound as the tests state it.
  static std::map<std::tuple<std::int64_t, std::int64_t>, test::AttnRef> refs;
  auto [it, fresh] = refs.try_emplace({state.range(1), S});
  if (fresh) {
    AttentionParams p;
    p.causal = false;
    it->second = test::attention_exact(q, k, v, p, (2 * std::ceil(static_cast<double>(S) / 128.0) + 4) * u);
  }
  const Tensor gq = q.to(Device::CUDA), gk = k.to(Device::CUDA), gv = v.to(Device::CUDA);
  Tensor out = Tensor::empty({1, s.N, s.H}, DType::F32, Device::CUDA);
  auto run = [&] { cuda::decode_attention(version, gq, gk, gv, S, out); };
  run();
  if (const std::string bad = check(out.to(Device::CPU), it->second); !bad.empty())
    return state.SkipWithError(("outside the float64 bound at " + bad).c_str());
  time_it(state, static_cast<double>(s.K) * S * s.H * 2 * 4, run);
  state.SetLabel(std::string(cuda::decode_attention_name(version)) + ", " + s.name);
}
BENCHMARK(BM_CudaDecodeAttention)
    ->ArgsProduct({{1, 2, 4, 5}, {0, 1, 2}, {4096, 16384, 32768}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Version 3 over latent rows [S, 1, r + dr]: N heads, values the first r columns. Args: positions.
void BM_CudaDecodeAttentionLatent(benchmark::State& state) {
  const std::string reason = cuda::unavailable_reason();
  if (!reason.empty()) return state.SkipWithError(("no CUDA device available: " + reason).c_str());
  constexpr std::int64_t N = 16, r = 512, R = 576;
  const std::int64_t S = state.range(0);
  const Tensor q = random_cpu({1, N, R}, 4, -1, 1), latent = random_cpu({S, 1, R}, 5, -1, 1);
  const Tensor values = latent.slice(2, 0, r).contiguous();
  const float scale = 1.0f / std::sqrt(192.0f);  // DeepSeek's q·k width (dn + dr), not R
  AttentionParams p;
  p.causal = false, p.scale = scale;
  const test::AttnRef e =
      test::attention_exact(q, latent, values, p, (2 * std::ceil(static_cast<double>(S) / 128.0) + 4) * u);
  const Tensor gq = q.to(Device::CUDA), gl = latent.to(Device::CUDA);
  Tensor out = Tensor::empty({1, N, r}, DType::F32, Device::CUDA);
  auto run = [&] { cuda::latent_decode_attention(gq, gl, S, scale, r, out); };
  run();
  if (const std::string bad = check(out.to(Device::CPU), e); !bad.empty())
    return state.SkipWithError(("outside the float64 bound at " + bad).c_str());
  time_it(state, static_cast<double>(S) * R * 4, run);
  state.SetLabel("3 latent, N16 r512 dr64");
}
BENCHMARK(BM_CudaDecodeAttentionLatent)->Arg(4096)->Arg(16384)->UseManualTime()->Unit(benchmark::kMicrosecond);

// Version 5 over a whole batch step, as each layer of the engine's batched step runs it: one
// ops::store_cached call (the step's new keys and values into their slots) and one
// ops::attention_cached call over a CachedBatch built and uploaded once. B sequences of `len`
// positions (GQA as Llama-3-8B), a decode row each, in contiguous caches of their own (paged 0) or
// in blocks of 16 positions of one pool through shuffled tables (paged 1). The first and the last
// sequence are checked against the float64 reference first; GB/s counts every sequence's cached K
// and V; `launches` are those of one call pair, the same at any B. Args: paged, B, positions.
void BM_CudaDecodeAttentionBatch(benchmark::State& state) {
  const std::string reason = cuda::unavailable_reason();
  if (!reason.empty()) return state.SkipWithError(("no CUDA device available: " + reason).c_str());
  const bool paged = state.range(0) != 0;
  const std::int64_t B = state.range(1), S = state.range(2), block = 16;
  const AttnShape s = kShapes[0];
  auto filled = [](const inferlab::Shape& shape, std::uint64_t seed, float lo, float hi) {
    Tensor t = Tensor::empty(shape, DType::F32, Device::CUDA);
    cuda::fill_uniform(t, seed, lo, hi);
    return t;
  };
  std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(B));
  std::vector<CachedSeq> seqs;
  if (paged) {
    const std::int64_t blocks = B * S / block;
    const Tensor kp = filled({blocks * block, s.K, s.H}, 2, -2, 2), vp = filled({blocks * block, s.K, s.H}, 3, -1, 1);
    std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
    for (std::int64_t b = 0; b < B; ++b) {
      auto& table = tables[static_cast<std::size_t>(b)];
      table.assign(order.begin() + b * S / block, order.begin() + (b + 1) * S / block);
      seqs.push_back({{kp}, {vp}, &table, block, S, b, b + 1, -1});
    }
  } else {
    for (std::int64_t b = 0; b < B; ++b)
      seqs.push_back({{filled({S, s.K, s.H}, 10 + 2 * static_cast<std::uint64_t>(b), -2, 2)},
                      {filled({S, s.K, s.H}, 11 + 2 * static_cast<std::uint64_t>(b), -1, 1)},
                      nullptr,
                      1,
                      S,
                      b,
                      b + 1,
                      -1});
  }
  const Tensor q = filled({B, s.N, s.H}, 4, -2, 2), k = filled({B, s.K, s.H}, 5, -2, 2), v = filled({B, s.K, s.H}, 6, -1, 1);
  const CachedBatch batch(seqs, B);
  Tensor out = Tensor::empty({B, s.N, s.H}, DType::F32, Device::CUDA);
  auto run = [&] {
    ops::store_cached(batch, 0, k, v);
    ops::attention_cached(q, batch, 0, out);
  };
  const cuda::Launches before = cuda::launches();
  run();
  const std::int64_t launches = cuda::launches().kernels - before.kernels;
  for (const std::int64_t b : {std::int64_t{0}, B - 1}) {  // the sequence's positions, gathered in order
    const CachedSeq& c = seqs[static_cast<std::size_t>(b)];
    Tensor kb = Tensor::empty({S, s.K, s.H}, DType::F32), vb = Tensor::empty({S, s.K, s.H}, DType::F32);
    for (std::int64_t p = 0; p < S; p += block) {
      const std::int64_t at = c.table ? (*c.table)[static_cast<std::size_t>(p / block)] * block : p;
      kb.slice(0, p, p + block).copy_from(c.k[0].slice(0, at, at + block).to(Device::CPU));
      vb.slice(0, p, p + block).copy_from(c.v[0].slice(0, at, at + block).to(Device::CPU));
    }
    const test::AttnRef e = test::attention_exact(q.slice(0, b, b + 1).to(Device::CPU), kb, vb, {},
                                                  (2 * std::ceil(static_cast<double>(S) / 128.0) + 4) * u);
    if (const std::string bad = check(out.slice(0, b, b + 1).to(Device::CPU), e); !bad.empty())
      return state.SkipWithError(("sequence " + std::to_string(b) + " outside the float64 bound at " + bad).c_str());
  }
  time_it(state, static_cast<double>(B) * s.K * S * s.H * 2 * 4, run);
  state.counters["launches"] = static_cast<double>(launches);
  state.SetLabel(std::string("5 paged over a batch step, ") + (paged ? "a pool of blocks of 16, " : "contiguous caches, ") +
                 s.name);
}
BENCHMARK(BM_CudaDecodeAttentionBatch)
    ->ArgsProduct({{0, 1}, {1, 8, 64}, {4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The CPU's decode attention over a batch step (ops::attention_cached: tasks over sequence × KV
// heads on the threads), as each layer of chapter 11's engine step on chapter 01's 100M shape runs
// it: B sequences of `len` positions, a decode row each, in contiguous caches of 16 heads of 64.
// The caches of enough layers, read in turn, to fill the last-level cache twice over, so that a
// layer's cache comes from memory as in a step. The first and the last sequence are checked
// against the float64 reference first; GB/s counts every cached K and V a call reads, of_ceiling
// divides it by the read ceiling measured for as many bytes (from memory). Args: B, positions.
void BM_CpuDecodeAttentionBatch(benchmark::State& state) {
  const std::int64_t B = state.range(0), S = state.range(1), N = 16, H = 64;
  const double layer_bytes = static_cast<double>(B * S * N * H) * 2 * 4;
  const auto layers = static_cast<std::size_t>(std::ceil(2 * metrics::last_level_cache_bytes() / layer_bytes));
  std::mt19937_64 rng(1);
  auto filled = [&](const inferlab::Shape& shape, float lo, float hi) {
    Tensor t = Tensor::empty(shape, DType::F32);
    std::uniform_real_distribution<float> d(lo, hi);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
    return t;
  };
  std::vector<std::vector<CachedKV>> caches(layers);
  for (auto& layer : caches)
    for (std::int64_t b = 0; b < B; ++b)
      layer.push_back({filled({S, N, H}, -2, 2), filled({S, N, H}, -1, 1), nullptr, 1, S, b, b + 1, -1});
  const Tensor q = filled({B, N, H}, -2, 2);
  Tensor out = Tensor::empty({B, N, H}, DType::F32);
  ops::attention_cached(q, caches[0], out);
  for (const std::int64_t b : {std::int64_t{0}, B - 1}) {
    const CachedKV& c = caches[0][static_cast<std::size_t>(b)];
    const test::AttnRef e = test::attention_exact(q.slice(0, b, b + 1), c.k, c.v, {});
    if (const std::string bad = check(out.slice(0, b, b + 1), e); !bad.empty())
      return state.SkipWithError(("sequence " + std::to_string(b) + " outside the float64 bound at " + bad).c_str());
  }
  double total = 0;
  std::size_t l = 1;  // layer 0 was just read by the check
  for (auto _ : state) {
    metrics::Timer t;
    ops::attention_cached(q, caches[l++ % layers], out);
    const double dt = t.seconds();
    state.SetIterationTime(dt);
    total += dt;
  }
  const double per = total / static_cast<double>(state.iterations());
  state.counters["GB/s"] = layer_bytes / per / 1e9;
  state.counters["of_ceiling"] =
      layer_bytes / per / metrics::cpu_read_ceiling(layer_bytes * static_cast<double>(layers)).bytes_per_s();
  state.counters["us"] = per * 1e6;
  state.SetLabel("cpu fast path over a batch step, contiguous caches, MHA N16 K16 H64 (the 100M shape), " +
                 std::to_string(layers) + " layers' caches in turn");
}
BENCHMARK(BM_CpuDecodeAttentionBatch)
    ->ArgsProduct({{8, 32}, {160, 2048}})
    ->UseManualTime()
    ->Iterations(64)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
