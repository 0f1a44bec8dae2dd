#include "chapters/12_paged_attention/hybrid_cache.h"

#include <sstream>

#include "common/ceiling.h"
#include "common/error.h"

namespace inferlab::ch12 {

using models::LayerKind;

namespace {

// The attention of a layer with its own parameters: chapter 12's kernel has the default scale and
// no soft-capping.
bool plain_attention(const models::LayerSpec& s) {
  return s.attention.scale == 0.0f && s.attention.softcap == 0.0f && s.attention.window == 0;
}

}  // namespace

PagedLayout PagedLayout::of(const models::Model& m) {
  PagedLayout L;
  L.layers = m.layers();
  for (const models::LayerSpec& s : L.layers) {
    std::int64_t at = -1;
    if (s.kind == LayerKind::Attention) {
      IL_CHECK(s.rows.size() == 2 && s.rows[0].size() == 2 && s.rows[1] == s.rows[0],
               "paged pool: an attention layer keeps K and V rows of one shape");
      at = static_cast<std::int64_t>(L.blocks.size());
      L.blocks.push_back({s.rows[0][0], s.rows[0][1], s.rows[1][1]});
      L.plain = L.plain && plain_attention(s);
    } else if (s.kind == LayerKind::Latent) {
      IL_CHECK(s.rows.size() == 1 && s.rows[0].size() == 2, "paged pool: a latent layer keeps one row a position");
      at = static_cast<std::int64_t>(L.blocks.size());
      L.blocks.push_back({s.rows[0][0], s.rows[0][1], 0});  // the value is the row's first columns
      L.plain = false;
    } else {
      L.plain = false;
      if (s.kind == LayerKind::Window || s.kind == LayerKind::Recurrent) {
        L.fixed = true;
        L.slot_bytes = checked_add(L.slot_bytes, s.bytes(0), "slot bytes");
      }
    }
    L.pool_layer.push_back(at);
  }
  return L;
}

std::int64_t PagedLayout::block_bytes(std::int64_t block_size) const {
  return blocks.empty() ? 0 : BlockPool::bytes_of_block(blocks, block_size);
}

std::string PagedLayout::describe() const {
  std::int64_t by_kind[5] = {};
  for (const models::LayerSpec& s : layers) ++by_kind[static_cast<int>(s.kind)];
  std::ostringstream os;
  const auto n = [&](LayerKind k) { return by_kind[static_cast<int>(k)]; };
  const auto layers = [](std::int64_t k) { return std::to_string(k) + (k == 1 ? " layer" : " layers"); };
  std::string kinds;
  if (n(LayerKind::Attention)) kinds += std::to_string(n(LayerKind::Attention)) + " attention";
  if (n(LayerKind::Latent)) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n(LayerKind::Latent)) + " latent";
  os << layers(static_cast<std::int64_t>(blocks.size())) << " in blocks";
  if (!blocks.empty()) os << " (" << kinds << ")";
  if (n(LayerKind::Shared)) os << ", " << layers(n(LayerKind::Shared)) << " reading another's";
  if (fixed)
    os << ", " << layers(n(LayerKind::Window) + n(LayerKind::Recurrent)) << " in a slot of "
       << metrics::human_bytes(static_cast<double>(slot_bytes)) << " (" << (n(LayerKind::Window) ? "rings" : "")
       << (n(LayerKind::Window) && n(LayerKind::Recurrent) ? ", " : "") << (n(LayerKind::Recurrent) ? "state" : "") << ")";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
HybridCache::HybridCache(const PagedLayout& layout, BlockPool& pool, std::unique_ptr<models::Cache> fixed)
    : HybridCache(layout, std::make_unique<PagedKVCache>(pool), std::move(fixed)) {}

HybridCache::HybridCache(const PagedLayout& layout, std::unique_ptr<PagedKVCache> paged,
                         std::unique_ptr<models::Cache> fixed)
    : layout_(layout), paged_(std::move(paged)), fixed_(std::move(fixed)) {
  IL_CHECK(layout_.fixed == (fixed_ != nullptr), "hybrid cache: the layout ", layout_.fixed ? "has" : "has no",
           " fixed layers, and the cache was given ", fixed_ ? "a slot" : "none");
}

void HybridCache::commit(std::int64_t T) {
  paged_->commit(T);
  if (fixed_) fixed_->commit(T);
}

void HybridCache::truncate(std::int64_t n) {
  if (fixed_) fixed_->truncate(n);  // first: a ring or a state refuses what it cannot roll back
  paged_->truncate(n);
}

std::int64_t HybridCache::bytes() const { return paged_->bytes() + (fixed_ ? fixed_->bytes() : 0); }

void HybridCache::release() {
  paged_->release();
  if (fixed_) fixed_->release();
}

void HybridCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  IL_CHECK(layer >= 0 && layer < static_cast<std::int64_t>(layout_.layers.size()), "hybrid cache: no layer ", layer);
  const models::LayerSpec& s = layout_.layers[static_cast<std::size_t>(layer)];
  switch (s.kind) {
    case LayerKind::Window: {
      auto* ring = dynamic_cast<models::KVCache*>(fixed_.get());
      IL_CHECK(ring != nullptr, "hybrid cache: window layer ", layer, " has no ring in the slot");
      return ring->attend(layer, q, k, v, out);
    }
    case LayerKind::Recurrent:
      IL_CHECK(false, "hybrid cache: layer ", layer, " is recurrent: it keeps a state, not keys");
      return;
    case LayerKind::Shared: {
      const std::int64_t at = layout_.pool_layer.at(static_cast<std::size_t>(s.source));
      IL_CHECK(!k.defined(), "hybrid cache: layer ", layer, " reads layer ", s.source, "'s rows and stores none");
      if (plain_attention(s)) return paged_->read(at, q, out);
      const std::int64_t S = paged_->length() + q.size(0);
      AttentionParams p = s.attention;
      p.q_offset = paged_->length();
      return ops::attention(q, paged_->gather(at, false, S), paged_->gather(at, true, S), out, p);
    }
    case LayerKind::Attention:
    case LayerKind::Latent: break;
  }
  const std::int64_t at = layout_.pool_layer[static_cast<std::size_t>(layer)];
  if (s.kind == LayerKind::Attention && plain_attention(s)) return paged_->attend(at, q, k, v, out);
  // A layer with its own scale or soft-capping (Gemma), or a latent one whose value is its key's
  // first r columns (MLA): its rows out of the blocks, then the attention op.
  paged_->store(at, k, s.kind == LayerKind::Latent ? Tensor() : v);
  const std::int64_t S = paged_->length() + q.size(0);
  const Tensor keys = paged_->gather(at, false, S);
  const Tensor values = s.kind == LayerKind::Latent ? keys.slice(2, 0, v.size(2)).contiguous() : paged_->gather(at, true, S);
  AttentionParams p = s.attention;
  p.q_offset = paged_->length();
  ops::attention(q, keys, values, out, p);
}

std::unique_ptr<HybridCache> HybridCache::fork() const {
  std::unique_ptr<models::Cache> slot;
  if (fixed_) {
    slot = fixed_->clone();
    IL_CHECK(slot != nullptr, "hybrid cache: the slot cannot be copied for a fork");
  }
  // The blocks, shared as chapter 12's fork shares them.
  return std::unique_ptr<HybridCache>(new HybridCache(layout_, paged_->fork(), std::move(slot)));
}

}  // namespace inferlab::ch12
