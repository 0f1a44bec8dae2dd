#include "common/models/kv_cache.h"

#include <sstream>
#include <typeinfo>

#include "common/lab.h"

namespace inferlab::models {

// ---------------------------------------------------------------------------------------------
// Chapter 01's forward pass and attention block; the lines marked "cache" are what changed
// (chapter 02's README shows the diff).
// The forward pass: embed, then per layer attention and MLP with residuals, then the head.
Tensor forward(const Llama& m, std::vector<SequenceStep>& seqs, const AttentionBlock& attention, AttendPath path) {
  const Batch batch(m, seqs, path);   // cache: each sequence's new tokens, at positions after its cached ones
  Tensor x = embed(m, batch.tokens);  // [T, D], the residual stream
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const LlamaLayer& l = m.layers[i];
    ops::add(x, post_norm(m, attention(m, l, norm(m, x, l.attn_norm), batch, i), l.post_attn_norm), x);  // cache
    ops::add(x, post_norm(m, mlp_block(l, norm(m, x, l.mlp_norm)), l.post_mlp_norm), x);
  }
  for (SequenceStep& s : seqs) s.cache->commit(static_cast<std::int64_t>(s.tokens.size()));  // cache
  return head(m, batch.logits_input(x));  // cache: each sequence's last row (or all of them)
}

// Attention: q, k, v projections, RoPE on q and k, causal attention, output projection.
Tensor attention_block(const Llama& m, const LlamaLayer& l, const Tensor& h, const Batch& batch, std::int64_t layer) {
  const auto& c = m.config;
  const Tensor& pos = batch.pos;  // cache
  const std::int64_t T = h.size(0), N = c.num_heads, K = c.num_kv_heads, H = c.head_dim;
  const std::vector<Tensor> qkv = linears(h, {&l.wq, &l.wk, &l.wv});  // one pass over h for the three
  Tensor q = qkv[0].view({T, N, H}), k = qkv[1].view({T, K, H}), v = qkv[2].view({T, K, H});
  // Qwen3's and Gemma 3's per-head norms, before RoPE (nothing for the others):
  head_norm(m, q, l.q_norm);
  ops::rope(q, pos, rope_freqs(m, l), m.rope_pairing);
  head_norm(m, k, l.k_norm);
  ops::rope(k, pos, rope_freqs(m, l), m.rope_pairing);
  Tensor a = batch.attend(layer, q, k, v);  // cache: keep k and v, attend over every cached position
  return linear(a.view({T, N * H}), l.wo);
}

// ---------------------------------------------------------------------------------------------
// A cache of rows: position p in row p.
RowCache::RowCache(const char* name, std::int64_t capacity) : name_(name), capacity_(capacity) {
  IL_CHECK(capacity > 0, name_, ": capacity must be positive, got ", capacity);
}

std::int64_t RowCache::end_of_step(std::int64_t T) const {
  IL_CHECK(T >= 0 && length_ + T <= capacity_, name_, " full: ", length_, " positions cached + ", T,
           " new exceeds its capacity of ", capacity_);
  return length_ + T;
}

void RowCache::commit(std::int64_t T) { length_ = end_of_step(T); }

void RowCache::truncate(std::int64_t n) {
  IL_CHECK(n >= 0 && n <= length_, name_, ": cannot truncate ", length_, " cached positions to ", n);
  length_ = n;  // the rows past n are overwritten by the next positions
}

// ---------------------------------------------------------------------------------------------
// The cache: K and V of position p in row p of each layer's tensors.
ContiguousKVCache::ContiguousKVCache(const TransformerConfig& c, std::int64_t capacity, Device device, DType dtype)
    : RowCache("KV cache", capacity), config_(c), dtype_(dtype) {
  const std::int64_t total = bytes();  // the size first: an overflowing capacity is an error, not a failed allocation
  with_context(
      [&] { return "KV cache of " + std::to_string(capacity) + " positions (" + std::to_string(total) + " bytes)"; },
      [&] {
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      k_.push_back(Tensor::zeros({capacity, c.num_kv_heads, c.head_dim}, dtype, device));
      v_.push_back(Tensor::zeros({capacity, c.num_kv_heads, c.head_dim}, dtype, device));
    }
      });
}

void ContiguousKVCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  IL_CHECK(layer >= 0 && layer < static_cast<std::int64_t>(k_.size()), "KV cache: no layer ", layer);
  IL_CHECK(k.defined() && v.defined(), "KV cache: layer ", layer,
           " brings no keys and values to keep (a layer that "
           "reads another layer's needs a cache that shares them, chapter 05's SharedKVCache)");
  const std::int64_t start = length_, end = end_of_step(k.size(0));
  // EXERCISE 02.1 BEGIN: keep the new keys and values, attend over the whole cache
  k_[layer].slice(0, start, end).copy_from(k);  // keep the new keys and values ...
  v_[layer].slice(0, start, end).copy_from(v);
  AttentionParams p;
  p.q_offset = start;  // ... and attend over all of them: query t sits at position start + t
  ops::attention(q, k_[layer].slice(0, 0, end), v_[layer].slice(0, 0, end), out, p);
  // EXERCISE 02.1 STUB
  // (void)start, (void)end;
  // lab::not_done("02.1", "copy k and v into rows start .. end of the layer's cache (k_[layer], v_[layer]), "
  //                       "then ops::attention of q over rows 0 .. end into out, with AttentionParams::q_offset "
  //                       "telling it that query t sits at position start + t");
  // EXERCISE 02.1 END
}

bool ContiguousKVCache::locate(std::int64_t T, CachedSeq& where) {
  // A subclass that attends its own way (chapter 06's mask, a test's gather) is read through its
  // own attend(): the batched ops would skip what it changes.
  if (typeid(*this) != typeid(ContiguousKVCache)) return false;
  if (k_.empty() || dtype_ != DType::F32) return false;
  where.k = k_, where.v = v_;     // position p in row p of each layer's storage
  where.length = end_of_step(T);  // an error if the step does not fit
  where.table = nullptr, where.block_size = 1;
  return true;
}

std::int64_t ContiguousKVCache::bytes() const {
  return config_.kv_cache_bytes(capacity_, static_cast<std::int64_t>(dtype_size(dtype_)));  // 0 once released
}

void ContiguousKVCache::release() {
  k_.clear(), v_.clear();
  capacity_ = length_ = 0;
}

std::string ContiguousKVCache::layout() const {
  std::ostringstream os;
  os << k_.size() << " layers × {K, V} × " << (k_.empty() ? "[]" : k_[0].describe()) << " = " << bytes() << " bytes";
  return os.str();
}

Tensor ContiguousKVCache::k(std::int64_t layer) const { return k_.at(static_cast<std::size_t>(layer)); }
Tensor ContiguousKVCache::v(std::int64_t layer) const { return v_.at(static_cast<std::size_t>(layer)); }

// ---------------------------------------------------------------------------------------------
// A batch: the sequences' new tokens as one list of rows.
Batch::Batch(const Llama& m, const std::vector<SequenceStep>& seqs, AttendPath how)
    : Batch(m.config.max_position_embeddings, m.device(), seqs, how) {}

Batch::Batch(std::optional<std::int64_t> context, Device device, const std::vector<SequenceStep>& seqs, AttendPath how)
    : path(how) {
  IL_CHECK(!seqs.empty(), "forward: an empty batch");
  std::vector<std::int32_t> p;
  begin.push_back(0);
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const SequenceStep& s = seqs[b];
    IL_CHECK(s.cache != nullptr, "forward: sequence ", b, " of the batch has no cache");
    IL_CHECK(!s.tokens.empty(), "forward: sequence ", b, " of the batch has no new tokens");
    const std::int64_t start = s.cache->length(), T = static_cast<std::int64_t>(s.tokens.size());
    IL_CHECK(!context || start + T <= *context, "forward: sequence ", b, " would reach position ", start + T,
             ", beyond the model's context of ", context.value_or(0));
    for (std::int64_t t = 0; t < T; ++t) {
      tokens.push_back(s.tokens[static_cast<std::size_t>(t)]);
      // EXERCISE 02.2 BEGIN: the position of a new token
      p.push_back(static_cast<std::int32_t>(start + t));
      // EXERCISE 02.2 STUB
      // lab::not_done("02.2", "append the position of new token t of a sequence that has `start` positions "
      //                       "cached to p (RoPE rotates it by this position)");
      // EXERCISE 02.2 END
      if (s.all_logits || t == T - 1) logit_rows.push_back(begin.back() + t);
    }
    begin.push_back(begin.back() + T);
    caches.push_back(s.cache);
  }
  pos = Tensor::from_vector(p, {static_cast<std::int64_t>(p.size())}).to(device);
  // The batched path's context: once here, for every layer.
  in_cached.assign(caches.size(), false);
  if (path != AttendPath::Batched) return;
  std::vector<CachedSeq> found;
  for (std::size_t b = 0; b < caches.size(); ++b) {
    auto* kv = dynamic_cast<KVCache*>(caches[b]);
    CachedSeq where;
    if (!kv || !kv->locate(begin[b + 1] - begin[b], where)) continue;
    where.q_begin = begin[b], where.q_end = begin[b + 1];
    found.push_back(std::move(where));
    in_cached[b] = true;
  }
  if (!found.empty()) cached.emplace(std::move(found), begin.back());
}

Tensor Batch::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v) const {
  Tensor out = Tensor::empty(q.shape(), DType::F32, q.device());
  // A layer that projects no keys and values (chapter 05: it reads another layer's) attends cache by cache.
  const bool together = cached && k.defined();
  if (together) ops::store_cached(*cached, layer, k, v);  // every sequence's new rows into their slots
  for (std::size_t b = 0; b < caches.size(); ++b) {
    if (together && in_cached[b]) continue;
    const std::int64_t r0 = begin[b], r1 = begin[b + 1];
    auto rows = [&](const Tensor& t) { return t.defined() ? t.slice(0, r0, r1) : t; };  // k, v undefined: chapter 05
    Tensor ob = out.slice(0, r0, r1);
    cache<KVCache>(b, "a cache of keys and values").attend(layer, q.slice(0, r0, r1), rows(k), rows(v), ob);
  }
  if (together) ops::attention_cached(q, *cached, layer, out);  // every sequence of the context at once
  return out;
}

Tensor Batch::logits_input(const Tensor& x) const {
  // EXERCISE 02.3 BEGIN: only the rows whose next token is wanted go through the head
  const std::int64_t n = static_cast<std::int64_t>(logit_rows.size());
  if (logit_rows.back() - logit_rows.front() == n - 1) return x.slice(0, logit_rows.front(), logit_rows.back() + 1);
  Tensor out = Tensor::empty({n, x.size(1)}, x.dtype(), x.device());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t r = logit_rows[static_cast<std::size_t>(i)];
    out.slice(0, i, i + 1).copy_from(x.slice(0, r, r + 1));
  }
  return out;
  // EXERCISE 02.3 STUB
  // lab::not_done("02.3", "return the rows of x listed in logit_rows, in order, as one [n, D] tensor: each "
  //                       "sequence's last row (all of its rows when it asked for all_logits); a run of "
  //                       "consecutive rows can be one slice, without a copy");
  // EXERCISE 02.3 END
}

Tensor forward_cached(const Llama& m, KVCache& cache, const std::vector<std::int32_t>& tokens, bool all_positions) {
  std::vector<SequenceStep> one{{tokens, &cache, all_positions}};
  return forward(m, one);
}

Generation generate_cached(const Llama& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                           const std::vector<std::int64_t>& eos_ids, const OnToken& on_token) {
  return generate_with_cache(
      m.config.max_position_embeddings, m.device(), prompt, max_new, sampler, eos_ids, on_token,
      [&](std::int64_t capacity) { return ContiguousKVCache(m.config, capacity, m.device()); },
      [&](ContiguousKVCache& cache, const std::vector<std::int32_t>& feed) { return forward_cached(m, cache, feed); });
}

}  // namespace inferlab::models
