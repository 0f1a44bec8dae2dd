#include "chapters/00_workload/roofline.h"

#include <cmath>
#include <random>

#include "common/cuda/backend.h"
#include "common/json_file.h"
#include "common/ops.h"

namespace inferlab::ch00 {

std::vector<metrics::RooflinePoint> measure_matmul_points(Device device, const metrics::Ceiling& ceiling, std::int64_t N,
                                                          std::int64_t K) {
  std::mt19937 g(1);
  std::uniform_real_distribution<float> d(-1, 1);
  auto random = [&](Shape s) {
    Tensor t = Tensor::empty(s, DType::F32);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
    return t.to(device);
  };
  std::vector<metrics::RooflinePoint> points;
  const Tensor w = random({N, K});
  for (std::int64_t M : {std::int64_t{1}, std::int64_t{256}}) {
    const Tensor x = random({M, K});
    Tensor out = Tensor::empty({M, N}, DType::F32, device);
    ops::matmul(x, w, out);  // warm-up
    if (device == Device::CUDA) cuda::synchronize();
    metrics::CountScope scope;
    metrics::Timer t = metrics::Timer::work(device == Device::CPU);
    int reps = 0;
    do {
      ops::matmul(x, w, out);
      ++reps;
      if (device == Device::CUDA) cuda::synchronize();
    } while (t.seconds() < 0.3);
    const std::string label = M == 1 ? "decode-like GEMV (M=1)" : "prefill-like GEMM (M=256)";
    // The read roof of one product's kind: its bytes, read `reps` times (in cache when they fit).
    points.push_back(metrics::roofline(label, scope.work(), t.seconds(), ceiling, scope.work().bytes / reps));
  }
  return points;
}

std::vector<metrics::RooflinePoint> load_points(const std::string& path, const metrics::Ceiling& ceiling) {
  const auto j = load_json(path);
  const auto& arr = j.is_array() ? j : j.value("roofline_points", nlohmann::json::array());
  IL_CHECK(arr.is_array() && !arr.empty(), path, ": no roofline points (expected an array or 'roofline_points')");
  std::vector<metrics::RooflinePoint> out;
  for (const auto& p : arr) {
    JsonFields f(p, path + ": roofline point");
    IL_CHECK(f.has("work"), path, ": roofline point: missing field 'work'");
    JsonFields w(p["work"], path + ": roofline point work");
    out.push_back(metrics::roofline(f.get<std::string>("label"), {w.get<double>("flops"), w.get<double>("bytes")},
                                    f.get<double>("seconds"), ceiling));
  }
  return out;
}

plot::Figure roofline_figure(const std::vector<metrics::Ceiling>& ceilings,
                             const std::vector<metrics::RooflinePoint>& points) {
  plot::Figure f;
  f.title = "Roofline (solid: measured here; dashed: datasheet figures)";
  f.x = {"arithmetic intensity (FLOP per byte moved)", true, 0.1, 1e4};
  f.y = {"FLOP/s", true, 0, 0};
  double ymin = 1e300, ymax = 0;
  for (const auto& c : ceilings) {
    plot::Series s;
    s.label = c.name + ", ridge " + std::to_string(static_cast<int>(std::lround(c.ridge())));
    s.dashed = c.source == "datasheet";
    for (double x = 0.1; x <= 1e4 * 1.0001; x *= std::pow(10.0, 0.05)) {
      s.x.push_back(x);
      s.y.push_back(std::min(c.flops_per_s, c.bytes_per_s * x));
    }
    ymin = std::min(ymin, c.bytes_per_s * 0.1), ymax = std::max(ymax, c.flops_per_s);
    f.series.push_back(s);
  }
  if (!points.empty()) {
    plot::Series s;
    s.label = "measured runs (ops::matmul)";
    s.line = false, s.label_points = true, s.color = "#000";
    for (const auto& p : points) {
      s.x.push_back(p.intensity());
      s.y.push_back(p.achieved_flops_per_s());
      s.point_labels.push_back(p.label);
      ymin = std::min(ymin, p.achieved_flops_per_s());
    }
    f.series.push_back(s);
  }
  f.y.min = std::pow(10, std::floor(std::log10(ymin))), f.y.max = std::pow(10, std::ceil(std::log10(ymax * 1.5)));
  return f;
}

}  // namespace inferlab::ch00
