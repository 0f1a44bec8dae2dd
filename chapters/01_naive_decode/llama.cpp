#include "chapters/01_naive_decode/llama.h"

#include <cmath>
#include <filesystem>
#include <numbers>
#include <random>
#include <set>

#include "common/cuda/backend.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/safetensors.h"

namespace inferlab::ch01 {

// ---------------------------------------------------------------------------------------------
// The forward pass: embed, then per layer attention and MLP with residuals, then the head.
Tensor forward(const Llama& m, const std::vector<std::int32_t>& tokens, bool all_positions) {
  const auto& c = m.config;
  const std::int64_t T = static_cast<std::int64_t>(tokens.size()), N = c.num_heads,
                     K = c.num_kv_heads, H = c.head_dim;
  IL_CHECK(T > 0, "forward: no tokens");
  IL_CHECK(T <= c.max_position_embeddings, "forward: ", T, " tokens is longer than the model's context of ",
           c.max_position_embeddings);
  const Device dev = m.device();
  std::vector<std::int32_t> pos(tokens.size());
  for (std::size_t t = 0; t < pos.size(); ++t) pos[t] = static_cast<std::int32_t>(t);
  const Tensor ids = Tensor::from_vector(tokens, {T}).to(dev), positions = Tensor::from_vector(pos, {T}).to(dev);

  Tensor x = ops::embedding(m.embed, ids);  // [T, D], the residual stream
  for (const LlamaLayer& l : m.layers) {
    // Attention: q, k, v projections, RoPE on q and k, causal attention, output projection.
    Tensor h = ops::rmsnorm(x, l.attn_norm, static_cast<float>(c.rms_norm_eps));
    Tensor q = ops::matmul(h, l.wq), k = ops::matmul(h, l.wk), v = ops::matmul(h, l.wv);
    if (l.bq.defined()) ops::add(q, l.bq, q), ops::add(k, l.bk, k), ops::add(v, l.bv, v);
    q = q.view({T, N, H}), k = k.view({T, K, H}), v = v.view({T, K, H});
    ops::rope(q, positions, m.inv_freq, m.rope_pairing);
    ops::rope(k, positions, m.inv_freq, m.rope_pairing);
    Tensor a = ops::attention(q, k, v);  // every position sees itself and the ones before it
    ops::add(x, ops::matmul(a.view({T, N * H}), l.wo), x);
    // MLP: down(silu(gate(h)) * up(h)).
    h = ops::rmsnorm(x, l.mlp_norm, static_cast<float>(c.rms_norm_eps));
    ops::add(x, ops::matmul(ops::swiglu(ops::matmul(h, l.w_gate), ops::matmul(h, l.w_up)), l.w_down), x);
  }
  if (!all_positions) x = x.slice(0, T - 1, T);
  return ops::matmul(ops::rmsnorm(x, m.final_norm, static_cast<float>(c.rms_norm_eps)), m.lm_head);
}

// ---------------------------------------------------------------------------------------------
// Loading.
Tensor rope_frequencies(const TransformerConfig& c) {
  Tensor f = rope_inv_freq(c.head_dim, c.rope_theta);
  if (c.rope_scaling.is_null()) return f;
  JsonFields s(c.rope_scaling, "rope_scaling");
  const std::string type = s.get_or<std::string>("rope_type", s.get_or<std::string>("type", ""));
  float* p = f.data<float>();
  if (type == "default") return f;
  if (type == "linear") {
    const double factor = s.get<double>("factor");
    for (std::int64_t j = 0; j < f.numel(); ++j) p[j] = static_cast<float>(p[j] / factor);
    return f;
  }
  IL_CHECK(type == "llama3", "rope_scaling type '", type, "' is not supported (default, linear, llama3)");
  // Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between
  // interpolated smoothly.
  const double factor = s.get<double>("factor"), lo = s.get<double>("low_freq_factor"),
               hi = s.get<double>("high_freq_factor"), old_ctx = s.get<double>("original_max_position_embeddings");
  const double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
  for (std::int64_t j = 0; j < f.numel(); ++j) {
    const double inv = p[j], wavelen = 2 * std::numbers::pi / inv;
    double out = inv;
    if (wavelen > lo_wavelen) {
      out = inv / factor;
    } else if (wavelen >= hi_wavelen) {
      const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
      out = (1 - smooth) * inv / factor + smooth * inv;
    }
    p[j] = static_cast<float>(out);
  }
  return f;
}

namespace {

// Builds a Llama from a tensor getter that speaks Hugging Face names.
template <class Get, class Has>
Llama assemble(const TransformerConfig& c, Get get, Has has) {
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, Q = c.num_heads * c.head_dim,
                     KV = c.num_kv_heads * c.head_dim;
  Llama m;
  m.config = c;
  m.inv_freq = rope_frequencies(c);
  m.embed = get("model.embed_tokens.weight", Shape{c.vocab_size, D});
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LlamaLayer l;
    l.attn_norm = get(p + "input_layernorm.weight", Shape{D});
    l.wq = get(p + "self_attn.q_proj.weight", Shape{Q, D});
    l.wk = get(p + "self_attn.k_proj.weight", Shape{KV, D});
    l.wv = get(p + "self_attn.v_proj.weight", Shape{KV, D});
    l.wo = get(p + "self_attn.o_proj.weight", Shape{D, Q});
    if (c.attention_bias) {
      // Biases are added to f32 activations: keep them in f32 whatever the checkpoint's dtype.
      l.bq = get(p + "self_attn.q_proj.bias", Shape{Q}).to(DType::F32);
      l.bk = get(p + "self_attn.k_proj.bias", Shape{KV}).to(DType::F32);
      l.bv = get(p + "self_attn.v_proj.bias", Shape{KV}).to(DType::F32);
    }
    l.mlp_norm = get(p + "post_attention_layernorm.weight", Shape{D});
    l.w_gate = get(p + "mlp.gate_proj.weight", Shape{F, D});
    l.w_up = get(p + "mlp.up_proj.weight", Shape{F, D});
    l.w_down = get(p + "mlp.down_proj.weight", Shape{D, F});
    m.layers.push_back(l);
  }
  m.final_norm = get("model.norm.weight", Shape{D});
  m.lm_head = c.tie_word_embeddings || !has("lm_head.weight") ? m.embed : get("lm_head.weight", Shape{c.vocab_size, D});
  return m;
}

}  // namespace

bool llama_family(const std::string& arch) {
  for (const char* a : {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "InternLM2ForCausalLM"})
    if (arch == a) return true;
  return false;
}

Llama load_llama(const std::string& path) {
  namespace fs = std::filesystem;
  IL_CHECK(fs::exists(path), "cannot open model ", path, ": no such file or folder");
  if (fs::is_regular_file(path) && fs::path(path).extension() == ".bin") {
    const Llama2cCheckpoint ck = load_llama2c(path);
    auto get = [&](const std::string& name, const Shape& s) {
      auto it = ck.tensors.find(name);
      IL_CHECK(it != ck.tensors.end() && it->second.shape() == s, path, ": tensor ", name, " missing or misshapen");
      return it->second;
    };
    Llama m = assemble(ck.config, get, [&](const std::string& n) { return ck.tensors.count(n) > 0; });
    m.rope_pairing = RopePairing::Adjacent;  // llama2.c rotates (2j, 2j+1)
    m.source = path;
    return m;
  }
  const HfConfig hf = load_hf_config(path);
  const std::string arch = hf.architecture();
  IL_CHECK(llama_family(arch), hf.path, ": architecture '", arch,
           "' is not a Llama-family decoder this chapter can run (LlamaForCausalLM, MistralForCausalLM, "
           "Qwen2ForCausalLM)");
  const TransformerConfig c = parse_transformer_config(hf);
  const JsonFields fields(hf.json, hf.path);
  if (arch == "MistralForCausalLM" && fields.has("sliding_window"))
    IL_CHECK(fields.get<std::int64_t>("sliding_window") >= c.max_position_embeddings, hf.path,
             ": this Mistral uses a sliding window of ", hf.json["sliding_window"].dump(),
             " tokens, which chapter 06 implements; chapter 01 would silently attend to everything");
  const Checkpoint ck(fs::is_directory(path) ? path : fs::path(path).parent_path().string());
  std::set<std::string> used;
  Llama m = assemble(c, [&](const std::string& n, const Shape& s) { return used.insert(n), ck.get(n, s); },
                     [&](const std::string& n) { return ck.contains(n); });
  // A tensor the config does not account for means the two disagree (e.g. num_hidden_layers
  // smaller than the checkpoint's layers): running would silently use part of the model.
  for (const std::string& n : ck.names())
    IL_CHECK(used.count(n) || n.find("rotary_emb.inv_freq") != std::string::npos ||
                 (n == "lm_head.weight" && c.tie_word_embeddings),  // tied: transformers ignores it too
             ck.path(), ": tensor '", n,
             "' is not part of the model that ", hf.path, " describes (does num_hidden_layers match the checkpoint?)");
  m.source = path;
  return m;
}

Llama random_llama(const TransformerConfig& c, std::uint64_t seed, DType dtype, Device device) {
  std::mt19937_64 rng(seed);
  auto fill = [&](Shape s, DType d, float lo, float hi) {
    if (device == Device::CUDA) {
      Tensor t = Tensor::empty(s, d, Device::CUDA);
      cuda::fill_uniform(t, rng(), lo, hi);
      return t;
    }
    std::uniform_real_distribution<float> dist(lo, hi);
    Tensor t = Tensor::empty(s, DType::F32);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    return d == DType::F32 ? t : t.to(d);
  };
  auto mat = [&](std::int64_t out, std::int64_t in) {
    const float a = 1.0f / std::sqrt(static_cast<float>(in));
    return fill({out, in}, dtype, -a, a);
  };
  auto norm = [&](std::int64_t n) { return fill({n}, DType::F32, 0.8f, 1.2f); };
  auto bias = [&](std::int64_t n) { return fill({n}, DType::F32, -0.1f, 0.1f); };
  const std::int64_t D = c.hidden_size, F = c.intermediate_size, Q = c.num_heads * c.head_dim,
                     KV = c.num_kv_heads * c.head_dim;
  Llama m;
  m.config = c;
  m.inv_freq = rope_frequencies(c).to(device);
  m.embed = mat(c.vocab_size, D);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    LlamaLayer l;
    l.attn_norm = norm(D), l.mlp_norm = norm(D);
    l.wq = mat(Q, D), l.wk = mat(KV, D), l.wv = mat(KV, D), l.wo = mat(D, Q);
    if (c.attention_bias) l.bq = bias(Q), l.bk = bias(KV), l.bv = bias(KV);
    l.w_gate = mat(F, D), l.w_up = mat(F, D), l.w_down = mat(D, F);
    m.layers.push_back(l);
  }
  m.final_norm = norm(D);
  m.lm_head = c.tie_word_embeddings ? m.embed : mat(c.vocab_size, D);
  m.source = "random weights, seed " + std::to_string(seed);
  return m;
}

std::int64_t Llama::weight_bytes() const {
  std::int64_t n = static_cast<std::int64_t>(embed.nbytes() + final_norm.nbytes());
  if (lm_head.raw_data() != embed.raw_data()) n += static_cast<std::int64_t>(lm_head.nbytes());
  for (const auto& l : layers)
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.mlp_norm, &l.w_gate,
                            &l.w_up, &l.w_down})
      if (t->defined()) n += static_cast<std::int64_t>(t->nbytes());
  return n;
}

Llama Llama::to(Device device, DType dtype) const {
  auto mat = [&](const Tensor& t) { return t.defined() ? t.to(dtype).to(device) : t; };
  auto f32 = [&](const Tensor& t) { return t.defined() ? t.to(DType::F32).to(device) : t; };
  Llama m = *this;
  m.inv_freq = f32(inv_freq);
  m.embed = mat(embed);
  m.final_norm = f32(final_norm);
  m.lm_head = lm_head.raw_data() == embed.raw_data() ? m.embed : mat(lm_head);
  for (auto& l : m.layers) {
    l.attn_norm = f32(l.attn_norm), l.mlp_norm = f32(l.mlp_norm);
    l.wq = mat(l.wq), l.wk = mat(l.wk), l.wv = mat(l.wv), l.wo = mat(l.wo);
    l.bq = f32(l.bq), l.bk = f32(l.bk), l.bv = f32(l.bv);
    l.w_gate = mat(l.w_gate), l.w_up = mat(l.w_up), l.w_down = mat(l.w_down);
  }
  return m;
}

}  // namespace inferlab::ch01
