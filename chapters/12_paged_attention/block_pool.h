#pragma once
/// @file block_pool.h
/// @brief Chapter 12: the KV memory as a pool of fixed-size blocks, with reference counts and a prefix cache.
///
/// PagedAttention applies virtual memory to the KV cache. The memory is one pool of blocks,
/// each holding the K and V of `block_size` positions in every layer. A sequence owns a list of
/// block numbers, its block table, and takes a new block only when its last one is full. So a
/// sequence wastes at most the unused tail of its last block (internal fragmentation is bounded
/// by one block), and since any free block serves any sequence, there are no gaps between
/// sequences (no external fragmentation).
///
/// Blocks are reference-counted, so sequences can share them: forks of one prompt (parallel
/// sampling, beam search) share all its blocks, and requests with the same prefix (a system
/// prompt) share the blocks holding it. A full block is named by a hash of its tokens and of
/// everything before them (its parent block's hash). A released block that has a hash stays in
/// the prefix cache until its memory is needed; then the least recently used one is evicted.

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "common/hf_config.h"
#include "common/tensor.h"

namespace inferlab::ch12 {

/// A full block's name: its tokens, chained to the hash of the block before it (0 for the first).
using BlockHash = std::uint64_t;
BlockHash block_hash(BlockHash parent, const std::int32_t* tokens, std::int64_t n);

/// What one layer keeps in a block per position: K [heads, k_dim] and V [heads, v_dim]; v_dim 0
/// for a layer whose values are its keys' first columns (MLA's latent rows: one row per
/// position, no heads, the value its first r columns).
struct PagedLayer {
  std::int64_t heads = 0, k_dim = 0, v_dim = 0;
  std::int64_t values() const { return heads * (k_dim + v_dim); }  ///< per position
};

class BlockPool {
 public:
  /// `blocks` blocks of `block_size` positions, for a model of config `c`, on `device`.
  BlockPool(const TransformerConfig& c, std::int64_t blocks, std::int64_t block_size = 16, Device device = Device::CPU);
  /// The same for any layers: each block holds `block_size` positions of every one of them.
  BlockPool(const std::vector<PagedLayer>& layers, std::int64_t blocks, std::int64_t block_size = 16,
            Device device = Device::CPU);
  /// Bytes of one block of these layers (f32).
  static std::int64_t bytes_of_block(const std::vector<PagedLayer>& layers, std::int64_t block_size);

  std::int64_t block_size() const { return block_size_; }
  std::int64_t total() const { return static_cast<std::int64_t>(refs_.size()); }
  /// Blocks allocate() can hand out: never used, freed, or cached without a reference.
  std::int64_t free() const { return static_cast<std::int64_t>(free_.size() + lru_.size()); }
  std::int64_t used() const { return total() - free(); }
  /// Bytes of one block: K and V of block_size positions in every layer.
  std::int64_t block_bytes() const { return block_bytes_; }

  /// A block with one reference, or -1 when none is free. A never-hashed free block first; else
  /// the least recently used cached one, whose hash is forgotten.
  std::int32_t allocate();
  void retain(std::int32_t b);
  /// One reference less; at zero the block is free (a hashed one stays findable until evicted).
  void release(std::int32_t b);
  int refs(std::int32_t b) const { return refs_.at(static_cast<std::size_t>(b)); }
  /// Whether the block is in the prefix cache (then it must never be written again).
  bool hashed(std::int32_t b) const { return hashed_.at(static_cast<std::size_t>(b)); }

  /// The cached block holding `tokens` (block_size of them) right after block `parent_block`
  /// (-1 for the first block), whose hash is `parent`, with one more reference; -1 if there is
  /// none. The parent is checked by block, not by hash alone: a block whose parent was evicted
  /// and replaced is never found through the replacement.
  std::int32_t find(BlockHash parent, std::int32_t parent_block, const std::int32_t* tokens);
  /// Puts full block `b`, holding `tokens` right after block `parent_block` (hash `parent`), in
  /// the prefix cache (a no-op if an equal block is cached already). Returns the block's hash.
  BlockHash publish(std::int32_t b, BlockHash parent, std::int32_t parent_block, const std::int32_t* tokens);

  /// Copies block `from`'s K and V rows in every layer into block `to` (copy-on-write).
  void copy(std::int32_t from, std::int32_t to);
  /// Layer `layer`'s storage, [blocks, block_size, K, H].
  const Tensor& k(std::int64_t layer) const { return k_.at(static_cast<std::size_t>(layer)); }
  /// Undefined for a layer whose values are its keys' first columns (v_dim 0).
  const Tensor& v(std::int64_t layer) const { return v_.at(static_cast<std::size_t>(layer)); }
  std::int64_t layers() const { return static_cast<std::int64_t>(k_.size()); }

  // Counters, for the chapter's figures and the tests.
  std::int64_t copies = 0, evictions = 0, hits = 0;

 private:
  struct Cached {
    BlockHash parent;
    std::int32_t parent_block;         // the block before it when it was published (-1: none)
    std::vector<std::int32_t> tokens;  // compared on a hit: equal hashes alone are not trusted
  };
  std::int64_t block_size_, block_bytes_;
  std::vector<Tensor> k_, v_;
  std::vector<int> refs_;
  std::vector<bool> hashed_;
  std::vector<BlockHash> hash_;
  std::vector<Cached> cached_of_;
  std::vector<std::int32_t> free_;  // never hashed (or evicted), ready
  std::list<std::int32_t> lru_;     // hashed, unreferenced: least recently released first
  std::unordered_map<std::int32_t, std::list<std::int32_t>::iterator> lru_at_;
  std::unordered_map<BlockHash, std::int32_t> by_hash_;
};

}  // namespace inferlab::ch12
