// Paged attention on the GPU: chapter 02's flash-decoding (decode_attention.cuh), with every key
// and value row found through the block table, several query rows per call and a causal limit per
// row. See cuda_paged.h.
#include <algorithm>
#include <cmath>

#include "chapters/12_paged_attention/cuda_paged.h"
#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"

namespace inferlab::ch12 {

namespace {

constexpr int kThreads = 128;
// Positions one thread block attends at most. Its scores live in shared memory, and a block walks
// its range row by row, so the range sets the kernel's serial chain: at 1,024 positions a block
// took 0.39 ms at 16K positions and 0.45 ms at 64K on an H200 (4× the blocks, the same time), 8%
// and 27% of the read ceiling. 256 is chapter 02's chunk: four times the blocks, a quarter of the
// chain.
constexpr int kMaxRange = 256;

__device__ inline long long slot_of(const int* table, int B, int p) {
  return static_cast<long long>(table[p / B]) * B + p % B;
}

// Part 1: one block per (range r, query head h, query row t). Leaves the range's maximum score
// m, its sum of exp(s − m) and its unnormalised weighted sum of values in part.
__global__ void paged_partial(const float* __restrict__ q, const float* __restrict__ kp, const float* __restrict__ vp,
                              const int* __restrict__ table, int B, int N, int K, int H, int q_offset, int per, float scale,
                              float* __restrict__ part) {
  extern __shared__ float sh[];
  float* qs = sh;      // H
  float* sc = sh + H;  // per
  const int r = blockIdx.x, h = blockIdx.y, t = blockIdx.z, splits = gridDim.x, g = h / (N / K);
  const int lo = r * per, hi = min(q_offset + t + 1, lo + per), n = max(0, hi - lo);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int i = threadIdx.x; i < H; i += blockDim.x) qs[i] = q[(static_cast<long long>(t) * N + h) * H + i] * scale;
  __syncthreads();
  for (int j = warp; j < n; j += warps) {  // a warp per key row, fetched from its slot
    const float* kr = kp + (slot_of(table, B, lo + j) * K + g) * H;
    float dot = 0.0f;
    for (int d = lane; d < H; d += 32) dot += qs[d] * kr[d];
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) sc[j] = dot;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, sc[j]);
  mx = cuda::block_max(mx);
  float l = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) l += (sc[j] = __expf(sc[j] - mx));
  l = cuda::block_sum(l);
  __syncthreads();
  float* out = part + ((static_cast<long long>(t) * N + h) * splits + r) * (H + 2);
  for (int d = threadIdx.x; d < H; d += blockDim.x)
    out[2 + d] = cuda::weighted_rows(sc, n, [&](int j) { return vp[(slot_of(table, B, lo + j) * K + g) * H + d]; });
  if (threadIdx.x == 0) out[0] = n > 0 ? mx : -INFINITY, out[1] = n > 0 ? l : 0.0f;
}

// Part 2: one block per (query row, head) rescales each range by exp(m_r − m) and normalises.
__global__ void paged_merge(const float* __restrict__ part, float* __restrict__ out, int splits, int H) {
  const long long th = blockIdx.x;
  const float* pr = part + th * splits * (H + 2);
  float m = -INFINITY;
  for (int r = 0; r < splits; ++r) m = fmaxf(m, pr[r * (H + 2)]);
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float l = 0.0f, o = 0.0f;
    for (int r = 0; r < splits; ++r) {
      const float* x = pr + r * (H + 2);
      if (x[1] == 0.0f) continue;
      const float c = __expf(x[0] - m);
      l += c * x[1], o += c * x[2 + d];
    }
    out[th * H + d] = o / l;
  }
}

__global__ void write_rows(float* __restrict__ kp, float* __restrict__ vp, const int* __restrict__ slots,
                           const float* __restrict__ k, const float* __restrict__ v, int row) {
  const int t = blockIdx.x;
  const long long dst = static_cast<long long>(slots[t]) * row, src = static_cast<long long>(t) * row;
  for (int i = threadIdx.x; i < row; i += blockDim.x) kp[dst + i] = k[src + i], vp[dst + i] = v[src + i];
}

}  // namespace

void cuda_paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out, std::int64_t splits) {
  const int T = static_cast<int>(q.size(0)), N = static_cast<int>(q.size(1)), H = static_cast<int>(q.size(2));
  const int K = static_cast<int>(kv.k_pool.size(2)), B = static_cast<int>(kv.block_size);
  const std::int64_t longest = q_offset + T;
  splits = std::max<std::int64_t>(splits, (longest + kMaxRange - 1) / kMaxRange);  // each range fits shared memory
  const int per = static_cast<int>((longest + splits - 1) / splits);
  const Tensor table = Tensor::from_vector(kv.table, {static_cast<std::int64_t>(kv.table.size())}).to(Device::CUDA);
  Tensor part = Tensor::empty({static_cast<std::int64_t>(T) * N * splits * (H + 2)}, DType::F32, Device::CUDA);
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(N), static_cast<unsigned>(T));
  const std::size_t shared = static_cast<std::size_t>(H + per) * sizeof(float);
  paged_partial<<<grid, kThreads, shared, cuda::stream()>>>(
      q.data<float>(), kv.k_pool.data<float>(), kv.v_pool.data<float>(), table.data<std::int32_t>(), B, N, K, H,
      static_cast<int>(q_offset), per, 1.0f / std::sqrt(static_cast<float>(H)), part.data<float>());
  IL_CUDA_LAUNCHED();
  paged_merge<<<static_cast<unsigned>(T * N), kThreads, 0, cuda::stream()>>>(part.data<float>(), out.data<float>(),
                                                                             static_cast<int>(splits), H);
  IL_CUDA_LAUNCHED();
}

void cuda_write_slots(const Tensor& k_pool, const Tensor& v_pool, const std::vector<std::int64_t>& slots, const Tensor& k,
                      const Tensor& v) {
  if (slots.empty()) return;
  const std::vector<std::int32_t> s32(slots.begin(), slots.end());
  const Tensor s = Tensor::from_vector(s32, {static_cast<std::int64_t>(s32.size())}).to(Device::CUDA);
  Tensor kp = k_pool, vp = v_pool;
  write_rows<<<static_cast<unsigned>(slots.size()), kThreads, 0, cuda::stream()>>>(
      kp.data<float>(), vp.data<float>(), s.data<std::int32_t>(), k.data<float>(), v.data<float>(),
      static_cast<int>(k.size(1) * k.size(2)));
  IL_CUDA_LAUNCHED();
}

}  // namespace inferlab::ch12
