// MLA's decode attention at long context, DeepSeek-V2's dims (N = 128 heads, r = 512, dr = 64,
// dn = dv = 128), one layer's latent cache of S positions:
//   absorbed  chapter 04's kernel over the latent rows themselves (each row read once for all
//             heads, Dqk = r + dr, Dv = r)
//   plain     rebuild every position's K [S, N, dn + dr] and V [S, N, dv] from its latent row
//             (models::mla::mla_rebuild_kv: cuBLAS GEMMs with W_KVB, and k_pe copied into every head),
//             then attention over them (ops::attention, which takes Dv ≠ Dqk)
//   rebuild   the plain path's rebuild alone, to show where its time goes
//   GQA       chapter 03's grouped kernel on a cache of the same bytes per token: K = 3 KV heads
//             of H = 96 (K·H·2 = 576 values, as r + dr) for N = 48 query heads, groups of 16,
//             the largest the kernel takes
// Bytes count what each must move: the cache rows read, and for the plain path also W_KVB and
// the rebuilt K and V written and read again. FLOPs count multiply-adds as 2. Achieved GB/s is
// set against the measured read bandwidth, FLOP/byte says which roof applies (see cuda_mla.h).
#include <benchmark/benchmark.h>

#include <cmath>

#include "bench_main.h"
#include "chapters/03_gqa/cuda_gqa.h"
#include "common/cuda/backend.h"
#include "common/metrics.h"
#include "common/models/cuda_mla.h"
#include "common/ops.h"

using namespace inferlab;

namespace {

constexpr std::int64_t N = 128, r = 512, dr = 64, dn = 128, dv = 128, R = r + dr;
constexpr std::int64_t kGqaHeads = 48, kGqaKv = 3, kGqaDim = 96;
static_assert(kGqaKv * kGqaDim * 2 == R, "the GQA cache holds as many values per token as the latent one");

enum Variant { Absorbed, Plain, Rebuild, Gqa };

struct Cost {
  double bytes, flops;
};

Cost cost(Variant v, double S) {
  const double f = 4;  // bytes per f32 value
  const double latent = S * R * f, weights = static_cast<double>(N * (dn + dv) * r) * f;
  const double kv = S * N * (dn + dr + dv) * f, rebuild = 2 * S * r * N * (dn + dv);
  switch (v) {
    case Absorbed: return {latent, 2 * S * N * R + 2 * S * N * r};
    case Rebuild: return {latent + weights + kv, rebuild};
    case Plain: return {latent + weights + 2 * kv, rebuild + 2 * S * N * (dn + dr) + 2 * S * N * dv};
    case Gqa: return {kGqaKv * S * kGqaDim * 2 * f, 2 * S * kGqaHeads * kGqaDim * 2};
  }
  return {};
}

const char* label(Variant v) {
  switch (v) {
    case Absorbed: return "absorbed kernel over the latent rows";
    case Plain: return "plain: rebuild K, V with W_KVB, then attention";
    case Rebuild: return "plain path's rebuild alone (GEMMs + k_pe copy)";
    case Gqa: return "GQA kernel, K = 3, H = 96, N = 48: same cache bytes per token";
  }
  return "";
}

void BM_CudaMlaDecode(benchmark::State& state) {
  const std::string reason = cuda::unavailable_reason();
  if (!reason.empty()) {
    state.SkipWithError(("no CUDA device available: " + reason).c_str());
    return;
  }
  const std::int64_t S = state.range(0);
  const auto variant = static_cast<Variant>(state.range(1));
  static const double ceiling = cuda::measure_read_bandwidth(std::size_t(2) << 30);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dn + dr)));
  auto uniform = [](Shape s, std::uint64_t seed) {
    Tensor t = Tensor::empty(s, DType::F32, Device::CUDA);
    cuda::fill_uniform(t, seed, -1, 1);
    return t;
  };
  Tensor latent, q, out, w_kvb, k, v, kq, gk, gv;
  if (variant == Gqa) {
    q = uniform({1, kGqaHeads, kGqaDim}, 1), gk = uniform({S, kGqaKv, kGqaDim}, 2), gv = uniform({S, kGqaKv, kGqaDim}, 3);
    out = Tensor::empty({1, kGqaHeads, kGqaDim}, DType::F32, Device::CUDA);
  } else {
    latent = uniform({S, 1, R}, 4);
    q = uniform({1, N, variant == Absorbed ? R : dn + dr}, 5);
    out = Tensor::empty({1, N, variant == Absorbed ? r : dv}, DType::F32, Device::CUDA);
    if (variant != Absorbed) {
      w_kvb = uniform({N * (dn + dv), r}, 6);
      k = Tensor::empty({S, N, dn + dr}, DType::F32, Device::CUDA), v = Tensor::empty({S, N, dv}, DType::F32, Device::CUDA);
    }
  }
  AttentionParams p;
  p.q_offset = S - 1;
  p.scale = scale;
  auto run = [&] {
    switch (variant) {
      case Absorbed: models::mla::mla_decode_attention(q, latent, S, scale, r, out); break;
      case Rebuild: models::mla::mla_rebuild_kv(latent, S, w_kvb, dn, k, v); break;
      case Plain:
        models::mla::mla_rebuild_kv(latent, S, w_kvb, dn, k, v);
        ops::attention(q, k, v, out, p);
        break;
      case Gqa: ch03::gqa_decode_attention(q, gk, gv, S, out); break;
    }
  };
  run();
  cuda::synchronize();
  const int reps = variant == Plain || variant == Rebuild ? 2 : 20;  // the rebuild takes milliseconds
  double total = 0;
  for (auto _ : state) {
    metrics::Timer t;
    for (int i = 0; i < reps; ++i) run();
    cuda::synchronize();
    const double dt = t.seconds() / reps;
    state.SetIterationTime(dt);
    total += dt;
  }
  const Cost w = cost(variant, static_cast<double>(S));
  const double per = total / static_cast<double>(state.iterations());
  state.counters["MB"] = w.bytes / 1e6;
  state.counters["GB/s"] = w.bytes / per / 1e9;
  state.counters["of_ceiling"] = w.bytes / per / ceiling;
  state.counters["TFLOP/s"] = w.flops / per / 1e12;
  state.counters["FLOP/B"] = w.flops / w.bytes;
  state.counters["us"] = per * 1e6;
  state.SetLabel(label(variant));
}
BENCHMARK(BM_CudaMlaDecode)
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {Absorbed, Plain, Rebuild, Gqa}})
    ->ArgNames({"S", "variant"})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

INFERLAB_BENCHMARK_MAIN()
