#include "common/decode_bench.h"

#include <nlohmann/json.hpp>

#include "common/cuda/backend.h"
#include "common/lab.h"
#include "common/metrics.h"

namespace inferlab {

double decode_step_bytes(double weight_bytes, const TransformerConfig& c, const std::vector<std::int64_t>& lengths,
                         DType cache_dtype) {
  // EXERCISE 03.3 BEGIN: the bytes one decode step reads
  double bytes = weight_bytes;
  for (std::int64_t len : lengths)
    bytes += static_cast<double>(c.kv_cache_bytes(len + 1, static_cast<std::int64_t>(dtype_size(cache_dtype))));
  return bytes;
  // EXERCISE 03.3 STUB
  // lab::not_done("03.3", "return the bytes one batched decode step reads: the weights once "
  //                       "(weight_bytes), plus each sequence's whole cache after it has kept "
  //                       "its new token (c.kv_cache_bytes)");
  // EXERCISE 03.3 END
}

void fill_random(Tensor& rows, std::uint64_t seed) {
  if (rows.is_cuda()) return cuda::fill_uniform(rows, seed, -1.0f, 1.0f);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  float* p = rows.data<float>();
  for (std::int64_t i = 0; i < rows.numel(); ++i) {  // xorshift: fast, not zeros, not cache-friendly
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) * 0x1p-23f;
  }
}

nlohmann::json to_json(const ThroughputPoint& p, const metrics::ReadCeiling& read, double peak_flops) {
  return {{"batch", p.batch},
          {"tokens_per_s", p.tokens_per_s()},
          {"memory_model_tokens_per_s", p.memory_bound_tokens_per_s(read.bytes_per_s())},
          {"roofline_tokens_per_s", p.roofline_tokens_per_s(read.bytes_per_s(), peak_flops)},
          {"achieved_bytes_per_s", p.achieved_bytes_per_s()},
          {"bytes_per_step", p.bytes_per_step},
          {"flops_per_step", p.flops_per_step},
          {"seconds_per_step", p.seconds_per_step},
          {"read_ceiling", metrics::to_json(read)}};
}

ThroughputPoint time_decode(std::int64_t batch, double bytes_per_step, int steps, Device device,
                            const std::function<void()>& step) {
  ThroughputPoint p;
  p.batch = batch;
  p.bytes_per_step = bytes_per_step;
  {
    metrics::CountScope scope;
    step();  // warm-up, and the step's FLOPs
    p.flops_per_step = scope.work().flops;
  }
  if (device == Device::CUDA) cuda::synchronize();
  double best = 1e300;
  for (int s = 0; s < steps; ++s) {
    metrics::Timer t = metrics::Timer::work(device == Device::CPU);
    step();
    if (device == Device::CUDA) cuda::synchronize();
    best = std::min(best, t.seconds());
  }
  p.seconds_per_step = best;
  return p;
}

}  // namespace inferlab
