// config.json: Llama-family hyper-parameters, parameter counts checked against published
// figures, and clear errors for missing or mistyped fields.
#include "common/hf_config.h"
#include "common/ops.h"
#include "test_util.h"

namespace inferlab {
namespace {

using test::expect_error;

TransformerConfig parse(const std::string& json_text) {
  test::TempDir dir;
  test::write_file(dir.file("config.json"), json_text);
  return parse_transformer_config(load_hf_config(dir.path().string()));
}

TEST(Config, PublishedParameterCounts) {
  // Parameter counts published with the checkpoints (model cards / safetensors metadata).
  const TransformerConfig llama2_7b = parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":4096,
      "intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,
      "vocab_size":32000,"rms_norm_eps":1e-5,"max_position_embeddings":4096,"bos_token_id":1,"eos_token_id":2})");
  EXPECT_EQ(llama2_7b.num_parameters(), 6738415616);
  EXPECT_EQ(llama2_7b.head_dim, 128);
  EXPECT_EQ(llama2_7b.num_kv_heads, 32);
  EXPECT_EQ(llama2_7b.eos_token_ids, (std::vector<std::int64_t>{2}));
  // The lecture's Llama 2 70B example: 4096 tokens x 8 KV heads x 128 x 80 layers x 2 (K and V)
  // x 2 bytes = 1,342,177,280 bytes (the lecture prints 671,088,640, one factor of 2 short).
  const TransformerConfig llama2_70b = parse(R"({"hidden_size":8192,"intermediate_size":28672,"num_hidden_layers":80,
      "num_attention_heads":64,"num_key_value_heads":8,"vocab_size":32000})");
  EXPECT_EQ(llama2_70b.kv_cache_bytes(4096, 2), 1342177280);
  EXPECT_EQ(llama2_70b.num_parameters(), 68976648192);
  const TransformerConfig llama3_8b = parse(R"({"hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,
      "num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"rope_theta":500000.0,
      "eos_token_id":[128001,128009],"torch_dtype":"bfloat16"})");
  EXPECT_EQ(llama3_8b.num_parameters(), 8030261248);
  EXPECT_EQ(llama3_8b.rope_theta, 500000.0);
  EXPECT_EQ(llama3_8b.eos_token_ids, (std::vector<std::int64_t>{128001, 128009}));
  EXPECT_EQ(llama3_8b.torch_dtype, "bfloat16");
  const TransformerConfig tinyllama = parse(R"({"hidden_size":2048,"intermediate_size":5632,"num_hidden_layers":22,
      "num_attention_heads":32,"num_key_value_heads":4,"vocab_size":32000})");
  EXPECT_EQ(tinyllama.num_parameters(), 1100048384);
  // Qwen2.5-0.5B: tied embeddings and q/k/v biases (implied by model_type qwen2).
  const TransformerConfig qwen = parse(R"({"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,
      "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,
      "tie_word_embeddings":true})");
  EXPECT_TRUE(qwen.attention_bias);
  EXPECT_TRUE(parse(R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":896,"intermediate_size":4864,
      "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936})")
                  .attention_bias)
      << "implied by the architecture without model_type";
  EXPECT_EQ(qwen.num_parameters(), 494032768);
}

TEST(Config, MissingAndMistypedFieldsAreNamed) {
  test::TempDir dir;
  const std::string path = dir.file("config.json");
  test::write_file(path, R"({"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":10})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {path, "missing field 'intermediate_size'"});
  test::write_file(path, R"({"hidden_size":"64","intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {"'hidden_size' must be an integer", "\"64\""});
  test::write_file(path, R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"num_key_value_heads":3,"vocab_size":10})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {"not a multiple of num_key_value_heads 3"});
  test::write_file(path, R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":0,
      "num_attention_heads":4,"vocab_size":10})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {"'num_hidden_layers' must be in [1, 4096], got 0"});
  // Absurd sizes are refused before anything multiplies them out (a product would overflow).
  test::write_file(path, R"({"hidden_size":1e15,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {"hidden_size"});
  test::write_file(path, R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10,"max_position_embeddings":-5})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {"'max_position_embeddings' must be in [1, "});
  test::write_file(path, R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10,"rms_norm_eps":-1e-5})");
  expect_error([&] { parse_transformer_config(load_hf_config(path)); }, {"rms_norm_eps must be positive"});
  test::write_file(path, R"({"hidden_size": 64,)");
  expect_error([&] { load_hf_config(path); }, {path, "not valid JSON"});
  expect_error([&] { load_hf_config(dir.file("nowhere")); }, {"nowhere", "config.json"});
  test::write_file(dir.file("model.safetensors"), "not a config");
  expect_error([&] { load_hf_config(dir.file("model.safetensors")); },
               {"model.safetensors is not a Hugging Face model: expected its folder or its config.json"});
}

TEST(Config, FieldsThatChangeTheMathAreImplementedOrRefusedByName) {
  // Each of these used to load and compute something other than the model the file describes.
  test::TempDir dir;
  const std::string path = dir.file("config.json");
  const std::string base = R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10,)";
  const struct {
    std::string fields;
    std::vector<std::string> words;
  } cases[] = {
      {R"("hidden_act":"gelu")", {"field 'hidden_act' is 'gelu'", "SiLU"}},
      {R"("partial_rotary_factor":0.5)", {"field 'partial_rotary_factor' is not 1"}},
      {R"("rms_norm_eps":1e39)", {"rms_norm_eps must be positive and within float32's range, got 1e+39"}},
      {R"("rms_norm_eps":1e-50)", {"rms_norm_eps must be positive and within float32's range"}},
      {R"("rope_scaling":{"rope_type":"linear","factor":-2.0})",
       {"field 'rope_scaling'", "'factor' must be positive, got -2"}},
      {R"("rope_scaling":{"type":"linear","factor":0})", {"field 'rope_scaling'", "'factor' must be positive, got 0"}},
      {R"("rope_scaling":{"type":"linear"})", {"field 'rope_scaling'", "missing field 'factor'"}},
      {R"("rope_scaling":{"rope_type":"dynamic","factor":4.0})",
       {"field 'rope_scaling'", "type 'dynamic' is not supported"}},
      {R"("rope_scaling":{"type":"yarn","factor":4.0,"beta_fast":1,"beta_slow":32})",
       {"field 'rope_scaling'", "'beta_fast' (1) must not be below 'beta_slow' (32)"}},
      {R"("rope_scaling":{"type":"yarn","factor":4.0,"mscale_all_dim":-1})",
       {"field 'rope_scaling'", "'mscale_all_dim' must be a finite non-negative number, got -1"}},
      {R"("rope_scaling":{"type":"yarn","factor":4.0,"original_max_position_embeddings":"4k"})",
       {"field 'rope_scaling'", "field 'original_max_position_embeddings' must be a number"}},
      {R"("rope_scaling":{"type":"yarn","factor":4.0,"truncate":1})",
       {"field 'rope_scaling'", "field 'truncate' must be true or false"}},
      {R"("rope_scaling":{"type":"yarn","factor":4.0,"attention_factor":0})",
       {"field 'rope_scaling'", "'attention_factor' must be positive"}},
      {R"("rope_scaling":{"type":"yarn"})", {"field 'rope_scaling'", "missing field 'factor'"}},
      // a tiny factor failed only at the first forward pass, with NaN
      {R"("rope_scaling":{"type":"yarn","factor":1e-300})",
       {"field 'rope_scaling'", "'factor' must be at least 1 for YaRN"}},
      {R"("rope_scaling":{"type":"yarn","factor":0.5})", {"'factor' must be at least 1 for YaRN, got 0.5"}},
      {R"("architectures":["LlamaForCausalLM"],"rope_scaling":{"type":"yarn","factor":4.0})",
       {"field 'rope_scaling'", "type 'yarn' is implemented for DeepseekV3ForCausalLM and DeepseekV2ForCausalLM",
        "not for architecture 'LlamaForCausalLM'"}},
      {R"("rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":4.0,"high_freq_factor":4.0,
          "original_max_position_embeddings":8192})",
       {"'high_freq_factor' must be above 'low_freq_factor'"}},
      {R"("rope_scaling":"linear")", {"field 'rope_scaling'", "expected a JSON object"}},
      {R"("bos_token_id":4294967297)", {"field 'bos_token_id' = 4294967297", "outside the vocabulary [0, 10)"}},
      {R"("eos_token_id":[2, -1])", {"field 'eos_token_id' = -1", "outside the vocabulary [0, 10)"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fields);
    test::write_file(path, base + c.fields + "}");
    try {
      parse_transformer_config(load_hf_config(path));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      for (const auto& w : c.words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  }
  // What is implemented still loads.
  test::write_file(path, base + R"("hidden_act":"swish","rope_scaling":{"rope_type":"llama3","factor":8.0,
      "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}})");
  EXPECT_EQ(parse_transformer_config(load_hf_config(path)).rope_scaling["factor"], 8.0);
}

// YaRN's fields with transformers' defaults: beta_fast 32 and beta_slow 1 when absent or 0 (it
// reads them with `or`), the original context max_position_embeddings when absent, truncate on.
TEST(HfConfig, YarnFieldsAndTheirDefaults) {
  test::TempDir dir;
  const std::string path = dir.file("config.json");
  const std::string base = R"({"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,
      "num_attention_heads":4,"vocab_size":10,"max_position_embeddings":640,"architectures":["DeepseekV3ForCausalLM"],)";
  test::write_file(path, base + R"("rope_scaling":{"type":"yarn","factor":40,"beta_fast":0}})");
  const TransformerConfig c = parse_transformer_config(load_hf_config(path));
  const YarnScaling d = parse_yarn_scaling(c, path);
  EXPECT_EQ(d.factor, 40.0);
  EXPECT_EQ(d.original_context, 640.0);
  EXPECT_EQ(d.beta_fast, 32.0);
  EXPECT_EQ(d.beta_slow, 1.0);
  EXPECT_TRUE(d.truncate);
  EXPECT_EQ(d.mscale, 0.0);
  EXPECT_EQ(d.attention_factor, 0.0);
  // DeepSeek-V3's own rope_scaling.
  test::write_file(path, base + R"("rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":40,"mscale":1.0,
      "mscale_all_dim":1.0,"original_max_position_embeddings":4096,"type":"yarn"}})");
  const YarnScaling v3 = parse_yarn_scaling(parse_transformer_config(load_hf_config(path)), path);
  EXPECT_EQ(v3.original_context, 4096.0);
  EXPECT_EQ(v3.mscale_all_dim, 1.0);
  EXPECT_EQ(yarn_attention_factor(v3), 1.0);  // mscale / mscale_all_dim cancel
  // Only a yarn rope_scaling is read as one.
  test::write_file(path, base + R"("rope_scaling":{"type":"linear","factor":2}})");
  test::expect_error([&] { parse_yarn_scaling(parse_transformer_config(load_hf_config(path)), path); },
                     {"field 'rope_scaling'", "type 'linear' is not 'yarn'"});
}

}  // namespace
}  // namespace inferlab
