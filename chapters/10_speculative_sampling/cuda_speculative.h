#pragma once
/// @file cuda_speculative.h
/// @brief Chapter 10's round on the GPU: the sampling distributions, the draws and the
/// accept/reject walk as CUDA kernels, so that a round moves a few integers to the host instead
/// of γ + 1 rows of V probabilities.
///
/// Each function is its host twin's arithmetic (Sampler::probabilities, Sampler::draw, verify)
/// in double precision, with sums taken in a different order: results agree to rounding, and a
/// draw lands on a different token only when its uniform number falls within rounding of a
/// boundary between two tokens. The uniform numbers come from the host's Sampler, so one seed
/// drives both paths through the same stream (tests/ch10/test_cuda_speculative.cpp).

#include <cstdint>
#include <vector>

#include "chapters/10_speculative_sampling/speculative.h"

namespace inferlab::ch10::cuda {

/// Sampler::probabilities(logits row t) under `params` for every row t of `logits` (CUDA, F32,
/// [T, V]): a CUDA F64 tensor [T, V].
Tensor distributions(const Tensor& logits, const SamplingParams& params);

/// Sampler::draw over row `row` of `weights` (CUDA, F64, [T, V]; non-negative, not necessarily
/// normalised) with the uniform number `u` it would have drawn.
std::int32_t draw(const Tensor& weights, std::int64_t row, double u);

/// verify() on the device: drafts d₁ … d_γ, their draft distributions p [γ, V] and the target's
/// q [γ + 1, V] (CUDA, F64), and the γ + 1 uniform numbers the host walk could consume. `used` is
/// how many of them it did consume (accepted + 2 at a rejection, γ + 1 when all are accepted);
/// `alpha_sum` is Σᵢ acceptance(pᵢ, qᵢ) over the γ drafted positions.
struct DeviceVerdict {
  Verdict verdict;
  int used = 0;
  double alpha_sum = 0;
};
DeviceVerdict verify(const std::vector<std::int32_t>& drafts, const Tensor& p, const Tensor& q,
                     const std::vector<double>& u);

}  // namespace inferlab::ch10::cuda
