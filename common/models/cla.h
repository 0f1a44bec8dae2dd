#pragma once
/// @file cla.h
/// @brief Chapter 05: cross-layer attention (CLA, Brandon et al. 2024). Adjacent layers share
/// one set of keys and values, so the cache holds ceil(L/s) layers instead of L.
///
/// GQA (chapter 03) shares keys and values between the heads of a layer; CLA shares them between
/// layers. With a sharing factor s, layers are grouped s at a time: the first layer of a group
/// projects K and V from its own input as always, and the other s − 1 layers of the group have
/// no K or V projection at all; they compute only their queries and attend over the keys and
/// values the group's first layer produced (already rotated by RoPE). The cache keeps one K and
/// V per group: ceil(L/s) storage layers, each read by up to s layers.
///
/// # How CLA plugs into the core
///
/// | piece | reused as is | added here |
/// |---|---|---|
/// | the model | `models::Llama`; a sharing layer leaves `wk` and `wv` undefined | `ClaLayout`: which storage layer each layer reads |
/// | the forward pass | `models::forward`, the batch step | `attention_block`: chapter 02's, with k and v projected only by a group's first layer |
/// | the cache | `models::ContiguousKVCache` of ceil(L/s) layers, `models::KVCache` | `SharedKVCache`: layer → storage layer |
/// | attention | `ops::attention` (GQA heads included) | |
///
/// It composes with GQA: a storage layer holds K KV heads, so the cache is
/// S × K × H × ceil(L/s) × 2 × bytes per element, the lecture's formula with L replaced by the
/// number of layers that store.
///
/// # What it saves, and what it does not
///
/// Sharing shrinks what is *stored*, by ceil(L/s)/L, and the parameters, by the (L − ceil(L/s))
/// K and V projections. It does not shrink what one decode step *reads*: every layer still
/// attends over its group's S cached positions, and between the two reads of a storage layer lie
/// a whole MLP and another attention block, so at a long context the second layer reads the rows
/// from memory again. Per sequence, a decode step moves nearly the bytes of the unshared model;
/// the gain is capacity: in a fixed memory budget s times as many sequences' caches fit, and a
/// batched decode step reads the weights once for all of them (chapter 05's `throughput`).

#include <cstdint>
#include <string>
#include <vector>

#include "common/decode_bench.h"
#include "common/models/kv_cache.h"

namespace inferlab::models::cla {

/// Which layers keep their own keys and values, and which storage layer every layer reads.
struct ClaLayout {
  std::int64_t share_factor = 1;      ///< s: layers per group (1 = no sharing, the plain model)
  std::vector<std::int64_t> storage;  ///< storage[i]: the storage layer layer i reads, i / s
  /// Groups of s consecutive layers, the first of each storing: `layers` = L, `share_factor` = s.
  static ClaLayout groups_of(std::int64_t layers, std::int64_t share_factor);
  std::int64_t layers() const { return static_cast<std::int64_t>(storage.size()); }
  /// ceil(L/s): the layers of K and V the cache holds.
  std::int64_t storage_layers() const;
  /// Whether layer i projects and stores its own K and V (the first of its group).
  bool stores(std::int64_t layer) const;
  /// "layers 0-1 read 0, 2-3 read 1"
  std::string describe() const;
};

/// Parameters of a CLA model: the config's count (every layer with its K and V projections)
/// less the K and V projections (and their biases) of the layers that share.
std::int64_t num_parameters(const TransformerConfig& c, const ClaLayout& layout);

/// Bytes of the shared cache at `positions` tokens: S × K × H × ceil(L/s) × 2 × bytes per element.
std::int64_t kv_cache_bytes(const TransformerConfig& c, const ClaLayout& layout, std::int64_t positions,
                            std::int64_t bytes_per_element);

/// A CLA model: chapter 01's Llama whose sharing layers have no `wk`/`wv`, and its layout.
struct ClaModel {
  models::Llama base;
  ClaLayout layout;
  const TransformerConfig& config() const { return base.config; }
};

/// Loads an InferLabCLAForCausalLM folder (tiny-cla, the random models of data/golden/cla-random):
/// the Llama checkpoint layout with k_proj/v_proj only in the first layer of each group of
/// `kv_share_factor` layers (and `kv_producer_layers`, when given, naming exactly those). Also
/// loads any Llama-family folder as CLA with s = 1. Refuses by name a missing or unexpected
/// K/V projection.
ClaModel load_cla(const std::string& path);

/// Random weights, drawn as models::random_llama draws them, with the sharing layers' K and V
/// projections removed (the two-path tests).
ClaModel random_cla(const TransformerConfig& c, std::int64_t share_factor, std::uint64_t seed);

/// An existing model's K and V projections kept only in the first layer of each group: the
/// model CLA would be if its sharing layers read their group's keys (no retraining, so the
/// function changes; ch05's `quality` measures by how much).
ClaModel share_kv(const models::Llama& m, std::int64_t share_factor);

/// The cache of a CLA model: a ContiguousKVCache of ceil(L/s) storage layers, and the map from
/// layer to storage layer. attend(layer, q, k, v): the first layer of a group brings k and v, which
/// are stored and attended over; the others bring none (undefined tensors) and attend over the
/// rows their group's first layer stored, in the same step, without a copy.
class SharedKVCache : public models::KVCache {
 public:
  SharedKVCache(const TransformerConfig& c, ClaLayout layout, std::int64_t capacity, Device device = Device::CPU,
                DType dtype = DType::F32);
  std::int64_t length() const override { return store_.length(); }
  void commit(std::int64_t T) override { store_.commit(T); }
  void truncate(std::int64_t n) override;
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;
  /// The storage's: capacity × K × H × ceil(L/s) × 2 × bytes per element.
  std::int64_t bytes() const override { return store_.bytes(); }
  void release() override;
  const ClaLayout& layout() const { return layout_; }
  /// The storage layers (for tests, benchmarks and their fill).
  models::ContiguousKVCache& storage() { return store_; }
  const models::ContiguousKVCache& storage() const { return store_; }

 private:
  ClaLayout layout_;
  models::ContiguousKVCache store_;
  std::vector<std::int64_t> stored_;  // per storage layer: the end of the rows stored so far
};

/// Chapter 02's attention block with cross-layer sharing: every layer projects its queries; only
/// a layer with K and V projections (the first of its group) projects keys and values; the cache
/// gives the others their group's.
Tensor attention_block(const models::Llama& m, const models::LlamaLayer& l, const Tensor& h, const models::Batch& batch,
                       std::int64_t layer);

/// Chapter 02's batch step with the CLA block (every cache a SharedKVCache of the model's layout).
Tensor forward(const ClaModel& m, std::vector<models::SequenceStep>& seqs);

/// One sequence: the whole prompt, or one token per decode step.
Tensor forward_cached(const ClaModel& m, SharedKVCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions = false);

/// The simple way, for the two-path tests: the logits of every position of `tokens`, each one
/// computed from scratch (a fresh cache, the whole prefix fed at once).
Tensor forward_recomputed(const ClaModel& m, const std::vector<std::int32_t>& tokens);

/// Greedy (or sampled) generation through the shared cache.
models::Generation generate_cached(const ClaModel& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                                   const std::vector<std::int64_t>& eos_ids, const models::OnToken& on_token = nullptr);

/// One batched decode step: sequence b feeds tokens[b] through *caches[b]. Returns logits [B, V].
Tensor decode_step(const ClaModel& m, const std::vector<SharedKVCache*>& caches, const std::vector<std::int32_t>& tokens);

/// Bytes one batched decode step reads: the weights once, and for every sequence each of the L
/// layers' reads of its storage layer at len + 1 positions (a sharing layer reads its group's
/// rows again: sharing shrinks what is stored, not what is read). As the ops count it.
double decode_step_bytes(const ClaModel& m, const std::vector<std::int64_t>& lengths);

/// Times `steps` batched decode steps of `batch` sequences at `context` cached positions (the
/// caches filled with pseudo-random rows, as chapter 02's measure_decode does; best step after a
/// warm-up).
ThroughputPoint measure_decode(const ClaModel& m, std::int64_t batch, std::int64_t context, int steps);

/// Character.AI's recipe (their 2024 note "Optimizing AI Inference at Character.AI"): MQA, local
/// attention with a window of `window` tokens in all but one layer in `global_every`, and K/V
/// shared across `share_factor` adjacent layers. The KV bytes per sequence at `context` tokens,
/// step by step from the plain model, for a model shape the caller chooses.
struct RecipeStep {
  std::string what;
  std::int64_t bytes = 0;  ///< the cache of one sequence at `context` after this step
};
std::vector<RecipeStep> character_ai_recipe(const TransformerConfig& c, std::int64_t context, std::int64_t window,
                                            std::int64_t global_every, std::int64_t share_factor,
                                            std::int64_t bytes_per_element);

}  // namespace inferlab::models::cla
