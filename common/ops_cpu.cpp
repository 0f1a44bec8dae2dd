// The fast CPU paths: a threaded GEMV for decode, Eigen GEMM for prefill, threaded attention.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>
#include <Eigen/Core>

#include "common/cached_batch.h"
#include "common/ops_cpu.h"

namespace inferlab::cpu {

namespace {

using namespace simd;

// Up to this many rows, matmul streams each weight row and dots it with eight x rows at a time
// (decode, also batched: the weight reads are the whole cost). Beyond it, Eigen's GEMM, which
// blocks for the caches and wins once there is enough arithmetic per weight.
constexpr std::int64_t kGemvMaxRows = 32;
// Below this many multiply-adds an op runs on one thread: waking a team of threads costs
// microseconds, and when the machine is busy a descheduled thread can stall the whole team for
// a scheduler time slice. Tiny models must not pay that on every op.
constexpr std::int64_t kParallelWork = 1 << 18;
// Attention splits over KV heads, and each task's work is its heads' keys read once: a decode
// step over a few dozen cached positions of a 100M-parameter model already pays for the wake-up
// (the tiny zoo models stay on one thread below 128 positions). Every head's sums run in the same
// order either way, so the result is the same bit for bit.
constexpr std::int64_t kParallelAttention = 1 << 15;

// Elementwise ops split over the threads from this many elements: an add reads and writes 12
// bytes an element at memory's pace (a [32, 1024] residual add, 128 KB, takes microseconds,
// about what waking the threads costs); swiglu spends an expf an element.
constexpr std::int64_t kParallelElements = 1 << 18;
constexpr std::int64_t kParallelExp = 1 << 12;

// dot_rows for any weight type dots<> reads: eight x rows at a time, the weight row hot in L1
// for the later groups.
template <class W>
void dot_rows_of(const float* x, std::int64_t M, std::int64_t K, const W* w, float* y, std::int64_t y_stride) {
  for (std::int64_t m0 = 0; m0 < M; m0 += 8) {
    const float* xm = x + m0 * K;
    float* ym = y + m0 * y_stride;
    switch (std::min<std::int64_t>(8, M - m0)) {
      case 1: dots<1>(xm, K, w, ym, y_stride); break;
      case 2: dots<2>(xm, K, w, ym, y_stride); break;
      case 3: dots<3>(xm, K, w, ym, y_stride); break;
      case 4: dots<4>(xm, K, w, ym, y_stride); break;
      case 5: dots<5>(xm, K, w, ym, y_stride); break;
      case 6: dots<6>(xm, K, w, ym, y_stride); break;
      case 7: dots<7>(xm, K, w, ym, y_stride); break;
      default: dots<8>(xm, K, w, ym, y_stride); break;
    }
  }
}

// Weight rows n and n + 1 against all M rows of x, for M = 5 or 6 (a verification pass at γ = 4
// or 5): with U = 1 their 2·M accumulators still fit the registers.
template <class W>
void two_rows_of(const float* x, std::int64_t M, std::int64_t K, const W* w, float* y, std::int64_t y_stride) {
  if (M == 5) dots<5, W, 2>(x, K, w, y, y_stride);
  else dots<6, W, 2>(x, K, w, y, y_stride);
}

// ---- the tiled version for 8 to 32 rows ----------------------------------------------------------
typedef Lanes<16>::f32 f32x16;

// Weight rows w .. w + 3K against x rows x .. x + 7K: each step loads 4 weight vectors and 8 x
// vectors for 32 multiply-adds of 16 lanes (the rows kernel: 1 weight vector and 8 x vectors for
// 8). y[m·y_stride + r] gets x row m against weight row r; the K tail is added in order at the end.
template <class W>
void tile_4x8(const float* x, std::int64_t K, const W* w, float* y, std::int64_t y_stride) {
  constexpr int R = 4, M = 8;
  f32x16 acc[R][M] = {};
  std::int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    f32x16 wv[R];
    for (int r = 0; r < R; ++r) {
      ask_for(reinterpret_cast<const char*>(w + r * K + k) + kPrefetchBytes, 64);
      wv[r] = load<16>(w + r * K + k);
    }
    for (int m = 0; m < M; ++m) {
      const f32x16 xv = load<16>(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] += xv * wv[r];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) {
      float s = 0.0f;
      for (int i = 0; i < 16; ++i) s += acc[r][m][i];
      for (std::int64_t j = k; j < K; ++j) s += x[m * K + j] * widen(w[r * K + j]);
      y[m * y_stride + r] = s;
    }
}

std::atomic<BatchGemv> g_batch_gemv{kDefaultBatchGemv};

// M ≥ 8 rows by f32 or bf16 weights, four weight rows a task: the full groups of eight x rows by
// tile_4x8, the rest of x's rows (and the last N mod 4 weight rows) by the rows kernel.
template <class W>
void gemv_tiles(const float* X, std::int64_t M, std::int64_t K, const W* w, std::int64_t N, float* Y) {
  const std::int64_t M8 = M / 8 * 8, N4 = N / 4 * 4;
#pragma omp parallel for schedule(static) if (M * N * K >= kParallelWork)
  for (std::int64_t i = 0; i < N4 / 4; ++i) {
    const std::int64_t n = 4 * i;
    for (std::int64_t m0 = 0; m0 < M8; m0 += 8) tile_4x8(X + m0 * K, K, w + n * K, Y + m0 * N + n, N);
    if (M8 < M)
      for (std::int64_t r = 0; r < 4; ++r) dot_rows_of(X + M8 * K, M - M8, K, w + (n + r) * K, Y + M8 * N + n + r, N);
  }
  for (std::int64_t n = N4; n < N; ++n) dot_rows_of(X, M, K, w + n * K, Y + n, N);
}

// ---- the broadcast version: the batch's rows in the lanes ---------------------------------------
// x is transposed once into xt[k·16V + m] (V vectors of 16 rows; zero past M). Then each weight
// w[n, k] is broadcast and multiplied into all of the batch's rows at once, R weight rows at a
// time: R·V accumulators whose lanes are rows of x, so no lane sums are left at the end, every
// weight is read once, and each y[m, n] is summed over k in order, as the reference loop does.
// Per k the loop loads V vectors of xt and R weights for R·V multiply-adds; x is read from L1 or
// L2 as a stream of 64·V bytes per k, where the tiles re-read eight whole rows of x per weight
// group and run out of L1.
template <int R, int V>
void broadcast_rows(const float* xt, std::int64_t K, const float* w, float* y, std::int64_t M, std::int64_t N) {
  f32x16 acc[R][V] = {};
  std::int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
#pragma GCC unroll 16  // the whole line of each weight row: one pointer step a row per 16 k
    for (int kk = 0; kk < 16; ++kk) {
      f32x16 xv[V];
      for (int v = 0; v < V; ++v) xv[v] = load<16>(xt + (k + kk) * 16 * V + 16 * v);
      for (int r = 0; r < R; ++r) {
        const float s = w[r * K + k + kk];
        for (int v = 0; v < V; ++v) acc[r][v] += xv[v] * s;
      }
    }
  }
  for (; k < K; ++k) {
    for (int v = 0; v < V; ++v) {
      const f32x16 xv = load<16>(xt + k * 16 * V + 16 * v);
      for (int r = 0; r < R; ++r) acc[r][v] += xv * w[r * K + k];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v)
      for (int i = 0; i < 16 && 16 * v + i < M; ++i) y[(16 * v + i) * N + r] = acc[r][v][i];
}

// M ≥ 8 rows by f32 weights: V = 1 for up to 16 rows, V = 2 for up to 32, 8 weight rows a task
// (8·V accumulators). More rows a task (24 and 12 were tried) run slower: the compiler keeps
// each row's pointer in a register and moves accumulators around; and a software prefetch of the
// R rows' next lines is slower than the hardware's own (measured on the 100M shape's layers).
// The threads transpose x together, a stretch of k each, before they share out the weight rows.
template <int V>
void gemv_broadcast(const float* X, std::int64_t M, std::int64_t K, const float* w, std::int64_t N, float* Y) {
  constexpr int R = 8;
  constexpr std::int64_t kStretch = 64;  // values of k a transposing task
  // A tensor's storage starts on a cache line, so no load of 16 lanes straddles two lines (in a
  // std::vector, aligned to 16 bytes, every load of x touched two, and the kernel ran 15% slower).
  thread_local Tensor buffer;
  if (buffer.numel() < K * 16 * V) buffer = Tensor::empty({K * 16 * V}, DType::F32);
  float* xt = buffer.data<float>();
  const std::int64_t tiles = N / R;
#pragma omp parallel if (M * N * K >= kParallelWork)
  {
#pragma omp for schedule(static)
    for (std::int64_t k0 = 0; k0 < K; k0 += kStretch)
      for (std::int64_t k = k0; k < std::min(K, k0 + kStretch); ++k)
        for (std::int64_t m = 0; m < 16 * V; ++m) xt[k * 16 * V + m] = m < M ? X[m * K + k] : 0.0f;
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < tiles; ++i) broadcast_rows<R, V>(xt, K, w + i * R * K, Y + i * R, M, N);
  }
  for (std::int64_t n = tiles * R; n < N; ++n) broadcast_rows<1, V>(xt, K, w + n * K, Y + n, M, N);
}

// gemv for one weight type: the tiles from 8 rows of x, else the rows kernel (two weight rows a
// task for 5 or 6 rows of x).
template <class W>
void gemv_of(const float* X, std::int64_t M, std::int64_t K, const W* w, std::int64_t N, float* Y) {
  if (M >= 8 && g_batch_gemv.load(std::memory_order_relaxed) != BatchGemv::Rows) return gemv_tiles(X, M, K, w, N, Y);
  const std::int64_t pair = M == 5 || M == 6 ? 2 : 1;  // weight rows a task
#pragma omp parallel for schedule(static) if (M * N * K >= kParallelWork)
  for (std::int64_t i = 0; i < (N + pair - 1) / pair; ++i) {
    const std::int64_t n = i * pair;
    const W* row = w + n * K;
    pair == 2 && n + 1 < N ? two_rows_of(X, M, K, row, Y + n, N) : dot_rows_of(X, M, K, row, Y + n, N);
  }
}

// Up to kGemvMaxRows rows: each weight row is streamed from memory once and dotted with every row
// of x, eight at a time; with 5 or 6 rows, two weight rows at a time.
void gemv(const Tensor& x, const Tensor& w, Tensor& out) {
  const std::int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const float* X = x.data<float>();
  float* Y = out.data<float>();
  const DType wt = w.dtype();
  const BatchGemv version = g_batch_gemv.load(std::memory_order_relaxed);
  if (M >= 8 && wt == DType::F32 &&
      (version == BatchGemv::Broadcast || (version == BatchGemv::Auto && M >= kBroadcastMinRows)))
    return M <= 16 ? gemv_broadcast<1>(X, M, K, w.data<float>(), N, Y) : gemv_broadcast<2>(X, M, K, w.data<float>(), N, Y);
  switch (wt) {
    case DType::F32: return gemv_of(X, M, K, w.data<float>(), N, Y);
    case DType::BF16: return gemv_of(X, M, K, w.data<std::uint16_t>(), N, Y);
    default: return gemv_of(X, M, K, reinterpret_cast<const Half*>(w.data<std::uint16_t>()), N, Y);  // F16
  }
}

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Eigen threads its GEMM on its own; below this many multiply-adds (a few milliseconds of one
// core's work) it is told to use one thread, for the reason given at kParallelWork.
constexpr std::int64_t kParallelGemm = std::int64_t{1} << 24;

void gemm_threads(const Tensor& x, const Tensor& w, Tensor& out);

void gemm(const Tensor& x, const Tensor& w, Tensor& out) {
  if (x.size(0) * x.size(1) * w.size(0) >= kParallelGemm) return gemm_threads(x, w, out);
  Eigen::setNbThreads(1);
  gemm_threads(x, w, out);
  Eigen::setNbThreads(0);  // back to following OpenMP (restoring nbThreads() would pin today's count)
}

void gemm_threads(const Tensor& x, const Tensor& w, Tensor& out) {
  const std::int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  Eigen::Map<const RowMajor> X(x.data<float>(), M, K);
  Eigen::Map<RowMajor> Y(out.data<float>(), M, N);
  if (w.dtype() == DType::F32) {
    Eigen::Map<const RowMajor> W(w.data<float>(), N, K);
    Y.noalias() = X * W.transpose();
    return;
  }
  // 16-bit weights: widen a block of rows at a time to f32, then GEMM that block.
  constexpr std::int64_t kBlock = 256;
  RowMajor wb(std::min(kBlock, N), K);
  for (std::int64_t n0 = 0; n0 < N; n0 += kBlock) {
    const std::int64_t nb = std::min(kBlock, N - n0);
#pragma omp parallel for schedule(static) if (nb * K >= kParallelWork)
    for (std::int64_t r = 0; r < nb; ++r)
      for (std::int64_t k = 0; k < K; ++k) wb(r, k) = weight_at(w.raw_data(), w.dtype(), (n0 + r) * K + k);
    Y.middleCols(n0, nb).noalias() = X * wb.topRows(nb).transpose();
  }
}

}  // namespace

void dot_rows(const float* x, std::int64_t M, std::int64_t K, const float* w, float* y, std::int64_t y_stride) {
  dot_rows_of(x, M, K, w, y, y_stride);
}
void dot_rows(const float* x, std::int64_t M, std::int64_t K, const std::int8_t* w, float* y, std::int64_t y_stride) {
  dot_rows_of(x, M, K, w, y, y_stride);
}

void set_batch_gemv(BatchGemv k) { g_batch_gemv.store(k, std::memory_order_relaxed); }
BatchGemv batch_gemv() { return g_batch_gemv.load(std::memory_order_relaxed); }

void matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  if (x.size(0) <= kGemvMaxRows) gemv(x, w, out);
  else gemm(x, w, out);
}

namespace {

// The rows kernel of gemv_of over several weights of one type: a task is one weight row (two for
// 5 or 6 rows of x) of one of the weights, numbered across them all, so one parallel region
// covers every row and each row is summed exactly as gemv_of sums it.
template <class W>
void gemv_rows_of(const float* X, std::int64_t M, std::int64_t K, const std::vector<const W*>& ws,
                  const std::vector<std::int64_t>& ns, const std::vector<float*>& ys) {
  const std::int64_t pair = M == 5 || M == 6 ? 2 : 1;
  std::vector<std::int64_t> first(ws.size() + 1, 0);  // the first task of each weight
  for (std::size_t j = 0; j < ws.size(); ++j) first[j + 1] = first[j] + (ns[j] + pair - 1) / pair;
  const std::int64_t tasks = first.back(), rows = std::accumulate(ns.begin(), ns.end(), std::int64_t{0});
#pragma omp parallel for schedule(static) if (M * rows * K >= kParallelWork)
  for (std::int64_t t = 0; t < tasks; ++t) {
    std::size_t j = 0;
    while (t >= first[j + 1]) ++j;
    const std::int64_t n = (t - first[j]) * pair, N = ns[j];
    const W* row = ws[j] + n * K;
    float* y = ys[j] + n;
    pair == 2 && n + 1 < N ? two_rows_of(X, M, K, row, y, N) : dot_rows_of(X, M, K, row, y, N);
  }
}

template <class W>
void gemv_rows_of(const Tensor& x, const std::vector<const Tensor*>& ws, const std::vector<Tensor*>& outs) {
  std::vector<const W*> w;
  std::vector<std::int64_t> n;
  std::vector<float*> y;
  for (std::size_t j = 0; j < ws.size(); ++j)
    w.push_back(static_cast<const W*>(ws[j]->raw_data())), n.push_back(ws[j]->size(0)), y.push_back(outs[j]->data<float>());
  gemv_rows_of(x.data<float>(), x.size(0), x.size(1), w, n, y);
}

}  // namespace

void matmuls(const Tensor& x, const std::vector<const Tensor*>& ws, const std::vector<Tensor*>& outs) {
  const DType wt = ws.empty() ? DType::F32 : ws[0]->dtype();
  bool shared = x.size(0) < 8;  // the rows kernel (from 8 rows, the tiles or a GEMM: one call each)
  for (const Tensor* w : ws) shared = shared && w->dtype() == wt;
  if (!shared) {
    for (std::size_t j = 0; j < ws.size(); ++j) matmul(x, *ws[j], *outs[j]);
    return;
  }
  switch (wt) {
    case DType::F32: return gemv_rows_of<float>(x, ws, outs);
    case DType::BF16: return gemv_rows_of<std::uint16_t>(x, ws, outs);
    default: return gemv_rows_of<Half>(x, ws, outs);  // F16
  }
}

// o[g·Dv + d] = Σ_j p[g·n + j] · v_row(j)[d] for the G query heads of one KV head, over its n
// positions in order: the sum that adding each position's weighted row into o makes, in the same
// order, but with the sums in registers (GH heads × NV vectors of 16 at a time, at most 16
// registers) instead of loaded and stored again at every position; each value row is read once for
// the GH heads.
template <int GH, int NV, class RowOf>
void weighted_values_block(const float* p, std::int64_t n, std::int64_t d0, RowOf& v_row, float* o, std::int64_t Dv) {
  using f32x16 = Lanes<16>::f32;
  f32x16 acc[GH][NV] = {};
  for (std::int64_t j = 0; j < n; ++j) {
    const float* vr = v_row(j) + d0;
    f32x16 v[NV];
    for (int u = 0; u < NV; ++u) v[u] = load<16>(vr + 16 * u);
    for (int g = 0; g < GH; ++g) {
      const float pj = p[g * n + j];
      for (int u = 0; u < NV; ++u) acc[g][u] += pj * v[u];
    }
  }
  for (int g = 0; g < GH; ++g)
    for (int u = 0; u < NV; ++u) std::memcpy(o + g * Dv + d0 + 16 * u, &acc[g][u], sizeof acc[g][u]);
}
template <int GH, class RowOf>
void weighted_values_heads(const float* p, std::int64_t n, std::int64_t Dv, RowOf& v_row, float* o) {
  std::int64_t d = 0;
  for (; d + 64 <= Dv; d += 64) weighted_values_block<GH, 4>(p, n, d, v_row, o, Dv);
  for (; d + 16 <= Dv; d += 16) weighted_values_block<GH, 1>(p, n, d, v_row, o, Dv);
  // The last Dv mod 16 values one at a time, each product added by one fused multiply-add, written
  // out: left to the compiler, a loop like this one was contracted in one inlined copy and not in
  // another, and paged and contiguous caches differed in the last bit.
  for (; d < Dv; ++d)
    for (int g = 0; g < GH; ++g) {
      float s = 0.0f;
      for (std::int64_t j = 0; j < n; ++j) s = std::fma(p[g * n + j], v_row(j)[d], s);
      o[g * Dv + d] = s;
    }
}
template <class RowOf>
void weighted_values(const float* p, std::int64_t n, std::int64_t G, std::int64_t Dv, RowOf&& v_row, float* o) {
  std::int64_t g = 0;
  for (; g + 4 <= G; g += 4) weighted_values_heads<4>(p + g * n, n, Dv, v_row, o + g * Dv);
  switch (G - g) {
    case 3: weighted_values_heads<3>(p + g * n, n, Dv, v_row, o + g * Dv); break;
    case 2: weighted_values_heads<2>(p + g * n, n, Dv, v_row, o + g * Dv); break;
    case 1: weighted_values_heads<1>(p + g * n, n, Dv, v_row, o + g * Dv); break;
    default: break;
  }
}

// How far ahead of the position whose keys it reads attention asks for a later position's keys
// (simd::ask_for): a position's key rows of all heads are one stretch of memory (4 KB in a 100M
// model), and the hardware's prefetcher stops at each 4 KB page and starts over on the next, so
// without being asked the first lines of every position waited on memory. (The value rows are read
// head by head, a row a position: asking for them ahead, and reading them position by position
// instead, were both measured slower.)
constexpr std::int64_t kAheadPositions = 4;

// Attention, fast path. Each task takes one query row and a range of KV heads with their whole
// query groups: every cached key row is read once per group rather than once per query head (the
// saving GQA is for), and every value row once per four of its group's heads (weighted_values);
// keys are walked in position order (all of the range's heads at position j, then j + 1), and the
// q·k products use the SIMD dot above. The tasks of a batch
// are those of all its sequences together, so decode rows of many sequences share the threads;
// each row only needs to know its sequence, and where that sequence's cache keeps position j
// (row j of its storage, or the row its block table names).
void attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, Tensor& out, const AttentionParams& p) {
  const std::int64_t T = q.size(0), Nq = q.size(1), Dqk = q.size(2), Dv = out.size(2);
  const float* Q = q.data<float>();
  float* O = out.data<float>();
  if (T == 0 || seqs.empty()) return;
  std::vector<std::int32_t> owner(static_cast<std::size_t>(T), -1);  // the sequence each query row belongs to
  std::int64_t longest = 1, work = 0, Nk = seqs[0].k.size(1);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const CachedKV& s = seqs[b];
    for (std::int64_t i = s.q_begin; i < s.q_end; ++i) owner[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(b);
    longest = std::max(longest, s.length);
    work += (s.q_end - s.q_begin) * s.length;
    Nk = std::max(Nk, s.k.size(1));
  }
  const bool parallel = work * Nq * (Dqk + Dv) >= kParallelAttention;
  // Split the KV heads so that there are a few tasks per thread, no more.
  const std::int64_t threads = parallel ? omp_get_max_threads() : 1;
  const std::int64_t ranges = std::min<std::int64_t>(Nk, std::max<std::int64_t>(1, (2 * threads + T - 1) / T));
#pragma omp parallel if (parallel)
  {
    std::vector<float> scores(static_cast<std::size_t>(Nq * longest));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (std::int64_t i = 0; i < T; ++i)
      for (std::int64_t r = 0; r < ranges; ++r) {
        const std::int32_t b = owner[static_cast<std::size_t>(i)];
        if (b < 0) continue;  // a row some other call attends
        const CachedKV& s = seqs[static_cast<std::size_t>(b)];
        const std::int64_t nk = s.k.size(1), G = Nq / nk, per = (nk + ranges - 1) / ranges;
        const std::int64_t h0 = r * per, h1 = std::min(nk, h0 + per);
        if (h0 >= h1) continue;
        const float *K = s.k.data<float>(), *V = s.v.data<float>();
        const std::int64_t t = i - s.q_begin;
        const std::int64_t hi = p.causal ? s.q_offset + t : s.length - 1;
        const std::int64_t lo = p.window > 0 ? std::max<std::int64_t>(0, hi - p.window + 1) : 0;
        const std::int64_t n = hi - lo + 1, heads = (h1 - h0) * G;
        const auto row = [&](std::int64_t pos) {  // where the cache keeps position pos
          return !s.table
                     ? pos
                     : static_cast<std::int64_t>((*s.table)[static_cast<std::size_t>(pos / s.block_size)]) * s.block_size +
                           pos % s.block_size;
        };
        const float* qr = Q + (i * Nq + h0 * G) * Dqk;  // the range's query heads, contiguous
        for (std::int64_t j = 0; j < n; ++j) {
          const std::int64_t at = row(lo + j);
          if (j + kAheadPositions < n)
            ask_for(K + (row(lo + j + kAheadPositions) * nk + h0) * Dqk, (h1 - h0) * Dqk * std::int64_t{sizeof(float)});
          for (std::int64_t kvh = h0; kvh < h1; ++kvh) {
            const float* kr = K + (at * nk + kvh) * Dqk;  // read once for its whole group
            for (std::int64_t g = 0; g < G; ++g) {
              const std::int64_t qh = (kvh - h0) * G + g;
              float sc = dot(qr + qh * Dqk, kr, Dqk) * p.scale;
              if (p.softcap > 0) sc = p.softcap * std::tanh(sc / p.softcap);  // Gemma 2's cap
              scores[static_cast<std::size_t>(qh * n + j)] = sc;
            }
          }
        }
        for (std::int64_t qh = 0; qh < heads; ++qh) {
          float* sq = scores.data() + qh * n;
          const float mx = *std::max_element(sq, sq + n);
          float sum = 0.0f;
          for (std::int64_t j = 0; j < n; ++j) sum += (sq[j] = std::exp(sq[j] - mx));
          for (std::int64_t j = 0; j < n; ++j) sq[j] /= sum;
        }
        for (std::int64_t kvh = h0; kvh < h1; ++kvh)
          weighted_values(
              scores.data() + (kvh - h0) * G * n, n, G, Dv,
              [&](std::int64_t j) { return V + (row(lo + j) * nk + kvh) * Dv; }, O + (i * Nq + kvh * G) * Dv);
      }
  }
}

// ---- elementwise: the reference loops over threads ----------------------------------------------
// Each element is computed by the same expression as its ref:: loop, so the results are the same
// bits; what changes is that the threads share the elements, and that add walks b row by row
// instead of taking an index modulo b's length at every element (a division each, and a loop the
// compiler cannot vectorise). On one thread, ref::add took 1.7% of chapter 11's batched decode
// step on the 100M shape (B = 32) and ref::swiglu with its expf about 3%.
void add(const Tensor& a, const Tensor& b, Tensor& out) {
  const std::int64_t n = a.numel(), L = a.ndim() == 0 ? 1 : a.size(-1);
  if (n == 0) return;
  const std::int64_t step = b.numel() == n ? L : 0;  // b has a's shape, or is one row of it
  const float *A = a.data<float>(), *B = b.data<float>();
  float* O = out.data<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelElements)
  for (std::int64_t r = 0; r < n / L; ++r) {
    const float *ar = A + r * L, *br = B + r * step;
    float* o = O + r * L;
#pragma omp simd
    for (std::int64_t i = 0; i < L; ++i) o[i] = ar[i] + br[i];
  }
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  const std::int64_t n = gate.numel();
  const float *G = gate.data<float>(), *U = up.data<float>();
  float* O = out.data<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelExp)
  for (std::int64_t i = 0; i < n; ++i) O[i] = G[i] / (1.0f + std::exp(-G[i])) * U[i];
}

// Row by row, each to the slot of its position: the arithmetic of cached_batch::View, the same
// functions the GPU's kernel runs, on the words the GPU reads.
void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v) {
  const cached_batch::View c{batch.words().data()};
  const std::int64_t kw = k.size(1) * k.size(2), vw = v.size(1) * v.size(2);
  const float *K = k.data<float>(), *V = v.data<float>();
  for (std::int64_t i = 0; i < c.rows(); ++i) {
    const std::int64_t b = c.sequence_of(i);
    if (b < 0) continue;  // a row its cache stores itself
    const std::int64_t at = c.row(b, c.position(b, i));
    std::memcpy(c.k(layer, b) + at * kw, K + i * kw, static_cast<std::size_t>(kw) * sizeof(float));
    std::memcpy(c.v(layer, b) + at * vw, V + i * vw, static_cast<std::size_t>(vw) * sizeof(float));
  }
}

// A ragged batch is the same kernel: sequence b's cache is rows kv_starts[b] .. of k and v.
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
               const AttentionParams& p) {
  std::vector<CachedKV> seqs;
  for (std::size_t b = 0; b + 1 < batch.q_starts.size(); ++b) {
    const std::int64_t k0 = batch.kv_starts[b], k1 = batch.kv_starts[b + 1];
    seqs.push_back({k.slice(0, k0, k1), v.slice(0, k0, k1), nullptr, 1, k1 - k0, batch.q_starts[b], batch.q_starts[b + 1],
                    batch.q_offsets[b]});
  }
  attention_cached(q, seqs, out, p);
}

}  // namespace inferlab::cpu
