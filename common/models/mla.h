#pragma once
/// @file mla.h
/// @brief Chapter 04: multi-head latent attention (DeepSeek-V2/V3). The cache keeps one small
/// latent row per token instead of every head's keys and values.
///
/// # How MLA plugs into the core
///
/// GQA (chapter 03) shrinks the cache by sharing heads; MLA keeps all N heads but stores, per
/// token and layer, a single row of r + dr numbers from which every head's key and value can be
/// rebuilt. Only the attention block and the cache's row change; everything else is the core's:
///
/// | piece | reused as is | added here |
/// |---|---|---|
/// | embedding, RMSNorm, positions, SwiGLU MLP, final norm, head | `models::embed`, `norm`, `positions`, `mlp_block`, `head` on `MlaModel::base` (a `models::Llama` whose attention projections are left undefined) | |
/// | the batch (rows, positions, logit rows) | `models::Batch`, `models::SequenceStep` | |
/// | attention | `ops::attention` (Dv ≠ Dqk, explicit scale) | `attention_block` below, plain and absorbed |
/// | RoPE | `ops::rope(x, pos, freq, pairing, begin)` on the trailing dr dims | frequencies of dr (not of a head) |
/// | the cache | the `models::KVCache` interface | `LatentCache`: one row [c_kv ‖ k_pe] per token |
///
/// The attention block, per token (h the normed residual row, D wide):
///
///     q      = W_Q h                      (or W_QB · RMSNorm(W_QA h) when q_lora_rank is set)
///              split per head into q_nope [dn] and q_pe [dr]
///     [c ‖ kp] = W_KVA h                  joint down-projection: c [r], kp [dr] (one, shared by all heads)
///     c      = RMSNorm(c)                 (kv_a_layernorm, eps 1e-6 whatever rms_norm_eps says)
///     q_pe, kp = RoPE(q_pe), RoPE(kp)     decoupled RoPE: only these dr dims carry position
///     cache row = [c ‖ kp]                what is stored: r + dr values per token and layer
///     [k_nope ‖ v] per head = W_KVB c     up-projection, [N·(dn + dv), r]
///     score  = (q_nope·k_nope + q_pe·kp) · scale,   scale = 1/sqrt(dn + dr) (· mscale², YaRN below)
///     out    = W_O (softmax(score) · v)
///
/// Why the decoupled part: RoPE rotates a key by its position, a rotation that does not commute
/// with W_KVB, so a rotated key cannot be rebuilt from a position-free latent. The dr extra
/// dims carry the position alone (the lecture's 512 + 64 = 576 for DeepSeek-V2).
///
/// YaRN (`rope_scaling` of type "yarn", DeepSeek-V2/V3's long-context configs) changes three
/// numbers, all as transformers 4.57.6's DeepseekV3 computes them:
/// - the dr frequencies are `yarn_inv_freq` (common/ops.h) instead of `rope_inv_freq`;
/// - cos and sin are multiplied by `yarn_attention_factor` a, so q_pe and kp both carry a (the
///   rope part of the score a²). RoPE is linear, so RoPE(a·x) = a·RoPE(x): `load_mla` multiplies
///   the rows of q_proj (or q_b_proj) that produce each head's q_pe, and the last dr rows of
///   kv_a_proj_with_mqa (kp), by a, and the forward pass is unchanged. The cached kp is
///   transformers' key, a included;
/// - DeepseekV3 multiplies the softmax scale by yarn_mscale(factor, mscale_all_dim)² when
///   mscale_all_dim is set (`MlaConfig::softmax_scale`). DeepseekV2ForCausalLM in transformers
///   does not, so `load_mla` refuses a V2 config with mscale_all_dim rather than pick one.
///
/// DeepseekV2ForCausalLM: the same dense layer, except that its RoPE multiplies adjacent pairs
/// (2j, 2j+1) as complex numbers: `RopePairing::Adjacent` with the key stored in transformers'
/// own order, whatever `rope_interleave` says (V2 has no such field).
///
/// RoPE pairing: with `rope_interleave` true (DeepSeek's own checkpoints), transformers
/// de-interleaves the dr dims (even ones first, then odd ones) and applies `rotate_half`; since
/// q and k get the same permutation, their dot product is that of rotating adjacent pairs
/// (2j, 2j+1) in place: `RopePairing::Adjacent` (the stored k_pe differs from transformers' by
/// that permutation only). With `rope_interleave` false (tiny-mla) it is Llama's HF pairing,
/// j with j + dr/2 (`RopePairing::HalfSplit`). Either way, unlike Llama, only dr of each head's
/// dn + dr query dims and one shared key of dr dims rotate, and the frequencies are those of dr.
///
/// # The cache layout
///
/// `LatentCache`: per layer one tensor [capacity, 1, r + dr], position p in row p: c (after its
/// RMSNorm) in columns 0 .. r-1, k_pe (after RoPE) in columns r .. r+dr-1. As a KV cache it is
/// one KV head whose key is the whole row and whose value is the first r columns of the same
/// row: nothing is stored twice. Bytes: capacity × (r + dr) × L × bytes per element.
///
/// # The two decode paths
///
/// Per layer and decode step at S cached positions (multiply-adds as 2 FLOPs, b bytes per cached
/// value, the projections of the new token left out as they are the same in both):
///
/// - **Plain**: rebuild every head's K and V from the S latent rows each step (W_KVB on all of
///   them), then ordinary attention.
///   FLOPs ≈ 2·S·r·N·(dn + dv) (the rebuild) + 2·S·N·(dn + dr) + 2·S·N·dv (attention).
///   Bytes: S·(r + dr)·b from the cache, plus the rebuilt K and V, S·N·(dn + dr + dv) f32 values
///   written and read again (that is the MHA cache, recomputed every step).
/// - **Absorbed**: W_UK (the k_nope rows of W_KVB) is folded into the query,
///   q_lat = W_UKᵀ q_nope [r] per head, and W_UV (the v rows) into the output, out_h = W_UV·o_lat;
///   attention runs in latent space against the cached rows themselves (Dqk = r + dr, Dv = r,
///   one KV head for all N query heads: MQA over the latents).
///   FLOPs ≈ 2·N·dn·r + 2·N·r·dv (fold in, fold out: independent of S) + 2·S·N·(r + dr) + 2·S·N·r.
///   Bytes: S·(r + dr)·b from the cache, nothing rebuilt.
///
/// DeepSeek-V2 (N = 128, dn = dv = 128, dr = 64, r = 512): per cached token and layer the plain
/// path spends 2·512·128·256 ≈ 33.6 MFLOP on the rebuild, the absorbed path 2·128·(576 + 512) ≈
/// 0.28 MFLOP on attention, about 120× fewer. Both read 576 values per token and layer from the
/// cache; MHA with the same heads would read N·(dn + dr + dv) = 40,960 (71×), or 2·N·128 = 32,768
/// (57×) in the paper's comparison with d_h = 128. The absorbed path makes attention compute
/// denser, not cheaper, than MHA's (1,088 vs 320 multiply-adds per head and cached token): decode
/// turns from memory-bound towards compute-bound, which is the point.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/models/kv_cache.h"

namespace inferlab::models::mla {

/// The MLA fields of a DeepseekV3 config.json, in the note's letters.
struct MlaConfig {
  std::int64_t q_lora_rank = 0;       ///< rq; 0 when the query is projected directly (q_lora_rank null)
  std::int64_t kv_lora_rank = 0;      ///< r: the latent c
  std::int64_t qk_nope_head_dim = 0;  ///< dn
  std::int64_t qk_rope_head_dim = 0;  ///< dr
  std::int64_t v_head_dim = 0;        ///< dv
  bool rope_interleave = false;       ///< true: adjacent pairs (DeepSeek's checkpoints); false: half split
  /// rope_scaling of type "yarn": the dr frequencies are yarn_inv_freq's; absent without rope_scaling.
  std::optional<YarnScaling> yarn;
  /// YaRN's factor on cos and sin (yarn_attention_factor), 1 without YaRN. The model's weights
  /// carry it (see the note), so the forward pass never reads it.
  double rope_attention_factor = 1;
  /// DeepseekV3's softmax correction under YaRN: yarn_mscale(factor, mscale_all_dim)² when
  /// mscale_all_dim is set, 1 otherwise.
  double softmax_mscale = 1;
  /// The eps of the two latent RMSNorms (q_a_layernorm, kv_a_layernorm): DeepSeek's code and
  /// transformers build them with their default 1e-6 whatever rms_norm_eps says; the model's
  /// other norms use rms_norm_eps.
  static constexpr float kLatentNormEps = 1e-6f;
  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  /// Values one token stores per layer: r + dr.
  std::int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
  /// The softmax scale softmax_mscale/sqrt(dn + dr): the score is that of a dn + dr dimensional
  /// query and key, whichever path computes it.
  float softmax_scale() const;
};

/// One layer's MLA weights ([out, in] as torch stores them).
struct MlaAttention {
  Linear wq;         ///< [N·(dn+dr), D] (q_proj), or undefined when q_lora_rank is set
  Linear wq_a;       ///< [rq, D] (q_a_proj)
  Tensor q_a_norm;   ///< [rq] (q_a_layernorm)
  Linear wq_b;       ///< [N·(dn+dr), rq] (q_b_proj)
  Linear wkv_a;      ///< [r + dr, D] (kv_a_proj_with_mqa): the joint down-projection
  Tensor kv_a_norm;  ///< [r] (kv_a_layernorm)
  Linear wkv_b;      ///< [N·(dn+dv), r] (kv_b_proj): head h's rows are its W_UK [dn, r], then its W_UV [dv, r]
  Linear wo;         ///< [D, N·dv] (o_proj)
  // The absorbed path's weights, taken from wkv_b when the model is built (f32):
  std::vector<Tensor> uk_t;  ///< per head W_UKᵀ [r, dn]: q_lat = q_nope · W_UK, as ops::matmul(q_nope, uk_t)
  std::vector<Tensor> uv;    ///< per head W_UV [dv, r]: out_h = o_lat · W_UVᵀ
};

/// A DeepseekV3 model with MLA attention and dense SwiGLU MLPs. `base` is chapter 01's model
/// holding everything but attention (its layers' wq/wk/wv/wo stay undefined); `attn[i]` is
/// layer i's attention. base.inv_freq are the frequencies of the dr rotary dims (YaRN's when
/// mla.yarn is set) and base.rope_pairing follows rope_interleave.
struct MlaModel {
  models::Llama base;
  MlaConfig mla;
  std::vector<MlaAttention> attn;
  const TransformerConfig& config() const { return base.config; }
};

/// Reads the MLA fields of a config.json (DeepseekV3 or DeepseekV2, from c.architecture),
/// refusing by name every field that would change the math and is not implemented here
/// (rope_scaling other than YaRN, attention biases, ...). The MoE fields are the core's
/// (parse_moe_config, common/moe_config.h), read into c.moe.
MlaConfig parse_mla_config(const HfConfig& hf, const TransformerConfig& c);

/// Loads a DeepseekV3ForCausalLM or DeepseekV2ForCausalLM Hugging Face folder (tiny-mla, the
/// random models of data/golden/mla-random). Checks every tensor's shape against the config,
/// and that the checkpoint holds no tensor the config does not explain. A path ending in .gguf
/// is read as llama.cpp's deepseek2 (load_mla_gguf, mla_gguf.h).
MlaModel load_mla(const std::string& path);

/// Where the model's tensors come from: get(name, shape) under Hugging Face's names
/// ("model.layers.3.self_attn.kv_b_proj.weight"), checked against the shape: a checkpoint, a
/// GGUF file (its names translated, mla_gguf.h), or random draws.
using TensorGetter = std::function<Tensor(const std::string& name, const Shape& shape)>;

/// The model of a config from a getter: chapter 01's decoder layout (models::read_decoder, its MoE
/// layers included) with MLA attention, the YaRN factor moved into the rope rows, the absorbed
/// path's weights taken out of kv_b_proj, RoPE frequencies and pairing from `mla`.
MlaModel assemble_mla(const TransformerConfig& c, const MlaConfig& mla, const TensorGetter& get);

/// Random weights for a config (the two-path tests), as models::random_llama draws them.
MlaModel random_mla(const TransformerConfig& c, const MlaConfig& mla, std::uint64_t seed);

/// Fills uk_t and uv from wkv_b (load_mla and random_mla call it).
void absorb(const MlaConfig& mla, std::int64_t num_heads, MlaAttention& a);

/// The latent cache: per layer [capacity, 1, r + dr], row p = [c ‖ k_pe] of position p.
class LatentCache : public models::RowCache {
 public:
  LatentCache(const TransformerConfig& c, const MlaConfig& mla, std::int64_t capacity, Device device = Device::CPU,
              DType dtype = DType::F32);
  /// The absorbed path: k [T, 1, r + dr] are the new latent rows (stored), v [T, 1, r] their
  /// first r columns (not stored again: the value is read from the key's row); q [T, N, r + dr]
  /// is the query in latent space; out [T, N, r] the attention output in latent space. Scale
  /// 1/sqrt(dn + dr), the model's, not 1/sqrt(r + dr).
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;
  /// The plain path: stores the new rows [T, r + dr] and returns rows 0 .. length() + T - 1 of
  /// the layer (a view), from which the caller rebuilds K and V.
  Tensor append(std::int64_t layer, const Tensor& rows);
  /// capacity × (r + dr) × L × bytes per element.
  std::int64_t bytes() const override;
  void release() override;
  /// Layer `layer`'s storage [capacity, 1, r + dr] (for tests).
  Tensor rows(std::int64_t layer) const;

 private:
  Tensor store(std::int64_t layer, const Tensor& rows);  // rows [T, r + dr] into length_ ..
  MlaConfig mla_;
  std::int64_t layers_ = 0;
  DType dtype_;
  std::vector<Tensor> rows_;
};

/// Which way the attention block computes attention over the latent cache.
enum class MlaPath {
  Plain,     ///< rebuild K and V of every cached position from its latent row
  Absorbed,  ///< fold W_UK into the query and W_UV into the output, attend over the latent rows
};

/// What one layer's MLA attention block costs for T new rows after S cached positions, in the
/// units the ops count (metrics::CountScope: a multiply-add is 2 FLOPs). D is the model width.
struct MlaCost {
  double projection_flops = 0;  ///< W_Q (or W_QA then W_QB), W_KVA and W_O: the same in both paths
  double cache_flops = 0;       ///< everything that reads the cache: rebuild or folds, and attention
  double cache_bytes = 0;       ///< the latent rows attention reads: (S + T) rows of r + dr values
  double rebuilt_bytes = 0;     ///< plain only: the rebuilt K and V (f32), written once and read once
};
MlaCost mla_cost(const MlaConfig& c, std::int64_t D, std::int64_t N, std::int64_t T, std::int64_t S, MlaPath path,
                 std::int64_t cache_value_bytes = 4);

/// Rows per step above which the plain path needs fewer cache FLOPs than the absorbed one, for a
/// long context (S ≫ T): r·(dn + dv) / (2r − dn − dv), infinite when 2r ≤ dn + dv. One decode
/// row is far below it; a prefill chunk of a few hundred rows is above it (DeepSeek-V2: 170.7).
double crossover_rows(const MlaConfig& c);

/// The MLA attention block over a batch: h [T, D] (normed) -> [T, D]. Every sequence's cache
/// must be a LatentCache.
Tensor attention_block(const MlaModel& m, const MlaAttention& a, const Tensor& h, const models::Batch& batch,
                       std::int64_t layer, MlaPath path);

/// Chapter 02's batched forward pass with the MLA attention block (the caches LatentCaches).
Tensor forward(const MlaModel& m, std::vector<models::SequenceStep>& seqs, MlaPath path = MlaPath::Absorbed);

/// One sequence: the whole prompt, or one token per decode step.
Tensor forward_cached(const MlaModel& m, LatentCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions = false, MlaPath path = MlaPath::Absorbed);

/// Greedy (or sampled) generation through the latent cache.
models::Generation generate_cached(const MlaModel& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                                   const std::vector<std::int64_t>& eos_ids, MlaPath path = MlaPath::Absorbed,
                                   const models::OnToken& on_token = nullptr);

}  // namespace inferlab::models::mla
