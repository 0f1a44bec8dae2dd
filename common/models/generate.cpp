#include "common/models/generate.h"

#include <algorithm>
#include <string>

#include "common/cuda/backend.h"

namespace inferlab::models {

void check_context(std::int64_t context, std::size_t prompt_tokens, int max_new) {
  IL_CHECK(prompt_tokens > 0, "the prompt is empty (no tokens to start from)");
  const std::int64_t need = static_cast<std::int64_t>(prompt_tokens) + max_new;
  IL_CHECK(need <= context, "the prompt (", prompt_tokens, " tokens) plus ", max_new, " new tokens is ", need,
           " tokens, longer than the model's context of ", context, " (use a shorter prompt or fewer --max-new-tokens)");
}

double Generation::tpot_s() const {
  if (steps.size() < 2) return 0;
  double s = 0;
  for (std::size_t i = 1; i < steps.size(); ++i) s += steps[i].seconds;
  return s / static_cast<double>(steps.size() - 1);
}

Generation generate(const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                    const std::vector<std::int64_t>& eos_ids, Device device, Feed feed, const NextLogits& next_logits,
                    const OnToken& on_token) {
  Generation g;
  g.tokens = prompt;
  std::vector<std::int32_t> input = prompt;  // the first step feeds the prompt either way
  metrics::Timer total = metrics::Timer::work(device == Device::CPU);
  for (int i = 0; i < max_new; ++i) {
    Step s;
    s.tokens_in = static_cast<std::int64_t>(input.size());
    metrics::Timer timer = metrics::Timer::work(device == Device::CPU);
    // Anything that fails in this step (the forward pass, the sampler, the device) says which
    // token it was making and at which position it sits.
    with_context(
        [&] { return "generating token " + std::to_string(i + 1) + " (position " + std::to_string(g.tokens.size()) + ")"; },
        [&] {
      metrics::CountScope scope;
      s.token = sampler.sample(next_logits(input));
      s.work = scope.work();
      if (auto it = scope.by_op().find("attention"); it != scope.by_op().end()) s.attention_flops = it->second.flops;
      if (device == Device::CUDA) cuda::synchronize();
        });
    s.seconds = timer.seconds();
    g.steps.push_back(s);
    g.tokens.push_back(s.token);
    g.generated.push_back(s.token);
    input = feed == Feed::WholeSequence ? g.tokens : std::vector<std::int32_t>{s.token};
    if (on_token) on_token(g);
    if (std::find(eos_ids.begin(), eos_ids.end(), s.token) != eos_ids.end()) {
      g.stopped_at_eos = true;
      break;
    }
  }
  g.total_s = total.seconds();
  return g;
}

}  // namespace inferlab::models
