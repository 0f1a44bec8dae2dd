#include "chapters/09_quantization/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "chapters/09_quantization/gguf_moe.h"
#include "chapters/09_quantization/quant_impl.h"
#include "common/atomic_file.h"
#include "common/gguf_tokenizer.h"
#include "common/json_file.h"
#include "common/llama2c.h"

namespace inferlab::ch09 {

namespace {

using gguf::Value;

gguf::Type type_of(const QuantSpec& s) {
  if (s.format == Format::Q8_0) return gguf::Type::Q8_0;
  if (s.format == Format::Q4_0) return gguf::Type::Q4_0;
  fail("GGUF: format ", s.name(), " has no GGUF type here (q8_0 and q4_0 do)");
}

// The q/k rows in llama.cpp's order (adjacent pairs) for a model that rotates halves.
QMatrix for_gguf(const QMatrix& w, std::int64_t heads, bool permute) {
  QMatrix q = w.to(Device::CPU);
  if (permute) q.data = permute_rope_rows(q.data, heads, false);
  return q;
}

gguf::Output output(const std::string& name, const QMatrix& w) {
  return {name, type_of(w.spec), {w.rows, w.cols}, w.data.to(Device::CPU)};
}

gguf::Output output(const std::string& name, const Tensor& t) {
  const Tensor f = t.to(Device::CPU).to(DType::F32);
  return {name, gguf::Type::F32, f.shape(), f.view({-1}).to(DType::F32)};
}

// A plain matrix as F32, or as F16 when it is stored in 16 bits (F16 or BF16: written as F16).
gguf::Output plain_output(const std::string& name, const Tensor& w) {
  if (w.dtype() == DType::F32) return output(name, w);
  const Tensor h = w.to(Device::CPU).to(DType::F32).to(DType::F16);
  return {
      name, gguf::Type::F16, h.shape(),
      Tensor::wrap(const_cast<void*>(h.raw_data()), {static_cast<std::int64_t>(h.nbytes())}, DType::U8, Device::CPU, nullptr)
          .clone()};
}

// A projection, packed or plain; q and k rows in llama.cpp's order when `heads` > 0.
gguf::Output output(const std::string& name, const Linear& w, std::int64_t heads = 0, bool permute = false) {
  if (!w.packed) {
    Tensor t = w.weight.to(Device::CPU);
    if (heads > 0 && permute) t = permute_rope_rows(t.contiguous(), heads, false);
    return plain_output(name, t);
  }
  const QMatrix& q = qmatrix(w, "GGUF: " + name);
  return output(name, heads > 0 ? for_gguf(q, heads, permute) : q);
}

}  // namespace

namespace {
// llama.cpp's llama_ftype of a file whose matrices are all like the head.
std::uint32_t file_type(const Linear& head) {
  if (!head.packed) return head.weight.dtype() == DType::F32 ? 0 : 1;          // ALL_F32, MOSTLY_F16
  return qmatrix(head, "GGUF: the head").spec.format == Format::Q8_0 ? 7 : 2;  // MOSTLY_Q8_0, MOSTLY_Q4_0
}
}  // namespace

void save_gguf(const std::string& path, const models::Llama& m, const HfTokenizer& tok) {
  const auto& c = m.config;
  IL_CHECK(c.rope_scaling.is_null(), path, ": ", m.source, " scales its RoPE frequencies (rope_scaling ",
           c.rope_scaling.dump(), "), which this GGUF writer does not record");
  // A model with q/k/v biases is written as llama.cpp's qwen2 (the same blocks with those biases,
  // RoPE over the halves of a head, rows as trained); any other as llama, whose q and k rows
  // llama.cpp expects in adjacent-pair order.
  const bool qwen2 = m.layers.empty() ? false : m.layers[0].wq.bias.defined();
  IL_CHECK(!qwen2 || m.rope_pairing == RopePairing::HalfSplit,
           "GGUF: a model with q/k/v biases is written as qwen2, "
           "whose RoPE rotates the halves of each head; this one pairs adjacent dimensions");
  const std::string arch = c.moe ? gguf_moe_architecture(*c.moe, qwen2) : qwen2 ? "qwen2" : "llama";
  const bool permute = !qwen2 && m.rope_pairing == RopePairing::HalfSplit;
  std::vector<std::pair<std::string, Value>> meta = {
      {"general.architecture", Value::str(arch)},
      {"general.name", Value::str(m.source)},
      {"general.file_type", Value::u32(file_type(m.lm_head))},
      {arch + ".context_length", Value::u32(static_cast<std::uint32_t>(c.max_position_embeddings))},
      {arch + ".embedding_length", Value::u32(static_cast<std::uint32_t>(c.hidden_size))},
      {arch + ".block_count", Value::u32(static_cast<std::uint32_t>(c.num_layers))},
      {arch + ".feed_forward_length", Value::u32(static_cast<std::uint32_t>(c.intermediate_size))},
      {arch + ".rope.dimension_count", Value::u32(static_cast<std::uint32_t>(c.head_dim))},
      {arch + ".attention.head_count", Value::u32(static_cast<std::uint32_t>(c.num_heads))},
      {arch + ".attention.head_count_kv", Value::u32(static_cast<std::uint32_t>(c.num_kv_heads))},
      {arch + ".attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(c.rms_norm_eps))},
      {arch + ".rope.freq_base", Value::f32(static_cast<float>(c.rope_theta))},
  };
  if (c.moe)
    for (auto& kv : gguf_moe_metadata(*c.moe, arch)) meta.push_back(std::move(kv));
  // The tokenizer, as llama.cpp reads it: tokens, types, merges or scores, the pre-tokenizer's
  // name, BOS (common/gguf_tokenizer.h).
  for (auto& kv : gguf::tokenizer_metadata(load_json(tok.path()), tok.path(), c.vocab_size)) meta.push_back(std::move(kv));
  const bool has_bos =
      std::any_of(meta.begin(), meta.end(), [](const auto& kv) { return kv.first == "tokenizer.ggml.bos_token_id"; });
  if (c.bos_token_id && !has_bos)
    meta.emplace_back("tokenizer.ggml.bos_token_id", Value::u32(static_cast<std::uint32_t>(*c.bos_token_id)));
  if (!c.eos_token_ids.empty())
    meta.emplace_back("tokenizer.ggml.eos_token_id", Value::u32(static_cast<std::uint32_t>(c.eos_token_ids[0])));

  std::vector<gguf::Output> ts = {output("token_embd.weight", m.embed)};
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    const std::string b = "blk." + std::to_string(i) + ".";
    IL_CHECK(l.wq.bias.defined() == qwen2 && l.wk.bias.defined() == qwen2 && l.wv.bias.defined() == qwen2 &&
                 !l.wo.bias.defined() && !l.w_gate.bias.defined() && !l.w_up.bias.defined() && !l.w_down.bias.defined(),
             "GGUF: layer ", i, " has biases other than on all of q, k and v (llama and qwen2 have none elsewhere)");
    ts.push_back(output(b + "attn_norm.weight", l.attn_norm));
    ts.push_back(output(b + "attn_q.weight", l.wq, c.num_heads, permute));
    ts.push_back(output(b + "attn_k.weight", l.wk, c.num_kv_heads, permute));
    ts.push_back(output(b + "attn_v.weight", l.wv));
    if (qwen2)
      for (const auto& [n, w] :
           {std::pair{"attn_q.bias", &l.wq}, std::pair{"attn_k.bias", &l.wk}, std::pair{"attn_v.bias", &l.wv}})
        ts.push_back(output(b + n, w->bias));
    ts.push_back(output(b + "attn_output.weight", l.wo));
    ts.push_back(output(b + "ffn_norm.weight", l.mlp_norm));
    if (l.moe.defined()) {  // llama.cpp's layout: the router in F32, each matrix's experts stacked
      const MoeFfn& f = l.moe;
      ts.push_back(output(b + "ffn_gate_inp.weight", f.router.to(Device::CPU, DType::F32).weight));
      for (const auto& [n, pick] :
           {std::pair{"gate", &Expert::gate}, std::pair{"up", &Expert::up}, std::pair{"down", &Expert::down}}) {
        std::vector<gguf::Output> parts;
        for (const Expert& e : f.experts) parts.push_back(output(b + "ffn_" + n + "_exps.weight", e.*pick));
        ts.push_back(stack_experts(b + "ffn_" + n + "_exps.weight", parts));
        if (f.shared.defined()) ts.push_back(output(b + "ffn_" + n + "_shexp.weight", f.shared.*pick));
      }
      if (f.shared_gate.defined())
        ts.push_back(output(b + "ffn_gate_inp_shexp.weight", f.shared_gate.to(Device::CPU, DType::F32).weight));
      continue;
    }
    ts.push_back(output(b + "ffn_gate.weight", l.w_gate));
    ts.push_back(output(b + "ffn_up.weight", l.w_up));
    ts.push_back(output(b + "ffn_down.weight", l.w_down));
  }
  ts.push_back(output("output_norm.weight", m.final_norm));
  ts.push_back(output("output.weight", m.lm_head));  // written even when tied: llama.cpp then uses it
  gguf::write(path, meta, ts);
}

namespace {
// The GGUF carries the model folder's tokenizer.json: a model file (a llama2.c .bin) has none, and
// its bytes used to be parsed as one.
void check_exportable(const std::string& model) {
  IL_CHECK(std::filesystem::is_directory(model), "--model ", model,
           ": export takes a Hugging Face model folder, whose tokenizer.json goes into the GGUF (a llama2.c "
           "checkpoint becomes one with `ch01_naive_decode convert ",
           model, " <folder> --to hf`)");
}
}  // namespace

void export_gguf(const std::string& model, const QuantSpec& spec, const std::string& out) {
  check_exportable(model);
  check_not_input(out, {model});  // before the work, and before the rename would replace the model
  require_writable_file(out, "GGUF");
  const models::Llama m = models::load_llama(model).to(Device::CPU, DType::F32);
  save_gguf(out, quantize_model(m, spec), HfTokenizer::load(model));
}

void export_gguf(const std::string& model, DType plain, const std::string& out) {
  IL_CHECK(plain == DType::F32 || plain == DType::F16, "export: plain matrices are written as f32 or f16, not ",
           dtype_name(plain));
  check_exportable(model);
  check_not_input(out, {model});
  require_writable_file(out, "GGUF");
  save_gguf(out, models::load_llama(model).to(Device::CPU, plain), HfTokenizer::load(model));
}

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

models::Llama load_gguf(const std::string& path) { return load_gguf(gguf::File(path)); }

models::Llama load_gguf(const gguf::File& f) {
  const TransformerConfig c = gguf_config(f);
  const auto w = gguf_windows(f, c);
  IL_CHECK(std::all_of(w.begin(), w.end(), [](std::int64_t x) { return x == 0; }), f.path(), ": ", c.architecture,
           " has sliding-window layers, which chapter 06 runs (ch06_local_attention generate --model ", f.path(),
           "); this chapter would attend to everything");
  return load_gguf_layers(f, w);
}

models::Llama load_gguf_layers(const gguf::File& f, const std::vector<std::int64_t>& windows) {
  const std::string& path = f.path();
  const TransformerConfig c = gguf_config(f);
  IL_CHECK(static_cast<std::int64_t>(windows.size()) == c.num_layers, path, ": ", windows.size(), " windows for ",
           c.num_layers, " layers");
  const gguf::Type qt = f.info("blk.0.attn_q.weight").type;
  const bool plain = qt == gguf::Type::F32 || qt == gguf::Type::F16 || qt == gguf::Type::BF16;
  // Every block type's matrices run packed: chapter 09's products read their bytes.
  auto packed_format = [](gguf::Type t) -> std::optional<Format> {
    for (const auto& [fmt, type] : gguf_formats())
      if (type == t) return fmt;
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
  models::Llama m;
  m.config = c;
  // llama.cpp's llama rotates adjacent pairs (its converter reorders q and k rows to match);
  // qwen2 rotates the two halves of a head, as Hugging Face does, and its rows are as trained.
  m.rope_pairing = c.architecture != "LlamaForCausalLM" ? RopePairing::HalfSplit : RopePairing::Adjacent;
  m.inv_freq = models::rope_frequencies(c);
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
    models::LlamaLayer q;
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

}  // namespace inferlab::ch09
