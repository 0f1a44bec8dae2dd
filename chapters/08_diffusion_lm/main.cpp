// ch08_diffusion_lm: a canvas of masks filled in over R steps. What it buys (L / R tokens per
// forward pass, each pass a GEMM over the whole canvas: the hardware used at B = 1 as a batch would
// use it) and what it costs (no KV cache, and quality as R falls).
//   ch08_diffusion_lm            the headline
//   ch08_diffusion_lm canvas     the canvas step by step (LLaDA's or MDLM's sampler), --json frames
//   ch08_diffusion_lm speed      tokens/s, tokens per forward and intensity against R, autoregressive beside
//   ch08_diffusion_lm quality    probe accuracy and the validation ELBO against R
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/08_diffusion_lm/diffusion.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/eval.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch08;
using nlohmann::json;

namespace {

using ll = long long;

// --- the canvas as a picture -----------------------------------------------------------------
// The generated region of a canvas: committed tokens as their text, masks as ▒, this step's
// commits bracketed.
std::string picture(const Tokenizer& tok, const Frame& f, std::size_t prompt_len, std::int32_t mask_id) {
  std::string s;
  for (std::size_t p = prompt_len; p < f.canvas.size(); ++p) {
    if (f.canvas[p] == mask_id) {
      s += "▒";
      continue;
    }
    std::string piece = tok.decode({f.canvas[p]});
    std::replace(piece.begin(), piece.end(), '\n', ' ');
    const bool now = std::find(f.committed.begin(), f.committed.end(), static_cast<std::int64_t>(p)) != f.committed.end();
    s += now ? "[" + piece + "]" : piece;
  }
  return s;
}

json run_canvas(const DiffusionModel& m, const Tokenizer& tok, const std::string& text, const SamplerOptions& o, bool mdlm,
                bool indent) {
  const char* pad = indent ? "  " : "";
  const auto prompt = tok.encode(text);
  std::printf("%sprompt: %s\n", pad, text.c_str());
  json frames = json::array();
  auto show = [&](const Frame& f) {
    std::printf("%sstep %2lld  %s\n", pad, static_cast<ll>(f.step + 1), picture(tok, f, prompt.size(), m.mask_id).c_str());
    std::fflush(stdout);
    frames.push_back({{"step", f.step}, {"canvas", f.canvas}, {"committed", f.committed}});
  };
  const DiffusionRun r =
      mdlm ? sample_mdlm(denoiser(m), prompt, m.mask_id, o, show) : sample_llada(denoiser(m), prompt, m.mask_id, o, show);
  const std::vector<std::int32_t> gen(r.tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), r.tokens.end());
  std::printf("%s%lld tokens in %lld forward passes (%.1f per pass), %.1f ms: %s\n", pad, static_cast<ll>(o.gen_length),
              static_cast<ll>(r.forwards), static_cast<double>(o.gen_length) / static_cast<double>(r.forwards),
              r.seconds * 1e3, tok.decode(gen).c_str());
  return {{"prompt", text},         {"prompt_ids", prompt}, {"tokens", r.tokens}, {"commit_step", r.commit_step},
          {"forwards", r.forwards}, {"seconds", r.seconds}, {"frames", frames}};
}

// --- speed against R -------------------------------------------------------------------------
struct Timing {
  std::string name;
  double seconds = 0, tokens = 0, forwards = 0;
  metrics::Work work;
};

// Chapter 02's autoregressive decoding of a model of the same size (tiny-mha: tiny-mdlm's shapes
// with a causal mask), greedy, best of `reps`.
Timing autoregressive(const models::Llama& m, const std::vector<std::int32_t>& prompt, std::int64_t n, int reps) {
  Timing best;
  for (int i = 0; i < reps; ++i) {
    Sampler greedy({});
    metrics::CountScope count;
    metrics::Timer clock = metrics::Timer::work(m.device() == Device::CPU);
    const auto g = models::generate_cached(m, prompt, static_cast<int>(n), greedy, {});
    const double s = clock.seconds();
    if (i == 0 || s < best.seconds)
      best = {"autoregressive (tiny-mha)", s, static_cast<double>(g.generated.size()), static_cast<double>(g.steps.size()),
              count.work()};
  }
  return best;
}

Timing diffusion(const DiffusionModel& m, const std::vector<std::int32_t>& prompt, std::int64_t n, std::int64_t R,
                 int reps) {
  Timing best;
  SamplerOptions o;
  o.gen_length = n, o.steps = R, o.block_length = n;
  o.clock = m.base.device() == Device::CPU ? metrics::Clock::Work : metrics::Clock::Wall;
  for (int i = 0; i < reps; ++i) {
    const DiffusionRun r = sample_llada(denoiser(m), prompt, m.mask_id, o);
    if (i == 0 || r.seconds < best.seconds)
      best = {"diffusion R = " + std::to_string(R), r.seconds, static_cast<double>(n), static_cast<double>(r.forwards),
              r.work};
  }
  return best;
}

json speed_table(const DiffusionModel& m, const models::Llama& ar, const std::vector<std::int32_t>& prompt, std::int64_t n,
                 const std::vector<std::int64_t>& steps, int reps, const metrics::Ceiling& roof, bool indent) {
  const char* pad = indent ? "  " : "";
  std::printf("%s%-26s %9s %8s %9s %9s %10s %22s %16s\n", pad, "", "time", "tokens/s", "forwards", "tok/pass", "FLOP/byte",
              "GB/s (of the ceiling)", "GFLOP/s (peak)");
  std::vector<Timing> rows = {autoregressive(ar, prompt, n, reps)};
  for (std::int64_t R : steps) rows.push_back(diffusion(m, prompt, n, R, reps));
  json out = json::array();
  metrics::CeilingLegend legend;
  for (const Timing& t : rows) {
    const double intensity = t.work.bytes > 0 ? t.work.flops / t.work.bytes : 0;
    // The ceiling of the passes' kind: a streaming read over as many bytes as one pass reads (a
    // model this small stays in the last-level cache from pass to pass).
    const auto read = metrics::read_ceiling_for(roof, t.work.bytes / std::max(t.forwards, 1.0));
    const double bps = t.work.bytes / t.seconds;
    std::printf("%s%-26s %7.1f ms %8.0f %9.0f %9.1f %10.1f %7.2f (%4.1f%% %-5s) %7.2f (%4.1f%%)\n", pad, t.name.c_str(),
                t.seconds * 1e3, t.tokens / t.seconds, t.forwards, t.tokens / t.forwards, intensity, bps / 1e9,
                legend.percent(t.name, bps, read), read.abbrev(), t.work.flops / t.seconds / 1e9,
                100 * t.work.flops / t.seconds / roof.flops_per_s);
    std::fflush(stdout);
    out.push_back({{"name", t.name},
                   {"seconds", t.seconds},
                   {"tokens", t.tokens},
                   {"forwards", t.forwards},
                   {"flops", t.work.flops},
                   {"bytes", t.work.bytes},
                   {"flop_per_byte", intensity},
                   {"read_ceiling", metrics::to_json(read)}});
  }
  legend.print(pad);
  std::printf(
      "%s(FLOPs and bytes as the ops count them: every weight read once per pass, the canvas's activations; "
      "the ridge of this machine is %.1f FLOP/byte)\n",
      pad, roof.ridge());
  return out;
}

// --- quality against R -----------------------------------------------------------------------
// A probe answered by sampling: the prompt, then `gen` masks filled in R steps; right when the
// generated tokens begin with the answer's.
json quality_table(const DiffusionModel& m, const Tokenizer& tok, const std::vector<std::int64_t>& steps, std::int64_t gen,
                   std::int64_t per_kind, std::int64_t windows, bool indent) {
  const char* pad = indent ? "  " : "";
  const bool probes = per_kind >= 0;  // per_kind < 0: the ELBO alone
  const auto all = eval::load_probes(data_dir() + "/corpus/probes.jsonl");
  const auto val = eval::tokenize_documents(tok, data_dir() + "/corpus/val.txt");
  if (probes)
    std::printf("%s%-14s %14s %14s   (probes: %lld per kind; NELBO: %lld windows of 128 tokens)\n", pad, "steps R",
                "probe accuracy", "NELBO nats/tok", static_cast<ll>(per_kind), static_cast<ll>(windows));
  else  // the probes generate an answer per probe at every R: the quality subcommand's work
    std::printf("%s%-14s %14s   (NELBO: %lld windows of 128 tokens)\n", pad, "steps R", "NELBO nats/tok",
                static_cast<ll>(windows));
  json rows = json::array();
  for (std::int64_t R : steps) {
    json row = {{"steps", R}};
    double mean = 0;
    if (probes) {
      // A bidirectional model cannot be teacher-forced (it would see the answer): it generates
      // max(gen, answer) tokens after the prompt in R steps, and its first ones are its answer.
      const eval::AnswerFn answer = [&](const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& want) {
        SamplerOptions o;
        o.gen_length = o.block_length = std::max<std::int64_t>(gen, static_cast<std::int64_t>(want.size()));
        o.steps = R;
        const auto r = sample_llada(denoiser(m), prompt, m.mask_id, o);
        const auto at = r.tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size());
        return std::vector<std::int32_t>(at, at + static_cast<std::ptrdiff_t>(want.size()));
      };
      const eval::ProbeScores scores =
          eval::probe_accuracy_of_answers(answer, tok, all, per_kind, "R = " + std::to_string(R) + ": probes");
      for (const auto& [kind, a] : scores.accuracy) mean += a / static_cast<double>(scores.accuracy.size());
      row["probe_accuracy"] = scores.accuracy, row["probe_accuracy_mean"] = mean;
    }
    double nelbo = 0;
    for (std::int64_t w = 0; w < windows; ++w) {
      const auto at = val.begin() + static_cast<std::ptrdiff_t>(w * 128);
      nelbo += negative_elbo(m, {at, at + 128}, R, static_cast<std::uint64_t>(w + 1)) / static_cast<double>(windows);
    }
    row["nelbo"] = nelbo;
    if (probes) std::printf("%s%-14lld %14.3f %14.3f\n", pad, static_cast<ll>(R), mean, nelbo);
    else std::printf("%s%-14lld %14.3f\n", pad, static_cast<ll>(R), nelbo);
    std::fflush(stdout);
    rows.push_back(row);
  }
  std::printf("%s(%sNELBO: the R-level discretisation of the bound tiny-mdlm was trained on, one random mask per level)\n",
              pad,
              probes ? "probe accuracy: the mean over the probe kinds of the answer generated exactly; chance is "
                       "1/16 to 1/10 per kind. "
                     : "");
  return rows;
}

// --- figures -------------------------------------------------------------------------------
// speed_table()'s rows (the autoregressive one first, then one per R: R passes each) and
// quality_table()'s NELBO rows against R: tokens per pass beside the L/R that R passes over L
// masks give, tokens/s, and the bound.
void plot_against_steps(const json& speed, const json& quality, std::int64_t gen, const std::string& path) {
  plot::Figure per_pass, rate, bound;
  per_pass.title = "Tokens per forward pass against denoising steps R (" + std::to_string(gen) + " new tokens)";
  rate.title = "Generation speed against R, measured here";
  bound.title = "Validation NELBO against R (tiny-mdlm)";
  per_pass.x.label = rate.x.label = bound.x.label = "denoising steps R";
  per_pass.x.log = rate.x.log = bound.x.log = true;
  per_pass.y.label = "tokens per forward pass";
  per_pass.y.log = true;
  rate.y.label = "tokens per second";
  bound.y.label = "NELBO (nats per token, lower is better)";
  plot::Series passes, tps, nelbo, ar_passes, ar_tps;
  passes.label = tps.label = "diffusion (tiny-mdlm)";
  nelbo.label = "R-step NELBO";
  passes.markers = tps.markers = nelbo.markers = true;
  double lo = 1e300, hi = 0, ar_rate = 0, ar_per_pass = 0;
  for (std::size_t i = 0; i < speed.size(); ++i) {
    const json& r = speed[i];
    const double tokens = r["tokens"].get<double>(), forwards = r["forwards"].get<double>(),
                 seconds = r["seconds"].get<double>();
    if (i == 0) {
      ar_rate = tokens / seconds, ar_per_pass = tokens / forwards;
      continue;
    }
    passes.x.push_back(forwards), passes.y.push_back(tokens / forwards);
    tps.x.push_back(forwards), tps.y.push_back(tokens / seconds);
    lo = std::min(lo, forwards), hi = std::max(hi, forwards);
  }
  for (const json& r : quality) {
    nelbo.x.push_back(r["steps"].get<double>()), nelbo.y.push_back(r["nelbo"].get<double>());
    lo = std::min(lo, nelbo.x.back()), hi = std::max(hi, nelbo.x.back());
  }
  if (hi <= 0) return;
  const double g = static_cast<double>(gen);
  plot::Series formula = plot::curve("L / R", lo, hi, 32, true, [g](double R) { return g / R; });
  formula.dashed = true;
  ar_passes = plot::curve("autoregressive (tiny-mha, ch02)", lo, hi, 2, true, [&](double) { return ar_per_pass; });
  ar_tps = plot::curve("autoregressive (tiny-mha, ch02)", lo, hi, 2, true, [&](double) { return ar_rate; });
  ar_passes.dashed = ar_tps.dashed = true;
  ar_passes.color = ar_tps.color = "#777";
  per_pass.series = {passes, formula, ar_passes};
  rate.series = {tps, ar_tps};
  bound.series = {nelbo};
  per_pass.height = rate.height = bound.height = 380;
  std::vector<plot::Figure> panels = {per_pass, rate};
  if (!quality.empty()) panels.push_back(bound);
  plot::save_svg(panels, path);
  std::printf("wrote %s\n", path.c_str());
}

// run_canvas()'s frames as a picture: a row per step, a cell per generated position, masked,
// committed at this step, or committed before.
void plot_canvas(const json& run, const Tokenizer& tok, std::int32_t mask_id, const std::string& path) {
  plot::Grid g;
  const std::size_t prompt_len = run["prompt_ids"].size();
  g.title = "The canvas after each step: \"" + run["prompt"].get<std::string>() + "\" + " +
            std::to_string(run["tokens"].size() - prompt_len) + " masks";
  g.x_label = "position after the prompt";
  g.y_label = "denoising step";
  g.kinds = {{"mask", "#cccccc"}, {"committed at this step", "#ff7f0e"}, {"committed earlier", "#9ecae1"}};
  g.cell_width = 50;
  for (const json& f : run["frames"]) {
    const auto canvas = f["canvas"].get<std::vector<std::int32_t>>();
    const auto now = f["committed"].get<std::vector<std::int64_t>>();
    std::vector<plot::Cell> row;
    for (std::size_t p = prompt_len; p < canvas.size(); ++p) {
      if (canvas[p] == mask_id) {
        row.push_back({"", 0});
        continue;
      }
      std::string piece = tok.decode({canvas[p]});
      std::replace(piece.begin(), piece.end(), '\n', ' ');
      std::size_t cut = 0, glyphs = 0;  // at most 6 characters, cut between UTF-8 sequences
      while (cut < piece.size() && glyphs < 6) {
        ++cut, ++glyphs;
        while (cut < piece.size() && (static_cast<unsigned char>(piece[cut]) & 0xC0) == 0x80) ++cut;
      }
      const bool fresh = std::find(now.begin(), now.end(), static_cast<std::int64_t>(p)) != now.end();
      row.push_back({piece.substr(0, cut), fresh ? 1 : 2});
    }
    g.row_labels.push_back("step " + std::to_string(f["step"].get<std::int64_t>() + 1));
    g.rows.push_back(row);
  }
  plot::save_svg(g, path);
  std::printf("wrote %s\n", path.c_str());
}

SamplerOptions canvas_options() {
  SamplerOptions o;
  o.gen_length = 32, o.steps = 16, o.block_length = 32;
  return o;
}

int headline(const std::string& json_path, const std::string& svg, const std::string& canvas_svg) {
  std::printf(
      "Diffusion language models (lecture: 扩散模型): a canvas of masks, filled in over R steps by a "
      "bidirectional denoiser\n");
  const DiffusionModel m = load_diffusion(bundled_model("tiny-mdlm"));
  const auto tok = Tokenizer::for_model(bundled_model("tiny-mdlm"));
  const json canvas = run_canvas(m, *tok, "Once upon a time there were", canvas_options(), false, true);
  const auto roof = metrics::measure_cpu_ceiling(0, 1024, 3);
  std::printf(
      "  64 new tokens after a 7-token prompt, one run each; GB/s against a streaming read over as many bytes as a\n"
      "  pass reads (cache: in the last-level cache), GFLOP/s against %s (f32 GEMM):\n",
      metrics::describe(roof.compute, "FLOP").c_str());
  const auto prompt = tok->encode("Once upon a time there were");
  const json speed = speed_table(m, models::load_llama(bundled_model("tiny-mha")), prompt, 64, {64, 16, 4}, 1, roof, true);
  std::printf("  the validation ELBO against R (2 windows; probe accuracy against R: ch08_diffusion_lm quality):\n");
  const json quality = quality_table(m, *tok, {16, 4, 1}, 8, -1, 2, true);
  std::printf("  more: ch08_diffusion_lm canvas | speed | quality\n");
  if (!svg.empty()) plot_against_steps(speed, quality, 64, svg);
  if (!canvas_svg.empty()) plot_canvas(canvas, *tok, m.mask_id, canvas_svg);
  if (!json_path.empty())
    write_json(json_path, {{"canvas", canvas}, {"ceiling", metrics::to_json(roof)}, {"speed", speed}, {"quality", quality}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 08: diffusion language models", "ch08_diffusion_lm"};
  std::string json_path;
  add_json_option(app, json_path);  // the bare run's
  std::string svg, canvas_svg;
  app.add_option("--svg", svg, "Also plot tokens per pass, tokens/s and the ELBO against R as SVG")->check(output_file());
  app.add_option("--canvas-svg", canvas_svg, "Also draw the canvas step by step as SVG")->check(output_file());
  help_footer(app,
              "tiny-mdlm filling a canvas of 32 masks in 16 steps, shown step by step; tokens/s, tokens per forward "
              "pass and arithmetic intensity of diffusion at R = 64, 16, 4 beside chapter 02's autoregressive decoding "
              "of the same-size tiny-mha (GB/s and GFLOP/s against the measured ceilings); the validation ELBO "
              "against R",
              "chapters/08_diffusion_lm/README.md", "扩散模型");
  std::string model = bundled_model("tiny-mdlm"), prompt = "Once upon a time there were", sampler = "llada",
              remasking = "low-confidence";
  SamplerOptions o = canvas_options();
  auto* sc = app.add_subcommand("canvas", "The canvas step by step (--json: every frame)");
  sc->add_option("--model", model, "A masked-diffusion model folder")->capture_default_str();
  sc->add_option("--prompt", prompt, "The text before the canvas")->capture_default_str();
  sc->add_option("--gen-length", o.gen_length, "Masks after the prompt (L)")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  sc->add_option("--steps", o.steps, "Denoiser calls (R)")->check(number_in(1, 4096))->capture_default_str();
  sc->add_option("--block-length", o.block_length, "Semi-autoregressive blocks, filled left to right")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  sc->add_option("--temperature", o.temperature, "Gumbel-max temperature (0: argmax)")
      ->check(number_in(0, 100))
      ->capture_default_str();
  sc->add_option("--remasking", remasking, "low-confidence or random")
      ->check(CLI::IsMember({"low-confidence", "random"}))
      ->capture_default_str();
  sc->add_option("--sampler", sampler, "llada (blocks and commit counts) or mdlm (the reverse process)")
      ->check(CLI::IsMember({"llada", "mdlm"}))
      ->capture_default_str();
  sc->add_option("--seed", o.seed, "Seed of the Gumbel noise and of random remasking")
      ->check(seed_number())
      ->capture_default_str();
  add_json_option(*sc, json_path);
  sc->add_option("--svg", canvas_svg, "Also draw the canvas step by step as SVG")->check(output_file());
  ModelOptions dev;
  std::int64_t gen = 64;
  std::vector<std::int64_t> steps = {64, 32, 16, 8, 4, 1};
  int reps = 3;
  auto* ss = app.add_subcommand("speed", "Tokens/s, tokens per pass and intensity against R, autoregressive beside");
  add_device_option(*ss, dev);
  add_json_option(*ss, json_path);
  ss->add_option("--svg", svg, "Also plot tokens per pass and tokens/s against R as SVG")->check(output_file());
  ss->add_option("--gen-length", gen, "New tokens")->check(number_in(1, 480))->capture_default_str();
  ss->add_option("--steps", steps,
                 "Values of R, each at most the generation length L (when R does not divide L, the "
                 "first L mod R steps commit one token more)")
      ->delimiter(',')
      ->check(number_in(1, 480));
  ss->add_option("--reps", reps, "Runs per row (best is kept)")->check(number_in(1, 100))->capture_default_str();
  std::vector<std::int64_t> q_steps = {8, 4, 2, 1};
  std::int64_t q_gen = 8, per_kind = 10, windows = 8;
  auto* sq = app.add_subcommand("quality", "Probe accuracy and the validation ELBO against R");
  add_json_option(*sq, json_path);
  sq->add_option("--steps", q_steps, "Values of R")->delimiter(',')->check(number_in(1, 4096));
  sq->add_option("--gen-length", q_gen, "Tokens generated per probe")->check(number_in(1, 256))->capture_default_str();
  sq->add_option("--probes-per-kind", per_kind, "Probes of each kind (0: all)")
      ->check(number_in(0, 1e9))
      ->capture_default_str();
  sq->add_option("--windows", windows, "Validation windows of 128 tokens for the ELBO")
      ->check(number_in(1, 1000))
      ->capture_default_str();
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*sc) {
      o.remasking = remasking == "random" ? Remasking::Random : Remasking::LowConfidence;
      const DiffusionModel m = load_diffusion(model);
      const auto tok = Tokenizer::for_model(model);
      std::printf("%s, %s sampler: %lld masks, %lld steps, blocks of %lld, temperature %g, %s remasking\n\n", model.c_str(),
                  sampler.c_str(), static_cast<ll>(o.gen_length), static_cast<ll>(o.steps), static_cast<ll>(o.block_length),
                  o.temperature, remasking.c_str());
      const json r = run_canvas(m, *tok, prompt, o, sampler == "mdlm", false);
      if (!canvas_svg.empty()) plot_canvas(r, *tok, m.mask_id, canvas_svg);
      if (!json_path.empty()) write_json(json_path, r, {model});
      return 0;
    }
    if (*ss) {
      for (std::int64_t R : steps)  // before any run: a step with nothing to commit
        IL_CHECK(R <= gen, "--steps ", R, " is more than --gen-length ", gen, ": each step commits at least one token");
      const Device d = dev.resolved_device();
      DiffusionModel m = load_diffusion(bundled_model("tiny-mdlm"));
      m.base = m.base.to(d, DType::F32);
      const models::Llama ar = models::load_llama(bundled_model("tiny-mha")).to(d, DType::F32);
      const auto tok = Tokenizer::for_model(bundled_model("tiny-mdlm"));
      const auto roof = metrics::measure_ceiling(d);
      std::printf(
          "%lld new tokens after a 7-token prompt on %s, best of %d; GB/s against a streaming read over as many "
          "bytes as a pass reads (cache: in the last-level cache, mem: from memory at %s), GFLOP/s against %s "
          "(%s)\n\n",
          static_cast<ll>(gen), device_name(d).data(), reps, metrics::describe(roof.read, "B").c_str(),
          metrics::describe(roof.compute, "FLOP").c_str(), roof.flops_dtype.c_str());
      const json rows = speed_table(m, ar, tok->encode("Once upon a time there were"), gen, steps, reps, roof, false);
      if (!svg.empty()) plot_against_steps(rows, json::array(), gen, svg);
      if (!json_path.empty())
        write_json(json_path, {{"device", device_name(d)}, {"ceiling", metrics::to_json(roof)}, {"rows", rows}});
      return 0;
    }
    if (*sq) {
      const DiffusionModel m = load_diffusion(bundled_model("tiny-mdlm"));
      const auto tok = Tokenizer::for_model(bundled_model("tiny-mdlm"));
      const json rows = quality_table(m, *tok, q_steps, q_gen, per_kind, windows, false);
      if (!json_path.empty()) write_json(json_path, {{"rows", rows}});
      return 0;
    }
    return headline(json_path, svg, canvas_svg);
  });
}
