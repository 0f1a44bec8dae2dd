#pragma once
// Chapter 09's internals: its block quantisers, beside the core's (common/quant/qmatrix_impl.h).
#include "chapters/09_quantization/quant.h"
#include "common/quant/qmatrix_impl.h"

namespace inferlab::ch09 {

using namespace quant;

/// llama.cpp's reference Q8_0 / Q4_0 block quantisers: 32 floats -> 34 / 18 bytes.
void quantize_q8_0_block(const float* x, std::uint8_t* out);
void quantize_q4_0_block(const float* x, std::uint8_t* out);
/// x quantised block by block with quantize_q8_0_block: the reference that
/// quant::blocked_activations_fast equals bit for bit.
BlockedActivations q8_0_blocks(const Tensor& x);

}  // namespace inferlab::ch09
