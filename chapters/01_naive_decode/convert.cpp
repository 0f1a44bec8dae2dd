#include "chapters/01_naive_decode/convert.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/llama.h"
#include "common/atomic_file.h"
#include "common/cli.h"
#include "common/llama2c.h"
#include "common/safetensors.h"

namespace inferlab::ch01 {

using namespace models;

namespace fs = std::filesystem;

void convert_llama2c_to_hf(const std::string& checkpoint, const std::string& tokenizer, const std::string& out_dir) {
  require_writable_folder(out_dir, "output folder");  // before the work
  const Llama2cCheckpoint ck = load_llama2c(checkpoint);
  const auto& c = ck.config;
  // The tokenizer first, so that a wrong one fails before anything is written.
  const auto tok = Tokenizer::for_model(checkpoint, tokenizer);
  const auto* l2c = dynamic_cast<const Llama2cTokenizer*>(tok.get());
  IL_CHECK(l2c != nullptr, tok->path(), " is not a llama2.c tokenizer (.bin)");
  check_tokenizer_vocab(*tok, c.vocab_size, checkpoint);
  check_not_input(out_dir, {checkpoint, tok->path()});
  fs::create_directories(out_dir);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, t] : ck.tensors) {
    Tensor w = t;
    if (name.find("self_attn.q_proj.weight") != std::string::npos) w = permute_rope_rows(t, c.num_heads, true);
    if (name.find("self_attn.k_proj.weight") != std::string::npos) w = permute_rope_rows(t, c.num_kv_heads, true);
    tensors.emplace_back(name, w);
  }
  save_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"model_type", "llama"},
                                 {"hidden_size", c.hidden_size},
                                 {"intermediate_size", c.intermediate_size},
                                 {"num_hidden_layers", c.num_layers},
                                 {"num_attention_heads", c.num_heads},
                                 {"num_key_value_heads", c.num_kv_heads},
                                 {"vocab_size", c.vocab_size},
                                 {"max_position_embeddings", c.max_position_embeddings},
                                 {"rms_norm_eps", c.rms_norm_eps},
                                 {"rope_theta", c.rope_theta},
                                 {"tie_word_embeddings", c.tie_word_embeddings},
                                 {"hidden_act", "silu"},
                                 {"bos_token_id", 1},
                                 {"eos_token_id", 2},
                                 {"torch_dtype", "float32"}};
  write_json((fs::path(out_dir) / "config.json").string(), config);
  write_text((fs::path(out_dir) / "tokenizer.json").string(), l2c->to_tokenizer_json() + "\n");
}

void convert_hf_to_llama2c(const std::string& folder, const std::string& out_file) {
  check_not_input(out_file, {folder});
  require_writable_file(out_file, "output file");  // before the work
  const Llama m = load_llama(folder);
  for (const Linear* w : m.layers.at(0).linears())  // every layer alike: the config says which have biases
    IL_CHECK(!w->bias.defined(), folder, ": its projections have biases, which a llama2.c checkpoint cannot hold");
  const auto& c = m.config;
  // A llama2.c header has no field for these; a reader assumes the values below, so any other
  // value would be written into a file that runs and computes something else.
  IL_CHECK(m.rope_pairing == RopePairing::HalfSplit, folder,
           " is already a llama2.c checkpoint; convert a Hugging Face folder");
  IL_CHECK(c.rope_theta == 10000.0 && c.rms_norm_eps == 1e-5 && c.rope_scaling.is_null() &&
               c.head_dim * c.num_heads == c.hidden_size,
           folder, ": llama2.c's header cannot express rope_theta ", c.rope_theta, ", rms_norm_eps ", c.rms_norm_eps,
           c.rope_scaling.is_null() ? "" : ", rope_scaling",
           " or a head_dim other than hidden_size / heads (it assumes "
           "10000, 1e-05, no scaling and ",
           c.hidden_size / c.num_heads, ")");
  std::map<std::string, Tensor> t;
  auto f32 = [](const Tensor& x) { return x.to(DType::F32); };
  t["model.embed_tokens.weight"] = f32(m.embed);
  t["model.norm.weight"] = f32(m.final_norm);
  if (!c.tie_word_embeddings) t["lm_head.weight"] = f32(m.lm_head.weight);
  for (std::size_t i = 0; i < m.layers.size(); ++i) {
    const auto& l = m.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = f32(l.attn_norm);
    t[p + "self_attn.q_proj.weight"] = f32(permute_rope_rows(l.wq.weight, c.num_heads, false));
    t[p + "self_attn.k_proj.weight"] = f32(permute_rope_rows(l.wk.weight, c.num_kv_heads, false));
    t[p + "self_attn.v_proj.weight"] = f32(l.wv.weight);
    t[p + "self_attn.o_proj.weight"] = f32(l.wo.weight);
    t[p + "post_attention_layernorm.weight"] = f32(l.mlp_norm);
    t[p + "mlp.gate_proj.weight"] = f32(l.w_gate.weight);
    t[p + "mlp.up_proj.weight"] = f32(l.w_up.weight);
    t[p + "mlp.down_proj.weight"] = f32(l.w_down.weight);
  }
  save_llama2c(out_file, c, t);
}

}  // namespace inferlab::ch01
