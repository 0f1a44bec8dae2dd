#include "common/eval.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/input_file.h"
#include "common/json_file.h"

namespace inferlab::eval {

std::vector<std::int32_t> tokenize_documents(const Tokenizer& tok, const std::string& path) {
  require_regular_file(path, "corpus");
  std::ifstream in(path);
  IL_CHECK(in.good(), "cannot open corpus ", path, ": ", std::strerror(errno));
  std::vector<std::int32_t> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto ids = tok.encode(line, true);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

namespace {
// Cross-entropy of one row of logits against `target`: logsumexp(l) − l[target], in double.
double cross_entropy(const float* l, std::int64_t V, std::int32_t target) {
  const double mx = *std::max_element(l, l + V);
  double s = 0;
  for (std::int64_t i = 0; i < V; ++i) s += std::exp(static_cast<double>(l[i]) - mx);
  return mx + std::log(s) - static_cast<double>(l[target]);
}
}  // namespace

Perplexity perplexity(const LogitsFn& logits, const std::vector<std::int32_t>& tokens, std::int64_t window,
                      std::int64_t max_windows, const std::string& what) {
  IL_CHECK(window > 0, "perplexity: window must be positive");
  std::int64_t n = (static_cast<std::int64_t>(tokens.size()) - 1) / window;
  if (max_windows > 0) n = std::min(n, max_windows);
  IL_CHECK(n > 0, "perplexity: ", tokens.size(), " tokens are fewer than one window of ", window + 1);
  double total = 0;
  std::int64_t count = 0;
  Progress progress(what + ": windows", n);
  for (std::int64_t w = 0; w < n; ++w) {
    progress.update(w);
    const auto b = tokens.begin() + w * window;
    const std::vector<std::int32_t> x(b, b + window);
    const Tensor l = logits(x).to(Device::CPU).contiguous();
    const std::int64_t V = l.size(1);
    for (std::int64_t t = 0; t < window; ++t) {
      const double ce = cross_entropy(l.data<float>() + t * V, V, *(b + t + 1));
      IL_CHECK(std::isfinite(ce), what, ": window ", w, ", position ", t, ": the logits hold NaN or infinity");
      total += ce;
    }
    count += window;
  }
  const double loss = total / static_cast<double>(count);
  IL_CHECK(std::isfinite(std::exp(loss)), what, ": a loss of ", loss, " nats per token has no finite perplexity");
  return {loss, std::exp(loss), count};
}

std::vector<Probe> load_probes(const std::string& path) {
  require_regular_file(path, "probe file");
  std::ifstream in(path);
  IL_CHECK(in.good(), "cannot open probe file ", path, ": ", std::strerror(errno));
  std::vector<Probe> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(path, ": line ", n, " is not valid JSON: ", e.what());
    }
    JsonFields f(j, path + ": line " + std::to_string(n));
    out.push_back({f.get<std::string>("kind"), f.get<std::string>("prompt"), f.get<std::string>("answer"),
                   f.get_or<std::string>("distractor", "")});
  }
  return out;
}

ProbeScores probe_accuracy_of_answers(const AnswerFn& answer, const Tokenizer& tok, const std::vector<Probe>& probes,
                                      std::int64_t per_kind, const std::string& what) {
  std::map<std::string, std::int64_t> right, dist, total;
  std::int64_t to_score = 0;  // the probes scored: at most per_kind of each kind
  for (const Probe& p : probes) to_score += per_kind <= 0 || total[p.kind]++ < per_kind;
  total.clear();
  Progress progress(what, to_score);
  std::int64_t scored = 0;
  for (const Probe& p : probes) {
    if (per_kind > 0 && total[p.kind] >= per_kind) continue;
    progress.update(scored++);
    const auto prompt = tok.encode(p.prompt, true), full = tok.encode(p.prompt + p.answer, true);
    IL_CHECK(full.size() > prompt.size() && std::equal(prompt.begin(), prompt.end(), full.begin()), "probe '",
             p.prompt.substr(0, 40), "...': its answer does not tokenize as a continuation of the prompt");
    const std::vector<std::int32_t> want(full.begin() + static_cast<std::ptrdiff_t>(prompt.size()), full.end());
    const auto got = answer(prompt, want);
    IL_CHECK(got.size() == want.size(), "probe '", p.prompt.substr(0, 40), "...': the model gave ", got.size(),
             " answer tokens for ", want.size());
    ++total[p.kind];
    right[p.kind] += got == want;
    if (!p.distractor.empty()) dist[p.kind] += got[0] == tok.encode(p.distractor, false).at(0);
  }
  ProbeScores s;
  for (const auto& [kind, n] : total) {
    s.accuracy[kind] = static_cast<double>(right[kind]) / static_cast<double>(n);
    if (dist.count(kind)) s.distractor[kind] = static_cast<double>(dist[kind]) / static_cast<double>(n);
    s.per_kind = std::max(s.per_kind, n);
  }
  return s;
}

ProbeScores probe_accuracy(const LogitsFn& logits, const Tokenizer& tok, const std::vector<Probe>& probes,
                           std::int64_t per_kind, const std::string& what) {
  // Teacher-forced: the prompt and the answer in one pass, the argmax at each answer position.
  const AnswerFn teacher_forced = [&](const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& answer) {
    std::vector<std::int32_t> full = prompt;
    full.insert(full.end(), answer.begin(), answer.end());
    const Tensor l = logits(full).to(Device::CPU).contiguous();
    const std::int64_t V = l.size(1);
    std::vector<std::int32_t> pred;
    for (std::size_t t = prompt.size(); t < full.size(); ++t) {
      const float* row = l.data<float>() + static_cast<std::int64_t>(t - 1) * V;
      pred.push_back(static_cast<std::int32_t>(std::max_element(row, row + V) - row));
    }
    return pred;
  };
  return probe_accuracy_of_answers(teacher_forced, tok, probes, per_kind, what);
}

std::vector<std::int32_t> validation_tokens(const std::string& data_dir, std::int64_t n) {
  const auto tok = Tokenizer::for_model(data_dir + "/models/tiny-mha");  // the zoo's one tokenizer
  auto val = tokenize_documents(*tok, data_dir + "/corpus/val.txt");
  IL_CHECK(static_cast<std::int64_t>(val.size()) >= n, data_dir, "/corpus/val.txt has ", val.size(), " tokens, fewer than ",
           n);
  val.resize(static_cast<std::size_t>(n));
  return val;
}

std::vector<std::string> kinds_in_reading_order(const std::map<std::string, double>& scores) {
  auto key = [](const std::string& k) {
    const auto cut = k.rfind('_');
    const std::string family = k.substr(0, cut);
    const std::string digits = cut == std::string::npos ? "" : k.substr(cut + 1);
    const bool numeric = !digits.empty() && digits.size() <= 18 &&
                         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    return std::make_tuple(family == "recall" ? 0
                           : family == "ar"   ? 1
                                              : 2,
                           family, numeric ? 0 : 1, numeric ? std::stoll(digits) : 0LL, k);
  };
  std::vector<std::string> kinds;
  for (const auto& [k, v] : scores) kinds.push_back(k);
  std::sort(kinds.begin(), kinds.end(), [&](const std::string& x, const std::string& y) { return key(x) < key(y); });
  return kinds;
}

nlohmann::json quality_table(const std::vector<Scored>& models, const std::string& data_dir, std::int64_t windows,
                             std::int64_t per_kind) {
  const auto tok = Tokenizer::for_model(data_dir + "/models/tiny-mha");  // the zoo's one tokenizer
  const auto val = tokenize_documents(*tok, data_dir + "/corpus/val.txt");
  const auto probes = load_probes(data_dir + "/corpus/probes.jsonl");
  std::size_t width = 10;
  for (const Scored& m : models) width = std::max(width, m.name.size());
  const int w = static_cast<int>(width);
  std::vector<std::string> kinds;
  nlohmann::json out = nlohmann::json::array();
  for (const Scored& m : models) {
    const auto ppl = perplexity(m.logits, val, 512, windows, m.name + ": validation perplexity");
    const auto pr = probe_accuracy(m.logits, *tok, probes, per_kind, m.name + ": probes");
    if (kinds.empty()) {
      std::printf("%-*s %12s %8s", w, "model", "cache B/tok", "val ppl");
      kinds = kinds_in_reading_order(pr.accuracy);
      for (const auto& k : kinds) std::printf(" %11s", k.c_str());
      std::printf("\n");
    }
    std::printf("%-*s %12lld %8.3f", w, m.name.c_str(), static_cast<long long>(m.cache_bytes_per_token), ppl.ppl);
    for (const auto& k : kinds) std::printf(" %11.3f", pr.accuracy.at(k));
    std::printf("\n");
    std::fflush(stdout);
    out.push_back({{"model", m.name},
                   {"cache_bytes_per_token", m.cache_bytes_per_token},
                   {"val_loss", ppl.loss},
                   {"val_ppl", ppl.ppl},
                   {"val_tokens", ppl.tokens},
                   {"probes", pr.accuracy}});
  }
  return out;
}

}  // namespace inferlab::eval
