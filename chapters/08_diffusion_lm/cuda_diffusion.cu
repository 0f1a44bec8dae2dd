// Chapter 08's kernel: see cuda_diffusion.h.
#include "chapters/08_diffusion_lm/cuda_diffusion.h"

#include <vector>

#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"

namespace inferlab::ch08 {

namespace {

constexpr int kThreads = 256;

// A block per row: the row's max and its lowest index, then Σ exp(l − max) over the row.
__global__ void argmax_probability(const float* __restrict__ logits, long long V, long long row0, int exclude,
                                   int* __restrict__ tokens, float* __restrict__ probs) {
  __shared__ float best_s[kThreads];
  __shared__ int index_s[kThreads];
  const float* row = logits + (row0 + blockIdx.x) * V;
  float best = -INFINITY;
  int index = 0x7fffffff;
  for (long long v = threadIdx.x; v < V; v += blockDim.x) {
    if (v == exclude) continue;
    if (row[v] > best) best = row[v], index = static_cast<int>(v);  // ascending v: the first maximum is kept
  }
  best_s[threadIdx.x] = best, index_s[threadIdx.x] = index;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      const float b = best_s[threadIdx.x + o];
      const int i = index_s[threadIdx.x + o];
      if (b > best_s[threadIdx.x] || (b == best_s[threadIdx.x] && i < index_s[threadIdx.x]))
        best_s[threadIdx.x] = b, index_s[threadIdx.x] = i;
    }
    __syncthreads();
  }
  const float mx = best_s[0];
  float sum = 0.0f;
  for (long long v = threadIdx.x; v < V; v += blockDim.x)
    if (v != exclude) sum += expf(row[v] - mx);
  sum = cuda::block_sum(sum);
  if (threadIdx.x == 0) tokens[blockIdx.x] = index_s[0], probs[blockIdx.x] = 1.0f / sum;  // exp(max − max) / Σ
}

}  // namespace

void cuda_argmax_probability(const Tensor& logits, std::int64_t row0, std::int64_t row1, std::int32_t exclude,
                             std::vector<std::int32_t>& tokens, std::vector<double>& probs) {
  IL_CHECK(logits.is_cuda() && logits.dtype() == DType::F32 && logits.is_contiguous() && logits.ndim() == 2,
           "cuda_argmax_probability: logits must be contiguous f32 [T, V] on CUDA; got ", logits.describe());
  IL_CHECK(row0 >= 0 && row0 <= row1 && row1 <= logits.size(0), "cuda_argmax_probability: rows ", row0, " .. ", row1,
           " outside ", logits.size(0));
  const std::int64_t n = row1 - row0;
  tokens.assign(static_cast<std::size_t>(n), 0), probs.assign(static_cast<std::size_t>(n), 0);
  if (n == 0) return;
  auto* scratch = static_cast<char*>(cuda::scratch(static_cast<std::size_t>(n) * 8));
  int* d_tokens = reinterpret_cast<int*>(scratch);
  float* d_probs = reinterpret_cast<float*>(scratch + n * 4);
  argmax_probability<<<static_cast<unsigned>(n), kThreads, 0, cuda::stream()>>>(logits.data<float>(), logits.size(1), row0,
                                                                                exclude, d_tokens, d_probs);
  IL_CUDA_LAUNCHED();
  std::vector<float> p(static_cast<std::size_t>(n));
  IL_CUDA(cudaMemcpyAsync(tokens.data(), d_tokens, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToHost, cuda::stream()));
  IL_CUDA(cudaMemcpyAsync(p.data(), d_probs, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToHost, cuda::stream()));
  IL_CUDA(cudaStreamSynchronize(cuda::stream()));
  for (std::size_t i = 0; i < p.size(); ++i) probs[i] = p[i];
}

}  // namespace inferlab::ch08
