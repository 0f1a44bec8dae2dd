#include "chapters/12_paged_attention/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "chapters/12_paged_attention/cuda_paged.h"
#include "common/error.h"
#include "common/lab.h"
#include "common/ops_cpu.h"

namespace inferlab::ch12 {

namespace {

void check(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, const Tensor& out) {
  IL_CHECK(q.ndim() == 3 && out.shape() == q.shape(), "paged attention: q ", q.describe(), " and out ", out.describe(),
           " must both be [T, N, H]");
  IL_CHECK(kv.k_pool.ndim() == 4 && kv.v_pool.shape() == kv.k_pool.shape() && kv.k_pool.size(1) == kv.block_size &&
               kv.k_pool.size(3) == q.size(2) && q.size(1) % kv.k_pool.size(2) == 0,
           "paged attention: pools ", kv.k_pool.describe(), " and ", kv.v_pool.describe(), " must be [blocks, ",
           kv.block_size, ", K, ", q.size(2), "] with K dividing ", q.size(1), " query heads");
  IL_CHECK(q.dtype() == DType::F32 && kv.k_pool.dtype() == DType::F32 && q.device() == kv.k_pool.device() &&
               out.device() == q.device(),
           "paged attention: f32 tensors on one device");
  const std::int64_t length = q_offset + q.size(0);
  IL_CHECK(q_offset >= 0 && length <= static_cast<std::int64_t>(kv.table.size()) * kv.block_size,
           "paged attention: ", length, " positions, but the block table holds ", kv.table.size(), " blocks of ",
           kv.block_size);
  for (std::int32_t b : kv.table)
    IL_CHECK(b >= 0 && b < kv.k_pool.size(0), "paged attention: block ", b, " is outside the pool of ", kv.k_pool.size(0),
             " blocks");
}

// Asks for the first rows of the block holding position p (if p < hi) ahead of their use.
void prefetch_block(const float* pool, const PagedKV& kv, std::int64_t p, std::int64_t hi, std::int64_t row) {
  if (p >= hi) return;
  const float* first = pool + slot(kv.table, kv.block_size, p) * row;
  const std::int64_t floats = std::min<std::int64_t>(row * std::min<std::int64_t>(2, hi - p), 1024);
  for (std::int64_t i = 0; i < floats; i += 16) __builtin_prefetch(first + i);
}

}  // namespace

std::int64_t slot(const std::vector<std::int32_t>& table, std::int64_t block_size, std::int64_t p) {
  // EXERCISE 12.1 BEGIN: the block-table lookup
  return static_cast<std::int64_t>(table[static_cast<std::size_t>(p / block_size)]) * block_size + p % block_size;
  // EXERCISE 12.1 STUB
  // lab::not_done("12.1", "return the pool row holding position p: the block the table lists for p's block "
  //                       "number (p / block_size), times block_size, plus p's offset within its block");
  // (void)table, (void)block_size, (void)p;
  // EXERCISE 12.1 END
}

void write_slots(const PagedKV& kv, std::int64_t start, const Tensor& k, const Tensor& v) {
  const std::int64_t T = k.size(0), row = k.size(1) * k.size(2);
  IL_CHECK(k.shape() == v.shape() && k.size(1) == kv.k_pool.size(2) && k.size(2) == kv.k_pool.size(3),
           "paged cache: new keys ", k.describe(), " and values ", v.describe(), " do not fit rows of ",
           kv.k_pool.describe());
  IL_CHECK(start + T <= static_cast<std::int64_t>(kv.table.size()) * kv.block_size, "paged cache: positions up to ",
           start + T, " but the block table holds ", kv.table.size(), " blocks");
  std::vector<std::int64_t> slots(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) slots[static_cast<std::size_t>(t)] = slot(kv.table, kv.block_size, start + t);
  if (k.device() == Device::CUDA) return cuda_write_slots(kv.k_pool, kv.v_pool, slots, k, v);
  Tensor kp = kv.k_pool, vp = kv.v_pool;  // handles to the pool's storage
  float *K = kp.data<float>(), *V = vp.data<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t s = slots[static_cast<std::size_t>(t)];
    std::memcpy(K + s * row, k.data<float>() + t * row, static_cast<std::size_t>(row) * sizeof(float));
    std::memcpy(V + s * row, v.data<float>() + t * row, static_cast<std::size_t>(row) * sizeof(float));
  }
}

namespace ref {

void paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out) {
  check(q, kv, q_offset, out);
  IL_CHECK(q.device() == Device::CPU, "ref::paged_attention runs on the CPU");
  const std::int64_t T = q.size(0), N = q.size(1), H = q.size(2), K = kv.k_pool.size(2), G = N / K;
  const float scale = 1.0f / std::sqrt(static_cast<float>(H));
  const float *Q = q.data<float>(), *Kp = kv.k_pool.data<float>(), *Vp = kv.v_pool.data<float>();
  float* O = out.data<float>();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < N; ++h) {
      const std::int64_t g = h / G, n = q_offset + t + 1;  // query t sees positions 0 .. q_offset + t
      std::vector<float> s(static_cast<std::size_t>(n));
      for (std::int64_t p = 0; p < n; ++p) {
        const float* kr = Kp + (slot(kv.table, kv.block_size, p) * K + g) * H;
        float dot = 0;
        for (std::int64_t d = 0; d < H; ++d) dot += Q[(t * N + h) * H + d] * kr[d];
        s[static_cast<std::size_t>(p)] = dot * scale;
      }
      const float mx = *std::max_element(s.begin(), s.end());
      float sum = 0;
      for (float& x : s) sum += (x = std::exp(x - mx));
      for (std::int64_t d = 0; d < H; ++d) {
        float o = 0;
        for (std::int64_t p = 0; p < n; ++p)
          o += s[static_cast<std::size_t>(p)] / sum * Vp[(slot(kv.table, kv.block_size, p) * K + g) * H + d];
        O[(t * N + h) * H + d] = o;
      }
    }
}

}  // namespace ref

// The fast path. A task is one query row and one range of positions, over every head: it walks
// its range block by block, and within a block position after position, so it reads each block's
// rows in memory order (all KV heads of a position, then the next), each key and value row once
// for its whole query group. It leaves the range's softmax statistics and unnormalised sums; the
// merge combines the ranges. Ranges, not heads, are what the threads share (flash-decoding).
void paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out, std::int64_t splits) {
  check(q, kv, q_offset, out);
  const std::int64_t T = q.size(0), N = q.size(1), H = q.size(2), K = kv.k_pool.size(2), G = N / K, B = kv.block_size;
  const std::int64_t longest = q_offset + T;
  if (splits <= 0) splits = std::max<std::int64_t>(1, (longest + 2047) / 2048);
  splits = std::min(splits, longest);
  if (q.device() == Device::CUDA) return cuda_paged_attention(q, kv, q_offset, out, splits);
  const float scale = 1.0f / std::sqrt(static_cast<float>(H));
  const float *Q = q.data<float>(), *Kp = kv.k_pool.data<float>(), *Vp = kv.v_pool.data<float>();
  // Per (row, query head, range): m, l, and the unnormalised sum of H values.
  std::vector<float> part(static_cast<std::size_t>(T * N * splits * (H + 2)));
  const std::int64_t per = (longest + splits - 1) / splits;
  const bool parallel = T * N * longest * H >= (std::int64_t{1} << 16);
#pragma omp parallel if (parallel)
  {
    std::vector<float> sc(static_cast<std::size_t>(N * per));  // sc[h·per + j]
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t r = 0; r < splits; ++r) {
        const std::int64_t lo = r * per, hi = std::min(q_offset + t + 1, lo + per), n = std::max<std::int64_t>(0, hi - lo);
        const float* qt = Q + t * N * H;
        for (std::int64_t p = lo; p < hi;) {  // block by block
          const std::int64_t row0 = slot(kv.table, B, p), run = std::min(hi, (p / B + 1) * B) - p;
          prefetch_block(Kp, kv, p + run, hi, K * H);  // the hardware prefetcher cannot guess the next block
          for (std::int64_t j = 0; j < run; ++j)
            for (std::int64_t g = 0; g < K; ++g) {
              const float* kr = Kp + ((row0 + j) * K + g) * H;  // read once for its whole group
              for (std::int64_t i = 0; i < G; ++i)
                sc[static_cast<std::size_t>((g * G + i) * per + p - lo + j)] = cpu::dot(qt + (g * G + i) * H, kr, H);
            }
          p += run;
        }
        for (std::int64_t h = 0; h < N; ++h) {
          float* pr = part.data() + ((t * N + h) * splits + r) * (H + 2);
          float* s = sc.data() + h * per;
          float mx = -INFINITY, l = 0;
          for (std::int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j] *= scale);
          for (std::int64_t j = 0; j < n; ++j) l += (s[j] = std::exp(s[j] - mx));
          pr[0] = mx, pr[1] = l;
          std::fill(pr + 2, pr + 2 + H, 0.0f);
        }
        for (std::int64_t p = lo; p < hi;) {
          const std::int64_t row0 = slot(kv.table, B, p), run = std::min(hi, (p / B + 1) * B) - p;
          prefetch_block(Vp, kv, p + run, hi, K * H);
          for (std::int64_t j = 0; j < run; ++j)
            for (std::int64_t g = 0; g < K; ++g) {
              const float* vr = Vp + ((row0 + j) * K + g) * H;  // read once for its whole group
              for (std::int64_t i = 0; i < G; ++i) {
                const std::int64_t h = g * G + i;
                const float w = sc[static_cast<std::size_t>(h * per + p - lo + j)];
                float* acc = part.data() + ((t * N + h) * splits + r) * (H + 2) + 2;
                for (std::int64_t d = 0; d < H; ++d) acc[d] += w * vr[d];
              }
            }
          p += run;
        }
      }
  }
  // The merge: rescale each range by exp(m_r − m) and divide by the total weight.
  float* O = out.data<float>();
  for (std::int64_t th = 0; th < T * N; ++th) {
    const float* pr = part.data() + th * splits * (H + 2);
    float m = -INFINITY;
    for (std::int64_t r = 0; r < splits; ++r) m = std::max(m, pr[r * (H + 2)]);
    float l = 0;
    std::fill(O + th * H, O + (th + 1) * H, 0.0f);
    for (std::int64_t r = 0; r < splits; ++r) {
      const float* x = pr + r * (H + 2);
      if (x[1] == 0) continue;  // an empty range (past this row's last position)
      const float c = std::exp(x[0] - m);
      l += c * x[1];
      for (std::int64_t d = 0; d < H; ++d) O[th * H + d] += c * x[2 + d];
    }
    for (std::int64_t d = 0; d < H; ++d) O[th * H + d] /= l;
  }
}

}  // namespace inferlab::ch12
