#include "common/metrics.h"

#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string_view>

#include <nlohmann/json.hpp>

namespace inferlab::metrics {

namespace {
thread_local CountScope* g_scope = nullptr;
}

void count(const char* op, double flops, double bytes) {
  if (g_scope) {
    g_scope->work_ += Work{flops, bytes};
    g_scope->by_op_[op] += Work{flops, bytes};
  }
}

CountScope::CountScope() : parent_(g_scope) { g_scope = this; }
CountScope::~CountScope() {
  g_scope = parent_;
  if (parent_) {
    parent_->work_ += work_;
    for (const auto& [op, w] : by_op_) parent_->by_op_[op] += w;
  }
}

bool Timer::work_runs_alone() {
  // INFERLAB_CLOCK=wall keeps every timer on the wall clock: for comparisons with programs that
  // time themselves that way (tools/llamacpp_bench.sh).
  static const bool wall = [] {
    const char* c = std::getenv("INFERLAB_CLOCK");
    return c != nullptr && std::string_view(c) == "wall";
  }();
  return !wall && omp_get_max_threads() == 1;
}

double Timer::now() const {
  if (cpu_) {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
      return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

nlohmann::json to_json(const Work& w) { return {{"flops", w.flops}, {"bytes", w.bytes}}; }

}  // namespace inferlab::metrics
