// ops:: — checks, work counting, and dispatch to the fast CPU path or the CUDA backend.
#include "common/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/cached_batch.h"
#include "common/cuda/backend.h"
#include "common/hf_config.h"
#include "common/metrics.h"
#include "common/ops_cpu.h"

namespace inferlab {

// ---------------------------------------------------------------------------------------------
// Checks shared by every version of every op.
namespace {

void want(const Tensor& t, const char* op, const char* name) {
  IL_CHECK(t.defined(), op, ": ", name, " is undefined");
  IL_CHECK(t.is_contiguous(), op, ": ", name, " ", t.describe(), " must be contiguous");
}
void want_dtype(const Tensor& t, DType d, const char* op, const char* name) {
  IL_CHECK(t.dtype() == d, op, ": ", name, " must be ", dtype_name(d), ", got ", t.describe());
}
void want_weight_dtype(const Tensor& t, const char* op, const char* name) {
  IL_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16, op, ": ", name,
           " must be f32, f16 or bf16, got ", t.describe());
}
void want_ndim(const Tensor& t, int n, const char* op, const char* name) {
  IL_CHECK(t.ndim() == n, op, ": ", name, " must be ", n, "-d, got ", t.describe());
}
void same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  Device d = (*ts.begin())->device();
  for (const Tensor* t : ts)
    IL_CHECK(t->device() == d, op, ": all tensors must be on one device, got ", t->describe(), " and a ", device_name(d),
             " tensor");
}
void same_shape(const Tensor& a, const Tensor& b, const char* op, const char* na, const char* nb) {
  IL_CHECK(a.shape() == b.shape(), op, ": ", na, " ", a.describe(), " and ", nb, " ", b.describe(),
           " must have the same shape");
}
double bytes(const Tensor& t) { return static_cast<double>(t.nbytes()); }

}  // namespace

namespace check {

void matmul(const Tensor& x, const Tensor& w, const Tensor& out) {
  want(x, "matmul", "x"), want(w, "matmul", "w"), want(out, "matmul", "out");
  want_ndim(x, 2, "matmul", "x"), want_ndim(w, 2, "matmul", "w"), want_ndim(out, 2, "matmul", "out");
  want_dtype(x, DType::F32, "matmul", "x"), want_weight_dtype(w, "matmul", "w");
  want_dtype(out, DType::F32, "matmul", "out");
  same_device("matmul", {&x, &w, &out});
  IL_CHECK(x.size(1) == w.size(1), "matmul: x ", x.describe(), " and w ", w.describe(), " disagree on the inner dimension");
  IL_CHECK(out.size(0) == x.size(0) && out.size(1) == w.size(0), "matmul: out ", out.describe(), " should be [", x.size(0),
           ", ", w.size(0), "]");
  metrics::count("matmul", 2.0 * x.size(0) * w.size(0) * x.size(1), bytes(x) + bytes(w) + bytes(out));
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  want(a, "add", "a"), want(b, "add", "b"), want(out, "add", "out");
  want_dtype(a, DType::F32, "add", "a"), want_dtype(b, DType::F32, "add", "b"), want_dtype(out, DType::F32, "add", "out");
  same_device("add", {&a, &b, &out});
  same_shape(a, out, "add", "a", "out");
  bool row = b.ndim() == 1 && a.ndim() >= 1 && b.size(0) == a.size(-1);
  IL_CHECK(row || b.shape() == a.shape(), "add: b ", b.describe(), " must have a's shape ", shape_str(a.shape()),
           " or be one row of its last dimension");
  metrics::count("add", static_cast<double>(a.numel()), bytes(a) + bytes(b) + bytes(out));
}

void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out) {
  want(x, "rmsnorm", "x"), want(w, "rmsnorm", "w"), want(out, "rmsnorm", "out");
  want_dtype(x, DType::F32, "rmsnorm", "x"), want_weight_dtype(w, "rmsnorm", "w");
  want_dtype(out, DType::F32, "rmsnorm", "out");
  same_device("rmsnorm", {&x, &w, &out});
  want_ndim(w, 1, "rmsnorm", "w");
  IL_CHECK(x.ndim() >= 1 && x.size(-1) == w.size(0), "rmsnorm: x ", x.describe(), " and weight ", w.describe(),
           " disagree on the last dimension");
  same_shape(x, out, "rmsnorm", "x", "out");
  metrics::count("rmsnorm", 4.0 * static_cast<double>(x.numel()), bytes(x) + bytes(w) + bytes(out));
}

void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, std::int64_t begin) {
  want(x, "rope", "x"), want(positions, "rope", "positions"), want(inv_freq, "rope", "inv_freq");
  want_ndim(x, 3, "rope", "x"), want_ndim(positions, 1, "rope", "positions"), want_ndim(inv_freq, 1, "rope", "inv_freq");
  want_dtype(x, DType::F32, "rope", "x"), want_dtype(positions, DType::I32, "rope", "positions");
  want_dtype(inv_freq, DType::F32, "rope", "inv_freq");
  same_device("rope", {&x, &positions, &inv_freq});
  IL_CHECK(positions.size(0) == x.size(0), "rope: ", positions.size(0), " positions for ", x.size(0), " rows of x ",
           x.describe());
  IL_CHECK(begin >= 0 && begin + 2 * inv_freq.size(0) <= x.size(2), "rope: ", inv_freq.size(0),
           " frequencies rotate dimensions ", begin, "..", begin + 2 * inv_freq.size(0) - 1, ", but the head dimension is ",
           x.size(2));
  const double pairs = static_cast<double>(x.size(0) * x.size(1) * inv_freq.size(0));
  metrics::count("rope", 6.0 * pairs, 2.0 * pairs * 2 * 4 + bytes(positions) + bytes(inv_freq));
}

void softmax(const Tensor& x, const Tensor& out) {
  want(x, "softmax", "x"), want(out, "softmax", "out");
  want_dtype(x, DType::F32, "softmax", "x"), want_dtype(out, DType::F32, "softmax", "out");
  same_device("softmax", {&x, &out});
  IL_CHECK(x.ndim() >= 1, "softmax: x must have at least one dimension");
  same_shape(x, out, "softmax", "x", "out");
  metrics::count("softmax", 4.0 * static_cast<double>(x.numel()), bytes(x) + bytes(out));
}

namespace {
// The gated MLP's activations: gate, up and out F32 of one shape, on one device.
void gated(const char* op, const Tensor& gate, const Tensor& up, const Tensor& out, double flops_per_element) {
  want(gate, op, "gate"), want(up, op, "up"), want(out, op, "out");
  want_dtype(gate, DType::F32, op, "gate"), want_dtype(up, DType::F32, op, "up"), want_dtype(out, DType::F32, op, "out");
  same_device(op, {&gate, &up, &out});
  same_shape(gate, up, op, "gate", "up"), same_shape(gate, out, op, "gate", "out");
  metrics::count(op, flops_per_element * static_cast<double>(gate.numel()), bytes(gate) + bytes(up) + bytes(out));
}
}  // namespace

void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) { gated("swiglu", gate, up, out, 5); }
void geglu(const Tensor& gate, const Tensor& up, const Tensor& out) { gated("geglu", gate, up, out, 9); }

void elementwise(const char* op, const Tensor& x, float factor, const char* what) {
  want(x, op, "x"), want_dtype(x, DType::F32, op, "x");
  IL_CHECK(std::isfinite(factor) && factor > 0, op, ": ", what, " must be positive and finite, got ", factor);
  metrics::count(op, 3.0 * static_cast<double>(x.numel()), 2 * bytes(x));
}

void embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  want(table, "embedding", "table"), want(ids, "embedding", "ids"), want(out, "embedding", "out");
  want_ndim(table, 2, "embedding", "table"), want_ndim(ids, 1, "embedding", "ids"), want_ndim(out, 2, "embedding", "out");
  want_weight_dtype(table, "embedding", "table"), want_dtype(ids, DType::I32, "embedding", "ids");
  want_dtype(out, DType::F32, "embedding", "out");
  same_device("embedding", {&table, &ids, &out});
  IL_CHECK(out.size(0) == ids.size(0) && out.size(1) == table.size(1), "embedding: out ", out.describe(), " should be [",
           ids.size(0), ", ", table.size(1), "]");
  // Token ids come from users and tokenizers: check every one (on the host; T is small).
  Tensor host_ids = ids.is_cuda() ? ids.to(Device::CPU) : ids;
  const std::int32_t* p = host_ids.data<std::int32_t>();
  for (std::int64_t t = 0; t < ids.size(0); ++t)
    IL_CHECK(p[t] >= 0 && p[t] < table.size(0), "embedding: token id ", p[t], " at position ", t,
             " is outside the vocabulary [0, ", table.size(0), ")");
  metrics::count("embedding", 0,
                 bytes(ids) + bytes(out) + static_cast<double>(ids.size(0) * table.size(1)) * dtype_size(table.dtype()));
}

namespace {

// What attention and attention_ragged check alike: q[T,Nq,Dqk], k[S,Nk,Dqk], v[S,Nk,Dv],
// out[T,Nq,Dv], query heads grouped over KV heads, and the options. Returns the options with
// the scale filled in.
AttentionParams attention_common(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const AttentionParams& p) {
  want(q, op, "q"), want(k, op, "k"), want(v, op, "v"), want(out, op, "out");
  want_ndim(q, 3, op, "q"), want_ndim(k, 3, op, "k"), want_ndim(v, 3, op, "v"), want_ndim(out, 3, op, "out");
  want_dtype(q, DType::F32, op, "q"), want_dtype(k, DType::F32, op, "k"), want_dtype(v, DType::F32, op, "v");
  want_dtype(out, DType::F32, op, "out");
  same_device(op, {&q, &k, &v, &out});
  const std::int64_t T = q.size(0), Nq = q.size(1), Dqk = q.size(2), S = k.size(0), Nk = k.size(1), Dv = v.size(2);
  IL_CHECK(k.size(2) == Dqk, op, ": q ", q.describe(), " and k ", k.describe(), " disagree on the head dimension");
  IL_CHECK(v.size(0) == S && v.size(1) == Nk, op, ": v ", v.describe(), " should have k's ", S, " rows and ", Nk,
           " heads (k is ", k.describe(), ")");
  IL_CHECK(out.size(0) == T && out.size(1) == Nq && out.size(2) == Dv, op, ": out ", out.describe(), " should be [", T, ", ",
           Nq, ", ", Dv, "] (q's rows and heads, v's head dimension)");
  IL_CHECK(Nk > 0 && Nq % Nk == 0, op, ": ", Nq, " query heads cannot be grouped over ", Nk, " KV heads");
  IL_CHECK(p.window >= 0, op, ": negative window ", p.window);
  IL_CHECK(p.causal || p.window == 0, op, ": a sliding window needs causal attention");
  IL_CHECK(std::isfinite(p.softcap) && p.softcap >= 0, op, ": softcap must be 0 (none) or positive, got ", p.softcap);
  // The CUDA kernels have no soft-capping: refused rather than computed without it.
  IL_CHECK(p.softcap == 0 || !q.is_cuda(), op,
           ": logit soft-capping (Gemma 2) runs on the CPU only; run the model with --device cpu");
  AttentionParams r = p;
  if (r.scale == 0.0f) r.scale = 1.0f / std::sqrt(static_cast<float>(Dqk));
  return r;
}

// How many keys the T queries of one sequence with S keys see in all.
double visible_keys(std::int64_t T, std::int64_t S, std::int64_t q_offset, const AttentionParams& p) {
  double visible = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    std::int64_t hi = p.causal ? q_offset + t : S - 1;
    std::int64_t lo = p.window > 0 ? std::max<std::int64_t>(0, hi - p.window + 1) : 0;
    visible += static_cast<double>(hi - lo + 1);
  }
  return visible;
}

// Work: every query head scores each key it sees (Dqk multiply-adds) and sums its value (Dv).
void count_attention(double visible, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) {
  metrics::count("attention", 2.0 * visible * static_cast<double>(q.size(1) * (q.size(2) + v.size(2))),
                 bytes(q) + bytes(k) + bytes(v) + bytes(out));
}

}  // namespace

AttentionParams attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const AttentionParams& p) {
  AttentionParams r = attention_common("attention", q, k, v, out, p);
  const std::int64_t T = q.size(0), S = k.size(0);
  IL_CHECK(S > 0, "attention: no keys (k is ", k.describe(), ")");
  if (r.q_offset < 0) r.q_offset = S - T;
  if (r.causal)
    IL_CHECK(r.q_offset >= 0 && r.q_offset + T <= S, "attention: queries at positions ", r.q_offset, "..",
             r.q_offset + T - 1, " need keys up to there, but only ", S, " keys were given");
  count_attention(visible_keys(T, S, r.q_offset, r), q, k, v, out);
  return r;
}

RaggedAttention attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const RaggedBatch& batch, const AttentionParams& p) {
  const char* op = "attention_ragged";
  RaggedAttention r{batch, attention_common(op, q, k, v, out, p)};
  IL_CHECK(p.q_offset < 0, op, ": AttentionParams::q_offset (", p.q_offset,
           ") does not apply to a batch; give RaggedBatch::q_offsets, one per sequence");
  const std::vector<std::int64_t>& qs = batch.q_starts;
  const std::vector<std::int64_t>& ks = batch.kv_starts;
  IL_CHECK(qs.size() >= 2 && ks.size() == qs.size(), op, ": q_starts and kv_starts need B + 1 entries each for B ",
           "sequences, got ", qs.size(), " and ", ks.size());
  const std::size_t B = qs.size() - 1;
  IL_CHECK(batch.q_offsets.empty() || batch.q_offsets.size() == B, op, ": q_offsets has ", batch.q_offsets.size(),
           " entries for ", B, " sequences (give one per sequence, or none for the default)");
  IL_CHECK(qs.front() == 0 && qs.back() == q.size(0), op, ": q_starts must run from 0 to q's ", q.size(0), " rows, got ",
           qs.front(), " .. ", qs.back());
  IL_CHECK(ks.front() == 0 && ks.back() == k.size(0), op, ": kv_starts must run from 0 to k's ", k.size(0), " rows, got ",
           ks.front(), " .. ", ks.back());
  r.batch.q_offsets.resize(B);
  double visible = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const std::int64_t T = qs[b + 1] - qs[b], S = ks[b + 1] - ks[b];
    IL_CHECK(T >= 0, op, ": q_starts must not decrease, but q_starts[", b + 1, "] = ", qs[b + 1], " < q_starts[", b,
             "] = ", qs[b]);
    IL_CHECK(S > 0, op, ": kv_starts must increase (every sequence needs keys), but kv_starts[", b + 1, "] = ", ks[b + 1],
             " <= kv_starts[", b, "] = ", ks[b]);
    const std::int64_t off = batch.q_offsets.empty() ? S - T : batch.q_offsets[b];
    if (r.params.causal)
      IL_CHECK(off >= 0 && off + T <= S, op, ": sequence ", b, "'s queries at positions ", off, "..", off + T - 1,
               " (q_offsets[", b, "] = ", off, ") need keys up to there, but it has only ", S, " keys");
    r.batch.q_offsets[b] = off;
    visible += visible_keys(T, S, off, r.params);
  }
  count_attention(visible, q, k, v, out);
  return r;
}

CachedAttention attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, const Tensor& out,
                                 const AttentionParams& p) {
  const char* op = "attention_cached";
  want(q, op, "q"), want(out, op, "out");
  want_ndim(q, 3, op, "q"), want_ndim(out, 3, op, "out");
  want_dtype(q, DType::F32, op, "q"), want_dtype(out, DType::F32, op, "out");
  same_device(op, {&q, &out});
  IL_CHECK(p.softcap == 0 || !q.is_cuda(), op,
           ": logit soft-capping (Gemma 2) runs on the CPU only; run the model with --device cpu");
  const std::int64_t T = q.size(0), Nq = q.size(1), Dqk = q.size(2);
  IL_CHECK(out.size(0) == T && out.size(1) == Nq, op, ": out ", out.describe(), " should have q's rows and heads (q is ",
           q.describe(), ")");
  IL_CHECK(p.q_offset < 0, op, ": AttentionParams::q_offset (", p.q_offset,
           ") does not apply to a batch; give each CachedKV's q_offset");
  IL_CHECK(p.window >= 0, op, ": negative window ", p.window);
  IL_CHECK(p.causal || p.window == 0, op, ": a sliding window needs causal attention");
  CachedAttention r{seqs, p};
  if (r.params.scale == 0.0f) r.params.scale = 1.0f / std::sqrt(static_cast<float>(Dqk));
  std::vector<std::pair<std::int64_t, std::int64_t>> rows;
  double visible = 0, kv_bytes = 0;
  for (std::size_t b = 0; b < r.seqs.size(); ++b) {
    CachedKV& s = r.seqs[b];
    want(s.k, op, "k"), want(s.v, op, "v");
    want_ndim(s.k, 3, op, "k"), want_ndim(s.v, 3, op, "v");
    want_dtype(s.k, DType::F32, op, "k"), want_dtype(s.v, DType::F32, op, "v");
    same_device(op, {&q, &s.k, &s.v});
    const std::int64_t Nk = s.k.size(1), rows_held = s.k.size(0), Tb = s.q_end - s.q_begin;
    IL_CHECK(s.k.size(2) == Dqk && s.v.size(0) == rows_held && s.v.size(1) == Nk && s.v.size(2) == out.size(2), op,
             ": sequence ", b, "'s k ", s.k.describe(), " and v ", s.v.describe(), " do not fit q ", q.describe(),
             " and out ", out.describe());
    IL_CHECK(Nk > 0 && Nq % Nk == 0, op, ": ", Nq, " query heads cannot be grouped over sequence ", b, "'s ", Nk,
             " KV heads");
    IL_CHECK(s.q_begin >= 0 && Tb >= 0 && s.q_end <= T, op, ": sequence ", b, "'s query rows ", s.q_begin, "..", s.q_end,
             " are not within q's ", T, " rows");
    IL_CHECK(s.length > 0, op, ": sequence ", b, " holds no positions");
    if (!s.table) {
      IL_CHECK(s.length <= rows_held, op, ": sequence ", b, " holds ", s.length, " positions in ", rows_held, " rows");
    } else {
      IL_CHECK(s.block_size > 0 && s.length <= static_cast<std::int64_t>(s.table->size()) * s.block_size, op, ": sequence ",
               b, " holds ", s.length, " positions, but its block table lists ", s.table->size(), " blocks of ",
               s.block_size);
      for (std::int64_t i = 0; i < (s.length + s.block_size - 1) / s.block_size; ++i) {
        const std::int64_t blk = (*s.table)[static_cast<std::size_t>(i)];
        IL_CHECK(blk >= 0 && (blk + 1) * s.block_size <= rows_held, op, ": sequence ", b, "'s block ", blk,
                 " is outside its storage of ", rows_held, " rows");
      }
    }
    if (s.q_offset < 0) s.q_offset = s.length - Tb;
    if (r.params.causal)
      IL_CHECK(s.q_offset >= 0 && s.q_offset + Tb <= s.length, op, ": sequence ", b, "'s queries at positions ", s.q_offset,
               "..", s.q_offset + Tb - 1, " need keys up to there, but it holds ", s.length);
    rows.emplace_back(s.q_begin, s.q_end);
    visible += visible_keys(Tb, s.length, s.q_offset, r.params);
    kv_bytes += static_cast<double>(s.length * Nk * (Dqk + s.v.size(2))) * sizeof(float);
  }
  std::sort(rows.begin(), rows.end());
  for (std::size_t i = 1; i < rows.size(); ++i)
    IL_CHECK(rows[i].first >= rows[i - 1].second, op, ": two sequences name query rows ", rows[i].first, "..",
             std::max(rows[i].first, rows[i - 1].second) - 1);
  // Work: as attention(); bytes: the queries and outputs once, and each sequence's cached rows once.
  metrics::count("attention", 2.0 * visible * static_cast<double>(Nq * (Dqk + out.size(2))),
                 bytes(q) + bytes(out) + kv_bytes);
  return r;
}

void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v) {
  const char* op = "store_cached";
  want(k, op, "k"), want(v, op, "v");
  want_ndim(k, 3, op, "k"), want_ndim(v, 3, op, "v");
  want_dtype(k, DType::F32, op, "k"), want_dtype(v, DType::F32, op, "v");
  if (batch.seqs().empty()) return;
  IL_CHECK(layer >= 0 && layer < batch.layers(), op, ": no layer ", layer, " in a batch of ", batch.layers());
  const Tensor &sk = batch.seqs()[0].k[0], &sv = batch.seqs()[0].v[0];
  IL_CHECK(k.device() == batch.device() && v.device() == batch.device(), op, ": k ", k.describe(), " and v ", v.describe(),
           " must be on the device of the caches (", device_name(batch.device()), ")");
  IL_CHECK(k.size(0) == batch.rows() && v.size(0) == batch.rows() && k.size(1) == sk.size(1) && k.size(2) == sk.size(2) &&
               v.size(1) == sv.size(1) && v.size(2) == sv.size(2),
           op, ": k ", k.describe(), " and v ", v.describe(), " should be the batch's ", batch.rows(),
           " rows of the caches' rows ", sk.describe(), " and ", sv.describe());
}

void argmax(const Tensor& x, const Tensor& out) {
  want(x, "argmax", "x"), want(out, "argmax", "out");
  want_ndim(x, 2, "argmax", "x"), want_ndim(out, 1, "argmax", "out");
  want_dtype(x, DType::F32, "argmax", "x"), want_dtype(out, DType::I32, "argmax", "out");
  same_device("argmax", {&x, &out});
  IL_CHECK(out.size(0) == x.size(0), "argmax: out ", out.describe(), " should have ", x.size(0), " entries");
  IL_CHECK(x.size(1) > 0, "argmax: rows of x ", x.describe(), " are empty");
  metrics::count("argmax", static_cast<double>(x.numel()), bytes(x) + bytes(out));
}

}  // namespace check

// ---------------------------------------------------------------------------------------------
// The per-step context of attention over a batch's caches (common/cached_batch.h).
CachedBatch::CachedBatch(std::vector<CachedSeq> seqs, std::int64_t rows, std::int64_t per)
    : seqs_(std::move(seqs)), rows_(rows) {
  using namespace cached_batch;
  const char* op = "cached batch";
  IL_CHECK(rows >= 0, op, ": ", rows, " query rows");
  IL_CHECK(per >= 1 && per <= kRange, op, ": ranges of ", per, " positions (1 to ", kRange, " allowed)");
  const std::int64_t B = static_cast<std::int64_t>(seqs_.size()), L = layers();
  words_.assign(kHeader, 0);
  words_[kSeqs] = B, words_[kRows] = rows, words_[kLayers] = L, words_[kPer] = per;
  std::vector<std::int64_t> owner(static_cast<std::size_t>(rows), -1), tables;
  for (std::int64_t b = 0; b < B; ++b) {
    CachedSeq& s = seqs_[static_cast<std::size_t>(b)];
    IL_CHECK(L > 0 && static_cast<std::int64_t>(s.k.size()) == L && static_cast<std::int64_t>(s.v.size()) == L, op,
             ": sequence ", b, " has ", s.k.size(), " layers of keys and ", s.v.size(), " of values; sequence 0 has ", L);
    std::int64_t held = -1;  // the fewest rows any layer's storage holds
    for (std::int64_t l = 0; l < L; ++l) {
      const Tensor &k = s.k[static_cast<std::size_t>(l)], &v = s.v[static_cast<std::size_t>(l)];
      want(k, op, "k"), want(v, op, "v"), want_ndim(k, 3, op, "k"), want_ndim(v, 3, op, "v");
      want_dtype(k, DType::F32, op, "k"), want_dtype(v, DType::F32, op, "v");
      const Tensor &k0 = seqs_[0].k[0], &v0 = seqs_[0].v[0];
      IL_CHECK(k.device() == k0.device() && v.device() == k0.device() && k.size(1) == k0.size(1) &&
                   k.size(2) == k0.size(2) && v.size(0) == k.size(0) && v.size(1) == v0.size(1) && v.size(2) == v0.size(2),
               op, ": sequence ", b, "'s layer ", l, " keeps k ", k.describe(), " and v ", v.describe(),
               ", unlike sequence 0's layer 0 (k ", k0.describe(), ", v ", v0.describe(), ")");
      held = held < 0 ? k.size(0) : std::min(held, k.size(0));
      aligned16_ = aligned16_ && reinterpret_cast<std::uintptr_t>(k.raw_data()) % 16 == 0 &&
                   reinterpret_cast<std::uintptr_t>(v.raw_data()) % 16 == 0;
    }
    const std::int64_t T = s.q_end - s.q_begin;
    IL_CHECK(s.q_begin >= 0 && T >= 0 && s.q_end <= rows, op, ": sequence ", b, "'s query rows ", s.q_begin, "..", s.q_end,
             " are not within the step's ", rows, " rows");
    IL_CHECK(s.length > 0, op, ": sequence ", b, " holds no positions");
    if (s.q_offset < 0) s.q_offset = s.length - T;
    IL_CHECK(s.q_offset >= 0 && s.q_offset + T <= s.length, op, ": sequence ", b, "'s rows at positions ", s.q_offset, "..",
             s.q_offset + T - 1, " are not among its ", s.length);
    std::int64_t table_at = -1;
    if (!s.table) {
      s.block_size = 1;
      IL_CHECK(s.length <= held, op, ": sequence ", b, " holds ", s.length, " positions in ", held, " rows");
    } else {
      const std::int64_t used = s.block_size > 0 ? (s.length + s.block_size - 1) / s.block_size : 0;
      IL_CHECK(s.block_size > 0 && used <= static_cast<std::int64_t>(s.table->size()), op, ": sequence ", b, " holds ",
               s.length, " positions, but its block table lists ", s.table->size(), " blocks of ", s.block_size);
      table_at = static_cast<std::int64_t>(tables.size());
      for (std::int64_t i = 0; i < used; ++i) {
        const std::int64_t blk = (*s.table)[static_cast<std::size_t>(i)];
        IL_CHECK(blk >= 0 && (blk + 1) * s.block_size <= held, op, ": sequence ", b, "'s block ", blk,
                 " is outside its storage of ", held, " rows");
        tables.push_back(blk);
      }
    }
    for (std::int64_t i = s.q_begin; i < s.q_end; ++i) {
      IL_CHECK(owner[static_cast<std::size_t>(i)] < 0, op, ": sequences ", owner[static_cast<std::size_t>(i)], " and ", b,
               " both name query row ", i);
      owner[static_cast<std::size_t>(i)] = b;
    }
    words_.insert(words_.end(), {s.q_begin, s.q_end, s.q_offset, s.length, table_at, s.block_size});
  }
  if (B > 0) {
    device_ = seqs_[0].k[0].device();
    const std::int64_t kw = seqs_[0].k[0].size(1) * seqs_[0].k[0].size(2),
                       vw = seqs_[0].v[0].size(1) * seqs_[0].v[0].size(2);
    aligned16_ = aligned16_ && kw % 4 == 0 && vw % 4 == 0;
  }
  words_[kRowsAt] = static_cast<std::int64_t>(words_.size());
  words_.insert(words_.end(), owner.begin(), owner.end());
  // A row's work items: its ranges of `per` positions over all of its sequence's positions, the
  // most any row can see (a causal row or a window sees fewer: its last items are empty).
  words_[kItemsAt] = static_cast<std::int64_t>(words_.size());
  std::int64_t items = 0;
  for (std::int64_t i = 0; i <= rows; ++i) {
    words_.push_back(items);
    const std::int64_t b = i < rows ? owner[static_cast<std::size_t>(i)] : -1;
    if (b >= 0) items += (seqs_[static_cast<std::size_t>(b)].length + per - 1) / per;
  }
  words_[kTablesAt] = static_cast<std::int64_t>(words_.size());
  words_.insert(words_.end(), tables.begin(), tables.end());
  auto addresses = [&](int at, bool keys) {
    words_[at] = static_cast<std::int64_t>(words_.size());
    for (std::int64_t l = 0; l < L; ++l)
      for (const CachedSeq& s : seqs_)
        words_.push_back(reinterpret_cast<std::int64_t>((keys ? s.k : s.v)[static_cast<std::size_t>(l)].raw_data()));
  };
  addresses(kKAt, true), addresses(kVAt, false);
  if (device_ == Device::CUDA)  // the one copy a step makes of it
    device_words_ = Tensor::from_vector(words_, {static_cast<std::int64_t>(words_.size())}).to(Device::CUDA);
}

std::int64_t CachedBatch::items() const { return cached_batch::View{words_.data()}.first_item(rows_); }

std::vector<CachedKV> CachedBatch::layer(std::int64_t l) const {
  IL_CHECK(l >= 0 && l < layers(), "cached batch: no layer ", l, " in a batch of ", layers());
  std::vector<CachedKV> out;
  out.reserve(seqs_.size());
  for (const CachedSeq& s : seqs_)
    out.push_back({s.k[static_cast<std::size_t>(l)], s.v[static_cast<std::size_t>(l)], s.table, s.block_size, s.length,
                   s.q_begin, s.q_end, s.q_offset});
  return out;
}

Tensor rope_inv_freq(std::int64_t rot_dim, double theta) {
  IL_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope_inv_freq: rotary dimension ", rot_dim, " must be positive and even");
  IL_CHECK(theta > 0, "rope_inv_freq: theta ", theta, " must be positive");
  std::vector<float> f(static_cast<std::size_t>(rot_dim / 2));
  for (std::size_t j = 0; j < f.size(); ++j)
    f[j] = static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(rot_dim)));
  return Tensor::from_vector(f, {rot_dim / 2});
}

double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

double yarn_attention_factor(const YarnScaling& y) {
  if (y.attention_factor != 0) return y.attention_factor;
  if (y.mscale != 0 && y.mscale_all_dim != 0)
    return yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim);
  return yarn_mscale(y.factor, 1.0);
}

Tensor yarn_inv_freq(std::int64_t rot_dim, double theta, const YarnScaling& y) {
  IL_CHECK(theta > 1, "yarn_inv_freq: theta ", theta, " must be above 1 (the ramp divides by ln theta)");
  IL_CHECK(y.factor > 0 && y.original_context > 0 && y.beta_fast > 0 && y.beta_slow > 0, "yarn_inv_freq: factor (", y.factor,
           "), original context (", y.original_context, "), beta_fast (", y.beta_fast, ") and beta_slow (", y.beta_slow,
           ") must be positive");
  Tensor f = rope_inv_freq(rot_dim, theta);
  const double d = static_cast<double>(rot_dim);
  // The pair index whose wavelength fits `turns` times into the original context.
  auto pair_turning = [&](double turns) {
    return d * std::log(y.original_context / (turns * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double lo = pair_turning(y.beta_fast), hi = pair_turning(y.beta_slow);
  if (y.truncate) lo = std::floor(lo), hi = std::ceil(hi);
  lo = std::max(lo, 0.0), hi = std::min(hi, d - 1);
  if (lo == hi) hi += 0.001;  // as transformers does, so the ramp never divides by zero
  float* p = f.data<float>();
  for (std::int64_t j = 0; j < f.numel(); ++j) {
    const double plain = std::pow(theta, -2.0 * static_cast<double>(j) / d);
    const double ramp = std::clamp((static_cast<double>(j) - lo) / (hi - lo), 0.0, 1.0);  // 0: keep, 1: interpolate
    p[j] = static_cast<float>(plain / y.factor * ramp + plain * (1 - ramp));
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// Dispatch. Most elementwise ops have no faster CPU version than their reference loop (they are
// limited by memory, not arithmetic): on CPU tensors ops:: runs ref::, which does the checks.
// add and swiglu run cpu::'s threaded loops, with the same bits as ref::.
namespace ops {

void matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  check::matmul(x, w, out);
  x.is_cuda() ? cuda::matmul(x, w, out) : cpu::matmul(x, w, out);
}
void matmuls(const Tensor& x, const std::vector<const Tensor*>& ws, const std::vector<Tensor*>& outs) {
  IL_CHECK(ws.size() == outs.size(), "matmuls: ", ws.size(), " weights but ", outs.size(), " outputs");
  for (std::size_t j = 0; j < ws.size(); ++j) check::matmul(x, *ws[j], *outs[j]);
  if (!x.is_cuda()) return cpu::matmuls(x, ws, outs);
  for (std::size_t j = 0; j < ws.size(); ++j) cuda::matmul(x, *ws[j], *outs[j]);
}
Tensor matmul(const Tensor& x, const Tensor& w) {
  Tensor out = Tensor::empty({x.size(0), w.size(0)}, DType::F32, x.device());
  matmul(x, w, out);
  return out;
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  check::add(a, b, out);
  a.is_cuda() ? cuda::add(a, b, out) : cpu::add(a, b, out);
}
Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), DType::F32, a.device());
  add(a, b, out);
  return out;
}

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  if (!x.is_cuda()) return ref::rmsnorm(x, w, eps, out);
  check::rmsnorm(x, w, out);
  cuda::rmsnorm(x, w, eps, out);
}
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  Tensor out = Tensor::empty(x.shape(), DType::F32, x.device());
  rmsnorm(x, w, eps, out);
  return out;
}

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing, std::int64_t begin) {
  if (!x.is_cuda()) return ref::rope(x, positions, inv_freq, pairing, begin);
  check::rope(x, positions, inv_freq, begin);
  cuda::rope(x, positions, inv_freq, pairing, begin);
}

void softmax(const Tensor& x, Tensor& out) {
  if (!x.is_cuda()) return ref::softmax(x, out);
  check::softmax(x, out);
  cuda::softmax(x, out);
}
Tensor softmax(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), DType::F32, x.device());
  softmax(x, out);
  return out;
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  check::swiglu(gate, up, out);
  gate.is_cuda() ? cuda::swiglu(gate, up, out) : cpu::swiglu(gate, up, out);
}
Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = Tensor::empty(gate.shape(), DType::F32, gate.device());
  swiglu(gate, up, out);
  return out;
}

// Gemma's pieces have no CUDA kernels: a model that needs them runs on the CPU.
void geglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  IL_CHECK(!gate.is_cuda(), "geglu (Gemma's MLP) runs on the CPU only; run the model with --device cpu");
  ref::geglu(gate, up, out);
}
Tensor geglu(const Tensor& gate, const Tensor& up) {
  Tensor out = Tensor::empty(gate.shape(), DType::F32, gate.device());
  geglu(gate, up, out);
  return out;
}
void softcap(Tensor& x, float cap) {
  IL_CHECK(!x.is_cuda(), "softcap (Gemma 2's logit soft-capping) runs on the CPU only; run the model with --device cpu");
  ref::softcap(x, cap);
}
void scale(Tensor& x, float s) {
  IL_CHECK(!x.is_cuda(), "scale (Gemma's embedding multiplier) runs on the CPU only; run the model with --device cpu");
  ref::scale(x, s);
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  if (!table.is_cuda()) return ref::embedding(table, ids, out);
  check::embedding(table, ids, out);
  cuda::embedding(table, ids, out);
}
Tensor embedding(const Tensor& table, const Tensor& ids) {
  Tensor out = Tensor::empty({ids.size(0), table.size(1)}, DType::F32, table.device());
  embedding(table, ids, out);
  return out;
}

namespace {
// [T, Nq, Dv]; wrong ranks are left for the checks to report.
Tensor attention_out(const Tensor& q, const Tensor& v) {
  Shape shape = q.shape();
  if (q.ndim() == 3 && v.ndim() == 3) shape[2] = v.size(2);
  return Tensor::empty(shape, DType::F32, q.device());
}
}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p) {
  const AttentionParams r = check::attention(q, k, v, out, p);
  // One sequence is a batch of one: the backends implement only the batch.
  const RaggedBatch one{{0, q.size(0)}, {0, k.size(0)}, {r.q_offset}};
  q.is_cuda() ? cuda::attention(q, k, v, out, one, r) : cpu::attention(q, k, v, out, one, r);
}
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  Tensor out = attention_out(q, v);
  attention(q, k, v, out, p);
  return out;
}

void attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
                      const AttentionParams& p) {
  const check::RaggedAttention r = check::attention_ragged(q, k, v, out, batch, p);
  q.is_cuda() ? cuda::attention(q, k, v, out, r.batch, r.params) : cpu::attention(q, k, v, out, r.batch, r.params);
}
Tensor attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, const RaggedBatch& batch,
                        const AttentionParams& p) {
  Tensor out = attention_out(q, v);
  attention_ragged(q, k, v, out, batch, p);
  return out;
}

void attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, Tensor& out, const AttentionParams& p) {
  const check::CachedAttention r = check::attention_cached(q, seqs, out, p);
  if (!q.is_cuda()) return cpu::attention_cached(q, r.seqs, out, r.params);
  if (r.seqs.empty()) return;
  std::vector<CachedSeq> one_layer;
  for (const CachedKV& s : r.seqs)
    one_layer.push_back({{s.k}, {s.v}, s.table, s.block_size, s.length, s.q_begin, s.q_end, s.q_offset});
  cuda::attention_cached(q, CachedBatch(std::move(one_layer), q.size(0)), 0, out, r.params);
}

void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v) {
  check::store_cached(batch, layer, k, v);
  if (batch.seqs().empty()) return;
  batch.device() == Device::CUDA ? cuda::store_cached(batch, layer, k, v) : cpu::store_cached(batch, layer, k, v);
}

void attention_cached(const Tensor& q, const CachedBatch& batch, std::int64_t layer, Tensor& out, const AttentionParams& p) {
  if (batch.seqs().empty()) return;
  const check::CachedAttention r = check::attention_cached(q, batch.layer(layer), out, p);
  IL_CHECK(q.device() == batch.device(), "attention_cached: q ", q.describe(), " and the caches (",
           device_name(batch.device()), ") are on different devices");
  q.is_cuda() ? cuda::attention_cached(q, batch, layer, out, r.params) : cpu::attention_cached(q, r.seqs, out, r.params);
}

void argmax(const Tensor& x, Tensor& out) {
  if (!x.is_cuda()) return ref::argmax(x, out);
  check::argmax(x, out);
  cuda::argmax(x, out);
}
Tensor argmax(const Tensor& x) {
  Tensor out = Tensor::empty({x.size(0)}, DType::I32, x.device());
  argmax(x, out);
  return out;
}

}  // namespace ops
}  // namespace inferlab
