#pragma once
/// @file cuda_paged.h
/// @brief Chapter 12 on the GPU: paged attention and the slot writes as CUDA kernels.
///
/// The attention kernel is flash-decoding through a block table: one thread block per (query
/// row, query head, range of positions) computes the range's scores (a warp per key row, fetched
/// from its slot), their maximum and sum, and the weighted sum of the values; a second kernel
/// merges the ranges. The block table is copied to the device once per call.

#include <cstdint>
#include <vector>

#include "chapters/12_paged_attention/paged_attention.h"

namespace inferlab::ch12 {

/// paged_attention's CUDA path (inputs checked): `splits` ranges of positions.
void cuda_paged_attention(const Tensor& q, const PagedKV& kv, std::int64_t q_offset, Tensor& out, std::int64_t splits);
/// write_slots' CUDA path: row t of k and v into pool row slots[t].
void cuda_write_slots(const Tensor& k_pool, const Tensor& v_pool, const std::vector<std::int64_t>& slots, const Tensor& k,
                      const Tensor& v);

}  // namespace inferlab::ch12
