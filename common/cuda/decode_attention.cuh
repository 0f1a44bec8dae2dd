#pragma once
// The decode-attention family: every kernel that attends one new query row per sequence over its
// cached keys and values, in one file, numbered as llm.c numbers its versions. Each is split-K
// (flash-decoding): a block attends one chunk of at most kChunk positions and leaves the chunk's
// maximum score m, its sum l = Σ e^(s − m) and its unnormalised output Σ e^(s − m) v in a partial
// slot; merge() rescales the chunks by e^(m_c − M) and divides by the total sum. The reference is
// ref::attention_cached (common/ops_ref.cpp); ops::attention_cached is the CPU fast path.
//
//   1 per_head   a block per (query head, chunk): the simple version (chapter 02's lesson)
//   2 grouped    a block per (KV head, chunk) serving its whole query group: each key and value
//                row read once for G query heads (chapter 03's lesson: where GQA's speed is)
//   3 latent     a block per (16 query heads, chunk) over MLA's latent rows, the values being the
//                first r columns of the same rows (chapter 04's absorbed decode)
//   4 ragged     version 1 over a batch: one launch for every sequence's decode row, each with its
//                own keys (a slice of packed rows), window and causal limit (ops::attention's decode rows)
//   5 paged      version 1 over a batch step's caches (common/cached_batch.h, the context uploaded
//                once a step): every query row of every sequence, prefill chunks and decode rows
//                alike, each sequence's keys through its block table (chapter 12's pool) or, without
//                one, in rows of its own as version 4 reads them (chapter 02's caches); a causal limit
//                and window per row. One launch a layer for the whole batch, whatever its size,
//                beside one that writes the step's new keys and values into their slots (store_rows)
//
// One set of constants, one partial layout, one merge, and every version scales q before the dot
// products and uses expf. Host code picks a version through cuda::decode_attention
// (common/cuda/backend.h); chapter 02's CUDA graph launches version 1 directly (launch_per_head).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cached_batch.h"
#include "common/cuda/util.cuh"

namespace inferlab::cuda::decode {

constexpr int kChunk = 256;          // positions a block attends at most: one split
constexpr int kThreads = 128;        // threads a block (versions 1, 2, 4, 5 and the merge)
constexpr int kMaxHead = 256;        // head dimension of versions 1, 2 and 5 (q in shared memory)
constexpr int kMaxQk = 1024;         // version 4: query/key width (MLA's q·k with RoPE, unabsorbed: 192)
constexpr int kMaxGroup = 16;        // version 2: query heads per KV head
constexpr int kMaxGroupDims = 2048;  // version 2: G·H values of q kept in shared memory
constexpr int kLatentHeads = 16;     // version 3: query heads a block serves
constexpr int kLatentThreads = 256;  // version 3: threads a block
constexpr int kMaxLatent = 1024;     // version 3: r + dr, a row held as at most 8 float4 a lane
constexpr int kSeqs = 32;            // version 4: sequences one launch carries by value
static_assert(cached_batch::kRange <= kChunk, "version 5 attends a work item's range in one chunk");

// Where a (group o, split c)'s partial result lives: [m, l, acc[0 .. D − 1]], o the output row
// × head index in the version's own order.
__device__ inline float* slot(float* part, long long o, int c, int splits, long long D) {
  return part + (o * splits + c) * (D + 2);
}

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The chunk's softmax over sc[0 .. n − 1] (raw scores in, weights e^(s − m) out), by the whole
// block; returns m and l to every thread.
__device__ inline void chunk_softmax(float* sc, int n, float& m, float& l) {
  m = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, sc[j]);
  m = block_max(m);
  l = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) l += (sc[j] = expf(sc[j] - m));
  l = block_sum(l);  // synchronises: sc[] holds the weights
}

// An empty chunk (past the sequence's keys): nothing to merge.
__device__ inline void empty_slot(float* out) {
  if (threadIdx.x == 0) out[0] = -INFINITY, out[1] = 0.0f;
}

// Scores of the chunk's n key rows against the block's query qs [D], a warp per key row (lanes
// read it coalesced): sc[j] = qs · key(j). The caller synchronises before reading sc.
template <class Key>
__device__ inline void warp_scores(const float* qs, long long D, int n, Key key, float* sc) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int j = warp; j < n; j += warps) {
    const float* kr = key(j);
    float dot = 0.0f;
    for (long long d = lane; d < D; d += 32) dot += qs[d] * kr[d];
    dot = warp_sum(dot);
    if (lane == 0) sc[j] = dot;
  }
}

// ---- version 1: per head ----------------------------------------------------------------------
// One block per (query head h, chunk c) of one sequence: k, v [S, K, H], the last position read
// from the device (*pos_p), so that a captured graph replays the launch at every position.
namespace {
__global__ void per_head(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                         const int* __restrict__ pos_p, float* __restrict__ part, int N, int Kh, int H, float scale) {
  __shared__ float qs[kMaxHead];
  __shared__ float sc[kChunk];
  const int h = blockIdx.x, c = blockIdx.y, splits = gridDim.y;
  const int len = *pos_p + 1, start = c * kChunk, n = max(0, min(start + kChunk, len) - start);
  float* out = slot(part, h, c, splits, H);
  if (n == 0) return empty_slot(out);
  const int kvh = h / (N / Kh);
  for (int d = threadIdx.x; d < H; d += blockDim.x) qs[d] = q[h * H + d] * scale;
  __syncthreads();
  warp_scores(
      qs, H, n, [&](int j) { return kc + (static_cast<long long>(start + j) * Kh + kvh) * H; }, sc);
  __syncthreads();
  float m, l;
  chunk_softmax(sc, n, m, l);
  const long long stride = static_cast<long long>(Kh) * H;
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    const float* vd = vc + static_cast<long long>(start) * stride + kvh * H + d;
    out[2 + d] = weighted_rows(sc, n, [&](int j) { return vd[j * stride]; });
  }
  if (threadIdx.x == 0) out[0] = m, out[1] = l;
}

// ---- version 2: grouped (GQA) -----------------------------------------------------------------
// One block per (KV head, chunk) serves the group of G = N/K query heads. kG: G rounded up to a
// power of two (1 … 16), so the loops over the group have a constant bound and their accumulators
// stay in registers. The sums run in the same order as version 1's, one head at a time.
template <int kG>
__global__ void grouped(const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
                        const int* __restrict__ pos_p, float* __restrict__ part, int N, int Kh, int H, float scale) {
  __shared__ float qs[kMaxGroupDims];
  __shared__ float sc[kG][kChunk];
  const int kvh = blockIdx.x, c = blockIdx.y, splits = gridDim.y, G = N / Kh;
  const int len = *pos_p + 1, start = c * kChunk, n = max(0, min(start + kChunk, len) - start);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (n == 0) {
    for (int g = 0; g < G; ++g) empty_slot(slot(part, kvh * G + g, c, splits, H));
    return;
  }
  for (int i = threadIdx.x; i < G * H; i += blockDim.x) qs[i] = q[kvh * G * H + i] * scale;  // the group's queries
  __syncthreads();
  // Scores: a warp per key row, read once, dotted with all G queries.
  for (int j = warp; j < n; j += warps) {
    const float* kr = kc + (static_cast<long long>(start + j) * Kh + kvh) * H;
    float kv[8];  // H/32 ≤ 8 values of the row per lane; constant indices keep them in registers
#pragma unroll
    for (int e = 0; e < 8; ++e) kv[e] = lane + 32 * e < H ? kr[lane + 32 * e] : 0.0f;
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (lane + 32 * e < H) dot += qs[g * H + lane + 32 * e] * kv[e];
      dot = warp_sum(dot);
      if (lane == 0) sc[g][j] = dot;
    }
  }
  __syncthreads();
  for (int g = 0; g < G; ++g) {  // each query head's softmax over the chunk
    float m, l;
    chunk_softmax(sc[g], n, m, l);
    if (threadIdx.x == 0) {
      float* out = slot(part, kvh * G + g, c, splits, H);
      out[0] = m, out[1] = l;
    }
  }
  __syncthreads();
  // Outputs: each value row read once, accumulated into all G heads, four rows loaded before use.
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float acc[kG] = {};
    const long long row = static_cast<long long>(Kh) * H;
    const float* vd = vc + static_cast<long long>(start) * row + kvh * H + d;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      float vv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) vv[u] = vd[(j + u) * row];
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int g = 0; g < kG; ++g)
          if (g < G) acc[g] += sc[g][j + u] * vv[u];
    }
    for (; j < n; ++j) {
      const float vv = vd[j * row];
#pragma unroll
      for (int g = 0; g < kG; ++g)
        if (g < G) acc[g] += sc[g][j] * vv;
    }
#pragma unroll
    for (int g = 0; g < kG; ++g)
      if (g < G) slot(part, kvh * G + g, c, splits, H)[2 + d] = acc[g];
  }
}

// ---- version 3: latent (MLA) ------------------------------------------------------------------
__device__ inline float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// One block per (group of kLatentHeads query heads, chunk) reads each latent row [R = r + dr]
// once and scores it against the whole group; the values are the row's first r columns.
// Dynamic shared memory: w [kLatentHeads][kChunk] (scores, then weights), then the group's
// scaled queries qs [heads][R].
__global__ void latent(const float* __restrict__ q, const float* __restrict__ rows, const int* __restrict__ pos_p,
                       float* __restrict__ part, int N, int R, int r, float scale) {
  extern __shared__ float4 smem[];
  float* w = reinterpret_cast<float*>(smem);
  float* qs = w + kLatentHeads * kChunk;
  constexpr int kRowVectors = kMaxLatent / 4 / 32;  // float4 of a row held by each lane
  const int h0 = blockIdx.x * kLatentHeads, heads = min(kLatentHeads, N - h0);
  const int c = blockIdx.y, splits = gridDim.y;
  const int len = *pos_p + 1, start = c * kChunk, n = max(0, min(start + kChunk, len) - start);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32, R4 = R / 4;
  if (n == 0) {
    for (int g = 0; g < heads; ++g) empty_slot(slot(part, h0 + g, c, splits, r));
    return;
  }
  for (int i = threadIdx.x; i < heads * R; i += blockDim.x) qs[i] = q[static_cast<long long>(h0) * R + i] * scale;
  __syncthreads();
  // Scores: a warp per row; the row is loaded once and dotted with every query of the group.
  const float4* q4 = reinterpret_cast<const float4*>(qs);
  for (int j = warp; j < n; j += warps) {
    const float4* row = reinterpret_cast<const float4*>(rows + static_cast<long long>(start + j) * R);
    float4 k[kRowVectors];
#pragma unroll
    for (int e = 0; e < kRowVectors; ++e) k[e] = lane + 32 * e < R4 ? row[lane + 32 * e] : make_float4(0, 0, 0, 0);
    for (int g = 0; g < heads; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kRowVectors; ++e)
        if (lane + 32 * e < R4) dot += dot4(q4[g * R4 + lane + 32 * e], k[e]);
      dot = warp_sum(dot);
      if (lane == 0) w[g * kChunk + j] = dot;
    }
  }
  __syncthreads();
  // Softmax statistics of each head: a warp per head. The weights past n, up to the next
  // multiple of 4, are zeroed for the value loop below.
  const int n4 = (n + 3) / 4 * 4;
  for (int g = warp; g < heads; g += warps) {
    float* s = w + g * kChunk;
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) sum += (s[j] = expf(s[j] - mx));
    for (int j = n + lane; j < n4; j += 32) s[j] = 0.0f;
    sum = warp_sum(sum);
    if (lane == 0) {
      float* out = slot(part, h0 + g, c, splits, r);
      out[0] = mx, out[1] = sum;
    }
  }
  __syncthreads();
  // Values: a thread per latent dimension d < r; column d of four rows at a time against the
  // four weights of each head (one 16-byte shared load per four multiply-adds).
  const float4* w4 = reinterpret_cast<const float4*>(w);
  for (int d = threadIdx.x; d < r; d += blockDim.x) {
    float acc[kLatentHeads] = {};
    for (int j = 0; j < n; j += 4) {
      float4 v;
      const float* col = rows + static_cast<long long>(start + j) * R + d;
      v.x = col[0];
      v.y = j + 1 < n ? col[R] : 0.0f;
      v.z = j + 2 < n ? col[2 * R] : 0.0f;
      v.w = j + 3 < n ? col[3 * R] : 0.0f;
#pragma unroll
      for (int g = 0; g < kLatentHeads; ++g)
        if (g < heads) acc[g] += dot4(w4[(g * kChunk + j) / 4], v);
    }
#pragma unroll
    for (int g = 0; g < kLatentHeads; ++g)
      if (g < heads) slot(part, h0 + g, c, splits, r)[2 + d] = acc[g];
  }
}
static_assert(kChunk % 4 == 0, "version 3's value loop reads the weights four positions at a time");
}  // namespace

// ---- version 4: ragged over a batch -----------------------------------------------------------
// The sequences of one launch, passed by value as a kernel argument (nothing copied first).
struct RaggedSeqs {
  long long row[kSeqs];            // the sequence's query row in q and out
  long long kv_start[kSeqs];       // its first key row in k and v
  long long lo[kSeqs], hi[kSeqs];  // the keys it attends, lo..hi (causal limit and window applied)
};

namespace {
// One block per (sequence b, query head h, chunk c): version 1 with each sequence's keys where
// they are, and Dqk ≠ Dv allowed (an MLA layer run unabsorbed).
__global__ void ragged(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       RaggedSeqs seqs, long long Nq, long long Nk, long long Dqk, long long Dv, float scale,
                       float* __restrict__ part) {
  __shared__ float qs[kMaxQk];
  __shared__ float sc[kChunk];
  const int b = blockIdx.x, c = blockIdx.z, splits = gridDim.z;
  const long long h = blockIdx.y, kvh = h / (Nq / Nk), row = seqs.row[b];
  const long long start = seqs.lo[b] + static_cast<long long>(c) * kChunk;
  const int n = static_cast<int>(max(0LL, min(start + kChunk, seqs.hi[b] + 1) - start));
  float* out = slot(part, b * Nq + h, c, splits, Dv);
  if (n == 0) return empty_slot(out);
  const float* kb = k + (seqs.kv_start[b] + start) * Nk * Dqk;
  const float* vb = v + (seqs.kv_start[b] + start) * Nk * Dv;
  for (long long d = threadIdx.x; d < Dqk; d += blockDim.x) qs[d] = q[(row * Nq + h) * Dqk + d] * scale;
  __syncthreads();
  warp_scores(
      qs, Dqk, n, [&](int j) { return kb + (j * Nk + kvh) * Dqk; }, sc);
  __syncthreads();
  float m, l;
  chunk_softmax(sc, n, m, l);
  const long long stride = Nk * Dv;
  for (long long d = threadIdx.x; d < Dv; d += blockDim.x) {
    const float* vd = vb + kvh * Dv + d;
    out[2 + d] = weighted_rows(sc, n, [&](int j) { return vd[j * stride]; });
  }
  if (threadIdx.x == 0) out[0] = m, out[1] = l;
}

// ---- version 5: paged, over a batch step --------------------------------------------------------
// One block per (work item, query head h) of a batch step's context (cached_batch.h): a work item
// is one query row's range of at most `per` positions, counted from the first key the row sees.
// The row's sequence, its position and where that sequence keeps its keys (through its block
// table, or rows of its own) all come from the context; Dqk ≠ Dv allowed. The storage rows of the
// range's positions are looked up once, into shared memory, then read as version 1 reads its own.
__global__ void paged(const std::int64_t* __restrict__ ctx, long long layer, const float* __restrict__ q, long long Nq,
                      long long Nk, long long Dqk, long long Dv, long long window, bool causal, float scale,
                      float* __restrict__ part) {
  __shared__ float qs[kMaxQk];
  __shared__ float sc[kChunk];
  __shared__ long long at[kChunk];
  const cached_batch::View c{ctx};
  const long long item = blockIdx.x, h = blockIdx.y, kvh = h / (Nq / Nk);
  const cached_batch::Range r = cached_batch::range(c, item, causal, window);
  float* out = part + (item * Nq + h) * (Dv + 2);
  const int n = static_cast<int>(r.n);
  if (n == 0) return empty_slot(out);
  for (int j = threadIdx.x; j < n; j += blockDim.x) at[j] = c.row(r.sequence, r.start + j);
  for (long long d = threadIdx.x; d < Dqk; d += blockDim.x) qs[d] = q[(r.row * Nq + h) * Dqk + d] * scale;
  __syncthreads();
  const float* __restrict__ kc = c.k(layer, r.sequence);
  const float* __restrict__ vc = c.v(layer, r.sequence);
  warp_scores(
      qs, Dqk, n, [&](int j) { return kc + (at[j] * Nk + kvh) * Dqk; }, sc);
  __syncthreads();
  float m, l;
  chunk_softmax(sc, n, m, l);
  for (long long d = threadIdx.x; d < Dv; d += blockDim.x)
    out[2 + d] = weighted_rows(sc, n, [&](int j) { return vc[(at[j] * Nk + kvh) * Dv + d]; });
  if (threadIdx.x == 0) out[0] = m, out[1] = l;
}

// A batch step's new keys and values of one layer into their slots (ops::store_cached): one block
// per query row, its k row and v row copied to the storage row of its position. T is float4 where
// every row starts on 16 bytes (CachedBatch::aligned16; kw, vw in T), else float.
template <class T>
__global__ void store_rows(const std::int64_t* __restrict__ ctx, long long layer, const T* __restrict__ k,
                           const T* __restrict__ v, long long kw, long long vw) {
  const cached_batch::View c{ctx};
  const long long i = blockIdx.x, b = c.sequence_of(i);
  if (b < 0) return;  // a row whose cache stores it itself
  const long long at = c.row(b, c.position(b, i));
  T* __restrict__ kd = reinterpret_cast<T*>(c.k(layer, b)) + at * kw;
  T* __restrict__ vd = reinterpret_cast<T*>(c.v(layer, b)) + at * vw;
  for (long long e = threadIdx.x; e < kw; e += blockDim.x) kd[e] = k[i * kw + e];
  for (long long e = threadIdx.x; e < vw; e += blockDim.x) vd[e] = v[i * vw + e];
}

// ---- the merge --------------------------------------------------------------------------------
// Output row o (o = blockIdx.x) goes to out + to(o) · D.
struct SameRow {
  __device__ long long operator()(long long o) const { return o; }
};
struct RaggedRow {  // version 4: group b · Nq + h is head h of sequence b's query row
  RaggedSeqs seqs;
  long long Nq;
  __device__ long long operator()(long long o) const { return seqs.row[o / Nq] * Nq + o % Nq; }
};

// One output row × head, by the block, from the partial results of its `splits` chunks, `stride`
// floats apart: the chunks rescaled by e^(m_c − M), divided by the total sum.
__device__ inline void merge_row(const float* __restrict__ pr, long long stride, int splits, long long D,
                                 float* __restrict__ dst) {
  float M = -INFINITY;
  for (int c = 0; c < splits; ++c) M = fmaxf(M, pr[c * stride]);
  float L = 0.0f;
  for (int c = 0; c < splits; ++c)
    if (pr[c * stride + 1] != 0.0f) L += pr[c * stride + 1] * expf(pr[c * stride] - M);
  for (long long d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    for (int c = 0; c < splits; ++c) {
      const float* x = pr + c * stride;
      if (x[1] != 0.0f) a += x[2 + d] * expf(x[0] - M);
    }
    dst[d] = a / L;
  }
}

// One block per output row × head, its chunks side by side.
template <class To>
__global__ void merge(const float* __restrict__ part, float* __restrict__ out, int splits, long long D, To to) {
  const long long o = blockIdx.x;
  merge_row(part + o * splits * (D + 2), D + 2, splits, D, out + to(o) * D);
}

// Version 5's merge: one block per query row × head of the step; a row's work items are its
// chunks, item e's partial result for head h at (e · Nq + h) · (D + 2). Rows the context does not
// name are left as they are (their caches attended them).
__global__ void merge_paged(const std::int64_t* __restrict__ ctx, const float* __restrict__ part, float* __restrict__ out,
                            long long Nq, long long D) {
  const cached_batch::View c{ctx};
  const long long o = blockIdx.x, i = o / Nq, h = o % Nq;
  if (c.sequence_of(i) < 0) return;
  const long long first = c.first_item(i);
  merge_row(part + (first * Nq + h) * (D + 2), Nq * (D + 2), static_cast<int>(c.first_item(i + 1) - first), D, out + o * D);
}
}  // namespace

// ---- launches ---------------------------------------------------------------------------------
/// Splits (chunks of kChunk positions) that `len` positions need.
inline int splits_for(long long len) { return static_cast<int>((len + kChunk - 1) / kChunk); }
/// Floats of partial results for `groups` output rows × heads of width D over `splits` chunks.
inline long long part_floats(long long groups, int splits, long long D) { return groups * splits * (D + 2); }

/// Version 1 then the merge, as chapter 02's CUDA graph captures them: the last position is read
/// from the device int *pos, and `splits` covers the cache's capacity (chunks past the position
/// contribute nothing). q [N, H], out [N, H]; part holds part_floats(N, splits, H).
inline void launch_per_head(const float* q, const float* k, const float* v, const int* pos, float* part, float* out, int N,
                            int Kh, int H, int splits, float scale, cudaStream_t stream) {
  per_head<<<dim3(static_cast<unsigned>(N), static_cast<unsigned>(splits)), kThreads, 0, stream>>>(q, k, v, pos, part, N, Kh,
                                                                                                   H, scale);
  IL_CUDA_LAUNCHED();
  merge<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(part, out, splits, H, SameRow{});
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::cuda::decode
