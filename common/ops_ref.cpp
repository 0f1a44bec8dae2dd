// ref:: — the reference loops: each op written the way the lecture writes its formula, after the
// same checks as ops::. Single-threaded, float32 arithmetic, no tricks. Every faster version is
// tested against these, and ops:: runs the elementwise ones as they are on CPU tensors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "common/lab.h"
#include "common/ops.h"
#include "common/ops_cpu.h"  // weight_at

namespace inferlab {
namespace {

using cpu::weight_at;

void cpu_only(const Tensor& t, const char* op) { IL_CHECK(!t.is_cuda(), op, " runs on the CPU only"); }

// One query row t of one head h:  out = sum_j softmax_j(scale * q·k_j) v_j over the visible keys.
// `scratch` holds at least S floats.
void attention_row(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p, std::int64_t t,
                   std::int64_t h, float* scratch) {
  const std::int64_t Nq = q.size(1), Dqk = q.size(2), S = k.size(0), Nk = k.size(1), Dv = v.size(2);
  const std::int64_t kvh = h / (Nq / Nk);  // the KV head this query head reads (GQA grouping)
  const std::int64_t hi = p.causal ? p.q_offset + t : S - 1;
  const std::int64_t lo = p.window > 0 ? std::max<std::int64_t>(0, hi - p.window + 1) : 0;
  const float* qr = q.data<float>() + (t * Nq + h) * Dqk;
  const float* K = k.data<float>();
  const float* V = v.data<float>();
  float* o = out.data<float>() + (t * Nq + h) * Dv;
  // EXERCISE 01.3 BEGIN: one row of attention: scores, softmax, weighted sum of values
  float mx = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = lo; j <= hi; ++j) {
    const float* kr = K + (j * Nk + kvh) * Dqk;
    float s = 0.0f;
    for (std::int64_t d = 0; d < Dqk; ++d) s += qr[d] * kr[d];
    scratch[j] = s * p.scale;
    if (p.softcap > 0) scratch[j] = p.softcap * std::tanh(scratch[j] / p.softcap);  // Gemma 2's cap
    mx = std::max(mx, scratch[j]);
  }
  float sum = 0.0f;
  for (std::int64_t j = lo; j <= hi; ++j) sum += (scratch[j] = std::exp(scratch[j] - mx));
  for (std::int64_t d = 0; d < Dv; ++d) o[d] = 0.0f;
  for (std::int64_t j = lo; j <= hi; ++j) {
    const float pj = scratch[j] / sum;
    const float* vr = V + (j * Nk + kvh) * Dv;
    for (std::int64_t d = 0; d < Dv; ++d) o[d] += pj * vr[d];
  }
  // EXERCISE 01.3 STUB
  // (void)qr, (void)K, (void)V, (void)o, (void)scratch, (void)lo, (void)kvh;
  // lab::not_done("01.3", "write o = sum over the visible keys j = lo .. hi of softmax_j(scale · q·k_j) v_j, "
  //                       "with the row's maximum subtracted before exp; scratch holds the scores");
  // EXERCISE 01.3 END
}

// Every query row of every head of one sequence.
void attention_rows(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p) {
  std::vector<float> scratch(static_cast<std::size_t>(std::max<std::int64_t>(k.size(0), 1)));
  for (std::int64_t t = 0; t < q.size(0); ++t)
    for (std::int64_t h = 0; h < q.size(1); ++h) attention_row(q, k, v, out, p, t, h, scratch.data());
}

}  // namespace

namespace ref {

// y[m][n] = sum_k x[m][k] * w[n][k]
void matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  check::matmul(x, w, out);
  cpu_only(x, "ref::matmul");
  const std::int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const float* X = x.data<float>();
  float* Y = out.data<float>();
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < K; ++k) acc += X[m * K + k] * weight_at(w.raw_data(), w.dtype(), n * K + k);
      Y[m * N + n] = acc;
    }
}

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  check::add(a, b, out);
  cpu_only(a, "ref::add");
  const std::int64_t n = a.numel(), bn = b.numel();
  const float *A = a.data<float>(), *B = b.data<float>();
  float* O = out.data<float>();
  for (std::int64_t i = 0; i < n; ++i) O[i] = A[i] + B[i % bn];
}

// out = x / sqrt(mean(x^2) + eps) * w, row by row
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  check::rmsnorm(x, w, out);
  cpu_only(x, "ref::rmsnorm");
  const std::int64_t D = x.size(-1), rows = x.numel() / D;
  const float* X = x.data<float>();
  float* O = out.data<float>();
  // EXERCISE 01.1 BEGIN: RMSNorm
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = X + r * D;
    float ss = 0.0f;
    for (std::int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    for (std::int64_t i = 0; i < D; ++i) O[r * D + i] = xr[i] * inv_rms * weight_at(w.raw_data(), w.dtype(), i);
  }
  // EXERCISE 01.1 STUB
  // (void)X, (void)O, (void)rows, (void)D;
  // lab::not_done("01.1", "for each of the rows of X (D floats each), write O = x / sqrt(mean(x^2) + eps) * w; "
  //                       "weight_at(w.raw_data(), w.dtype(), i) reads w[i] whatever its dtype");
  // EXERCISE 01.1 END
}

// Rotate pairs (a, b) by angle pos * inv_freq[j]:  a' = a cos - b sin,  b' = a sin + b cos.
// Within the rotated dimensions begin .. begin + rot - 1, HalfSplit pairs element j with
// j + rot/2; Adjacent pairs 2j with 2j + 1.
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing, std::int64_t begin) {
  check::rope(x, positions, inv_freq, begin);
  cpu_only(x, "ref::rope");
  const std::int64_t T = x.size(0), heads = x.size(1), D = x.size(2), half = inv_freq.size(0);
  const std::int32_t* pos = positions.data<std::int32_t>();
  const float* f = inv_freq.data<float>();
  float* X = x.data<float>();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t j = 0; j < half; ++j) {
      // The angle in double: at position 100k a float angle would already be off by ~0.01 rad.
      const double angle = static_cast<double>(pos[t]) * static_cast<double>(f[j]);
      const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      // EXERCISE 01.2 BEGIN: the RoPE rotation of one pair in every head
      for (std::int64_t h = 0; h < heads; ++h) {
        float* row = X + (t * heads + h) * D + begin;
        const std::int64_t ia = pairing == RopePairing::HalfSplit ? j : 2 * j;
        const std::int64_t ib = pairing == RopePairing::HalfSplit ? j + half : 2 * j + 1;
        const float a = row[ia], b = row[ib];
        row[ia] = a * c - b * s;
        row[ib] = a * s + b * c;
      }
      // EXERCISE 01.2 STUB
      // (void)c, (void)s, (void)X, (void)heads, (void)D, (void)pairing;
      // lab::not_done("01.2", "in every head h of row t, rotate the pair (a, b) = (x[ia], x[ib]) by the angle: "
      //                       "a' = a cos - b sin, b' = a sin + b cos; HalfSplit pairs j with j + half, "
      //                       "Adjacent pairs 2j with 2j + 1 (offsets from `begin`)");
      // EXERCISE 01.2 END
    }
}

// softmax(x)_i = exp(x_i - max x) / sum_j exp(x_j - max x)
void softmax(const Tensor& x, Tensor& out) {
  check::softmax(x, out);
  cpu_only(x, "ref::softmax");
  const std::int64_t N = x.size(-1), rows = x.numel() / N;
  const float* X = x.data<float>();
  float* O = out.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = X + r * N;
    float* orow = O + r * N;
    float mx = -std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < N; ++i) mx = std::max(mx, xr[i]);
    float sum = 0.0f;
    for (std::int64_t i = 0; i < N; ++i) sum += (orow[i] = std::exp(xr[i] - mx));
    for (std::int64_t i = 0; i < N; ++i) orow[i] /= sum;
  }
}

// silu(g) * u
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  check::swiglu(gate, up, out);
  cpu_only(gate, "ref::swiglu");
  const std::int64_t n = gate.numel();
  const float *G = gate.data<float>(), *U = up.data<float>();
  float* O = out.data<float>();
  for (std::int64_t i = 0; i < n; ++i) O[i] = G[i] / (1.0f + std::exp(-G[i])) * U[i];
}

// gelu_tanh(g) * u, GELU in its tanh approximation (Hendrycks & Gimpel 2016), as torch's
// gelu(approximate="tanh") computes it.
void geglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  check::geglu(gate, up, out);
  cpu_only(gate, "ref::geglu");
  const std::int64_t n = gate.numel();
  const float *G = gate.data<float>(), *U = up.data<float>();
  float* O = out.data<float>();
  const float k = std::sqrt(2.0f / std::numbers::pi_v<float>);
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = G[i];
    O[i] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * U[i];
  }
}

// c · tanh(x / c): close to x while |x| is well below c, never beyond ±c.
void softcap(Tensor& x, float cap) {
  check::elementwise("softcap", x, cap, "the cap");
  cpu_only(x, "ref::softcap");
  float* X = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) X[i] = cap * std::tanh(X[i] / cap);
}

void scale(Tensor& x, float s) {
  check::elementwise("scale", x, s, "the factor");
  cpu_only(x, "ref::scale");
  float* X = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) X[i] *= s;
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  check::embedding(table, ids, out);
  cpu_only(table, "ref::embedding");
  const std::int64_t T = ids.size(0), D = table.size(1);
  const std::int32_t* id = ids.data<std::int32_t>();
  float* O = out.data<float>();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < D; ++i) O[t * D + i] = weight_at(table.raw_data(), table.dtype(), id[t] * D + i);
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p) {
  const AttentionParams r = check::attention(q, k, v, out, p);
  cpu_only(q, "ref::attention");
  attention_rows(q, k, v, out, r);
}

// Each sequence of the batch is an attention call of its own, on its rows of q, k, v and out.
void attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
                      const AttentionParams& p) {
  const auto [seqs, r] = check::attention_ragged(q, k, v, out, batch, p);
  cpu_only(q, "ref::attention_ragged");
  for (std::size_t b = 0; b < seqs.q_offsets.size(); ++b) {
    AttentionParams rb = r;
    rb.q_offset = seqs.q_offsets[b];
    const std::int64_t q0 = seqs.q_starts[b], q1 = seqs.q_starts[b + 1];
    const std::int64_t k0 = seqs.kv_starts[b], k1 = seqs.kv_starts[b + 1];
    Tensor o = out.slice(0, q0, q1);
    attention_rows(q.slice(0, q0, q1), k.slice(0, k0, k1), v.slice(0, k0, k1), o, rb);
  }
}

// Each sequence's cached positions gathered into rows 0 .. length − 1, then attention as one call.
void attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, Tensor& out, const AttentionParams& p) {
  const auto [resolved, r] = check::attention_cached(q, seqs, out, p);
  for (const CachedKV& s : resolved) {
    const std::int64_t Nk = s.k.size(1), Dqk = s.k.size(2), Dv = s.v.size(2);
    Tensor k = Tensor::empty({s.length, Nk, Dqk}, DType::F32), v = Tensor::empty({s.length, Nk, Dv}, DType::F32);
    for (std::int64_t pos = 0; pos < s.length; ++pos) {
      const std::int64_t row =
          !s.table ? pos : (*s.table)[static_cast<std::size_t>(pos / s.block_size)] * s.block_size + pos % s.block_size;
      k.slice(0, pos, pos + 1).copy_from(s.k.slice(0, row, row + 1));
      v.slice(0, pos, pos + 1).copy_from(s.v.slice(0, row, row + 1));
    }
    AttentionParams rb = r;
    rb.q_offset = s.q_offset;
    Tensor o = out.slice(0, s.q_begin, s.q_end);
    attention_rows(q.slice(0, s.q_begin, s.q_end), k, v, o, rb);
  }
}

// First index of the maximum; NaN counts as the maximum.
void argmax(const Tensor& x, Tensor& out) {
  check::argmax(x, out);
  cpu_only(x, "ref::argmax");
  const std::int64_t M = x.size(0), N = x.size(1);
  const float* X = x.data<float>();
  std::int32_t* O = out.data<std::int32_t>();
  for (std::int64_t m = 0; m < M; ++m) {
    const float* r = X + m * N;
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < N && !std::isnan(r[best]); ++i)
      if (std::isnan(r[i]) || r[i] > r[best]) best = i;
    O[m] = static_cast<std::int32_t>(best);
  }
}

}  // namespace ref
}  // namespace inferlab
