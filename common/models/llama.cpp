#include "common/models/llama.h"

#include "common/models/hf_weights.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <numbers>
#include <random>
#include <set>

#include "common/cuda/backend.h"
#include "common/json_file.h"
#include "common/llama2c.h"
#include "common/safetensors.h"

namespace inferlab::models {

// ---------------------------------------------------------------------------------------------
// The blocks.
Tensor embed(const Llama& m, const std::vector<std::int32_t>& tokens) {
  Tensor x = ops::embedding(m.embed, Tensor::from_vector(tokens, {static_cast<std::int64_t>(tokens.size())}).to(m.device()));
  if (m.config.embed_scale != 1.0) ops::scale(x, static_cast<float>(m.config.embed_scale));  // Gemma's √D
  return x;
}

Tensor norm(const Llama& m, const Tensor& x, const Tensor& w) {
  return ops::rmsnorm(x, w, static_cast<float>(m.config.rms_norm_eps));
}

Tensor post_norm(const Llama& m, const Tensor& y, const Tensor& w) { return w.defined() ? norm(m, y, w) : y; }

void head_norm(const Llama& m, Tensor& x, const Tensor& w) {
  if (w.defined()) x = norm(m, x, w);  // over the last dimension, H: each head on its own
}

const Tensor& rope_freqs(const Llama& m, const LlamaLayer& l) { return l.inv_freq.defined() ? l.inv_freq : m.inv_freq; }

AttentionParams attention_params(const TransformerConfig& c) {
  AttentionParams p;
  if (c.query_pre_attn_scalar > 0) p.scale = static_cast<float>(1.0 / std::sqrt(c.query_pre_attn_scalar));
  p.softcap = static_cast<float>(c.attn_logit_softcapping);
  return p;
}

Tensor positions(const Llama& m, std::int64_t begin, std::int64_t T) {
  IL_CHECK(T > 0, "forward: no tokens");
  IL_CHECK(begin + T <= m.config.max_position_embeddings, "forward: positions up to ", begin + T,
           " are beyond the model's context of ", m.config.max_position_embeddings);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(begin + t);
  return Tensor::from_vector(pos, {T}).to(m.device());
}

Tensor mlp_block(const LlamaLayer& l, const Tensor& h) {
  if (l.moe.defined()) return moe_block(l.moe, h);                       // k of E experts per row
  const std::vector<Tensor> gate_up = linears(h, {&l.w_gate, &l.w_up});  // one pass over h for both
  const Tensor &gate = gate_up[0], &up = gate_up[1];
  return linear(l.geglu ? ops::geglu(gate, up) : ops::swiglu(gate, up), l.w_down);
}

Tensor head(const Llama& m, const Tensor& x) {
  Tensor logits = linear(norm(m, x, m.final_norm), m.lm_head);
  if (m.config.final_logit_softcapping > 0) ops::softcap(logits, static_cast<float>(m.config.final_logit_softcapping));
  return logits;
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
template <class Get>
Llama assemble(const TransformerConfig& c, Get get) {
  const std::int64_t D = c.hidden_size, Q = c.num_heads * c.head_dim, KV = c.num_kv_heads * c.head_dim;
  Llama m = read_decoder(c, get, [&](const std::string& p, std::int64_t, LlamaLayer& l) {
    l.wq = get(p + "self_attn.q_proj.weight", Shape{Q, D});
    l.wk = get(p + "self_attn.k_proj.weight", Shape{KV, D});
    l.wv = get(p + "self_attn.v_proj.weight", Shape{KV, D});
    l.wo = get(p + "self_attn.o_proj.weight", Shape{D, Q});
    if (c.attention_bias) {
      // Biases are added to f32 activations: keep them in f32 whatever the checkpoint's dtype.
      l.wq.bias = get(p + "self_attn.q_proj.bias", Shape{Q}).to(DType::F32);
      l.wk.bias = get(p + "self_attn.k_proj.bias", Shape{KV}).to(DType::F32);
      l.wv.bias = get(p + "self_attn.v_proj.bias", Shape{KV}).to(DType::F32);
    }
    if (c.attention_out_bias) l.wo.bias = get(p + "self_attn.o_proj.bias", Shape{D}).to(DType::F32);
    if (c.qk_norm) {  // Qwen3: one RMSNorm weight over head_dim, shared by every head
      l.q_norm = get(p + "self_attn.q_norm.weight", Shape{c.head_dim});
      l.k_norm = get(p + "self_attn.k_norm.weight", Shape{c.head_dim});
    }
  });
  m.inv_freq = rope_frequencies(c);
  return m;
}

}  // namespace

bool llama_family(const std::string& arch) {
  for (const char* a :
       {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "InternLM2ForCausalLM"})
    if (arch == a) return true;
  return false;
}

Llama load_llama(const std::string& path) {
  namespace fs = std::filesystem;
  IL_CHECK(fs::exists(path), "cannot open model ", path, ": no such file or folder");
  if (!fs::is_directory(path) && fs::path(path).extension() == ".bin") {
    const Llama2cCheckpoint ck = load_llama2c(path);
    auto get = [&](const std::string& name, const Shape& s) {
      auto it = ck.tensors.find(name);
      IL_CHECK(it != ck.tensors.end() && it->second.shape() == s, path, ": tensor ", name, " missing or misshapen");
      return check_finite(it->second, path + ": tensor " + name);
    };
    Llama m = assemble(ck.config, get);
    m.rope_pairing = RopePairing::Adjacent;  // llama2.c rotates (2j, 2j+1)
    m.source = path;
    return m;
  }
  const HfConfig hf = load_hf_config(path);
  const std::string arch = hf.architecture();
  IL_CHECK(!arch.empty(), hf.path,
           ": field 'architectures' must be a list whose first entry names the model class "
           "(e.g. [\"LlamaForCausalLM\"]), got ",
           hf.json.contains("architectures") ? hf.json["architectures"].dump() : "nothing");
  IL_CHECK(arch != "MinistralForCausalLM", hf.path,
           ": MinistralForCausalLM has sliding-window layers, which chapter 06 "
           "implements (ch06_local_attention); chapter 01 would attend to everything");
  IL_CHECK(arch != "InferLabMDLMForMaskedDiffusion", hf.path,
           ": a masked-diffusion denoiser (bidirectional, no causal "
           "mask), which chapter 08 runs (ch08_diffusion_lm); chapter 01 would decode it left to right");
  IL_CHECK(arch != "DeepseekV2ForCausalLM" && arch != "DeepseekV3ForCausalLM", hf.path, ": architecture '", arch,
           "' has multi-head latent attention (and mixture-of-experts layers), which chapter 01 does not implement",
           where_it_runs(arch));
  IL_CHECK(!gemma_family(arch), hf.path, ": ", arch,
           " interleaves sliding-window and global layers, which chapter 01 would not window", where_it_runs(arch));
  IL_CHECK(llama_family(arch) || moe_llama_family(arch), hf.path, ": architecture '", arch,
           "' is not a Llama-family decoder this chapter can run (LlamaForCausalLM, MistralForCausalLM, "
           "Qwen2ForCausalLM, Qwen3ForCausalLM, and with mixture-of-experts layers MixtralForCausalLM, "
           "Qwen2MoeForCausalLM)",
           where_it_runs(arch));
  const TransformerConfig c = parse_transformer_config(hf);
  const JsonFields fields(hf.json, hf.path);
  if (arch == "MistralForCausalLM" && fields.has("sliding_window") && !hf.json["sliding_window"].is_null())
    IL_CHECK(fields.get<std::int64_t>("sliding_window") >= c.max_position_embeddings, hf.path,
             ": this Mistral uses a sliding window of ", hf.json["sliding_window"].dump(),
             " tokens, which chapter 06 implements (ch06_local_attention); chapter 01 would silently attend to everything");
  if (arch == "MixtralForCausalLM" && fields.has("sliding_window"))
    IL_CHECK(fields.get<std::int64_t>("sliding_window") >= c.max_position_embeddings, hf.path,
             ": this Mixtral uses a sliding window of ", hf.json["sliding_window"].dump(),
             " tokens; chapter 06 (ch06_local_attention) runs windows for dense models only, and chapter 01 would "
             "attend to everything");
  if (arch == "Qwen2ForCausalLM" || arch == "Qwen2MoeForCausalLM" || arch == "Qwen3ForCausalLM")
    IL_CHECK(!fields.get_or<bool>("use_sliding_window", false), hf.path,
             ": field 'use_sliding_window' is true; sliding windows are chapter 06's (ch06_local_attention), chapter 01 "
             "would attend to everything");
  return load_hf_decoder(hf, c, path);
}

Llama load_hf_decoder(const HfConfig& hf, const TransformerConfig& c, const std::string& path) {
  const JsonFields fields(hf.json, hf.path);
  HfWeights weights(hf, c, path);
  const Checkpoint& ck = weights.checkpoint();
  // Biases the config declares, missing from the checkpoint: refused by field, not by tensor.
  auto require = [&](const std::string& n, const char* field) {
    IL_CHECK(ck.contains(n), hf.path, ": field '", field, "' is true",
             fields.has(field)
                 ? ""
                 : " (for " + (hf.model_type().empty() ? hf.architecture() : "model_type " + hf.model_type()) + ")",
             " but ", ck.path(), " has no tensor '", n, "'");
  };
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* proj : {"q", "k", "v"})
      if (c.attention_bias) require(p + "self_attn." + proj + "_proj.bias", "attention_bias");
    if (c.attention_out_bias) require(p + "self_attn.o_proj.bias", "attention_bias");
    for (const char* proj : {"gate", "up", "down"})
      if (c.mlp_bias) require(p + "mlp." + proj + "_proj.bias", "mlp_bias");
  }
  Llama m = assemble(c, std::ref(weights));
  weights.check_all_used("does num_hidden_layers match the checkpoint?");
  m.source = path;
  return m;
}

TransformerConfig memory_bound_shape(std::int64_t layers, std::int64_t kv_heads, std::int64_t vocab, std::int64_t context) {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 1024, c.intermediate_size = 2816, c.num_layers = layers, c.num_heads = 16, c.num_kv_heads = kv_heads;
  c.head_dim = 64, c.vocab_size = vocab, c.max_position_embeddings = context, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  return c;
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
    if (c.attention_bias) l.wq.bias = bias(Q), l.wk.bias = bias(KV), l.wv.bias = bias(KV);
    if (c.attention_out_bias) l.wo.bias = bias(D);
    if (c.moe && c.moe->is_moe_layer(i)) {  // the experts, read as from a checkpoint of random tensors
      l.moe = read_moe(*c.moe, D, "", [&](const std::string&, const Shape& s) {
        return s.size() == 1 ? bias(s[0]) : Tensor(mat(s[0], s[1]));
      });
    } else {
      l.w_gate = mat(F, D), l.w_up = mat(F, D), l.w_down = mat(D, F);
      if (c.mlp_bias) l.w_gate.bias = bias(F), l.w_up.bias = bias(F), l.w_down.bias = bias(D);
    }
    if (c.qk_norm) l.q_norm = norm(c.head_dim), l.k_norm = norm(c.head_dim);
    if (c.post_norms) l.post_attn_norm = norm(D), l.post_mlp_norm = norm(D);
    l.geglu = c.hidden_act == "gelu_pytorch_tanh";
    m.layers.push_back(l);
  }
  m.final_norm = norm(D);
  m.lm_head = c.tie_word_embeddings ? m.embed : mat(c.vocab_size, D);
  m.source = "random weights, seed " + std::to_string(seed);
  return m;
}

std::int64_t Llama::matrix_bytes() const {
  std::int64_t n = tied() ? 0 : lm_head.bytes();
  for (const auto& l : layers) {
    for (const Linear* w : l.linears()) n += w->bytes();
    if (l.moe.defined())
      for (const Linear* w : l.moe.linears()) n += w->bytes();
  }
  return n;
}

std::int64_t Llama::weight_bytes() const {
  std::int64_t n = matrix_bytes() + static_cast<std::int64_t>(embed.nbytes() + final_norm.nbytes());
  for (const auto& l : layers)
    for (const Tensor* t : {&l.attn_norm, &l.mlp_norm, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_mlp_norm})
      n += t->defined() ? static_cast<std::int64_t>(t->nbytes()) : 0;
  return n;
}

std::int64_t Llama::step_weight_bytes() const {
  const std::int64_t table = static_cast<std::int64_t>(embed.nbytes());
  return weight_bytes() - (tied() ? 0 : table - table / config.vocab_size);
}

Llama Llama::to(Device device, DType dtype) const {
  auto f32 = [&](const Tensor& t) { return t.defined() ? t.to(DType::F32).to(device) : t; };
  // A failure (out of device memory, a value a 16-bit type cannot hold) names the part it hit.
  auto at = [&](const std::string& part) {
    return [&, part] {
      return "converting " + part + " to " + std::string(dtype_name(dtype)) + " on " + std::string(device_name(device));
    };
  };
  for (const LlamaLayer& l : layers)
    IL_CHECK(device == Device::CPU || !l.moe.defined(),
             "mixture-of-experts layers run on the CPU only (--device cpu): this build has no CUDA path for them");
  Llama m = *this;
  with_context(at("the embedding, final norm and head"), [&] {
    m.inv_freq = f32(inv_freq);
    m.embed = embed.to(dtype).to(device);
    m.final_norm = f32(final_norm);
    m.lm_head = tied() ? Linear(m.embed) : lm_head.to(device, dtype);
  });
  for (std::size_t i = 0; i < m.layers.size(); ++i)
    with_context(at("layer " + std::to_string(i)), [&] {
      LlamaLayer& l = m.layers[i];
      for (Tensor* t : {&l.attn_norm, &l.mlp_norm, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_mlp_norm, &l.inv_freq})
        *t = f32(*t);
      for (Linear* w : l.linears()) *w = w->to(device, dtype);
      if (l.moe.defined()) {
        for (Linear* w : l.moe.linears()) *w = w->to(device, dtype);
        l.moe.score_bias = f32(l.moe.score_bias);
      }
    });
  return m;
}

}  // namespace inferlab::models
