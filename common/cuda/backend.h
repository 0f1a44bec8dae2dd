#pragma once
/// @file backend.h
/// @brief The CUDA backend's entry points, callable from plain C++.
///
/// This header includes no CUDA headers, so every translation unit can call it. When the build
/// has CUDA (INFERLAB_HAVE_CUDA), the .cu files beside it implement these functions; otherwise
/// stub.cpp does, and each throws "no CUDA device available: this build has no CUDA backend".
/// The op functions have the same contracts as in ops.h; ops:: calls them after its checks.
/// Device memory (malloc, copy, synchronize) is in device_memory.h, which this includes.

#include <cstddef>
#include <string>

#include "common/device_memory.h"
#include "common/ops.h"
#include "common/tensor.h"

namespace inferlab::cuda {

/// True when this binary was built with the CUDA backend.
bool built();
/// Empty when a CUDA device is usable; otherwise the reason in the driver's words.
std::string unavailable_reason();
/// Throws inferlab::Error("no CUDA device available: <reason>") unless a device is usable.
void require_device();
/// "NVIDIA H200 (sm_90, 132 SMs, 140 GiB)"
std::string device_description();
/// Total memory of the device, in bytes.
std::size_t device_memory_bytes();

void matmul(const Tensor& x, const Tensor& w, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing, std::int64_t begin);
void softmax(const Tensor& x, Tensor& out);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
/// Attention over a checked, resolved batch (a single sequence is a batch of one).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
               const AttentionParams& p);
void argmax(const Tensor& x, Tensor& out);

/// Fills a CUDA tensor (F32, F16 or BF16) with uniform random values in [lo, hi) from a
/// counter-based hash of (seed, index): large random models without a trip through the host.
void fill_uniform(Tensor& t, std::uint64_t seed, float lo, float hi);

/// Which matmul kernel ops::matmul uses for a single row (M = 1).
enum class GemvKernel { Own, Cublas };
/// The GEMV used for M = 1 (ours by default; cuBLAS for comparison in benchmarks).
void set_gemv_kernel(GemvKernel k);

/// Read bandwidth of a streaming kernel over `bytes` of device memory (bytes/s, best of 20).
double measure_read_bandwidth(std::size_t bytes);
/// cuBLAS bf16 GEMM throughput at n×n×n (FLOP/s, best of 10).
double measure_gemm_flops(int n);

}  // namespace inferlab::cuda
