#include "common/models/local.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "common/json_file.h"
#include "common/lab.h"
#include "common/models/gguf_llama.h"
#include "common/models/hf_weights.h"

namespace inferlab::models::local {

// ---------------------------------------------------------------------------------------------
// The layout.
LocalLayout LocalLayout::global(std::int64_t layers) {
  IL_CHECK(layers > 0, "local attention: a model needs at least one layer, got ", layers);
  LocalLayout l;
  l.window.assign(static_cast<std::size_t>(layers), 0);
  return l;
}

LocalLayout LocalLayout::local(std::int64_t layers, std::int64_t window) {
  IL_CHECK(window > 0, "local attention: the window must be positive, got ", window);
  LocalLayout l = global(layers);
  l.window.assign(l.window.size(), window);
  return l;
}

LocalLayout LocalLayout::hybrid(std::int64_t layers, std::int64_t window, std::int64_t global_every) {
  IL_CHECK(global_every > 0, "local attention: one global layer in ", global_every, " is not a pattern");
  LocalLayout l = local(layers, window);
  for (std::int64_t i = global_every - 1; i < layers; i += global_every) l.window[static_cast<std::size_t>(i)] = 0;
  return l;
}

bool LocalLayout::is_local(std::int64_t layer) const {
  IL_CHECK(layer >= 0 && layer < layers(), "local attention: no layer ", layer, " in a model of ", layers());
  return window[static_cast<std::size_t>(layer)] > 0;
}

std::int64_t LocalLayout::locals() const {
  return static_cast<std::int64_t>(std::count_if(window.begin(), window.end(), [](std::int64_t w) { return w > 0; }));
}

std::int64_t LocalLayout::rows(std::int64_t layer, std::int64_t capacity) const {
  // EXERCISE 06.1 BEGIN: the rows a layer keeps
  return is_local(layer) ? std::min(capacity, sinks + window[static_cast<std::size_t>(layer)]) : capacity;
  // EXERCISE 06.1 STUB
  // (void)capacity;
  // lab::not_done("06.1", "return the rows layer `layer` keeps for a sequence of up to `capacity` positions: a "
  //                       "global layer keeps them all; a local layer its window W (window[layer]) and the "
  //                       "`sinks` first positions, never more than capacity");
  // EXERCISE 06.1 END
}

std::int64_t LocalLayout::receptive_field() const {
  if (locals() < layers()) return -1;
  std::int64_t reach = 1;
  for (std::int64_t w : window) reach += w - 1;
  return reach;
}

std::string LocalLayout::describe() const {
  std::ostringstream os;
  for (std::int64_t i = 0; i < layers();) {
    std::int64_t j = i;
    while (j + 1 < layers() && window[static_cast<std::size_t>(j + 1)] == window[static_cast<std::size_t>(i)]) ++j;
    const std::int64_t w = window[static_cast<std::size_t>(i)];
    os << (i ? ", " : "")
       << (i == j ? "layer " + std::to_string(i) : "layers " + std::to_string(i) + "-" + std::to_string(j))
       << (w > 0 ? " local (W = " + std::to_string(w) + ")" : " global");
    i = j + 1;
  }
  if (sinks > 0) os << ", " << sinks << " sink positions";
  return os.str();
}

std::int64_t kv_cache_bytes(const TransformerConfig& c, const LocalLayout& layout, std::int64_t positions,
                            std::int64_t bytes_per_element) {
  IL_CHECK(layout.layers() == c.num_layers, "local attention: a layout of ", layout.layers(), " layers for a model of ",
           c.num_layers);
  TransformerConfig one = c;  // one layer's K and V: the one formula, layer by layer
  one.num_layers = 1;
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < c.num_layers; ++i)
    total = checked_add(total, one.kv_cache_bytes(layout.rows(i, positions), bytes_per_element), "KV-cache bytes");
  return total;
}

// ---------------------------------------------------------------------------------------------
// Loading: the windows as transformers reads them.
LocalLayout parse_local_layout(const HfConfig& hf, std::int64_t layers) {
  const JsonFields f(hf.json, hf.path);
  const std::string arch = hf.architecture();
  // sliding_window: a positive integer, or absent / null for none.
  auto window = [&]() -> std::int64_t {
    if (!f.has("sliding_window") || hf.json["sliding_window"].is_null()) return 0;
    const std::int64_t w = f.get<std::int64_t>("sliding_window");
    IL_CHECK(w > 0, hf.path, ": field 'sliding_window' must be a positive number of positions, got ", w);
    return w;
  };
  // layer_types: one entry per layer, each "sliding_attention" (window W) or "full_attention".
  auto from_layer_types = [&](std::int64_t W) {
    const auto types = f.get<std::vector<std::string>>("layer_types");
    IL_CHECK(static_cast<std::int64_t>(types.size()) == layers, hf.path, ": field 'layer_types' has ", types.size(),
             " entries for ", layers, " layers (num_hidden_layers)");
    LocalLayout l = LocalLayout::global(layers);
    for (std::size_t i = 0; i < types.size(); ++i) {
      IL_CHECK(types[i] == "sliding_attention" || types[i] == "full_attention", hf.path, ": field 'layer_types' entry ", i,
               " is '", types[i], "' (sliding_attention or full_attention)");
      if (types[i] == "full_attention") continue;
      IL_CHECK(W > 0, hf.path, ": layer ", i, " is 'sliding_attention' but the config sets no sliding_window",
               arch == "Qwen2ForCausalLM" ? " (Qwen2 uses sliding_window only when use_sliding_window is true)" : "");
      l.window[i] = W;
    }
    return l;
  };
  if (arch == "MinistralForCausalLM") {
    const std::int64_t W = window();
    if (f.has("layer_types") && !hf.json["layer_types"].is_null()) return from_layer_types(W);
    return W > 0 ? LocalLayout::local(layers, W) : LocalLayout::global(layers);
  }
  if (arch == "MistralForCausalLM") {  // one window for every layer; layer_types is not Mistral's
    const std::int64_t W = window();
    return W > 0 ? LocalLayout::local(layers, W) : LocalLayout::global(layers);
  }
  if (gemma_family(arch)) {
    // Gemma 2 alternates (layer 0 local), Gemma 3 keeps one global layer in sliding_window_pattern
    // (6); configs written by transformers 4.57 list layer_types, which say the same.
    const std::int64_t W = f.has("sliding_window") ? window() : 4096;  // the classes' default
    if (f.has("layer_types") && !hf.json["layer_types"].is_null()) return from_layer_types(W);
    const std::int64_t every = arch == "Gemma2ForCausalLM" ? 2 : f.get_or<std::int64_t>("sliding_window_pattern", 6);
    IL_CHECK(every >= 1 && every <= layers + 1, hf.path, ": field 'sliding_window_pattern' must be in [1, ", layers + 1,
             "], got ", every);
    IL_CHECK(W > 0, hf.path, ": Gemma needs a positive 'sliding_window' for its local layers");
    return LocalLayout::hybrid(layers, W, every);
  }
  if (arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM") {
    const std::int64_t W = f.get_or<bool>("use_sliding_window", false) ? window() : 0;
    if (f.has("layer_types") && !hf.json["layer_types"].is_null()) return from_layer_types(W);
    LocalLayout l = LocalLayout::global(layers);
    if (W == 0) return l;
    const std::int64_t first = f.get_or<std::int64_t>("max_window_layers", 28);
    for (std::int64_t i = std::max<std::int64_t>(first, 0); i < layers; ++i) l.window[static_cast<std::size_t>(i)] = W;
    return l;
  }
  IL_CHECK(models::llama_family(arch), hf.path, ": architecture '", arch,
           "' is not one chapter 06 runs (MistralForCausalLM, MinistralForCausalLM, Qwen2ForCausalLM, "
           "Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, or another Llama-family decoder without windows)",
           where_it_runs(arch));
  return LocalLayout::global(layers);
}

LocalModel load_local(const std::string& path) {
  namespace fs = std::filesystem;
  IL_CHECK(fs::exists(path), "cannot open model ", path, ": no such file or folder");
  if (!fs::is_directory(path) && fs::path(path).extension() == ".bin") {  // llama2.c: no windows
    models::Llama m = models::load_llama(path);
    const std::int64_t L = m.config.num_layers;
    return {std::move(m), LocalLayout::global(L)};
  }
  if (fs::path(path).extension() == ".gguf") {  // chapter 09's reader, with the windows llama.cpp applies
    const gguf::File f(path);
    LocalLayout layout;
    layout.window = models::gguf_windows(f, models::gguf_config(f));
    return {models::load_gguf_layers(f, layout.window), std::move(layout)};
  }
  const HfConfig hf = load_hf_config(path);
  const TransformerConfig c = parse_transformer_config(hf);
  LocalLayout layout = parse_local_layout(hf, c.num_layers);
  if (gemma_family(c.architecture)) return {load_gemma(hf, c, layout, path), std::move(layout)};
  return {models::load_hf_decoder(hf, c, path), std::move(layout)};
}

// Gemma 2 and 3: chapter 01's layer with the pieces their checkpoints add, under their names.
models::Llama load_gemma(const HfConfig& hf, const TransformerConfig& c, const LocalLayout& layout,
                         const std::string& path) {
  models::HfWeights get(hf, c, path);
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, H = c.head_dim, Q = c.num_heads * H,
                     KV = c.num_kv_heads * H;
  // Gemma's RMSNorm multiplies by 1 + w (in float32, as transformers does): kept here as the
  // weight the norm multiplies by, so that the norm op is everyone's.
  auto norm = [&](const std::string& name, std::int64_t n) {
    Tensor w = get(name, Shape{n}).to(DType::F32);
    for (std::int64_t i = 0; i < n; ++i) w.data<float>()[i] += 1.0f;
    return w;
  };
  models::Llama m;
  m.config = c;
  m.inv_freq = models::rope_frequencies(c);  // the global layers', with rope_scaling
  // Gemma 3's local layers rotate with a base of their own, unscaled.
  const Tensor local_freq = c.rope_local_base_freq > 0 ? rope_inv_freq(H, c.rope_local_base_freq) : Tensor{};
  m.embed = get("model.embed_tokens.weight", Shape{c.vocab_size, D});
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    models::LlamaLayer l;
    l.attn_norm = norm(p + "input_layernorm.weight", D);
    l.wq = get(p + "self_attn.q_proj.weight", Shape{Q, D});
    l.wk = get(p + "self_attn.k_proj.weight", Shape{KV, D});
    l.wv = get(p + "self_attn.v_proj.weight", Shape{KV, D});
    l.wo = get(p + "self_attn.o_proj.weight", Shape{D, Q});
    if (c.attention_bias) {  // on all four projections, as Gemma's attention_bias puts them
      l.wq.bias = get(p + "self_attn.q_proj.bias", Shape{Q}).to(DType::F32);
      l.wk.bias = get(p + "self_attn.k_proj.bias", Shape{KV}).to(DType::F32);
      l.wv.bias = get(p + "self_attn.v_proj.bias", Shape{KV}).to(DType::F32);
      l.wo.bias = get(p + "self_attn.o_proj.bias", Shape{D}).to(DType::F32);
    }
    if (c.qk_norm) l.q_norm = norm(p + "self_attn.q_norm.weight", H), l.k_norm = norm(p + "self_attn.k_norm.weight", H);
    l.post_attn_norm = norm(p + "post_attention_layernorm.weight", D);  // Gemma's name for the norm after attention
    l.mlp_norm = norm(p + "pre_feedforward_layernorm.weight", D);
    l.post_mlp_norm = norm(p + "post_feedforward_layernorm.weight", D);
    l.w_gate = get(p + "mlp.gate_proj.weight", Shape{F, D});
    l.w_up = get(p + "mlp.up_proj.weight", Shape{F, D});
    l.w_down = get(p + "mlp.down_proj.weight", Shape{D, F});
    l.geglu = true;
    if (local_freq.defined() && layout.is_local(i)) l.inv_freq = local_freq;
    m.layers.push_back(std::move(l));
  }
  m.final_norm = norm("model.norm.weight", D);
  m.lm_head = c.tie_word_embeddings ? Linear(m.embed) : Linear(get("lm_head.weight", Shape{c.vocab_size, D}));
  get.check_all_used("does num_hidden_layers match the checkpoint?");
  m.source = path;
  return m;
}

// ---------------------------------------------------------------------------------------------
// The ring cache.
RingKVCache::RingKVCache(const TransformerConfig& c, LocalLayout layout, std::int64_t capacity, Device device, DType dtype)
    : RowCache("ring KV cache", capacity), config_(c), layout_(std::move(layout)), dtype_(dtype) {
  IL_CHECK(layout_.layers() == c.num_layers, "ring KV cache: a layout of ", layout_.layers(), " layers for a model of ",
           c.num_layers);
  IL_CHECK(layout_.sinks >= 0, "ring KV cache: a negative number of sink positions, ", layout_.sinks);
  const std::int64_t total = bytes();
  with_context(
      [&] { return "ring KV cache of " + std::to_string(capacity) + " positions (" + std::to_string(total) + " bytes)"; },
      [&] {
    for (std::int64_t l = 0; l < c.num_layers; ++l) {
      const std::int64_t rows = layout_.rows(l, capacity);
      k_.push_back(Tensor::zeros({rows, c.num_kv_heads, c.head_dim}, dtype, device));
      v_.push_back(Tensor::zeros({rows, c.num_kv_heads, c.head_dim}, dtype, device));
    }
      });
}

RingKVCache RingKVCache::rings_only(const TransformerConfig& c, LocalLayout layout, Device device) {
  RingKVCache r(c, LocalLayout::local(c.num_layers, 1), 1, device);  // one row a layer, replaced below
  r.layout_ = std::move(layout), r.rings_only_ = true;
  r.capacity_ = std::numeric_limits<std::int64_t>::max() / 4;  // no length limit: a ring is bounded by its window
  r.k_.clear(), r.v_.clear();
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const std::int64_t rows = r.layout_.is_local(l) ? r.layout_.sinks + r.layout_.window[static_cast<std::size_t>(l)] : 0;
    r.k_.push_back(Tensor::zeros({rows, c.num_kv_heads, c.head_dim}, DType::F32, device));
    r.v_.push_back(Tensor::zeros({rows, c.num_kv_heads, c.head_dim}, DType::F32, device));
  }
  return r;
}

std::unique_ptr<models::Cache> RingKVCache::clone() const {
  auto r = std::make_unique<RingKVCache>(*this);  // the tensors are handles: give the copy storage of its own
  for (Tensor& t : r->k_) t = t.clone();
  for (Tensor& t : r->v_) t = t.clone();
  return r;
}

std::int64_t RingKVCache::slot(std::int64_t layer, std::int64_t p) const {
  const std::int64_t ns = layout_.sinks, W = layout_.window.at(static_cast<std::size_t>(layer));
  // EXERCISE 06.2 BEGIN: the slot of a position
  if (W == 0 || p < ns) return p;  // a global layer's row, or a sink's own slot
  return ns + (p - ns) % W;
  // EXERCISE 06.2 STUB
  // (void)ns, (void)W;
  // lab::not_done("06.2", "return the slot of position p: a global layer (W == 0) keeps p in row p, and so does a "
  //                       "local layer for its ns sink positions; the positions after them share the W slots "
  //                       "that follow the sinks, in turn, so that each overwrites the one W positions before it");
  // EXERCISE 06.2 END
}

void RingKVCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  IL_CHECK(layer >= 0 && layer < static_cast<std::int64_t>(k_.size()), "ring KV cache: no layer ", layer);
  IL_CHECK(k.defined() && v.defined(), "ring KV cache: layer ", layer, " brings no keys and values to keep");
  IL_CHECK(!rings_only_ || layout_.is_local(layer), "ring KV cache: layer ", layer,
           " is global, and this cache keeps only the local layers' rings (its rows are the paged pool's)");
  const std::int64_t start = length_, T = k.size(0), end = end_of_step(T);
  Tensor &K = k_[static_cast<std::size_t>(layer)], &V = v_[static_cast<std::size_t>(layer)];
  const std::int64_t rows = K.size(0);
  if (end <= rows) {
    // Nothing wraps (always so for a global layer): position p in row p, chapter 02's attend. A
    // local layer's window is no mask here: every query p < sinks + W sees 0 .. p anyway.
    K.slice(0, start, end).copy_from(k);
    V.slice(0, start, end).copy_from(v);
    AttentionParams p = models::attention_params(config_);  // Gemma's scale and soft-capping, else the defaults
    p.q_offset = start;
    ops::attention(q, K.slice(0, 0, end), V.slice(0, 0, end), out, p);
    return;
  }
  // The ring wraps: one position at a time, each stored in its slot and attending over the rows
  // it may see, always a prefix of the storage (the sinks, then the ring's filled slots).
  for (std::int64_t t = 0; t < T; ++t) {
    const std::int64_t pos = start + t, s = slot(layer, pos);
    K.slice(0, s, s + 1).copy_from(k.slice(0, t, t + 1));
    V.slice(0, s, s + 1).copy_from(v.slice(0, t, t + 1));
    AttentionParams p = models::attention_params(config_);
    p.causal = false;  // every filled slot is in the window, in whatever order
    Tensor o = out.slice(0, t, t + 1);
    const std::int64_t visible = std::min(pos + 1, rows);
    ops::attention(q.slice(0, t, t + 1), K.slice(0, 0, visible), V.slice(0, 0, visible), o, p);
  }
}

void RingKVCache::truncate(std::int64_t n) {
  if (n < 0 || n > length_) return RowCache::truncate(n);  // which names the bad request
  // Position q overwrote position q − W of a full ring. After the rollback, position n's query
  // needs n − W + 1 .. n − 1: lost if some q in n + 1 .. length − 1 overwrote one of them.
  for (std::int64_t l = 0; l < layout_.layers(); ++l) {
    const std::int64_t W = layout_.window[static_cast<std::size_t>(l)], ns = layout_.sinks;
    if (W == 0 || length_ <= ns + W) continue;  // a global layer, or a ring that never wrapped
    const std::int64_t lost_from = std::max(n - W + 1, ns),
                       lost_to = std::min(length_ - 1 - W, n - 1);  // overwritten, needed
    IL_CHECK(lost_to < lost_from, name_, ": layer ", l, " keeps only its last ", W, " positions; rolling back from ",
             length_, " to ", n, " needs positions ", lost_from, " .. ", lost_to,
             ", already overwritten (a full ring rolls back one position at most)");
  }
  RowCache::truncate(n);
}

std::int64_t RingKVCache::bytes() const {
  if (rings_only_) {
    std::int64_t b = 0;
    for (const Tensor& t : k_) b += 2 * static_cast<std::int64_t>(t.nbytes());
    return b;
  }
  return kv_cache_bytes(config_, layout_, capacity_, static_cast<std::int64_t>(dtype_size(dtype_)));  // 0 once released
}

void RingKVCache::release() {
  k_.clear(), v_.clear();
  capacity_ = length_ = 0;
}

// ---------------------------------------------------------------------------------------------
// The simple way: every position kept, the window a mask.
MaskedKVCache::MaskedKVCache(const TransformerConfig& c, LocalLayout layout, std::int64_t capacity, Device device)
    : models::ContiguousKVCache(c, capacity, device), layout_(std::move(layout)), params_(models::attention_params(c)) {
  IL_CHECK(layout_.layers() == c.num_layers, "masked KV cache: a layout of ", layout_.layers(), " layers for a model of ",
           c.num_layers);
  IL_CHECK(layout_.sinks == 0, "masked KV cache: sink positions are the ring cache's (the attention op's window has none)");
}

void MaskedKVCache::attend(std::int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out) {
  const std::int64_t start = length_, end = end_of_step(k.size(0));
  Tensor K = ContiguousKVCache::k(layer), V = ContiguousKVCache::v(layer);
  K.slice(0, start, end).copy_from(k);
  V.slice(0, start, end).copy_from(v);
  AttentionParams p = params_;
  p.q_offset = start;
  // EXERCISE 06.3 BEGIN: the sliding-window mask
  p.window = layout_.window.at(static_cast<std::size_t>(layer));  // 0: a global layer sees everything
  // EXERCISE 06.3 STUB
  // lab::not_done("06.3", "set the attention op's window (AttentionParams::window) to this layer's W, so that the "
  //                       "query at position p sees keys p - W + 1 .. p; 0, a global layer's, means no window");
  // EXERCISE 06.3 END
  ops::attention(q, K.slice(0, 0, end), V.slice(0, 0, end), out, p);
}

// ---------------------------------------------------------------------------------------------
// Whether the token `d` positions before the last can reach the last position's logits at all:
// its embedding is made NaN (a token id the sequence does not use, the head kept as it was), and
// NaN spreads through every product and sum it enters, however small the attention weight that
// carries it. Only attention moves anything between positions, so the last logits turn NaN
// exactly when some chain of attention hops, each inside its layer's window, links the two.
bool reaches(const LocalModel& m, const std::vector<std::int32_t>& tokens, std::int64_t d) {
  IL_CHECK(d >= 0 && d < static_cast<std::int64_t>(tokens.size()), "reaches: distance ", d, " is outside a sequence of ",
           tokens.size());
  std::int32_t unused = 0;
  while (std::find(tokens.begin(), tokens.end(), unused) != tokens.end()) ++unused;
  IL_CHECK(unused < m.config().vocab_size, "reaches: the sequence uses every token id");
  LocalModel poisoned = m;
  poisoned.base.embed = m.base.embed.clone();
  poisoned.base.lm_head = Linear(m.base.lm_head.weight);  // the original head, tied or not
  float* row = poisoned.base.embed.data<float>() + static_cast<std::int64_t>(unused) * m.config().hidden_size;
  std::fill(row, row + m.config().hidden_size, std::numeric_limits<float>::quiet_NaN());
  auto t = tokens;
  t[t.size() - 1 - static_cast<std::size_t>(d)] = unused;
  RingKVCache cache(m.config(), m.layout, static_cast<std::int64_t>(t.size()));
  const auto logits = forward_cached(poisoned, cache, t).to_double_vector();
  return std::any_of(logits.begin(), logits.end(), [](double x) { return std::isnan(x); });
}

// ---------------------------------------------------------------------------------------------
Tensor forward_cached(const LocalModel& m, models::KVCache& cache, const std::vector<std::int32_t>& tokens,
                      bool all_positions) {
  return models::forward_cached(m.base, cache, tokens, all_positions);
}

models::Generation generate_cached(const LocalModel& m, const std::vector<std::int32_t>& prompt, int max_new,
                                   Sampler& sampler, const std::vector<std::int64_t>& eos_ids,
                                   const models::OnToken& on_token) {
  return models::generate_with_cache(
      m.config().max_position_embeddings, m.base.device(), prompt, max_new, sampler, eos_ids, on_token,
      [&](std::int64_t capacity) { return RingKVCache(m.config(), m.layout, capacity, m.base.device()); },
      [&](RingKVCache& cache, const std::vector<std::int32_t>& feed) { return forward_cached(m, cache, feed); });
}

}  // namespace inferlab::models::local
