#pragma once
/// @file cuda_diffusion.h
/// @brief Chapter 08 on the GPU: each masked position's x₀ and its confidence, where the logits are.
///
/// The denoiser itself needs nothing new on the GPU: chapter 02's batch step on CUDA tensors is
/// cuBLAS GEMMs over the canvas's rows and the attention kernel without its causal mask. What a
/// sampling step then needs from the [T, V] logits is two numbers per row: the argmax token (the
/// mask token excluded) and its softmax probability. Copying the logits to the host would move
/// T × V × 4 bytes per step (2 MB for 512 positions of a 1024-token vocabulary); this kernel
/// reduces each row on the device, a block per row (max and its index, then Σ exp(l − max)),
/// and 8 bytes per row come back. Choosing the k most confident of at most a block's positions
/// is then a sort of a few dozen numbers on the host.

#include <cstdint>
#include <vector>

#include "common/tensor.h"

namespace inferlab::ch08 {

/// For rows [row0, row1) of logits [T, V] (CUDA, f32, contiguous): the argmax over every token
/// but `exclude` (the lowest index on ties) into tokens, and its probability under the softmax
/// without `exclude` into probs; both host vectors of row1 − row0 entries.
void cuda_argmax_probability(const Tensor& logits, std::int64_t row0, std::int64_t row1, std::int32_t exclude,
                             std::vector<std::int32_t>& tokens, std::vector<double>& probs);

}  // namespace inferlab::ch08
