// Work counting, the roofline arithmetic, the ceiling measurements' sanity, and the order of the
// quality tables' probe columns.
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "common/ceiling.h"
#include "common/cli.h"
#include "common/eval.h"
#include "common/metrics.h"
#include "test_util.h"

namespace inferlab {
namespace {

TEST(Metrics, RooflineArithmetic) {
  metrics::Ceiling c{"test", 100e9, 1e12, "f32", "made up"};
  EXPECT_DOUBLE_EQ(c.ridge(), 10.0);
  // A decode-like point: 1 FLOP per byte, 50 GB/s achieved: half the memory roof.
  auto p = metrics::roofline("decode", {100e9, 100e9}, 2.0, c);
  EXPECT_DOUBLE_EQ(p.intensity(), 1.0);
  EXPECT_DOUBLE_EQ(p.achieved_bytes_per_s(), 50e9);
  EXPECT_DOUBLE_EQ(p.attainable_flops_per_s(), 100e9);
  EXPECT_DOUBLE_EQ(p.fraction_of_roof(), 0.5);
  EXPECT_EQ(p.bound(), "memory");
  // A prefill-like point past the ridge is bounded by the FLOP roof.
  auto q = metrics::roofline("prefill", {4e12, 1e11}, 8.0, c);
  EXPECT_EQ(q.bound(), "compute");
  EXPECT_DOUBLE_EQ(q.attainable_flops_per_s(), 1e12);
  EXPECT_DOUBLE_EQ(q.fraction_of_roof(), 0.5);
  const auto j = metrics::to_json(p);
  EXPECT_EQ(j["bound"], "memory");
  EXPECT_DOUBLE_EQ(j["ceiling"]["ridge_flops_per_byte"].get<double>(), 10.0);
  EXPECT_NE(metrics::describe(p).find("50% of 100 GB/s"), std::string::npos) << metrics::describe(p);
}

TEST(EvalTables, ProbeColumnsReadByDistanceThenPairs) {
  std::map<std::string, double> scores;
  for (const char* k : {"ar_16", "recall_400", "ar_4", "recall_32", "recall_128", "ar_64", "recall_48"}) scores[k] = 0.5;
  const std::vector<std::string> want = {"recall_32", "recall_48", "recall_128", "recall_400", "ar_4", "ar_16", "ar_64"};
  EXPECT_EQ(eval::kinds_in_reading_order(scores), want);
  // a kind without a number (or one too long to be a count) follows its family's numbered ones,
  // an unknown family comes last, and nothing throws
  const std::map<std::string, double> odd = {
      {"recall_x", 0}, {"recall_123456789012345678901234567890", 0}, {"recall_400", 0}, {"zz_1", 0}, {"ar_8", 0}};
  const std::vector<std::string> odd_want = {"recall_400", "recall_123456789012345678901234567890", "recall_x", "ar_8",
                                             "zz_1"};
  EXPECT_EQ(eval::kinds_in_reading_order(odd), odd_want);
}

TEST(Metrics, HumanUnits) {
  EXPECT_EQ(metrics::human_rate(3.35e12, "B"), "3.35 TB/s");
  EXPECT_EQ(metrics::human_rate(512e6, "B"), "512 MB/s");
  EXPECT_EQ(metrics::human_bytes(671088640), "640 MiB");
  EXPECT_EQ(metrics::human_bytes(1 << 30), "1 GiB");
  EXPECT_EQ(metrics::human_bytes(100), "100 B");
}

TEST(Metrics, CountScopesNestAndStop) {
  metrics::CountScope a;
  metrics::count("a", 1, 2);
  {
    metrics::CountScope b;
    metrics::count("b", 10, 20);
    EXPECT_EQ(b.work().flops, 10);
    EXPECT_EQ(a.work().flops, 1);  // not yet: b adds itself when it ends
  }
  EXPECT_EQ(a.work().flops, 11);
  EXPECT_EQ(a.work().bytes, 22);
  EXPECT_EQ(a.by_op().at("a").flops, 1);
  EXPECT_EQ(a.by_op().at("b").bytes, 20);
}

// On one thread, Clock::Work counts the thread's time on the CPU: a wait (as when other work has
// the core) is not the work's time; the wall clock counts it. On more threads both are the wall.
TEST(Metrics, TheWorkClockCountsCpuTimeOnOneThreadAndTheWallOtherwise) {
  const int threads = omp_get_max_threads();
  auto waited = [](metrics::Clock clock) {
    metrics::Timer t(clock);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    return std::pair{t.seconds(), t.counts_cpu_time()};
  };
  omp_set_num_threads(1);
  const auto [work, cpu] = waited(metrics::Clock::Work);
  const auto [wall, wall_cpu] = waited(metrics::Clock::Wall);
  EXPECT_TRUE(cpu);
  EXPECT_FALSE(wall_cpu);
  EXPECT_LT(work, 0.02);  // a sleeping thread runs for microseconds
  EXPECT_GE(wall, 0.06);
  EXPECT_FALSE(metrics::Timer::work(false).counts_cpu_time()) << "work on a GPU is timed on the wall";
  // Work that runs counts as CPU time too: a busy loop of ~30 ms is ~30 ms of either clock.
  metrics::Timer busy(metrics::Clock::Work), busy_wall;
  volatile double x = 0;
  while (busy_wall.seconds() < 0.03) x = x + 1;
  EXPECT_GT(busy.seconds(), 0.001);  // at least some of it ran, however busy the machine
  EXPECT_LE(busy.seconds(), busy_wall.seconds() + 0.002);
  omp_set_num_threads(2);
  EXPECT_FALSE(metrics::Timer(metrics::Clock::Work).counts_cpu_time());
  omp_set_num_threads(threads);
}

TEST(Metrics, CpuCeilingsAreMeasured) {
  // No speed threshold here (speeds belong in benchmarks; a loaded or sanitizer build may be
  // slow): a measurement must be a positive, finite rate, and DRAM reads cannot exceed
  // 10 TB/s on any CPU, so a larger figure would mean the loop was optimised away.
  const double bw = metrics::measure_cpu_read_bandwidth(std::size_t(64) << 20, 0, 2);
  EXPECT_GT(bw, 0);
  EXPECT_LT(bw, 1e13);
  const double fl = metrics::measure_cpu_matmul_flops(128, 1);
  EXPECT_GT(fl, 0);
  EXPECT_TRUE(std::isfinite(fl));
}

TEST(Metrics, SpreadIsBestMedianWorst) {
  const auto s = metrics::spread_of({3, 1, 4, 1, 5});
  EXPECT_EQ(s.best, 5);
  EXPECT_EQ(s.median, 3);
  EXPECT_EQ(s.worst, 1);
  EXPECT_EQ(s.runs, 5);
  EXPECT_EQ(metrics::spread_of({2, 4}).median, 3);
  EXPECT_EQ(metrics::spread_of({}).runs, 0);
  EXPECT_EQ(metrics::describe(metrics::spread_of({17.3e9, 16e9, 12.1e9}), "B"),
            "17.3 GB/s (best of 3; median 16, worst 12.1)");
}

TEST(Metrics, WorkingSetsAreSortedByTheLastLevelCache) {
  const double llc = metrics::last_level_cache_bytes();
  ASSERT_GT(llc, 0);
  EXPECT_EQ(metrics::cache_kind(0.25 * llc), "in cache");
  EXPECT_EQ(metrics::cache_kind(llc), "partly in cache");
  EXPECT_EQ(metrics::cache_kind(3 * llc), "from memory");
  EXPECT_GE(metrics::memory_ceiling_bytes(), std::size_t(256) << 20);
}

TEST(Metrics, AFigureIsComparedWithACeilingOfItsOwnKind) {
  // A GPU's (or a datasheet's) ceiling is its memory bandwidth, whatever the working set.
  metrics::Ceiling gpu{"gpu", 1e12, 1e14, "bf16", "made up"};
  const auto g = metrics::read_ceiling_for(gpu, 1e6);
  EXPECT_EQ(g.bytes_per_s(), 1e12);
  EXPECT_EQ(g.kind, "from memory");
  // On this CPU, a working set in cache is measured over as many bytes (within 10%), in cache.
  const double small = std::min(1048576.0, metrics::last_level_cache_bytes() / 4);
  const auto c = metrics::cpu_read_ceiling(small);
  EXPECT_EQ(c.kind, "in cache");
  EXPECT_NEAR(c.measured_bytes / std::max(small, 262144.0), 1.0, 0.1);
  EXPECT_GT(c.bytes_per_s(), 0);
  EXPECT_LT(c.bytes_per_s(), 1e14);
  EXPECT_EQ(c.rate.runs, 5);
  EXPECT_LE(c.rate.worst, c.rate.median);
  EXPECT_LE(c.rate.median, c.rate.best);
  // Measured once per size: the same size again is the same measurement.
  EXPECT_EQ(metrics::cpu_read_ceiling(small).bytes_per_s(), c.bytes_per_s());
}

// A ceiling taken in turns with a figure's runs: one pass per run over as many bytes as the figure
// reads (whole 64-byte rows of 16 floats); in cache where the figure's data and the array fit in
// the last-level cache together.
TEST(Metrics, ACeilingTakenInTurnsHasOnePassPerRun) {
  const double small = std::min(1048576.0, metrics::last_level_cache_bytes() / 4) + 100;
  metrics::ReadPasses passes(small);
  for (int i = 0; i < 3; ++i) passes.run();
  const metrics::ReadCeiling c = passes.ceiling();
  EXPECT_EQ(c.rate.runs, 3);
  EXPECT_EQ(c.kind, "in cache");
  EXPECT_EQ(c.working_set_bytes, small);
  EXPECT_EQ(c.measured_bytes, std::floor(small / 64) * 64);
  EXPECT_GT(c.rate.worst, 0);
  EXPECT_LE(c.rate.worst, c.rate.best);
  EXPECT_LT(c.bytes_per_s(), 1e14);
}

// A working set far beyond the cache (a terabyte of weights) is read from memory by passes over
// memory_ceiling_bytes(), not over an array of its own size.
TEST(Metrics, ACeilingInTurnsForAHugeWorkingSetReadsAnArrayOfTheMemoryCeilingsSize) {
  const double huge = 1e12;
  const metrics::ReadCeiling c = metrics::ReadPasses(huge).ceiling();
  EXPECT_EQ(c.working_set_bytes, huge);
  EXPECT_EQ(c.measured_bytes, std::floor(static_cast<double>(metrics::memory_ceiling_bytes()) / 64) * 64);
  EXPECT_EQ(c.kind, "from memory");
}

TEST(Metrics, StepsAgainstSumsInTurnsCompareLikeWithLike) {
  metrics::ReadCeiling c;
  c.rate = metrics::spread_of({40e9, 36e9, 20e9});  // median 36, best 40
  c.kind = "from memory";
  const metrics::Spread steps = metrics::spread_of({30e9, 27e9, 9e9, 28e9});  // median 27.5, best 30
  EXPECT_EQ(metrics::against_in_turns(steps, c),
            "27.5 GB/s median of 4 = 76% of the sums' median 36 GB/s (best 30 = 75% of 40), from memory");
}

TEST(Metrics, AFigureAboveItsCeilingSaysWhy) {
  metrics::ReadCeiling c;
  c.rate = metrics::spread_of({100e9, 90e9, 80e9});
  c.kind = "from memory";
  EXPECT_EQ(metrics::above_ceiling_note(100e9, c), "");
  EXPECT_EQ(metrics::against(50e9, c), "50 GB/s = 50% of 100 GB/s from memory (best of 3, worst 80)");
  // Above the best run but within the spread of the runs: the machine moved.
  EXPECT_NE(metrics::above_ceiling_note(110e9, c).find("spread"), std::string::npos);
  EXPECT_NE(metrics::against(110e9, c).find("[above:"), std::string::npos);
  // Far above, for a working set partly in cache, and far above anything else.
  EXPECT_NE(metrics::above_ceiling_note(300e9, c).find("fewer bytes than it counts"), std::string::npos);
  c.kind = "partly in cache";
  EXPECT_NE(metrics::above_ceiling_note(300e9, c).find("partly in cache"), std::string::npos);
  EXPECT_DOUBLE_EQ(metrics::percent_of(300e9, c), 300);
}

#ifdef INFERLAB_PASSIVE_PROBE
// Runs the probe with `env` before it and returns what it printed.
std::string run_probe(const std::string& env) {
  const std::string cmd =
      "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " + env + " '" INFERLAB_PASSIVE_PROBE "' one 'two words'";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (!p) return "";
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  EXPECT_EQ(pclose(p), 0);
  return out;
}

TEST(Metrics, ExecutablesLeaveBusyCoresToTheWorkOnThem) {
  // Every core on a quiet machine; a core three quarters busy or more is left to its work; one
  // thread at least; all of them when the load cannot be read.
  EXPECT_EQ(threads_beside(0.0, 2), 2);
  EXPECT_EQ(threads_beside(0.7, 2), 2);
  EXPECT_EQ(threads_beside(0.8, 2), 1);
  EXPECT_EQ(threads_beside(2.0, 2), 1);
  EXPECT_EQ(threads_beside(5.0, 2), 1);
  EXPECT_EQ(threads_beside(3.7, 16), 13);
  EXPECT_EQ(threads_beside(3.8, 16), 12);
  EXPECT_EQ(threads_beside(-1, 8), 8);
  const int cores = usable_cores();
  EXPECT_GE(cores, 1);
  const double busy = busy_cores(0.02);
  EXPECT_GE(busy, 0);  // /proc/stat exists on Linux
  EXPECT_LE(busy, cores + 1e-9);
}

TEST(Metrics, ExecutablesSpinBrieflyThenSleepUnlessTheUserChose) {
  // The program runs again with the short spin set, before OpenMP loads it, and the same arguments.
  EXPECT_EQ(run_probe(""), std::string("policy=(unset) spins=") + kWaitSpins + " one two words\n");
  // A policy the user set is kept, and so is a spin count they chose.
  EXPECT_EQ(run_probe("OMP_WAIT_POLICY=passive"), "policy=passive spins=(unset) one two words\n");
  EXPECT_EQ(run_probe("OMP_WAIT_POLICY=active"), "policy=active spins=(unset) one two words\n");
  EXPECT_EQ(run_probe("GOMP_SPINCOUNT=50"), "policy=(unset) spins=50 one two words\n");
}
#endif

TEST(Metrics, AcceleratorPresetsAreLabelledDatasheetFigures) {
  for (const auto& c : metrics::accelerator_presets()) {
    EXPECT_EQ(c.source, "datasheet");
    EXPECT_GT(c.bytes_per_s, 1e12);
  }
  // The lecture's accelerator intensity for the H100: 989 / 3.35 ≈ 295.
  EXPECT_NEAR(metrics::accelerator_presets()[1].ridge(), 295.2, 0.1);
}

}  // namespace
}  // namespace inferlab
