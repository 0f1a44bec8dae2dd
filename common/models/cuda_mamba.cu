// Chapter 07's kernels: see cuda_mamba.h for what each does and why.
#include "common/models/cuda_mamba.h"

#include <algorithm>

#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"

namespace inferlab::models::mamba {

namespace {

constexpr int kLanes = 16;   // state lanes of a chunk: a half warp
constexpr int kChunks = 16;  // chunks of the sequence per channel
constexpr int kPerLane = 4;  // states per lane, so N <= 64
constexpr int kMaxN = kLanes * kPerLane;

__device__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// Sum over the 16 lanes of a half warp (every lane of the warp must call it).
__device__ float half_warp_sum(float v) {
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One block per channel c; thread = (chunk, lane), lane handling states lane, lane + 16, ...
__global__ void __launch_bounds__(kLanes* kChunks) scan_chunked(ScanView v, float* __restrict__ h) {
  __shared__ float prod_s[kChunks][kMaxN], end_s[kChunks][kMaxN], start_s[kChunks][kMaxN];
  const long long c = blockIdx.x;
  const int lane = threadIdx.x % kLanes, chunk = threadIdx.x / kLanes;
  const long long len = (v.T + kChunks - 1) / kChunks, t0 = chunk * len, t1 = t0 + len < v.T ? t0 + len : v.T;
  float a[kPerLane], s[kPerLane], p[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int n = lane + i * kLanes;
    a[i] = n < v.N ? v.A[c * v.N + n] : 0.0f;
    s[i] = 0.0f, p[i] = 1.0f;
  }
  // 1. The chunk from a zero state: (product of Ā, end state), one element of the associative scan.
  for (long long t = t0; t < t1; ++t) {
    const float delta = softplus_f(v.dt_at(t, c)), du = delta * v.u_at(t, c);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int n = lane + i * kLanes;
      if (n >= v.N) continue;
      const float ab = expf(delta * a[i]);
      s[i] = ab * s[i] + du * v.B_at(t, c, n), p[i] *= ab;
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int n = lane + i * kLanes;
    if (n < v.N) prod_s[chunk][n] = p[i], end_s[chunk][n] = s[i];
  }
  __syncthreads();
  // 2. The carries, chunk after chunk, from the state before this call; the final state.
  if (chunk == 0)
    for (int n = lane; n < v.N; n += kLanes) {
      float st = h[c * v.N + n];
      for (int k = 0; k < kChunks; ++k) start_s[k][n] = st, st = prod_s[k][n] * st + end_s[k][n];
      h[c * v.N + n] = st;
    }
  __syncthreads();
  // 3. The chunk again from its true start, writing y. Every lane runs len steps, so that the
  //    half-warp sums see all 32 lanes; past the chunk's end a lane adds nothing.
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int n = lane + i * kLanes;
    s[i] = n < v.N ? start_s[chunk][n] : 0.0f;
  }
  for (long long step = 0; step < len; ++step) {
    const long long t = t0 + step;
    const bool valid = t < t1;
    float acc = 0.0f, u = 0.0f;
    if (valid) {
      const float delta = softplus_f(v.dt_at(t, c));
      u = v.u_at(t, c);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int n = lane + i * kLanes;
        if (n >= v.N) continue;
        s[i] = expf(delta * a[i]) * s[i] + delta * u * v.B_at(t, c, n);
        acc += v.C_at(t, c, n) * s[i];
      }
    }
    acc = half_warp_sum(acc);
    if (valid && lane == 0) v.y_at(t, c) = (acc + v.D[c] * u) * silu_f(v.z_at(t, c));
  }
}

// Decoding: one token, a half warp per channel, a lane per state (stepping by 16).
__global__ void scan_step(ScanView v, float* __restrict__ h) {
  const long long c = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = threadIdx.x % kLanes;
  const bool valid = c < v.E;
  float acc = 0.0f, u = 0.0f;
  if (valid) {
    const float delta = softplus_f(v.dt_at(0, c));
    u = v.u_at(0, c);
    for (int n = lane; n < v.N; n += kLanes) {
      float& st = h[c * v.N + n];
      st = expf(delta * v.A[c * v.N + n]) * st + delta * u * v.B_at(0, c, n);
      acc += v.C_at(0, c, n) * st;
    }
  }
  acc = half_warp_sum(acc);
  if (valid && lane == 0) v.y_at(0, c) = (acc + v.D[c] * u) * silu_f(v.z_at(0, c));
}

__global__ void conv_out(const float* __restrict__ x, long long x_t, const float* __restrict__ w,
                         const float* __restrict__ b, const float* __restrict__ state, float* __restrict__ out,
                         long long out_t, long long T, long long E, int K) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < T * E;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = i / E, c = i % E;
    float acc = b ? b[c] : 0.0f;
    for (int k = 0; k < K; ++k) {
      const long long s = t - (K - 1) + k;
      acc += w[c * K + k] * (s >= 0 ? x[s * x_t + c] : state[(K - 1 + s) * E + c]);
    }
    out[t * out_t + c] = silu_f(acc);
  }
}

// Row r of the new state is input T - (K - 1) + r; a row taken from the old state is row T + r,
// which this thread overwrites only later (rows ascend), so the update is in place.
__global__ void conv_advance(const float* __restrict__ x, long long x_t, float* __restrict__ state, long long T, long long E,
                             int K) {
  const long long c = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
  if (c >= E) return;
  for (int r = 0; r < K - 1; ++r) {
    const long long s = T - (K - 1) + r;
    state[r * E + c] = s >= 0 ? x[s * x_t + c] : state[(K - 1 + s) * E + c];
  }
}

}  // namespace

void cuda_selective_scan(const ScanView& v, float* h) {
  IL_CHECK(v.N <= kMaxN, "selective_scan (CUDA): the state size N = ", v.N, " is above the kernel's ", kMaxN);
  if (v.T == 1) {
    scan_step<<<cuda::blocks_for(v.E * kLanes, 256), 256, 0, cuda::stream()>>>(v, h);
  } else {
    scan_chunked<<<static_cast<unsigned>(v.E), kLanes * kChunks, 0, cuda::stream()>>>(v, h);
  }
  IL_CUDA_LAUNCHED();
}

void cuda_causal_conv(const float* x, std::int64_t x_t, const float* w, const float* b, float* state, float* out,
                      std::int64_t out_t, std::int64_t T, std::int64_t E, std::int64_t K) {
  const unsigned blocks = std::min(cuda::blocks_for(T * E, 256), 65535u);
  conv_out<<<blocks, 256, 0, cuda::stream()>>>(x, x_t, w, b, state, out, out_t, T, E, static_cast<int>(K));
  IL_CUDA_LAUNCHED();
  if (K > 1) {
    conv_advance<<<cuda::blocks_for(E, 256), 256, 0, cuda::stream()>>>(x, x_t, state, T, E, static_cast<int>(K));
    IL_CUDA_LAUNCHED();
  }
}

}  // namespace inferlab::models::mamba
