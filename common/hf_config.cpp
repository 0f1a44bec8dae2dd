#include "common/hf_config.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "common/dtype.h"
#include "common/json_file.h"
#include "common/lab.h"

namespace inferlab {

namespace fs = std::filesystem;

HfConfig load_hf_config(const std::string& path) {
  HfConfig c;
  c.path = fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  IL_CHECK(fs::exists(c.path), "cannot open ", c.path, ": no such file (a model folder needs a config.json)");
  IL_CHECK(fs::path(c.path).extension() == ".json", path,
           " is not a Hugging Face model: expected its folder or its config.json");
  c.json = load_json(c.path);
  IL_CHECK(c.json.is_object(), c.path, ": expected a JSON object");
  return c;
}

std::string HfConfig::architecture() const {
  if (json.contains("architectures") && json["architectures"].is_array() && !json["architectures"].empty() &&
      json["architectures"][0].is_string())
    return json["architectures"][0].get<std::string>();
  return "";
}

std::string HfConfig::model_type() const {
  return json.contains("model_type") && json["model_type"].is_string() ? json["model_type"].get<std::string>() : "";
}

std::vector<std::int64_t> eos_token_ids(const HfConfig& cfg) {
  const JsonFields f(cfg.json, cfg.path);
  std::vector<std::int64_t> ids;
  if (!f.has("eos_token_id")) return ids;
  const auto& e = cfg.json["eos_token_id"];
  if (!e.is_array()) return {f.get<std::int64_t>("eos_token_id")};
  for (const auto& v : e) {
    IL_CHECK(v.is_number_integer(), cfg.path, ": field 'eos_token_id' must hold integers, got ", v.dump());
    ids.push_back(v.get<std::int64_t>());
  }
  return ids;
}

bool gemma_family(const std::string& arch) { return arch == "Gemma2ForCausalLM" || arch == "Gemma3ForCausalLM"; }

namespace {

// Gemma 2 and 3 (transformers 4.57's Gemma2Config, Gemma3TextConfig): a Llama-family layer with
// norms after each block as well, GeGLU, √D-scaled embeddings, its own attention scale, soft-
// capping (Gemma 2), per-head q/k norms and a second RoPE base for local layers (Gemma 3).
void read_gemma_fields(const JsonFields& f, const HfConfig& cfg, TransformerConfig& c) {
  const bool v3 = c.architecture == "Gemma3ForCausalLM";
  c.post_norms = true;
  c.qk_norm = v3;
  c.hidden_act = f.get_or<std::string>("hidden_activation", f.get_or<std::string>("hidden_act", "gelu_pytorch_tanh"));
  // A null means none, as transformers reads it; absent means the class's default; a number must
  // be positive (transformers would divide by a 0).
  auto positive = [&](const char* key, double v) {
    IL_CHECK(std::isfinite(v) && v > 0, cfg.path, ": field '", key, "' must be a positive number, got ", v);
    return v;
  };
  auto optional = [&](const char* key, double fallback) {
    if (!f.has(key)) return fallback;
    return cfg.json[key].is_null() ? 0.0 : positive(key, f.get<double>(key));
  };
  c.query_pre_attn_scalar = positive("query_pre_attn_scalar", f.get_or<double>("query_pre_attn_scalar", 256));
  c.attn_logit_softcapping = optional("attn_logit_softcapping", v3 ? 0 : 50);
  c.final_logit_softcapping = optional("final_logit_softcapping", v3 ? 0 : 30);
  if (v3) c.rope_local_base_freq = positive("rope_local_base_freq", f.get_or<double>("rope_local_base_freq", 10000));
  // transformers multiplies by √D cast to the activations' dtype (bfloat16 turns √3072 = 55.43
  // into 55.5); the checkpoint's dtype is the one a real run computes in.
  const float s = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  c.embed_scale = c.torch_dtype == "bfloat16"  ? bf16_to_f32(f32_to_bf16(s))
                  : c.torch_dtype == "float16" ? f16_to_f32(f32_to_f16(s))
                                               : std::sqrt(static_cast<double>(c.hidden_size));
  IL_CHECK(!f.get_or<bool>("use_bidirectional_attention", false), cfg.path,
           ": field 'use_bidirectional_attention' is true (an embedding model); the decoders here are causal");
}

}  // namespace

std::string where_it_runs(const std::string& a) {
  const char* where = nullptr;
  if (a == "DeepseekV2ForCausalLM" || a == "DeepseekV3ForCausalLM") where = "chapter 04, ch04_mla";
  if (a == "MixtralForCausalLM" || a == "Qwen2MoeForCausalLM")
    where = "chapters 01 and 02, ch01_naive_decode and ch02_kv_cache (its mixture-of-experts layers on the CPU)";
  if (a == "MinistralForCausalLM") where = "chapter 06, ch06_local_attention";
  if (a == "InferLabCLAForCausalLM") where = "chapter 05, ch05_cla";
  if (a == "MambaForCausalLM" || a == "InferLabLTIMambaForCausalLM") where = "chapter 07, ch07_mamba";
  if (a == "InferLabMDLMForMaskedDiffusion") where = "chapter 08, ch08_diffusion_lm";
  if (gemma_family(a)) where = "chapter 06, ch06_local_attention (its local and global layers)";
  for (const char* llama :
       {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "InternLM2ForCausalLM"})
    if (a == llama) where = "chapter 01 and every chapter after it, ch01_naive_decode on";
  return where == nullptr ? "" : std::string(" (it runs in ") + where + ")";
}

std::string where_gguf_runs(const std::string& a) {
  const char* where = nullptr;
  if (a == "deepseek2") where = "chapter 04, ch04_mla generate --model FILE.gguf";
  if (a == "gemma2" || a == "gemma3") where = "chapter 06, ch06_local_attention generate --model FILE.gguf";
  if (a == "llama" || a == "qwen2" || a == "qwen2moe" || a == "qwen3") where = "chapter 09, ch09_quantization run FILE.gguf";
  return where == nullptr ? "" : std::string(" (it runs in ") + where + ")";
}

TransformerConfig parse_transformer_config(const HfConfig& cfg) {
  JsonFields f(cfg.json, cfg.path);
  TransformerConfig c;
  c.architecture = cfg.architecture();
  c.hidden_size = f.get<std::int64_t>("hidden_size");
  c.intermediate_size = f.get<std::int64_t>("intermediate_size");
  c.num_layers = f.get<std::int64_t>("num_hidden_layers");
  c.num_heads = f.get<std::int64_t>("num_attention_heads");
  c.num_kv_heads = f.get_or<std::int64_t>("num_key_value_heads", c.num_heads);
  c.vocab_size = f.get<std::int64_t>("vocab_size");
  c.max_position_embeddings = f.get_or<std::int64_t>("max_position_embeddings", 2048);
  c.rms_norm_eps = f.get_or<double>("rms_norm_eps", 1e-6);
  c.rope_theta = f.get_or<double>("rope_theta", 10000.0);
  if (f.has("rope_scaling")) c.rope_scaling = cfg.json["rope_scaling"];
  const bool gemma = gemma_family(c.architecture);
  // Gemma's classes tie by default, so save_pretrained leaves the field out.
  c.tie_word_embeddings = f.get_or<bool>("tie_word_embeddings", gemma);
  // Qwen2's q/k/v biases are implied by its architecture rather than a config field. Llama's
  // attention_bias puts a bias on all four attention projections, o_proj too (transformers'
  // LlamaAttention: bias=config.attention_bias for q_proj, k_proj, v_proj and o_proj).
  // (The architecture implies them too: a Qwen2ForCausalLM config without model_type ran without.)
  c.attention_bias = f.get_or<bool>("attention_bias", cfg.model_type() == "qwen2" || c.architecture == "Qwen2ForCausalLM");
  // Qwen2-MoE names its q/k/v biases qkv_bias (default true).
  if (c.architecture == "Qwen2MoeForCausalLM" || cfg.model_type() == "qwen2_moe")
    c.attention_bias = f.get_or<bool>("qkv_bias", true);
  c.attention_out_bias =
      c.attention_bias && (c.architecture == "LlamaForCausalLM" || c.architecture == "Qwen3ForCausalLM" || gemma);
  c.qk_norm = c.architecture == "Qwen3ForCausalLM";  // Qwen3's q_norm and k_norm
  c.mlp_bias = f.get_or<bool>("mlp_bias", false);
  c.torch_dtype = f.get_or<std::string>("torch_dtype", f.get_or<std::string>("dtype", ""));
  if (f.has("bos_token_id")) c.bos_token_id = f.get<std::int64_t>("bos_token_id");
  c.eos_token_ids = eos_token_ids(cfg);
  // Fields that change what a Llama-family layer computes: implemented, or refused by name
  // rather than run as a different model (rope_scaling is checked in validate()).
  if (gemma) {
    read_gemma_fields(f, cfg, c);
    IL_CHECK(c.hidden_act == "gelu_pytorch_tanh", cfg.path, ": field 'hidden_activation' is '", c.hidden_act,
             "'; Gemma's MLP here computes GeGLU with the tanh GELU ('gelu_pytorch_tanh')");
  } else {
    const std::string act = f.get_or<std::string>("hidden_act", "silu");
    IL_CHECK(act == "silu" || act == "swish", cfg.path, ": field 'hidden_act' is '", act,
             "'; the gated MLP here computes SiLU ('silu' or 'swish')");
  }
  IL_CHECK(f.get_or<double>("partial_rotary_factor", 1.0) == 1.0, cfg.path,
           ": field 'partial_rotary_factor' is not 1: RoPE here rotates the whole head");
  if (f.has("head_dim")) {
    c.head_dim = f.get<std::int64_t>("head_dim");
  } else if (gemma) {
    c.head_dim = 256;  // Gemma's classes' default, whatever hidden_size / num_attention_heads is
  } else if (c.num_heads > 0) {
    IL_CHECK(c.hidden_size % c.num_heads == 0, cfg.path, ": hidden_size ", c.hidden_size,
             " is not a multiple of num_attention_heads ", c.num_heads, " (and no head_dim is given)");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.validate(cfg.path);
  c.moe = parse_moe_config(cfg, c);
  return c;
}

void TransformerConfig::validate(const std::string& where) const {
  // Positive, and small enough that every size the project multiplies out (parameters, cache
  // bytes for any context it accepts) stays far inside 64 bits: the largest real models are
  // about a tenth of each limit.
  struct Field {
    const char* name;
    std::int64_t value, limit;
  };
  for (const Field& f :
       {Field{"hidden_size", hidden_size, 1 << 20}, Field{"intermediate_size", intermediate_size, 1 << 20},
        Field{"num_hidden_layers", num_layers, 1 << 12}, Field{"num_attention_heads", num_heads, 1 << 12},
        Field{"num_key_value_heads", num_kv_heads, 1 << 12}, Field{"head_dim", head_dim, 1 << 12},
        Field{"vocab_size", vocab_size, kMaxVocabSize}, Field{"max_position_embeddings", max_position_embeddings, 1 << 30}})
    IL_CHECK(f.value > 0 && f.value <= f.limit, where, ": field '", f.name, "' must be in [1, ", f.limit, "], got ",
             f.value);
  IL_CHECK(num_heads % num_kv_heads == 0, where, ": num_attention_heads ", num_heads,
           " is not a multiple of num_key_value_heads ", num_kv_heads);
  IL_CHECK(head_dim % 2 == 0, where, ": head_dim ", head_dim, " must be even for RoPE");
  // RMSNorm adds eps in float32: beyond float's range it would be infinite, below it zero.
  IL_CHECK(rms_norm_eps > 0 && rms_norm_eps <= std::numeric_limits<float>::max() && static_cast<float>(rms_norm_eps) > 0,
           where, ": rms_norm_eps must be positive and within float32's range, got ", rms_norm_eps);
  IL_CHECK(std::isfinite(rope_theta) && rope_theta > 0, where, ": rope_theta must be positive, got ", rope_theta);
  IL_CHECK(hidden_act == "silu" || hidden_act == "gelu_pytorch_tanh", where, ": hidden activation '", hidden_act,
           "' is not one the MLP computes (silu, gelu_pytorch_tanh)");
  // The Gemma fields: each finite, a scale positive, a cap or base 0 (none) or positive.
  IL_CHECK(std::isfinite(embed_scale) && embed_scale > 0, where, ": the embedding scale must be positive, got ",
           embed_scale);
  for (auto [name, v] : {std::pair{"query_pre_attn_scalar", query_pre_attn_scalar},
                         std::pair{"attn_logit_softcapping", attn_logit_softcapping},
                         std::pair{"final_logit_softcapping", final_logit_softcapping},
                         std::pair{"rope_local_base_freq", rope_local_base_freq}})
    IL_CHECK(std::isfinite(v) && v >= 0 && v <= 1e12, where, ": field '", name, "' must be a positive number (or ",
             "absent), got ", v);
  // A token id outside the vocabulary is never sampled: generation would not stop at that EOS.
  std::vector<std::pair<const char*, std::int64_t>> ids;
  if (bos_token_id) ids.emplace_back("bos_token_id", *bos_token_id);
  for (auto id : eos_token_ids) ids.emplace_back("eos_token_id", id);
  for (auto [name, id] : ids)
    IL_CHECK(id >= 0 && id < vocab_size, where, ": field '", name, "' = ", id, " is outside the vocabulary [0, ", vocab_size,
             ")");
  if (!rope_scaling.is_null()) {
    const JsonFields s(rope_scaling, where + ": field 'rope_scaling'");
    const std::string type = s.get_or<std::string>("rope_type", s.get_or<std::string>("type", ""));
    IL_CHECK(type == "default" || type == "linear" || type == "llama3" || type == "yarn", s.context(), ": type '", type,
             "' is not supported (default, linear, llama3, yarn)");
    auto positive = [&](const char* key) {
      const double v = s.get<double>(key);
      IL_CHECK(std::isfinite(v) && v > 0, s.context(), ": '", key, "' must be positive, got ", v);
      return v;
    };
    if (type != "default") positive("factor");
    if (type == "llama3") {  // the band between the two wavelengths divides by high - low
      IL_CHECK(positive("high_freq_factor") > positive("low_freq_factor"), s.context(),
               ": 'high_freq_factor' must be above 'low_freq_factor'");
      positive("original_max_position_embeddings");
    }
    if (type == "yarn") {
      parse_yarn_scaling(*this, where);  // its fields first, each named when malformed
      // YaRN also multiplies cos and sin by a factor; the Llama-family loaders (chapter 01's
      // rope_frequencies) do not apply it yet, so only chapter 04's DeepSeek models take it.
      IL_CHECK(architecture == "DeepseekV3ForCausalLM" || architecture == "DeepseekV2ForCausalLM", s.context(),
               ": type 'yarn' is implemented for DeepseekV3ForCausalLM and DeepseekV2ForCausalLM (chapter 04) only, "
               "not for architecture '",
               architecture, "'");
    }
  }
}

YarnScaling parse_yarn_scaling(const TransformerConfig& c, const std::string& where) {
  const JsonFields s(c.rope_scaling, where + ": field 'rope_scaling'");
  const std::string type = s.get_or<std::string>("rope_type", s.get_or<std::string>("type", ""));
  IL_CHECK(type == "yarn", s.context(), ": type '", type, "' is not 'yarn'");
  // Every field a number that is finite and, where the formula needs it, positive; a field
  // transformers reads with `or default` (0 and null both mean the default) reads the same here.
  auto number = [&](const char* key, double fallback, bool zero_means_fallback) {
    const double v = s.get_or<double>(key, fallback);
    IL_CHECK(std::isfinite(v) && v >= 0, s.context(), ": '", key, "' must be a finite non-negative number, got ", v);
    return zero_means_fallback && v == 0 ? fallback : v;
  };
  YarnScaling y;
  y.factor = s.get<double>("factor");
  // YaRN stretches the context by `factor`: below 1 it is not YaRN (transformers warns), and a tiny
  // one made the interpolated frequencies overflow to NaN only at the first forward pass.
  IL_CHECK(std::isfinite(y.factor) && y.factor >= 1, s.context(), ": 'factor' must be at least 1 for YaRN, got ", y.factor);
  y.original_context = number("original_max_position_embeddings", static_cast<double>(c.max_position_embeddings), true);
  y.beta_fast = number("beta_fast", 32, true);
  y.beta_slow = number("beta_slow", 1, true);
  IL_CHECK(y.beta_fast >= y.beta_slow, s.context(), ": 'beta_fast' (", y.beta_fast, ") must not be below 'beta_slow' (",
           y.beta_slow, "): the ramp runs from the fast pairs to the slow ones");
  y.truncate = s.get_or<bool>("truncate", true);
  y.mscale = number("mscale", 0, false);
  y.mscale_all_dim = number("mscale_all_dim", 0, false);
  y.attention_factor = number("attention_factor", 0, false);
  IL_CHECK(!s.has("attention_factor") || y.attention_factor > 0, s.context(),
           ": 'attention_factor' must be positive, got 0");
  return y;
}

std::int64_t TransformerConfig::num_parameters() const {
  const std::int64_t D = hidden_size, F = intermediate_size, H = head_dim;
  const std::int64_t q = D * num_heads * H, kv = 2 * D * num_kv_heads * H, o = num_heads * H * D;
  const std::int64_t bias = (attention_bias ? (num_heads + 2 * num_kv_heads) * H : 0) + (attention_out_bias ? D : 0);
  const std::int64_t mlp = 3 * D * F + (mlp_bias ? 2 * F + D : 0);
  const std::int64_t norms = (post_norms ? 4 : 2) * D + (qk_norm ? 2 * H : 0);  // RMSNorm weights
  const std::int64_t per_layer = q + kv + o + bias + mlp + norms;
  // An MoE layer's router and experts in place of its dense MLP.
  std::int64_t moe_extra = 0;
  for (std::int64_t i = 0; moe && i < num_layers; ++i)
    if (moe->is_moe_layer(i)) moe_extra = checked_add(moe_extra, moe->layer_parameters(D) - mlp, "MoE parameters");
  return checked_add(vocab_size * D + num_layers * per_layer + D + (tie_word_embeddings ? 0 : vocab_size * D), moe_extra,
                     "parameters");
}

std::int64_t TransformerConfig::kv_cache_bytes(std::int64_t positions, std::int64_t bytes_per_element) const {
  // EXERCISE 00.3 BEGIN: the bytes of the KV cache
  return checked_mul(positions, num_kv_heads * head_dim * num_layers * 2 * bytes_per_element, "KV-cache bytes");
  // EXERCISE 00.3 STUB
  // lab::not_done("00.3", "return the bytes of a KV cache of `positions` positions: per position, K and V "
  //                       "of every KV head (head_dim elements) in every layer; checked_mul(a, b, what) "
  //                       "multiplies without overflowing");
  // EXERCISE 00.3 END
}

}  // namespace inferlab
