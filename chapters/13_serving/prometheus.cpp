#include "chapters/13_serving/prometheus.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/error.h"

namespace inferlab::ch13 {

namespace {

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os.precision(12);
  os << v;
  return os.str();
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  IL_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()), "histogram: the bucket bounds must be in increasing order");
}

void Histogram::observe(double v) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[static_cast<std::size_t>(at)]++;
  sum_ += v;
  ++count_;
}

std::string Histogram::text(const std::string& name, const std::string& help) const {
  std::ostringstream os;
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  std::int64_t below = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    below += counts_[i];
    os << name << "_bucket{le=\"" << (i < bounds_.size() ? number(bounds_[i]) : "+Inf") << "\"} " << below << "\n";
  }
  os << name << "_sum " << number(sum_) << "\n" << name << "_count " << count_ << "\n";
  return os.str();
}

std::string metric_text(const std::string& name, const std::string& type, const std::string& help, double value) {
  return "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + number(value) + "\n";
}

std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60};
}

}  // namespace inferlab::ch13
