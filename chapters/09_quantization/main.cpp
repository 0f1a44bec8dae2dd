// ch09_quantization: fewer bits per weight, what they cost in quality and what they buy in speed.
//   ch09_quantization                 a short table on tiny-mha
//   ch09_quantization table           every format (and AWQ) on a model: bytes, perplexity, probes
//   ch09_quantization speed           decode tokens/s and GB/s per format on a larger random model
//   ch09_quantization export OUT.gguf write a q8_0 or q4_0 model as GGUF (llama.cpp's format)
//   ch09_quantization run FILE.gguf   generate with a GGUF model
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/02_kv_cache/kv_cache.h"
#include "chapters/09_quantization/awq.h"
#include "chapters/09_quantization/gguf_model.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/cuda/backend.h"
#include "common/eval.h"

using namespace inferlab;
using namespace inferlab::ch09;
using nlohmann::json;

namespace {

struct Row {
  std::string name;
  ch01::Llama model;
};

// Whether every matrix of m can take the format (K a multiple of its block or group).
bool fits(const ch01::Llama& m, const QuantSpec& s) {
  const std::int64_t g = s.format == Format::Int4Sym || s.format == Format::Int4Asym ? s.group
                         : s.format == Format::Q8_0 || s.format == Format::Q4_0     ? 32
                                                                                     : 1;
  const auto& c = m.config;
  for (std::int64_t k : {c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim})
    if (k % g) return false;
  return true;
}

// The projections and the head as stored; a tied head counts here too (quantisation gives it
// its own copy).
std::int64_t matrix_bytes(const ch01::Llama& m) {
  return m.matrix_bytes() + (m.tied() ? static_cast<std::int64_t>(m.embed.nbytes()) : 0);
}

// Bits per weight of the projections and the head, as stored.
double bits(const ch01::Llama& m) {
  return 8.0 * static_cast<double>(matrix_bytes(m)) / static_cast<double>(matrix_weights(m));
}

std::vector<Row> rows_for(const ch01::Llama& m, const std::vector<QuantSpec>& specs,
                          const std::vector<QuantSpec>& awq_specs, const std::vector<std::int32_t>& calibration) {
  std::vector<Row> rows;
  rows.push_back({"f32 (unquantised)", m});
  for (const auto& s : specs) {
    if (fits(m, s)) rows.push_back({s.name(), quantize_model(m, s)});
    else std::printf("(%s skipped: a matrix width is not a multiple of its group)\n", s.name().c_str());
  }
  for (const QuantSpec& s : awq_specs)
    if (fits(m, s)) {
      std::vector<AwqGroup> report;
      const ch01::Llama q = quantize_model(awq_scale(m, calibration, s, &report), s);
      int better = 0;
      double rtn = 0, awq = 0;
      for (const auto& g : report) better += g.loss_awq < g.loss_rtn, rtn += g.loss_rtn, awq += g.loss_awq;
      std::printf("(AWQ for %s: %d of %zu layer groups found scales better than round-to-nearest; calibration error %.3g -> %.3g)\n",
                  s.name().c_str(), better, report.size(), rtn, awq);
      rows.push_back({"awq " + s.name(), q});
    }
  return rows;
}

int quality(const CommonOptions& o, const std::vector<QuantSpec>& specs, std::int64_t windows, std::int64_t per_kind,
            const std::vector<QuantSpec>& awq) {
  const ch01::Llama m = ch01::load_llama(o.model).to(Device::CPU, DType::F32);
  const auto tok = HfTokenizer::load(o.model);
  const std::string data = data_dir();
  const auto val = eval::tokenize_documents(tok, data + "/corpus/val.txt");
  const auto probes = eval::load_probes(data + "/corpus/probes.jsonl");
  auto calib = eval::tokenize_documents(tok, data + "/corpus/train-sample.txt");
  calib.resize(std::min<std::size_t>(calib.size(), 2048));
  const auto rows = rows_for(m, specs, awq, calib);
  std::printf("%s: the projections and head quantised; perplexity on %s validation windows of 512, probes %lld per kind\n\n",
              o.model.c_str(), windows ? std::to_string(windows).c_str() : "all", static_cast<long long>(per_kind));
  std::printf("%-22s %8s %12s %9s %9s", "format", "bits/w", "matrix bytes", "val ppl", "Δ ppl");
  std::vector<std::string> kinds;
  json out = json::array();
  double base = 0;
  bool first = true;
  for (const auto& r : rows) {
    const eval::LogitsFn f = [&r](const std::vector<std::int32_t>& t) { return ch01::forward(r.model, t, true); };
    const auto ppl = eval::perplexity(f, val, 512, windows, o.model + " as " + r.name + ": validation perplexity");
    eval::ProbeScores pr;
    if (per_kind > 0) pr = eval::probe_accuracy(f, tok, probes, per_kind);
    if (first) {
      for (const auto& [k, v] : pr.accuracy) kinds.push_back(k), std::printf(" %10s", k.c_str());
      std::printf("\n");
      base = ppl.ppl, first = false;
    }
    std::printf("%-22s %8.2f %12lld %9.3f %+9.3f", r.name.c_str(), bits(r.model), static_cast<long long>(matrix_bytes(r.model)), ppl.ppl,
                ppl.ppl - base);
    for (const auto& k : kinds) std::printf(" %10.3f", pr.accuracy.count(k) ? pr.accuracy.at(k) : 0.0);
    std::printf("\n");
    std::fflush(stdout);
    out.push_back({{"format", r.name}, {"bits_per_weight", bits(r.model)}, {"matrix_bytes", matrix_bytes(r.model)},
                   {"val_ppl", ppl.ppl}, {"val_loss", ppl.loss}, {"probes", pr.accuracy}});
  }
  if (!o.json.empty()) write_json(o.json, {{"model", o.model}, {"rows", out}}, {o.model});
  return 0;
}

// A Llama-shaped model large enough to leave the caches, for speed.
TransformerConfig speed_shape() {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 2048, c.intermediate_size = 5632, c.num_layers = 6, c.num_heads = 16, c.num_kv_heads = 4;
  c.head_dim = 128, c.vocab_size = 32000, c.max_position_embeddings = 4096, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  return c;
}

int speed(const CommonOptions& o, const std::vector<QuantSpec>& specs) {
  const Device dev = o.resolved_device();
  const TransformerConfig c = speed_shape();
  const double bw = dev == Device::CUDA ? cuda::measure_read_bandwidth(std::size_t(2) << 30)
                                        : metrics::measure_cpu_read_bandwidth(std::size_t(1) << 30, 0, 5);
  std::printf("Decode speed, B = 1, context 64, random weights (%.0f M parameters), %s; measured read bandwidth %.1f GB/s\n",
              static_cast<double>(c.num_parameters()) / 1e6, device_name(dev).data(), bw / 1e9);
  std::printf("bytes per token = the matrices as stored + norms + embedding row + KV cache\n\n");
  std::printf("%-18s %8s %14s %12s %10s %10s %9s\n", "format", "bits/w", "matrix bytes", "tokens/s", "GB/s", "of ceil",
              "vs base");
  const ch01::Llama base = ch01::random_llama(c, 1, DType::F32);
  const DType base_dtype = dev == Device::CUDA ? DType::BF16 : DType::F32;
  json out = json::array();
  double base_tps = 0;
  auto time_steps = [&](const ch01::Llama& model) {
    ch02::ContiguousKVCache cache(c, 128, dev);
    ch02::forward_cached(model, cache, std::vector<std::int32_t>(64, 3));
    double best = 1e300;
    for (int i = 0; i < 8; ++i) {
      metrics::Timer t;
      ch02::forward_cached(model, cache, {3});
      if (dev == Device::CUDA) cuda::synchronize();
      best = std::min(best, t.seconds());
    }
    const double bytes = static_cast<double>(model.matrix_bytes()) + 4.0 * c.hidden_size * (2 * c.num_layers + 2) +
                         static_cast<double>(c.kv_cache_bytes(65, 4));
    return std::pair{best, bytes};
  };
  {
    const ch01::Llama m = base.to(dev, base_dtype);
    const double matrix = static_cast<double>(m.matrix_bytes());
    const auto [s, bytes] = time_steps(m);
    base_tps = 1 / s;
    std::printf("%-18s %8.2f %14.0f %12.1f %10.2f %9.0f%% %8.2f×\n", dtype_name(base_dtype).data(),
                8.0 * dtype_size(base_dtype), matrix, 1 / s, bytes / s / 1e9, 100 * bytes / s / bw, 1.0);
    out.push_back({{"format", dtype_name(base_dtype)}, {"tokens_per_s", 1 / s}, {"bytes_per_token", bytes}});
  }
  for (const auto& spec : specs) {
    if (!fits(base, spec)) continue;
    const ch01::Llama q = quantize_model(base, spec).to(dev, base_dtype);
    const auto [s, bytes] = time_steps(q);
    std::printf("%-18s %8.2f %14lld %12.1f %10.2f %9.0f%% %8.2f×\n", spec.name().c_str(), bits(q),
                static_cast<long long>(q.matrix_bytes()),
                1 / s, bytes / s / 1e9, 100 * bytes / s / bw, (1 / s) / base_tps);
    std::fflush(stdout);
    out.push_back({{"format", spec.name()}, {"tokens_per_s", 1 / s}, {"bytes_per_token", bytes}});
  }
  if (!o.json.empty()) write_json(o.json, {{"device", device_name(dev)}, {"bandwidth", bw}, {"rows", out}});
  return 0;
}

int export_to(const CommonOptions& o, const std::string& format, const std::string& out) {
  const QuantSpec spec = QuantSpec::parse(format);
  export_gguf(o.model, spec, out);
  std::printf("wrote %s (%s)\n", out.c_str(), spec.name().c_str());
  return 0;
}

int run_gguf(const CommonOptions& o, const std::string& file, const std::string& tokenizer) {
  const Device dev = o.resolved_device();
  const gguf::File f(file);
  const ch01::Llama m = load_gguf(f).to(dev, DType::F32);
  const auto tok = gguf_tokenizer(f, tokenizer, o.model);
  const SamplingParams sp = o.sampling(*tok, m.config.vocab_size);
  const auto ids = tok->encode(o.prompt);
  Sampler sampler(sp);
  TextStream stream(*tok, ids);
  ch02::generate_cached(m, ids, o.max_new_tokens, sampler, m.config.eos_token_ids,
                        [&](const ch01::Generation& g) { stream.print(g.tokens); });
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Chapter 09: quantisation", "ch09_quantization"};
  CommonOptions o;
  add_model_option(app, o);  // the bare run: a short table on --model
  add_json_option(app, o.json);
  help_footer(app, "five formats (and AWQ) on tiny-mha: bits per weight against perplexity, in seconds",
              "chapters/09_quantization/README.md", "量化与模型剪枝");
  std::int64_t windows = 0, per_kind = 200;
  bool no_awq = false;
  std::vector<std::string> formats;
  std::string format = "q4_0", out, file, tokenizer;
  auto* st = app.add_subcommand("table", "Every format on a model: bytes, perplexity, probe accuracy");
  add_model_option(*st, o);
  add_json_option(*st, o.json);
  st->add_option("--windows", windows, "Validation windows of 512 tokens to score (0: all of them)")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  st->add_option("--probes-per-kind", per_kind, "Probes scored per kind (0: skip the probes)")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  st->add_option("--formats", formats, "Comma-separated formats (default: all)")->delimiter(',');
  st->add_flag("--no-awq", no_awq, "Skip the AWQ rows");
  auto* ss = app.add_subcommand("speed", "Decode speed per format on a larger random model");
  add_device_option(*ss, o);
  add_json_option(*ss, o.json);
  ss->add_option("--formats", formats, "Comma-separated formats (default: all)")->delimiter(',');
  auto* se = app.add_subcommand("export", "Write the model quantised as GGUF");
  add_model_option(*se, o);
  se->add_option("output", out, "The .gguf file")->required();
  se->add_option("--format", format, "q8_0 or q4_0")->check(CLI::IsMember({"q8_0", "q4_0"}))->capture_default_str();
  auto* sr = app.add_subcommand("run", "Generate with a GGUF model");
  add_model_option(*sr, o);
  sr->get_option("--model")->description("The bundled model whose tokenizer to use when the GGUF's vocabulary is its own");
  add_device_option(*sr, o);
  add_generation_options(*sr, o);
  sr->add_option("file", file, "A Llama GGUF with q8_0 or q4_0 projections")->required();
  sr->add_option("--tokenizer", tokenizer,
                 "Tokenizer: a tokenizer.json, a folder holding one, or a llama2.c .bin (default: --model's, "
                 "if the GGUF's vocabulary is that tokenizer's)");
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    std::vector<QuantSpec> specs;
    for (const std::string& f : formats) specs.push_back(QuantSpec::parse(f));
    if (specs.empty()) specs = all_specs();
    if (*st)
      return quality(o, specs, windows, per_kind,
                     no_awq ? std::vector<QuantSpec>{} : std::vector<QuantSpec>{{Format::Int4Asym, 32}, {Format::Int4Asym, 64}, {Format::Int4Sym, 32}});
    if (*ss) return speed(o, specs);
    if (*se) return export_to(o, format, out);
    if (*sr) return run_gguf(o, file, tokenizer);
    // The tour: a few formats on tiny-mha, 8 validation windows, no probes.
    std::printf("Quantisation (lecture: 量化): bits per weight against quality, on the bundled model\n\n");
    return quality(o, {QuantSpec{Format::Int8Row}, QuantSpec{Format::Q8_0}, QuantSpec{Format::Fp8E4M3},
                       QuantSpec{Format::Int4Asym, 32}, QuantSpec{Format::Q4_0}},
                   8, 0, {QuantSpec{Format::Int4Asym, 32}});
  });
}
