// ch12_paged_attention: the KV cache in blocks. Chapter 11's engine on chapter 11's trace, with
// contiguous max-length caches and with paged ones; prefix sharing; the paged attention op's speed.
//   ch12_paged_attention            memory waste and batch size on the trace, prefix sharing, the op at 16K
//   ch12_paged_attention memory     the trace under both caches, any budget, cap and block size
//   ch12_paged_attention sharing    n parallel samples (fork, copy-on-write) and a shared system prompt
//   ch12_paged_attention speed      paged against contiguous attention at long contexts
//   ch12_paged_attention kinds      one budget for every kind of layer: bytes per sequence, sequences, speed
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <nlohmann/json.hpp>

#include "chapters/11_continuous_batching/trace.h"
#include "chapters/12_paged_attention/hybrid_cache.h"
#include "chapters/12_paged_attention/paged_attention.h"
#include "chapters/12_paged_attention/paged_cache.h"
#include "common/ceiling.h"
#include "common/cli.h"
#include "common/device_memory.h"
#include "common/eval.h"
#include "common/metrics.h"
#include "common/ops.h"
#include "common/plot.h"
#include "common/tokenizer.h"

using namespace inferlab;
using namespace inferlab::ch12;
using nlohmann::json;

namespace {

using ll = long long;

struct MemoryOptions {
  ch11::TraceSpec spec;
  std::int64_t max_running = 32, step_tokens = 128, block_size = 16;
  double budget_mib = 4;
  std::vector<std::int64_t> more_block_sizes;  ///< further paged runs, after block_size's
  std::string svg;                             ///< waste against block size
};

struct Served {
  ch11::Report report;
  double waste = 0;  ///< 1 − positions held / positions charged, averaged over the steps
  std::vector<std::vector<std::int32_t>> tokens;
  std::int64_t prefill_tokens = 0;
};

Served serve(const models::Llama& m, const std::vector<ch11::Request>& trace, ch11::KVPool& pool, std::int64_t cap,
             std::int64_t step_tokens) {
  ch11::EngineConfig c;
  c.scheduler = {ch11::Policy::Continuous, cap, step_tokens};
  ch11::Engine e(m, pool, c);
  for (const ch11::Request& r : trace) e.add(r);
  e.run();
  Served s;
  s.report = ch11::report(e);
  const double per_position = static_cast<double>(m.config.kv_cache_bytes(1, 4));
  double charged = 0, held = 0;
  for (const ch11::StepRecord& r : e.steps()) {
    charged += static_cast<double>(r.kv_bytes), held += static_cast<double>(r.kv_positions) * per_position;
    s.prefill_tokens += r.prefill_tokens;
  }
  s.waste = charged > 0 ? 1 - held / charged : 0;
  s.tokens.resize(trace.size());
  for (const auto& q : e.finished()) s.tokens[static_cast<std::size_t>(q->request.id)] = q->tokens;
  return s;
}

// --- figures ------------------------------------------------------------------------------------
// memory()'s rows against block size: the paged runs' waste and sequences per step, the
// contiguous run's as a level line (its waste does not depend on a block size).
void plot_waste(const json& rows, const MemoryOptions& o, std::int64_t budget, const char* pad) {
  plot::Figure waste, batch;
  const std::string setting = std::to_string(o.spec.requests) + " requests, KV budget " +
                              metrics::human_bytes(static_cast<double>(budget)) + ", cap " + std::to_string(o.max_running);
  waste.title = "Wasted KV memory against block size (" + setting + ")";
  batch.title = "Sequences per step against block size (the same runs)";
  waste.x.label = batch.x.label = "block size (positions per block)";
  waste.x.log = batch.x.log = true;
  waste.y.label = "KV memory holding no position (%, mean over steps)";
  batch.y.label = "sequences per step (mean)";
  plot::Series w, b;
  w.label = b.label = "paged";
  w.markers = b.markers = true;
  double contiguous_waste = 0, contiguous_batch = 0, lo = 1e300, hi = 0;
  for (const json& r : rows) {
    if (!r.contains("block_size")) {
      contiguous_waste = 100 * r["waste"].get<double>(), contiguous_batch = r["mean_batch"].get<double>();
      continue;
    }
    const double size = r["block_size"].get<double>();
    w.x.push_back(size), w.y.push_back(100 * r["waste"].get<double>());
    b.x.push_back(size), b.y.push_back(r["mean_batch"].get<double>());
    lo = std::min(lo, size), hi = std::max(hi, size);
  }
  std::vector<std::size_t> order(w.x.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return w.x[x] < w.x[y]; });
  plot::Series ws = w, bs = b;
  for (std::size_t i = 0; i < order.size(); ++i)
    ws.x[i] = bs.x[i] = w.x[order[i]], ws.y[i] = w.y[order[i]], bs.y[i] = b.y[order[i]];
  if (hi <= lo) lo /= 2, hi *= 2;
  plot::Series cw =
      plot::curve("contiguous, each request's maximum length", lo, hi, 2, true, [&](double) { return contiguous_waste; });
  plot::Series cb =
      plot::curve("contiguous, each request's maximum length", lo, hi, 2, true, [&](double) { return contiguous_batch; });
  cw.dashed = cb.dashed = true;
  waste.series = {ws, cw};
  batch.series = {bs, cb};
  waste.y.min = batch.y.min = 0;
  waste.y.max = std::max(contiguous_waste, ws.y.empty() ? 0 : *std::max_element(ws.y.begin(), ws.y.end())) * 1.1 + 1;
  batch.y.max = std::max(contiguous_batch, bs.y.empty() ? 0 : *std::max_element(bs.y.begin(), bs.y.end())) * 1.1 + 1;
  waste.x.min = batch.x.min = lo / 1.4, waste.x.max = batch.x.max = hi * 1.4;  // no empty decade around the runs
  waste.height = batch.height = 420;
  plot::save_svg(std::vector<plot::Figure>{waste, batch}, o.svg);
  std::printf("%s  wrote %s\n", pad, o.svg.c_str());
}

// The block tables of forked samples: a row per sample, a cell per logical block holding its
// physical block, marked shared (still referenced by more than one sample), copied on write (the
// partly filled last prompt block each sample wrote into) or the sample's own.
void plot_block_tables(const std::vector<std::unique_ptr<PagedKVCache>>& caches, std::int64_t prompt,
                       std::int64_t block_size, const std::string& path) {
  plot::Grid g;
  g.title = std::to_string(caches.size()) + " samples forked after a " + std::to_string(prompt) +
            "-token prompt: block tables at the end (blocks of " + std::to_string(block_size) + ")";
  g.x_label = "logical block (position / block size); each cell: the physical block";
  g.y_label = "sample";
  g.kinds = {{"shared: one physical block for every sample", "#9ecae1"},
             {"the partly filled last prompt block, copied on write (one sample keeps the original)", "#ff7f0e"},
             {"the sample's own (its new tokens)", "#a1d99b"}};
  g.cell_width = 36;
  const std::int64_t partial = prompt % block_size ? prompt / block_size : -1;  // the block forks must copy
  for (std::size_t i = 0; i < caches.size(); ++i) {
    const BlockPool& pool = caches[i]->pool();
    std::vector<plot::Cell> row;
    const auto& table = caches[i]->block_table();
    for (std::size_t j = 0; j < table.size(); ++j) {
      const int kind = pool.refs(table[j]) > 1 ? 0 : static_cast<std::int64_t>(j) == partial ? 1 : 2;
      row.push_back({std::to_string(table[j]), kind});
    }
    g.row_labels.push_back("sample " + std::to_string(i + 1));
    g.rows.push_back(row);
  }
  plot::save_svg(g, path);
  std::printf("  wrote %s\n", path.c_str());
}

// --- memory: contiguous max-length allocation against blocks ------------------------------------
json memory(const models::Llama& m, const std::vector<std::int32_t>& text, const MemoryOptions& o, bool indent) {
  const char* pad = indent ? "  " : "";
  const auto trace = ch11::make_trace(o.spec, text);
  const auto budget = static_cast<std::int64_t>(o.budget_mib * (1 << 20));
  ch11::ContiguousPool contiguous(m.config, budget, ch11::Allocation::MaxLength, m.device());
  std::vector<std::int64_t> block_sizes = {o.block_size};
  for (std::int64_t b : o.more_block_sizes)
    if (std::find(block_sizes.begin(), block_sizes.end(), b) == block_sizes.end()) block_sizes.push_back(b);
  std::vector<std::unique_ptr<PagedPool>> paged_pools;
  std::vector<ch11::KVPool*> pools = {&contiguous};
  for (std::int64_t b : block_sizes) {
    paged_pools.push_back(std::make_unique<PagedPool>(m.config, budget, b, m.device()));
    pools.push_back(paged_pools.back().get());
  }
  std::printf("%s%lld requests (outputs log-normal, median %.0f), all at once, cap %lld sequences, KV budget %s:\n", pad,
              static_cast<ll>(o.spec.requests), o.spec.output_median, static_cast<ll>(o.max_running),
              metrics::human_bytes(static_cast<double>(budget)).c_str());
  std::printf("%s  %-44s %10s %9s %8s %8s %9s\n", pad, "KV memory", "sequences", "waste", "preempt", "tok/s", "e2e p50");
  json rows = json::array();
  std::vector<Served> runs;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    runs.push_back(serve(m, trace, *pools[i], o.max_running, o.step_tokens));
    const Served& s = runs.back();
    const std::string name = i > 0 ? "paged, blocks of " + std::to_string(block_sizes[i - 1]) + " positions"
                                   : "contiguous, each request's maximum length";
    std::printf("%s  %-44s %10.2f %8.1f%% %8lld %8.0f %8.2fs\n", pad, name.c_str(), s.report.mean_batch, 100 * s.waste,
                static_cast<ll>(s.report.preemptions), s.report.throughput, s.report.e2e.p50);
    if (m.device() == Device::CUDA)  // one attention launch a layer for the whole batch, paged or not
      std::printf("%s    GPU: %s\n", pad, ch11::launches_line(s.report, m.config.num_layers).c_str());
    json j = ch11::to_json(s.report);
    j["kv_memory"] = name, j["waste"] = s.waste;
    if (i > 0) j["block_size"] = block_sizes[i - 1];
    rows.push_back(j);
  }
  if (!o.svg.empty()) plot_waste(rows, o, budget, pad);
  const bool same = runs[0].tokens == runs[1].tokens;
  std::printf(
      "%s  (sequences: per step, on average; waste: the share of the charged KV memory holding no position, "
      "averaged over the steps; the paged waste is at most the unused tail of each last block)\n",
      pad);
  std::printf("%s  paged: %.2fx the sequences per step and %.2fx the throughput; every request's tokens %s\n", pad,
              runs[1].report.mean_batch / runs[0].report.mean_batch, runs[1].report.throughput / runs[0].report.throughput,
              same ? "identical on both caches"
                   : "not all identical on both caches (a near-tie between two tokens, within the two paths' "
                     "rounding: the tests bound the logits)");
  return {{"rows", rows}, {"identical_outputs", same}};
}

// --- sharing: parallel samples and a shared system prompt --------------------------------------
json sharing(const models::Llama& m, const std::vector<std::int32_t>& text, std::int64_t n, std::int64_t block_size,
             bool indent, const std::string& svg) {
  const char* pad = indent ? "  " : "";
  json out;
  {  // n samples of one prompt: prefill once, fork n − 1 times, decode each with its own seed
    const std::vector<std::int32_t> prompt(text.begin(), text.begin() + 200);
    const int new_tokens = 64;
    BlockPool pool(m.config, 4096, block_size, m.device());
    std::vector<std::unique_ptr<PagedKVCache>> caches;
    caches.push_back(std::make_unique<PagedKVCache>(pool));
    IL_CHECK(caches[0]->reserve(static_cast<std::int64_t>(prompt.size())), "sharing: the pool is too small");
    const Tensor first = models::forward_cached(m, *caches[0], prompt).to(Device::CPU);
    for (std::int64_t i = 1; i < n; ++i) caches.push_back(caches[0]->fork());
    const std::int64_t after_fork = pool.used();
    std::vector<Sampler> samplers;
    std::vector<std::int32_t> last;
    for (std::int64_t i = 0; i < n; ++i) {
      SamplingParams p;
      p.temperature = 0.8f, p.seed = static_cast<std::uint64_t>(i + 1);
      samplers.emplace_back(p);
      last.push_back(samplers.back().sample(first));
    }
    for (int t = 1; t < new_tokens; ++t) {
      std::vector<models::SequenceStep> steps;
      for (std::int64_t i = 0; i < n; ++i) {
        IL_CHECK(caches[static_cast<std::size_t>(i)]->reserve(1), "sharing: the pool is too small");
        steps.push_back({{last[static_cast<std::size_t>(i)]}, caches[static_cast<std::size_t>(i)].get(), false});
      }
      const Tensor logits = models::forward(m, steps).to(Device::CPU);
      for (std::int64_t i = 0; i < n; ++i)
        last[static_cast<std::size_t>(i)] = samplers[static_cast<std::size_t>(i)].sample(logits.slice(0, i, i + 1));
    }
    const std::int64_t per_seq = (static_cast<std::int64_t>(prompt.size()) + new_tokens - 1 + block_size - 1) / block_size;
    std::printf("%s%lld samples of one %zu-token prompt, %d tokens each (fork after prefill, copy-on-write):\n", pad,
                static_cast<ll>(n), prompt.size(), new_tokens);
    std::printf(
        "%s  blocks: %lld after the fork, %lld at the end, against %lld without sharing (%.0f%% saved); "
        "%lld blocks copied (each sample's partly filled last prompt block)\n",
        pad, static_cast<ll>(after_fork), static_cast<ll>(pool.used()), static_cast<ll>(n * per_seq),
        100.0 * (1 - static_cast<double>(pool.used()) / static_cast<double>(n * per_seq)), static_cast<ll>(pool.copies));
    out["parallel_samples"] = {{"n", n},
                               {"prompt", prompt.size()},
                               {"new_tokens", new_tokens},
                               {"blocks_after_fork", after_fork},
                               {"blocks_end", pool.used()},
                               {"blocks_unshared", n * per_seq},
                               {"copies", pool.copies}};
    if (!svg.empty()) plot_block_tables(caches, static_cast<std::int64_t>(prompt.size()), block_size, svg);
  }
  {  // a shared system prompt: 16 requests = the same 256 tokens + their own question
    const std::vector<std::int32_t> system(text.begin() + 1000, text.begin() + 1256);
    std::vector<ch11::Request> trace;
    for (int i = 0; i < 16; ++i) {
      ch11::Request r;
      r.id = i;
      r.prompt = system;
      r.prompt.insert(r.prompt.end(), text.begin() + 2000 + i * 40, text.begin() + 2000 + i * 40 + 12 + i % 5);
      r.max_new_tokens = 32;
      r.arrival = i * 0.002;
      trace.push_back(r);
    }
    std::printf("%s16 requests sharing a 256-token system prompt (each adds 12-16 tokens and generates 32):\n", pad);
    json rows = json::array();
    std::vector<Served> runs;
    for (const bool prefix : {false, true}) {
      PagedPool pool(m.config, 64 << 20, block_size, m.device(), prefix);
      runs.push_back(serve(m, trace, pool, 16, 512));
      const Served& s = runs.back();
      std::printf("%s  %-22s peak KV %9s, %5lld prefill tokens computed, TTFT p50 %6.1f ms, %lld cached blocks reused\n",
                  pad, prefix ? "with prefix caching" : "without", metrics::human_bytes(s.report.peak_kv_bytes).c_str(),
                  static_cast<ll>(s.prefill_tokens), s.report.ttft.p50 * 1e3, static_cast<ll>(pool.blocks().hits));
      rows.push_back({{"prefix_caching", prefix},
                      {"peak_kv_bytes", s.report.peak_kv_bytes},
                      {"prefill_tokens", s.prefill_tokens},
                      {"ttft", ch11::to_json(s.report.ttft)},
                      {"hits", pool.blocks().hits}});
    }
    std::printf("%s  outputs %s\n", pad, runs[0].tokens == runs[1].tokens ? "identical" : "differ (see the tests' bound)");
    out["system_prompt"] = rows;
  }
  return out;
}

// --- kinds: one budget, every kind of layer ----------------------------------------------------
struct KindsOptions {
  std::vector<std::string> models;
  ch11::TraceSpec spec;
  std::int64_t max_running = 32, step_tokens = 128, block_size = 16, length = 256;
  double budget_mib = 4;
};

// Chapter 11's trace on each model through the hybrid pool (hybrid_cache.h), under one budget:
// what a sequence of `length` positions keeps, how many such sequences the budget holds, and what
// the engine then ran: sequences per step, preemptions, tokens per second and GB/s against the
// read ceiling of the steps' kind. The first model is the one the others are compared with.
json kinds(const KindsOptions& o, const metrics::Ceiling& roof, bool indent) {
  const char* pad = indent ? "  " : "";
  const auto budget = static_cast<std::int64_t>(o.budget_mib * (1 << 20));
  std::printf(
      "%sOne KV budget of %s for every kind of layer: %lld requests all at once (outputs log-normal, median %.0f),\n"
      "%scap %lld sequences, blocks of %lld positions, a slot per running sequence where a layer keeps one\n",
      pad, metrics::human_bytes(static_cast<double>(budget)).c_str(), static_cast<ll>(o.spec.requests), o.spec.output_median,
      pad, static_cast<ll>(o.max_running), static_cast<ll>(o.block_size));
  std::printf("%s  %-12s %-36s %12s %9s %9s %6s %8s %23s\n", pad, "model", "layers",
              ("KV at " + std::to_string(o.length)).c_str(), "fit", "batch", "preem", "tok/s", "GB/s (of its ceiling)");
  json rows = json::array();
  metrics::CeilingLegend legend;
  struct Row {
    std::string name;
    double bytes = 0, fit = 0, batch = 0, tps = 0;
    bool gathers = false;  // some layer gathers its rows out of the blocks each step (hybrid_cache.h)
  };
  std::vector<Row> seen;
  for (const std::string& path : o.models) {
    const auto m = models::load_model(path);
    const auto tok = models::load_model_tokenizer(*m);
    const auto text = eval::tokenize_documents(*tok, data_dir() + "/corpus/val.txt");
    ch11::TraceSpec spec = o.spec;
    spec.context = std::min<std::int64_t>(spec.context, m->context().value_or(spec.context));
    spec.sampling.vocab = std::min<std::int64_t>(tok->vocab_size(), m->vocab_size());
    const auto trace = ch11::make_trace(spec, text);
    const PagedLayout layout = PagedLayout::of(*m);
    // Slots where some layer keeps one: as many as sequences of `length` positions fit beside their
    // blocks, at most the cap (a model of slots alone gets what the budget holds).
    const std::int64_t per_length = (o.length + o.block_size - 1) / o.block_size * layout.block_bytes(o.block_size);
    const std::int64_t slots =
        layout.blocks.empty()
            ? 0
            : std::max<std::int64_t>(1, std::min(o.max_running, budget / (layout.slot_bytes + per_length)));
    PagedPool pool(*m, budget, o.block_size, false, slots);
    ch11::EngineConfig c;
    c.scheduler = {ch11::Policy::Continuous, o.max_running, o.step_tokens};
    ch11::Engine e(*m, pool, c);
    for (const ch11::Request& r : trace) e.add(r);
    e.run();
    const ch11::Report r = ch11::report(e);
    const double per_seq = static_cast<double>(pool.bytes_for(o.length));
    // Sequences of `length` positions the budget holds: the blocks left beside the slots, or the slots.
    double fit = layout.blocks.empty() ? static_cast<double>(pool.slots_total())
                                       : static_cast<double>(pool.blocks_total()) /
                                             static_cast<double>((o.length + o.block_size - 1) / o.block_size);
    if (layout.fixed && !layout.blocks.empty()) fit = std::min(fit, static_cast<double>(pool.slots_total()));
    const double gbs = r.busy > 0 ? r.bytes_read / r.busy : 0;
    const metrics::ReadCeiling read =
        metrics::read_ceiling_for(roof, r.steps > 0 ? r.bytes_read / static_cast<double>(r.steps) : 0);
    const std::string name = std::filesystem::path(path).filename().string();
    std::string layers = m->describe_layers();
    if (layers.size() > 36) layers = layers.substr(0, 35) + "…";
    std::printf("%s  %-12s %-36s %12s %9.0f %9.2f %6lld %8.0f %6.2f (%3.0f%% %-5s)\n", pad, name.c_str(), layers.c_str(),
                metrics::human_bytes(per_seq).c_str(), fit, r.mean_batch, static_cast<ll>(r.preemptions), r.throughput,
                gbs / 1e9, legend.percent(name, gbs, read), read.abbrev());
    std::fflush(stdout);
    json j = ch11::to_json(r);
    j["model"] = name, j["layers"] = m->describe_layers(), j["pool"] = pool.describe();
    j["kv_bytes_per_sequence"] = per_seq, j["sequences_that_fit"] = fit, j["length"] = o.length;
    j["achieved_bytes_per_s"] = gbs, j["read_ceiling"] = metrics::to_json(read);
    rows.push_back(j);
    seen.push_back({name, per_seq, fit, r.mean_batch, r.throughput, !layout.plain && !layout.blocks.empty()});
  }
  legend.print(pad);
  // What this run shows, against the lecture's argument (smaller caches: more sequences in the same
  // memory, and in a memory-bound decode more tokens per second).
  const Row& base = seen.front();
  for (std::size_t i = 1; i < seen.size(); ++i) {
    const Row& x = seen[i];
    const double bytes = x.bytes / base.bytes, batch = x.batch / base.batch, tps = x.tps / base.tps;
    std::printf(
        "%s  %s against %s: %.2fx the KV bytes of a %lld-position sequence, %.2fx the sequences per step, "
        "%.2fx the tokens per second%s\n",
        pad, x.name.c_str(), base.name.c_str(), bytes, static_cast<ll>(o.length), batch, tps,
        batch > 1.05 && tps < 1
            ? (x.gathers ? " (more sequences ran, but each step cost more: its layers copy their rows out of "
                           "the blocks for the attention op every step, and at this size the cache reads are "
                           "not what sets the pace, the GB/s column says how far from the read ceiling)"
                         : " (more sequences ran, but each step cost more than the bytes it saved: at this "
                           "size the cache reads are not what sets the pace, the GB/s column says how far "
                           "from the read ceiling)")
        : batch <= 1.05 && bytes < 0.95 ? " (the cap or the trace, not the memory, set the batch: the "
                                          "smaller cache had nothing more to admit)"
                                        : "");
  }
  return {{"rows", rows}, {"budget_bytes", budget}};
}

// --- speed: the paged op against the contiguous one --------------------------------------------
json speed(std::int64_t context, std::int64_t block_size, Device d, const metrics::Ceiling& roof, bool indent) {
  const char* pad = indent ? "  " : "";
  const std::int64_t N = 8, K = 8, H = 128, blocks = (context + block_size - 1) / block_size;
  std::mt19937_64 g(5);
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  for (std::int64_t i = 0; i < blocks; ++i) table[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(table.begin(), table.end(), g);  // scattered blocks, as a busy pool leaves them
  auto random = [&](const Shape& s) {
    std::vector<float> v(static_cast<std::size_t>(shape_numel(s)));
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& x : v) x = u(g);
    return Tensor::from_vector(v, s).to(d);
  };
  const Tensor kp = random({blocks, block_size, K, H}), vp = random({blocks, block_size, K, H});
  const Tensor kc = random({context, K, H}), vc = random({context, K, H}), q = random({1, N, H});
  Tensor out = Tensor::empty({1, N, H}, DType::F32, d);
  const PagedKV kv{kp, vp, table, block_size};
  auto best = [&](auto&& f) {
    f();
    if (d == Device::CUDA) cuda::synchronize();
    double b = 1e30;
    for (int i = 0; i < 7; ++i) {
      metrics::Timer t = metrics::Timer::work(d == Device::CPU);
      f();
      if (d == Device::CUDA) cuda::synchronize();
      b = std::min(b, t.seconds());
    }
    return b;
  };
  AttentionParams p;
  p.q_offset = context - 1;
  const double contiguous = best([&] { ops::attention(q, kc, vc, out, p); });
  const double bytes = 2.0 * static_cast<double>(context * K * H) * 4;
  std::printf("%sone decode row, %lld heads of %lld, %lld positions (%s of K and V), blocks of %lld in random order:\n", pad,
              static_cast<ll>(N), static_cast<ll>(H), static_cast<ll>(context), metrics::human_bytes(bytes).c_str(),
              static_cast<ll>(block_size));
  // Against a streaming read over as many bytes: K and V of this size stay in a large last-level
  // cache between the timed runs, so their ceiling is the cache's.
  const metrics::ReadCeiling read = metrics::read_ceiling_for(roof, bytes);
  std::printf("%s  %-28s %10s %12s (of the ceiling %s, below)\n", pad, "attention", "time", "GB/s", read.kind.c_str());
  metrics::CeilingLegend legend;
  auto show = [&](const std::string& name, double t) {
    std::printf("%s  %-28s %8.3fms %12.2f (%.0f%%)", pad, name.c_str(), t * 1e3, bytes / t / 1e9,
                legend.percent(name, bytes / t, read));
  };
  show("contiguous (ops::attention)", contiguous);
  std::printf("\n");
  json rows = json::array({{{"kind", "contiguous"}, {"seconds", contiguous}}});
  // The same paged kernel over blocks in order (the pool's rows are then one contiguous cache)
  // and over the shuffled table: the difference is what paging itself costs.
  std::vector<std::int32_t> in_order(table.size());
  for (std::size_t i = 0; i < in_order.size(); ++i) in_order[i] = static_cast<std::int32_t>(i);
  const PagedKV ordered{kp, vp, in_order, block_size};
  for (const std::int64_t splits : {1, 8}) {
    const double t0 = best([&] { paged_attention(q, ordered, context - 1, out, splits); });
    const double t1 = best([&] { paged_attention(q, kv, context - 1, out, splits); });
    for (const bool scattered : {false, true}) {
      const double t = scattered ? t1 : t0;
      char name[64];
      std::snprintf(name, sizeof name, "paged, %s, %lld split%s", scattered ? "scattered" : "in order",
                    static_cast<ll>(splits), splits > 1 ? "s" : "");
      show(name, t);
      if (scattered) std::printf("  %.3fx the time in order", t1 / t0);
      std::printf("\n");
      rows.push_back({{"kind", scattered ? "paged_scattered" : "paged_in_order"}, {"splits", splits}, {"seconds", t}});
    }
  }
  legend.print((std::string(pad) + "  ").c_str());
  return {{"context", context}, {"bytes", bytes}, {"read_ceiling", metrics::to_json(read)}, {"rows", rows}};
}

}  // namespace

int main(int argc, char** argv) {
  wait_passively(argv);  // timings that hold on a busy machine (common/cli.h)
  CLI::App app{"Chapter 12: PagedAttention", "ch12_paged_attention"};
  std::string json_path;
  add_json_option(app, json_path);
  help_footer(app,
              "chapter 11's trace on tiny-mha under a 4 MiB KV budget with contiguous max-length caches and "
              "with paged ones: sequences per step, wasted KV memory, throughput, identical outputs; 8 parallel "
              "samples by fork and copy-on-write; a shared system prompt with prefix caching; paged against "
              "contiguous attention at 16K positions beside the read ceiling",
              "chapters/12_paged_attention/README.md", "PagedAttention 与 vLLM");
  std::string model = bundled_model("tiny-mha");
  ModelOptions dev;
  MemoryOptions mo;
  mo.spec.sampling.temperature = 0.8f;
  std::int64_t samples = 8, context = 16384;
  auto* sm = app.add_subcommand("memory", "Chapter 11's trace with contiguous max-length caches and with paged ones");
  sm->add_option("--model", model, "The model folder")->capture_default_str();
  add_device_option(*sm, dev);
  sm->add_option("--requests", mo.spec.requests, "Requests in the trace")->check(number_in(1, 1e6))->capture_default_str();
  sm->add_option("--output-median", mo.spec.output_median, "Median output length")
      ->check(number_in(1, 1e6))
      ->capture_default_str();
  sm->add_option("--max-running", mo.max_running, "Sequences per step at most")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  sm->add_option("--step-tokens", mo.step_tokens, "Tokens per step at most")
      ->check(number_in(1, 1 << 20))
      ->capture_default_str();
  sm->add_option("--block-size", mo.block_size, "Positions per block")->check(number_in(1, 4096))->capture_default_str();
  sm->add_option("--budget-mib", mo.budget_mib, "The KV budget, MiB")
      ->check(number_in(0.01, 1 << 20))
      ->capture_default_str();
  sm->add_option("--more-block-sizes", mo.more_block_sizes, "Further paged runs at these block sizes")
      ->delimiter(',')
      ->check(number_in(1, 4096));
  sm->add_option("--svg", mo.svg, "Also plot the waste and sequences per step against block size as SVG")
      ->check(output_file());
  add_json_option(*sm, json_path);
  std::string sharing_svg;
  auto* sh = app.add_subcommand("sharing", "Parallel samples by fork and copy-on-write; a shared system prompt");
  sh->add_option("--model", model, "The model folder")->capture_default_str();
  sh->add_option("--samples", samples, "Parallel samples of one prompt")->check(number_in(1, 256))->capture_default_str();
  sh->add_option("--block-size", mo.block_size, "Positions per block")->check(number_in(1, 4096))->capture_default_str();
  sh->add_option("--svg", sharing_svg, "Also draw the forked samples' block tables as SVG")->check(output_file());
  add_json_option(*sh, json_path);
  auto* sp = app.add_subcommand("speed", "Paged against contiguous attention for one decode row");
  sp->add_option("--context", context, "Positions")->check(number_in(1, 1 << 24))->capture_default_str();
  sp->add_option("--block-size", mo.block_size, "Positions per block")->check(number_in(1, 4096))->capture_default_str();
  add_device_option(*sp, dev);
  add_json_option(*sp, json_path);
  KindsOptions ko;
  for (const char* z : {"tiny-mha", "tiny-mla", "tiny-cla", "tiny-hybrid", "tiny-swa", "tiny-mamba"})
    ko.models.push_back(bundled_model(z));
  ko.spec.output_median = 96;
  auto* sk = app.add_subcommand("kinds", "One KV budget for every kind of layer: what a sequence keeps, how many run");
  sk->add_option("--models", ko.models, "Model files or folders, the first the one compared with")->delimiter(',');
  sk->add_option("--requests", ko.spec.requests, "Requests in the trace")->check(number_in(1, 1e6))->capture_default_str();
  sk->add_option("--output-median", ko.spec.output_median, "Median output length")
      ->check(number_in(1, 1e6))
      ->capture_default_str();
  sk->add_option("--max-running", ko.max_running, "Sequences per step at most")
      ->check(number_in(1, 4096))
      ->capture_default_str();
  sk->add_option("--budget-mib", ko.budget_mib, "The KV budget, MiB")
      ->check(number_in(0.01, 1 << 20))
      ->capture_default_str();
  sk->add_option("--block-size", ko.block_size, "Positions per block")->check(number_in(1, 4096))->capture_default_str();
  sk->add_option("--length", ko.length, "The sequence length whose KV bytes are compared")
      ->check(number_in(1, 1 << 24))
      ->capture_default_str();
  add_json_option(*sk, json_path);
  app.require_subcommand(0, 1);
  bare_run_options_only(app);
  return run_cli(app, argc, argv, [&] {
    const Device d = dev.resolved_device();
    const bool bare = !*sm && !*sh && !*sp && !*sk;
    json out;
    if (bare)
      std::printf("PagedAttention (lecture: PagedAttention 与 vLLM): the KV cache in blocks of %lld positions\n\n",
                  static_cast<ll>(mo.block_size));
    if (bare || *sm || *sh) {
      models::Llama m = models::load_llama(model).to(d, DType::F32);
      const auto tok = Tokenizer::for_model(model);
      const auto text = eval::tokenize_documents(*tok, data_dir() + "/corpus/val.txt");
      mo.spec.context = m.config.max_position_embeddings;
      mo.spec.sampling.vocab = tok->vocab_size();
      if (bare || *sm) out["memory"] = memory(m, text, mo, bare);
      if (bare) std::printf("\n");
      if (bare || *sh) out["sharing"] = sharing(m, text, samples, mo.block_size, bare, sharing_svg);
      if (bare) std::printf("\n");
    }
    if (bare || *sp) {
      const metrics::Ceiling roof = metrics::measure_ceiling(d);
      out["speed"] = speed(context, mo.block_size, d, roof, bare);
      out["ceiling"] = metrics::to_json(roof);
    }
    if (*sk) {
      const metrics::Ceiling roof = metrics::measure_ceiling(Device::CPU);
      out["kinds"] = kinds(ko, roof, false);
      out["ceiling"] = metrics::to_json(roof);
    }
    if (bare) std::printf("  more: ch12_paged_attention memory | sharing | speed | kinds (--help for each)\n");
    if (!json_path.empty()) write_json(json_path, out, {model});
    return 0;
  });
}
