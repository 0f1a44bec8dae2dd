#pragma once
/// @file local.h
/// @brief Chapter 06: local attention. A sliding-window layer sees only its last W positions, so
/// its cache is a ring of W slots whose size no longer grows with the sequence.
///
/// # The convention
///
/// A query at position p of a local layer with window W sees the keys of positions
/// p − W + 1 .. p: W positions, itself included. That is what `AttentionParams::window` does and
/// what Mistral's and Ministral's `sliding_window` means in transformers (its mask keeps key j
/// for query i when j > i − W). A global layer sees 0 .. p as always.
///
/// # The ring
///
/// Position p of a local layer lives in slot p mod W of W slots: writing position p overwrites
/// p − W, the one position the query at p no longer sees. Once the ring is full, its slots hold
/// exactly the window, in rotated order; attention does not care about the order of its keys (RoPE
/// was applied before they were stored, with their own positions), so a decode step attends over
/// all slots, with no mask and no copy. With `sinks` (StreamingLLM, Xiao et al. 2023), positions
/// 0 .. sinks − 1 keep slots of their own in front of the ring (slot = sinks + (p − sinks) mod W)
/// and every query sees them as well: the rows it may read are always a prefix of the storage.
///
/// # Hybrid stacks
///
/// Models mix local and global layers (`layer_types`: Ministral, Qwen2; tiny-hybrid keeps one
/// global layer in four, Character.AI one in six, Gemma 3 one in six). The cache is a ring for
/// each local layer and chapter 02's rows for each global one:
///   bytes = (n_global × T + n_local × min(T, sinks + W)) × K × H × 2 × bytes per element.
/// The model is chapter 01's, the forward pass chapter 02's batch step as it is: the window is
/// the cache's business. What local layers cost is reach: information moves at most W − 1
/// positions per layer, so a stack of L local layers sees L × (W − 1) + 1 positions back, its
/// receptive field, and nothing beyond it; one global layer lifts the limit.

#include <cstdint>
#include <string>
#include <vector>

#include "common/models/kv_cache.h"

namespace inferlab::models::local {

/// Which layers attend locally, and with what window.
struct LocalLayout {
  std::vector<std::int64_t> window;  ///< per layer: its W, or 0 for a global layer
  std::int64_t sinks = 0;            ///< positions every local layer keeps besides its window (StreamingLLM)

  /// L layers, all global (the dense model), or all local with window W.
  static LocalLayout global(std::int64_t layers);
  static LocalLayout local(std::int64_t layers, std::int64_t window);
  /// One global layer in every `global_every`: layers g − 1, 2g − 1, ... (the last of each group of
  /// g, as tiny-hybrid and Gemma 3 place it); the others local with window W.
  static LocalLayout hybrid(std::int64_t layers, std::int64_t window, std::int64_t global_every);
  std::int64_t layers() const { return static_cast<std::int64_t>(window.size()); }
  bool is_local(std::int64_t layer) const;
  std::int64_t locals() const;
  std::int64_t globals() const { return layers() - locals(); }
  /// Rows layer `layer` keeps for a sequence of up to `capacity` positions: min(capacity,
  /// sinks + W) for a local layer, capacity for a global one.
  std::int64_t rows(std::int64_t layer, std::int64_t capacity) const;
  /// How many positions back position p can draw information from (p itself included):
  /// L × (W − 1) + 1 for L local layers of window W (sinks aside), −1 (unlimited) once a layer is global.
  std::int64_t receptive_field() const;
  /// "layers 0-2 local (W = 64), layer 3 global"
  std::string describe() const;
};

/// The cache bytes of a sequence of `positions` tokens: for each layer its rows × K × H × 2 × b.
std::int64_t kv_cache_bytes(const TransformerConfig& c, const LocalLayout& layout, std::int64_t positions,
                            std::int64_t bytes_per_element);

/// The windows of a config.json, as transformers 4.57 reads them:
/// - MinistralForCausalLM: `layer_types` ("sliding_attention" / "full_attention"), or every layer
///   local when it is absent and `sliding_window` is set;
/// - MistralForCausalLM: every layer local with `sliding_window`, none when it is null (Mistral
///   ignores `layer_types`, as transformers' Mistral does);
/// - Qwen2ForCausalLM: `sliding_window` only when `use_sliding_window` is true; then `layer_types`,
///   or layers max_window_layers .. L − 1 local;
/// - other Llama-family architectures: every layer global.
/// Throws naming the field for a window that is not a positive integer, a layer type it does not
/// know, or a sliding layer without a window.
LocalLayout parse_local_layout(const HfConfig& hf, std::int64_t layers);

/// A model with its windows: chapter 01's Llama (the weights do not change) and its layout.
struct LocalModel {
  models::Llama base;
  LocalLayout layout;
  const TransformerConfig& config() const { return base.config; }
};

/// Loads a Mistral, Ministral, Qwen2, Qwen3, Gemma 2 / Gemma 3 or other Llama-family folder
/// (tiny-swa, tiny-hybrid, the random models of data/golden/window-random and family-random) with
/// its windows; a GGUF file (chapter 09's reader) with the windows llama.cpp reads from it; a
/// llama2.c file as all global.
LocalModel load_local(const std::string& path);

/// Reads a Gemma 2 or Gemma 3 text checkpoint (Gemma2ForCausalLM, Gemma3ForCausalLM) as chapter
/// 01's Llama with the pieces Gemma adds: norms after attention and MLP (post_attention_layernorm,
/// post_feedforward_layernorm; pre_feedforward_layernorm is the MLP's), every norm weight w stored
/// as the 1 + w Gemma multiplies by, GeGLU, Gemma 3's q/k norms and the RoPE base of its local
/// layers (those `layout` marks local). The config carries the rest (embedding scale, attention
/// scale, soft-capping).
models::Llama load_gemma(const HfConfig& hf, const TransformerConfig& c, const LocalLayout& layout, const std::string& path);

/// The cache of a local/global stack: per local layer a ring of min(capacity, sinks + W) slots,
/// per global layer chapter 02's rows. attend(): store the new keys and values in their slots,
/// then attention over the rows the queries may see (see the note above).
class RingKVCache : public models::RowCache {
 public:
  RingKVCache(const TransformerConfig& c, LocalLayout layout, std::int64_t capacity, Device device = Device::CPU,
              DType dtype = DType::F32);
  /// Only the local layers' rings, for any length: a global layer keeps nothing here (chapter 12's
  /// paged pool keeps its rows in blocks) and attending in one is refused.
  static RingKVCache rings_only(const TransformerConfig& c, LocalLayout layout, Device device = Device::CPU);
  std::unique_ptr<models::Cache> clone() const override;
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;
  /// Forgets positions from n on. A full ring has overwritten what lies before its window, so
  /// rolling back more than one position of a full ring is refused, naming the positions lost.
  void truncate(std::int64_t n) override;
  std::int64_t bytes() const override;
  void release() override;
  const LocalLayout& layout() const { return layout_; }
  /// The slot of position p in local layer `layer` (a global layer's row is p).
  std::int64_t slot(std::int64_t layer, std::int64_t p) const;
  /// Layer `layer`'s storage [rows, K, H] (for tests, and to fill it in benchmarks).
  Tensor k(std::int64_t layer) const { return k_.at(static_cast<std::size_t>(layer)); }
  Tensor v(std::int64_t layer) const { return v_.at(static_cast<std::size_t>(layer)); }

 private:
  TransformerConfig config_;
  LocalLayout layout_;
  DType dtype_;
  bool rings_only_ = false;
  std::vector<Tensor> k_, v_;
};

/// The simple way, for the two-path tests and the lesson: every position kept in contiguous rows
/// (chapter 02's cache) and the window applied as a mask in the attention op. It saves the
/// arithmetic of local attention but none of its memory.
class MaskedKVCache : public models::ContiguousKVCache {
 public:
  MaskedKVCache(const TransformerConfig& c, LocalLayout layout, std::int64_t capacity, Device device = Device::CPU);
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;

 private:
  LocalLayout layout_;
  AttentionParams params_;  // the config's scale and soft-capping
};

/// Whether the token `d` positions before the last of `tokens` can reach the last position's
/// logits at all: its embedding made NaN (a token id the sequence does not use; the head keeps the
/// original table), the last logits turn NaN exactly when a chain of attention hops, each inside
/// its layer's window, links the two, however small the weights along it. For a stack of local
/// layers: exactly when d < receptive_field().
bool reaches(const LocalModel& m, const std::vector<std::int32_t>& tokens, std::int64_t d);

/// One sequence through chapter 02's batch step with a ring cache.
Tensor forward_cached(const LocalModel& m, models::KVCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions = false);

/// Greedy (or sampled) generation through a ring cache of prompt + max_new positions.
models::Generation generate_cached(const LocalModel& m, const std::vector<std::int32_t>& prompt, int max_new,
                                   Sampler& sampler, const std::vector<std::int64_t>& eos_ids,
                                   const models::OnToken& on_token = nullptr);

}  // namespace inferlab::models::local
