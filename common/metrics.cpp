#include "common/metrics.h"

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

nlohmann::json to_json(const Work& w) { return {{"flops", w.flops}, {"bytes", w.bytes}}; }

}  // namespace inferlab::metrics
