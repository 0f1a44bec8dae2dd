// ch09_quantization: fewer bits per weight, what they cost in quality and what they buy in speed.
//   ch09_quantization                 a short table on tiny-mha
//   ch09_quantization table           every format (and AWQ) on a model: bytes, perplexity, probes
//   ch09_quantization speed           decode tokens/s and GB/s per format on a larger random model
//   ch09_quantization export OUT.gguf write the model as GGUF (llama.cpp's format): q8_0, q4_0, f32, f16
//   ch09_quantization run FILE.gguf   generate with a GGUF model
#include <cstdio>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>

#include "chapters/01_naive_decode/generate.h"
#include "chapters/09_quantization/awq.h"
#include "chapters/09_quantization/gguf_model.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/cuda/backend.h"
#include "common/eval.h"
#include "common/gguf_tokenizer.h"
#include "common/models/kv_cache.h"
#include "common/plot.h"

using namespace inferlab;
using namespace inferlab::ch09;
using nlohmann::json;

namespace {

// Which CPU products the quantised models run (--kernel): the fast kernel lays out every matrix that
// can be eight rows at a time (qmodel.h's interleave_blocks: x as q8_0 blocks, integer sums), the
// reference kernel keeps each matrix in row order (quant_rows.cpp: int8 and int4 multiply x in f32).
enum class Kernel { Fast, Reference };
Kernel kernel_named(const std::string& name) { return name == "reference" ? Kernel::Reference : Kernel::Fast; }
const char* kernel_name(Kernel k) { return k == Kernel::Fast ? "fast" : "reference"; }
void add_kernel_option(CLI::App& app, std::string& kernel) {
  app.add_option("--kernel", kernel,
                 "CPU products of the quantised matrices: fast (eight rows at a time, x as q8_0 blocks, integer sums) "
                 "or reference (row by row; int8 and int4 keep x in f32)")
      ->check(CLI::IsMember({"fast", "reference"}))
      ->capture_default_str();
}
// m with its matrices laid out for `kernel` (on the CPU: interleave_blocks for the fast one).
models::Llama for_kernel(models::Llama m, Kernel kernel) {
  if (kernel == Kernel::Fast && m.device() == Device::CPU) interleave_blocks(m);
  return m;
}

struct Row {
  std::string name;
  models::Llama model;
  std::vector<std::string> kept_f32;  ///< matrices the format cannot hold, kept as they were
};

// Whether every matrix of m can take the format (its input width n_in a multiple of its block or
// group).
bool fits(const models::Llama& m, const QuantSpec& s) {
  const std::int64_t g = width_multiple(s);
  const auto& c = m.config;
  for (std::int64_t n_in : {c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim})
    if (n_in % g) return false;
  return true;
}

// The projections and the head as stored; a tied head counts here too (quantisation gives it
// its own copy).
std::int64_t matrix_bytes(const models::Llama& m) {
  return m.matrix_bytes() + (m.tied() ? static_cast<std::int64_t>(m.embed.nbytes()) : 0);
}

// Bits per weight of the projections and the head, as stored.
double bits(const models::Llama& m) {
  return 8.0 * static_cast<double>(matrix_bytes(m)) / static_cast<double>(matrix_weights(m));
}

std::vector<Row> rows_for(const models::Llama& m, const std::vector<QuantSpec>& specs,
                          const std::vector<QuantSpec>& awq_specs, const std::vector<std::int32_t>& calibration,
                          Kernel kernel) {
  std::vector<Row> rows;
  rows.push_back({"f32 (unquantised)", m, {}});
  // A format that cannot hold every matrix (an input width not whole blocks or groups, as
  // stories260K's 172-wide down_proj) quantises the others; the row names the ones kept in f32.
  for (const auto& s : specs) {
    std::vector<std::string> kept;
    models::Llama q = quantize_model(m, s, &kept);
    if (!q.lm_head.packed && kept.size() == q.layers[0].linears().size() + 1) {  // nothing of the format is left
      std::printf("(%s skipped: no matrix width is a multiple of its group)\n", s.name().c_str());
      continue;
    }
    rows.push_back({s.name(), for_kernel(std::move(q), kernel), kept});
  }
  for (const QuantSpec& s : awq_specs)
    if (fits(m, s)) {
      std::vector<AwqGroup> report;
      const models::Llama q = for_kernel(quantize_model(awq_scale(m, calibration, s, &report), s), kernel);
      int better = 0;
      double rtn = 0, awq = 0;
      for (const auto& g : report) better += g.loss_awq < g.loss_rtn, rtn += g.loss_rtn, awq += g.loss_awq;
      std::printf(
          "(AWQ for %s: %d of %zu layer groups found scales better than round-to-nearest; calibration error %.3g -> %.3g)\n",
          s.name().c_str(), better, report.size(), rtn, awq);
      rows.push_back({"awq " + s.name(), q, {}});
    } else {
      std::printf("(awq %s skipped: a matrix width is not a multiple of its group)\n", s.name().c_str());
    }
  return rows;
}

// One row of the quality table: a format on the model, scored on validation text (and probes).
struct QualityRow {
  std::string name;
  double bits = 0;
  std::int64_t matrix_bytes = 0;
  eval::Perplexity ppl;
  eval::ProbeScores probes;
  std::vector<std::string> kept_f32;
};

// Scores each row as it is ready, calling on_row (to print as it goes: a full table takes minutes).
std::vector<QualityRow> measure_quality(const CommonOptions& o, const std::vector<QuantSpec>& specs, std::int64_t windows,
                                        std::int64_t per_kind, const std::vector<QuantSpec>& awq,
                                        std::size_t calibration_tokens, Kernel kernel,
                                        const std::function<void(const QualityRow&)>& on_row = nullptr,
                                        const std::string& tokenizer = "") {
  const models::Llama m = models::load_llama(o.model).to(Device::CPU, DType::F32);
  const auto tok = Tokenizer::for_model(o.model, tokenizer);  // default: a folder's tokenizer.json, a llama2.c file's .bin
  const std::string data = data_dir();
  const auto val = eval::tokenize_documents(*tok, data + "/corpus/val.txt");
  // Probes longer than the model's context cannot be scored on it (stories260K's is 512 tokens).
  std::vector<eval::Probe> probes;
  std::size_t too_long = 0;
  for (eval::Probe& p : eval::load_probes(data + "/corpus/probes.jsonl")) {
    const std::int64_t ctx = m.config.max_position_embeddings;  // 0: not known, no limit
    if (ctx > 0 && static_cast<std::int64_t>(tok->encode(p.prompt + p.answer).size()) > ctx) ++too_long;
    else probes.push_back(std::move(p));
  }
  if (too_long > 0 && per_kind > 0)
    std::printf("(%zu probes longer than the model's context of %lld tokens left out)\n", too_long,
                static_cast<long long>(m.config.max_position_embeddings));
  auto calib = eval::tokenize_documents(*tok, data + "/corpus/train-sample.txt");
  calib.resize(std::min(calib.size(), calibration_tokens));
  std::vector<QualityRow> out;
  for (const auto& r : rows_for(m, specs, awq, calib, kernel)) {
    const eval::LogitsFn f = [&r](const std::vector<std::int32_t>& t) { return ch01::forward(r.model, t, true); };
    QualityRow q{r.name, bits(r.model), matrix_bytes(r.model), {}, {}, r.kept_f32};
    q.ppl = eval::perplexity(f, val, 512, windows, o.model + " as " + r.name + ": validation perplexity");
    if (per_kind > 0) q.probes = eval::probe_accuracy(f, *tok, probes, per_kind, o.model + " as " + r.name + ": probes");
    if (on_row) on_row(q);
    out.push_back(std::move(q));
  }
  return out;
}

json to_json(const QualityRow& r) {
  return {{"format", r.name},       {"bits_per_weight", r.bits},   {"matrix_bytes", r.matrix_bytes}, {"val_ppl", r.ppl.ppl},
          {"val_loss", r.ppl.loss}, {"probes", r.probes.accuracy}, {"kept_f32", r.kept_f32}};
}

int quality(const CommonOptions& o, const std::vector<QuantSpec>& specs, std::int64_t windows, std::int64_t per_kind,
            const std::vector<QuantSpec>& awq, const std::string& tokenizer, Kernel kernel) {
  std::vector<std::string> kinds;
  double base = 0;
  json out = json::array();
  measure_quality(
      o, specs, windows, per_kind, awq, 2048, kernel,
      [&](const QualityRow& r) {
    if (out.empty()) {
      std::printf(
          "%s: the projections and head quantised (%s kernel); perplexity on %s validation windows of 512, probes %lld "
          "per kind\n\n",
          o.model.c_str(), kernel_name(kernel), windows ? std::to_string(windows).c_str() : "all",
          static_cast<long long>(per_kind));
      std::printf("%-22s %8s %12s %9s %9s", "format", "bits/w", "matrix bytes", "val ppl", "Δ ppl");
      kinds = eval::kinds_in_reading_order(r.probes.accuracy);
      for (const auto& k : kinds) std::printf(" %10s", k.c_str());
      std::printf("\n");
      base = r.ppl.ppl;
    }
    std::printf("%-22s %8.2f %12lld %9.3f %+9.3f", r.name.c_str(), r.bits, static_cast<long long>(r.matrix_bytes), r.ppl.ppl,
                r.ppl.ppl - base);
    for (const auto& k : kinds) std::printf(" %10.3f", r.probes.accuracy.count(k) ? r.probes.accuracy.at(k) : 0.0);
    for (std::size_t i = 0; i < r.kept_f32.size(); ++i) std::printf("%s%s", i ? ", " : "   f32: ", r.kept_f32[i].c_str());
    std::printf("\n");
    std::fflush(stdout);
    out.push_back(to_json(r));
      },
      tokenizer);
  if (!o.json.empty()) write_json(o.json, {{"model", o.model}, {"kernel", kernel_name(kernel)}, {"rows", out}}, {o.model});
  return 0;
}

// A Llama-shaped model large enough to leave the caches, for speed: 402 M parameters.
TransformerConfig speed_shape() {
  TransformerConfig c;
  c.architecture = "LlamaForCausalLM";
  c.hidden_size = 2048, c.intermediate_size = 5632, c.num_layers = 6, c.num_heads = 16, c.num_kv_heads = 4;
  c.head_dim = 128, c.vocab_size = 32000, c.max_position_embeddings = 4096, c.rms_norm_eps = 1e-5, c.rope_theta = 1e4;
  return c;
}

// The bare run's speed model: the same layout at a quarter of the width, so that a bare run
// stays within seconds; its f32 weights are still 12 times the last-level cache of the
// development machine (32 MiB), and its int4 weights are not far above it.
TransformerConfig bare_speed_shape() {
  TransformerConfig c = speed_shape();
  c.hidden_size = 1024, c.intermediate_size = 2816, c.num_heads = 16, c.head_dim = 64, c.vocab_size = 16384;
  return c;
}

// One row of the speed table: a format's decode step at B = 1.
struct SpeedRow {
  std::string name;
  double bits = 0;
  std::int64_t matrix_bytes = 0;
  double seconds = 0;           // best of the timed steps
  double bytes = 0;             // bytes a step must read: matrices as stored, norms, embedding row, KV cache
  metrics::ReadCeiling read{};  // a streaming read over as many bytes (in cache or from memory)
  double tokens_per_s() const { return 1 / seconds; }
  double bytes_per_s() const { return bytes / seconds; }
  double percent_of_ceiling() const { return metrics::percent_of(bytes_per_s(), read); }
};
struct SpeedRun {
  std::string device;
  Kernel kernel = Kernel::Fast;  // the quantised rows' CPU products
  TransformerConfig shape;
  metrics::Ceiling roof;  // the device's ceilings, measured in the same run (common/ceiling.h)
  int context = 0, steps = 0;
  std::vector<SpeedRow> rows;  // the unquantised base first
};

// Decode speed of each format at B = 1 after a prefill of `context` tokens, on a random model of
// `shape`: the best of `steps` timed steps, each against the read ceiling of its own kind measured
// in the same run (on the CPU, a streaming read over as many bytes as its step reads, in turns with
// the steps: a 4-bit model's weights may sit in a cache that an f32 model's overflow).
SpeedRun measure_speed(Device dev, const TransformerConfig& c, const std::vector<QuantSpec>& specs, int context, int steps,
                       Kernel kernel, const std::function<void(const SpeedRun&, const SpeedRow&)>& on_row = nullptr) {
  SpeedRun run{std::string(device_name(dev)), kernel, c, {}, context, steps, {}};
  run.roof = metrics::measure_ceiling(dev);
  const models::Llama base = models::random_llama(c, 1, DType::F32);
  const DType base_dtype = dev == Device::CUDA ? DType::BF16 : DType::F32;
  auto time_steps = [&](const std::string& name, const models::Llama& model) {
    models::ContiguousKVCache cache(c, context + steps, dev);
    models::forward_cached(model, cache, std::vector<std::int32_t>(static_cast<std::size_t>(context), 3));
    SpeedRow r{name, bits(model), model.matrix_bytes(), 1e300, 0};
    r.bytes = static_cast<double>(model.matrix_bytes()) + 4.0 * c.hidden_size * (2 * c.num_layers + 2) +
              static_cast<double>(c.kv_cache_bytes(context + 1, 4));
    // On the CPU the ceiling takes turns with the steps: a step, a streaming read over as many
    // bytes, a step, … (common/ceiling.h's ReadPasses). Both see the same moments of the machine
    // and the same cache: an f32 step beyond the last-level cache and the read beside it each
    // evict what the other left, so both come from memory; a 4-bit step and its read both fit.
    std::optional<metrics::ReadPasses> passes;
    if (dev == Device::CPU) passes.emplace(r.bytes);
    for (int i = 0; i < steps; ++i) {
      metrics::Timer t = metrics::Timer::work(dev == Device::CPU);
      models::forward_cached(model, cache, {3});
      if (dev == Device::CUDA) cuda::synchronize();
      r.seconds = std::min(r.seconds, t.seconds());
      if (passes) passes->run();
    }
    r.read = passes ? passes->ceiling() : metrics::read_ceiling_for(run.roof, r.bytes);
    run.rows.push_back(r);
  };
  time_steps(std::string(dtype_name(base_dtype)), base.to(dev, base_dtype));
  if (on_row) on_row(run, run.rows.back());
  for (const auto& spec : specs)
    if (fits(base, spec)) {
      time_steps(spec.name(), for_kernel(quantize_model(base, spec).to(dev, base_dtype), kernel));
      if (on_row) on_row(run, run.rows.back());
    }
  return run;
}

json to_json(const SpeedRun& run) {
  json rows = json::array();
  for (const auto& r : run.rows)
    rows.push_back({{"format", r.name},
                    {"bits_per_weight", r.bits},
                    {"matrix_bytes", r.matrix_bytes},
                    {"seconds_per_token", r.seconds},
                    {"tokens_per_s", r.tokens_per_s()},
                    {"bytes_per_token", r.bytes},
                    {"achieved_bytes_per_s", r.bytes_per_s()},
                    {"fraction_of_ceiling", r.percent_of_ceiling() / 100},
                    {"read_ceiling", metrics::to_json(r.read)},
                    {"vs_base", r.tokens_per_s() / run.rows.front().tokens_per_s()}});
  return {{"device", run.device},
          {"kernel", kernel_name(run.kernel)},
          {"ceiling", metrics::to_json(run.roof)},
          {"parameters", run.shape.num_parameters()},
          {"context", run.context},
          {"steps", run.steps},
          {"rows", rows}};
}

void print_speed_header(const SpeedRun& run) {
  std::printf(
      "Decode speed, B = 1, context %d, random weights (%.0f M parameters), %s, %s kernel, best of %d steps; "
      "read from memory %s\n",
      run.context, static_cast<double>(run.shape.num_parameters()) / 1e6, run.device.c_str(), kernel_name(run.kernel),
      run.steps, metrics::describe(run.roof.read, "B").c_str());
  std::printf(
      "bytes per token = the matrices as stored + norms + embedding row + KV cache; each row's GB/s against a\n"
      "streaming read over as many bytes, in turns with its steps (cache: in the %s last-level cache, part:\n"
      "partly, mem: from memory)\n\n",
      metrics::human_bytes(metrics::last_level_cache_bytes()).c_str());
}

// Under a speed table: the ceilings its rows were compared with, and why a row is above its own.
void print_speed_legend(const SpeedRun& run) {
  metrics::CeilingLegend legend;
  for (const auto& r : run.rows) legend.percent(r.name, r.bytes_per_s(), r.read);
  std::printf("\n");
  legend.print("");
}

int speed(const CommonOptions& o, const std::vector<QuantSpec>& specs, Kernel kernel) {
  const SpeedRun run =
      measure_speed(o.resolved_device(), speed_shape(), specs, 64, 8, kernel, [](const SpeedRun& run, const SpeedRow& r) {
        if (run.rows.size() == 1) {
          print_speed_header(run);
          std::printf("%-18s %8s %14s %12s %10s %16s %9s\n", "format", "bits/w", "matrix bytes", "tokens/s", "GB/s",
                      "of its ceiling", "vs base");
        }
        std::printf("%-18s %8.2f %14lld %12.1f %10.2f %9.0f%% %-5s %8.2f×\n", r.name.c_str(), r.bits,
                    static_cast<long long>(r.matrix_bytes), r.tokens_per_s(), r.bytes_per_s() / 1e9, r.percent_of_ceiling(),
                    r.read.abbrev(), r.tokens_per_s() / run.rows.front().tokens_per_s());
        std::fflush(stdout);
      });
  print_speed_legend(run);
  if (!o.json.empty()) write_json(o.json, to_json(run));
  return 0;
}

// The bare run's two measurements against bits per weight: perplexity of each format on the
// model, and the decode speed of the random model in the same formats beside its ceiling, the
// read bandwidth over the bytes a token reads (a decode step at B = 1 is memory-bound).
void plot_headline(const std::vector<QualityRow>& quality, const SpeedRun& run, const std::string& model,
                   const std::string& path) {
  plot::Figure ppl, speed;
  ppl.title = "Validation perplexity against bits per weight (" + model + ", 4 windows of 512)";
  char title[160];
  std::snprintf(title, sizeof title, "Decode speed against bits per weight (random %.0f M-parameter model, B = 1, %s)",
                static_cast<double>(run.shape.num_parameters()) / 1e6, run.device.c_str());
  speed.title = title;
  ppl.x.label = speed.x.label = "bits per weight (projections and head, as stored)";
  ppl.y.label = "perplexity (lower is better)";
  speed.y.label = "tokens per second";
  plot::Series p, t, ceiling;
  p.label = "each format (AWQ: int4 with activation-aware scales)";
  t.label = "measured (best of the steps)";
  ceiling.label = "ceiling: read bandwidth / bytes per token";
  p.line = t.line = false;
  p.label_points = t.label_points = ceiling.markers = ceiling.dashed = true;
  for (const auto& q : quality) p.x.push_back(q.bits), p.y.push_back(q.ppl.ppl), p.point_labels.push_back(q.name);
  for (const auto& r : run.rows) {
    t.x.push_back(r.bits), t.y.push_back(r.tokens_per_s()), t.point_labels.push_back(r.name);
    ceiling.x.push_back(r.bits), ceiling.y.push_back(r.read.bytes_per_s() / r.bytes);
  }
  ppl.series = {p};
  speed.series = {t, ceiling};
  ppl.height = speed.height = 420;
  ppl.x.min = speed.x.min = 0, ppl.x.max = speed.x.max = 44;  // room for the labels right of f32
  plot::save_svg(std::vector<plot::Figure>{ppl, speed}, path);
  std::printf("wrote %s\n", path.c_str());
}

// The bare run: a few formats on the bundled model, quality and speed in one table, in seconds.
// Quality is perplexity on 4 validation windows (no probes; AWQ calibrated on 512 tokens);
// speed is the decode step of a random model of bare_speed_shape() in the same formats, at
// context 16, the best of 8 steps, each against the read ceiling of its own kind. `table` and
// `speed` run the full versions.
int headline(const CommonOptions& o, const std::string& svg, Kernel kernel) {
  const std::vector<QuantSpec> specs = {QuantSpec{Format::Int8Row}, QuantSpec{Format::Int4Asym, 32}};
  const std::int64_t windows = 4;
  std::printf("Quantisation (lecture: 量化): bits per weight against quality and decode speed\n");
  const auto quality_rows = measure_quality(o, specs, windows, 0, {QuantSpec{Format::Int4Asym, 32}}, 512, kernel);
  const SpeedRun run = measure_speed(Device::CPU, bare_speed_shape(), specs, 16, 8, kernel);
  std::printf("quality: %s, perplexity on %lld validation windows of 512 tokens, %s kernel\n", o.model.c_str(),
              static_cast<long long>(windows), kernel_name(kernel));
  print_speed_header(run);
  std::printf("%-22s %8s %9s %9s %11s %10s %14s %8s\n", "format", "bits/w", "val ppl", "Δ ppl", "tokens/s", "GB/s",
              "of its ceiling", "vs f32");
  for (const auto& q : quality_rows) {
    // AWQ changes the values, not the layout: its speed is its format's.
    const std::string format = q.name.rfind("awq ", 0) == 0    ? q.name.substr(4)
                               : q.name == "f32 (unquantised)" ? "f32"
                                                               : q.name;
    std::printf("%-22s %8.2f %9.3f %+9.3f", q.name.c_str(), q.bits, q.ppl.ppl, q.ppl.ppl - quality_rows.front().ppl.ppl);
    for (const auto& r : run.rows)
      if (r.name == format)
        std::printf(" %11.1f %10.2f %7.0f%% %-5s %7.2f×", r.tokens_per_s(), r.bytes_per_s() / 1e9, r.percent_of_ceiling(),
                    r.read.abbrev(), r.tokens_per_s() / run.rows.front().tokens_per_s());
    std::printf("\n");
  }
  print_speed_legend(run);
  std::printf(
      "\nmore: ch09_quantization table (every format, all windows, probes) | speed (a 402 M model) | export | run\n");
  if (!svg.empty()) plot_headline(quality_rows, run, o.model.substr(o.model.find_last_of('/') + 1), svg);
  if (!o.json.empty()) {
    json q = json::array();
    for (const auto& r : quality_rows) q.push_back(to_json(r));
    write_json(o.json,
               {{"kernel", kernel_name(kernel)},
                {"quality", {{"model", o.model}, {"windows", windows}, {"rows", q}}},
                {"speed", to_json(run)}},
               {o.model});
  }
  return 0;
}

int export_to(const CommonOptions& o, const std::string& format, const std::string& out) {
  if (format == "f32" || format == "f16") export_gguf(o.model, format == "f32" ? DType::F32 : DType::F16, out);
  else export_gguf(o.model, QuantSpec::parse(format), out);
  std::printf("wrote %s (%s)\n", out.c_str(), format.c_str());
  return 0;
}

int run_gguf(const CommonOptions& o, const std::string& file, const std::string& tokenizer, Kernel kernel) {
  const Device dev = o.resolved_device();
  const gguf::File f(file);
  // On the CPU every tensor runs as it is stored (F16 and BF16 matrices too); the GPU path takes
  // plain matrices as f32.
  models::Llama m = load_gguf(f);
  if (dev != Device::CPU) m = m.to(dev, DType::F32);
  else m = for_kernel(std::move(m), kernel);  // the GGUF block types but q2_k and q3_k: eight rows at a time (qmodel.h)
  const auto tok = gguf_tokenizer(f, tokenizer, o.model);
  const SamplingParams sp = o.sampling(*tok, m.config.vocab_size);
  const auto ids = tok->encode(o.prompt);
  models::check_context(m, ids.size(), o.max_new_tokens);  // before the prompt is echoed
  // It stops where llama.cpp would: the EOS id, and the end-of-turn tokens the file names.
  std::vector<std::int64_t> stops = gguf::stop_ids(f);
  for (std::int64_t e : m.config.eos_token_ids)
    if (std::find(stops.begin(), stops.end(), e) == stops.end()) stops.push_back(e);
  // Speed, against the read ceiling of the step's kind measured here: a decode step reads every
  // weight once. On the CPU, weights beyond the last-level cache are read from memory by every
  // step, and so is a streaming sum over as many bytes run after each token (ReadPasses): the two
  // take turns, so they see the same moments of a shared machine. Weights that fit stay in the
  // cache from step to step, and a sum between the steps would evict them: their ceiling is a sum
  // over an array of their size in cache, best of 5, after the steps. On a GPU, a streaming read
  // over 1 GiB.
  const double step_bytes = static_cast<double>(m.step_weight_bytes());
  std::optional<metrics::ReadPasses> passes;
  if (dev == Device::CPU && step_bytes >= metrics::last_level_cache_bytes()) passes.emplace(step_bytes);
  Sampler sampler(sp);
  TextStream stream(*tok, ids);
  const models::Generation g =
      models::generate_cached(m, ids, o.max_new_tokens, sampler, stops, [&](const models::Generation& g) {
        stream.print(g.tokens);
        if (passes) passes->run();  // between the steps, outside their timing
      });
  std::printf("\n");
  metrics::Ceiling roof;
  roof.name = device_name(dev);
  roof.cpu = dev == Device::CPU;
  if (dev == Device::CUDA) {
    roof.bytes_per_s = cuda::measure_read_bandwidth(std::size_t(1) << 30);
    roof.source = "measured: a streaming read over 1 GiB";
  }
  const double tpot = g.tpot_s();
  const metrics::ReadCeiling read = passes ? passes->ceiling() : metrics::read_ceiling_for(roof, step_bytes);
  // Each decode step's read rate. Against sums taken in turns with the steps, like against like:
  // the median step against the median sum, the best against the best (the mean step against the
  // best sum mixes a figure's typical moment with the ceiling's luckiest one).
  std::vector<double> rates;
  for (std::size_t i = 1; i < g.steps.size(); ++i)
    if (g.steps[i].seconds > 0) rates.push_back(step_bytes / g.steps[i].seconds);
  const metrics::Spread step_rates = metrics::spread_of(rates);
  std::fprintf(stderr,
               "%zu prompt tokens, %zu generated%s; first token %.1f ms, then %.2f ms per token (%.1f tokens/s): "
               "%s of weights a step, %s\n",
               ids.size(), g.generated.size(), g.stopped_at_eos ? " (stopped at an end token)" : "", g.ttft_s() * 1e3,
               tpot * 1e3, tpot > 0 ? 1 / tpot : 0.0, metrics::human_bytes(step_bytes).c_str(),
               passes && step_rates.runs > 0 ? metrics::against_in_turns(step_rates, read).c_str()
                                             : metrics::against(tpot > 0 ? step_bytes / tpot : 0, read).c_str());
  if (!o.json.empty()) {
    nlohmann::json steps = nlohmann::json::array();
    for (const auto& s : g.steps)
      steps.push_back(
          {{"tokens_in", s.tokens_in}, {"seconds", s.seconds}, {"token", s.token}, {"work", metrics::to_json(s.work)}});
    write_json(o.json,
               {{"file", file},
                {"tokenizer", tok->path()},
                {"prompt_tokens", ids},
                {"generated", g.generated},
                {"text", tok->decode(g.generated)},
                {"stopped_at_eos", g.stopped_at_eos},
                {"stop_ids", stops},
                {"ttft_s", g.ttft_s()},
                {"tpot_s", tpot},
                {"step_weight_bytes", step_bytes},
                {"achieved_bytes_per_s", tpot > 0 ? step_bytes / tpot : 0},
                {"step_bytes_per_s", metrics::to_json(step_rates)},
                {"read_ceiling", metrics::to_json(read)},
                {"ceiling_in_turns", passes.has_value()},
                {"steps", steps}},
               {file});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 09: quantisation", "ch09_quantization"};
  CommonOptions o;
  add_model_option(app, o);  // the bare run: a short table on --model
  add_json_option(app, o.json);
  std::string svg, kernel = "fast";
  app.add_option("--svg", svg, "Also plot perplexity and tokens/s against bits per weight as SVG")->check(output_file());
  add_kernel_option(app, kernel);
  help_footer(app,
              "int8_row, int4_g32_asym and AWQ on tiny-mha: bits per weight and perplexity on 4 validation "
              "windows, beside decode tokens/s and GB/s against the measured read bandwidth on a 101 M random model",
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
  // A format name is checked where it is given, so that a typo is a usage error naming --formats.
  const CLI::Validator known_format(
      [](std::string& name) {
    try {
      QuantSpec::parse(name);
      return std::string();
    } catch (const Error& e) {
      return std::string(e.what());
    }
      },
      "FORMAT");
  st->add_option("--formats", formats, "Comma-separated formats (default: all)")->delimiter(',')->check(known_format);
  st->add_flag("--no-awq", no_awq, "Skip the AWQ rows");
  st->add_option("--tokenizer", tokenizer,
                 "Tokenizer: a tokenizer.json, a folder holding one, or a llama2.c .bin (default: the model's own)");
  add_kernel_option(*st, kernel);
  auto* ss = app.add_subcommand("speed", "Decode speed per format on a larger random model");
  add_device_option(*ss, o);
  add_json_option(*ss, o.json);
  ss->add_option("--formats", formats, "Comma-separated formats (default: all)")->delimiter(',')->check(known_format);
  add_kernel_option(*ss, kernel);
  auto* se = app.add_subcommand("export", "Write the model quantised as GGUF");
  add_model_option(*se, o);
  se->add_option("output", out, "The .gguf file")->required()->check(output_file());
  se->add_option("--format", format, "q8_0, q4_0, or f32 / f16 (unquantised, for llama.cpp's llama-quantize)")
      ->check(CLI::IsMember({"q8_0", "q4_0", "f32", "f16"}))
      ->capture_default_str();
  auto* sr = app.add_subcommand("run", "Generate with a GGUF model");
  add_model_option(*sr, o);
  sr->get_option("--model")->description("The bundled model whose tokenizer to use for a GGUF that carries none");
  add_device_option(*sr, o);
  add_generation_options(*sr, o);
  sr->add_option("file", file,
                 "A Llama GGUF (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K-Q6_K, IQ4_NL or IQ4_XS projections)")
      ->required();
  sr->add_option("--tokenizer", tokenizer,
                 "Tokenizer: a tokenizer.json, a folder holding one, or a llama2.c .bin (default: the GGUF's own, "
                 "from its tokenizer.ggml.* metadata)");
  add_kernel_option(*sr, kernel);
  add_json_option(*sr, o.json);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    std::vector<QuantSpec> specs;
    for (const std::string& f : formats) specs.push_back(QuantSpec::parse(f));
    if (specs.empty()) specs = all_specs();
    if (*st)
      return quality(o, specs, windows, per_kind,
                     no_awq ? std::vector<QuantSpec>{}
                            : std::vector<QuantSpec>{{Format::Int4Asym, 32}, {Format::Int4Asym, 64}, {Format::Int4Sym, 32}},
                     tokenizer, kernel_named(kernel));
    if (*ss) return speed(o, specs, kernel_named(kernel));
    if (*se) return export_to(o, format, out);
    if (*sr) return run_gguf(o, file, tokenizer, kernel_named(kernel));
    return headline(o, svg, kernel_named(kernel));
  });
}
