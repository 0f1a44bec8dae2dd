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
class PagedPool : public ch11::KVPool {
 public:
  PagedPool(const TransformerConfig& c, std::int64_t budget_bytes, std::int64_t block_size = 16, Device device = Device::CPU,
            bool prefix_caching = false);
  bool reserve(ch11::Sequence& s, std::int64_t n) override;
  void free(ch11::Sequence& s) override;
  std::int64_t used_bytes() const override { return blocks_.used() * blocks_.block_bytes(); }
  std::int64_t budget_bytes() const override { return blocks_.total() * blocks_.block_bytes(); }
  std::int64_t bytes_for(std::int64_t tokens) const override;
  /// A fork sharing every block of s's cache (parallel samples): no block is taken until one
  /// of them writes into the shared, partly filled last block.
  std::unique_ptr<models::Cache> fork(const ch11::Sequence& s) override;
  std::string describe() const override;
  BlockPool& blocks() { return blocks_; }
  const BlockPool& blocks() const { return blocks_; }
  bool prefix_caching() const { return prefix_caching_; }

 private:
  BlockPool blocks_;
  bool prefix_caching_;
};

}  // namespace inferlab::ch12
