#pragma once
/// @file awq.h
/// @brief Chapter 09: activation-aware weight quantisation (AWQ, Lin et al. 2023).
///
/// Not all weights matter equally: an input channel with large activations multiplies its
/// weights' rounding errors. AWQ scales each input channel c of a linear layer up by s_c before
/// quantising (W·diag(s)) and the layer's input down by the same factor (x/s), which leaves
/// the product unchanged in exact arithmetic but gives the salient channels more of the
/// quantisation grid. s = mean|x|^α, with α chosen per layer group on a grid by the output
/// error on calibration data. The 1/s goes into whatever produces the input: the RMSNorm
/// weights before q/k/v and gate/up, the v projection before o (attention is linear in v), and
/// the up projection before down (SwiGLU is linear in up). α = 0 is round-to-nearest itself,
/// so the search can never do worse than RTN on its own objective.

#include <string>
#include <vector>

#include "chapters/01_naive_decode/llama.h"
#include "chapters/09_quantization/quant.h"

namespace inferlab::ch09 {

struct AwqGroup {
  std::string name;     ///< "layer 0 q/k/v", ...
  double alpha = 0;     ///< the chosen exponent
  double loss_rtn = 0;  ///< mean squared output error of round-to-nearest (α = 0)
  double loss_awq = 0;  ///< the same at the chosen α (≤ loss_rtn)
};

/// Returns `m` with AWQ's scales applied (the same function up to float rounding; quantise it
/// with quantize_model afterwards). `calibration` is split into windows of the model's context.
models::Llama awq_scale(const models::Llama& m, const std::vector<std::int32_t>& calibration, const QuantSpec& spec,
                        std::vector<AwqGroup>* report = nullptr, int grid = 20);

}  // namespace inferlab::ch09
