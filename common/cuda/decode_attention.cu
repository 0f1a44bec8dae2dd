// The decode-attention family's entry points on tensors (common/cuda/backend.h): the checks, the
// scratch for the partial results, and the launches of decode_attention.cuh's versions.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "common/cached_batch.h"
#include "common/cuda/backend.h"
#include "common/cuda/decode_attention.cuh"

namespace inferlab::cuda {

namespace {

using namespace decode;

// q and out [1, N, H], k and v [S, K, H] with K dividing N, all contiguous f32 on the device,
// 0 < len <= S.
void check_inputs(const char* who, const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len, const Tensor& out) {
  IL_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && out.is_cuda(), who, ": tensors must be on CUDA");
  IL_CHECK(q.ndim() == 3 && k.ndim() == 3 && q.size(0) == 1 && k.size(1) > 0 && k.size(2) == q.size(2) &&
               v.shape() == k.shape() && out.shape() == q.shape() && q.size(1) % k.size(1) == 0,
           who, ": expected q and out [1, N, H] and k, v [S, K, H] with K dividing N; got q ", q.describe(), ", k ",
           k.describe(), ", v ", v.describe(), ", out ", out.describe());
  for (const Tensor* t : {&q, &k, &v, &out})
    IL_CHECK(t->dtype() == DType::F32 && t->is_contiguous(), who, ": ", t->describe(), " must be contiguous f32");
  IL_CHECK(len > 0 && len <= k.size(0), who, ": length ", len, " outside the cache of ", k.size(0), " positions");
  IL_CHECK(q.size(2) <= kMaxHead, who, ": head dimension ", q.size(2), " is above the kernels' limit of ", kMaxHead);
}

// One scratch allocation: the last position as a device int (as versions 1-3 read it), then
// the partial results. Valid until the next scratch() call; work on stream() is ordered.
struct Scratch {
  int* pos;
  float* part;
};
Scratch scratch_for(long long part_floats, std::int64_t len) {
  char* base = static_cast<char*>(scratch(256 + static_cast<std::size_t>(part_floats) * sizeof(float)));
  Scratch s{reinterpret_cast<int*>(base), reinterpret_cast<float*>(base + 256)};
  const int last = static_cast<int>(len - 1);
  IL_CUDA(cudaMemcpyAsync(s.pos, &last, sizeof last, cudaMemcpyHostToDevice, stream()));
  return s;
}

template <int kG>
void launch_grouped(dim3 grid, const float* q, const float* k, const float* v, const Scratch& s, int N, int Kh, int H,
                    float scale) {
  grouped<kG><<<grid, kThreads, 0, stream()>>>(q, k, v, s.pos, s.part, N, Kh, H, scale);
  IL_CUDA_LAUNCHED();
}

int shared_limit() {
  int device = 0, bytes = 0;
  IL_CUDA(cudaGetDevice(&device));
  IL_CUDA(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

bool aligned16(const Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.raw_data()) % 16 == 0; }

}  // namespace

void decode_attention(DecodeAttention version, const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len,
                      Tensor& out, std::int64_t block_size) {
  const char* who = "decode_attention";
  check_inputs(who, q, k, v, len, out);
  const int N = static_cast<int>(q.size(1)), H = static_cast<int>(q.size(2)), Kh = static_cast<int>(k.size(1));
  const float scale = 1.0f / std::sqrt(static_cast<float>(H));
  switch (version) {
    case DecodeAttention::PerHead: {
      const int splits = splits_for(len);
      const Scratch s = scratch_for(part_floats(N, splits, H), len);
      launch_per_head(q.data<float>(), k.data<float>(), v.data<float>(), s.pos, s.part, out.data<float>(), N, Kh, H, splits,
                      scale, stream());
      return;
    }
    case DecodeAttention::Grouped: {
      const int G = N / Kh;
      IL_CHECK(G <= kMaxGroup && G * H <= kMaxGroupDims, who, ": groups of ", G, " heads of size ", H,
               " exceed version 2's limits (", kMaxGroup, " heads, ", kMaxGroupDims, " values)");
      const int splits = splits_for(len);
      const Scratch s = scratch_for(part_floats(N, splits, H), len);
      const auto launch = G <= 1   ? launch_grouped<1>
                          : G <= 2 ? launch_grouped<2>
                          : G <= 4 ? launch_grouped<4>
                          : G <= 8 ? launch_grouped<8>
                                   : launch_grouped<16>;  // the group size rounded up to a power of two
      launch(dim3(static_cast<unsigned>(Kh), static_cast<unsigned>(splits)), q.data<float>(), k.data<float>(),
             v.data<float>(), s, N, Kh, H, scale);
      merge<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(s.part, out.data<float>(), splits, H, SameRow{});
      IL_CUDA_LAUNCHED();
      return;
    }
    case DecodeAttention::Ragged: {  // a batch of one sequence
      RaggedSeqs one{};
      one.row[0] = 0, one.kv_start[0] = 0, one.lo[0] = 0, one.hi[0] = len - 1;
      const int splits = splits_for(len);
      auto* part = static_cast<float*>(scratch(static_cast<std::size_t>(part_floats(N, splits, H)) * sizeof(float)));
      ragged<<<dim3(1, static_cast<unsigned>(N), static_cast<unsigned>(splits)), kThreads, 0, stream()>>>(
          q.data<float>(), k.data<float>(), v.data<float>(), one, N, Kh, H, H, scale, part);
      IL_CUDA_LAUNCHED();
      merge<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(part, out.data<float>(), splits, H, RaggedRow{one, N});
      IL_CUDA_LAUNCHED();
      return;
    }
    case DecodeAttention::Paged: {  // the cache as blocks of block_size rows, in order
      IL_CHECK(block_size > 0 && k.size(0) % block_size == 0, who, ": blocks of ", block_size,
               " rows must tile the cache of ", k.size(0));
      std::vector<std::int32_t> table(static_cast<std::size_t>(k.size(0) / block_size));
      for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
      paged_decode_attention(q, k, v, table, block_size, len - 1, out);
      return;
    }
    case DecodeAttention::Latent: break;
  }
  fail(who, ": version ", decode_attention_name(version), " reads latent rows: call latent_decode_attention");
}

void latent_decode_attention(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r,
                             Tensor& out) {
  const char* who = "latent_decode_attention";
  IL_CHECK(q.is_cuda() && latent.is_cuda() && out.is_cuda(), who, ": tensors must be on CUDA; got q ", q.describe(),
           ", latent ", latent.describe(), ", out ", out.describe());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&q, &latent, &out})
    IL_CHECK(t->dtype() == DType::F32 && t->is_contiguous(), who, ": ", t->describe(), " must be contiguous f32");
  IL_CHECK(q.ndim() == 3 && q.size(0) == 1 && q.size(1) > 0 && latent.ndim() == 3 && latent.size(1) == 1 &&
               latent.size(2) == q.size(2),
           who, ": expected q [1, N, r + dr] and latent [S, 1, r + dr]; got q ", q.describe(), ", latent ",
           latent.describe());
  const std::int64_t N = q.size(1), R = q.size(2);
  IL_CHECK(r > 0 && r <= R, who, ": the value width r = ", r, " must be in [1, r + dr = ", R, "]");
  IL_CHECK(out.ndim() == 3 && out.size(0) == 1 && out.size(1) == N && out.size(2) == r, who, ": out must be [1, ", N, ", ",
           r, "] (one row of N heads of r values); got ", out.describe());
  IL_CHECK(len > 0 && len <= latent.size(0), who, ": length ", len, " outside the cache of ", latent.size(0), " positions");
  IL_CHECK(R % 4 == 0 && R <= kMaxLatent, who, ": r + dr = ", R, " must be a multiple of 4 and at most ", kMaxLatent,
           " (rows are read as 16-byte vectors, held in registers)");
  IL_CHECK(aligned16(q) && aligned16(latent), who, ": q and latent must start on a 16-byte boundary");
  const std::size_t smem = static_cast<std::size_t>(kLatentHeads * (kChunk + R)) * sizeof(float);
  IL_CHECK(smem <= static_cast<std::size_t>(shared_limit()), who, ": r + dr = ", R, " needs ", smem,
           " bytes of shared memory per block, more than this GPU's ", shared_limit());
  IL_CUDA(cudaFuncSetAttribute(decode::latent, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int splits = splits_for(len);
  const Scratch s = scratch_for(part_floats(N, splits, r), len);
  const unsigned groups = static_cast<unsigned>((N + kLatentHeads - 1) / kLatentHeads);
  decode::latent<<<dim3(groups, static_cast<unsigned>(splits)), kLatentThreads, smem, stream()>>>(
      q.data<float>(), latent.data<float>(), s.pos, s.part, static_cast<int>(N), static_cast<int>(R), static_cast<int>(r),
      scale);
  IL_CUDA_LAUNCHED();
  merge<<<static_cast<unsigned>(N), kThreads, 0, stream()>>>(s.part, out.data<float>(), splits, r, SameRow{});
  IL_CUDA_LAUNCHED();
}

void paged_decode_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                            const std::vector<std::int32_t>& table, std::int64_t block_size, std::int64_t q_offset,
                            Tensor& out, std::int64_t splits) {
  const std::int64_t T = q.size(0), H = q.size(2), K = k_pool.size(-2);  // [slots, K, H] or [blocks, B, K, H]
  IL_CHECK(H <= kMaxHead, "paged_decode_attention: head dimension ", H, " is above the kernel's limit of ", kMaxHead);
  const std::int64_t longest = q_offset + T;
  splits = std::max<std::int64_t>(splits, splits_for(longest));  // each range fits a chunk
  const Shape rows{k_pool.numel() / (K * H), K, H};
  CachedSeq one{{k_pool.view(rows)}, {v_pool.view(rows)}, &table, block_size, longest, 0, T, q_offset};
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(H));
  attention_cached(q, CachedBatch({std::move(one)}, T, (longest + splits - 1) / splits), 0, out, p);
}

void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v) {
  const auto* ctx = batch.device_words().data<std::int64_t>();
  const unsigned rows = static_cast<unsigned>(batch.rows());
  if (rows == 0) return;
  const long long kw = k.size(1) * k.size(2), vw = v.size(1) * v.size(2);
  if (batch.aligned16() && aligned16(k) && aligned16(v))  // 16-byte loads and stores
    store_rows<float4><<<rows, kThreads, 0, stream()>>>(ctx, layer, reinterpret_cast<const float4*>(k.data<float>()),
                                                        reinterpret_cast<const float4*>(v.data<float>()), kw / 4, vw / 4);
  else store_rows<float><<<rows, kThreads, 0, stream()>>>(ctx, layer, k.data<float>(), v.data<float>(), kw, vw);
  IL_CUDA_LAUNCHED();
}

void attention_cached(const Tensor& q, const CachedBatch& batch, std::int64_t layer, Tensor& out, const AttentionParams& p) {
  const char* who = "attention_cached (CUDA)";
  const long long Nq = q.size(1), Dqk = q.size(2), Dv = out.size(2), items = batch.items();
  const long long Nk = batch.seqs().at(0).k.at(0).size(1);
  IL_CHECK(Dqk <= kMaxQk, who, ": query/key head dimension ", Dqk, " is above the kernel's limit of ", kMaxQk);
  IL_CHECK(Nq <= 65535 && items < (1LL << 31) && batch.rows() * Nq < (1LL << 31), who, ": ", items,
           " ranges of positions × ", Nq, " heads over ", batch.rows(), " rows exceed what one launch can hold");
  if (items == 0) return;
  const auto* ctx = batch.device_words().data<std::int64_t>();
  auto* part = static_cast<float*>(scratch(static_cast<std::size_t>(items * Nq * (Dv + 2)) * sizeof(float)));
  decode::paged<<<dim3(static_cast<unsigned>(items), static_cast<unsigned>(Nq)), kThreads, 0, stream()>>>(
      ctx, layer, q.data<float>(), Nq, Nk, Dqk, Dv, p.window, p.causal, p.scale, part);
  IL_CUDA_LAUNCHED();
  merge_paged<<<static_cast<unsigned>(batch.rows() * Nq), kThreads, 0, stream()>>>(ctx, part, out.data<float>(), Nq, Dv);
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::cuda
