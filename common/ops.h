#pragma once
/// @file ops.h
/// @brief The transformer's building blocks, each in three versions behind the same contract.
///
/// - `ref::`  the plain CPU loop: the formula as you would write it beside the lecture
///            (ops_ref.cpp). Single-threaded, no tricks. This is what every other version is
///            tested against.
/// - `ops::`  what the chapters call: dispatches on the inputs' device to the fast CPU path
///            (ops_cpu.cpp: Eigen GEMM, an OpenMP GEMV for decode, threaded attention) or the
///            CUDA kernels (cuBLAS for GEMM, our own GEMV and the rest). Elementwise ops have no
///            separate fast CPU path: on CPU tensors ops:: runs their ref:: loop, which is
///            already memory-bound.
///
/// Conventions shared by all three:
/// - Activations are F32 and contiguous, row-major; weights may be F32, F16 or BF16.
/// - Outputs are preallocated by the caller (`out`), so a decode loop allocates nothing;
///   every op also has a convenience overload that returns a new tensor.
/// - Every call checks shapes, dtypes and devices and throws inferlab::Error naming the op and
///   the offending tensor; all tensors of one call must be on the same device.
/// - Every call adds its FLOPs and minimal bytes moved to the active metrics::CountScope.

#include <cstdint>
#include <vector>

#include "common/tensor.h"

namespace inferlab {

/// Which elements RoPE rotates together.
enum class RopePairing {
  /// Hugging Face `rotate_half`: element j pairs with j + d/2 (Llama/Qwen in transformers).
  HalfSplit,
  /// Adjacent pairs (2j, 2j+1): Meta's original Llama code, llama2.c and GGUF.
  Adjacent,
};

/// Options of causal attention.
struct AttentionParams {
  /// Absolute position of q[0] among the keys; -1 means S - T (queries are the last T keys).
  std::int64_t q_offset = -1;
  /// Sliding window: a query at position p sees keys p - window + 1 .. p. 0 means unlimited.
  std::int64_t window = 0;
  /// Score scale; 0 means 1 / sqrt(Dqk), the query/key head dimension.
  float scale = 0.0f;
  /// False gives bidirectional attention (every query sees every key).
  bool causal = true;
  /// Logit soft-capping (Gemma 2): each scaled score s becomes c · tanh(s / c) before the
  /// softmax, so no score exceeds ±c. 0 means none. CPU only.
  float softcap = 0.0f;
};

/// Several sequences packed along the rows of q and of k/v, for one attention call (what
/// flash-attn's varlen interface calls cu_seqlens_q and cu_seqlens_k). Sequence b owns rows
/// q_starts[b] .. q_starts[b+1] - 1 of q and out, and rows kv_starts[b] .. kv_starts[b+1] - 1
/// of k and v; its queries see only its own keys. Decode rows (T_b = 1) and prefill chunks mix
/// freely: this is how a server batches requests of different lengths into one launch.
struct RaggedBatch {
  /// B + 1 row starts into q: 0 first, q's row count last, never decreasing (T_b = 0 is allowed).
  std::vector<std::int64_t> q_starts;
  /// B + 1 row starts into k and v: 0 first, their row count last, increasing (S_b > 0).
  std::vector<std::int64_t> kv_starts;
  /// Each sequence's AttentionParams::q_offset (position of its first query among its keys);
  /// empty means S_b - T_b for all, i.e. each sequence's queries are its last T_b keys.
  std::vector<std::int64_t> q_offsets;
};

/// One sequence's cached keys and values, for one attention call over the caches of a whole
/// batch (ops::attention_cached): what a batch step's attention reads, where each cache keeps
/// it, without gathering anything first. Position p of the sequence is row p of k and v (a
/// cache's storage for one layer, [rows, Nk, Dqk] and [rows, Nk, Dv]) or, with a block table
/// (chapter 12's pool), row table[p / block_size]·block_size + p % block_size.
struct CachedKV {
  Tensor k, v;
  const std::vector<std::int32_t>* table = nullptr;  ///< null: position p is row p
  std::int64_t block_size = 1;
  std::int64_t length = 0;              ///< positions it holds, this step's new ones included
  std::int64_t q_begin = 0, q_end = 0;  ///< the rows of q and out that are its queries
  /// Position of its first query; -1: length − (q_end − q_begin), its queries are its last positions.
  std::int64_t q_offset = -1;
};

class CachedBatch;  // common/cached_batch.h: the per-step context of attention over a batch's caches

namespace ops {

/// out[M,N] = x[M,K] · w[N,K]ᵀ (w stored as PyTorch's Linear stores it: one row per output).
void matmul(const Tensor& x, const Tensor& w, Tensor& out);
Tensor matmul(const Tensor& x, const Tensor& w);
/// out_j = x · w_jᵀ for several weights that share their input (q, k and v; gate and up): the
/// same sums as one matmul each, but on the CPU at decode one pass of the threads over the rows of
/// them all (cpu::matmuls).
void matmuls(const Tensor& x, const std::vector<const Tensor*>& ws, const std::vector<Tensor*>& outs);
/// out = a + b, where b has a's shape or is one row [N] broadcast over a's rows.
void add(const Tensor& a, const Tensor& b, Tensor& out);
Tensor add(const Tensor& a, const Tensor& b);
/// out[m,:] = x[m,:] / sqrt(mean(x[m,:]²) + eps) * w   (Zhang & Sennrich 2019).
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps);
/// Rotary position embedding, in place on x[T, heads, head_dim]: dimensions begin ..
/// begin + 2·len(inv_freq) - 1 of each head of row t are rotated by angles positions[t] ·
/// inv_freq[j]; the rest are kept. begin = 0 rotates the leading dimensions (Llama, or partial
/// rotary); DeepSeek's MLA rotates the trailing ones (begin = head_dim - rot) of its q and k.
/// The pairing indexes within the rotated range. positions is I32 [T]; inv_freq is F32 [rot/2]
/// (see rope_inv_freq).
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing, std::int64_t begin = 0);
/// Row-wise softmax over the last dimension of x[M,N].
void softmax(const Tensor& x, Tensor& out);
Tensor softmax(const Tensor& x);
/// out = silu(gate) * up, silu(g) = g / (1 + e^-g): the gated MLP's activation.
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
Tensor swiglu(const Tensor& gate, const Tensor& up);
/// out = gelu_tanh(gate) * up, gelu_tanh(g) = g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³))): Gemma's
/// GeGLU (transformers' "gelu_pytorch_tanh"). CPU only.
void geglu(const Tensor& gate, const Tensor& up, Tensor& out);
Tensor geglu(const Tensor& gate, const Tensor& up);
/// In place, x = c · tanh(x / c): Gemma 2's soft-capping of the final logits (c > 0). CPU only.
void softcap(Tensor& x, float cap);
/// In place, x = x · s: Gemma's embedding multiplier √D. CPU only.
void scale(Tensor& x, float s);
/// out[t,:] = table[ids[t],:] as F32; ids is I32 [T] and must be in range.
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
Tensor embedding(const Tensor& table, const Tensor& ids);
/// Scaled dot-product attention. q[T,Nq,Dqk], k[S,Nk,Dqk], v[S,Nk,Dv], out[T,Nq,Dv], with Nq a
/// multiple of Nk (query head h reads KV head h / (Nq/Nk): MHA, GQA and MQA alike). Values may
/// be narrower or wider than queries and keys (MLA: Dqk = 192, Dv = 128); the default scale is
/// 1/sqrt(Dqk).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p = {});
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p = {});
/// The same over a ragged batch: equal, bit for bit, to one attention call per sequence on its
/// rows, with its q_offset. window, scale and causal apply to every sequence; p.q_offset must
/// stay at its default (the offsets are per sequence, in the batch).
void attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
                      const AttentionParams& p = {});
Tensor attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, const RaggedBatch& batch,
                        const AttentionParams& p = {});
/// Attention over many caches in one call: sequence b's queries (rows seqs[b].q_begin ..
/// q_end − 1 of q [T, Nq, Dqk]) attend over its own cached positions, read where its cache keeps
/// them, into the same rows of out [T, Nq, Dv]. Equal, bit for bit, to one attention() call per
/// sequence over its rows gathered in order. Rows no sequence names are left as they are (a
/// caller attends them some other way). Window, scale and causal as in attention(), q_offset per
/// sequence. On CUDA (no soft cap) the sequences are packed and uploaded for the call: a batch
/// step that attends in every layer builds its CachedBatch once and uses the two calls below.
void attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, Tensor& out, const AttentionParams& p = {});
/// A batch step's new keys and values of layer `layer`, k [rows, Nk, Dqk] and v [rows, Nk, Dv],
/// written straight into their slots: row i of a sequence of the batch to the storage row of its
/// position (CachedSeq::q_offset + i − q_begin), through its block table where it has one. Rows
/// no sequence names are skipped. One launch on the GPU.
void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v);
/// attention_cached over the batch's caches in layer `layer`: the same bits on the CPU; on the
/// GPU one launch for every query row of the batch (prefill chunks and decode rows alike, split
/// into ranges of positions) and one merging the ranges, reading the context uploaded once a step.
void attention_cached(const Tensor& q, const CachedBatch& batch, std::int64_t layer, Tensor& out,
                      const AttentionParams& p = {});
/// Index of the largest element of each row of x[M,N] (I32 [M]); ties go to the lowest index,
/// and NaN counts as the largest value (as torch.argmax does), so a NaN never hides.
void argmax(const Tensor& x, Tensor& out);
Tensor argmax(const Tensor& x);

}  // namespace ops

/// The reference versions: same contracts, CPU only, plain loops.
namespace ref {
void matmul(const Tensor& x, const Tensor& w, Tensor& out);
void add(const Tensor& a, const Tensor& b, Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& w, float eps, Tensor& out);
void rope(Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopePairing pairing, std::int64_t begin = 0);
void softmax(const Tensor& x, Tensor& out);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& out);
void geglu(const Tensor& gate, const Tensor& up, Tensor& out);
void softcap(Tensor& x, float cap);
void scale(Tensor& x, float s);
void embedding(const Tensor& table, const Tensor& ids, Tensor& out);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const AttentionParams& p = {});
void attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, const RaggedBatch& batch,
                      const AttentionParams& p = {});
void attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, Tensor& out, const AttentionParams& p = {});
void argmax(const Tensor& x, Tensor& out);
}  // namespace ref

/// RoPE inverse frequencies theta^(-2j/rot_dim), j = 0 .. rot_dim/2 - 1, as F32 on the host.
Tensor rope_inv_freq(std::int64_t rot_dim, double theta);

struct YarnScaling;  // common/hf_config.h: the fields of a rope_scaling of type "yarn"

/// YaRN's inverse frequencies (Peng et al. 2023, "YaRN: Efficient Context Window Extension"),
/// as transformers 4.57.6 computes them (`_compute_yarn_parameters`), F32 on the host. With
/// d = rot_dim, s = factor, L = original_max_position_embeddings and f_j = theta^(-2j/d) (the
/// plain frequencies of rope_inv_freq):
///
///     dim(b)  = d · ln(L / (2π·b)) / (2 ln theta)    the pair index that turns b times over L
///     lo, hi  = dim(beta_fast), dim(beta_slow)         (floor and ceil when truncate),
///               then lo = max(lo, 0), hi = min(hi, d - 1), and hi += 0.001 if they are equal
///     ramp_j  = clamp((j - lo) / (hi - lo), 0, 1)
///     inv_j   = f_j / s · ramp_j + f_j · (1 - ramp_j)
///
/// Fast pairs (many turns over L, j below lo) keep their frequency, slow ones (j above hi) are
/// interpolated by s, those between are blended. The cos/sin factor is yarn_attention_factor.
Tensor yarn_inv_freq(std::int64_t rot_dim, double theta, const YarnScaling& y);

/// YaRN's magnitude correction 0.1 · m · ln(s) + 1 for s > 1, and 1 for s <= 1
/// (transformers' `get_mscale` and DeepSeek's `yarn_get_mscale`).
double yarn_mscale(double s, double m);

/// The factor YaRN multiplies cos and sin by (so every rotated query and key dimension):
/// attention_factor when the config gives it; else yarn_mscale(s, mscale) /
/// yarn_mscale(s, mscale_all_dim) when both are nonzero; else yarn_mscale(s, 1).
double yarn_attention_factor(const YarnScaling& y);

/// The shape, dtype and device checks shared by every version (they also count the op's work).
namespace check {
void matmul(const Tensor& x, const Tensor& w, const Tensor& out);
void add(const Tensor& a, const Tensor& b, const Tensor& out);
void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out);
void rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, std::int64_t begin);
void softmax(const Tensor& x, const Tensor& out);
void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out);
void geglu(const Tensor& gate, const Tensor& up, const Tensor& out);
/// softcap and scale: an F32 tensor and a positive, finite factor (`what` names it).
void elementwise(const char* op, const Tensor& x, float factor, const char* what);
void embedding(const Tensor& table, const Tensor& ids, const Tensor& out);
/// Returns the resolved parameters (q_offset, scale filled in).
AttentionParams attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const AttentionParams& p);
/// A ragged batch with its defaults resolved: every q_offset, and the scale, filled in.
struct RaggedAttention {
  RaggedBatch batch;
  AttentionParams params;
};
RaggedAttention attention_ragged(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                 const RaggedBatch& batch, const AttentionParams& p);
/// Every sequence's q_offset filled in (the returned copy), and the scale.
struct CachedAttention {
  std::vector<CachedKV> seqs;
  AttentionParams params;
};
CachedAttention attention_cached(const Tensor& q, const std::vector<CachedKV>& seqs, const Tensor& out,
                                 const AttentionParams& p);
/// store_cached's k and v against the batch's rows, heads and device.
void store_cached(const CachedBatch& batch, std::int64_t layer, const Tensor& k, const Tensor& v);
void argmax(const Tensor& x, const Tensor& out);
}  // namespace check

}  // namespace inferlab
