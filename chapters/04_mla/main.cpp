// ch04_mla: multi-head latent attention.
//   ch04_mla            the cache bytes per token (MLA against MHA, GQA and MQA of the same heads,
//                       tiny-mla and DeepSeek-V2), then one MLA layer's decode step by the plain and
//                       the absorbed path, measured against context length and rows per step, then
//                       the weight bytes of mixture-of-experts decode (k of E experts) by batch size
//   ch04_mla quality    tiny-mla's perplexity and probes beside tiny-mha, tiny-gqa and tiny-mqa
//   ch04_mla generate   text from an MLA model (tiny-mla, a DeepseekV2/V3 folder or a deepseek2 GGUF) by both paths
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>
#include <random>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/04_mla/moe_decode.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/eval.h"
#include "common/gguf_tokenizer.h"
#include "common/metrics.h"
#include "common/models/mla.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using nlohmann::json;

namespace {

// The same heads as a Llama-style cache of K heads: per token and layer K keys of dn + dr values
// and K values of dv. kv_cache_bytes counts 2·K·H per layer, so H = (dn + dr + dv) / 2 counts both
// exactly (both models here have an even sum).
TransformerConfig as_llama_cache(const TransformerConfig& c, const models::mla::MlaConfig& mla, std::int64_t kv_heads) {
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

json table(const char* name, const TransformerConfig& c, const models::mla::MlaConfig& mla, std::int64_t bytes_per_value,
           const char* dtype) {
  const std::int64_t N = c.num_heads;
  const std::int64_t mla_bytes = mla.latent_dim() * c.num_layers * bytes_per_value;
  std::printf("%s: L = %lld, N = %lld, dn = %lld, dr = %lld, dv = %lld, r = %lld; %s cache, per token (all layers)\n", name,
              static_cast<long long>(c.num_layers), static_cast<long long>(N), static_cast<long long>(mla.qk_nope_head_dim),
              static_cast<long long>(mla.qk_rope_head_dim), static_cast<long long>(mla.v_head_dim),
              static_cast<long long>(mla.kv_lora_rank), dtype);
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

// One layer of a DeepSeek-V2-shaped MLA model with 16 of its 128 heads (r, dr, dn, dv as the real
// one), random weights: big enough that weights and caches live in DRAM, small enough that the
// plain path's rebuild takes a fraction of a second on a laptop.
struct DecodeLayer {
  TransformerConfig c;
  models::mla::MlaConfig mla;
  models::mla::MlaModel m;
  DecodeLayer() {
    c.architecture = "DeepseekV3ForCausalLM";
    c.hidden_size = 2048, c.intermediate_size = 64, c.num_layers = 1, c.num_heads = 16, c.num_kv_heads = 16;
    c.head_dim = 64, c.vocab_size = 256, c.max_position_embeddings = 1 << 20, c.rms_norm_eps = 1e-6, c.rope_theta = 1e4;
    mla.kv_lora_rank = 512, mla.qk_rope_head_dim = 64, mla.qk_nope_head_dim = 128, mla.v_head_dim = 128;
    m = models::mla::random_mla(c, mla, 7);
  }
  // The attention weights one step reads (W_UK and W_UV are W_KVB's values, read once either way).
  double weight_bytes() const {
    const models::mla::MlaAttention& a = m.attn[0];
    return static_cast<double>(a.wq.weight.nbytes() + a.wkv_a.weight.nbytes() + a.wkv_b.weight.nbytes() +
                               a.wo.weight.nbytes());
  }
};

struct Measured {
  double seconds = 0, flops = 0, bytes = 0;
};

// T new rows of one sequence after S cached positions of random latent rows, through one
// attention block: best of `reps` after a warm-up that counts the FLOPs.
Measured measure_block(const DecodeLayer& L, std::int64_t S, std::int64_t T, models::mla::MlaPath path, int reps) {
  models::mla::LatentCache cache(L.c, L.mla, S + T);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor rows = Tensor::empty({S, L.mla.latent_dim()}, DType::F32);
  for (std::int64_t i = 0; i < rows.numel(); ++i) rows.data<float>()[i] = dist(rng);
  cache.append(0, rows);
  cache.commit(S);
  Tensor h = Tensor::empty({T, L.c.hidden_size}, DType::F32);
  for (std::int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = dist(rng);
  std::vector<models::SequenceStep> seqs{{std::vector<std::int32_t>(static_cast<std::size_t>(T), 1), &cache}};
  const models::Batch batch(L.m.base, seqs);
  Measured out;
  {
    metrics::CountScope scope;
    models::mla::attention_block(L.m, L.m.attn[0], h, batch, 0, path);
    out.flops = scope.work().flops;
  }
  out.seconds = 1e300;
  for (int i = 0; i < reps; ++i) {
    metrics::Timer t(metrics::Clock::Work);  // the CPU's work
    models::mla::attention_block(L.m, L.m.attn[0], h, batch, 0, path);
    out.seconds = std::min(out.seconds, t.seconds());
  }
  const models::mla::MlaCost cost = models::mla::mla_cost(L.mla, L.c.hidden_size, L.c.num_heads, T, S, path);
  out.bytes = L.weight_bytes() + cost.cache_bytes + cost.rebuilt_bytes;
  return out;
}

const char* path_name(models::mla::MlaPath p) { return p == models::mla::MlaPath::Plain ? "plain" : "absorbed"; }

json decode_steps(const metrics::Ceiling& roof) {
  const DecodeLayer L;
  std::printf(
      "\nOne decode step of one MLA layer (N = 16 heads, D = 2048, r = 512, dr = 64, dn = dv = 128; random "
      "weights, f32), best of 3:\n");
  std::printf(
      "  (GB/s against a streaming read over as many bytes as the step moves: one layer's weights and cache are\n"
      "   tens of MB, which a %s last-level cache holds between steps, and then its ceiling is the cache's)\n",
      metrics::human_bytes(metrics::last_level_cache_bytes()).c_str());
  std::printf("  %6s %-9s %12s %10s %10s %15s %22s %10s\n", "S", "path", "GFLOP", "MB moved", "ms", "GFLOP/s (peak)",
              "GB/s (of the ceiling)", "roofline");
  json rows = json::array();
  metrics::CeilingLegend legend;
  for (std::int64_t S : {256, 1024, 4096}) {
    double plain_s = 0;
    for (models::mla::MlaPath path : {models::mla::MlaPath::Plain, models::mla::MlaPath::Absorbed}) {
      const Measured m = measure_block(L, S, 1, path, 3);
      const auto read = metrics::read_ceiling_for(roof, m.bytes);
      const double roofline = std::max(m.bytes / read.bytes_per_s(), m.flops / roof.flops_per_s);
      if (path == models::mla::MlaPath::Plain) plain_s = m.seconds;
      std::printf("  %6lld %-9s %12.3f %10.1f %10.2f %8.1f (%3.0f%%) %6.1f (%3.0f%% %-8s) %7.2f ms",
                  static_cast<long long>(S), path_name(path), m.flops / 1e9, m.bytes / 1e6, m.seconds * 1e3,
                  m.flops / m.seconds / 1e9, 100 * m.flops / m.seconds / roof.flops_per_s, m.bytes / m.seconds / 1e9,
                  legend.percent(std::string(path_name(path)) + " at S = " + std::to_string(S), m.bytes / m.seconds, read),
                  read.kind.c_str(), roofline * 1e3);
      if (path == models::mla::MlaPath::Absorbed) std::printf("   %.1f× faster", plain_s / m.seconds);
      std::printf("\n");
      rows.push_back({{"context", S},
                      {"rows", 1},
                      {"path", path_name(path)},
                      {"flops", m.flops},
                      {"bytes", m.bytes},
                      {"seconds", m.seconds},
                      {"roofline_seconds", roofline},
                      {"read_ceiling", metrics::to_json(read)}});
    }
  }
  legend.print("  ");
  std::printf(
      "  The plain path rebuilds every cached position's K and V (2·S·r·N·(dn + dv) FLOPs) and is compute-bound;\n"
      "  the absorbed path reads the same latent rows and multiplies only the new token's query into them.\n");

  const std::int64_t S = 1024;
  const double cross = models::mla::crossover_rows(L.mla);
  std::printf(
      "\nRows per step (a prefill chunk, or speculative verification) at S = %lld cached positions: the "
      "absorbed path's\nattention works in r + dr = 576 dims instead of dn + dr = 192, so above r·(dn + dv) / "
      "(2r − dn − dv) = %.1f rows\nthe plain path, whose rebuild is paid once for all rows, needs fewer FLOPs:\n",
      static_cast<long long>(S), cross);
  std::printf("  %5s %16s %16s %12s %12s %10s\n", "T", "plain GFLOP", "absorbed GFLOP", "plain ms", "absorbed ms", "faster");
  for (std::int64_t T : {1, 16, 64, 256, 512}) {
    const Measured p = measure_block(L, S, T, models::mla::MlaPath::Plain, 2),
                   a = measure_block(L, S, T, models::mla::MlaPath::Absorbed, 2);
    std::printf("  %5lld %16.3f %16.3f %12.2f %12.2f %10s\n", static_cast<long long>(T), p.flops / 1e9, a.flops / 1e9,
                p.seconds * 1e3, a.seconds * 1e3, p.seconds < a.seconds ? "plain" : "absorbed");
    rows.push_back(
        {{"context", S}, {"rows", T}, {"path", "plain"}, {"flops", p.flops}, {"bytes", p.bytes}, {"seconds", p.seconds}});
    rows.push_back(
        {{"context", S}, {"rows", T}, {"path", "absorbed"}, {"flops", a.flops}, {"bytes", a.bytes}, {"seconds", a.seconds}});
  }
  std::printf("  Decode (T = 1) absorbs, prefill of long chunks rebuilds: what DeepSeek's inference code does too.\n");
  return {{"steps", rows}, {"crossover_rows", cross}};
}

// The decode steps of decode_steps() (one row each) against context: each path measured, and
// its roofline (the slower of its bytes at the read ceiling and its FLOPs at the peak) dashed.
void plot_decode(const json& steps, const std::string& path) {
  plot::Figure f;
  f.title = "One MLA layer's decode step: plain (rebuild K, V) against absorbed, by context";
  f.x.label = "cached positions S";
  f.y.label = "time per decode step (ms, best of 3)";
  f.x.log = f.y.log = true;
  for (const char* name : {"plain", "absorbed"}) {
    plot::Series m, r;
    m.label = std::string(name) + ", measured";
    r.label = std::string(name) + ", roofline";
    m.markers = r.dashed = true;
    m.color = r.color = name[0] == 'p' ? "#d62728" : "#1f77b4";
    for (const json& row : steps)
      if (row["rows"] == 1 && row["path"] == name && row.contains("roofline_seconds")) {  // the decode rows
        m.x.push_back(row["context"].get<double>()), m.y.push_back(row["seconds"].get<double>() * 1e3);
        r.x.push_back(row["context"].get<double>()), r.y.push_back(row["roofline_seconds"].get<double>() * 1e3);
      }
    f.series.push_back(m), f.series.push_back(r);
  }
  plot::save_svg(f, path);
  std::printf("wrote %s\n", path.c_str());
}

int headline(const std::string& json_path, const std::string& svg) {
  const std::string path = data_dir() + "/models/tiny-mla";
  const HfConfig hf = load_hf_config(path);
  const TransformerConfig c = parse_transformer_config(hf);
  const models::mla::MlaConfig mla = models::mla::parse_mla_config(hf, c);
  json out;
  out["tiny-mla"] = table("tiny-mla", c, mla, 4, "f32");
  // DeepSeek-V2 (its paper, Table 1 and appendix): 60 layers, 128 heads, r = 512, dr = 64.
  TransformerConfig v2 = c;
  v2.num_layers = 60, v2.num_heads = 128, v2.num_kv_heads = 128, v2.hidden_size = 5120;
  models::mla::MlaConfig v2m;
  v2m.kv_lora_rank = 512, v2m.qk_nope_head_dim = 128, v2m.qk_rope_head_dim = 64, v2m.v_head_dim = 128,
  v2m.q_lora_rank = 1536;
  std::printf("\n");
  out["DeepSeek-V2"] = table("DeepSeek-V2", v2, v2m, 2, "bf16");
  const std::int64_t paper_mha = 2 * 128 * 128;  // the paper's MHA: 2·N·d_h values per layer, d_h = 128
  std::printf(
      "  (the paper compares with MHA of d_h = 128 for keys and values: 2·N·d_h = %lld values per layer\n"
      "   against %lld, %s; the lecture's 16384 → 512 counts only one of K and V and leaves out k_pe)\n",
      static_cast<long long>(paper_mha), static_cast<long long>(v2m.latent_dim()),
      ratio(paper_mha, v2m.latent_dim()).c_str());
  // The ceilings, measured briefly (3 runs, a 1024³ GEMM).
  const metrics::Ceiling roof = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf("\nMeasured here: %s read from memory, %s (f32 GEMM 1024³)\n", metrics::describe(roof.read, "B").c_str(),
              metrics::describe(roof.compute, "FLOP").c_str());
  out["ceiling"] = metrics::to_json(roof);
  out["decode"] = decode_steps(roof);
  out["moe"] = ch04::moe_decode_table();
  std::printf(
      "\nMLA stores one row per token and layer for all heads, as MQA does, yet each head gets its own keys\n"
      "and values back from it (W_KVB). More: ch04_mla quality; chapters/04_mla/README.md.\n");
  if (!svg.empty()) plot_decode(out["decode"]["steps"], svg);
  if (!json_path.empty()) write_json(json_path, out);
  return 0;
}

int quality(const std::string& json_path, std::int64_t windows, std::int64_t per_kind) {
  const std::string data = data_dir();
  std::printf("Validation perplexity (%s windows of 512) and probe accuracy (%lld per kind)\n\n",
              windows ? std::to_string(windows).c_str() : "all", static_cast<long long>(per_kind));
  std::vector<eval::Scored> rows;
  const models::mla::MlaModel mla = models::mla::load_mla(data + "/models/tiny-mla");
  rows.push_back({"tiny-mla", mla.mla.latent_dim() * mla.config().num_layers * 4, [&](const std::vector<std::int32_t>& t) {
                    models::mla::LatentCache cache(mla.config(), mla.mla, static_cast<std::int64_t>(t.size()));
                    return models::mla::forward_cached(mla, cache, t, true);
                  }});
  std::vector<models::Llama> llamas;
  for (const char* name : {"tiny-mha", "tiny-gqa", "tiny-mqa"})
    llamas.push_back(models::load_llama(data + "/models/" + name));
  for (const models::Llama& m : llamas)
    rows.push_back({m.source.substr(m.source.find_last_of('/') + 1), m.config.kv_cache_bytes(1, 4),
                    [&m](const std::vector<std::int32_t>& t) { return ch01::forward(m, t, true); }});
  const json out = eval::quality_table(rows, data, windows, per_kind);
  if (!json_path.empty()) write_json(json_path, {{"rows", out}, {"probes_per_kind", per_kind}});
  return 0;
}

// Text from an MLA model through the latent cache, by the absorbed path (streamed) and then the
// plain one: the same tokens (greedy), and what each step cost.
int generate(const CommonOptions& o) {
  const models::mla::MlaModel m = models::mla::load_mla(o.model);
  // A GGUF file carries its tokenizer (tokenizer.ggml.*) and the ids llama.cpp stops at.
  const bool gguf_file = std::filesystem::path(o.model).extension() == ".gguf";
  const auto tok = gguf_file ? Tokenizer::load(o.model) : Tokenizer::for_model(o.model);
  const auto prompt = tok->encode(o.prompt);
  const auto& c = m.config();
  std::vector<std::int64_t> stops = c.eos_token_ids;
  if (gguf_file)
    for (std::int64_t id : gguf::stop_ids(gguf::File(o.model)))
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
  models::check_context(m.base, prompt.size(), o.max_new_tokens);
  const std::int64_t S = static_cast<std::int64_t>(prompt.size()) + o.max_new_tokens;
  const models::mla::LatentCache cache(c, m.mla, S);
  std::printf(
      "%s, %.2f M parameters; latent cache for S = %lld: %lld bytes (r + dr = %lld values per token and "
      "layer), an MHA cache of the same heads: %lld\n\n",
      m.base.source.c_str(), static_cast<double>(c.num_parameters()) / 1e6, static_cast<long long>(S),
      static_cast<long long>(cache.bytes()), static_cast<long long>(m.mla.latent_dim()),
      static_cast<long long>(S * c.num_layers * c.num_heads * (m.mla.qk_head_dim() + m.mla.v_head_dim) * 4));
  const SamplingParams sp = o.sampling(*tok, c.vocab_size);
  json runs = json::array();
  std::vector<std::int32_t> first;
  for (models::mla::MlaPath path : {models::mla::MlaPath::Absorbed, models::mla::MlaPath::Plain}) {
    Sampler sampler(sp);
    const bool show = path == models::mla::MlaPath::Absorbed;  // the text once; the plain path's tokens are compared
    std::optional<TextStream> stream;
    if (show) stream.emplace(*tok, prompt);
    const models::Generation g =
        models::mla::generate_cached(m, prompt, o.max_new_tokens, sampler, stops, path, [&](const models::Generation& gen) {
          if (stream) stream->print(gen.tokens);
        });
    if (show) std::printf("\n\n"), first = g.generated;
    std::printf("%-9s %3zu tokens: time to first token %7.2f ms, %7.2f ms per later token, %7.1f tokens/s%s\n",
                path_name(path), g.generated.size(), g.ttft_s() * 1e3, g.tpot_s() * 1e3, g.tokens_per_s(),
                show ? "" : (g.generated == first ? "  (the same tokens)" : "  (different tokens)"));
    runs.push_back({{"path", path_name(path)},
                    {"generated", g.generated},
                    {"ttft_s", g.ttft_s()},
                    {"tpot_s", g.tpot_s()},
                    {"tokens_per_s", g.tokens_per_s()}});
  }
  if (!o.json.empty())
    write_json(o.json,
               {{"model", o.model},
                {"prompt", o.prompt},
                {"prompt_tokens", prompt},
                {"cache_bytes", cache.bytes()},
                {"runs", runs}},
               {o.model});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 04: multi-head latent attention", "ch04_mla"};
  std::string json_path;
  add_json_option(app, json_path);
  std::string svg;
  app.add_option("--svg", svg, "Also plot the decode step of both paths against context as SVG")->check(output_file());
  help_footer(app,
              "the cache bytes per token of tiny-mla's latent rows against an MHA, GQA and MQA cache of the same "
              "heads (and for DeepSeek-V2's dimensions, with the exact ratios), then one MLA layer's decode step by "
              "the plain and the absorbed path against context length and rows per step, beside the measured ceilings; "
              "then the weight bytes of mixture-of-experts decode against a dense FFN of the same active size, and the "
              "experts a batch touches",
              "chapters/04_mla/README.md", "多头潜在注意力（MLA）");
  std::int64_t windows = 0, per_kind = 200;
  auto* sq = app.add_subcommand("quality", "tiny-mla's perplexity and probes beside tiny-mha, tiny-gqa and tiny-mqa");
  add_json_option(*sq, json_path);
  add_quality_options(*sq, windows, per_kind);
  CommonOptions go;
  go.model = data_dir() + "/models/tiny-mla";
  auto* sg = app.add_subcommand(
      "generate", "Text from an MLA model (a DeepseekV3ForCausalLM folder, or a deepseek2 GGUF) by both decode paths");
  add_model_option(*sg, go);
  add_generation_options(*sg, go);
  add_json_option(*sg, go.json);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*sq) return quality(json_path, windows, per_kind);
    if (*sg) return generate(go);
    return headline(json_path, svg);
  });
}
