#include "common/models/gguf_llama.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "common/gguf_tokenizer.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/models/gguf_moe.h"
#include "common/quant/interleaved_matrix.h"
#include "common/quant/qmatrix_impl.h"

namespace inferlab::models {

using namespace quant;

namespace {
// What llama.cpp's gemma2 and gemma3 read besides llama's keys (src/models/gemma2.cpp, gemma3.cpp),
// with its defaults: soft caps (gemma2: 50 and 30), the embedding scale √D in float32, RMSNorm
// weights stored with Gemma's + 1 already added (the converter adds it), and an attention scale
// the file does not carry: 1/√head_dim, but 1/√(D / heads) for the 27B models (46 and 62 layers),
// as Gemma's query_pre_attn_scalar is.
void gemma_config(const gguf::File& f, const std::string& k, TransformerConfig& c) {
  const bool v2 = k == "gemma2.";
  auto cap = [&](const std::string& key, double fallback) {
    const double v = f.has(k + key) ? f.get_float(k + key) : fallback;
    IL_CHECK(std::isfinite(v) && v >= 0, f.path(), ": metadata '", k, key, "' = ", v, " must be 0 (none) or positive");
    return v;
  };
  c.post_norms = true;
  c.hidden_act = "gelu_pytorch_tanh";
  c.embed_scale = std::sqrt(static_cast<float>(c.hidden_size));
  c.attn_logit_softcapping = v2 ? cap("attn_logit_softcapping", 50) : 0;  // llama.cpp's gemma3 applies none
  c.final_logit_softcapping = cap("final_logit_softcapping", v2 ? 30 : 0);
  const bool big = c.num_layers == (v2 ? 46 : 62);
  c.query_pre_attn_scalar = static_cast<double>(big ? c.hidden_size / c.num_heads : c.head_dim);
  if (!v2) c.rope_local_base_freq = f.has(k + "rope.freq_base_swa") ? f.get_float(k + "rope.freq_base_swa") : 10000;
}
}  // namespace

std::vector<std::int64_t> gguf_windows(const gguf::File& f, const TransformerConfig& c) {
  const std::string& arch = f.get_string("general.architecture");
  std::vector<std::int64_t> w(static_cast<std::size_t>(c.num_layers), 0);
  if (arch != "gemma2" && arch != "gemma3") return w;
  const std::string key = arch + ".attention.sliding_window", pattern = arch + ".attention.sliding_window_pattern";
  // gemma3 without a window is all global (llama.cpp's LLAMA_SWA_TYPE_NONE); gemma2's default is 4096.
  const std::int64_t W = f.has(key) ? f.get_int(key) : (arch == "gemma2" ? 4096 : 0);
  IL_CHECK(W >= 0 && W < (std::int64_t{1} << 30), f.path(), ": metadata '", key, "' = ", W, " is not a window");
  if (W == 0) return w;
  // llama.cpp's pattern: n means layer i is local unless i % n == n - 1 (gemma2: 2, gemma3: 6), or
  // one boolean per layer (true: local).
  if (f.has(pattern) && f.get(pattern).kind == gguf::Value::Kind::Array) {
    const auto& items = f.get(pattern).items;
    IL_CHECK(static_cast<std::int64_t>(items.size()) == c.num_layers, f.path(), ": metadata '", pattern, "' has ",
             items.size(), " entries for ", c.num_layers, " layers");
    for (std::size_t i = 0; i < items.size(); ++i) w[i] = items[i].i ? W : 0;
    return w;
  }
  const std::int64_t n = f.has(pattern) ? f.get_int(pattern) : (arch == "gemma2" ? 2 : 6);
  IL_CHECK(n >= 1 && n <= c.num_layers + 1, f.path(), ": metadata '", pattern, "' = ", n, " must be in [1, ",
           c.num_layers + 1, "]");
  for (std::int64_t i = 0; i < c.num_layers; ++i) w[static_cast<std::size_t>(i)] = i % n < n - 1 ? W : 0;
  return w;
}

TransformerConfig gguf_config(const gguf::File& f) {
  const std::string& arch = f.get_string("general.architecture");
  // qwen2 is llama with biases on q, k and v and RoPE over the two halves of a head (llama.cpp's
  // NEOX pairing, the Hugging Face order): the same blocks, read under their own key prefix; so
  // are qwen3 (per-head q/k norms instead of biases), gemma2 and gemma3 (gemma_config below).
  // qwen2moe is qwen2 with mixture-of-experts layers (gguf_moe.h), as llama with expert tensors is Mixtral.
  IL_CHECK(
      arch == "llama" || arch == "qwen2" || arch == "qwen2moe" || arch == "qwen3" || arch == "gemma2" || arch == "gemma3",
      f.path(), ": architecture '", arch, "' is not llama, qwen2, qwen2moe, qwen3, gemma2 or gemma3", where_gguf_runs(arch));
  const std::string k = arch + ".";
  // Counts are checked before anything divides by them or loops over them.
  auto count = [&](const std::string& key) {
    const std::int64_t v = f.get_int(key);
    IL_CHECK(v > 0 && v < (std::int64_t{1} << 24), f.path(), ": metadata '", key, "' = ", v,
             " is not a plausible count (must be in [1, 2^24))");
    return v;
  };
  auto positive = [&](const std::string& key) {
    const double v = f.get_float(key);
    IL_CHECK(std::isfinite(v) && v > 0, f.path(), ": metadata '", key, "' = ", v, " must be a finite number above 0");
    return v;
  };
  TransformerConfig c;
  c.architecture = arch == "qwen2"      ? "Qwen2ForCausalLM"
                   : arch == "qwen2moe" ? "Qwen2MoeForCausalLM"
                   : arch == "qwen3"    ? "Qwen3ForCausalLM"
                   : arch == "gemma2"   ? "Gemma2ForCausalLM"
                   : arch == "gemma3"   ? "Gemma3ForCausalLM"
                                        : "LlamaForCausalLM";
  c.attention_bias = arch == "qwen2" || arch == "qwen2moe";
  c.qk_norm = arch == "qwen3" || arch == "gemma3";
  c.hidden_size = count(k + "embedding_length");
  c.intermediate_size = count(k + "feed_forward_length");
  c.num_layers = count(k + "block_count");
  c.num_heads = count(k + "attention.head_count");
  c.num_kv_heads = f.has(k + "attention.head_count_kv") ? count(k + "attention.head_count_kv") : c.num_heads;
  if (f.has(k + "attention.key_length")) {  // llama.cpp's explicit head size
    c.head_dim = count(k + "attention.key_length");
    IL_CHECK(!f.has(k + "attention.value_length") || count(k + "attention.value_length") == c.head_dim, f.path(),
             ": metadata '", k, "attention.value_length' differs from '", k, "attention.key_length' (not supported)");
  } else {
    IL_CHECK(c.hidden_size % c.num_heads == 0, f.path(), ": '", k, "embedding_length' ", c.hidden_size,
             " is not a multiple of '", k, "attention.head_count' ", c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  // RoPE here rotates the whole head; a model rotating part of it would run silently wrong.
  if (f.has(k + "rope.dimension_count"))
    IL_CHECK(count(k + "rope.dimension_count") == c.head_dim, f.path(), ": metadata '", k,
             "rope.dimension_count' = ", f.get_int(k + "rope.dimension_count"), " but the heads have ", c.head_dim,
             " dimensions (partial RoPE is not supported)");
  c.max_position_embeddings = count(k + "context_length");
  c.rms_norm_eps = positive(k + "attention.layer_norm_rms_epsilon");
  c.rope_theta = f.has(k + "rope.freq_base") ? positive(k + "rope.freq_base") : 10000.0;
  const auto& embd = f.info("token_embd.weight");
  IL_CHECK(embd.shape.size() == 2, f.path(), ": tensor token_embd.weight has shape ", shape_str(embd.shape),
           ", expected [vocab, ", c.hidden_size, "]");
  c.vocab_size = embd.shape[0];
  c.tie_word_embeddings = !f.contains("output.weight");
  auto token = [&](const std::string& key) {
    const std::int64_t id = f.get_int(key);
    IL_CHECK(id >= 0 && id < c.vocab_size, f.path(), ": metadata '", key, "' = ", id, " is outside the vocabulary [0, ",
             c.vocab_size, ")");
    return id;
  };
  if (f.has("tokenizer.ggml.bos_token_id")) c.bos_token_id = token("tokenizer.ggml.bos_token_id");
  if (f.has("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {token("tokenizer.ggml.eos_token_id")};
  if (arch == "gemma2" || arch == "gemma3") gemma_config(f, k, c);
  // Linear RoPE scaling (Gemma 3's global layers) divides every frequency by the factor.
  const bool linear = f.has(k + "rope.scaling.type") && f.get_string(k + "rope.scaling.type") == "linear";
  if (linear) c.rope_scaling = {{"rope_type", "linear"}, {"factor", positive(k + "rope.scaling.factor")}};
  // Other scaled RoPE (Llama 3.1's frequency factors, YaRN scaling) would run with the wrong
  // frequencies here: refuse it rather than generate from a different model.
  const bool scaled = f.has(k + "rope.scaling.type") && f.get_string(k + "rope.scaling.type") != "none" && !linear;
  IL_CHECK(!scaled, f.path(), ": the model scales its RoPE frequencies (", k, "rope.scaling.type '",
           scaled ? f.get_string(k + "rope.scaling.type") : "", "'), which this loader does not implement (linear, and ",
           "llama3's factors in rope_freqs.weight, it does)");
  // The project's shared rules (KV heads dividing heads, an even head_dim, size limits), whose
  // messages use config.json's field names.
  c.validate(f.path() + " (" + arch + ".* metadata, named as in a config.json)");
  c.moe = gguf_moe_config(f, arch, c.num_layers, c.intermediate_size);
  return c;
}

Llama load_gguf(const std::string& path) { return load_gguf(gguf::File(path)); }

Llama load_gguf(const gguf::File& f) {
  const TransformerConfig c = gguf_config(f);
  const auto w = gguf_windows(f, c);
  IL_CHECK(std::all_of(w.begin(), w.end(), [](std::int64_t x) { return x == 0; }), f.path(), ": ", c.architecture,
           " has sliding-window layers, which chapter 06 runs (ch06_local_attention generate --model ", f.path(),
           "); this chapter would attend to everything");
  return load_gguf_layers(f, w);
}

Llama load_gguf_layers(const gguf::File& f, const std::vector<std::int64_t>& windows) {
  const std::string& path = f.path();
  const TransformerConfig c = gguf_config(f);
  IL_CHECK(static_cast<std::int64_t>(windows.size()) == c.num_layers, path, ": ", windows.size(), " windows for ",
           c.num_layers, " layers");
  const gguf::Type qt = f.info("blk.0.attn_q.weight").type;
  const bool plain = qt == gguf::Type::F32 || qt == gguf::Type::F16 || qt == gguf::Type::BF16;
  // Every block type's matrices run packed: chapter 09's products read their bytes.
  auto packed_format = [](gguf::Type t) -> std::optional<Format> {
    if (blocks_activations(t)) return t;  // a block type is its format
    return std::nullopt;
  };
  // A packed matrix, its scales checked first (a NaN scale would decode as NaN).
  auto packed = [&](const std::string& name, Format fmt, std::int64_t rows, std::int64_t cols) {
    check_block_scales(f.raw(name), fmt, path + ": tensor " + name);
    return std::make_shared<QMatrix>(QuantSpec{fmt}, rows, cols, f.raw(name).clone());
  };
  IL_CHECK(plain || packed_format(qt), path, ": projections are ", gguf::type_name(qt),
           "; this loader reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL and IQ4_XS models");
  std::set<std::string> used;
  // Anything failing while a tensor is read (a conversion, an allocation) names the file and it.
  auto dense = [&](const std::string& name, const Shape& s) {
    return with_context(path + ": tensor " + name, [&] {
      const auto& i = f.info(name);
      used.insert(name);
      IL_CHECK(i.shape == s, path, ": tensor ", name, " has shape ", shape_str(i.shape), ", expected ", shape_str(s));
      if (i.type == gguf::Type::F32 || i.type == gguf::Type::F16 || i.type == gguf::Type::BF16)
        return check_finite(f.tensor(name).to(DType::F32), path + ": tensor " + name);
      IL_CHECK(packed_format(i.type) && s.size() == 2, path, ": tensor ", name, " is ", gguf::type_name(i.type),
               shape_str(s), "; this loader reads F32, F16 and BF16 vectors and matrices of its block types");
      return dequantize(*packed(name, *packed_format(i.type), s[0], s[1]));
    });
  };
  auto matrix = [&](const std::string& name, std::int64_t rows, std::int64_t cols) {
    return with_context(path + ": tensor " + name, [&] {
      const auto& i = f.info(name);
      used.insert(name);
      // Q4_K_M and its kin mix types across tensors (Q6_K for some, Q4_K for the rest; Q8_0 in
      // small ones): each matrix runs in its own type.
      const bool plain_type = i.type == gguf::Type::F32 || i.type == gguf::Type::F16 || i.type == gguf::Type::BF16;
      IL_CHECK(i.shape == Shape({rows, cols}) && (plain_type || packed_format(i.type)), path, ": tensor ", name, " is ",
               gguf::type_name(i.type), shape_str(i.shape), ", expected a matrix ", shape_str(Shape{rows, cols}));
      // A plain matrix runs in its stored type (the products widen 16-bit weights as they read them).
      if (plain_type) return Linear(check_finite(f.tensor(name).clone(), path + ": tensor " + name));
      return Linear(packed(name, *packed_format(i.type), rows, cols));
    });
  };
  Llama m;
  m.config = c;
  // llama.cpp's llama rotates adjacent pairs (its converter reorders q and k rows to match);
  // qwen2 rotates the two halves of a head, as Hugging Face does, and its rows are as trained.
  m.rope_pairing = c.architecture != "LlamaForCausalLM" ? RopePairing::HalfSplit : RopePairing::Adjacent;
  m.inv_freq = rope_frequencies(c);
  // Llama 3's scaling as llama.cpp stores it: one factor per pair that divides its frequency
  // (the converter computes them from rope_scaling's llama3 fields, as transformers does).
  if (f.contains("rope_freqs.weight")) {
    const Tensor factors = dense("rope_freqs.weight", {c.head_dim / 2});
    for (std::int64_t j = 0; j < c.head_dim / 2; ++j) {
      const float s = factors.data<float>()[j];
      IL_CHECK(s > 0, path, ": tensor rope_freqs.weight: factor ", j, " is ", s, ", not positive");
      m.inv_freq.data<float>()[j] /= s;
    }
  }
  // Gemma 3's local layers rotate with a base of their own, unscaled.
  const Tensor local_freq = c.rope_local_base_freq > 0 ? rope_inv_freq(c.head_dim, c.rope_local_base_freq) : Tensor{};
  m.embed = dense("token_embd.weight", {c.vocab_size, c.hidden_size});
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, Q = c.num_heads * c.head_dim,
                     KV = c.num_kv_heads * c.head_dim;
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LlamaLayer q;
    q.attn_norm = dense(b + "attn_norm.weight", {D}), q.mlp_norm = dense(b + "ffn_norm.weight", {D});
    q.wq = matrix(b + "attn_q.weight", Q, D), q.wk = matrix(b + "attn_k.weight", KV, D);
    q.wv = matrix(b + "attn_v.weight", KV, D), q.wo = matrix(b + "attn_output.weight", D, Q);
    if (c.attention_bias) {  // qwen2: q, k and v have biases
      q.wq.bias = dense(b + "attn_q.bias", {Q}), q.wk.bias = dense(b + "attn_k.bias", {KV});
      q.wv.bias = dense(b + "attn_v.bias", {KV});
    }
    if (c.moe && c.moe->is_moe_layer(l)) {
      q.moe = read_gguf_moe(f, *c.moe, D, l, used);
    } else {
      q.w_gate = matrix(b + "ffn_gate.weight", F, D), q.w_up = matrix(b + "ffn_up.weight", F, D);
      q.w_down = matrix(b + "ffn_down.weight", D, F);
    }
    if (c.qk_norm) {  // qwen3, gemma3
      q.q_norm = dense(b + "attn_q_norm.weight", {c.head_dim}), q.k_norm = dense(b + "attn_k_norm.weight", {c.head_dim});
    }
    if (c.post_norms) {  // gemma2, gemma3: ffn_norm is the one before the MLP
      q.post_attn_norm = dense(b + "post_attention_norm.weight", {D}),
      q.post_mlp_norm = dense(b + "post_ffw_norm.weight", {D});
    }
    q.geglu = c.hidden_act == "gelu_pytorch_tanh";
    if (local_freq.defined() && windows[static_cast<std::size_t>(l)] > 0) q.inv_freq = local_freq;
    m.layers.push_back(std::move(q));
  }
  m.final_norm = dense("output_norm.weight", {D});
  // A tied head is the embedding table in the type it is stored in (llama.cpp's Q4_0 files keep
  // token_embd as Q8_0): re-quantising it to the projections' type would run another model.
  if (f.contains("output.weight")) {
    m.lm_head = matrix("output.weight", c.vocab_size, D);
  } else {
    const auto& e = f.info("token_embd.weight");
    if (packed_format(e.type)) {
      m.lm_head = Linear(packed("token_embd.weight", *packed_format(e.type), c.vocab_size, D));
    } else {
      m.lm_head = Linear(m.embed);
    }
  }
  // A tensor left over means the metadata and the tensors disagree (a block_count below the
  // layers present would run part of the model).
  for (const auto& t : f.tensors())
    IL_CHECK(used.count(t.name), path, ": tensor '", t.name, "' is not part of the model the llama.* metadata describes",
             " (llama.block_count = ", c.num_layers, ")");
  m.source = path;
  return m;
}

std::unique_ptr<Tokenizer> gguf_tokenizer(const gguf::File& f, const std::string& explicit_path,
                                          const std::string& default_model) {
  const TransformerConfig c = gguf_config(f);
  if (!explicit_path.empty()) {
    auto tok = Tokenizer::load(explicit_path);
    check_tokenizer_vocab(*tok, c.vocab_size, f.path());
    return tok;
  }
  if (f.has("tokenizer.ggml.model")) {  // the file's own tokenizer
    auto tok = gguf::tokenizer(f);
    check_tokenizer_vocab(*tok, c.vocab_size, f.path());
    return tok;
  }
  auto tok = Tokenizer::for_model(default_model);
  IL_CHECK(tok->vocab_size() == c.vocab_size, f.path(), " has no tokenizer of its own (tokenizer.ggml.*) and ", c.vocab_size,
           " embedding rows, not the ", tok->vocab_size(), " tokens of ", tok->path(),
           "; pass the model's own tokenizer with --tokenizer");
  return tok;
}

void interleave_blocks(Llama& m, int* count) {
  int n = 0;
  auto swap = [&](Linear& l) {
    const auto* q = dynamic_cast<const QMatrix*>(l.packed.get());
    if (q == nullptr || !interleavable(*q)) return;
    l.packed = std::make_shared<InterleavedMatrix>(*q);
    ++n;
  };
  for (auto& layer : m.layers)
    for (Linear* w : layer.linears()) swap(*w);
  swap(m.lm_head);
  if (count) *count = n;
}

}  // namespace inferlab::models
