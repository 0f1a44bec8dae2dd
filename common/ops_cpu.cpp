// The fast CPU paths: a threaded GEMV for decode, Eigen GEMM for prefill, threaded attention.
#include <omp.h>

#include <Eigen/Core>
#include <bit>
#include <vector>

#include "common/ops_cpu.h"

namespace inferlab::cpu {

namespace {

// Up to this many rows, matmul streams each weight row once and dots it with every x row
// (decode: the weights are read once per step, which is the whole cost). Beyond it, GEMM.
constexpr std::int64_t kGemvMaxRows = 4;
// Below this many multiply-adds an op runs on one thread: waking a team of threads costs
// microseconds, and when the machine is busy a descheduled thread can stall the whole team for
// a scheduler time slice. Tiny models must not pay that on every op.
constexpr std::int64_t kParallelWork = 1 << 18;

// Dot products with 16 independent partial sums: the compiler turns the fixed-size inner loop
// into SIMD multiply-adds, and the partial sums break the dependency chain that would otherwise
// make one scalar add per element the bottleneck instead of memory. (Any summation order obeys
// the same γ_K error bound as the reference loop.)
constexpr int kLanes = 16;

template <class Load>
inline float dot_lanes(const float* x, std::int64_t K, Load load) {
  float acc[kLanes] = {};
  std::int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[k + j] * load(k + j);
  float s = 0.0f;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  for (; k < K; ++k) s += x[k] * load(k);
  return s;
}

inline float dot(const float* x, const float* w, std::int64_t K) {
  return dot_lanes(x, K, [w](std::int64_t k) { return w[k]; });
}

inline float dot_bf16(const float* x, const std::uint16_t* w, std::int64_t K) {
  return dot_lanes(x, K, [w](std::int64_t k) { return std::bit_cast<float>(static_cast<std::uint32_t>(w[k]) << 16); });
}

inline float dot_f16(const float* x, const std::uint16_t* w, std::int64_t K) {
  float acc = 0.0f;
  for (std::int64_t k = 0; k < K; ++k) acc += x[k] * static_cast<float>(std::bit_cast<Eigen::half>(w[k]));
  return acc;
}

void gemv(const Tensor& x, const Tensor& w, Tensor& out) {
  const std::int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const float* X = x.data<float>();
  float* Y = out.data<float>();
  const DType wt = w.dtype();
  const void* W = w.raw_data();
#pragma omp parallel for schedule(static) if (M * N * K >= kParallelWork)
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t m = 0; m < M; ++m) {
      const float* xr = X + m * K;
      float y;
      if (wt == DType::F32) y = dot(xr, static_cast<const float*>(W) + n * K, K);
      else if (wt == DType::BF16) y = dot_bf16(xr, static_cast<const std::uint16_t*>(W) + n * K, K);
      else y = dot_f16(xr, static_cast<const std::uint16_t*>(W) + n * K, K);
      Y[m * N + n] = y;
    }
  }
}

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Eigen threads its GEMM on its own; below this many multiply-adds (a few milliseconds of one
// core's work) it is told to use one thread, for the reason given at kParallelWork.
constexpr std::int64_t kParallelGemm = std::int64_t{1} << 24;

void gemm_threads(const Tensor& x, const Tensor& w, Tensor& out);

void gemm(const Tensor& x, const Tensor& w, Tensor& out) {
  if (x.size(0) * x.size(1) * w.size(0) >= kParallelGemm) return gemm_threads(x, w, out);
  const int saved = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  gemm_threads(x, w, out);
  Eigen::setNbThreads(saved);
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

void matmul(const Tensor& x, const Tensor& w, Tensor& out) {
  if (x.size(0) <= kGemvMaxRows) gemv(x, w, out);
  else gemm(x, w, out);
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p) {
  const std::int64_t T = q.size(0), Nq = q.size(1), S = k.size(0), H = q.size(2);
#pragma omp parallel if (T * Nq * S * H >= kParallelWork)
  {
    std::vector<float> scratch(static_cast<std::size_t>(std::max<std::int64_t>(S, 1)));
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < Nq; ++h) loops::attention_rows(q, k, v, out, p, t, h, scratch.data());
  }
}

// The elementwise ops are memory-bound already; their reference loops are the fast path.
void add(const Tensor& a, const Tensor& b, Tensor& out) { loops::add(a, b, out); }
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out) { loops::rmsnorm(x, w, eps, out); }
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing) {
  loops::rope(x, positions, inv_freq, pairing);
}
void softmax(const Tensor& x, Tensor& out) { loops::softmax(x, out); }
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) { loops::swiglu(gate, up, out); }
void embedding(const Tensor& table, const Tensor& ids, Tensor& out) { loops::embedding(table, ids, out); }
void argmax(const Tensor& x, Tensor& out) { loops::argmax(x, out); }

}  // namespace inferlab::cpu
