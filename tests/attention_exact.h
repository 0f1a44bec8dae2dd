#pragma once
// Attention in float64, written from the formula, with a per-element error bound for a float32
// implementation, and ragged batches of random sequences: shared by the CPU and CUDA tests.
#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "common/ops.h"
#include "test_util.h"

namespace inferlab::test {

struct AttnRef {
  std::vector<double> out, bound;
};

/// out[t,h,:] = Σ_j softmax_j(scale · q[t,h]·k[j,kvh]) v[j,kvh] over the keys query t sees: all
/// of them, or (causal) those at positions ≤ q_offset + t, and with a window only the last
/// `window` of those. q[T,Nq,Dqk], k[S,Nk,Dqk], v[S,Nk,Dv]. `extra_eta` widens the bound by a
/// further relative error on each softmax weight, for kernels that rescale as they go.
inline AttnRef attention_exact(const Tensor& q, const Tensor& k, const Tensor& v, AttentionParams p, double extra_eta = 0) {
  constexpr double u = 0x1p-24;
  const std::int64_t T = q.size(0), Nq = q.size(1), Dqk = q.size(2), S = k.size(0), Nk = k.size(1), Dv = v.size(2);
  if (p.q_offset < 0) p.q_offset = S - T;
  // The scale as the op computes it, in float.
  const double fscale = p.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(Dqk)) : p.scale;
  const auto Q = q.to_double_vector(), K = k.to_double_vector(), V = v.to_double_vector();
  AttnRef r{std::vector<double>(T * Nq * Dv), std::vector<double>(T * Nq * Dv)};
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < Nq; ++h) {
      const std::int64_t kvh = h / (Nq / Nk);
      const std::int64_t hi = p.causal ? p.q_offset + t : S - 1;
      const std::int64_t lo = p.window > 0 ? std::max<std::int64_t>(0, hi - p.window + 1) : 0;
      std::vector<double> s(S);
      double mx = -INFINITY, E = 0;
      for (std::int64_t j = lo; j <= hi; ++j) {
        double dot = 0, a = 0;
        for (std::int64_t d = 0; d < Dqk; ++d)
          dot += Q[(t * Nq + h) * Dqk + d] * K[(j * Nk + kvh) * Dqk + d],
              a += std::fabs(Q[(t * Nq + h) * Dqk + d] * K[(j * Nk + kvh) * Dqk + d]);
        s[j] = dot * fscale;
        mx = std::max(mx, s[j]);
        E = std::max(E, fscale * gamma(Dqk) * a + u * std::fabs(s[j]));  // error of one score
      }
      double sum = 0, spread = 0;
      for (std::int64_t j = lo; j <= hi; ++j) sum += std::exp(s[j] - mx), spread = std::max(spread, mx - s[j]);
      const double n = static_cast<double>(hi - lo + 1);
      // Each weight exp(s_j − max) is off by a relative η ≤ E + u·spread + 2u (score error,
      // the subtraction, exp); weights normalised by their own sum move the output by at most
      // 2η·max|v|; the two S-term sums add γ_S each, the division u.
      const double eta = E + u * spread + 2 * u + extra_eta;
      for (std::int64_t d = 0; d < Dv; ++d) {
        double o = 0, vmax = 0;
        for (std::int64_t j = lo; j <= hi; ++j)
          o += std::exp(s[j] - mx) / sum * V[(j * Nk + kvh) * Dv + d],
              vmax = std::max(vmax, std::fabs(V[(j * Nk + kvh) * Dv + d]));
        r.out[(t * Nq + h) * Dv + d] = o;
        r.bound[(t * Nq + h) * Dv + d] = (2 * eta + 2 * gamma(n) + 3 * u) * vmax;
      }
    }
  return r;
}

/// Random q, k, v for sequences of (T_b queries, S_b keys), packed along the rows, and their batch.
struct Packed {
  Tensor q, k, v;
  RaggedBatch batch;
};

inline Packed pack(std::mt19937_64& rng, const std::vector<std::pair<std::int64_t, std::int64_t>>& lengths, std::int64_t Nq,
                   std::int64_t Nk, std::int64_t Dqk, std::int64_t Dv) {
  Packed p;
  p.batch.q_starts = {0}, p.batch.kv_starts = {0};
  for (auto [T, S] : lengths) {
    p.batch.q_starts.push_back(p.batch.q_starts.back() + T);
    p.batch.kv_starts.push_back(p.batch.kv_starts.back() + S);
  }
  p.q = uniform(rng, {p.batch.q_starts.back(), Nq, Dqk}, -2, 2);
  p.k = uniform(rng, {p.batch.kv_starts.back(), Nk, Dqk}, -2, 2);
  p.v = uniform(rng, {p.batch.kv_starts.back(), Nk, Dv});
  return p;
}

}  // namespace inferlab::test
