#include "chapters/12_paged_attention/block_pool.h"

#include <algorithm>

#include "common/error.h"

namespace inferlab::ch12 {

BlockHash block_hash(BlockHash parent, const std::int32_t* tokens, std::int64_t n) {
  // FNV-1a over the parent's hash and the tokens' bytes.
  BlockHash h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t x) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((x >> (8 * i)) & 0xff)) * 1099511628211ull;
  };
  mix(parent);
  for (std::int64_t i = 0; i < n; ++i) mix(static_cast<std::uint32_t>(tokens[i]));
  return h;
}

namespace {

std::vector<PagedLayer> layers_of(const TransformerConfig& c) {
  return std::vector<PagedLayer>(static_cast<std::size_t>(c.num_layers), PagedLayer{c.num_kv_heads, c.head_dim, c.head_dim});
}

}  // namespace

std::int64_t BlockPool::bytes_of_block(const std::vector<PagedLayer>& layers, std::int64_t block_size) {
  std::int64_t values = 0;
  for (const PagedLayer& l : layers) values = checked_add(values, l.values(), "block values");
  return checked_mul(checked_mul(values, block_size, "block values"), 4, "block bytes");
}

BlockPool::BlockPool(const TransformerConfig& c, std::int64_t blocks, std::int64_t block_size, Device device)
    : BlockPool(layers_of(c), blocks, block_size, device) {}

BlockPool::BlockPool(const std::vector<PagedLayer>& layers, std::int64_t blocks, std::int64_t block_size, Device device)
    : block_size_(block_size) {
  IL_CHECK(blocks >= 1, "block pool: at least one block, got ", blocks);
  IL_CHECK(block_size >= 1, "block pool: a block holds at least one position, got ", block_size);
  IL_CHECK(!layers.empty(), "block pool: no layer keeps rows in blocks");
  for (const PagedLayer& l : layers) {
    IL_CHECK(l.heads >= 1 && l.k_dim >= 1 && l.v_dim >= 0, "block pool: a layer of ", l.heads, " heads of ", l.k_dim,
             " and ", l.v_dim, " values");
    k_.push_back(Tensor::zeros({blocks, block_size, l.heads, l.k_dim}, DType::F32, device));
    v_.push_back(l.v_dim > 0 ? Tensor::zeros({blocks, block_size, l.heads, l.v_dim}, DType::F32, device) : Tensor());
  }
  block_bytes_ = bytes_of_block(layers, block_size);
  refs_.assign(static_cast<std::size_t>(blocks), 0);
  hashed_.assign(static_cast<std::size_t>(blocks), false);
  hash_.assign(static_cast<std::size_t>(blocks), 0);
  cached_of_.resize(static_cast<std::size_t>(blocks));
  for (std::int64_t b = blocks - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));  // block 0 first
}

std::int32_t BlockPool::allocate() {
  std::int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {  // evict the least recently used cached block
    b = lru_.front();
    lru_.pop_front();
    lru_at_.erase(b);
    by_hash_.erase(hash_[static_cast<std::size_t>(b)]);
    hashed_[static_cast<std::size_t>(b)] = false;
    ++evictions;
  } else {
    return -1;
  }
  refs_[static_cast<std::size_t>(b)] = 1;
  return b;
}

void BlockPool::retain(std::int32_t b) {
  IL_CHECK(b >= 0 && b < total() && refs(b) > 0, "block pool: retain of block ", b, ", which nobody holds");
  ++refs_[static_cast<std::size_t>(b)];
}

void BlockPool::release(std::int32_t b) {
  IL_CHECK(b >= 0 && b < total() && refs(b) > 0, "block pool: release of block ", b, ", which nobody holds");
  if (--refs_[static_cast<std::size_t>(b)] > 0) return;
  if (hashed(b)) {
    lru_at_[b] = lru_.insert(lru_.end(), b);
  } else {
    free_.push_back(b);
  }
}

std::int32_t BlockPool::find(BlockHash parent, std::int32_t parent_block, const std::int32_t* tokens) {
  const auto it = by_hash_.find(block_hash(parent, tokens, block_size_));
  if (it == by_hash_.end()) return -1;
  const std::int32_t b = it->second;
  const Cached& c = cached_of_[static_cast<std::size_t>(b)];
  if (c.parent != parent || c.parent_block != parent_block || !std::equal(c.tokens.begin(), c.tokens.end(), tokens))
    return -1;         // a collision, or a parent that is no longer the one it followed
  if (refs(b) == 0) {  // back from the LRU list
    lru_.erase(lru_at_.at(b));
    lru_at_.erase(b);
  }
  ++refs_[static_cast<std::size_t>(b)];
  ++hits;
  return b;
}

BlockHash BlockPool::publish(std::int32_t b, BlockHash parent, std::int32_t parent_block, const std::int32_t* tokens) {
  const BlockHash h = block_hash(parent, tokens, block_size_);
  if (hashed(b) || by_hash_.count(h)) return h;
  by_hash_[h] = b;
  hash_[static_cast<std::size_t>(b)] = h;
  hashed_[static_cast<std::size_t>(b)] = true;
  cached_of_[static_cast<std::size_t>(b)] = {parent, parent_block, std::vector<std::int32_t>(tokens, tokens + block_size_)};
  return h;
}

void BlockPool::copy(std::int32_t from, std::int32_t to) {
  for (std::size_t l = 0; l < k_.size(); ++l) {
    k_[l].slice(0, to, to + 1).copy_from(k_[l].slice(0, from, from + 1));
    if (v_[l].defined()) v_[l].slice(0, to, to + 1).copy_from(v_[l].slice(0, from, from + 1));
  }
  ++copies;
}

}  // namespace inferlab::ch12
