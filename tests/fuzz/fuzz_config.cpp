// A config.json: parsed, checked, and turned into the RoPE frequencies it asks for.
#include "chapters/01_naive_decode/llama.h"
#include "common/hf_config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  fuzz::write_input(data, size, "config.json");
  fuzz::expect_clean([] {
    const TransformerConfig c = parse_transformer_config(load_hf_config(fuzz::work_dir()));
    c.num_parameters();
    c.kv_cache_bytes(c.max_position_embeddings, 4);
    models::rope_frequencies(c);
  });
  return 0;
}
