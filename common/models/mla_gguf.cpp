#include "common/models/mla_gguf.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "common/ops.h"

namespace inferlab::models::mla {

namespace {

const std::string kArch = "deepseek2.";

// A count: an integer key in [lo, 2^24), named when it is not one.
std::int64_t count(const gguf::File& f, const std::string& key, std::int64_t lo = 1) {
  const std::int64_t v = f.get_int(key);
  IL_CHECK(v >= lo && v < (std::int64_t{1} << 24), f.path(), ": metadata '", key, "' = ", v,
           " is not a plausible count (must be in [", lo, ", 2^24))");
  return v;
}

double positive(const gguf::File& f, const std::string& key) {
  const double v = f.get_float(key);
  IL_CHECK(std::isfinite(v) && v > 0, f.path(), ": metadata '", key, "' = ", v, " must be a finite number above 0");
  return v;
}

bool flag(const gguf::File& f, const std::string& key) {
  const gguf::Value& v = f.get(key);
  IL_CHECK(v.kind == gguf::Value::Kind::Bool, f.path(), ": metadata '", key, "' is ", gguf::kind_name(v.kind), ", not BOOL");
  return v.i != 0;
}

// YaRN as llama.cpp's deepseek2 applies it (llama-context.cpp, models/deepseek2.cpp): cos and
// sin unscaled (it takes mscale = mscale_all_dim), the softmax times yarn_mscale(s, m)² with
// m = yarn_log_multiplier / 0.1 (the converter stores 0.1 · mscale_all_dim). Returns m.
double read_yarn(const gguf::File& f, nlohmann::json& j, std::int64_t context) {
  const std::string y = kArch + "rope.scaling.";
  const std::string type = f.has(y + "type") ? f.get_string(y + "type") : "none";
  if (type == "none") return 0;
  IL_CHECK(type == "yarn", f.path(), ": metadata '", y, "type' is '", type,
           "'; chapter 04 runs DeepSeek's RoPE scaling, 'yarn', or none");
  IL_CHECK(f.has(y + "yarn_log_multiplier"), f.path(), ": YaRN without metadata '", y,
           "yarn_log_multiplier' (0.1 · mscale_all_dim, which DeepSeek's files carry): llama.cpp then scales cos, "
           "sin and the softmax by 1 + 0.1 ln(factor) at once, which no DeepSeek model does");
  const double m = f.get_float(y + "yarn_log_multiplier") / 0.1;
  IL_CHECK(std::isfinite(m) && m >= 0, f.path(), ": metadata '", y, "yarn_log_multiplier' = ", m * 0.1,
           " must be a finite number, not below 0");
  // Factors llama.cpp would multiply in besides: refused unless they are its defaults.
  for (const char* key : {"attn_factor", "yarn_attn_factor", "yarn_ext_factor"})
    IL_CHECK(!f.has(y + key) || f.get_float(y + key) == 1.0, f.path(), ": metadata '", y, key,
             "' = ", f.has(y + key) ? f.get_float(y + key) : 1.0, "; chapter 04 runs DeepSeek's YaRN, where it is 1");
  nlohmann::json s = {{"type", "yarn"},
                      {"rope_type", "yarn"},
                      {"factor", positive(f, y + "factor")},
                      {"original_max_position_embeddings",
                       f.has(y + "original_context_length") ? count(f, y + "original_context_length") : context},
                      {"attention_factor", 1.0}};  // cos and sin unscaled, as in llama.cpp's deepseek2
  if (f.has(y + "yarn_beta_fast")) s["beta_fast"] = positive(f, y + "yarn_beta_fast");
  if (f.has(y + "yarn_beta_slow")) s["beta_slow"] = positive(f, y + "yarn_beta_slow");
  j["rope_scaling"] = s;
  return m;
}

// The MoE fields: V3's noaux_tc for a sigmoid router, V2's greedy or group-limited routing for a
// softmax one (the file names neither). Returns the expert_weights_norm flag.
bool read_moe(const gguf::File& f, nlohmann::json& j, bool sigmoid) {
  const std::string& k = kArch;
  j["n_routed_experts"] = count(f, k + "expert_count");
  j["num_experts_per_tok"] = count(f, k + "expert_used_count");
  j["moe_intermediate_size"] = count(f, k + "expert_feed_forward_length");
  j["n_shared_experts"] = count(f, k + "expert_shared_count", 0);
  j["routed_scaling_factor"] = f.has(k + "expert_weights_scale") ? positive(f, k + "expert_weights_scale") : 1.0;
  j["scoring_func"] = sigmoid ? "sigmoid" : "softmax";
  const std::int64_t groups = f.has(k + "expert_group_count") ? count(f, k + "expert_group_count") : 1;
  IL_CHECK(groups == 1 || f.has(k + "expert_group_used_count"), f.path(), ": metadata '", k,
           "expert_group_count' = ", groups, " without '", k, "expert_group_used_count' (how many groups a token may use)");
  j["n_group"] = groups;
  j["topk_group"] = groups == 1 ? 1 : count(f, k + "expert_group_used_count");
  const bool norm = f.has(k + "expert_weights_norm") && flag(f, k + "expert_weights_norm");
  if (sigmoid) {
    j["topk_method"] = "noaux_tc";
    j["norm_topk_prob"] = norm;
  } else {
    j["topk_method"] = groups > 1 ? "group_limited_greedy" : "greedy";
  }
  return norm;
}

}  // namespace

MlaGgufConfig deepseek2_config(const gguf::File& f) {
  const std::string& k = kArch;
  const std::string& path = f.path();
  const std::int64_t L = count(f, k + "block_count"), D = count(f, k + "embedding_length"),
                     N = count(f, k + "attention.head_count"), r = count(f, k + "attention.kv_lora_rank"),
                     dr = count(f, k + "rope.dimension_count"), context = count(f, k + "context_length");
  // llama.cpp's MLA files (since the split of kv_b) describe the absorbed attention, one KV head
  // of r + dr, in key_length and value_length, and the model's heads in the *_mla keys.
  MlaGgufConfig out;
  out.kv_b_split = f.has(k + "attention.key_length_mla");
  const std::string head_k = k + (out.kv_b_split ? "attention.key_length_mla" : "attention.key_length");
  const std::string head_v = k + (out.kv_b_split ? "attention.value_length_mla" : "attention.value_length");
  const std::int64_t dk = count(f, head_k), dv = count(f, head_v);
  if (out.kv_b_split) {
    for (const auto& [key, want] :
         {std::pair{k + "attention.key_length", r + dr}, std::pair{k + "attention.value_length", r}})
      IL_CHECK(count(f, key) == want, path, ": metadata '", key, "' = ", f.get_int(key), " is not ", want, " (kv_lora_rank",
               key.find("key") != std::string::npos ? " + rope.dimension_count" : "",
               "), the width llama.cpp's MLA files give the absorbed attention's one KV head");
  }
  IL_CHECK(dk > dr, path, ": metadata '", head_k, "' = ", dk, " leaves no dimension without RoPE ('", k,
           "rope.dimension_count' = ", dr, "): a head's key is qk_nope_head_dim + qk_rope_head_dim");
  if (f.has(k + "attention.head_count_kv")) {
    const std::int64_t kv = count(f, k + "attention.head_count_kv");
    IL_CHECK(kv == 1 || kv == N, path, ": metadata '", k, "attention.head_count_kv' = ", kv,
             " is neither 1 (MLA as one latent KV head) nor the ", N, " heads");
  }
  IL_CHECK(!f.has(k + "attention.temperature_scale") || f.get_float(k + "attention.temperature_scale") == 0, path,
           ": metadata '", k, "attention.temperature_scale' is set; chapter 04 does not scale queries by position");
  const auto& embd = f.info("token_embd.weight");
  IL_CHECK(embd.shape.size() == 2 && embd.shape[1] == D, path, ": tensor token_embd.weight has shape ",
           shape_str(embd.shape), ", expected [vocab, ", D, "]");
  const std::int64_t V = embd.shape[0];
  if (f.has(k + "vocab_size"))
    IL_CHECK(count(f, k + "vocab_size") == V, path, ": metadata '", k, "vocab_size' = ", f.get_int(k + "vocab_size"),
             " but token_embd.weight has ", V, " rows");
  const std::int64_t gating = f.has(k + "expert_gating_func") ? f.get_int(k + "expert_gating_func") : 0;
  IL_CHECK(gating >= 0 && gating <= 2, path, ": metadata '", k, "expert_gating_func' = ", gating,
           "; chapter 04 runs DeepSeek's routers, softmax (1, V2; also when absent) and sigmoid (2, V3)");
  const bool sigmoid = gating == 2;

  nlohmann::json j = {
      {"architectures", {sigmoid ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"}},
      {"model_type", sigmoid ? "deepseek_v3" : "deepseek_v2"},
      {"hidden_size", D},
      {"intermediate_size", count(f, k + "feed_forward_length")},
      {"num_hidden_layers", L},
      {"num_attention_heads", N},
      {"num_key_value_heads", N},
      {"head_dim", dr},  // as DeepseekV3Config sets it: the rotary width
      {"vocab_size", V},
      {"max_position_embeddings", context},
      {"rms_norm_eps", positive(f, k + "attention.layer_norm_rms_epsilon")},
      {"rope_theta", f.has(k + "rope.freq_base") ? positive(f, k + "rope.freq_base") : 10000.0},
      {"tie_word_embeddings", !f.contains("output.weight")},
      {"kv_lora_rank", r},
      {"q_lora_rank", nullptr},
      {"qk_nope_head_dim", dk - dr},
      {"qk_rope_head_dim", dr},
      {"v_head_dim", dv},
      {"attention_bias", false},
  };
  // Both rotate adjacent pairs: V2 always, V3 with rope_interleave (llama.cpp's deepseek2 too).
  if (sigmoid) j["rope_interleave"] = true;
  if (f.has(k + "attention.q_lora_rank") && count(f, k + "attention.q_lora_rank", 0) > 0)
    j["q_lora_rank"] = f.get_int(k + "attention.q_lora_rank");
  for (const char* id : {"bos_token_id", "eos_token_id"}) {
    const std::string key = std::string("tokenizer.ggml.") + id;
    if (!f.has(key)) continue;
    const std::int64_t v = f.get_int(key);
    IL_CHECK(v >= 0 && v < V, path, ": metadata '", key, "' = ", v, " is outside the vocabulary [0, ", V, ")");
    j[id] = v;
  }
  const std::int64_t first_dense = f.has(k + "leading_dense_block_count") ? count(f, k + "leading_dense_block_count", 0) : 0;
  IL_CHECK(first_dense <= L, path, ": metadata '", k, "leading_dense_block_count' = ", first_dense, " exceeds ", k,
           "block_count (", L, ")");
  j["first_k_dense_replace"] = first_dense;
  const bool norm = first_dense < L && read_moe(f, j, sigmoid);
  const double mscale_all_dim = read_yarn(f, j, context);

  HfConfig hf;
  hf.path = path + " (deepseek2.* metadata, named as in a config.json)";
  hf.json = j;
  out.config = parse_transformer_config(hf);
  out.mla = parse_mla_config(hf, out.config);
  // What llama.cpp computes where transformers' V2 would differ (mla_gguf.h).
  if (out.mla.yarn && mscale_all_dim > 0) {
    const double ms = yarn_mscale(out.mla.yarn->factor, mscale_all_dim);
    out.mla.softmax_mscale = ms * ms;
  }
  if (MoeConfig* m = out.config.moe ? &*out.config.moe : nullptr) {
    m->norm_topk_prob = norm;
    // llama.cpp adds exp_probs_b to the scores for the choice wherever the file has it.
    m->score_bias = f.contains("blk." + std::to_string(m->first_dense) + ".exp_probs_b.bias");
    m->validate(hf.path, L);
  }
  return out;
}

std::string deepseek2_tensor_name(const std::string& hf, std::int64_t* expert) {
  static const std::map<std::string, std::string> model = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  static const std::map<std::string, std::string> layer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
      {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
      {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
      {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
      {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
      {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"mlp.experts.gate_proj.weight", "ffn_gate_exps.weight"},
      {"mlp.experts.up_proj.weight", "ffn_up_exps.weight"},
      {"mlp.experts.down_proj.weight", "ffn_down_exps.weight"},
      {"mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
  };
  if (expert != nullptr) *expert = -1;
  if (auto it = model.find(hf); it != model.end()) return it->second;
  const std::string prefix = "model.layers.";
  const std::size_t dot = hf.find('.', prefix.size());
  if (hf.rfind(prefix, 0) != 0 || dot == std::string::npos || dot == prefix.size()) return "";
  const std::string index = hf.substr(prefix.size(), dot - prefix.size());
  if (index.find_first_not_of("0123456789") != std::string::npos) return "";
  std::string rest = hf.substr(dot + 1);
  // Expert j's matrices are row block j of one stacked tensor per matrix.
  const std::string experts = "mlp.experts.";
  if (rest.rfind(experts, 0) == 0) {
    const std::size_t end = rest.find('.', experts.size());
    const std::string j = rest.substr(experts.size(), end == std::string::npos ? std::string::npos : end - experts.size());
    if (end == std::string::npos || j.empty() || j.find_first_not_of("0123456789") != std::string::npos || j.size() > 6)
      return "";
    if (expert != nullptr) *expert = std::stoll(j);
    rest = experts + rest.substr(end + 1);
  }
  const auto it = layer.find(rest);
  return it == layer.end() ? "" : "blk." + index + "." + it->second;
}

namespace {

// The tensors of a deepseek2 file under Hugging Face's names (the getter assemble_mla reads):
// each one's shape checked, its values as f32 (decoded from any type gguf.h reads) and finite,
// every name read remembered.
class Deepseek2Tensors {
 public:
  Deepseek2Tensors(const gguf::File& f, const MlaGgufConfig& g) : f_(f), g_(g) {}

  Tensor operator()(const std::string& hf, const Shape& shape) {
    std::int64_t expert = -1;
    const std::string name = deepseek2_tensor_name(hf, &expert);
    IL_CHECK(!name.empty(), f_.path(), ": chapter 04 asks for ", hf, ", which a deepseek2 file has no name for");
    if (expert >= 0) {  // [E, rows, cols], expert j's rows
      const Shape whole{g_.config.moe->num_experts, shape[0], shape[1]};
      const gguf::TensorInfo& i = info(name, whole);
      return rows(i, expert * shape[0], (expert + 1) * shape[0]).view(shape);
    }
    if (g_.kv_b_split && name.size() > 16 && name.compare(name.size() - 16, 16, "attn_kv_b.weight") == 0)
      return kv_b(name.substr(0, name.size() - 16), shape);
    const gguf::TensorInfo& i = info(name, shape);
    return rows(i, 0, i.shape.size() == 1 ? 1 : shape_rows(i.shape)).view(shape);
  }

  // A tensor left over means the metadata and the tensors disagree (a block_count below the
  // layers present, or tensors of a part chapter 04 does not run).
  void check_all_used() const {
    for (const auto& t : f_.tensors())
      IL_CHECK(used_.count(t.name), f_.path(), ": tensor '", t.name,
               "' is not part of the model the deepseek2.* metadata describes (deepseek2.block_count = ",
               g_.config.num_layers, ")");
  }

 private:
  static std::int64_t shape_rows(const Shape& s) {
    std::int64_t n = 1;
    for (std::size_t d = 0; d + 1 < s.size(); ++d) n *= s[d];
    return n;
  }

  const gguf::TensorInfo& info(const std::string& name, const Shape& shape) {
    IL_CHECK(f_.contains(name), f_.path(), ": tensor ", name, " is missing");
    const gguf::TensorInfo& i = f_.info(name);
    IL_CHECK(i.shape == shape, f_.path(), ": tensor ", name, " has shape ", shape_str(i.shape), ", expected ",
             shape_str(shape));
    used_.insert(name);
    return i;
  }

  // Rows [r0, r1) of a tensor seen as [rows, its innermost dimension], as f32.
  Tensor rows(const gguf::TensorInfo& i, std::int64_t r0, std::int64_t r1) const {
    const std::string what = f_.path() + ": tensor " + i.name;
    return with_context(what, [&] {
      const std::int64_t cols = i.shape.back();
      const bool plain = i.type == gguf::Type::F32 || i.type == gguf::Type::F16 || i.type == gguf::Type::BF16;
      if (plain) {
        const Tensor all = f_.tensor(i.name);
        return check_finite(all.view({all.numel() / cols, cols}).slice(0, r0, r1).to(DType::F32), what);
      }
      return check_finite(gguf::dequantize_rows(i.type, f_.raw(i.name).slice(0, r0, r1).contiguous(), cols), what);
    });
  }

  // kv_b_proj [N·(dn + dv), r] from the split form: head h's rows are its W_UK [dn, r], stored
  // transposed in attn_k_b [N, r, dn], then its W_UV [dv, r] from attn_v_b [N, dv, r].
  Tensor kv_b(const std::string& block, const Shape& shape) {
    const std::int64_t N = g_.config.num_heads, dn = g_.mla.qk_nope_head_dim, dv = g_.mla.v_head_dim,
                       r = g_.mla.kv_lora_rank;
    const Tensor k = rows(info(block + "attn_k_b.weight", {N, r, dn}), 0, N * r);
    const Tensor v = rows(info(block + "attn_v_b.weight", {N, dv, r}), 0, N * dv);
    Tensor w = Tensor::empty(shape, DType::F32);
    for (std::int64_t h = 0; h < N; ++h) {
      const std::int64_t row = h * (dn + dv);
      for (std::int64_t i = 0; i < dn; ++i)
        for (std::int64_t j = 0; j < r; ++j) w.data<float>()[(row + i) * r + j] = k.data<float>()[(h * r + j) * dn + i];
      w.slice(0, row + dn, row + dn + dv).copy_from(v.slice(0, h * dv, (h + 1) * dv));
    }
    return w;
  }

  const gguf::File& f_;
  const MlaGgufConfig& g_;
  std::set<std::string> used_;
};

}  // namespace

MlaModel load_mla_gguf(const std::string& path) {
  const gguf::File f(path);
  const std::string& arch = f.get_string("general.architecture");
  IL_CHECK(arch == "deepseek2", path, ": architecture '", arch, "' is not deepseek2, the GGUF architecture chapter 04 runs",
           where_gguf_runs(arch));
  const MlaGgufConfig g = deepseek2_config(f);
  Deepseek2Tensors tensors(f, g);
  MlaModel m = assemble_mla(g.config, g.mla, std::ref(tensors));
  tensors.check_all_used();
  m.base.source = path;
  return m;
}

}  // namespace inferlab::models::mla
