#include "chapters/01_naive_decode/generate.h"

namespace inferlab::ch01 {

using namespace models;

Generation generate_naive(const Llama& m, const std::vector<std::int32_t>& prompt, int max_new, Sampler& sampler,
                          const std::vector<std::int64_t>& eos_ids, const OnToken& on_token) {
  check_context(m, prompt.size(), max_new);
  return generate(
      prompt, max_new, sampler, eos_ids, m.device(), Feed::WholeSequence,
      [&](const std::vector<std::int32_t>& tokens) { return forward(m, tokens); }, on_token);
}

}  // namespace inferlab::ch01
