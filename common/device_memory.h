#pragma once
/// @file device_memory.h
/// @brief Device memory for Tensor: allocate, free, copy, zero, wait. Nothing else.
///
/// The CUDA runtime (cuda/runtime.cu) implements these; in a build without CUDA, cuda/stub.cpp
/// does, and allocating fails with "no CUDA device available: ...". The ops are in cuda/backend.h.

#include <cstddef>

namespace inferlab::cuda {

/// `bytes` of device memory; throws "out of CUDA memory: ..." when there is not enough.
void* device_malloc(std::size_t bytes);
/// Frees device_malloc's memory (nullptr is fine); never throws.
void device_free(void* p);
/// Copies `bytes` between host and device memory in any direction, and waits for the copy.
void memcpy(void* dst, const void* src, std::size_t bytes);
/// Sets `bytes` of device memory to zero (queued, like a kernel).
void memset_zero(void* p, std::size_t bytes);
/// Waits for all queued device work; rethrows an asynchronous kernel error as inferlab::Error.
void synchronize();

}  // namespace inferlab::cuda
