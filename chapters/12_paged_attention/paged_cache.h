#pragma once
/// @file paged_cache.h
/// @brief Chapter 12: a KV cache made of blocks, and the pool chapter 11's engine runs on.
///
/// PagedKVCache is another implementation of chapter 02's cache interface: it stores a new
/// token's K and V in the slot its block table names and attends through the table. So chapter
/// 02's forward pass, and chapter 11's engine, run on it unchanged. What changes is the memory:
/// a block is taken only when the last one is full, a fork shares every block, and a block that
/// others share is copied before it is written (copy-on-write). Only the partly filled block
/// holding the next position is ever written again, so a fork copies at most one block.

#include <cstdint>
#include <memory>
#include <vector>

#include "chapters/11_continuous_batching/sequence.h"
#include "chapters/12_paged_attention/block_pool.h"

namespace inferlab::ch12 {

/// The copy-on-write rule: whether writing `n` more positions after the first `length` of a
/// cache whose block table is `table` must first copy the block the next position goes into.
/// Only a partly filled block is ever written again; it needs a copy when another holder shares
/// it (a fork) or the prefix cache holds it.
bool must_copy_before_writing(const BlockPool& pool, const std::vector<std::int32_t>& table, std::int64_t length,
                              std::int64_t n);

class PagedKVCache : public models::KVCache {
 public:
  explicit PagedKVCache(BlockPool& pool);
  ~PagedKVCache() override;
  PagedKVCache(const PagedKVCache&) = delete;
  PagedKVCache& operator=(const PagedKVCache&) = delete;

  std::int64_t length() const override { return length_; }
  void commit(std::int64_t T) override;
  /// Forgets positions from n on; blocks past the last one needed go back to the pool.
  void truncate(std::int64_t n) override;
  /// Blocks held × block bytes (a shared block is counted by each holder).
  std::int64_t bytes() const override;
  void release() override;
  /// Stores k, v through the slot mapping of positions length() .. length() + T − 1, then paged
  /// attention of q over positions 0 .. length() + T − 1. reserve(T) must have made room.
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;
  /// The batched path: names the pool's rows in every layer and this cache's block table, through
  /// which ops::store_cached writes the step's keys and values (slot mapping) and
  /// ops::attention_cached reads them, on the CPU or the GPU. reserve(T) must have made room.
  bool locate(std::int64_t T, CachedSeq& where) override;

  /// Makes room for n more positions: a private copy of a partly filled last block that is
  /// shared (or in the prefix cache), and new blocks as needed. False, changing nothing, when
  /// the pool has too few free blocks.
  /// Pieces of attend() for a cache that pages only some of a model's layers (hybrid_cache.h):
  /// store() writes the new rows of pool layer `layer` ([T, heads, dim]; v undefined for a layer
  /// without values of its own), read() attends over its rows 0 .. length() + T − 1 without
  /// writing (a CLA layer reading its source's), gather() copies the first `positions` rows of
  /// its keys (or values) out of the blocks into one contiguous [positions, heads, dim] tensor.
  void store(std::int64_t layer, const Tensor& k, const Tensor& v);
  void read(std::int64_t layer, const Tensor& q, Tensor& out) const;
  Tensor gather(std::int64_t layer, bool values, std::int64_t positions) const;

  bool reserve(std::int64_t n);
  /// A cache holding the same positions, sharing every block (one more reference each).
  std::unique_ptr<PagedKVCache> fork() const;
  /// On an empty cache: shares the cached blocks holding the longest prefix of `tokens` made of
  /// whole blocks, at most `max_positions` positions. Returns the positions it now holds.
  std::int64_t adopt_prefix(const std::vector<std::int32_t>& tokens, std::int64_t max_positions);
  /// Puts every full block not yet in the prefix cache there; `tokens` are the sequence's (at
  /// least length() of them).
  void publish(const std::vector<std::int32_t>& tokens);

  const std::vector<std::int32_t>& block_table() const { return table_; }
  BlockPool& pool() const { return pool_; }

 private:
  // Refuses a write into a block that is shared or in the prefix cache (a missing reserve).
  void check_writable(std::int64_t layer, std::int64_t T) const;
  BlockPool& pool_;
  std::vector<std::int32_t> table_;
  std::vector<BlockHash> hashes_;  // hashes of table_'s first blocks, as published or adopted
  std::int64_t length_ = 0;
};

/// Chapter 11's KV pool made of blocks: the budget is the block pool, a sequence is charged for
/// the blocks it holds, and with prefix caching a new sequence starts with the cached blocks of
/// its prompt's prefix.
struct PagedLayout;

class PagedPool : public ch11::KVPool {
 public:
  PagedPool(const TransformerConfig& c, std::int64_t budget_bytes, std::int64_t block_size = 16, Device device = Device::CPU,
            bool prefix_caching = false);
  /// Any model (which must outlive the pool), on its device (hybrid_cache.h): its growing layers'
  /// rows in blocks, its fixed layers (windows, states) in one slot per sequence, `slots` of them
  /// set aside from the budget before the blocks get the rest (give the scheduler's max_running:
  /// no more sequences run at once). A model without growing layers (Mamba) gets only slots, as
  /// many as the budget holds. Prefix caching is refused, by name, for a model with a slot.
  PagedPool(const models::Model& m, std::int64_t budget_bytes, std::int64_t block_size = 16, bool prefix_caching = false,
            std::int64_t slots = 8);
  ~PagedPool() override;
  bool reserve(ch11::Sequence& s, std::int64_t n) override;
  void free(ch11::Sequence& s) override;
  std::int64_t used_bytes() const override;
  std::int64_t budget_bytes() const override;
  std::int64_t bytes_for(std::int64_t tokens) const override;
  /// A fork sharing every block of s's cache (parallel samples): no block is taken until one
  /// of them writes into the shared, partly filled last block.
  std::unique_ptr<models::Cache> fork(const ch11::Sequence& s) override;
  std::string describe() const override;
  /// The blocks (refused for a pool of slots only: has_blocks()).
  BlockPool& blocks();
  const BlockPool& blocks() const;
  bool has_blocks() const { return blocks_ != nullptr; }
  std::int64_t blocks_used() const { return blocks_ ? blocks_->used() : 0; }
  std::int64_t blocks_total() const { return blocks_ ? blocks_->total() : 0; }
  std::int64_t block_bytes() const { return blocks_ ? blocks_->block_bytes() : 0; }
  std::int64_t prefix_hits() const { return blocks_ ? blocks_->hits : 0; }
  /// Slots held and set aside (0 for a model whose every layer grows).
  std::int64_t slots_used() const { return slots_used_; }
  std::int64_t slots_total() const { return slots_; }
  std::int64_t slot_bytes() const;
  bool prefix_caching() const { return prefix_caching_; }
  /// The block table of a cache this pool made (null for a slot alone).
  static const PagedKVCache* blocks_of(const models::Cache* c);
  /// The layout of a pool made for a Model (null for one made from a config: plain attention).
  const PagedLayout* layout() const { return layout_.get(); }
  /// Bytes held now by the layers of each kind (models::LayerKind's order): a block's bytes split
  /// among the growing layers by their rows, a slot's among the fixed layers by their state.
  std::vector<std::int64_t> used_by_kind() const;

 private:
  std::unique_ptr<models::Cache> open();
  std::unique_ptr<PagedLayout> layout_;
  const models::Model* model_ = nullptr;
  std::unique_ptr<BlockPool> blocks_;
  bool prefix_caching_;
  std::int64_t slots_ = 0, slots_used_ = 0;
};

}  // namespace inferlab::ch12
