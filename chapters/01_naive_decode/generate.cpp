#include "chapters/01_naive_decode/generate.h"

#include <algorithm>

#include "common/cuda/backend.h"

namespace inferlab::ch01 {

void check_context(const Llama& m, std::size_t prompt_tokens, int max_new) {
  IL_CHECK(prompt_tokens > 0, "the prompt is empty (no tokens to start from)");
  const std::int64_t need = static_cast<std::int64_t>(prompt_tokens) + max_new;
  IL_CHECK(need <= m.config.max_position_embeddings, "the prompt (", prompt_tokens, " tokens) plus ", max_new,
           " new tokens is ", need, " tokens, longer than the model's context of ", m.config.max_position_embeddings,
           " (use a shorter prompt or fewer --max-new-tokens)");
}

Generation generate_naive(const Llama& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                          const std::vector<std::int64_t>& eos_ids, const OnToken& on_token) {
  check_context(m, prompt.size(), max_new);
  Generation g;
  g.tokens = prompt;
  for (int i = 0; i < max_new; ++i) {
    Step s;
    s.tokens_in = static_cast<std::int64_t>(g.tokens.size());
    metrics::Timer timer;
    {
      metrics::CountScope scope;
      const Tensor logits = forward(m, g.tokens);  // the whole sequence, every step
      s.token = sampler.sample(logits);
      s.work = scope.work();
      if (auto it = scope.by_op().find("attention"); it != scope.by_op().end()) s.attention_flops = it->second.flops;
    }
    if (m.device() == Device::CUDA) cuda::synchronize();
    s.seconds = timer.seconds();
    g.steps.push_back(s);
    g.tokens.push_back(s.token);
    g.generated.push_back(s.token);
    if (on_token) on_token(g);
    if (std::find(eos_ids.begin(), eos_ids.end(), s.token) != eos_ids.end()) {
      g.stopped_at_eos = true;
      break;
    }
  }
  return g;
}

}  // namespace inferlab::ch01
