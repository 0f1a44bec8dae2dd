// Chapter 10's round on the GPU: the sampling distribution of each logits row, a draw from a row,
// and the accept/reject walk over the γ drafts. See cuda_speculative.h. One thread block does a
// row; every sum is in double, as on the host.
#include <cub/device/device_segmented_radix_sort.cuh>

#include <climits>
#include <cmath>
#include <limits>

#include "chapters/10_speculative_sampling/cuda_speculative.h"
#include "common/cuda/backend.h"
#include "common/cuda/util.cuh"
#include "common/error.h"

namespace inferlab::ch10::cuda {

using inferlab::cuda::stream;

namespace {

constexpr int kThreads = 1024;

// Each thread owns one contiguous chunk of a row; the chunks' sums are combined in thread order
// by one thread, so chunk t's interval [before_t, before_t + sum_t) ends exactly where chunk
// t + 1's begins and the intervals cover [0, total) without gaps.
struct Chunk {
  long long lo, hi;
};
__device__ inline Chunk chunk_of(long long n) {
  const long long per = (n + blockDim.x - 1) / blockDim.x;
  const long long lo = min(n, per * threadIdx.x);
  return {lo, min(n, lo + per)};
}

// The sum of the chunk sums before this thread's, and the total; all threads get both.
__device__ inline double prefix_before(double mine, double* total) {
  __shared__ double sums[kThreads + 1];
  __syncthreads();  // sums[] may still be read by a previous call
  sums[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const double s = sums[t];
      sums[t] = run;
      run += s;
    }
    sums[blockDim.x] = run;
  }
  __syncthreads();
  *total = sums[blockDim.x];
  return sums[threadIdx.x];
}

__device__ inline double block_sum_d(double v) {
  double total;
  prefix_before(v, &total);
  return total;
}

// Sampler::draw over w[0, n) with the uniform number u, by the whole block: the first index
// whose running sum passes u · total (zeros skipped); the last nonzero one when u · total is
// within rounding of the total. All threads get it.
__device__ int block_draw(const double* __restrict__ w, long long n, double u) {
  __shared__ int found, last_nonzero;
  const Chunk c = chunk_of(n);
  double mine = 0;
  int last = -1;
  for (long long i = c.lo; i < c.hi; ++i)
    if (w[i] != 0) mine += w[i], last = static_cast<int>(i);
  if (threadIdx.x == 0) found = INT_MAX, last_nonzero = -1;
  double total;
  const double before = prefix_before(mine, &total);  // its barriers order the writes above
  atomicMax(&last_nonzero, last);
  const double r = u * total;
  if (mine > 0 && r >= before && r < before + mine) {  // r falls in this thread's chunk
    double cum = before;
    int hit = last;  // rounding may end the walk short of before + mine: then r was at its end
    for (long long i = c.lo; i < c.hi; ++i) {
      if (w[i] == 0) continue;
      cum += w[i];
      if (r < cum) {
        hit = static_cast<int>(i);
        break;
      }
    }
    atomicMin(&found, hit);
  }
  __syncthreads();
  const int token = found != INT_MAX ? found : last_nonzero;
  __syncthreads();  // found and last_nonzero are read before a next call resets them
  return token;
}

// Row t of the sampling distribution: exp((l − max) / T) over the usable ids (unnormalised), zero
// beyond; at T = 0 all mass on the argmax. error[0] gets the first NaN / +inf logit (row-major
// index + 1), error[1] the first row whose usable logits are all −inf (+ 1).
__global__ void __launch_bounds__(kThreads)
    distribution_rows(const float* __restrict__ logits, long long V, long long usable, float temperature,
                      double* __restrict__ out, unsigned long long* __restrict__ error) {
  const float* l = logits + blockIdx.x * V;
  double* o = out + blockIdx.x * V;
  for (long long i = threadIdx.x; i < usable; i += blockDim.x)
    if (isnan(l[i]) || l[i] == INFINITY) atomicMin(&error[0], static_cast<unsigned long long>(blockIdx.x * V + i + 1));
  float mx = -INFINITY;
  for (long long i = threadIdx.x; i < usable; i += blockDim.x) mx = fmaxf(mx, l[i]);
  mx = inferlab::cuda::block_max(mx);
  if (mx == -INFINITY && threadIdx.x == 0) atomicMin(&error[1], static_cast<unsigned long long>(blockIdx.x + 1));
  if (temperature == 0.0f) {
    const int best = inferlab::cuda::block_argmax(l, usable);
    for (long long i = threadIdx.x; i < V; i += blockDim.x) o[i] = i == best ? 1.0 : 0.0;
    return;
  }
  for (long long i = threadIdx.x; i < V; i += blockDim.x)
    o[i] = i < usable ? exp((static_cast<double>(l[i]) - mx) / temperature) : 0.0;
}

// ids[t][i] = i: the values the sort carries along with the probabilities.
__global__ void __launch_bounds__(kThreads) iota_rows(int* __restrict__ ids, long long V) {
  for (long long i = threadIdx.x; i < V; i += blockDim.x) ids[blockIdx.x * V + i] = static_cast<int>(i);
}

// Normalises row t over all ids (no top-k / top-p).
__global__ void __launch_bounds__(kThreads) normalise_rows(double* __restrict__ out, long long V) {
  double* o = out + blockIdx.x * V;
  double mine = 0;
  const Chunk c = chunk_of(V);
  for (long long i = c.lo; i < c.hi; ++i) mine += o[i];
  const double total = block_sum_d(mine);
  for (long long i = threadIdx.x; i < V; i += blockDim.x) o[i] /= total;
}

// Top-k / top-p on row t, given its unnormalised probabilities sorted most likely first (ties by
// index: the radix sort is stable) with their ids: keep the first k, then the smallest prefix whose
// mass reaches top_p of theirs; zero the rest and normalise over what is kept.
__global__ void __launch_bounds__(kThreads)
    truncate_rows(double* __restrict__ out, const double* __restrict__ sorted, const int* __restrict__ ids, long long V,
                  long long usable, long long top_k, double top_p) {
  __shared__ long long keep;
  double* o = out + blockIdx.x * V;
  const double* s = sorted + blockIdx.x * V;
  const int* id = ids + blockIdx.x * V;
  if (threadIdx.x == 0) keep = top_k > 0 && top_k < usable ? top_k : usable;
  __syncthreads();
  const long long k = keep;
  if (top_p < 1.0) {
    const Chunk c = chunk_of(k);
    double mine = 0;
    for (long long r = c.lo; r < c.hi; ++r) mine += s[r];
    double total;
    double cum = prefix_before(mine, &total);
    const double threshold = top_p * total;
    for (long long r = c.lo; r < c.hi; ++r) {
      cum += s[r];
      if (cum >= threshold) {
        atomicMin(reinterpret_cast<unsigned long long*>(&keep), static_cast<unsigned long long>(r + 1));
        break;
      }
    }
    __syncthreads();
  }
  const long long n = keep;
  for (long long r = n + threadIdx.x; r < V; r += blockDim.x) o[id[r]] = 0.0;
  const Chunk c = chunk_of(n);
  double mine = 0;
  for (long long r = c.lo; r < c.hi; ++r) mine += s[r];
  const double total = block_sum_d(mine);  // its barriers also order the zeroing above
  for (long long i = threadIdx.x; i < V; i += blockDim.x) o[i] /= total;
}

__global__ void __launch_bounds__(kThreads)
    draw_row(const double* __restrict__ w, long long n, double u, int* __restrict__ token) {
  const int t = block_draw(w, n, u);
  if (threadIdx.x == 0) *token = t;
}

struct WalkResult {
  int accepted, next, bonus, used, error;
  double alpha_sum;
};

// verify(): accept draft i with probability min(1, q_i(d_i) / p_i(d_i)) using u[i]; at the first
// rejection draw from norm(max(q_i − p_i, 0)) (q_i when nothing is left over) with u[i + 1]; when
// all γ are accepted, the bonus token from q_γ with u[γ]. `residual` is V doubles of scratch.
__global__ void __launch_bounds__(kThreads)
    verify_walk(const int* __restrict__ drafts, int gamma, const double* __restrict__ p, const double* __restrict__ q,
                long long V, const double* __restrict__ u, double* __restrict__ residual, WalkResult* __restrict__ res) {
  double alpha = 0;
  const Chunk c = chunk_of(V);
  for (int i = 0; i < gamma; ++i) {  // α of every drafted position, as the host loop sums it
    double mine = 0;
    for (long long x = c.lo; x < c.hi; ++x) mine += fmin(p[i * V + x], q[i * V + x]);
    alpha += block_sum_d(mine);
  }
  WalkResult r{gamma, 0, 1, gamma + 1, 0, alpha};
  int i = 0;
  for (; i < gamma; ++i) {
    const int d = drafts[i];
    const double pd = p[i * V + d], qd = q[i * V + d];
    if (!(pd > 0)) {
      r.error = i + 1;
      break;
    }
    if (!(u[i] < fmin(1.0, qd / pd))) break;
  }
  if (r.error == 0 && i < gamma) {  // rejected at i
    double mine = 0;
    for (long long x = c.lo; x < c.hi; ++x) mine += (residual[x] = fmax(q[i * V + x] - p[i * V + x], 0.0));
    const double left = block_sum_d(mine);  // its barriers make the residual visible to all
    r = {i, block_draw(left > 0 ? residual : q + i * V, V, u[i + 1]), 0, i + 2, 0, alpha};
  } else if (r.error == 0) {
    r.next = block_draw(q + static_cast<long long>(gamma) * V, V, u[gamma]);
  }
  if (threadIdx.x == 0) *res = r;
}

void check_row_tensor(const Tensor& t, DType dtype, const char* what) {
  IL_CHECK(t.is_cuda() && t.dtype() == dtype && t.ndim() == 2 && t.is_contiguous(), what, ": expected a contiguous CUDA ",
           dtype_name(dtype), " [T, V] tensor, got ", t.describe());
  IL_CHECK(t.size(1) < INT_MAX, what, ": ", t.size(1), " ids do not fit the kernels' int token ids");
}

}  // namespace

Tensor distributions(const Tensor& logits, const SamplingParams& params) {
  validate(params);
  check_row_tensor(logits, DType::F32, "distributions");
  const std::int64_t T = logits.size(0), V = logits.size(1);
  IL_CHECK(T > 0 && V > 0, "distributions: empty logits ", logits.describe());
  IL_CHECK(T * V < INT_MAX, "distributions: ", T, " rows of ", V,
           " ids are too many for one call (sort only the rows "
           "you draw from)");
  IL_CHECK(params.vocab <= V, "sample: ", V, " logits for a vocabulary of ", params.vocab);
  const std::int64_t usable = params.vocab > 0 ? params.vocab : V;
  Tensor out = Tensor::empty({T, V}, DType::F64, Device::CUDA);
  const std::vector<std::int64_t> none = {std::numeric_limits<std::int64_t>::max(),
                                          std::numeric_limits<std::int64_t>::max()};
  Tensor error = Tensor::from_vector(none, {2}).to(Device::CUDA);
  distribution_rows<<<static_cast<unsigned>(T), kThreads, 0, stream()>>>(
      logits.data<float>(), V, usable, params.temperature, out.data<double>(),
      reinterpret_cast<unsigned long long*>(error.data<std::int64_t>()));
  IL_CUDA_LAUNCHED();
  const std::vector<std::int64_t> e = [&] {
    const Tensor h = error.to(Device::CPU);
    return std::vector<std::int64_t>(h.data<std::int64_t>(), h.data<std::int64_t>() + 2);
  }();
  IL_CHECK(e[0] == none[0], "sample: logit ", (e[0] - 1) % V, " of row ", (e[0] - 1) / V,
           " is NaN or +inf (the model's output is broken)");
  IL_CHECK(e[1] == none[1], "sample: every logit of row ", e[1] - 1, " is -inf, there is no token to choose");
  if (params.temperature == 0.0f) return out;
  const bool truncate = (params.top_k > 0 && params.top_k < usable) || params.top_p < 1.0f;
  if (!truncate) {
    normalise_rows<<<static_cast<unsigned>(T), kThreads, 0, stream()>>>(out.data<double>(), V);
    IL_CUDA_LAUNCHED();
    return out;
  }
  // Every row sorted most likely first with its ids (stable, so ties stay in id order).
  std::vector<std::int32_t> offsets(static_cast<std::size_t>(T + 1));
  for (std::int64_t t = 0; t <= T; ++t) offsets[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t * V);
  const Tensor offs = Tensor::from_vector(offsets, {T + 1}).to(Device::CUDA);
  Tensor ids_in = Tensor::empty({T, V}, DType::I32, Device::CUDA);
  iota_rows<<<static_cast<unsigned>(T), kThreads, 0, stream()>>>(ids_in.data<std::int32_t>(), V);
  IL_CUDA_LAUNCHED();
  Tensor sorted = Tensor::empty({T, V}, DType::F64, Device::CUDA), ids = Tensor::empty({T, V}, DType::I32, Device::CUDA);
  const int n = static_cast<int>(T * V), rows = static_cast<int>(T);
  const int* begin = offs.data<std::int32_t>();
  std::size_t bytes = 0;
  IL_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, bytes, out.data<double>(), sorted.data<double>(),
                                                             ids_in.data<std::int32_t>(), ids.data<std::int32_t>(), n, rows,
                                                             begin, begin + 1, 0, 64, stream()));
  IL_CUDA(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      inferlab::cuda::scratch(bytes), bytes, out.data<double>(), sorted.data<double>(), ids_in.data<std::int32_t>(),
      ids.data<std::int32_t>(), n, rows, begin, begin + 1, 0, 64, stream()));
  truncate_rows<<<static_cast<unsigned>(T), kThreads, 0, stream()>>>(out.data<double>(), sorted.data<double>(),
                                                                     ids.data<std::int32_t>(), V, usable, params.top_k,
                                                                     static_cast<double>(params.top_p));
  IL_CUDA_LAUNCHED();
  return out;
}

std::int32_t draw(const Tensor& weights, std::int64_t row, double u) {
  check_row_tensor(weights, DType::F64, "draw");
  IL_CHECK(row >= 0 && row < weights.size(0), "draw: row ", row, " of ", weights.describe());
  IL_CHECK(u >= 0 && u < 1, "draw: the uniform number ", u, " is outside [0, 1)");
  Tensor token = Tensor::empty({1}, DType::I32, Device::CUDA);
  const std::int64_t V = weights.size(1);
  draw_row<<<1, kThreads, 0, stream()>>>(weights.data<double>() + row * V, V, u, token.data<std::int32_t>());
  IL_CUDA_LAUNCHED();
  const std::int32_t t = token.to(Device::CPU).data<std::int32_t>()[0];
  IL_CHECK(t >= 0, "draw: the probabilities sum to 0, there is no token to choose");
  return t;
}

DeviceVerdict verify(const std::vector<std::int32_t>& drafts, const Tensor& p, const Tensor& q,
                     const std::vector<double>& u) {
  const auto gamma = static_cast<std::int64_t>(drafts.size());
  check_row_tensor(q, DType::F64, "verify (target)");
  if (gamma > 0) check_row_tensor(p, DType::F64, "verify (draft)");
  IL_CHECK(q.size(0) == gamma + 1 && (gamma == 0 || (p.size(0) == gamma && p.size(1) == q.size(1))), "verify: ", gamma,
           " drafts need as many draft and one more target distributions; got ", gamma > 0 ? p.describe() : "none", " and ",
           q.describe());
  IL_CHECK(static_cast<std::int64_t>(u.size()) == gamma + 1, "verify: ", gamma + 1, " uniform numbers needed, got ",
           u.size());
  const std::int64_t V = q.size(1);
  for (std::int32_t d : drafts) IL_CHECK(d >= 0 && d < V, "verify: draft token ", d, " outside the vocabulary");
  std::vector<std::int32_t> d_host = drafts.empty() ? std::vector<std::int32_t>{0} : drafts;
  const Tensor d_dev = Tensor::from_vector(d_host, {static_cast<std::int64_t>(d_host.size())}).to(Device::CUDA);
  const Tensor u_dev = Tensor::from_vector(u, {gamma + 1}).to(Device::CUDA);
  Tensor residual = Tensor::empty({V}, DType::F64, Device::CUDA);
  Tensor res = Tensor::empty({static_cast<std::int64_t>(sizeof(WalkResult))}, DType::U8, Device::CUDA);
  verify_walk<<<1, kThreads, 0, stream()>>>(
      d_dev.data<std::int32_t>(), static_cast<int>(gamma), gamma > 0 ? p.data<double>() : nullptr, q.data<double>(), V,
      u_dev.data<double>(), residual.data<double>(), static_cast<WalkResult*>(res.raw_data()));
  IL_CUDA_LAUNCHED();
  WalkResult r{};
  inferlab::cuda::memcpy(&r, res.raw_data(), sizeof r);
  IL_CHECK(r.error == 0, "verify: draft ", r.error - 1, " (token ",
           r.error > 0 ? drafts[static_cast<std::size_t>(r.error - 1)] : 0,
           ") has probability 0 under the draft that proposed it");
  IL_CHECK(r.next >= 0, "verify: the distribution to draw from sums to 0, there is no token to choose");
  return {{r.accepted, r.next, r.bonus != 0}, r.used, r.alpha_sum};
}

}  // namespace inferlab::ch10::cuda
