// The quantised formats' CUDA products, by number (QMatrix::gemv_version). Version 2, for int8_row, q8_0, q4_0,
// int4 and q4_k, lives in common/quant/gemv_q.cuh: the quants repacked for 16-byte loads when the matrix
// went to the GPU, x in int8 blocks, dp4a. The rest of this file is version 1, every format's.
//
// Version 1: one warp per output row streams the packed weights and unpacks
// them in registers; llm_int8 and q8_0 accumulate int8·int8 products in int32 (__dp4a). The other
// GGUF block formats (q4_0, q4_1, q5_0, q5_1, q2_k … q6_k, iq4_nl, iq4_xs) multiply x rounded through q8_0
// blocks, the function their CPU products compute; their kernels then multiply in f32 (q8_0's
// __dp4a sums would be the next step for them too). The values of the GGUF types beyond q8_0 and
// q4_0 decode in common/quant/blocks.cuh, beside the CPU products of common/quant/blocks.h.
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"
#include "common/quant/blocks.cuh"
#include "common/quant/gemv_q.cuh"
#include "common/quant/qmatrix_impl.h"

namespace inferlab::quant {

namespace {

using cuda::blocks_for;
using cuda::stream;
constexpr int kWarps = 8;
constexpr int kMaxRows = 8;  // rows of x per launch

__constant__ float kE4m3[256];

struct View {  // the quantised matrix as raw device pointers
  const std::uint8_t* data;
  const float* scales;
  const std::uint8_t* zeros;
  int K, group;
};

using quant::half_at;

// The block type of the GGUF formats whose values common/quant/blocks.cuh decodes (F32: none).
__host__ __device__ constexpr gguf::Type gguf_type_of(Format f) {
  switch (f) {
    case Format::Q4_1: return gguf::Type::Q4_1;
    case Format::Q5_0: return gguf::Type::Q5_0;
    case Format::Q5_1: return gguf::Type::Q5_1;
    case Format::Q4_K: return gguf::Type::Q4_K;
    case Format::Q5_K: return gguf::Type::Q5_K;
    case Format::Q6_K: return gguf::Type::Q6_K;
    case Format::Q2_K: return gguf::Type::Q2_K;
    case Format::Q3_K: return gguf::Type::Q3_K;
    case Format::IQ4_NL: return gguf::Type::IQ4_NL;
    case Format::IQ4_XS: return gguf::Type::IQ4_XS;
    default: return gguf::Type::F32;
  }
}

// The 8 weights of row `n` starting at column k (k a multiple of 8), as floats.
template <Format F>
__device__ inline void unpack8(const View& v, long long n, int k, float* w) {
  const int K = v.K;
  if constexpr (F == Format::Int8Tensor || F == Format::Int8Row || F == Format::LlmInt8) {
    const float s = v.scales[F == Format::Int8Tensor ? 0 : n];
    const uint2 raw = *reinterpret_cast<const uint2*>(v.data + n * K + k);
    const std::int8_t* q = reinterpret_cast<const std::int8_t*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = static_cast<float>(q[j]) * s;
  } else if constexpr (F == Format::Int4Sym || F == Format::Int4Asym) {
    const int G = v.group, g = k / G, i = k % G, groups = K / G;  // 8 values in one half of a group
    const float s = v.scales[n * groups + g];
    const float z = F == Format::Int4Sym ? 8.0f : static_cast<float>(v.zeros[n * groups + g]);
    const uint2 raw = *reinterpret_cast<const uint2*>(v.data + n * (K / 2) + g * (G / 2) + i % (G / 2));
    const std::uint8_t* b = reinterpret_cast<const std::uint8_t*>(&raw);
    const int shift = i < G / 2 ? 0 : 4;
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = (static_cast<float>((b[j] >> shift) & 15) - z) * s;
  } else if constexpr (F == Format::Q4_0) {
    const std::uint8_t* b = v.data + n * (K / 32 * 18) + (k / 32) * 18;
    const float d = half_at(b);
    const int o = k % 32;  // 0, 8: low nibbles of bytes o..o+7; 16, 24: high nibbles of bytes o-16..
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int q = o < 16 ? (b[2 + o + j] & 15) : (b[2 + o - 16 + j] >> 4);
      w[j] = static_cast<float>(q - 8) * d;
    }
  } else if constexpr (gguf_type_of(F) != gguf::Type::F32) {
    quant::block_values8<gguf_type_of(F)>(v.data, n, v.K, k, w);  // the other GGUF types (common/quant/blocks.cuh)
  } else if constexpr (F == Format::Fp8E4M3) {
    const float s = v.scales[0];
    const uint2 raw = *reinterpret_cast<const uint2*>(v.data + n * K + k);
    const std::uint8_t* q = reinterpret_cast<const std::uint8_t*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = kE4m3[q[j]] * s;
  }
}

// Weight-only formats: y[m, n] = Σ_k x[m, k] · w(n, k) for up to kMaxRows rows of x.
template <Format F>
__global__ void qgemv(View v, const float* __restrict__ x, float* __restrict__ y, int M, int N) {
  const long long n = blockIdx.x * (long long)kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  float acc[kMaxRows] = {};
  for (int k = lane * 8; k < v.K; k += 32 * 8) {
    float w[8];
    unpack8<F>(v, n, k, w);
    for (int m = 0; m < M; ++m) {
      const float4 a = *reinterpret_cast<const float4*>(x + (long long)m * v.K + k);
      const float4 b = *reinterpret_cast<const float4*>(x + (long long)m * v.K + k + 4);
      acc[m] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
  }
  for (int m = 0; m < M; ++m) {
    float s = acc[m];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[(long long)m * N + n] = s;
  }
}

// --- llm_int8 ---------------------------------------------------------------------------------
// Columns of x with any |x| ≥ threshold.
__global__ void mark_outliers(const float* __restrict__ x, int M, int K, float threshold, int* __restrict__ flag) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < K; k += gridDim.x * blockDim.x) {
    int f = 0;
    for (int m = 0; m < M; ++m) f |= fabsf(x[(long long)m * K + k]) >= threshold;
    flag[k] = f;
  }
}

// Each row of x to int8 by its absmax over the non-outlier columns (outlier columns get 0).
__global__ void quantize_rows(const float* __restrict__ x, const int* __restrict__ flag, int K, std::int8_t* __restrict__ xq,
                              float* __restrict__ sx) {
  const float* r = x + (long long)blockIdx.x * K;
  float a = 0.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x)
    if (!flag[k]) a = fmaxf(a, fabsf(r[k]));
  a = cuda::block_max(a);
  const float s = a > 0 ? a / 127.0f : 1.0f;
  for (int k = threadIdx.x; k < K; k += blockDim.x)
    xq[(long long)blockIdx.x * K + k] =
        flag[k] ? 0 : static_cast<std::int8_t>(fminf(fmaxf(roundf(r[k] / s), -127.0f), 127.0f));  // half away, as std::round
  if (threadIdx.x == 0) sx[blockIdx.x] = s;
}

__global__ void llm_int8_gemv(View v, const float* __restrict__ x, const std::int8_t* __restrict__ xq,
                              const float* __restrict__ sx, const int* __restrict__ flag, float* __restrict__ y, int M,
                              int N) {
  const long long n = blockIdx.x * (long long)kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, K = v.K;
  if (n >= N) return;
  const std::int8_t* wr = reinterpret_cast<const std::int8_t*>(v.data) + n * K;
  const float sw = v.scales[n];
  for (int m = 0; m < M; ++m) {
    int acc = 0;
    float hi = 0.0f;
    for (int k = lane * 4; k < K; k += 32 * 4) {  // four int8 products per __dp4a
      acc = __dp4a(*reinterpret_cast<const int*>(wr + k), *reinterpret_cast<const int*>(xq + (long long)m * K + k), acc);
      for (int j = 0; j < 4; ++j)
        if (flag[k + j])
          hi += __half2float(__float2half_rn(x[(long long)m * K + k + j])) *
                __half2float(__float2half_rn(static_cast<float>(wr[k + j]) * sw));
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o), hi += __shfl_xor_sync(0xffffffffu, hi, o);
    if (lane == 0) y[(long long)m * N + n] = static_cast<float>(acc) * sx[m] * sw + hi;
  }
}

// --- q8_0 ---------------------------------------------------------------------------------------
// One block of 32 activations as the CPU reference quantiser makes it: the f16 scale d = max |x| /
// 127, and the multiplier 1 / d (0 where d is 0 or 1 / d overflows: the block is zeros).
__device__ inline float q8_0_scale(const float* p, __half& h) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(p[i]));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  h = __float2half_rn(d);
  return isfinite(id) ? id : 0.0f;
}

// x into q8_0 blocks (one thread per block).
__global__ void quantize_q8_0(const float* __restrict__ x, long long blocks, std::uint8_t* __restrict__ out) {
  const long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const float* p = x + b * 32;
  __half h;
  const float id = q8_0_scale(p, h);
  // One 16-bit store of the scale's bits (b * 34 is even, so it is aligned). Copying the __half
  // byte by byte (memcpy) is miscompiled by nvcc 13.0's ptxas for sm_90: it turns the low byte's
  // store into a conversion of the half's value to an unsigned byte (F2I.U8.F16), which writes 0
  // for every scale below 1, so the block's scale loses its low 8 bits.
  *reinterpret_cast<unsigned short*>(out + b * 34) = __half_as_ushort(h);
  for (int i = 0; i < 32; ++i) out[b * 34 + 2 + i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(roundf(p[i] * id)));
}

// x rounded through its q8_0 blocks, d·round(x / d), for the GGUF block formats but q8_0: the x
// their CPU products multiply (q8_0_activations). The weight-only kernels then run on it unchanged.
__global__ void round_q8_0(const float* __restrict__ x, long long blocks, float* __restrict__ out) {
  const long long b = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const float* p = x + b * 32;
  __half h;
  const float id = q8_0_scale(p, h), d = __half2float(h);
  for (int i = 0; i < 32; ++i) out[b * 32 + i] = d * static_cast<float>(static_cast<std::int8_t>(roundf(p[i] * id)));
}

__global__ void q8_0_gemv(View v, const std::uint8_t* __restrict__ xq, float* __restrict__ y, int M, int N) {
  const long long n = blockIdx.x * (long long)kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32, nb = v.K / 32;
  if (n >= N) return;
  for (int m = 0; m < M; ++m) {
    float s = 0.0f;
    for (int b = lane; b < nb; b += 32) {  // a lane per block: 32 int8 products in 8 __dp4a
      const std::uint8_t* wb = v.data + (n * nb + b) * 34;
      const std::uint8_t* xb = xq + ((long long)m * nb + b) * 34;
      int sumi = 0;
      for (int i = 0; i < 32; i += 4) {
        int a, c;
        memcpy(&a, wb + 2 + i, 4), memcpy(&c, xb + 2 + i, 4);
        sumi = __dp4a(a, c, sumi);
      }
      s += static_cast<float>(sumi) * (half_at(wb) * half_at(xb));
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) y[(long long)m * N + n] = s;
  }
}

template <Format F>
void launch_weight_only(const View& v, const float* x, int M, Tensor& out, int N) {
  for (int m0 = 0; m0 < M; m0 += kMaxRows) {
    const int rows = std::min(kMaxRows, M - m0);
    qgemv<F><<<blocks_for(N, kWarps), kWarps * 32, 0, stream()>>>(v, x + (long long)m0 * v.K,
                                                                  out.data<float>() + (long long)m0 * N, rows, N);
    IL_CUDA_LAUNCHED();
  }
}

template <Format F>
void launch_weight_only(const View& v, const Tensor& x, Tensor& out, int N) {
  launch_weight_only<F>(v, x.data<float>(), static_cast<int>(x.size(0)), out, N);
}

// The GGUF block formats but q8_0: x rounded through its q8_0 blocks (into scratch), then the
// weight-only kernel.
template <Format F>
void launch_blocked(const View& v, const Tensor& x, Tensor& out, int N) {
  const int M = static_cast<int>(x.size(0));
  const long long blocks = static_cast<long long>(M) * (v.K / 32);
  auto* xh = static_cast<float*>(cuda::scratch(static_cast<std::size_t>(blocks) * 32 * sizeof(float)));
  round_q8_0<<<blocks_for(blocks, 128), 128, 0, stream()>>>(x.data<float>(), blocks, xh);
  IL_CUDA_LAUNCHED();
  launch_weight_only<F>(v, xh, M, out, N);
}

// Version 2 of `kind` (common/quant/gemv_q.cuh) on w's repacked quants where it has them, else its data.
void launch_v2(quant::qgemv::Kind kind, const QMatrix& w, const Tensor& x, Tensor& out) {
  using quant::qgemv::Kind;
  const quant::qgemv::Weights v{
      static_cast<const std::uint8_t*>(w.gpu_quants.defined() ? w.gpu_quants.raw_data() : w.data.raw_data()),
      w.gpu_scales.defined() ? static_cast<const std::uint16_t*>(w.gpu_scales.raw_data()) : nullptr,
      w.gpu_sub.defined() ? w.gpu_sub.data<std::uint8_t>() : nullptr,
      w.scales.defined() ? w.scales.data<float>() : nullptr,
      w.zeros.defined() ? w.zeros.data<std::uint8_t>() : nullptr,
      static_cast<int>(w.cols),
      w.spec.group};
  IL_CHECK(w.gpu_quants.defined() == quant::qgemv::repacked(kind, w.spec.group), "qmatmul (CUDA): a ", w.spec.name(),
           " matrix without version 2's layout; move it with QMatrix::to(Device::CUDA)");
  const int M = static_cast<int>(x.size(0)), N = static_cast<int>(w.rows);
  const float* xp = x.data<float>();
  float* y = out.data<float>();
  switch (kind) {
    case Kind::Int8Row: return quant::qgemv::gemv<Kind::Int8Row>(v, xp, M, y, N);
    case Kind::Q8_0: return quant::qgemv::gemv<Kind::Q8_0>(v, xp, M, y, N);
    case Kind::Q4_0: return quant::qgemv::gemv<Kind::Q4_0>(v, xp, M, y, N);
    case Kind::Int4Sym: return quant::qgemv::gemv<Kind::Int4Sym>(v, xp, M, y, N);
    case Kind::Int4Asym: return quant::qgemv::gemv<Kind::Int4Asym>(v, xp, M, y, N);
    case Kind::Q4_K: return quant::qgemv::gemv<Kind::Q4_K>(v, xp, M, y, N);
    default: fail("qmatmul (CUDA): version 2 has no kernel for ", w.spec.name());
  }
}

}  // namespace

void cuda_qmatmul(const Tensor& x, const QMatrix& w, Tensor& out) {
  static bool table_ready = false;
  if (!table_ready) {
    float t[256];
    for (int b = 0; b < 256; ++b) t[b] = e4m3_to_f32(static_cast<std::uint8_t>(b));
    // On InferLab's stream, so that the kernels queued after it are ordered after the upload.
    IL_CUDA(cudaMemcpyToSymbolAsync(kE4m3, t, sizeof t, 0, cudaMemcpyHostToDevice, stream()));
    table_ready = true;
  }
  const int M = static_cast<int>(x.size(0)), N = static_cast<int>(w.rows), K = static_cast<int>(w.cols);
  IL_CHECK(K % 32 == 0, "qmatmul (CUDA): the input width n_in = ", K, " must be a multiple of 32");
  IL_CHECK(!blocks_activations(w.spec.format) || K % gguf::block_values(gguf_type(w.spec.format)) == 0,
           "qmatmul (CUDA): ", w.spec.name(), " rows are whole super-blocks of 256, got n_in = ", K);
  if (M == 0 || N == 0) return;  // nothing to compute (and a grid of zero blocks is a launch error)
  if ((w.gemv_version ? w.gemv_version : default_qgemv_version()) == 2)
    if (const auto kind = qgemv_kind(w.spec.format)) return launch_v2(*kind, w, x, out);
  const View v{static_cast<const std::uint8_t*>(w.data.raw_data()), w.scales.defined() ? w.scales.data<float>() : nullptr,
               w.zeros.defined() ? w.zeros.data<std::uint8_t>() : nullptr, K, w.spec.group};
  switch (w.spec.format) {
    case Format::Int8Tensor: return launch_weight_only<Format::Int8Tensor>(v, x, out, N);
    case Format::Int8Row: return launch_weight_only<Format::Int8Row>(v, x, out, N);
    case Format::Int4Sym: return launch_weight_only<Format::Int4Sym>(v, x, out, N);
    case Format::Int4Asym: return launch_weight_only<Format::Int4Asym>(v, x, out, N);
    case Format::Q4_0: return launch_blocked<Format::Q4_0>(v, x, out, N);
    case Format::Fp8E4M3: return launch_weight_only<Format::Fp8E4M3>(v, x, out, N);
    case Format::Q4_K: return launch_blocked<Format::Q4_K>(v, x, out, N);
    case Format::Q6_K: return launch_blocked<Format::Q6_K>(v, x, out, N);
    case Format::Q4_1: return launch_blocked<Format::Q4_1>(v, x, out, N);
    case Format::Q5_0: return launch_blocked<Format::Q5_0>(v, x, out, N);
    case Format::Q5_1: return launch_blocked<Format::Q5_1>(v, x, out, N);
    case Format::Q5_K: return launch_blocked<Format::Q5_K>(v, x, out, N);
    case Format::Q2_K: return launch_blocked<Format::Q2_K>(v, x, out, N);
    case Format::Q3_K: return launch_blocked<Format::Q3_K>(v, x, out, N);
    case Format::IQ4_NL: return launch_blocked<Format::IQ4_NL>(v, x, out, N);
    case Format::IQ4_XS: return launch_blocked<Format::IQ4_XS>(v, x, out, N);
    case Format::LlmInt8: {
      char* base =
          static_cast<char*>(cuda::scratch(static_cast<std::size_t>(K) * 4 + static_cast<std::size_t>(M) * K + M * 4 + 512));
      int* flag = reinterpret_cast<int*>(base);
      std::int8_t* xq = reinterpret_cast<std::int8_t*>(base + static_cast<std::size_t>(K) * 4);
      float* sx = reinterpret_cast<float*>(
          base + ((static_cast<std::size_t>(K) * 4 + static_cast<std::size_t>(M) * K + 255) / 256) * 256);
      mark_outliers<<<blocks_for(K, 256), 256, 0, stream()>>>(x.data<float>(), M, K, w.spec.threshold, flag);
      quantize_rows<<<M, 256, 0, stream()>>>(x.data<float>(), flag, K, xq, sx);
      for (int m0 = 0; m0 < M; m0 += kMaxRows) {
        const int rows = std::min(kMaxRows, M - m0);
        llm_int8_gemv<<<blocks_for(N, kWarps), kWarps * 32, 0, stream()>>>(v, x.data<float>() + (long long)m0 * K,
                                                                           xq + (long long)m0 * K, sx + m0, flag,
                                                                           out.data<float>() + (long long)m0 * N, rows, N);
      }
      IL_CUDA_LAUNCHED();
      return;
    }
    case Format::Q8_0: {
      const long long blocks = static_cast<long long>(M) * (K / 32);
      auto* xq = static_cast<std::uint8_t*>(cuda::scratch(static_cast<std::size_t>(blocks) * 34));
      quantize_q8_0<<<blocks_for(blocks, 128), 128, 0, stream()>>>(x.data<float>(), blocks, xq);
      for (int m0 = 0; m0 < M; m0 += kMaxRows) {
        const int rows = std::min(kMaxRows, M - m0);
        q8_0_gemv<<<blocks_for(N, kWarps), kWarps * 32, 0, stream()>>>(v, xq + (long long)m0 * (K / 32) * 34,
                                                                       out.data<float>() + (long long)m0 * N, rows, N);
      }
      IL_CUDA_LAUNCHED();
      return;
    }
    default: fail("qmatmul (CUDA): ", w.spec.name(), " is not a quantised format");
  }
}

}  // namespace inferlab::quant
