#include "common/models/cla.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>

#include "common/json_file.h"
#include "common/lab.h"
#include "common/models/batch_decode.h"
#include "common/models/hf_weights.h"

namespace inferlab::models::cla {

using models::Batch;
using models::Llama;
using models::LlamaLayer;

// ---------------------------------------------------------------------------------------------
// The layout: groups of s consecutive layers; the first of each group stores.
ClaLayout ClaLayout::groups_of(std::int64_t layers, std::int64_t share_factor) {
  IL_CHECK(layers > 0, "CLA: a model needs at least one layer, got ", layers);
  IL_CHECK(share_factor >= 1 && share_factor <= layers, "CLA: the sharing factor must be in [1, ", layers,
           "] (the number of layers), got ", share_factor);
  ClaLayout out;
  out.share_factor = share_factor;
  for (std::int64_t i = 0; i < layers; ++i) {
    // EXERCISE 05.1 BEGIN: which storage layer a layer reads
    out.storage.push_back(i / share_factor);
    // EXERCISE 05.1 STUB
    // lab::not_done("05.1", "append the storage layer that layer i reads: layers are grouped share_factor at a "
    //                       "time (0 .. s-1, s .. 2s-1, ...), and every group has one storage layer, numbered "
    //                       "from 0 in order");
    // EXERCISE 05.1 END
  }
  return out;
}

std::int64_t ClaLayout::storage_layers() const { return storage.empty() ? 0 : storage.back() + 1; }

bool ClaLayout::stores(std::int64_t layer) const {
  IL_CHECK(layer >= 0 && layer < layers(), "CLA: no layer ", layer, " in a model of ", layers());
  return layer == 0 || storage[static_cast<std::size_t>(layer)] != storage[static_cast<std::size_t>(layer - 1)];
}

std::string ClaLayout::describe() const {
  std::ostringstream os;
  for (std::int64_t i = 0; i < layers();) {
    std::int64_t j = i;
    while (j + 1 < layers() && !stores(j + 1)) ++j;
    os << (i ? ", " : "")
       << (i == j ? "layer " + std::to_string(i) : "layers " + std::to_string(i) + "-" + std::to_string(j)) << " read "
       << storage[static_cast<std::size_t>(i)];
    i = j + 1;
  }
  return os.str();
}

std::int64_t num_parameters(const TransformerConfig& c, const ClaLayout& layout) {
  IL_CHECK(layout.layers() == c.num_layers, "CLA: a layout of ", layout.layers(), " layers for a model of ", c.num_layers);
  const std::int64_t kv = c.num_kv_heads * c.head_dim;
  const std::int64_t per_sharing_layer = 2 * c.hidden_size * kv + (c.attention_bias ? 2 * kv : 0);
  return c.num_parameters() - (c.num_layers - layout.storage_layers()) * per_sharing_layer;
}

namespace {

// The config of the storage: the same layers' K and V, ceil(L/s) of them.
TransformerConfig storage_config(const TransformerConfig& c, const ClaLayout& layout) {
  IL_CHECK(layout.layers() == c.num_layers, "CLA: a layout of ", layout.layers(), " layers for a model of ", c.num_layers);
  TransformerConfig s = c;
  s.num_layers = layout.storage_layers();
  return s;
}

}  // namespace

std::int64_t kv_cache_bytes(const TransformerConfig& c, const ClaLayout& layout, std::int64_t positions,
                            std::int64_t bytes_per_element) {
  // EXERCISE 05.3 BEGIN: the bytes of a shared cache
  return storage_config(c, layout).kv_cache_bytes(positions, bytes_per_element);
  // EXERCISE 05.3 STUB
  // (void)storage_config;
  // lab::not_done("05.3", "return the bytes of the shared cache at `positions` tokens: the lecture's "
  //                       "S × K × H × L × 2 × bytes, with L the number of layers that store "
  //                       "(layout.storage_layers()); TransformerConfig::kv_cache_bytes computes the rest");
  // EXERCISE 05.3 END
}

// ---------------------------------------------------------------------------------------------
// Loading.
namespace {

// The sharing factor and its check against kv_producer_layers, from an InferLabCLA config.
ClaLayout parse_layout(const HfConfig& hf, const TransformerConfig& c) {
  const JsonFields f(hf.json, hf.path);
  const std::int64_t s = f.get_or<std::int64_t>("kv_share_factor", 1);
  IL_CHECK(s >= 1 && s <= c.num_layers, hf.path, ": field 'kv_share_factor' must be in [1, ", c.num_layers,
           "] (num_hidden_layers), got ", s);
  ClaLayout layout = ClaLayout::groups_of(c.num_layers, s);
  if (f.has("kv_producer_layers")) {
    std::vector<std::int64_t> want;
    for (std::int64_t i = 0; i < c.num_layers; ++i)
      if (layout.stores(i)) want.push_back(i);
    const auto got = f.get<std::vector<std::int64_t>>("kv_producer_layers");
    IL_CHECK(got == want, hf.path, ": field 'kv_producer_layers' is ", hf.json["kv_producer_layers"].dump(),
             ", but kv_share_factor ", s, " makes the first layer of each group of ", s,
             " the producer: ", nlohmann::json(want).dump(), " (other layouts are not implemented)");
  }
  if (f.has("causal"))
    IL_CHECK(f.get<bool>("causal"), hf.path, ": field 'causal' is false: not a decoder (chapter 08 runs those)");
  return layout;
}

}  // namespace

ClaModel load_cla(const std::string& path) {
  namespace fs = std::filesystem;
  IL_CHECK(fs::exists(path), "cannot open model ", path, ": no such file or folder");
  const HfConfig hf = load_hf_config(path);
  const std::string arch = hf.architecture();
  if (arch != "InferLabCLAForCausalLM") {
    // A plain Llama-family model is CLA with s = 1: every layer stores.
    IL_CHECK(models::llama_family(arch), hf.path, ": architecture '", arch,
             "' is neither InferLabCLAForCausalLM nor a Llama-family decoder", where_it_runs(arch));
    models::Llama base = models::load_llama(path);
    const std::int64_t L = base.config.num_layers;
    return {std::move(base), ClaLayout::groups_of(L, 1)};
  }
  TransformerConfig c = parse_transformer_config(hf);
  const ClaLayout layout = parse_layout(hf, c);
  IL_CHECK(!c.attention_bias && !c.mlp_bias, hf.path,
           ": InferLabCLAForCausalLM has no biases, but the config asks for them");
  IL_CHECK(c.rope_scaling.is_null(), hf.path,
           ": field 'rope_scaling' is set; tools/ref_transformer.py, this model's "
           "definition, has none");
  models::HfWeights weights(hf, c, path);
  const Checkpoint& ck = weights.checkpoint();
  const std::int64_t D = c.hidden_size, Q = c.num_heads * c.head_dim, KV = c.num_kv_heads * c.head_dim;
  Llama m = models::read_decoder(c, std::ref(weights), [&](const std::string& p, std::int64_t i, LlamaLayer& l) {
    l.wq = weights(p + "self_attn.q_proj.weight", Shape{Q, D});
    l.wo = weights(p + "self_attn.o_proj.weight", Shape{D, Q});
    if (layout.stores(i)) {
      l.wk = weights(p + "self_attn.k_proj.weight", Shape{KV, D});
      l.wv = weights(p + "self_attn.v_proj.weight", Shape{KV, D});
    } else {
      for (const char* kv : {"k", "v"})
        IL_CHECK(!ck.contains(p + "self_attn." + kv + "_proj.weight"), hf.path, ": layer ", i, " has a ", kv,
                 "_proj, but with kv_share_factor ", layout.share_factor, " it reads layer ", i - i % layout.share_factor,
                 "'s keys and values and has none");
    }
  });
  weights.check_all_used("do num_hidden_layers and kv_share_factor match the checkpoint?");
  m.inv_freq = models::rope_frequencies(c);
  m.source = path;
  return {std::move(m), layout};
}

ClaModel share_kv(const models::Llama& m, std::int64_t share_factor) {
  ClaModel out{m, ClaLayout::groups_of(m.config.num_layers, share_factor)};
  for (std::int64_t i = 0; i < out.config().num_layers; ++i)
    if (!out.layout.stores(i)) {
      LlamaLayer& l = out.base.layers[static_cast<std::size_t>(i)];
      l.wk = Linear(), l.wv = Linear();
    }
  if (share_factor > 1) out.base.source = m.source + " (K and V shared by " + std::to_string(share_factor) + " layers)";
  return out;
}

ClaModel random_cla(const TransformerConfig& c, std::int64_t share_factor, std::uint64_t seed) {
  return share_kv(models::random_llama(c, seed), share_factor);
}

// ---------------------------------------------------------------------------------------------
// The shared cache: a contiguous cache of the storage layers, read through the layout.
SharedKVCache::SharedKVCache(const TransformerConfig& c, ClaLayout layout, std::int64_t capacity, Device device, DType dtype)
    : layout_(std::move(layout)),
      store_(storage_config(c, layout_), capacity, device, dtype),
      stored_(static_cast<std::size_t>(layout_.storage_layers()), 0) {}

void SharedKVCache::truncate(std::int64_t n) {
  store_.truncate(n);
  for (std::int64_t& e : stored_) e = std::min(e, n);
}

void SharedKVCache::release() {
  store_.release();
  stored_.assign(stored_.size(), 0);
}

void SharedKVCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  IL_CHECK(layer >= 0 && layer < layout_.layers(), "shared KV cache: no layer ", layer, " in a layout of ",
           layout_.layers());
  const std::int64_t s = layout_.storage[static_cast<std::size_t>(layer)], start = length(), end = start + q.size(0);
  const bool first = layout_.stores(layer);
  IL_CHECK(first == k.defined() && first == v.defined(), "shared KV cache: layer ", layer,
           first ? " is the first of its group and must bring its keys and values"
                 : " shares its group's keys and values and must bring none");
  // EXERCISE 05.2 BEGIN: a group's first layer stores, the others read what it stored
  if (first) {
    store_.attend(s, q, k, v, out);  // chapter 02's: keep the new rows, attend over all of them
    stored_[static_cast<std::size_t>(s)] = end;
    return;
  }
  IL_CHECK(stored_[static_cast<std::size_t>(s)] == end, "shared KV cache: layer ", layer, " reads storage layer ", s,
           " before its group's first layer stored this step's positions");
  AttentionParams p;
  p.q_offset = start;  // query t sits at position start + t, as in the layer that stored
  ops::attention(q, store_.k(s).slice(0, 0, end), store_.v(s).slice(0, 0, end), out, p);
  // EXERCISE 05.2 STUB
  // (void)s, (void)start, (void)end;
  // lab::not_done("05.2", "if `first`, let the storage (store_, a ContiguousKVCache) keep and attend over layer "
  //                       "s's rows with store_.attend and record in stored_[s] that rows up to `end` are in; "
  //                       "otherwise run ops::attention of q over rows 0 .. end of store_.k(s) and store_.v(s), "
  //                       "with AttentionParams::q_offset = start, without storing anything");
  // EXERCISE 05.2 END
}

// ---------------------------------------------------------------------------------------------
// Chapter 02's attention block; the lines marked CLA are what changed (the README shows the diff).
Tensor attention_block(const Llama& m, const LlamaLayer& l, const Tensor& h, const Batch& batch, std::int64_t layer) {
  const auto& c = m.config;
  const Tensor& pos = batch.pos;  // cache
  const std::int64_t T = h.size(0), N = c.num_heads, K = c.num_kv_heads, H = c.head_dim;
  Tensor q = linear(h, l.wq).view({T, N, H}), k, v;  // CLA: k and v stay undefined in a sharing layer
  // Qwen3's and Gemma 3's per-head norms, before RoPE (nothing for the others):
  head_norm(m, q, l.q_norm);
  ops::rope(q, pos, rope_freqs(m, l), m.rope_pairing);
  if (l.wk.defined()) {  // CLA: only the first layer of a group has K and V projections
    k = linear(h, l.wk).view({T, K, H}), v = linear(h, l.wv).view({T, K, H});
    head_norm(m, k, l.k_norm);
    ops::rope(k, pos, rope_freqs(m, l), m.rope_pairing);
  }
  Tensor a = batch.attend(layer, q, k, v);  // CLA: the cache keeps k and v, or hands a sharing layer its group's
  return linear(a.view({T, N * H}), l.wo);
}

Tensor forward(const ClaModel& m, std::vector<models::SequenceStep>& seqs) {
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    // A SharedKVCache of the model's layout, or a cache that knows the layers (chapter 12's, from
    // the model's layer specs: a sharing layer reads its source's blocks).
    const auto* shared = dynamic_cast<const SharedKVCache*>(seqs[b].cache);
    IL_CHECK(dynamic_cast<const models::KVCache*>(seqs[b].cache) != nullptr, "CLA forward: sequence ", b,
             "'s cache keeps no keys and values");
    if (shared != nullptr)
      IL_CHECK(shared->layout().storage == m.layout.storage, "CLA forward: sequence ", b, "'s cache is laid out as ",
               shared->layout().describe(), ", the model as ", m.layout.describe());
  }
  return models::forward(m.base, seqs, attention_block);
}

Tensor forward_cached(const ClaModel& m, SharedKVCache& cache, const std::vector<std::int32_t>& tokens, bool all_positions) {
  std::vector<models::SequenceStep> one{{tokens, &cache, all_positions}};
  return forward(m, one);
}

Tensor forward_recomputed(const ClaModel& m, const std::vector<std::int32_t>& tokens) {
  const std::int64_t T = static_cast<std::int64_t>(tokens.size());
  IL_CHECK(T > 0, "forward_recomputed: no tokens");
  Tensor out = Tensor::empty({T, m.config().vocab_size}, DType::F32);
  for (std::int64_t t = 1; t <= T; ++t) {
    SharedKVCache fresh(m.config(), m.layout, t, m.base.device());
    const std::vector<std::int32_t> prefix(tokens.begin(), tokens.begin() + t);
    out.slice(0, t - 1, t).copy_from(forward_cached(m, fresh, prefix).to(Device::CPU));
  }
  return out;
}

models::Generation generate_cached(const ClaModel& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                                   const std::vector<std::int64_t>& eos_ids, const models::OnToken& on_token) {
  return models::generate_with_cache(
      m.config().max_position_embeddings, m.base.device(), prompt, max_new, sampler, eos_ids, on_token,
      [&](std::int64_t capacity) { return SharedKVCache(m.config(), m.layout, capacity, m.base.device()); },
      [&](SharedKVCache& cache, const std::vector<std::int32_t>& feed) { return forward_cached(m, cache, feed); });
}

// ---------------------------------------------------------------------------------------------
// Batched decode, measured.
Tensor decode_step(const ClaModel& m, const std::vector<SharedKVCache*>& caches, const std::vector<std::int32_t>& tokens) {
  IL_CHECK(!tokens.empty() && caches.size() == tokens.size(), "decode_step: ", tokens.size(), " tokens for ", caches.size(),
           " caches");
  std::vector<models::SequenceStep> batch;
  for (std::size_t b = 0; b < tokens.size(); ++b) batch.push_back({{tokens[b]}, caches[b]});
  return forward(m, batch);
}

double decode_step_bytes(const ClaModel& m, const std::vector<std::int64_t>& lengths) {
  double bytes = static_cast<double>(m.base.step_weight_bytes());
  for (std::int64_t len : lengths) bytes += static_cast<double>(m.config().kv_cache_bytes(len + 1, 4));  // L layers read
  return bytes;
}

ThroughputPoint measure_decode(const ClaModel& m, std::int64_t batch, std::int64_t context, int steps) {
  std::vector<std::unique_ptr<SharedKVCache>> caches;
  std::vector<SharedKVCache*> views;
  for (std::int64_t b = 0; b < batch; ++b) {
    caches.push_back(std::make_unique<SharedKVCache>(m.config(), m.layout, context + steps + 1, m.base.device()));
    models::fill_cache(caches.back()->storage(), context, static_cast<std::uint64_t>(b) * 1000 + 1);
    views.push_back(caches.back().get());
  }
  const std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch), 3);
  return time_decode(batch, decode_step_bytes(m, std::vector<std::int64_t>(static_cast<std::size_t>(batch), context)), steps,
                     m.base.device(), [&] { decode_step(m, views, tokens); });
}

// ---------------------------------------------------------------------------------------------
// Character.AI's recipe as arithmetic.
std::vector<RecipeStep> character_ai_recipe(const TransformerConfig& c, std::int64_t context, std::int64_t window,
                                            std::int64_t global_every, std::int64_t share_factor,
                                            std::int64_t bytes_per_element) {
  IL_CHECK(context > 0 && window > 0 && global_every > 0 && share_factor > 0,
           "Character.AI recipe: context, window, global_every and share_factor must be positive");
  const std::int64_t L = c.num_layers, b = bytes_per_element;
  // One layer's K and V of `positions` tokens with K KV heads.
  auto layer_bytes = [&](std::int64_t kv_heads, std::int64_t positions) {
    TransformerConfig one = c;
    one.num_layers = 1, one.num_kv_heads = kv_heads;
    return one.kv_cache_bytes(positions, b);
  };
  // Layers 0, global_every, 2·global_every, ... are global; the others local.
  std::int64_t globals = 0;
  for (std::int64_t i = 0; i < L; i += global_every) ++globals;
  const std::int64_t locals = L - globals, W = std::min(window, context);
  // Sharing: the global layers in groups of s (across the blocks), each run of adjacent local
  // layers in groups of s (a run is the global_every - 1 layers between two global ones).
  std::int64_t local_storage = 0;
  for (std::int64_t i = 0; i < L; i += global_every) {
    const std::int64_t run = std::min(global_every - 1, L - i - 1);
    local_storage += (run + share_factor - 1) / share_factor;
  }
  const std::int64_t global_storage = (globals + share_factor - 1) / share_factor;
  std::vector<RecipeStep> out;
  out.push_back({"the model as given (K = " + std::to_string(c.num_kv_heads) + " KV heads, every layer global)",
                 L * layer_bytes(c.num_kv_heads, context)});
  out.push_back({"+ MQA (K = 1)", L * layer_bytes(1, context)});
  out.push_back({"+ local attention: " + std::to_string(locals) + " layers keep a window of " + std::to_string(W) + ", " +
                     std::to_string(globals) + " global (1 in " + std::to_string(global_every) + ")",
                 globals * layer_bytes(1, context) + locals * layer_bytes(1, W)});
  out.push_back({"+ K/V shared by " + std::to_string(share_factor) + " adjacent layers: " + std::to_string(global_storage) +
                     " global and " + std::to_string(local_storage) + " local storage layers",
                 global_storage * layer_bytes(1, context) + local_storage * layer_bytes(1, W)});
  return out;
}

}  // namespace inferlab::models::cla
