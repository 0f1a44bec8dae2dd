#pragma once
// Attention in float64, written from the formula, with a per-element error bound for a float32
// implementation, and ragged batches of random sequences: shared by the CPU and CUDA tests.
#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "common/cached_batch.h"
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

/// One layer's caches of a batch step, for ops::store_cached and ops::attention_cached over a
/// CachedBatch: sequences of (T_b new rows, S_b positions after the step), the even ones in blocks
/// of a shared pool through shuffled tables, the odd ones in rows of their own with 5 to spare;
/// every position random before the step (the new rows overwrite theirs). `layers` layers of
/// storage, each random; q, k, v the step's rows, with one more (row `gap`, before the middle
/// sequence's) that no sequence names.
struct StepCaches {
  std::vector<CachedSeq> seqs;
  std::vector<std::vector<std::int32_t>> tables;  // the paged sequences' (seqs point into it)
  std::int64_t block = 16, rows = 0, gap = 0;
  Tensor q, k, v;
  StepCaches() = default;
  StepCaches(const StepCaches&) = delete;
  StepCaches(StepCaches&&) = default;

  /// Layer l's positions of sequence b, gathered in order: [S_b, Nk, Dqk] and [S_b, Nk, Dv] on the CPU.
  std::pair<Tensor, Tensor> gather(std::size_t b, std::int64_t l) const {
    const CachedSeq& s = seqs[b];
    const Tensor &k = s.k[static_cast<std::size_t>(l)], &v = s.v[static_cast<std::size_t>(l)];
    Tensor kb = Tensor::empty({s.length, k.size(1), k.size(2)}, DType::F32);
    Tensor vb = Tensor::empty({s.length, v.size(1), v.size(2)}, DType::F32);
    for (std::int64_t p = 0; p < s.length; ++p) {
      const std::int64_t at = s.table ? (*s.table)[static_cast<std::size_t>(p / block)] * block + p % block : p;
      kb.slice(0, p, p + 1).copy_from(k.slice(0, at, at + 1).to(Device::CPU));
      vb.slice(0, p, p + 1).copy_from(v.slice(0, at, at + 1).to(Device::CPU));
    }
    return {kb, vb};
  }
};

inline StepCaches step_caches(std::mt19937_64& rng, const std::vector<std::pair<std::int64_t, std::int64_t>>& lengths,
                              std::int64_t Nq, std::int64_t Nk, std::int64_t Dqk, std::int64_t Dv, std::int64_t layers) {
  StepCaches c;
  const std::size_t B = lengths.size();
  std::int64_t blocks = 3;  // three to spare
  c.rows = 1;
  for (auto [T, S] : lengths) blocks += (S + c.block - 1) / c.block, c.rows += T;
  std::vector<std::int32_t> order(static_cast<std::size_t>(blocks));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int32_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<Tensor> pool_k, pool_v;
  for (std::int64_t l = 0; l < layers; ++l)
    pool_k.push_back(uniform(rng, {blocks * c.block, Nk, Dqk}, -2, 2)),
        pool_v.push_back(uniform(rng, {blocks * c.block, Nk, Dv}));
  c.tables.resize(B);
  std::size_t next = 0;
  std::int64_t row = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const auto [T, S] = lengths[b];
    if (b == B / 2) c.gap = row++;
    CachedSeq s;
    s.length = S, s.q_begin = row, s.q_end = row + T;
    row += T;
    if (b % 2 == 0) {
      for (std::int64_t i = 0; i < (S + c.block - 1) / c.block; ++i) c.tables[b].push_back(order[next++]);
      s.k = pool_k, s.v = pool_v, s.table = &c.tables[b], s.block_size = c.block;
    } else {
      for (std::int64_t l = 0; l < layers; ++l)
        s.k.push_back(uniform(rng, {S + 5, Nk, Dqk}, -2, 2)), s.v.push_back(uniform(rng, {S + 5, Nk, Dv}));
    }
    c.seqs.push_back(s);
  }
  c.q = uniform(rng, {c.rows, Nq, Dqk}, -2, 2), c.k = uniform(rng, {c.rows, Nk, Dqk}, -2, 2),
  c.v = uniform(rng, {c.rows, Nk, Dv});
  return c;
}

/// Decode rows, prefill chunks and whole prompts of up to 60 positions, a sequence with no new
/// rows and one over three ranges of 256 positions, shuffled: the (T, S) of a ragged batch step.
inline std::vector<std::pair<std::int64_t, std::int64_t>> step_lengths(std::mt19937_64& rng) {
  std::vector<std::pair<std::int64_t, std::int64_t>> lengths = {{1, 700}, {40, 40}, {3, 300}, {0, 9}};
  for (int b = 0; b < 9; ++b) {
    const std::int64_t S = std::uniform_int_distribution<std::int64_t>(1, 60)(rng);
    const std::int64_t chunk = std::uniform_int_distribution<std::int64_t>(1, S)(rng);
    lengths.emplace_back(b % 3 == 0 ? 1 : b % 3 == 1 ? chunk : S, S);
  }
  std::shuffle(lengths.begin(), lengths.end(), rng);
  return lengths;
}

}  // namespace inferlab::test
