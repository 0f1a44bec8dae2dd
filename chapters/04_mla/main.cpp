// ch04_mla: multi-head latent attention. What one token costs in the cache: MLA's latent row
// against the MHA, GQA and MQA caches of the same model, for tiny-mla and for DeepSeek-V2.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <nlohmann/json.hpp>

#include "chapters/04_mla/mla.h"
#include "common/cli.h"

using namespace inferlab;
using nlohmann::json;

namespace {

// The same heads as a Llama-style cache of K heads: per token and layer K keys of dn + dr values
// and K values of dv. kv_cache_bytes counts 2·K·H per layer, so H = (dn + dr + dv) / 2 counts both
// exactly (both models here have an even sum).
TransformerConfig as_llama_cache(const TransformerConfig& c, const ch04::MlaConfig& mla, std::int64_t kv_heads) {
  TransformerConfig t = c;
  IL_CHECK((mla.qk_head_dim() + mla.v_head_dim) % 2 == 0, "ch04: dn + dr + dv is odd; the comparison needs it even");
  t.num_kv_heads = kv_heads;
  t.head_dim = (mla.qk_head_dim() + mla.v_head_dim) / 2;
  return t;
}

std::string ratio(std::int64_t a, std::int64_t b) {
  const std::int64_t g = std::gcd(a, b);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.2f× (%lld/%lld)", static_cast<double>(a) / static_cast<double>(b),
                static_cast<long long>(a / g), static_cast<long long>(b / g));
  return buf;
}

json table(const char* name, const TransformerConfig& c, const ch04::MlaConfig& mla, std::int64_t bytes_per_value,
           const char* dtype) {
  const std::int64_t N = c.num_heads;
  const std::int64_t mla_bytes = mla.latent_dim() * c.num_layers * bytes_per_value;
  std::printf("%s: L = %lld, N = %lld, dn = %lld, dr = %lld, dv = %lld, r = %lld; %s cache, per token (all layers)\n",
              name, static_cast<long long>(c.num_layers), static_cast<long long>(N),
              static_cast<long long>(mla.qk_nope_head_dim), static_cast<long long>(mla.qk_rope_head_dim),
              static_cast<long long>(mla.v_head_dim), static_cast<long long>(mla.kv_lora_rank), dtype);
  std::printf("  %-22s %14s   %s\n", "cache", "bytes/token", "MLA is smaller by");
  std::printf("  %-22s %14lld\n", "MLA [c ‖ k_pe]", static_cast<long long>(mla_bytes));
  json rows = json::array();
  rows.push_back({{"cache", "MLA"}, {"bytes_per_token", mla_bytes}});
  const std::int64_t groups = N > 8 ? 8 : std::max<std::int64_t>(1, N / 4);  // GQA: 8 groups, as DeepSeek-V2 compares
  for (std::int64_t K : {N, groups, std::int64_t{1}}) {
    const std::int64_t b = as_llama_cache(c, mla, K).kv_cache_bytes(1, bytes_per_value);
    char label[48];
    std::snprintf(label, sizeof label, "%s, K = %lld", K == N ? "MHA" : K == 1 ? "MQA" : "GQA", static_cast<long long>(K));
    std::printf("  %-22s %14lld   %s\n", label, static_cast<long long>(b), ratio(b, mla_bytes).c_str());
    rows.push_back({{"cache", label}, {"kv_heads", K}, {"bytes_per_token", b}});
  }
  return {{"model", name}, {"bytes_per_value", bytes_per_value}, {"rows", rows}};
}

int headline(const std::string& json_path) {
  const std::string path = data_dir() + "/models/tiny-mla";
  const HfConfig hf = load_hf_config(path);
  const TransformerConfig c = parse_transformer_config(hf);
  const ch04::MlaConfig mla = ch04::parse_mla_config(hf, c);
  json out;
  out["tiny-mla"] = table("tiny-mla", c, mla, 4, "f32");
  // DeepSeek-V2 (its paper, Table 1 and appendix): 60 layers, 128 heads, r = 512, dr = 64.
  TransformerConfig v2 = c;
  v2.num_layers = 60, v2.num_heads = 128, v2.num_kv_heads = 128, v2.hidden_size = 5120;
  ch04::MlaConfig v2m;
  v2m.kv_lora_rank = 512, v2m.qk_nope_head_dim = 128, v2m.qk_rope_head_dim = 64, v2m.v_head_dim = 128, v2m.q_lora_rank = 1536;
  std::printf("\n");
  out["DeepSeek-V2"] = table("DeepSeek-V2", v2, v2m, 2, "bf16");
  const std::int64_t paper_mha = 2 * 128 * 128;  // the paper's MHA: 2·N·d_h values per layer, d_h = 128
  std::printf("  (the paper compares with MHA of d_h = 128 for keys and values: 2·N·d_h = %lld values per layer\n"
              "   against %lld, %s; the lecture's 16384 → 512 counts only one of K and V and leaves out k_pe)\n",
              static_cast<long long>(paper_mha), static_cast<long long>(v2m.latent_dim()),
              ratio(paper_mha, v2m.latent_dim()).c_str());
  std::printf("\nMLA stores one row per token and layer for all heads, as MQA does, yet each head gets its own keys\n"
              "and values back from it (W_KVB); the absorbed decode path never rebuilds them (chapters/04_mla/mla.h).\n");
  if (!json_path.empty()) write_json(json_path, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Chapter 04: multi-head latent attention", "ch04_mla"};
  std::string json_path;
  add_json_option(app, json_path);
  help_footer(app, "the cache bytes per token of tiny-mla's latent rows against an MHA, GQA and MQA cache of the same "
              "heads, and the same for DeepSeek-V2's dimensions, with the exact ratios",
              "chapters/04_mla/README.md", "多头潜在注意力（MLA）");
  return run_cli(app, argc, argv, [&] { return headline(json_path); });
}
