#pragma once
/// @file kv_cache.h
/// @brief Chapter 02: the KV cache. Prefill fills it, decode reads it.
///
/// Chapter 01's forward pass recomputes every earlier position's keys and values at every step,
/// although under the causal mask they never change. Keep them instead: for every layer, K and
/// V of every position so far. Then a step only has to run its new tokens through the network:
/// the whole prompt at once (prefill), then one token at a time (decode).
///
/// The forward pass here is the one every later chapter runs: it takes a batch of sequences,
/// each with its own new tokens and its own cache, so that continuous batching (chapter 11)
/// and speculative decoding (chapter 10) are a way of calling it, and a ring buffer (06), a
/// shared (05) or a paged (12) cache is another implementation of KVCache.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cached_batch.h"
#include "common/models/generate.h"
#include "common/models/llama.h"

namespace inferlab::models {

/// What every per-sequence cache does, whatever it stores (keys and values here, chapter 04's
/// latent rows, chapter 07's fixed-size state): count its positions, take a forward pass's new
/// positions in, roll back, tell its size, give its memory back.
class Cache {
 public:
  virtual ~Cache() = default;
  /// Positions cached so far: the position of the next new token.
  virtual std::int64_t length() const = 0;
  /// Ends a forward pass: its `T` new positions, stored by every layer, are now cached.
  virtual void commit(std::int64_t T) = 0;
  /// Forgets every position from `n` on (speculative sampling's rollback); n <= length().
  virtual void truncate(std::int64_t n) = 0;
  /// Bytes of memory it holds now.
  virtual std::int64_t bytes() const = 0;
  /// Gives its memory back; afterwards it holds nothing and can store nothing.
  virtual void release() = 0;
  /// A copy holding the same positions, for a parallel sample forked from this one (chapter 12's
  /// pool copies a fixed slot this way: a ring or a recurrent state cannot share blocks); null
  /// where this cache cannot be copied (the fork then computes its prompt again).
  virtual std::unique_ptr<Cache> clone() const { return nullptr; }
};

/// A cache of keys and values that also runs the attention reading them: the cache stores and
/// attends. Where K and V live (rows, a ring, blocks of a shared pool) and which attention op
/// reads them are the cache's business; the model code only calls attend().
class KVCache : public Cache {
 public:
  /// Stores layer `layer`'s keys and values of the new tokens (k, v [T, K, H], positions
  /// length() .. length() + T - 1) and writes their queries' causal attention over every cached
  /// position of that layer, these included, to out [T, N, H] (q [T, N, H]).
  virtual void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) = 0;
  /// The batched path's part of a step's context (Batch::cached): says where this cache keeps each
  /// layer's keys and values (where.k, v, table, block_size) and how many positions it will hold
  /// once the step's `T` new ones are in (where.length), so that every layer stores the batch's
  /// new rows with one ops::store_cached call and attends every sequence with one
  /// ops::attention_cached call (Batch::attend). Called once a step, before any layer; refuses,
  /// naming the cache, a step it has no room for. False when those ops cannot read this cache (a
  /// ring of recent rows, a latent cache, 16-bit rows): the batch then calls attend().
  virtual bool locate(std::int64_t T, CachedSeq& where) { return false; }
};

/// The bookkeeping of a cache whose positions are rows: position p in row p of per-layer
/// storage of `capacity` rows (chapter 02's K and V, chapter 04's latent rows). It counts the
/// positions and refuses, naming the cache, a step that would not fit.
class RowCache : public KVCache {
 public:
  std::int64_t length() const override { return length_; }
  std::int64_t capacity() const { return capacity_; }
  void commit(std::int64_t T) override;
  void truncate(std::int64_t n) override;

 protected:
  /// `name` starts every error ("KV cache", "latent cache").
  RowCache(const char* name, std::int64_t capacity);
  /// The first row after a step's T new positions, length() + T; an error if past capacity.
  std::int64_t end_of_step(std::int64_t T) const;
  const char* name_;
  std::int64_t capacity_ = 0, length_ = 0;
};

/// Chapter 02's cache: for every layer, K and V of up to `capacity` positions, each a
/// contiguous tensor [capacity, K, H]; position p lives in row p.
class ContiguousKVCache : public RowCache {
 public:
  ContiguousKVCache(const TransformerConfig& c, std::int64_t capacity, Device device = Device::CPU,
                    DType dtype = DType::F32);
  std::int64_t layers() const { return static_cast<std::int64_t>(k_.size()); }
  void attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) override;
  bool locate(std::int64_t T, CachedSeq& where) override;
  /// capacity × K × H × L × 2 × bytes per element (TransformerConfig::kv_cache_bytes).
  std::int64_t bytes() const override;
  void release() override;
  /// "5 layers × {K, V} × [512, 4, 8] f32 = 655,360 bytes"
  std::string layout() const;
  /// Layer `layer`'s storage [capacity, K, H]: a handle to the cache's bytes (for the CUDA
  /// decoder, which writes it with its own kernels, and for tests).
  Tensor k(std::int64_t layer) const;
  Tensor v(std::int64_t layer) const;

 private:
  TransformerConfig config_;
  DType dtype_;
  std::vector<Tensor> k_, v_;  // one per layer
};

/// One sequence's part of a batched forward pass: its new tokens (a whole prompt, a prefill
/// chunk or one decode token) and the cache holding everything before them: a KVCache for an
/// attention model, any Cache for a model whose layers keep something else (chapter 07's state).
struct SequenceStep {
  std::vector<std::int32_t> tokens;
  Cache* cache = nullptr;
  bool all_logits = false;  ///< logits for every new token (verification, perplexity), else the last one's
};

/// How a batch attends: each sequence through its cache's attend() (the simple path), or every
/// sequence together over the caches where they are: per layer one ops::store_cached call that
/// writes every new key and value into its slot, and one ops::attention_cached call (threads over
/// the rows and heads of the whole batch on the CPU; on the GPU a launch each, whatever the
/// batch). The two give the same bits on contiguous CPU caches, and agree within the rounding of
/// split-K on the GPU; a cache the ops cannot read attends on its own either way.
enum class AttendPath { PerSequence, Batched };

/// A batch as the model sees it: every sequence's new tokens one after the other, as rows.
struct Batch {
  std::vector<std::int32_t> tokens;  ///< all new tokens, sequence after sequence
  Tensor pos;                        ///< I32: each row's position in its own sequence
  std::vector<std::int64_t> begin;   ///< sequence b owns rows begin[b] .. begin[b+1] - 1
  std::vector<Cache*> caches;
  std::vector<std::int64_t> logit_rows;  ///< the rows whose logits the forward pass returns
  AttendPath path = AttendPath::Batched;
  /// The batched path's context (AttendPath::Batched): every sequence whose cache the batched ops
  /// can read (KVCache::locate), with where it keeps each layer's keys and values and where this
  /// step's go. Built here once, uploaded once on the GPU, read by every layer; none when no cache
  /// can be read that way.
  std::optional<CachedBatch> cached;
  std::vector<bool> in_cached;  ///< whether sequence b is in `cached` (else it attends on its own)

  /// The batch of an attention model: positions checked against its context.
  Batch(const Llama& m, const std::vector<SequenceStep>& seqs, AttendPath path = AttendPath::Batched);
  /// Any model's batch on `device`: positions checked against `context` where the model has one
  /// (a state-space model has none).
  Batch(std::optional<std::int64_t> context, Device device, const std::vector<SequenceStep>& seqs,
        AttendPath path = AttendPath::Batched);
  /// Attention of every sequence's rows against its own cache (which stores k and v first; both
  /// undefined for a layer that projects none and reads what another layer stored, chapter 05).
  Tensor attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v) const;
  /// Sequence b's cache as the kind a layer needs (a KVCache for attention, chapter 07's state for
  /// its mixer); a cache of another kind is refused by name.
  template <class C>
  C& cache(std::size_t b, const char* kind) const {
    auto* c = dynamic_cast<C*>(caches.at(b));
    IL_CHECK(c != nullptr, "forward: the cache of sequence ", b, " is not ", kind);
    return *c;
  }
  /// The rows of x named by logit_rows.
  Tensor logits_input(const Tensor& x) const;
};

/// Chapter 01's attention block with a cache: each sequence's keys and values are kept, and its
/// queries attend over everything its cache holds.
Tensor attention_block(const Llama& m, const LlamaLayer& l, const Tensor& h, const Batch& batch, std::int64_t layer);

/// The attention block a forward pass runs in every layer, with attention_block's arguments:
/// chapter 02's own, or a later chapter's (05's cross-layer block, 04's latent one), which thus
/// replaces this one piece and reuses the rest of the pass.
using AttentionBlock =
    std::function<Tensor(const Llama& m, const LlamaLayer& l, const Tensor& h, const Batch& batch, std::int64_t layer)>;

/// Chapter 01's forward pass with a cache, over a batch: every sequence's new tokens continue
/// the sequence its cache holds; their keys and values are appended, and attention reads every
/// cached position. The projections and the MLP run once over the rows of all sequences (one
/// weight read for the whole batch); attention reads each sequence's own cache (`path`). Returns the logits of each
/// sequence's last new token (of all of them where all_logits is set), sequence after sequence.
Tensor forward(const Llama& m, std::vector<SequenceStep>& seqs, const AttentionBlock& attention = attention_block,
               AttendPath path = AttendPath::Batched);

/// One sequence: prefill is a call with the whole prompt, each decode step a call with one token.
Tensor forward_cached(const Llama& m, KVCache& cache, const std::vector<std::int32_t>& tokens, bool all_positions = false);

/// Prefill the prompt, then decode one token per step until max_new or an EOS id: chapter 01's
/// generate loop, feeding only the new tokens.
Generation generate_cached(const Llama& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                           const std::vector<std::int64_t>& eos_ids, const OnToken& on_token = nullptr);

/// The generate loop of every model that keeps a cache per sequence, which each chapter's
/// generate_cached calls with what differs: checks that the prompt plus max_new tokens fit
/// `context` positions (none: a model without a limit, chapter 07's), makes the cache for that
/// many positions (`make_cache(capacity)`, a cache returned by value), then runs chapter 01's loop
/// feeding only the new tokens through `forward(cache, feed)`: the prompt once (prefill), then
/// one token per step.
template <class MakeCache, class Forward>
Generation generate_with_cache(std::optional<std::int64_t> context, Device device, const std::vector<std::int32_t>& prompt,
                               int max_new, Sampler& sampler, const std::vector<std::int64_t>& eos_ids,
                               const OnToken& on_token, const MakeCache& make_cache, const Forward& forward) {
  if (context) check_context(*context, prompt.size(), max_new);
  auto cache = make_cache(static_cast<std::int64_t>(prompt.size()) + max_new);
  return generate(
      prompt, max_new, sampler, eos_ids, device, Feed::NewTokens,
      [&](const std::vector<std::int32_t>& feed) { return forward(cache, feed); }, on_token);
}

}  // namespace inferlab::models
