// ch11_continuous_batching: one engine, two policies. Static batching holds a batch until its
// longest request ends; continuous batching refills every slot the iteration it frees.
//   ch11_continuous_batching            the lecture's example, then tiny-mha serving a trace at three arrival rates
//   ch11_continuous_batching trace      any model, trace, caps and budgets; --random for a memory-bound 100M model
//   ch11_continuous_batching example    the lecture's 10/50/100 example, step by step
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "chapters/11_continuous_batching/trace.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/eval.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch11;
using nlohmann::json;

namespace {

using ll = long long;

struct ServeOptions {
  SchedulerConfig scheduler;
  Allocation allocation = Allocation::MaxLength;
  double budget_mib = 64;
  Clock clock = Clock::Measured;
  models::AttendPath attend = models::AttendPath::Batched;
};

struct Served {
  Report report;
  std::vector<StepRecord> steps;
  double end = 0;
};

Served serve(const models::Llama& m, const std::vector<Request>& trace, const ServeOptions& o, Policy policy) {
  ContiguousPool pool(m.config, static_cast<std::int64_t>(o.budget_mib * (1 << 20)), o.allocation, m.device());
  EngineConfig c;
  c.scheduler = o.scheduler;
  c.scheduler.policy = policy;
  c.clock = o.clock;
  c.attend_path = o.attend;
  Engine e(m, pool, c);
  for (const Request& r : trace) e.add(r);
  e.run();
  return {report(e), e.steps(), e.now()};
}

const char* policy_name(Policy p) { return p == Policy::Static ? "static" : "continuous"; }

// --- the lecture's example -------------------------------------------------------------------
json example(const models::Llama& m, bool indent) {
  const char* pad = indent ? "  " : "";
  ServeOptions o;
  o.scheduler.max_running = 3, o.scheduler.max_step_tokens = 3;
  o.clock = Clock::Steps;
  const std::int64_t queued = 9;
  const Served st = serve(m, lecture_example(0, 1), o, Policy::Static);
  const Served sq = serve(m, lecture_example(queued, 1), o, Policy::Static);
  const Served cq = serve(m, lecture_example(queued, 1), o, Policy::Continuous);
  std::int64_t full = 0, with_queue = 0;  // continuous: steps taken while requests still waited
  for (const StepRecord& r : cq.steps)
    if (r.waiting > 0) ++with_queue, full += r.sequences == 3;
  std::printf("%sThe lecture's example, in steps (one token per request per step), batch 3:\n", pad);
  std::printf("%s  static, requests of 10, 50, 100 tokens: %lld steps, slots in use %.1f%% (= 160 / 300)\n", pad,
              static_cast<ll>(st.report.steps), 100 * st.report.slot_utilisation);
  std::printf("%s  with %lld more queued (10, 50, 100 repeating; %lld tokens in all):\n", pad, static_cast<ll>(queued),
              static_cast<ll>(sq.report.generated));
  std::printf("%s    static      %4lld steps, slots in use %5.1f%%  %s\n", pad, static_cast<ll>(sq.report.steps),
              100 * sq.report.slot_utilisation, utilisation_line(sq.steps, 3, sq.end, 60).c_str());
  std::printf("%s    continuous  %4lld steps, slots in use %5.1f%%  %s\n", pad, static_cast<ll>(cq.report.steps),
              100 * cq.report.slot_utilisation, utilisation_line(cq.steps, 3, sq.end, 60).c_str());
  std::printf("%s    continuous batching: %lld of its %lld steps with a queue ran a full batch; %.2fx static's throughput\n",
              pad, static_cast<ll>(full), static_cast<ll>(with_queue),
              static_cast<double>(sq.report.steps) / static_cast<double>(cq.report.steps));
  return {{"static_three", to_json(st.report)},
          {"static_queued", to_json(sq.report)},
          {"continuous_queued", to_json(cq.report)},
          {"continuous_full_steps_with_queue", full},
          {"continuous_steps_with_queue", with_queue}};
}

// --- a trace at several arrival rates ----------------------------------------------------------
struct TraceOptions {
  TraceSpec spec;
  std::vector<double> rates;  ///< requests per second; 0: all at once; empty: relative to the measured capacity
  std::vector<Policy> policies = {Policy::Static, Policy::Continuous};
  std::string svg;
};

void print_header(const char* pad, Clock clock) {
  if (clock == Clock::Steps) {
    std::printf("%s%-14s %-10s %8s %9s %9s %9s %8s %8s %6s %6s\n", pad, "arrivals", "policy", "tok/step", "TTFT p50",
                "TTFT p99", "TPOT p50", "e2e p50", "e2e p99", "batch", "preem");
    return;
  }
  std::printf("%s%-14s %-10s %8s %9s %9s %9s %8s %8s %6s %6s %13s %15s\n", pad, "arrivals", "policy", "tok/s", "TTFT p50",
              "TTFT p99", "TPOT p50", "e2e p50", "e2e p99", "batch", "preem", "GB/s (of its ceiling)", "GFLOP/s (peak)");
}

json print_row(const char* pad, const std::string& arrivals, Policy p, const Served& s, const metrics::Ceiling& roof,
               Clock clock, metrics::CeilingLegend& legend) {
  const Report& r = s.report;
  const bool timed = r.busy > 0 && clock == Clock::Measured;
  const double gbs = timed ? r.bytes_read / r.busy : 0, flops = timed ? r.flops / r.busy : 0;
  // The read ceiling of the steps' kind: a streaming read over as many bytes as a mean step reads
  // (the weights and the caches it attends over; a small model's stay in the last-level cache).
  const metrics::ReadCeiling read =
      metrics::read_ceiling_for(roof, r.steps > 0 ? r.bytes_read / static_cast<double>(r.steps) : 0);
  if (clock == Clock::Steps)  // times in steps: the lecture's model, where a step costs the same at any batch
    std::printf("%s%-14s %-10s %8.2f %9.1f %9.1f %9.2f %8.1f %8.1f %6.2f %6lld\n", pad, arrivals.c_str(), policy_name(p),
                r.throughput, r.ttft.p50, r.ttft.p99, r.tpot.p50, r.e2e.p50, r.e2e.p99, r.mean_batch,
                static_cast<ll>(r.preemptions));
  else
    std::printf(
        "%s%-14s %-10s %8.0f %7.1fms %7.1fms %7.2fms %7.2fs %7.2fs %6.2f %6lld %6.2f (%3.0f%% %-5s) %8.1f (%3.0f%%)\n", pad,
        arrivals.c_str(), policy_name(p), r.throughput, r.ttft.p50 * 1e3, r.ttft.p99 * 1e3, r.tpot.p50 * 1e3, r.e2e.p50,
        r.e2e.p99, r.mean_batch, static_cast<ll>(r.preemptions), gbs / 1e9,
        legend.percent(arrivals + ", " + policy_name(p), gbs, read), read.abbrev(), flops / 1e9,
        100 * flops / roof.flops_per_s);
  std::fflush(stdout);
  json j = to_json(r);
  j["policy"] = policy_name(p), j["arrivals"] = arrivals;
  if (clock == Clock::Measured)
    j["achieved_bytes_per_s"] = gbs, j["achieved_flops_per_s"] = flops, j["read_ceiling"] = metrics::to_json(read);
  return j;
}

json run_trace(const models::Llama& m, const std::vector<std::int32_t>& text, const TraceOptions& t, const ServeOptions& o,
               const metrics::Ceiling& roof, bool indent) {
  const char* pad = indent ? "  " : "";
  {  // warm-up: the first steps of a process pay for page faults and cold caches
    TraceSpec w = t.spec;
    w.requests = std::min<std::int64_t>(4, w.requests), w.rate = 0;
    serve(m, make_trace(w, text), o, Policy::Continuous);
  }
  std::vector<double> rates = t.rates;
  json rows = json::array();
  metrics::CeilingLegend legend;
  print_header(pad, o.clock);
  double capacity = 0;
  std::vector<Served> at_once;
  if (rates.empty()) {  // all at once first: continuous batching's capacity sets the other rates
    TraceSpec s = t.spec;
    s.rate = 0;
    const auto trace = make_trace(s, text);
    for (Policy p : t.policies) {
      at_once.push_back(serve(m, trace, o, p));
      rows.push_back(print_row(pad, "all at once", p, at_once.back(), roof, o.clock, legend));
      if (p == Policy::Continuous)
        capacity = static_cast<double>(at_once.back().report.requests) / at_once.back().report.makespan;
    }
    if (capacity == 0) capacity = static_cast<double>(at_once.back().report.requests) / at_once.back().report.makespan;
    rates = {0.75 * capacity, 0.35 * capacity};
  }
  for (double rate : rates) {
    TraceSpec s = t.spec;
    s.rate = rate;
    const auto trace = make_trace(s, text);
    char label[32];
    std::snprintf(label, sizeof label,
                  rate <= 0                 ? "all at once"
                  : o.clock == Clock::Steps ? "%.3f req/step"
                                            : "%.1f req/s",
                  rate);
    for (Policy p : t.policies) {
      const Served r = serve(m, trace, o, p);
      rows.push_back(print_row(pad, label, p, r, roof, o.clock, legend));
      if (at_once.size() < t.policies.size()) at_once.push_back(r);
    }
  }
  std::printf(
      "%s(TTFT: arrival to first token; TPOT: per output token after the first; e2e: arrival to last token; "
      "batch: sequences per step; preem: preemptions%s)\n",
      pad,
      o.clock == Clock::Steps ? "; every time in steps"
                              : "; GB/s: the fewest bytes each step must read (weights once, every cache), "
                                "and GFLOP/s the FLOPs the ops counted, over the time in steps, against "
                                "the measured read ceilings below and the f32 GEMM peak");
  legend.print(pad);
  if (m.device() == Device::CUDA)  // the batched step's launches do not grow with the batch; cache by cache they do
    for (std::size_t i = 0; i < at_once.size(); ++i)
      std::printf("%sGPU, %s, %s attention, %.2f sequences a step: %s\n", pad, policy_name(t.policies[i]),
                  o.attend == models::AttendPath::Batched ? "batched" : "per-sequence", at_once[i].report.mean_batch,
                  launches_line(at_once[i].report, m.config.num_layers).c_str());
  const double end = std::max(at_once.front().end, at_once.back().end);
  std::printf("%sslots in use over time, %s:\n", pad, t.rates.empty() ? "all at once" : "the first rate");
  for (std::size_t i = 0; i < at_once.size(); ++i)
    std::printf(o.clock == Clock::Steps ? "%s  %-10s |%s| %.0f steps\n" : "%s  %-10s |%s| %.2fs\n", pad,
                policy_name(t.policies[i]), utilisation_line(at_once[i].steps, o.scheduler.max_running, end, 64).c_str(),
                at_once[i].end);
  json verdict;
  if (at_once.size() == 2) {
    const double gain = at_once[1].report.throughput / at_once[0].report.throughput;
    std::printf(
        o.clock == Clock::Steps
            ? "%scontinuous batching: %.2fx static batching's throughput, median end-to-end latency %.1f steps against "
              "%.1f\n"
            : "%scontinuous batching: %.2fx static batching's throughput, median end-to-end latency %.2fs against %.2fs\n",
        pad, gain, at_once[1].report.e2e.p50, at_once[0].report.e2e.p50);
    if (o.clock == Clock::Measured) {
      const Report& c = at_once[1].report;
      std::printf(
          "%sa step cost %.3f ms + %.3f ms per token in it (least squares over continuous batching's %lld steps): "
          "batching shares only the first part\n",
          pad, c.step_fixed * 1e3, c.step_per_token * 1e3, static_cast<ll>(c.steps));
    }
    verdict = {{"throughput_gain", gain},
               {"continuous_e2e_p50", at_once[1].report.e2e.p50},
               {"static_e2e_p50", at_once[0].report.e2e.p50}};
  }
  if (!t.svg.empty()) {
    plot::Figure f;
    f.title = "Sequences per step over time (cap " + std::to_string(o.scheduler.max_running) + ")";
    f.x.label = o.clock == Clock::Steps ? "steps" : "time (s)";
    f.y.label = "sequences in the step";
    for (std::size_t i = 0; i < at_once.size(); ++i) {
      plot::Series s;
      s.label = policy_name(t.policies[i]);
      for (const StepRecord& r : at_once[i].steps) {
        s.x.push_back(r.start), s.y.push_back(static_cast<double>(r.sequences));
        s.x.push_back(r.end), s.y.push_back(static_cast<double>(r.sequences));
      }
      f.series.push_back(s);
    }
    plot::save_svg(f, t.svg);
    std::printf("%swrote %s\n", pad, t.svg.c_str());
  }
  return {{"capacity_requests_per_s", capacity}, {"rows", rows}, {"first_rate", verdict}};
}

std::string describe_spec(const TraceSpec& s, const ServeOptions& o, const std::string& model) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s serving %lld requests of real text: prompts log-normal (median %.0f, σ %.1f), outputs log-normal "
                "(median %.0f, σ %.1f), temperature %g; at most %lld sequences and %lld tokens a step, %s",
                model.c_str(), static_cast<ll>(s.requests), s.prompt_median, s.prompt_sigma, s.output_median, s.output_sigma,
                s.sampling.temperature, static_cast<ll>(o.scheduler.max_running),
                static_cast<ll>(o.scheduler.max_step_tokens),
                o.allocation == Allocation::MaxLength ? "each cache of max length" : "caches growing on demand");
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 11: continuous batching", "ch11_continuous_batching"};
  std::string json_path;
  add_json_option(app, json_path);
  help_footer(app,
              "the lecture's 10/50/100 example counted in steps, then tiny-mha serving a trace of 48 requests "
              "at three arrival rates under static and continuous batching: throughput, TTFT, TPOT and end-to-end "
              "percentiles, GB/s against the measured read ceiling, the slots in use over time",
              "chapters/11_continuous_batching/README.md", "处理动态工作负载");
  std::string model = bundled_model("tiny-mha");
  ModelOptions dev;
  TraceOptions t;
  ServeOptions o;
  t.spec.sampling.temperature = 0.8f;
  std::string allocation = "max-length", policy = "both", clock = "measured", attend = "batched";
  bool random_model = false;
  std::int64_t budget_mib = 64;
  auto* st = app.add_subcommand("trace", "Serve a seeded trace: static against continuous batching at chosen arrival rates");
  CLI::Option* model_opt = st->add_option("--model", model, "The model folder")->capture_default_str();
  st->add_flag("--random", random_model, "A random 100M-parameter Llama (memory-bound on a CPU) with tiny-mha's tokenizer")
      ->excludes(model_opt);  // --model was ignored beside it
  add_device_option(*st, dev);
  st->add_option("--requests", t.spec.requests, "Requests in the trace")->check(number_in(1, 1e6))->capture_default_str();
  st->add_option("--rate", t.rates,
                 "Arrival rates, requests per second (0: all at once; default: all at once, then "
                 "0.75 and 0.35 of continuous batching's measured capacity)")
      ->delimiter(',')
      ->check(number_in(0, 1e9));
  st->add_option("--prompt-median", t.spec.prompt_median, "Median prompt length, tokens")
      ->check(number_in(1, 1e6))
      ->capture_default_str();
  st->add_option("--prompt-sigma", t.spec.prompt_sigma, "σ of log prompt length")
      ->check(number_in(0, 5))
      ->capture_default_str();
  st->add_option("--output-median", t.spec.output_median, "Median output length, tokens")
      ->check(number_in(1, 1e6))
      ->capture_default_str();
  st->add_option("--output-sigma", t.spec.output_sigma, "σ of log output length")
      ->check(number_in(0, 5))
      ->capture_default_str();
  st->add_option("--seed", t.spec.seed, "The trace's seed")->check(seed_number())->capture_default_str();
  st->add_option("--temperature", t.spec.sampling.temperature, "Every request's temperature (0: greedy)")
      ->check(number_in(0, 100))
      ->capture_default_str();
  st->add_option("--max-running", o.scheduler.max_running, "Sequences per step at most")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  st->add_option("--step-tokens", o.scheduler.max_step_tokens, "Tokens per step at most (continuous; chunked prefill)")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  st->add_option("--budget-mib", budget_mib, "The KV cache budget, MiB")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  st->add_option("--allocation", allocation, "max-length (at admission) or on-demand (16 positions at a time; may preempt)")
      ->check(CLI::IsMember({"max-length", "on-demand"}))
      ->capture_default_str();
  st->add_option("--policy", policy, "static, continuous or both")
      ->check(CLI::IsMember({"static", "continuous", "both"}))
      ->capture_default_str();
  st->add_option(
        "--clock", clock,
        "measured (seconds) or steps (every step costs 1: the lecture's memory-bound model; rates in requests per step)")
      ->check(CLI::IsMember({"measured", "steps"}))
      ->capture_default_str();
  st->add_option("--attend", attend,
                 "batched (each layer's attention one call over every cache) or per-sequence (cache by cache)")
      ->check(CLI::IsMember({"batched", "per-sequence"}))
      ->capture_default_str();
  st->add_option("--svg", t.svg, "Also plot the sequences per step over time (the first rate) as SVG")->check(output_file());
  add_json_option(*st, json_path);
  auto* se = app.add_subcommand("example", "The lecture's example: 10, 50 and 100-token requests at batch 3, in steps");
  add_json_option(*se, json_path);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    if (*se) {
      const json r = example(models::load_llama(model), false);
      if (!json_path.empty()) write_json(json_path, {{"example", r}});
      return 0;
    }
    const bool bare = !*st;
    const Device d = dev.resolved_device();
    models::Llama m =
        random_model ? models::random_llama(models::memory_bound_shape(8, 16, 1024, 4096), 1) : models::load_llama(model);
    std::shared_ptr<Tokenizer> tok = Tokenizer::for_model(random_model ? bundled_model("tiny-mha") : model);
    m = m.to(d, DType::F32);
    t.spec.context = m.config.max_position_embeddings;
    t.spec.sampling.vocab = tok->vocab_size();
    o.budget_mib = static_cast<double>(budget_mib);
    o.allocation = allocation == "on-demand" ? Allocation::OnDemand : Allocation::MaxLength;
    o.clock = clock == "steps" ? Clock::Steps : Clock::Measured;
    o.attend = attend == "per-sequence" ? models::AttendPath::PerSequence : models::AttendPath::Batched;
    if (policy != "both") t.policies = {policy == "static" ? Policy::Static : Policy::Continuous};
    o.scheduler.validate();
    const auto text = eval::tokenize_documents(*tok, data_dir() + "/corpus/val.txt");  // in the model's own tokens
    const std::string name = random_model ? "a random 100M-parameter Llama" : model;
    const metrics::Ceiling roof = metrics::measure_ceiling(d);
    json out = {{"model", name}, {"ceiling", metrics::to_json(roof)}};
    if (bare) {
      std::printf("Continuous batching (lecture: 处理动态工作负载): one engine, static and continuous policies\n\n");
      out["example"] = example(m, true);
      std::printf("\n");
    }
    std::printf("%s; KV budget %s\n", describe_spec(t.spec, o, name).c_str(),
                metrics::human_bytes(o.budget_mib * (1 << 20)).c_str());
    std::printf(
        "%sthe read ceiling from memory: %s (%s); each row's GB/s against a streaming read over as many\n"
        "%sbytes as its mean step reads (cache: in the last-level cache, part: partly, mem: from memory)\n",
        bare ? "  " : "", metrics::describe(roof.read, "B").c_str(), roof.source.c_str(), bare ? "  " : "");
    out["trace"] = run_trace(m, text, t, o, roof, bare);
    if (bare) {  // the same trace where every step costs the same, whatever its batch: the lecture's memory-bound model
      TraceSpec s = t.spec;
      s.rate = 0;
      ServeOptions steps = o;
      steps.clock = Clock::Steps;
      const auto trace = make_trace(s, text);
      const Report st = serve(m, trace, steps, Policy::Static).report,
                   ct = serve(m, trace, steps, Policy::Continuous).report;
      std::printf(
          "  the same trace, all at once, counted in steps (the lecture's model: a step costs the same at any "
          "batch): static %lld steps, continuous %lld, so %.2fx the throughput\n",
          static_cast<ll>(st.steps), static_cast<ll>(ct.steps),
          static_cast<double>(st.steps) / static_cast<double>(ct.steps));
      out["in_steps"] = {{"static", to_json(st)}, {"continuous", to_json(ct)}};
    }
    if (bare) std::printf("  more: ch11_continuous_batching trace --help | example\n");
    if (!json_path.empty()) write_json(json_path, out, {model});
    return 0;
  });
}
