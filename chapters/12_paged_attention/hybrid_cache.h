#pragma once
/// @file hybrid_cache.h
/// @brief The paged pool for every architecture: which layers keep rows in blocks, which read
/// another layer's, which keep one fixed slot per sequence.
///
/// A model says what each layer keeps (common/models/model.h, LayerSpec). The pool reads that:
///
/// | layer kind | in the pool                                   | a sequence of n positions costs |
/// |------------|-----------------------------------------------|---------------------------------|
/// | Attention  | K and V rows in blocks                        | ceil(n / B) blocks              |
/// | Latent     | one latent row in blocks (its value is the row's first r columns: no V) | the same blocks |
/// | Shared     | nothing: it reads its source layer's blocks   | 0                               |
/// | Window     | a ring of sinks + W rows in the sequence's slot | one slot, whatever n          |
/// | Recurrent  | the conv and SSM state in the sequence's slot | one slot, whatever n            |
///
/// Every growing layer (Attention, Latent) shares one block table: a block holds B positions of
/// each of them, so the table grows as the sequence does. The fixed layers share one slot per
/// sequence, made by the model (Model::make_fixed_cache): the pool sets a number of slots aside
/// from its budget (as many as sequences run at once) and gives the rest to blocks. A window's
/// ring is a slot rather than blocks freed as they fall behind the window: the ring's bytes are
/// the window's, allocated once, and a block table that holds every growing layer could not free
/// one layer's part of a block.
///
/// Prefix caching shares blocks by the hash of the tokens they hold. A ring has overwritten its
/// early positions and a state keeps none, so a model with a fixed slot shares no prefix: the pool
/// refuses prefix caching for it, by name, rather than serve a prompt's cached blocks beside a
/// slot that never saw them. Copy-on-write forks (n > 1) share the blocks as chapter 12 does and
/// copy the slot.
///
/// The production counterpart is vLLM V1's hybrid KV cache manager (one block table per group of
/// layers of the same kind, sliding-window groups freeing blocks outside the window, Mamba state
/// in a page of its own).

#include <cstdint>
#include <memory>
#include <vector>

#include "chapters/12_paged_attention/paged_cache.h"
#include "common/models/model.h"

namespace inferlab::ch12 {

/// Where each of a model's layers keeps its cache in the paged pool.
struct PagedLayout {
  std::vector<models::LayerSpec> layers;
  std::vector<std::int64_t> pool_layer;  ///< per model layer: its layer in the block pool, or −1
  std::vector<PagedLayer> blocks;        ///< the pool's layers: each growing layer of the model
  bool fixed = false;                    ///< some layer keeps a fixed slot (a window, a state)
  std::int64_t slot_bytes = 0;           ///< bytes of one sequence's slot
  /// Every layer full attention at the default scale and without soft-capping: chapter 12's
  /// cache and kernel as they are (PagedKVCache, the batched step's one call).
  bool plain = true;

  static PagedLayout of(const models::Model& m);
  /// Bytes of one block of `block_size` positions of the growing layers (0 when none grows).
  std::int64_t block_bytes(std::int64_t block_size) const;
  /// "4 layers in blocks (2 attention, 2 latent), 2 shared, 3 in a slot of 12 KiB (window)"
  std::string describe() const;
};

/// One sequence's cache when its model has more than plain attention layers: the growing layers'
/// rows in the pool's blocks (a PagedKVCache over the pool's layers), the fixed layers in its
/// slot. attend() sends each layer where its spec says; a layer with its own scale, soft-capping
/// or a value that is its key's first columns gathers its rows out of the blocks and runs the
/// attention op (the plain layers read the blocks in place with chapter 12's kernel).
class HybridCache : public models::KVCache {
 public:
  /// `fixed`: the model's make_fixed_cache(), where the layout has fixed layers.
  HybridCache(const PagedLayout& layout, BlockPool& pool, std::unique_ptr<models::Cache> fixed);
  std::int64_t length() const override { return paged_->length(); }
  void commit(std::int64_t T) override;
  void truncate(std::int64_t n) override;
  std::int64_t bytes() const override;
  void release() override;
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;

  PagedKVCache& paged() { return *paged_; }
  const PagedKVCache& paged() const { return *paged_; }
  /// The slot (null when the layout has none).
  const models::Cache* fixed() const { return fixed_.get(); }
  /// Shares the blocks and copies the slot (a parallel sample).
  std::unique_ptr<HybridCache> fork() const;

 private:
  HybridCache(const PagedLayout& layout, std::unique_ptr<PagedKVCache> paged, std::unique_ptr<models::Cache> fixed);
  const PagedLayout& layout_;
  std::unique_ptr<PagedKVCache> paged_;
  std::unique_ptr<models::Cache> fixed_;
};

}  // namespace inferlab::ch12
