// CUDA kernels of the core ops. Each mirrors its reference loop in ops_ref.cpp; most are plain
// versions (the chapters add tuned ones beside them). Attention's decode rows are the exception:
// every chapter's decode step on the GPU runs through this op, so they are split over chunks of
// keys (flash-decoding, as chapter 02's fused decoder does it).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/cuda/backend.h"
#include "common/cuda/decode_attention.cuh"
#include "common/cuda/gemv.cuh"
#include "common/cuda/util.cuh"

namespace inferlab::cuda {

namespace {

// Calls f with a null pointer of the C++ type that stores weight dtype d.
template <class F>
void with_weight_type(DType d, F&& f) {
  switch (d) {
    case DType::F32: f(static_cast<const float*>(nullptr)); break;
    case DType::BF16: f(static_cast<const __nv_bfloat16*>(nullptr)); break;
    case DType::F16: f(static_cast<const __half*>(nullptr)); break;
    default: fail("CUDA op: weight dtype ", dtype_name(d), " is not supported");
  }
}

template <class W>
__global__ void convert_f32(const float* __restrict__ in, W* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    if constexpr (sizeof(W) == 2 && std::is_same_v<W, __half>) out[i] = __float2half_rn(in[i]);
    else out[i] = __float2bfloat16_rn(in[i]);
  }
}

GemvKernel g_gemv = GemvKernel::Own;
// 0 until chosen: then INFERLAB_GEMV_VERSION, or the default.
int g_gemv_version = 0;

}  // namespace

void set_gemv_kernel(GemvKernel k) { g_gemv = k; }
void set_gemv_version(GemvVersion v) {
  IL_CHECK(v >= GemvVersion::WarpRow && v <= GemvVersion::NormFused, "set_gemv_version: no GEMV version ",
           static_cast<int>(v), " (there are 1 to 3)");
  g_gemv_version = static_cast<int>(v);
}
GemvVersion gemv_version() {
  if (g_gemv_version == 0) {
    const char* env = std::getenv("INFERLAB_GEMV_VERSION");
    const std::string v = env ? env : "";
    IL_CHECK(v.empty() || v == "1" || v == "2" || v == "3", "INFERLAB_GEMV_VERSION=", v, ": expected 1, 2 or 3");
    g_gemv_version = v.empty() ? static_cast<int>(kDefaultGemvVersion) : v[0] - '0';
  }
  return static_cast<GemvVersion>(g_gemv_version);
}

void matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  const long long M = x.size(0), K = x.size(1), N = w.size(0);
  if (M == 0 || N == 0) return;               // an empty product (and a grid of zero blocks is a launch error)
  if (M == 1 && g_gemv == GemvKernel::Own) {  // decode: the GEMV family of gemv.cuh
    with_weight_type(w.dtype(), [&](auto* tag) {
      using W = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
      const GemvSegments<W> s{{static_cast<const W*>(w.raw_data()), nullptr, nullptr},
                              {nullptr, nullptr, nullptr},
                              {static_cast<int>(N), 0, 0},
                              1};
      // No RMSNorm precedes a plain product: version 3 is version 2 here.
      if (gemv_version() == GemvVersion::WarpRow) launch_gemv(s, x.data<float>(), out.data<float>(), K, false);
      else launch_gemv_staged(s, x.data<float>(), out.data<float>(), K, false);
    });
    return;
  }
  // cuBLAS is column-major: our row-major out[M,N] is its N×M matrix out' = w'ᵀ·x' where w' is
  // w viewed as K×N and x' is x viewed as K×M.
  const float alpha = 1.0f, beta = 0.0f;
  if (w.dtype() == DType::F32) {
    IL_CUBLAS(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                          &alpha, w.data<float>(), static_cast<int>(K), x.data<float>(), static_cast<int>(K), &beta,
                          out.data<float>(), static_cast<int>(N)));
    count_launch();  // a cuBLAS call counts as one launch
    return;
  }
  // 16-bit weights: cuBLAS wants both inputs in one type, so the activations are rounded to the
  // weights' type first (as every bf16 inference engine does); accumulation stays f32.
  const bool bf = w.dtype() == DType::BF16;
  void* xh = scratch(static_cast<std::size_t>(M * K) * 2);
  if (bf)
    convert_f32<__nv_bfloat16>
        <<<blocks_for(M * K, 256), 256, 0, stream()>>>(x.data<float>(), static_cast<__nv_bfloat16*>(xh), M * K);
  else convert_f32<__half><<<blocks_for(M * K, 256), 256, 0, stream()>>>(x.data<float>(), static_cast<__half*>(xh), M * K);
  IL_CUDA_LAUNCHED();
  const cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_16F;
  IL_CUBLAS(cublasGemmEx(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M), static_cast<int>(K),
                         &alpha, w.raw_data(), t, static_cast<int>(K), xh, t, static_cast<int>(K), &beta, out.data<float>(),
                         CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  count_launch();
}

void gemv(GemvVersion version, const Tensor& x, const GemvArgs& a, Tensor& out) {
  const char* who = "cuda::gemv";
  IL_CHECK(version >= GemvVersion::WarpRow && version <= GemvVersion::NormFused, who, ": no GEMV version ",
           static_cast<int>(version), " (there are 1 to 3)");
  const int count = static_cast<int>(a.weights.size());
  IL_CHECK(count >= 1 && count <= 3 && (!a.swiglu || count == 2), who,
           ": expected 1 to 3 weight matrices (2 with swiglu), got ", count);
  IL_CHECK(x.is_cuda() && x.dtype() == DType::F32 && x.is_contiguous() && x.ndim() >= 1 && x.ndim() <= 2 &&
               (x.ndim() == 1 || x.size(0) == 1),
           who, ": x must be one contiguous f32 row on CUDA, got ", x.describe());
  const long long K = x.numel();
  long long total = 0;
  for (const Tensor& w : a.weights) {
    IL_CHECK(w.is_cuda() && w.is_contiguous() && w.ndim() == 2 && w.size(1) == K && w.dtype() == a.weights[0].dtype(), who,
             ": weights must be contiguous [rows, ", K, "] on CUDA, all of one dtype; got ", w.describe());
    total += w.size(0);
  }
  IL_CHECK(!a.swiglu || a.weights[0].shape() == a.weights[1].shape(), who, ": gate ", a.weights[0].describe(), " and up ",
           a.weights[1].describe(), " differ in shape");
  const long long rows = a.swiglu ? a.weights[0].size(0) : total;
  IL_CHECK(out.is_cuda() && out.dtype() == DType::F32 && out.is_contiguous() && out.numel() == rows, who,
           ": out must be contiguous f32 on CUDA with ", rows, " elements, got ", out.describe());
  IL_CHECK(a.biases.empty() || (!a.swiglu && a.biases.size() == a.weights.size()), who,
           ": biases: none, or one per weight matrix (none with swiglu)");
  IL_CHECK(!(a.swiglu && a.accumulate), who, ": swiglu does not accumulate");
  const float* bias[3] = {nullptr, nullptr, nullptr};
  for (std::size_t i = 0; i < a.biases.size(); ++i) {
    const Tensor& b = a.biases[i];
    if (!b.defined()) continue;
    IL_CHECK(b.is_cuda() && b.dtype() == DType::F32 && b.is_contiguous() && b.numel() == a.weights[i].size(0), who,
             ": bias ", i, " must be contiguous f32 on CUDA with ", a.weights[i].size(0), " elements, got ", b.describe());
    bias[i] = b.data<float>();
  }
  const bool fused = version == GemvVersion::NormFused;
  IL_CHECK(fused == a.norm.defined(), who, ": version 3 needs the RMSNorm's weight (norm), versions 1 and 2 take none");
  if (fused)
    IL_CHECK(a.norm.is_cuda() && a.norm.dtype() == DType::F32 && a.norm.is_contiguous() && a.norm.numel() == K, who,
             ": norm must be contiguous f32 on CUDA with ", K, " elements, got ", a.norm.describe());
  const float* norm = fused ? a.norm.data<float>() : nullptr;
  if (total == 0) return;
  with_weight_type(a.weights[0].dtype(), [&](auto* tag) {
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    const W* w[3] = {nullptr, nullptr, nullptr};
    int n[3] = {0, 0, 0};
    for (int i = 0; i < count; ++i)
      w[i] = static_cast<const W*>(a.weights[i].raw_data()), n[i] = static_cast<int>(a.weights[i].size(0));
    if (a.swiglu) {
      launch_gemv_swiglu(version, w[0], w[1], x.data<float>(), out.data<float>(), n[0], K, norm, a.eps);
    } else {
      const GemvSegments<W> s{{w[0], w[1], w[2]}, {bias[0], bias[1], bias[2]}, {n[0], n[1], n[2]}, count};
      launch_gemv(version, s, x.data<float>(), out.data<float>(), K, a.accumulate, norm, a.eps);
    }
  });
}

// ---------------------------------------------------------------------------------------------
namespace {

__global__ void add_kernel(const float* a, const float* b, float* out, long long n, long long bn) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i % bn];
}

__global__ void rope_kernel(float* x, const int* pos, const float* inv_freq, long long T, long long heads, long long D,
                            long long begin, long long half, bool adjacent) {
  const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;  // one (t, j) pair
  if (i >= T * half) return;
  const long long t = i / half, j = i % half;
  double s, c;
  sincos(static_cast<double>(pos[t]) * static_cast<double>(inv_freq[j]), &s, &c);  // angle in double, as on the CPU
  const float cf = static_cast<float>(c), sf = static_cast<float>(s);
  const long long ia = adjacent ? 2 * j : j, ib = adjacent ? 2 * j + 1 : j + half;
  for (long long h = 0; h < heads; ++h) {
    float* row = x + (t * heads + h) * D + begin;
    const float a = row[ia], b = row[ib];
    row[ia] = a * cf - b * sf;
    row[ib] = a * sf + b * cf;
  }
}

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out, long long N) {
  const float* xr = x + blockIdx.x * N;
  float* orow = out + blockIdx.x * N;
  float mx = -INFINITY;
  for (long long i = threadIdx.x; i < N; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (long long i = threadIdx.x; i < N; i += blockDim.x) sum += (orow[i] = expf(xr[i] - mx));
  sum = block_sum(sum);
  for (long long i = threadIdx.x; i < N; i += blockDim.x) orow[i] /= sum;
}

__global__ void swiglu_kernel(const float* g, const float* u, float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

template <class W>
__global__ void embedding_kernel(const W* __restrict__ table, const int* __restrict__ ids, float* __restrict__ out,
                                 long long D) {
  const W* row = table + static_cast<long long>(ids[blockIdx.x]) * D;
  for (long long i = threadIdx.x; i < D; i += blockDim.x) out[blockIdx.x * D + i] = to_f(row[i]);
}

// Attention, one block per (query row, head), online softmax over chunks of blockDim keys:
// each thread scores one key of the chunk, the block rescales its running sum and output by
// exp(old max - new max), then each thread accumulates its output dimensions. The query row
// sits in shared memory; each thread keeps kDims output dimensions in registers, which bounds
// Dv (512 covers MLA with the up-projections absorbed: Dqk = 576, Dv = 512).
constexpr int kAttnThreads = 128;
constexpr int kAttnMaxQk = 1024;
constexpr int kAttnMaxV = 512;

// The sequences of one launch (a ragged batch's row starts, as in RaggedBatch), passed by value
// as a kernel argument: nothing is copied to the device first. (Decode rows use the scratch
// buffer for their chunks' partial results, so a CUDA graph must not capture this op: a growing
// scratch would free memory the graph holds.) A batch of more sequences takes several launches.
constexpr int kAttnSeqs = 32;
static_assert(kAttnSeqs <= decode::kSeqs && kAttnMaxQk <= decode::kMaxQk,
              "the decode rows of a launch go to the ragged decode kernel whole");
struct AttnSeqs {
  long long q_start[kAttnSeqs + 1];
  long long kv_start[kAttnSeqs + 1];
  long long q_offset[kAttnSeqs];
};

__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                 float* __restrict__ out, AttnSeqs seqs, long long Nq, long long Nk, long long Dqk,
                                 long long Dv, long long window, float scale, bool causal) {
  // (Sequences of a single query row go to the ragged decode kernel: attention() launches this kernel only
  // over the rows of the others.)
  __shared__ float qs[kAttnMaxQk];
  __shared__ float ps[kAttnThreads];
  const long long row = seqs.q_start[0] + blockIdx.x, h = blockIdx.y, kvh = h / (Nq / Nk);
  int b = 0;  // the row is query t of sequence b
  while (seqs.q_start[b + 1] <= row) ++b;
  if (seqs.q_start[b + 1] - seqs.q_start[b] == 1) return;  // a decode row: the ragged decode kernel's
  const long long t = row - seqs.q_start[b], S = seqs.kv_start[b + 1] - seqs.kv_start[b];
  k += seqs.kv_start[b] * Nk * Dqk;  // the sequence's own keys and values
  v += seqs.kv_start[b] * Nk * Dv;
  const long long hi = causal ? seqs.q_offset[b] + t : S - 1;
  const long long lo = window > 0 ? max(0LL, hi - window + 1) : 0;
  for (long long d = threadIdx.x; d < Dqk; d += blockDim.x) qs[d] = q[(row * Nq + h) * Dqk + d];
  __syncthreads();
  constexpr int kDims = kAttnMaxV / kAttnThreads;  // output dimensions per thread
  float acc[kDims] = {};
  float m = -INFINITY, l = 0.0f;
  for (long long j0 = lo; j0 <= hi; j0 += blockDim.x) {
    const long long j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j <= hi) {
      const float* kr = k + (j * Nk + kvh) * Dqk;
      float dot = 0.0f;
      for (long long d = 0; d < Dqk; ++d) dot += qs[d] * kr[d];
      s = dot * scale;
    }
    const float m_new = fmaxf(m, block_max(s));
    const float correction = expf(m - m_new);  // 0 on the first chunk (m = -inf)
    const float p = j <= hi ? expf(s - m_new) : 0.0f;
    __syncthreads();
    ps[threadIdx.x] = p;
    const float chunk_sum = block_sum(p);  // synchronises, so ps[] is complete
    l = l * correction + chunk_sum;
    const long long n = min(static_cast<long long>(blockDim.x), hi - j0 + 1);
#pragma unroll
    for (int c = 0; c < kDims; ++c) {
      const long long d = threadIdx.x + c * blockDim.x;
      if (d < Dv) {
        float a = acc[c] * correction;
        for (long long i = 0; i < n; ++i) a += ps[i] * v[((j0 + i) * Nk + kvh) * Dv + d];
        acc[c] = a;
      }
    }
    m = m_new;
  }
#pragma unroll
  for (int c = 0; c < kDims; ++c) {
    const long long d = threadIdx.x + c * blockDim.x;
    if (d < Dv) out[(row * Nq + h) * Dv + d] = acc[c] / l;
  }
}

// Decode rows (a sequence with one query row, as in every decode step) go to version 4 of the
// decode-attention family (decode_attention.cuh, `ragged`): the kernel above gives each (row,
// head) one block whose threads each read a whole key row, which at decode is a few blocks for the
// whole GPU and uncoalesced reads (45 GB/s on an H200, 1% of its bandwidth). Whether a row goes
// there depends on its own sequence only, so a sequence gets the same bits alone or in any batch.

__global__ void argmax_kernel(const float* __restrict__ x, int* __restrict__ out, long long N) {
  const int i = block_argmax(x + blockIdx.x * N, N);
  if (threadIdx.x == 0) out[blockIdx.x] = i;
}

}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) {
  if (a.numel() == 0) return;
  add_kernel<<<blocks_for(a.numel(), 256), 256, 0, stream()>>>(a.data<float>(), b.data<float>(), out.data<float>(),
                                                               a.numel(), b.numel());
  IL_CUDA_LAUNCHED();
}

void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) {
  const long long D = x.size(-1), rows = x.numel() / D;
  if (rows == 0) return;
  with_weight_type(w.dtype(), [&](auto* tag) {
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    rmsnorm_rows<W><<<static_cast<unsigned>(rows), 256, 0, stream()>>>(x.data<float>(), static_cast<const W*>(w.raw_data()),
                                                                       out.data<float>(), D, eps);
    IL_CUDA_LAUNCHED();
  });
}

void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing, std::int64_t begin) {
  const long long T = x.size(0), half = inv_freq.size(0);
  if (T * half == 0) return;
  rope_kernel<<<blocks_for(T * half, 256), 256, 0, stream()>>>(x.data<float>(), positions.data<std::int32_t>(),
                                                               inv_freq.data<float>(), T, x.size(1), x.size(2), begin, half,
                                                               pairing == RopePairing::Adjacent);
  IL_CUDA_LAUNCHED();
}

void softmax(const Tensor& x, Tensor& out) {
  const long long N = x.size(-1), rows = x.numel() / N;
  if (rows == 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows), 256, 0, stream()>>>(x.data<float>(), out.data<float>(), N);
  IL_CUDA_LAUNCHED();
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  if (gate.numel() == 0) return;
  swiglu_kernel<<<blocks_for(gate.numel(), 256), 256, 0, stream()>>>(gate.data<float>(), up.data<float>(), out.data<float>(),
                                                                     gate.numel());
  IL_CUDA_LAUNCHED();
}

void embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  if (ids.size(0) == 0) return;
  with_weight_type(table.dtype(), [&](auto* tag) {
    using W = std::remove_cv_t<std::remove_pointer_t<decltype(tag)>>;
    embedding_kernel<W><<<static_cast<unsigned>(ids.size(0)), 256, 0, stream()>>>(
        static_cast<const W*>(table.raw_data()), ids.data<std::int32_t>(), out.data<float>(), table.size(1));
    IL_CUDA_LAUNCHED();
  });
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
               const AttentionParams& p) {
  const long long Nq = q.size(1), Dqk = q.size(2), Dv = v.size(2);
  IL_CHECK(Dqk <= kAttnMaxQk, "attention (CUDA): query/key head dimension ", Dqk, " is above this kernel's limit of ",
           kAttnMaxQk);
  IL_CHECK(Dv <= kAttnMaxV, "attention (CUDA): value head dimension ", Dv, " is above this kernel's limit of ", kAttnMaxV);
  const std::size_t B = batch.q_offsets.size();
  for (std::size_t b0 = 0; b0 < B; b0 += kAttnSeqs) {
    const std::size_t n = std::min<std::size_t>(kAttnSeqs, B - b0);
    AttnSeqs seqs{};
    for (std::size_t b = 0; b <= n; ++b)
      seqs.q_start[b] = batch.q_starts[b0 + b], seqs.kv_start[b] = batch.kv_starts[b0 + b];
    for (std::size_t b = 0; b < n; ++b) seqs.q_offset[b] = batch.q_offsets[b0 + b];
    const long long rows = seqs.q_start[n] - seqs.q_start[0];
    if (rows == 0) continue;
    // The sequences of one query row go to the ragged decode kernel, with the keys each attends; the
    // plain kernel skips their rows.
    decode::RaggedSeqs one{};
    int count = 0;
    long long longest = 0;
    for (std::size_t b = 0; b < n; ++b) {
      if (seqs.q_start[b + 1] - seqs.q_start[b] != 1) continue;
      const long long S = seqs.kv_start[b + 1] - seqs.kv_start[b], hi = p.causal ? seqs.q_offset[b] : S - 1;
      const long long lo = p.window > 0 ? std::max(0LL, hi - p.window + 1) : 0;
      one.row[count] = seqs.q_start[b], one.kv_start[count] = seqs.kv_start[b], one.lo[count] = lo, one.hi[count] = hi;
      longest = std::max(longest, hi - lo + 1), ++count;
    }
    if (count < rows) {
      dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(Nq));
      attention_kernel<<<grid, kAttnThreads, 0, stream()>>>(q.data<float>(), k.data<float>(), v.data<float>(),
                                                            out.data<float>(), seqs, Nq, k.size(1), Dqk, Dv, p.window,
                                                            p.scale, p.causal);
      IL_CUDA_LAUNCHED();
    }
    if (count > 0 && longest > 0) {
      const long long chunks = (longest + decode::kChunk - 1) / decode::kChunk;
      IL_CHECK(chunks <= 65535, "attention (CUDA): a decode row over ", longest, " keys needs ", chunks, " chunks of ",
               decode::kChunk, ", above the 65,535 a launch can hold");
      const int splits = static_cast<int>(chunks);
      auto* part = static_cast<float*>(scratch(static_cast<std::size_t>(count) * Nq * splits * (Dv + 2) * sizeof(float)));
      decode::ragged<<<dim3(static_cast<unsigned>(count), static_cast<unsigned>(Nq), static_cast<unsigned>(splits)),
                       decode::kThreads, 0, stream()>>>(q.data<float>(), k.data<float>(), v.data<float>(), one, Nq,
                                                        k.size(1), Dqk, Dv, p.scale, part);
      IL_CUDA_LAUNCHED();
      decode::merge<<<static_cast<unsigned>(count * Nq), decode::kThreads, 0, stream()>>>(part, out.data<float>(), splits,
                                                                                          Dv, decode::RaggedRow{one, Nq});
      IL_CUDA_LAUNCHED();
    }
  }
}

void argmax(const Tensor& x, Tensor& out) {
  if (x.size(0) == 0) return;
  argmax_kernel<<<static_cast<unsigned>(x.size(0)), 256, 0, stream()>>>(x.data<float>(), out.data<std::int32_t>(),
                                                                        x.size(1));
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::cuda
