#include "chapters/12_paged_attention/paged_cache.h"

#include <sstream>

#include "chapters/12_paged_attention/hybrid_cache.h"
#include "chapters/12_paged_attention/paged_attention.h"
#include "common/ceiling.h"
#include "common/error.h"
#include "common/lab.h"

namespace inferlab::ch12 {

PagedKVCache::PagedKVCache(BlockPool& pool) : pool_(pool) {}

PagedKVCache::~PagedKVCache() { release(); }

void PagedKVCache::commit(std::int64_t T) {
  IL_CHECK(T >= 0 && length_ + T <= static_cast<std::int64_t>(table_.size()) * pool_.block_size(), "paged cache: ", T,
           " positions committed beyond its ", table_.size(), " blocks (reserve first)");
  length_ += T;
}

void PagedKVCache::truncate(std::int64_t n) {
  IL_CHECK(n >= 0 && n <= length_, "paged cache: truncate to ", n, " of ", length_, " positions");
  length_ = n;
  const std::size_t keep = static_cast<std::size_t>((n + pool_.block_size() - 1) / pool_.block_size());
  while (table_.size() > keep) pool_.release(table_.back()), table_.pop_back();
  if (hashes_.size() > static_cast<std::size_t>(n / pool_.block_size()))
    hashes_.resize(static_cast<std::size_t>(n / pool_.block_size()));
}

std::int64_t PagedKVCache::bytes() const { return static_cast<std::int64_t>(table_.size()) * pool_.block_bytes(); }

void PagedKVCache::release() {
  // Last block first: the prefix cache evicts the least recently released block, so a chain's
  // tail goes before its head, never leaving blocks whose parent is gone.
  for (auto it = table_.rbegin(); it != table_.rend(); ++it) pool_.release(*it);
  table_.clear(), hashes_.clear();
  length_ = 0;
}

bool must_copy_before_writing(const BlockPool& pool, const std::vector<std::int32_t>& table, std::int64_t length,
                              std::int64_t n) {
  const std::int64_t B = pool.block_size();
  const std::size_t next = static_cast<std::size_t>(length / B);  // the block the next position goes into
  bool cow = false;
  // EXERCISE 12.2 BEGIN: the copy-on-write rule
  // The block the next position goes into is written, so it must be this cache's alone and not
  // in the prefix cache. That is only ever a partly filled block: a full one is never written.
  cow = n > 0 && length % B != 0 && (pool.refs(table[next]) > 1 || pool.hashed(table[next]));
  // EXERCISE 12.2 STUB
  // lab::not_done("12.2", "set cow: whether the block the next position is written into must be copied first "
  //                       "(a partly filled last block that another holder shares or the prefix cache holds)");
  // (void)table, (void)length, (void)n, (void)next;
  // EXERCISE 12.2 END
  return cow;
}

bool PagedKVCache::reserve(std::int64_t n) {
  const bool cow = must_copy_before_writing(pool_, table_, length_, n);
  // EXERCISE 12.3 BEGIN: room for n more positions: new blocks, and a copy of a shared one
  const std::int64_t B = pool_.block_size(), have = static_cast<std::int64_t>(table_.size());
  const std::int64_t want = (length_ + n + B - 1) / B;  // blocks the table needs
  const std::int64_t needed = std::max<std::int64_t>(0, want - have) + (cow ? 1 : 0);
  if (needed > pool_.free()) return false;  // all or nothing: a refused reserve changes nothing
  if (cow) {                                // this cache's own copy of the block, and one reference less on the shared one
    const std::size_t next = static_cast<std::size_t>(length_ / B);
    const std::int32_t mine = pool_.allocate();
    pool_.copy(table_[next], mine);
    pool_.release(table_[next]);
    table_[next] = mine;
  }
  while (static_cast<std::int64_t>(table_.size()) < want) table_.push_back(pool_.allocate());
  // EXERCISE 12.3 STUB
  // lab::not_done("12.3", "make room for n more positions: count the blocks the table needs beyond those it "
  //                       "has, plus one if cow; return false, changing nothing, if the pool has fewer free; "
  //                       "if cow, allocate a block, copy the shared one into it, release the shared one and "
  //                       "put yours in its place in table_; then allocate blocks until the table is long enough");
  // (void)cow;
  // EXERCISE 12.3 END
  return true;
}

void PagedKVCache::check_writable(std::int64_t layer, std::int64_t T) const {
  const std::int64_t B = pool_.block_size();
  if (layer == 0)  // the blocks written must be this cache's alone: a missing reserve is an error, not a corruption
    for (std::int64_t b = length_ / B; b < (length_ + T + B - 1) / B && b < static_cast<std::int64_t>(table_.size()); ++b) {
      const std::int32_t blk = table_[static_cast<std::size_t>(b)];
      IL_CHECK(pool_.refs(blk) == 1 && !pool_.hashed(blk), "paged cache: block ", blk, " would be written but is ",
               pool_.hashed(blk) ? "in the prefix cache" : "shared", " (reserve before writing)");
    }
}

void PagedKVCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  check_writable(layer, k.size(0));
  const PagedKV kv{pool_.k(layer), pool_.v(layer), table_, pool_.block_size()};
  write_slots(kv, length_, k, v);
  paged_attention(q, kv, length_, out);
}

void PagedKVCache::store(std::int64_t layer, const Tensor& k, const Tensor& v) {
  check_writable(layer, k.size(0));
  const Tensor& kp = pool_.k(layer);
  IL_CHECK(k.ndim() == 3 && k.size(1) == kp.size(2) && k.size(2) == kp.size(3), "paged cache: new rows ", k.describe(),
           " do not fit layer ", layer, "'s blocks ", kp.describe());
  const std::int64_t B = pool_.block_size(), T = k.size(0);
  IL_CHECK(length_ + T <= static_cast<std::int64_t>(table_.size()) * B, "paged cache: positions up to ", length_ + T,
           " but the block table holds ", table_.size(), " blocks (reserve first)");
  const Tensor& vp = pool_.v(layer);
  for (std::int64_t t = 0; t < T;) {  // a run of positions in one block is one copy
    const std::int64_t p = length_ + t, run = std::min(T - t, B - p % B), row = slot(table_, B, p);
    const std::int64_t blk = row / B, off = row % B;
    kp.slice(0, blk, blk + 1).view({B, kp.size(2), kp.size(3)}).slice(0, off, off + run).copy_from(k.slice(0, t, t + run));
    if (vp.defined())
      vp.slice(0, blk, blk + 1).view({B, vp.size(2), vp.size(3)}).slice(0, off, off + run).copy_from(v.slice(0, t, t + run));
    t += run;
  }
}

void PagedKVCache::read(std::int64_t layer, const Tensor& q, Tensor& out) const {
  const PagedKV kv{pool_.k(layer), pool_.v(layer), table_, pool_.block_size()};
  paged_attention(q, kv, length_, out);
}

Tensor PagedKVCache::gather(std::int64_t layer, bool values, std::int64_t positions) const {
  const Tensor& p = values ? pool_.v(layer) : pool_.k(layer);
  IL_CHECK(p.defined(), "paged cache: layer ", layer, " keeps no values of its own");
  const std::int64_t B = pool_.block_size();
  IL_CHECK(positions >= 0 && positions <= static_cast<std::int64_t>(table_.size()) * B, "paged cache: ", positions,
           " positions, but the block table holds ", table_.size(), " blocks");
  Tensor rows = Tensor::empty({positions, p.size(2), p.size(3)}, DType::F32, p.device());
  for (std::int64_t b = 0; b * B < positions; ++b) {
    const std::int64_t n = std::min(B, positions - b * B), blk = table_[static_cast<std::size_t>(b)];
    rows.slice(0, b * B, b * B + n).copy_from(p.slice(0, blk, blk + 1).view({B, p.size(2), p.size(3)}).slice(0, 0, n));
  }
  return rows;
}

bool PagedKVCache::locate(std::int64_t T, CachedSeq& where) {
  const std::int64_t B = pool_.block_size();
  IL_CHECK(length_ + T <= static_cast<std::int64_t>(table_.size()) * B, "paged cache: positions up to ", length_ + T,
           " but the block table holds ", table_.size(), " blocks (reserve first)");
  check_writable(0, T);
  for (std::int64_t l = 0; l < pool_.layers(); ++l) {  // [blocks, B, K, H] as rows
    const Tensor &kp = pool_.k(l), &vp = pool_.v(l);
    where.k.push_back(kp.view({kp.size(0) * B, kp.size(2), kp.size(3)}));
    where.v.push_back(vp.view({vp.size(0) * B, vp.size(2), vp.size(3)}));
  }
  where.table = &table_, where.block_size = B, where.length = length_ + T;
  return true;
}

std::unique_ptr<PagedKVCache> PagedKVCache::fork() const {
  auto c = std::make_unique<PagedKVCache>(pool_);
  // The blocks holding positions, not those reserved ahead of them (those are this cache's own).
  const std::size_t held = static_cast<std::size_t>((length_ + pool_.block_size() - 1) / pool_.block_size());
  c->table_.assign(table_.begin(), table_.begin() + static_cast<long>(held));
  for (std::int32_t b : c->table_) pool_.retain(b);
  c->hashes_ = hashes_, c->length_ = length_;
  return c;
}

std::int64_t PagedKVCache::adopt_prefix(const std::vector<std::int32_t>& tokens, std::int64_t max_positions) {
  IL_CHECK(length_ == 0 && table_.empty(), "paged cache: a prefix can only be adopted by an empty cache");
  const std::int64_t B = pool_.block_size();
  BlockHash parent = 0;
  for (std::int64_t i = 0; (i + 1) * B <= std::min<std::int64_t>(max_positions, static_cast<std::int64_t>(tokens.size()));
       ++i) {
    const std::int32_t* block_tokens = tokens.data() + i * B;
    const std::int32_t b = pool_.find(parent, table_.empty() ? -1 : table_.back(), block_tokens);
    if (b < 0) break;
    table_.push_back(b);
    parent = block_hash(parent, block_tokens, B);
    hashes_.push_back(parent);
  }
  length_ = static_cast<std::int64_t>(table_.size()) * B;
  return length_;
}

void PagedKVCache::publish(const std::vector<std::int32_t>& tokens) {
  const std::int64_t B = pool_.block_size(), full = length_ / B;
  IL_CHECK(static_cast<std::int64_t>(tokens.size()) >= length_, "paged cache: ", tokens.size(), " tokens for ", length_,
           " positions");
  for (std::int64_t i = static_cast<std::int64_t>(hashes_.size()); i < full; ++i) {
    const BlockHash parent = i == 0 ? 0 : hashes_[static_cast<std::size_t>(i - 1)];
    const std::int32_t parent_block = i == 0 ? -1 : table_[static_cast<std::size_t>(i - 1)];
    hashes_.push_back(pool_.publish(table_[static_cast<std::size_t>(i)], parent, parent_block, tokens.data() + i * B));
  }
}

// ---------------------------------------------------------------------------------------------
PagedPool::PagedPool(const TransformerConfig& c, std::int64_t budget_bytes, std::int64_t block_size, Device device,
                     bool prefix_caching)
    : prefix_caching_(prefix_caching) {
  IL_CHECK(block_size >= 1, "paged KV pool: a block holds at least one position, got ", block_size);
  IL_CHECK(budget_bytes >= c.kv_cache_bytes(block_size, 4), "paged KV pool: a budget of ", budget_bytes,
           " bytes holds no block of ", c.kv_cache_bytes(block_size, 4), " bytes");
  blocks_ = std::make_unique<BlockPool>(c, budget_bytes / c.kv_cache_bytes(block_size, 4), block_size, device);
}

PagedPool::PagedPool(const models::Model& m, std::int64_t budget_bytes, std::int64_t block_size, bool prefix_caching,
                     std::int64_t slots)
    : layout_(std::make_unique<PagedLayout>(PagedLayout::of(m))), model_(&m), prefix_caching_(prefix_caching) {
  const PagedLayout& L = *layout_;
  IL_CHECK(block_size >= 1, "paged KV pool: a block holds at least one position, got ", block_size);
  IL_CHECK(!(prefix_caching && L.fixed), "paged KV pool: prefix caching shares blocks of cached positions, and ",
           m.architecture(), " keeps ", L.describe(),
           ": a ring has overwritten its early positions and a state keeps none, so no prefix can be shared "
           "(turn prefix caching off for this model)");
  if (L.fixed) {
    slots_ = L.blocks.empty() ? budget_bytes / L.slot_bytes : slots;
    IL_CHECK(slots_ >= 1 && slots_ <= budget_bytes / L.slot_bytes, "paged KV pool: a budget of ",
             metrics::human_bytes(static_cast<double>(budget_bytes)), " holds ", budget_bytes / L.slot_bytes, " slots of ",
             metrics::human_bytes(static_cast<double>(L.slot_bytes)), " (", L.describe(), "), not ", slots_,
             " (one for each sequence that runs at once)");
  }
  if (!L.blocks.empty()) {
    const std::int64_t block = L.block_bytes(block_size), left = budget_bytes - slots_ * L.slot_bytes;
    IL_CHECK(left >= block, "paged KV pool: a budget of ", metrics::human_bytes(static_cast<double>(budget_bytes)),
             L.fixed ? " less its slots" : "", " holds no block of ", block, " bytes (", L.describe(), ")");
    blocks_ = std::make_unique<BlockPool>(L.blocks, left / block, block_size, m.device());
  }
}

PagedPool::~PagedPool() = default;

BlockPool& PagedPool::blocks() {
  IL_CHECK(blocks_ != nullptr, "paged KV pool: this model's layers keep no blocks, only slots");
  return *blocks_;
}

const BlockPool& PagedPool::blocks() const { return const_cast<PagedPool*>(this)->blocks(); }

std::int64_t PagedPool::slot_bytes() const { return layout_ ? layout_->slot_bytes : 0; }

std::int64_t PagedPool::used_bytes() const { return blocks_used() * block_bytes() + slots_used_ * slot_bytes(); }

std::int64_t PagedPool::budget_bytes() const { return blocks_total() * block_bytes() + slots_ * slot_bytes(); }

const PagedKVCache* PagedPool::blocks_of(const models::Cache* c) {
  if (auto* p = dynamic_cast<const PagedKVCache*>(c)) return p;
  if (auto* h = dynamic_cast<const HybridCache*>(c)) return &h->paged();
  return nullptr;
}

namespace {

PagedKVCache* table_of(models::Cache* c) { return const_cast<PagedKVCache*>(PagedPool::blocks_of(c)); }

}  // namespace

std::unique_ptr<models::Cache> PagedPool::open() {
  if (!layout_ || layout_->plain) return std::make_unique<PagedKVCache>(*blocks_);
  if (layout_->fixed && slots_used_ == slots_) return nullptr;  // every slot taken: wait for one
  std::unique_ptr<models::Cache> slot = layout_->fixed ? model_->make_fixed_cache() : nullptr;
  IL_CHECK(!layout_->fixed || slot, "paged KV pool: ", model_->architecture(), " made no slot for its fixed layers");
  if (layout_->fixed) ++slots_used_;
  if (!blocks_) return slot;  // a model of fixed layers only: the slot is the cache (Mamba's state)
  return std::make_unique<HybridCache>(*layout_, *blocks_, std::move(slot));
}

bool PagedPool::reserve(ch11::Sequence& s, std::int64_t n) {
  const bool opening = !s.cache;
  std::int64_t adopted = 0;
  if (opening) {
    std::unique_ptr<models::Cache> c = open();
    if (!c) return false;
    // Never the whole sequence: its last token must go through the model to give logits.
    if (prefix_caching_) adopted = table_of(c.get())->adopt_prefix(s.tokens, static_cast<std::int64_t>(s.tokens.size()) - 1);
    s.cache = std::move(c);
    n = std::min(n, s.pending());
  }
  PagedKVCache* c = table_of(s.cache.get());
  if (!c) return true;                        // a slot alone: its bytes do not grow
  if (prefix_caching_) c->publish(s.tokens);  // the blocks earlier steps filled
  if (c->reserve(n)) return true;
  if (opening) {  // back to how it was: its adopted blocks stay cached, and were not reused after all
    s.cache.reset();
    if (layout_ && layout_->fixed) --slots_used_;
    blocks_->hits -= adopted / blocks_->block_size();
  }
  return false;
}

void PagedPool::free(ch11::Sequence& s) {
  if (!s.cache) return;
  if (prefix_caching_) table_of(s.cache.get())->publish(s.tokens);
  if (layout_ && layout_->fixed) --slots_used_;
  s.cache.reset();
}

std::unique_ptr<models::Cache> PagedPool::fork(const ch11::Sequence& s) {
  if (!s.cache) return nullptr;
  if (auto* p = dynamic_cast<const PagedKVCache*>(s.cache.get())) return p->fork();
  const bool slot = layout_ && layout_->fixed;
  if (slot && slots_used_ == slots_) return nullptr;  // no slot for a copy: the fork computes its prompt when one is free
  std::unique_ptr<models::Cache> c;
  if (auto* h = dynamic_cast<const HybridCache*>(s.cache.get())) c = h->fork();
  else c = s.cache->clone();
  if (c && slot) ++slots_used_;
  return c;
}

std::int64_t PagedPool::bytes_for(std::int64_t tokens) const {
  const std::int64_t blocks = blocks_ ? (tokens + blocks_->block_size() - 1) / blocks_->block_size() * block_bytes() : 0;
  return blocks + slot_bytes();
}

std::vector<std::int64_t> PagedPool::used_by_kind() const {
  std::vector<std::int64_t> by(5, 0);
  if (!layout_) {
    by[static_cast<std::size_t>(models::LayerKind::Attention)] = used_bytes();
    return by;
  }
  const PagedLayout& L = *layout_;
  const std::int64_t B = blocks_ ? blocks_->block_size() : 0;
  for (std::size_t l = 0; l < L.layers.size(); ++l) {
    const models::LayerSpec& s = L.layers[l];
    std::int64_t& b = by[static_cast<std::size_t>(s.kind)];
    if (L.pool_layer[l] >= 0) b += blocks_used() * B * L.blocks[static_cast<std::size_t>(L.pool_layer[l])].values() * 4;
    else if (s.kind == models::LayerKind::Window || s.kind == models::LayerKind::Recurrent) b += slots_used_ * s.bytes(0);
  }
  return by;
}

std::string PagedPool::describe() const {
  std::ostringstream os;
  os << "paged: ";
  if (blocks_) os << blocks_->total() << " blocks of " << blocks_->block_size() << " positions";
  if (blocks_ && slots_) os << " and ";
  if (slots_) os << slots_ << " slots of " << metrics::human_bytes(static_cast<double>(slot_bytes()));
  os << " (" << metrics::human_bytes(static_cast<double>(budget_bytes())) << ")"
     << (prefix_caching_ ? ", prefix caching" : "");
  if (layout_ && !layout_->plain) os << "; " << layout_->describe();
  return os.str();
}

}  // namespace inferlab::ch12
