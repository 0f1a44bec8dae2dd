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
#include <cstdint>
#include <string>
#include <vector>

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

/// The decode-attention family (common/cuda/decode_attention.cuh), by number: 1 per head, 2
/// grouped (GQA), 3 latent (MLA: latent_decode_attention), 4 ragged over a batch, 5 paged.
enum class DecodeAttention { PerHead = 1, Grouped = 2, Latent = 3, Ragged = 4, Paged = 5 };
/// "1 per_head", "2 grouped", ...
inline const char* decode_attention_name(DecodeAttention v) {
  switch (v) {
    case DecodeAttention::PerHead: return "1 per_head";
    case DecodeAttention::Grouped: return "2 grouped";
    case DecodeAttention::Latent: return "3 latent";
    case DecodeAttention::Ragged: return "4 ragged";
    case DecodeAttention::Paged: return "5 paged";
  }
  return "unknown";
}
/// One query row q [1, N, H] against the first `len` positions of k, v [S, K, H] (contiguous f32
/// on the device, K dividing N), out [1, N, H], by version 1, 2, 4 or 5 (5 through the identity
/// block table over blocks of `block_size` rows, which must divide S): the same inputs for every
/// version, so that each can be checked against the reference and timed against the others.
void decode_attention(DecodeAttention version, const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t len,
                      Tensor& out, std::int64_t block_size = 16);
/// Version 3, MLA's absorbed decode: q [1, N, R] (R = r + dr) against latent rows [S, 1, R], the
/// values being their first r columns; scores scaled by `scale`; out [1, N, r].
void latent_decode_attention(const Tensor& q, const Tensor& latent, std::int64_t len, float scale, std::int64_t r,
                             Tensor& out);
/// Version 5 over a pool, for one sequence: query rows q [T, N, H] at positions q_offset ..
/// q_offset + T − 1, each seeing the positions up to its own; k_pool, v_pool [slots, K, H] (or
/// [blocks, block_size, K, H]) in blocks of `block_size` slots, position p in block
/// table[p / block_size]; at least `splits` ranges of positions. A batch of one (CachedBatch),
/// uploaded for the call.
void paged_decode_attention(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                            const std::vector<std::int32_t>& table, std::int64_t block_size, std::int64_t q_offset,
                            Tensor& out, std::int64_t splits = 1);

/// A batch step's new keys and values into their slots (ops::store_cached, checked): one launch.
void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v);
/// Version 5 over a batch step (ops::attention_cached, checked and resolved): one launch for
/// every query row of every sequence of the batch, then the merge of their ranges.
void attention_cached(const Tensor& q, const CachedBatch& batch, std::int64_t layer, Tensor& out, const AttentionParams& p);

/// What this process has queued on the GPU so far: kernel launches (every launch of ours, and
/// each cuBLAS call as one) and cuda::memcpy copies. A caller reads them before and after a piece
/// of work (chapter 11's engine, a step) to count its launches. Zero in a build without CUDA.
struct Launches {
  std::int64_t kernels = 0, copies = 0;
};
Launches launches();

/// Fills a CUDA tensor (F32, F16 or BF16) with uniform random values in [lo, hi) from a
/// counter-based hash of (seed, index): large random models without a trip through the host.
void fill_uniform(Tensor& t, std::uint64_t seed, float lo, float hi);

/// Which matmul kernel ops::matmul uses for a single row (M = 1).
enum class GemvKernel { Own, Cublas };
/// The GEMV used for M = 1 (ours by default; cuBLAS for comparison in benchmarks).
void set_gemv_kernel(GemvKernel k);

/// The GEMV family (common/cuda/gemv.cuh), by number: 1 a warp per row reading x from global
/// memory (the simple version), 2 x staged once per block in shared memory and several rows a
/// warp, 3 version 2 with the RMSNorm of x folded into its prologue.
enum class GemvVersion { WarpRow = 1, SharedX = 2, NormFused = 3 };
/// "1 warp_row", "2 shared_x", "3 norm_fused"
inline const char* gemv_version_name(GemvVersion v) {
  switch (v) {
    case GemvVersion::WarpRow: return "1 warp_row";
    case GemvVersion::SharedX: return "2 shared_x";
    case GemvVersion::NormFused: return "3 norm_fused";
  }
  return "unknown";
}
/// The version used unless set_gemv_version chose another.
inline constexpr GemvVersion kDefaultGemvVersion = GemvVersion::NormFused;
/// The newest version ops::matmul (M = 1, GemvKernel::Own) and chapter 02's CudaDecoder (read when
/// it is constructed) may use: a product with no RMSNorm before it runs version 2 under 3. Older
/// versions stay selectable for the tests and benchmarks. Until set_gemv_version is called, the
/// environment's INFERLAB_GEMV_VERSION (1, 2 or 3) chooses, for runs of whole programs.
void set_gemv_version(GemvVersion v);
GemvVersion gemv_version();

/// One GEMV by a given version on tensors, so that the tests and benchmarks run every version on
/// the same inputs. x [K] (or [1, K]) f32 on the device; out f32 with as many elements as the
/// weights have rows together.
struct GemvArgs {
  /// 1 to 3 matrices [rows_i, K] of one dtype (F32, BF16 or F16), stacked into out (q, k and v in
  /// one launch); with `swiglu`, exactly two of the same shape, gate and up.
  std::vector<Tensor> weights;
  /// None, or one f32 [rows_i] per matrix (an undefined tensor: none); not with `swiglu`.
  std::vector<Tensor> biases;
  /// out += W·x + bias (a residual add) instead of out = W·x + bias; not with `swiglu`.
  bool accumulate = false;
  /// out[r] = silu(gate[r]·x) · (up[r]·x), the MLP's first half in one pass over both weights.
  bool swiglu = false;
  /// Version 3 only (required there): x is replaced by x / sqrt(mean(x²) + eps) · norm, norm f32 [K].
  Tensor norm;
  float eps = 1e-5f;
};
void gemv(GemvVersion version, const Tensor& x, const GemvArgs& args, Tensor& out);

/// Read bandwidth of a streaming kernel over `bytes` of device memory (bytes/s, best of 20).
double measure_read_bandwidth(std::size_t bytes);
/// cuBLAS bf16 GEMM throughput at n×n×n (FLOP/s, best of 10).
double measure_gemm_flops(int n);

}  // namespace inferlab::cuda
