#include "chapters/11_continuous_batching/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace inferlab::ch11 {

namespace {

// The next double in [0, 1) from the top 53 bits, as common/sampling.h draws them.
double uniform(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1p-53; }

// A standard normal by Box and Muller's transform.
double normal(std::mt19937_64& g) {
  const double u = 1.0 - uniform(g), v = uniform(g);  // u in (0, 1]
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * M_PI * v);
}

std::int64_t lognormal_length(std::mt19937_64& g, double median, double sigma, std::int64_t lo, std::int64_t hi) {
  const double x = median * std::exp(sigma * normal(g));
  return std::clamp(static_cast<std::int64_t>(std::llround(x)), lo, hi);
}

}  // namespace

std::vector<Request> make_trace(const TraceSpec& spec, const std::vector<std::int32_t>& text) {
  IL_CHECK(spec.requests >= 1, "trace: at least one request, got ", spec.requests);
  IL_CHECK(spec.rate >= 0 && std::isfinite(spec.rate), "trace: the arrival rate must be finite and not negative, got ",
           spec.rate);
  IL_CHECK(spec.prompt_median >= 1 && spec.output_median >= 1 && spec.prompt_sigma >= 0 && spec.output_sigma >= 0,
           "trace: medians must be at least 1 token and sigmas not negative");
  IL_CHECK(spec.context >= 2, "trace: a context of ", spec.context, " positions holds no prompt and output");
  std::mt19937_64 g(spec.seed);
  std::vector<Request> out;
  double t = 0;
  const std::int64_t longest_prompt = spec.context / 2;
  for (std::int64_t i = 0; i < spec.requests; ++i) {
    if (spec.rate > 0 && i > 0) t += -std::log(1.0 - uniform(g)) / spec.rate;  // exponential gaps: Poisson arrivals
    Request r;
    r.id = i;
    r.arrival = t;
    const std::int64_t p = lognormal_length(g, spec.prompt_median, spec.prompt_sigma, 1, longest_prompt);
    r.max_new_tokens = static_cast<int>(lognormal_length(g, spec.output_median, spec.output_sigma, 1, spec.context - p));
    IL_CHECK(static_cast<std::int64_t>(text.size()) > p, "trace: the text has ", text.size(), " tokens, too few for a ", p,
             "-token prompt");
    const std::int64_t start = static_cast<std::int64_t>(uniform(g) * static_cast<double>(text.size() - p));
    r.prompt.assign(text.begin() + start, text.begin() + start + p);
    r.sampling = spec.sampling;
    r.sampling.seed = spec.sampling.seed * 1000003 + static_cast<std::uint64_t>(i);
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<Request> lecture_example(std::int64_t queued, std::int32_t token) {
  std::vector<Request> out;
  const int lengths[] = {10, 50, 100};
  for (std::int64_t i = 0; i < 3 + queued; ++i) {
    Request r;
    r.id = i;
    r.prompt = {token};
    r.max_new_tokens = lengths[i % 3];
    out.push_back(std::move(r));
  }
  return out;
}

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = static_cast<std::int64_t>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {  // linear interpolation between the order statistics around q·(n − 1)
    const double x = q * static_cast<double>(v.size() - 1);
    const auto i = static_cast<std::size_t>(std::floor(x));
    const std::size_t j = std::min(i + 1, v.size() - 1);
    return v[i] + (x - static_cast<double>(i)) * (v[j] - v[i]);
  };
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = at(0.5), s.p90 = at(0.9), s.p99 = at(0.99), s.max = v.back();
  return s;
}

Report report(const Engine& e) {
  Report r;
  std::vector<double> ttft, tpot, e2e;
  double first_arrival = 1e300, last_finish = 0;
  for (const auto& s : e.finished()) {
    r.requests++;
    r.generated += s->generated();
    ttft.push_back(s->first_token_time - s->request.arrival);
    e2e.push_back(s->finish_time - s->request.arrival);
    if (s->generated() > 1) tpot.push_back((s->finish_time - s->first_token_time) / static_cast<double>(s->generated() - 1));
    first_arrival = std::min(first_arrival, s->request.arrival);
    last_finish = std::max(last_finish, s->finish_time);
  }
  r.ttft = summarize(ttft), r.tpot = summarize(tpot), r.e2e = summarize(e2e);
  r.makespan = r.requests ? last_finish - first_arrival : 0;
  r.throughput = r.makespan > 0 ? static_cast<double>(r.generated) / r.makespan : 0;
  r.steps = static_cast<std::int64_t>(e.steps().size());
  r.preemptions = e.scheduler().preemptions();
  double seqs = 0;
  for (const StepRecord& s : e.steps()) {
    seqs += static_cast<double>(s.sequences);
    r.peak_kv_bytes = std::max(r.peak_kv_bytes, static_cast<double>(s.kv_bytes));
    r.bytes_read += s.bytes_read;
    r.busy += s.end - s.start;
    r.flops += s.flops;
    r.launches_per_step += static_cast<double>(s.launches), r.copies_per_step += static_cast<double>(s.copies);
    r.launches_min = &s == &e.steps().front() ? s.launches : std::min(r.launches_min, s.launches);
    r.launches_max = std::max(r.launches_max, s.launches);
  }
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;  // the least-squares line through (tokens, seconds)
  for (const StepRecord& s : e.steps()) {
    const double x = static_cast<double>(s.prefill_tokens + s.decode_tokens);
    n += 1, sx += x, sy += s.seconds, sxx += x * x, sxy += x * s.seconds;
  }
  if (n > 1 && n * sxx - sx * sx > 0) {
    r.step_per_token = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    r.step_fixed = (sy - r.step_per_token * sx) / n;
  }
  if (r.steps) {
    r.launches_per_step /= static_cast<double>(r.steps), r.copies_per_step /= static_cast<double>(r.steps);
    r.mean_batch = seqs / static_cast<double>(r.steps);
    r.slot_utilisation = r.mean_batch / static_cast<double>(e.scheduler().config().max_running);
  }
  return r;
}

std::string utilisation_line(const std::vector<StepRecord>& steps, std::int64_t cap, double end, int width) {
  static const char* const bars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> used(static_cast<std::size_t>(width), 0), time(static_cast<std::size_t>(width), 0);
  if (end <= 0) return std::string(static_cast<std::size_t>(width), ' ');
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const double a = steps[i].start, b = std::min(steps[i].end, end);
    const double share = static_cast<double>(steps[i].sequences) / static_cast<double>(cap);
    for (int c = 0; c < width; ++c) {  // the overlap of [a, b) with column c
      const double c0 = end * c / width, c1 = end * (c + 1) / width, o = std::min(b, c1) - std::max(a, c0);
      if (o > 0) used[static_cast<std::size_t>(c)] += o * share, time[static_cast<std::size_t>(c)] += o;
    }
  }
  std::string line;
  for (int c = 0; c < width; ++c) {
    const double col = end / width, t = time[static_cast<std::size_t>(c)];
    if (t <= 0) {  // no step in this column: the server was idle
      line += " ";
      continue;
    }
    const double u = used[static_cast<std::size_t>(c)] / col;  // slots in use, averaged over the column's time
    line += bars[std::clamp(static_cast<int>(std::lround(u * 8)) - 1, 0, 7)];
  }
  return line;
}

nlohmann::json to_json(const Summary& s) {
  return {{"n", s.n}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}};
}

nlohmann::json to_json(const Report& r) {
  return {{"requests", r.requests},
          {"generated", r.generated},
          {"steps", r.steps},
          {"preemptions", r.preemptions},
          {"makespan", r.makespan},
          {"busy", r.busy},
          {"throughput", r.throughput},
          {"ttft", to_json(r.ttft)},
          {"tpot", to_json(r.tpot)},
          {"e2e", to_json(r.e2e)},
          {"slot_utilisation", r.slot_utilisation},
          {"mean_batch", r.mean_batch},
          {"peak_kv_bytes", r.peak_kv_bytes},
          {"bytes_read", r.bytes_read},
          {"flops", r.flops},
          {"step_fixed_seconds", r.step_fixed},
          {"step_seconds_per_token", r.step_per_token},
          {"launches_per_step", r.launches_per_step},
          {"launches_min", r.launches_min},
          {"launches_max", r.launches_max},
          {"copies_per_step", r.copies_per_step}};
}

std::string launches_line(const Report& r, std::int64_t layers) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "kernel launches per step: %.1f (%lld to %lld; %.1f per layer), copies per step: %.1f",
                r.launches_per_step, static_cast<long long>(r.launches_min), static_cast<long long>(r.launches_max),
                r.launches_per_step / static_cast<double>(std::max<std::int64_t>(1, layers)), r.copies_per_step);
  return buf;
}

}  // namespace inferlab::ch11
