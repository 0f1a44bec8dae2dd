// ch10_speculative_sampling: a draft guesses γ tokens, the target checks them in one pass, and the
// output is an exact sample from the target.
//   ch10_speculative_sampling              the headline: tiny-draft drafting for tiny-mha
//   ch10_speculative_sampling sweep        acceptance, tokens per target pass, predicted and measured speed-up against γ
//   ch10_speculative_sampling self         self-speculation: the target quantised to int4 as its own draft
//   ch10_speculative_sampling example      the lecture's worked example, recomputed
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/09_quantization/qmodel.h"
#include "chapters/10_speculative_sampling/speculative.h"
#include "common/cli.h"
#include "common/metrics.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch10;
using nlohmann::json;

namespace {

using ll = long long;

struct Setup {
  models::Llama target, draft;
  std::vector<std::int32_t> prompt;
  SamplingParams params;
  std::shared_ptr<Tokenizer> tok;
  int max_new = 0;
};

// One generation with fresh caches. With γ = 0 it is `target` alone through the same Model
// interface (one target pass per token): the baseline every speed-up is measured against.
SpeculativeRun run_once(const Setup& s, const models::Llama& target, const models::Llama& draft, std::int64_t gamma) {
  const std::int64_t cap = static_cast<std::int64_t>(s.prompt.size()) + s.max_new + gamma + 2;
  CachedModel t(target, std::min(cap, target.config.max_position_embeddings), s.params),
      d(draft, std::min(cap, draft.config.max_position_embeddings), s.params);
  Sampler rng(s.params);
  return speculative_generate(t, d, s.prompt, s.max_new, gamma, rng, target.config.eos_token_ids);
}

// The fastest of `reps` runs of each: the target alone, the draft alone, then speculative
// decoding at each γ. The runs take turns (one of each, then again), so a change in the machine's
// speed while they run (other work, memory bandwidth shared with other tenants) touches every
// figure alike instead of skewing the ratios between them.
struct Runs {
  SpeculativeRun target, draft;
  std::vector<SpeculativeRun> speculative;  // per γ
};
Runs fastest_runs(const Setup& s, const models::Llama& draft, const std::vector<std::int64_t>& gammas, int reps) {
  Runs best;
  best.speculative.resize(gammas.size());
  auto keep = [](SpeculativeRun& best_so_far, SpeculativeRun r, int rep) {
    if (rep == 0 || r.seconds < best_so_far.seconds) best_so_far = std::move(r);
  };
  for (int rep = 0; rep < reps; ++rep) {
    keep(best.target, run_once(s, s.target, draft, 0), rep);
    keep(best.draft, run_once(s, draft, draft, 0), rep);
    for (std::size_t i = 0; i < gammas.size(); ++i) keep(best.speculative[i], run_once(s, s.target, draft, gammas[i]), rep);
  }
  return best;
}

// The target's verification pass over `rows` tokens after the prompt, over its pass over one:
// what the lecture's formula takes to be 1 (a memory-bound pass reads the weights once, whatever
// the rows). Best of 5 each, the two kinds of pass taking turns.
double verify_cost(const Setup& s, std::int64_t rows) {
  const auto n0 = static_cast<std::int64_t>(s.prompt.size());
  CachedModel m(s.target, n0 + rows + 1, s.params);
  m.feed(s.prompt);
  auto time_pass = [&](std::int64_t n) {
    metrics::Timer t = metrics::Timer::work(s.target.device() == Device::CPU);
    m.feed(std::vector<std::int32_t>(static_cast<std::size_t>(n), s.prompt.back()));
    const double dt = t.seconds();
    m.truncate(n0);
    return dt;
  };
  double many = 1e30, one = 1e30;
  for (int i = 0; i < 5; ++i) many = std::min(many, time_pass(rows)), one = std::min(one, time_pass(1));
  return many / one;
}

double per_token(const SpeculativeRun& r) {
  return r.generated.empty() ? 0 : r.seconds / static_cast<double>(r.generated.size());
}

// The output, each token marked by who produced it: plain = a draft the target accepted,
// [bracketed] = the target's own (a resample after a rejection, or the bonus token).
std::string marked(const Tokenizer& tok, const SpeculativeRun& r) {
  std::string s;
  for (std::size_t i = 0; i < r.generated.size(); ++i) {
    const std::string piece = tok.decode({r.generated[i]});
    s += r.origin[i] == Origin::Draft ? piece : "[" + piece + "]";
  }
  return s;
}

json sweep(const Setup& s, const models::Llama& draft, const std::string& draft_name,
           const std::vector<std::int64_t>& gammas, int reps, bool indent) {
  const char* pad = indent ? "  " : "";
  const Runs runs = fastest_runs(s, draft, gammas, reps);
  const SpeculativeRun &alone = runs.target, &draft_alone = runs.draft;
  const double c = per_token(draft_alone) / per_token(alone);
  std::printf(
      "%starget alone: %.2f ms per token; %s alone: %.2f ms per token, so c = %.3f (a draft pass over a target pass)\n", pad,
      per_token(alone) * 1e3, draft_name.c_str(), per_token(draft_alone) * 1e3, c);
  std::printf("%s%-6s %8s %10s %12s %12s %10s %10s %12s %12s\n", pad, "gamma", "alpha", "accepted", "tok/target", "formula",
              "speed-up", "predicted", "verify cost", "with it");
  json rows = json::array();
  for (std::size_t i = 0; i < gammas.size(); ++i) {
    const std::int64_t g = gammas[i];
    const SpeculativeRun& r = runs.speculative[i];
    const double measured = per_token(alone) / per_token(r), predicted = expected_speedup(r.alpha(), g, c);
    const double v = verify_cost(s, g + 1), with_v = r.tokens_per_round() / (static_cast<double>(g) * c + v);
    std::printf("%s%-6lld %8.3f %9.1f%% %12.2f %12.2f %9.2fx %9.2fx %11.2f %11.2fx\n", pad, static_cast<ll>(g), r.alpha(),
                r.drafted ? 100.0 * static_cast<double>(r.accepted) / static_cast<double>(r.drafted) : 0.0,
                r.tokens_per_round(), expected_tokens_per_round(r.alpha(), g), measured, predicted, v, with_v);
    std::fflush(stdout);
    rows.push_back({{"gamma", g},
                    {"alpha", r.alpha()},
                    {"drafted", r.drafted},
                    {"accepted", r.accepted},
                    {"rounds", r.rounds},
                    {"generated", r.generated.size()},
                    {"tokens_per_target_pass", r.tokens_per_round()},
                    {"formula_tokens_per_pass", expected_tokens_per_round(r.alpha(), g)},
                    {"seconds", r.seconds},
                    {"speedup", measured},
                    {"predicted_speedup", predicted},
                    {"verify_cost", v},
                    {"predicted_with_verify_cost", with_v},
                    {"draft_seconds", r.draft_seconds},
                    {"target_seconds", r.target_seconds}});
  }
  std::printf(
      "%s(alpha: Σ min(p, q) averaged over the drafted positions; formula: (1 − α^(γ+1)) / (1 − α); predicted: "
      "that over γc + 1, with the measured α and c; verify cost: the target's pass over γ + 1 tokens over its pass "
      "over one, which the formula takes as 1; with it: the measured tokens per pass over γc + that cost)\n",
      pad);
  if (!gammas.empty() && runs.speculative.front().target_seconds > 0) {  // host rounds: the time split by who spent it
    std::printf(
        "%swhere a round's time goes, in target passes (the formula's γc + 1 beside it):\n%s%-6s %10s %10s %10s %10s %10s\n",
        pad, pad, "gamma", "drafting", "verifying", "the rest", "round", "γc + 1");
    for (std::size_t i = 0; i < gammas.size(); ++i) {
      const SpeculativeRun& r = runs.speculative[i];
      const double unit = per_token(alone) * static_cast<double>(r.rounds);  // one target pass per round
      const double rest = r.seconds - r.draft_seconds - r.target_seconds;
      std::printf("%s%-6lld %10.2f %10.2f %10.2f %10.2f %10.2f\n", pad, static_cast<ll>(gammas[i]), r.draft_seconds / unit,
                  r.target_seconds / unit, rest / unit, r.seconds / unit, static_cast<double>(gammas[i]) * c + 1);
    }
  }
  return {{"target_seconds_per_token", per_token(alone)},
          {"draft_seconds_per_token", per_token(draft_alone)},
          {"c", c},
          {"rows", rows}};
}

// sweep()'s rows on the formula's curves: speed-up = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) against γ
// for a few α (the measured c), and each measured γ at its measured speed-up, labelled with its α.
void plot_sweep(const json& sw, const std::string& title, const std::string& path) {
  const double c = sw["c"].get<double>();
  plot::Figure f;
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s: speed-up against γ and α (c = %.3f measured)", title.c_str(), c);
  f.title = buf;
  f.x.label = "drafted tokens per round γ";
  f.y.label = "speed-up over the target alone (×)";
  std::int64_t top = 1;
  double mean_alpha = 0;
  for (const json& r : sw["rows"])
    top = std::max(top, r["gamma"].get<std::int64_t>()), mean_alpha += r["alpha"].get<double>();
  mean_alpha /= std::max<double>(1, static_cast<double>(sw["rows"].size()));
  const char* colors[] = {"#bbbbbb", "#999999", "#666666"};
  int k = 0;
  for (const double a : {0.5, 0.7, 0.9}) {
    plot::Series curve;
    std::snprintf(buf, sizeof buf, "formula, α = %.1f", a);
    curve.label = buf;
    curve.color = colors[k++];
    for (std::int64_t g = 1; g <= top + 2; ++g)
      curve.x.push_back(static_cast<double>(g)), curve.y.push_back(ch10::expected_speedup(a, g, c));
    f.series.push_back(curve);
  }
  plot::Series at_mean, measured, predicted;
  std::snprintf(buf, sizeof buf, "formula, measured mean α = %.2f", mean_alpha);
  at_mean.label = buf;
  at_mean.dashed = true, at_mean.color = "#1f77b4";
  for (std::int64_t g = 1; g <= top + 2; ++g)
    at_mean.x.push_back(static_cast<double>(g)), at_mean.y.push_back(ch10::expected_speedup(mean_alpha, g, c));
  measured.label = "measured (each point: its own α)";
  measured.line = false, measured.label_points = true, measured.color = "#d62728";
  predicted.label = "predicted with the measured verify cost";
  predicted.line = false, predicted.markers = true, predicted.color = "#2ca02c";
  for (const json& r : sw["rows"]) {
    const double g = r["gamma"].get<double>();
    measured.x.push_back(g), measured.y.push_back(r["speedup"].get<double>());
    std::snprintf(buf, sizeof buf, "α = %.2f", r["alpha"].get<double>());
    measured.point_labels.push_back(buf);
    predicted.x.push_back(g), predicted.y.push_back(r["predicted_with_verify_cost"].get<double>());
  }
  f.series.push_back(at_mean), f.series.push_back(measured), f.series.push_back(predicted);
  plot::save_svg(f, path);
  std::printf("wrote %s\n", path.c_str());
}

json example(bool indent) {
  const char* pad = indent ? "  " : "";
  const double td = 2e-3, tv = 30e-3;
  std::printf("%sthe lecture's worked example: γ = 4, t_d = 2 ms, t_v = 30 ms, so c = 1/15\n", pad);
  json rows = json::array();
  for (const double a : {0.8, 0.5}) {
    const double tokens = expected_tokens_per_round(a, 4), speedup = tokens * tv / (4 * td + tv);
    std::printf("%s  alpha = %.1f: %.4f tokens per round, speed-up %.4f × 30 / 38 = %.2fx\n", pad, a, tokens, tokens,
                speedup);
    rows.push_back({{"alpha", a}, {"tokens_per_round", tokens}, {"speedup", speedup}});
  }
  std::printf(
      "%s  (the lecture writes 3.54 tokens and 2.8x at alpha = 0.8: its sum 1 + α + α² + α³ + (1 − α⁴) counts the "
      "last term differently; the expectation is Σ_{i=0..γ} α^i = (1 − α^5) / (1 − α) = 3.3616, and 1.94 at 0.5 "
      "agrees with it)\n",
      pad);
  return rows;
}

// A random Llama big enough that its decode step is memory-bound on a CPU (D = 1024, 8 layers,
// F = 2816, 16 heads of 64, tiny-mha's 1024-token vocabulary: about 100M parameters, 400 MB in
// f32): the regime the lecture's argument is about. Its tokenizer is tiny-mha's.
Setup random_setup(const GenerationOptions& g) {
  const TransformerConfig c = models::memory_bound_shape(8, 16, 1024, 4096);
  Setup s;
  s.target = models::random_llama(c, 1);
  s.tok = Tokenizer::for_model(bundled_model("tiny-mha"));
  s.prompt = s.tok->encode(g.prompt);
  s.params = g.sampling(*s.tok, c.vocab_size, bundled_model("tiny-mha"));
  s.max_new = g.max_new_tokens;
  return s;
}

Setup setup(const std::string& target, const std::string& draft, const GenerationOptions& g) {
  Setup s;
  s.target = models::load_llama(target);
  s.draft = models::load_llama(draft);
  IL_CHECK(s.target.config.vocab_size == s.draft.config.vocab_size, "the draft (", draft, ") has a vocabulary of ",
           s.draft.config.vocab_size, " and the target (", target, ") of ", s.target.config.vocab_size,
           ": speculative sampling needs the same tokenizer");
  s.tok = Tokenizer::for_model(target);
  s.prompt = s.tok->encode(g.prompt);
  if (draft != target) {  // the same tokenizer: the same ids for the same text, and the same vocabulary
    const auto dtok = Tokenizer::for_model(draft);
    IL_CHECK(dtok->vocab_size() == s.tok->vocab_size() && dtok->encode(g.prompt) == s.prompt, "the draft (", draft,
             ") and the target (", target, ") do not share a tokenizer: their vocabularies (", dtok->vocab_size(), ", ",
             s.tok->vocab_size(), ") or their encodings of the prompt differ");
  }
  s.params = g.sampling(*s.tok, s.target.config.vocab_size, target);
  s.max_new = g.max_new_tokens;
  models::check_context(s.target, s.prompt.size(), s.max_new);  // a round never holds more than prompt + max_new
  models::check_context(s.draft, s.prompt.size(), s.max_new);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 10: speculative sampling", "ch10_speculative_sampling"};
  std::string json_path;
  add_json_option(app, json_path);  // the bare run's
  std::string svg;
  app.add_option("--svg", svg, "Also plot the speed-up against γ on the formula's curves as SVG")->check(output_file());
  help_footer(app,
              "tiny-draft drafting for tiny-mha at temperature 0.8: the output with the target's own tokens marked, "
              "acceptance, tokens per target pass, the measured cost ratio c, predicted and measured speed-up for "
              "γ = 1 … 6; the lecture's worked example recomputed",
              "chapters/10_speculative_sampling/README.md", "无损加速：投机采样");
  std::string target = bundled_model("tiny-mha"), draft = bundled_model("tiny-draft");
  GenerationOptions go;
  go.max_new_tokens = 96;
  go.temperature = 0.8f;
  std::vector<std::int64_t> gammas = {1, 2, 3, 4, 6};
  int reps = 3;
  ModelOptions dev;
  auto* ss = app.add_subcommand("sweep", "Acceptance, tokens per target pass, predicted and measured speed-up against γ");
  ss->add_option("--target", target, "The target model folder")->capture_default_str();
  ss->add_option("--draft", draft, "The draft model folder (the same tokenizer)")->capture_default_str();
  add_generation_options(*ss, go);
  add_device_option(*ss, dev);
  ss->add_option("--gamma", gammas,
                 "Drafts per round, 1 to 64 (the target alone is the baseline every row is measured against)")
      ->delimiter(',')
      ->check(number_in(1, 64));
  ss->add_option("--reps", reps, "Runs per row (best is kept)")->check(number_in(1, 100))->capture_default_str();
  add_json_option(*ss, json_path);
  ss->add_option("--svg", svg, "Also plot the speed-up against γ on the formula's curves as SVG")->check(output_file());
  std::string format = "int4_g32_sym";
  std::int64_t self_gamma = 4;
  bool random_target = false;
  auto* sf = app.add_subcommand("self", "Self-speculation: the target quantised (chapter 09) as its own draft");
  sf->add_option("--target", target, "The target model folder")->capture_default_str();
  sf->add_option("--format", format, "The draft's chapter 09 format")->capture_default_str();
  sf->add_option("--gamma", self_gamma, "Drafts per round")->check(number_in(1, 64))->capture_default_str();
  sf->add_option("--reps", reps, "Runs per row (best is kept)")->check(number_in(1, 100))->capture_default_str();
  sf->add_flag("--random", random_target, "A random 100M-parameter target (memory-bound on a CPU) instead of --target");
  add_generation_options(*sf, go);
  add_device_option(*sf, dev);
  add_json_option(*sf, json_path);
  auto* se = app.add_subcommand("example", "The lecture's worked example, recomputed");
  add_json_option(*se, json_path);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*se) {
      const json r = example(false);
      if (!json_path.empty()) write_json(json_path, {{"example", r}});
      return 0;
    }
    if (*sf) {
      Setup s = random_target ? random_setup(go) : setup(target, target, go);
      s.draft = ch09::quantize_model(s.target, ch09::QuantSpec::parse(format)).to(dev.resolved_device(), DType::F32);
      s.target = s.target.to(dev.resolved_device(), DType::F32);
      const std::string name = random_target ? "a random 100M-parameter Llama" : target;
      std::printf("%s drafting for itself as %s (chapter 09: %.0f MB against %.0f MB), temperature %g, %d tokens\n\n",
                  name.c_str(), format.c_str(), static_cast<double>(s.draft.weight_bytes()) / 1e6,
                  static_cast<double>(s.target.weight_bytes()) / 1e6, s.params.temperature, s.max_new);
      const json r = sweep(s, s.draft, format, {self_gamma}, reps, false);
      if (!json_path.empty()) write_json(json_path, {{"target", name}, {"format", format}, {"sweep", r}}, {target});
      return 0;
    }
    const bool bare = !*ss;
    Setup s = setup(target, draft, go);
    if (*ss)
      s.target = s.target.to(dev.resolved_device(), DType::F32), s.draft = s.draft.to(dev.resolved_device(), DType::F32);
    if (bare) {
      std::printf(
          "Speculative sampling (lecture: 无损加速：投机采样): tiny-draft (2 layers, D = 64) drafts, tiny-mha (the "
          "target) verifies; temperature %g, %d tokens, best of %d runs\n",
          s.params.temperature, s.max_new, reps);
      const SpeculativeRun r = run_once(s, s.target, s.draft, 4);
      std::printf("  γ = 4, the target's own tokens [bracketed]: %s%s\n", s.tok->decode(s.prompt).c_str(),
                  marked(*s.tok, r).c_str());
    } else {
      std::printf("%s drafting for %s, temperature %g, %d tokens, best of %d runs\n\n", draft.c_str(), target.c_str(),
                  s.params.temperature, s.max_new, reps);
    }
    const json sw = sweep(s, s.draft, "the draft", gammas, reps, bare);
    json out = {{"target", target}, {"draft", draft}, {"temperature", s.params.temperature}, {"sweep", sw}};
    if (bare) out["example"] = example(true);
    if (bare) std::printf("  more: ch10_speculative_sampling sweep | self | example\n");
    if (!svg.empty()) {
      auto name = [](const std::string& folder) { return folder.substr(folder.find_last_of('/') + 1); };
      plot_sweep(sw, name(draft) + " drafting for " + name(target) + ", " + std::to_string(s.max_new) + " tokens", svg);
    }
    if (!json_path.empty()) write_json(json_path, out, {target, draft});
    return 0;
  });
}
