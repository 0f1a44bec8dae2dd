// A Hugging Face config.json for every architecture the project loads, structure-aware: the seeds
// are the bundled models' configs (Llama, GQA/MQA, MLA, CLA, sliding-window and hybrid, Mamba, LTI,
// masked diffusion), and the custom mutator changes one field of a valid config at a time (a
// field at any depth, given an edge value: 0, -1, 2.5, 1e300, 1e-300, 2^31, 2^64, a string, null,
// a list, an object, or another field's value), so that inputs stay JSON and reach each field's
// check. Each config is then given to every loader: the ones that need weights stop at the
// missing checkpoint with an inferlab::Error after their config checks.
#include <cstring>
#include <random>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/llama.h"
#include "chapters/08_diffusion_lm/diffusion.h"
#include "common/hf_config.h"
#include "common/models/cla.h"
#include "common/models/local.h"
#include "common/models/mamba.h"
#include "common/models/mla.h"
#include "fuzz_util.h"

extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

namespace {

using nlohmann::json;

// Every value inside j (objects' fields and lists' entries), depth first.
void values(json& j, std::vector<json*>& out) {
  if (j.is_object())
    for (auto& [k, v] : j.items()) out.push_back(&v), values(v, out);
  else if (j.is_array())
    for (auto& v : j) out.push_back(&v), values(v, out);
}

json edge_value(std::mt19937& g, const std::vector<json*>& all) {
  static const json edges = json::parse(R"([0, -1, 1, 2, 2.5, -2.5, 1e300, -1e300, 1e-300, 1e-45, 65504, 2147483648,
      4294967297, 9223372036854775807, 18446744073709551615, -9223372036854775808, "", "x", "silu", "yarn",
      "sliding_attention", true, false, null, [], {}, [1, "a"], [0, 2.5], {"type": "yarn", "factor": 1e-30},
      {"rope_type": "llama3", "factor": 8.0}])");
  if (g() % 4 == 0) return *all[g() % all.size()];  // another field's value
  return edges[g() % edges.size()];
}

}  // namespace

extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size, unsigned seed) {
  json j = json::parse(data, data + size, nullptr, false);
  std::mt19937 g(seed);
  if (j.is_discarded() || !j.is_object() || g() % 16 == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::vector<json*> all;
  values(j, all);
  if (all.empty()) return LLVMFuzzerMutate(data, size, max_size);
  json* target = all[g() % all.size()];
  if (g() % 8 == 0 && j.size() > 1) {  // a field left out
    auto it = j.begin();
    std::advance(it, g() % j.size());
    j.erase(it);
  } else {
    *target = edge_value(g, all);
  }
  const std::string out = j.dump();
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  fuzz::write_input(data, size, "config.json");
  const std::string dir = fuzz::work_dir();
  fuzz::expect_clean([&] {
    const HfConfig hf = load_hf_config(dir);
    const TransformerConfig c = parse_transformer_config(hf);
    c.num_parameters();
    c.kv_cache_bytes(c.max_position_embeddings, 4);
    models::rope_frequencies(c);
    models::mla::parse_mla_config(hf, c);
    models::local::parse_local_layout(hf, c.num_layers);
  });
  fuzz::expect_clean([&] { models::mamba::parse_mamba_config(load_hf_config(dir)).num_parameters(); });
  for (auto load :
       {+[](const std::string& d) { models::load_llama(d); }, +[](const std::string& d) { models::mla::load_mla(d); },
        +[](const std::string& d) { models::cla::load_cla(d); }, +[](const std::string& d) { models::local::load_local(d); },
        +[](const std::string& d) { models::mamba::load_mamba(d); }, +[](const std::string& d) { ch08::load_diffusion(d); }})
    fuzz::expect_clean([&] { load(dir); });
  return 0;
}
