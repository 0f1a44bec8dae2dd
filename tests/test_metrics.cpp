// Work counting, the roofline arithmetic, the ceiling measurements' sanity, and the order of the
// quality tables' probe columns.
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/ceiling.h"
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
  const std::vector<std::string> odd_want = {"recall_400", "recall_123456789012345678901234567890", "recall_x",
                                             "ar_8", "zz_1"};
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
